"""S3 requests through the AWS Common Runtime (``awscrt``'s S3 client), to an explicit endpoint:
CopyObject, the multipart upload API (create, UploadPart, UploadPartCopy, ListParts,
complete, abort) and a listing delimited by "/" (a page at a time, which obstore cannot).

What these requests cost the client is the start of what sends them and its CPU per request:
the CRT is C, quick to import and light per request, where aiobotocore imports aiohttp and
botocore and builds a client first (figures: benchmarks/README.md). Which requests come here
is the store's clients' rule (``s3_store_clients``).

Requests are signed by the CRT (SigV4 with S3's rules) with the store's current keys; its
retries are configured from the one ``RetryPolicy``, as the other SDKs' are. Answers are
reduced to ``s3_errors.Answer`` (status and XML code) and translated by the same table, as are
the CRT's own errors (no connection, a refused handshake, SlowDown: ``s3_errors.crt_error``).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from urllib.parse import quote, unquote_plus, urlsplit

from ..errors import Permanent, Transient
from ..retry import RetryPolicy
from ..types import Buffer
from .s3_body import Body
from .s3_clients import ClientCert, ClientSettings
from .s3_errors import S3Answered, crt_answer, crt_error
from .s3_keys import Keys, S3Credentials

# botocore's read_timeout: a CopyObject answers when the copy is done, so this bounds a copy
# as it does botocore's (which fails a read that waits longer, and tries again). A request with
# a body is given longer by its size: the CRT reports no progress of a body it sends, so a
# part on a slow link is bounded by the slowest rate worth waiting for instead.
ANSWER_TIMEOUT_S = 120.0
SLOWEST_SEND_BYTES_S = 256 * 1024
CONNECT_TIMEOUT_MS = 10_000
# How long a cancelled request may take to let go of its body (the caller's buffer, which goes
# back to the pool once this returns).
RELEASE_TIMEOUT_S = 10.0
# The CRT's TLS (s2n) holds a failed handshake back 20-30 s before it says so (its blinding
# delay, not configurable from Python): a trust the store's preflight (obstore's) already
# checked, so met mid-run only with a bundle that lacks a CA the system's roots hold.


@dataclass(frozen=True, slots=True)
class Endpoint:
    """Where the requests go: ``host`` (with its port, if one is given) for the Host header,
    the endpoint's own path (a store behind a path of a gateway), and whether they go over
    TLS."""

    host: str
    tls: bool
    path_style: bool
    base: str = ""

    @classmethod
    def of(cls, settings: ClientSettings) -> Endpoint:
        parts = urlsplit(settings.endpoint_url or "")
        if not parts.netloc:
            raise ValueError("the CRT client needs an explicit endpoint")
        return cls(parts.netloc, parts.scheme == "https", settings.path_style,
                   parts.path.rstrip("/"))

    def target(self, bucket: str, key: str | None) -> tuple[str, str]:
        """(Host header, path) of ``key`` in ``bucket`` (None: the bucket itself): keys
        encoded as botocore does."""
        if key is None:
            return ((self.host, f"{self.base}/{bucket}") if self.path_style
                    else (f"{bucket}.{self.host}", f"{self.base}/"))
        if self.path_style:
            return self.host, f"{self.base}/{bucket}/{quote(key, safe='/~')}"
        return f"{bucket}.{self.host}", f"{self.base}/{quote(key, safe='/~')}"


@dataclass(frozen=True, slots=True)
class Response:
    """A 2xx answer: its headers (names lower-cased) and body."""

    status: int
    headers: dict[str, str]
    body: bytes


def xml_fields(body: bytes, *names: str) -> dict[str, list[str]]:
    """The texts of the elements named ``names`` anywhere in an S3 XML answer (namespaces
    dropped), each in document order; empty lists for an answer that is no XML."""
    import xml.etree.ElementTree as ET  # paid by the runs that need it, not every run

    found: dict[str, list[str]] = {name: [] for name in names}
    try:
        root = ET.fromstring(body)
    except ET.ParseError:
        return found
    for element in root.iter():
        name = element.tag.rpartition("}")[2]
        if name in found:
            found[name].append(element.text or "")
    return found


def first(fields: dict[str, list[str]], name: str) -> str | None:
    values = fields.get(name)
    return values[0] if values else None


class CrtClient:
    """S3 requests to one store's endpoint, signed with its keys. The CRT's client and its
    threads are made on the first request (importing ``awscrt`` is a cost only the runs that
    need it pay)."""

    def __init__(self, settings: ClientSettings, keys: Keys) -> None:
        self._settings = settings
        self._keys = keys
        self._endpoint = Endpoint.of(settings)
        self._client: Any = None
        self._signed_with: tuple[S3Credentials, Any] | None = None

    def _open(self) -> Any:
        from awscrt import io, s3

        settings = self._settings
        kwargs: dict[str, Any] = {}
        if self._endpoint.tls:
            options = (_mtls_options(settings.client_cert) if settings.client_cert is not None
                       else io.TlsContextOptions())
            if settings.ca_pem is not None:
                options.override_default_trust_store(settings.ca_pem.encode())
            kwargs["tls_mode"] = s3.S3RequestTlsMode.ENABLED
            try:
                context = io.ClientTlsContext(options)
            except RuntimeError as exc:  # AWS_IO_TLS_CTX_ERROR: a pair s2n will not take
                if settings.client_cert is None:
                    raise
                pair = settings.client_cert
                raise Permanent(f"client certificate {pair.cert} / key {pair.key}: the CRT "
                                f"cannot use them ({exc})") from None
            kwargs["tls_connection_options"] = context.new_connection_options()
        else:
            kwargs["tls_mode"] = s3.S3RequestTlsMode.DISABLED
        return s3.S3Client(
            bootstrap=io.ClientBootstrap.get_or_create_static_default(),
            region=settings.region or "us-east-1",
            max_active_connections_override=settings.max_connections,
            retry_config=crt_retry_config(settings.retry),
            connect_timeout_ms=CONNECT_TIMEOUT_MS,
            **kwargs,
        )

    async def _provider(self) -> Any:
        """A credentials provider holding the keys to sign with now (renewed keys included)."""
        from awscrt import auth

        creds, _ = await self._keys.current()
        if self._signed_with is None or self._signed_with[0] != creds:
            provider = auth.AwsCredentialsProvider.new_static(
                creds.access_key_id or "", creds.secret_access_key or "", creds.session_token)
            self._signed_with = (creds, provider)
        return self._signed_with[1]

    async def request(self, method: str, bucket: str, key: str | None, what: str, *,
                      operation: str,
                      query: str = "", headers: Sequence[tuple[str, str]] = (),
                      body: Buffer | None = None) -> Response:
        """One request for ``key`` of ``bucket`` (None: of the bucket; ``query`` without its
        "?"); the 2xx answer.
        An S3 error answer raises ``S3Answered``, the CRT's own errors mcsync's (``what``
        names the object). Returns only once the CRT is done with ``body``, even when
        cancelled."""
        from awscrt import http, s3

        if self._client is None:
            self._client = self._open()
        host, path = self._endpoint.target(bucket, key)
        length = memoryview(body).nbytes if body is not None else 0
        sent = [("Host", host), ("Content-Length", str(length)), *headers]
        loop = asyncio.get_running_loop()
        done: asyncio.Future[tuple[Any, int | None, bytes | None]] = loop.create_future()
        got: dict[str, str] = {}
        chunks: list[bytes] = []

        def on_headers(status_code: int, headers: list[tuple[str, str]], **_: Any) -> None:
            got.update((name.lower(), value) for name, value in headers)

        def on_body(chunk: Any, **_: Any) -> None:
            chunks.append(bytes(chunk))

        def on_done(error: Any = None, status_code: int | None = None,
                    error_body: bytes | None = None, **_: Any) -> None:
            def settle() -> None:
                if not done.done():
                    done.set_result((error, status_code, error_body))
            with contextlib.suppress(RuntimeError):  # the loop closed: no one is waiting
                loop.call_soon_threadsafe(settle)

        request = self._client.make_request(
            type=s3.S3RequestType.DEFAULT, operation_name=operation,
            request=http.HttpRequest(method, f"{path}?{query}" if query else path,
                                     http.HttpHeaders(sent),
                                     body_stream=Body(body) if body is not None else None),
            credential_provider=await self._provider(), on_headers=on_headers,
            on_body=on_body, on_done=on_done)
        limit = ANSWER_TIMEOUT_S + length / SLOWEST_SEND_BYTES_S
        try:
            error, status, error_body = await asyncio.wait_for(asyncio.shield(done), limit)
        except TimeoutError:
            await _release(request, done)
            raise Transient(f"{what}: no answer in {limit:.0f} s") from None
        except asyncio.CancelledError:
            await _release(request, done)
            raise
        if error is not None:
            if status is not None:
                raise S3Answered(crt_answer(status, error_body))
            raise crt_error(getattr(error, "name", type(error).__name__), what)
        return Response(status or 0, got, b"".join(chunks))

    async def copy_object(self, source_bucket: str, source_key: str, source_etag: str | None,
                          bucket: str, key: str, what: str) -> str | None:
        """CopyObject ``source_bucket/source_key`` (only while its ETag is ``source_etag``,
        if given) to ``bucket/key``; the new object's ETag (None if the answer holds none,
        as botocore's would)."""
        r = await self.request("PUT", bucket, key, what, operation="CopyObject",
                               headers=_copy_source(source_bucket, source_key, source_etag))
        return first(_checked(r, "ETag"), "ETag")

    async def create_upload(self, bucket: str, key: str, what: str) -> str:
        r = await self.request("POST", bucket, key, what, operation="CreateMultipartUpload",
                               query="uploads")
        upload_id = first(_checked(r, "UploadId"), "UploadId")
        if not upload_id:
            raise Transient(f"{what}: CreateMultipartUpload answered no upload id")
        return upload_id

    async def upload_part(self, bucket: str, key: str, upload_id: str, number: int,
                          data: Buffer, checksum: tuple[str, str], what: str) -> str:
        """UploadPart ``number`` with ``checksum`` (header, value) of ``data``; its ETag."""
        r = await self.request("PUT", bucket, key, what, operation="UploadPart",
                               query=f"partNumber={number}&uploadId={_q(upload_id)}",
                               headers=[checksum], body=data)
        etag = r.headers.get("etag")
        if not etag:
            raise Transient(f"{what}: UploadPart {number} answered no ETag")
        return etag

    async def copy_part(self, bucket: str, key: str, upload_id: str, number: int,
                        source_bucket: str, source_key: str, source_etag: str | None,
                        first_byte: int, last_byte: int, what: str) -> str | None:
        """UploadPartCopy of bytes ``first_byte``-``last_byte`` (inclusive) of ``source_key``
        (only while its ETag is ``source_etag``, if given) as part ``number``; its ETag."""
        r = await self.request("PUT", bucket, key, what, operation="UploadPartCopy",
                               query=f"partNumber={number}&uploadId={_q(upload_id)}",
                               headers=[*_copy_source(source_bucket, source_key, source_etag),
                                        ("x-amz-copy-source-range",
                                         f"bytes={first_byte}-{last_byte}")])
        return first(_checked(r, "ETag"), "ETag")

    async def list_parts(self, bucket: str, key: str, upload_id: str,
                         what: str) -> list[tuple[int, str, int]]:
        """(number, ETag, size) of every part the upload holds, page after page."""
        parts: list[tuple[int, str, int]] = []
        marker = ""
        while True:
            query = f"uploadId={_q(upload_id)}" + (f"&part-number-marker={marker}"
                                                   if marker else "")
            r = await self.request("GET", bucket, key, what, operation="ListParts", query=query)
            fields = _checked(r, "PartNumber", "ETag", "Size", "IsTruncated",
                              "NextPartNumberMarker")
            numbers, etags, sizes = fields["PartNumber"], fields["ETag"], fields["Size"]
            if not len(numbers) == len(etags) == len(sizes):
                raise Transient(f"{what}: ListParts answered parts without number, ETag or size")
            parts.extend((int(n), e, int(z)) for n, e, z in zip(numbers, etags, sizes,
                                                                strict=True))
            following = first(fields, "NextPartNumberMarker")
            if first(fields, "IsTruncated") != "true" or not following or following == marker:
                return parts
            marker = following

    async def complete_upload(self, bucket: str, key: str, upload_id: str,
                              parts: Sequence[tuple[int, str]], what: str) -> str | None:
        """CompleteMultipartUpload of ``parts`` (number, ETag as recorded); the object's ETag."""
        xml = "".join(f"<Part><PartNumber>{n}</PartNumber><ETag>&quot;{_xml(e)}&quot;</ETag>"
                      "</Part>" for n, e in parts)
        body = f"<CompleteMultipartUpload>{xml}</CompleteMultipartUpload>".encode()
        r = await self.request("POST", bucket, key, what, operation="CompleteMultipartUpload",
                               query=f"uploadId={_q(upload_id)}", body=body)
        return first(_checked(r, "ETag"), "ETag")

    async def abort_upload(self, bucket: str, key: str, upload_id: str, what: str) -> None:
        await self.request("DELETE", bucket, key, what, operation="AbortMultipartUpload",
                           query=f"uploadId={_q(upload_id)}")

    async def list_level(self, bucket: str, prefix: str, *, after: str, token: str,
                         page: int, what: str, delimiter: str = "/") -> dict[str, Any]:
        """One ListObjectsV2 page under ``prefix`` delimited by ``delimiter`` ("": not
        delimited), from the first name after ``after`` or from the continuation ``token``,
        as botocore's: ``Contents`` (Key, Size, ETag, LastModified), ``CommonPrefixes``,
        ``IsTruncated``, ``NextContinuationToken``."""
        asked = [("list-type", "2"), ("delimiter", delimiter), ("encoding-type", "url"),
                 ("max-keys", str(page)), ("prefix", prefix)]
        asked.append(("continuation-token", token) if token else ("start-after", after))
        query = "&".join(f"{name}={_q(value)}" for name, value in asked if value)
        r = await self.request("GET", bucket, None, what, operation="ListObjectsV2",
                               query=query)
        if b"<Error>" in r.body:
            raise S3Answered(crt_answer(r.status, r.body))
        return listing_page(r.body, what)

    def close(self) -> None:
        """Let the client go: the CRT shuts it down on its own threads."""
        self._client = None
        self._signed_with = None


def listing_page(body: bytes, what: str) -> dict[str, Any]:
    """A ListObjectsV2 answer as botocore parses it (keys URL-decoded where the answer says
    they are encoded, as botocore does)."""
    import xml.etree.ElementTree as ET  # paid by the runs that need it, not every run

    try:
        root = ET.fromstring(body)
    except ET.ParseError:
        raise Transient(f"{what}: a listing answered no XML") from None

    def text(element: ET.Element, name: str) -> str:
        for child in element:
            if child.tag.rpartition("}")[2] == name:
                return child.text or ""
        return ""

    contents: list[dict[str, Any]] = []
    prefixes: list[str] = []
    for element in root:
        tag = element.tag.rpartition("}")[2]
        if tag == "Contents":
            contents.append({"Key": text(element, "Key"), "Size": int(text(element, "Size")),
                             "ETag": text(element, "ETag"),
                             "LastModified": datetime.fromisoformat(
                                 text(element, "LastModified"))})
        elif tag == "CommonPrefixes":
            prefixes.append(text(element, "Prefix"))
    if text(root, "EncodingType") == "url":
        for c in contents:
            c["Key"] = unquote_plus(c["Key"])
        prefixes = [unquote_plus(p) for p in prefixes]
    return {"Contents": contents, "CommonPrefixes": [{"Prefix": p} for p in prefixes],
            "IsTruncated": text(root, "IsTruncated") == "true",
            "NextContinuationToken": text(root, "NextContinuationToken")}


def _mtls_options(pair: ClientCert) -> Any:
    """The CRT's TLS options presenting ``pair``. A file holding both the certificate and its
    key is split (the CRT's PEM reader refuses a certificate file that holds a key): only its
    blocks go to the CRT, never into a message."""
    from awscrt import io

    try:
        if pair.cert != pair.key:
            return io.TlsContextOptions.create_client_with_mtls_from_path(pair.cert, pair.key)
        with open(pair.cert, "rb") as f:
            text = f.read()
        certs = b"".join(m.group(0) + b"\n" for m in _PEM_BLOCK.finditer(text)
                         if m.group(1) == b"CERTIFICATE")
        keys = [m.group(0) + b"\n" for m in _PEM_BLOCK.finditer(text)
                if m.group(1).endswith(b"PRIVATE KEY")]
        return io.TlsContextOptions.create_client_with_mtls(certs, keys[0] if keys else b"")
    except (OSError, RuntimeError) as exc:  # checked when the store was made: changed since
        raise Permanent(f"client certificate {pair.cert} / key {pair.key}: the CRT cannot "
                        f"use them ({getattr(exc, 'strerror', None) or exc})") from None


_PEM_BLOCK = re.compile(rb"-----BEGIN ([A-Z ]+)-----.+?-----END \1-----", re.DOTALL)


async def _release(request: Any, done: asyncio.Future[Any]) -> None:
    """Cancel ``request`` and wait until the CRT has let go of it (and of its body)."""
    request.cancel()
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(asyncio.shield(done), RELEASE_TIMEOUT_S)


def _checked(r: Response, *names: str) -> dict[str, list[str]]:
    """The fields ``names`` of a 200 answer, which may still be an error: S3 answers
    CompleteMultipartUpload and copies with 200 before it knows how they end."""
    if b"<Error>" in r.body:
        raise S3Answered(crt_answer(r.status, r.body))
    return xml_fields(r.body, *names)


def _copy_source(bucket: str, key: str, etag: str | None) -> list[tuple[str, str]]:
    """The headers naming a copy's source, encoded as botocore does, and guarding it with its
    ETag when one is given (a changed source is then refused with 412, never copied)."""
    headers = [("x-amz-copy-source", quote(f"{bucket}/{key}", safe="/~"))]
    if etag:
        headers.append(("x-amz-copy-source-if-match", f'"{etag}"'))
    return headers


def _q(value: str) -> str:
    return quote(value, safe="")


def _xml(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def crt_retry_config(policy: RetryPolicy) -> Any:
    """``policy``'s SDK-level tries as the CRT's ``S3RetryConfig``."""
    from awscrt import s3

    fields = policy.crt()
    mode = {"none": s3.S3RetryMode.NONE, "standard": s3.S3RetryMode.STANDARD}[
        fields.pop("retry_mode")]
    return s3.S3RetryConfig(retry_mode=mode, **fields)
