"""S3 requests through the AWS Common Runtime (``awscrt``'s S3 client), to an explicit endpoint:
the operations of ``s3_requests.S3Requests`` (CopyObject, the multipart upload API, a listing
delimited by "/"), each sent by ``CrtClient.request``.

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
from typing import Any

from ..errors import Permanent, Transient
from ..retry import RetryPolicy
from ..types import Buffer
from .http_wire import ANSWER_TIMEOUT_S, SLOWEST_SEND_BYTES_S
from .s3_body import Body
from .s3_clients import ClientCert, ClientSettings
from .s3_errors import S3Answered, crt_answer, crt_error
from .s3_keys import Keys, S3Credentials
from .s3_requests import Endpoint, Response, S3Requests

CONNECT_TIMEOUT_MS = 10_000
# How long a cancelled request may take to let go of its body (the caller's buffer, which goes
# back to the pool once this returns).
RELEASE_TIMEOUT_S = 10.0
# The CRT's TLS (s2n) holds a failed handshake back 20-30 s before it says so (its blinding
# delay, not configurable from Python): a trust the store's preflight (obstore's) already
# checked, so met mid-run only with a bundle that lacks a CA the system's roots hold.


class CrtCredentials:
    """The store's keys as the CRT's credentials provider, remade when the keys change
    (renewed keys included)."""

    def __init__(self, keys: Keys) -> None:
        self._keys = keys
        self._made: tuple[S3Credentials, Any] | None = None

    async def provider(self) -> Any:
        from awscrt import auth

        creds, _ = await self._keys.current()
        if self._made is None or self._made[0] != creds:
            made = auth.AwsCredentialsProvider.new_static(
                creds.access_key_id or "", creds.secret_access_key or "", creds.session_token)
            self._made = (creds, made)
        return self._made[1]

    def forget(self) -> None:
        self._made = None


class CrtClient(S3Requests):
    """S3 requests to one store's endpoint, signed with its keys. The CRT's client and its
    threads are made on the first request (importing ``awscrt`` is a cost only the runs that
    need it pay)."""

    def __init__(self, settings: ClientSettings, keys: Keys) -> None:
        self._settings = settings
        self._credentials = CrtCredentials(keys)
        self._endpoint = Endpoint.of(settings)
        self._client: Any = None

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
            credential_provider=await self._credentials.provider(), on_headers=on_headers,
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

    def close(self) -> None:
        """Let the client go: the CRT shuts it down on its own threads."""
        self._client = None
        self._credentials.forget()


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


def crt_retry_config(policy: RetryPolicy) -> Any:
    """``policy``'s SDK-level tries as the CRT's ``S3RetryConfig``."""
    from awscrt import s3

    fields = policy.crt()
    mode = {"none": s3.S3RetryMode.NONE, "standard": s3.S3RetryMode.STANDARD}[
        fields.pop("retry_mode")]
    return s3.S3RetryConfig(retry_mode=mode, **fields)
