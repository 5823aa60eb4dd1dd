"""S3 and S3-compatible object stores (Amazon S3, Meta Storage, SeaweedFS, MinIO...).

Two clients, each where it is strongest (measured against SeaweedFS on loopback, 16 KiB objects,
64 in flight: aiobotocore spends ~1.2 ms of client CPU per PUT and ~1.7 ms per GET, obstore's
Rust client ~0.2 ms): obstore carries whole-object PUTs and every GET (whole or ranged),
aiobotocore everything obstore lacks: listing pages, HEAD, multipart uploads with their ids,
UploadPartCopy, CopyObject, DELETE. For parts of 8 MiB and more the per-request cost is noise.

SDK errors are translated into ``mcsync.errors`` here and nowhere else. Retries of single
requests are botocore's (configured once, in ``mcsync.retry``); the engine never loops.

Every body sent carries a checksum the target can verify on receipt: UploadPart (and the S3 API
PUT) an ``x-amz-checksum-crc32c`` computed here, off the event loop (``Content-MD5`` on an
endpoint that refuses that header, found out by its first refusal); obstore's PUT an
``x-amz-checksum-sha256`` (the digest it computes anyway to sign the payload, so it costs no
extra pass). The signed ``x-amz-content-sha256`` alone is not enough: SeaweedFS does not check
it against the body (tests/integration/test_servers.py).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import email.utils
import hashlib
import itertools
import logging
import os
import re
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import obstore
import obstore.exceptions as obstore_exc

from .. import __version__, checksums
from ..config import S3_MAX_PART_SIZE, S3_MIN_PART_SIZE
from ..errors import (
    ConfigError,
    IntegrityError,
    ListingOrderError,
    MCSyncError,
    NotFound,
    Permanent,
    PreconditionFailed,
    Transient,
    UnsafeKey,
)
from ..retry import RetryPolicy
from ..types import ByteRange, Capabilities, ObjectInfo, PartClaim, PartRef
from .base import Buffer, CheckMode, Store

if TYPE_CHECKING:
    from botocore.exceptions import ClientError

log = logging.getLogger(__name__)

_NOT_FOUND = {"NoSuchKey", "NotFound", "NoSuchUpload", "404"}
_PRECONDITION = {"PreconditionFailed", "412"}
_NO_BUCKET = {"NoSuchBucket"}
_DENIED = {"AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "403",
           "InvalidToken", "ExpiredToken", "AccessDeniedException"}
# The target computed another checksum than the one sent with the body: the bytes were damaged
# on the way (or the checksum was wrong). Nothing was stored.
_BAD_DIGEST = {"BadDigest", "InvalidDigest", "XAmzContentChecksumMismatch",
               "XAmzContentSHA256Mismatch"}
_THROTTLED = {"SlowDown", "Throttling", "ThrottlingException", "RequestLimitExceeded",
              "TooManyRequests", "429", "503", "RequestTimeout", "InternalError", "500"}


@dataclass(frozen=True, slots=True)
class S3Credentials:
    """Explicit keys (meta:// and tests). ``None`` fields fall back to botocore's chain."""

    access_key_id: str | None = None
    secret_access_key: str | None = None
    session_token: str | None = None

    def __repr__(self) -> str:  # keys never reach a log through repr()
        return "S3Credentials(***)"


@dataclass(frozen=True, slots=True)
class S3CopySource:
    bucket: str
    key: str
    etag: str | None


class S3Store:
    caps = Capabilities(multipart=True, server_side_copy=True, min_part_size=S3_MIN_PART_SIZE,
                        max_part_size=S3_MAX_PART_SIZE, max_parts=10_000, send_copies=2,
                        compose=True)

    def __init__(
        self,
        *,
        scheme: str,
        bucket: str,
        prefix: str,
        endpoint_url: str | None = None,
        region: str | None = None,
        credentials: S3Credentials | None = None,
        profile: str | None = None,
        path_style: bool | None = None,
        max_connections: int = 128,
        retry: RetryPolicy | None = None,
    ) -> None:
        self.bucket = bucket
        self.prefix = prefix  # "" or ends with "/"
        self.url = f"{scheme}://{bucket}/{prefix}"
        self.endpoint_url = endpoint_url
        self._region = region
        self._credentials = credentials or S3Credentials()
        self._profile = profile
        if path_style is None:
            path_style = endpoint_url is not None  # custom endpoints rarely do virtual hosts
        self._retry = retry or RetryPolicy()
        self._max_connections = max_connections
        self._client_lock = asyncio.Lock()
        self._client_cm: Any = None
        self._client: Any = None
        self._fast_client: Any = None
        self._path_style = path_style
        self._access_key_seen: str | None = None
        self._creds_used = S3Credentials()

    # -- lifecycle ----------------------------------------------------------------------------

    async def _c(self) -> Any:
        """The botocore client (multipart uploads, copies, HEAD), opened on first use."""
        if self._client is None:
            async with self._client_lock:
                if self._client is None:
                    await self._open_clients()
        return self._client

    async def _fast(self) -> Any:
        """The obstore client. Built without botocore when the keys and the region are given
        (meta://, or AWS keys in the environment): importing and starting botocore costs
        ~0.2 s, most of what a no-op scheduled run would otherwise take."""
        if self._fast_client is None:
            creds = self._given_credentials()
            if creds is not None and self._region:
                self._access_key_seen = creds.access_key_id
                self._fast_client = self._make_fast_client(creds)
            else:
                await self._c()
        return self._fast_client

    def _given_credentials(self) -> S3Credentials | None:
        """Keys known without botocore's chain: explicit ones, else the environment's (the
        chain's first step) when no profile is named, since a named profile skips that step."""
        if self._credentials.access_key_id:
            return self._credentials
        env = os.environ
        if self._profile or env.get("AWS_PROFILE") or not env.get("AWS_ACCESS_KEY_ID"):
            return None
        if not env.get("AWS_SECRET_ACCESS_KEY"):
            return None
        return S3Credentials(env["AWS_ACCESS_KEY_ID"], env["AWS_SECRET_ACCESS_KEY"],
                             env.get("AWS_SESSION_TOKEN"))

    async def _open_clients(self) -> None:
        from aiobotocore.config import AioConfig
        from aiobotocore.session import AioSession, get_session
        from botocore.exceptions import ProfileNotFound

        config = AioConfig(
            # A fixed User-Agent: botocore otherwise rebuilds its own from a dozen components
            # twice per request (~10% of the client CPU of a small-object server-side copy).
            user_agent=f"mcsync/{__version__}",
            max_pool_connections=self._max_connections,
            retries=self._retry.botocore(),
            s3={"addressing_style": "path" if self._path_style else "auto"},
            connect_timeout=10,
            read_timeout=120,
            tcp_keepalive=True,
            # Part and object checksums are computed by us (CRC32C, off the event loop);
            # botocore's default would add a CRC32 computed on the event loop (over https as
            # aws-chunked trailers, which some S3-compatibles reject).
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required",
        )
        session: AioSession = get_session()
        if self._profile:
            try:
                session = AioSession(profile=self._profile)
                await session.get_credentials()
            except ProfileNotFound:
                raise ConfigError(f"AWS profile {self._profile!r} not found") from None
        session.get_component("response_parser_factory").set_parser_defaults(
            timestamp_parser=_parse_timestamp)
        creds = self._credentials
        cm = session.create_client(
            "s3",
            endpoint_url=self.endpoint_url,
            region_name=self._region,
            aws_access_key_id=creds.access_key_id,
            aws_secret_access_key=creds.secret_access_key,
            aws_session_token=creds.session_token,
            config=config,
        )
        client = await cm.__aenter__()
        if self._fast_client is None:
            if not creds.access_key_id:  # the standard chain: env, profile, IMDS...
                resolved = await session.get_credentials()
                if resolved is not None:
                    frozen = await resolved.get_frozen_credentials()
                    creds = S3Credentials(frozen.access_key, frozen.secret_key, frozen.token)
            region = client.meta.region_name
            self._region = "us-east-1" if region in (None, "aws-global") else region
            self._access_key_seen = creds.access_key_id
            self._fast_client = self._make_fast_client(creds)
        self._client_cm, self._client = cm, client

    def _make_fast_client(self, creds: S3Credentials, *, preflight: bool = False) -> Any:
        from obstore.store import S3Store as ObStore

        self._creds_used = creds

        # Credentials are resolved once per run: a temporary role credential that expires
        # mid-run fails the remaining reads, which are then reported, never half-written.
        kwargs: dict[str, Any] = {}
        if creds.access_key_id:
            kwargs.update(access_key_id=creds.access_key_id,
                          secret_access_key=creds.secret_access_key)
            if creds.session_token:
                kwargs["token"] = creds.session_token
        else:
            kwargs["skip_signature"] = True  # anonymous access to a public bucket
        if self.endpoint_url:
            kwargs["endpoint"] = self.endpoint_url
        with _aws_env_hidden():
            return ObStore(
                self.bucket,
                region=self._region or "us-east-1",
                virtual_hosted_style_request=not self._path_style,
                client_options={
                    "allow_http": bool(self.endpoint_url and self.endpoint_url.startswith("http:")),
                    "pool_max_idle_per_host": str(self._max_connections),
                    "timeout": "300s",
                    "connect_timeout": "10s",
                },
                retry_config=self._retry.obstore(preflight=preflight),
                # x-amz-checksum-sha256 on every PUT: the target verifies the body against it.
                checksum_algorithm="sha256",
                **kwargs,
            )

    async def aclose(self) -> None:
        if self._client_cm is not None:
            cm, self._client_cm, self._client = self._client_cm, None, None
            await cm.__aexit__(None, None, None)

    def _full(self, key: str) -> str:
        return self.prefix + key

    # -- identity for server-side copy ----------------------------------------------------------

    def endpoint_identity(self) -> tuple[str | None, str | None]:
        """Two stores with the same endpoint and access key can copy server-side. Known once
        a client exists (``check`` creates one)."""
        return (self.endpoint_url.rstrip("/") if self.endpoint_url else None,
                self._access_key_seen)

    def can_copy_from(self, other: Store) -> bool:
        return (isinstance(other, S3Store) and self._fast_client is not None
                and other._fast_client is not None
                and other.endpoint_identity() == self.endpoint_identity())

    def copy_source(self, key: str, etag: str | None) -> S3CopySource:
        return S3CopySource(self.bucket, self._full(key), etag)

    def compose_source(self, current: ObjectInfo) -> S3CopySource:
        return self.copy_source(current.key, current.etag)

    # -- operations -----------------------------------------------------------------------------

    async def check(self, *, mode: CheckMode) -> None:
        """One listing request, tried only ``preflight_attempts`` times: a wrong address, key
        or bucket is a one-line error in seconds. Its page also shows whether the endpoint
        lists in byte order (see ``list``)."""
        await self._fast()
        probe = self._make_fast_client(self._creds_used, preflight=True)
        with self._translate(None, preflight=True):
            try:
                stream = obstore.list(probe, self.prefix.rstrip("/") or None, chunk_size=1000)
                page = await anext(aiter(stream), [])
                keys = [meta["path"] for meta in page]
            except obstore_exc.InvalidPathError:  # a key obstore cannot spell: plain S3 API
                client = await self._c()
                listed = await client.list_objects_v2(Bucket=self.bucket, Prefix=self.prefix)
                keys = [c["Key"] for c in listed.get("Contents", ())]
        if any(a >= b for a, b in itertools.pairwise(keys)):
            self._use_tree_listing()

    async def list(self) -> AsyncIterator[ObjectInfo]:
        """Every key under the prefix in UTF-8 byte order.

        S3 lists a flat, recursive listing in that order; some S3-compatibles (SeaweedFS among
        them) walk their directory tree instead and put ``a/b`` before ``a-b``. Such an endpoint
        is listed directory by directory (``tree``), which is ordered by construction. Which
        one an endpoint needs is found out by ``check`` and, failing that, by the first
        out-of-order key, and remembered for the endpoint in this process."""
        await self._fast()
        walk = self._walk(self.prefix) if self._tree_listing() else self._flat(self.prefix)
        cut = len(self.prefix)
        last = ""
        with self._translate(None, preflight=True):
            async for c in walk:
                full = c["Key"]
                if full <= last:
                    raise ListingOrderError(
                        f"{self.url}: server lists keys out of byte order ({last!r} before "
                        f"{full!r})", fallback=self._use_tree_listing)
                last = full
                key = full[cut:]
                if not key:
                    continue  # the prefix's own "directory marker"
                yield ObjectInfo(key, c["Size"], _etag(c.get("ETag")),
                                 c["LastModified"].timestamp())

    async def _flat(self, prefix: str) -> AsyncIterator[dict[str, Any]]:
        """Pages through obstore (parsing 1,000 entries in Rust costs ~1 ms; botocore's XML
        and dateutil parsing ~100 ms). obstore refuses a whole page that holds a key it cannot
        represent ("a//b", "x/../y"): the listing then goes on through botocore, after the
        last key already yielded, so no key is lost or repeated."""
        last = ""
        try:
            # obstore's prefix is a path prefix: "run" lists run/..., as our "run/" does
            stream = obstore.list(self._fast_client, prefix.rstrip("/") or None,
                                  chunk_size=1000)
            async for chunk in stream:
                for meta in chunk:
                    last = meta["path"]
                    yield {"Key": last, "Size": meta["size"], "ETag": meta["e_tag"],
                           "LastModified": meta["last_modified"]}
            return
        except obstore_exc.InvalidPathError:
            log.debug("%s: a key obstore cannot represent; listing on with the S3 API", self.url)
        paginator = (await self._c()).get_paginator("list_objects_v2")
        async for page in paginator.paginate(Bucket=self.bucket, Prefix=prefix,
                                             StartAfter=last or prefix):
            for c in page.get("Contents", ()):
                yield c

    async def _walk(self, prefix: str) -> AsyncIterator[dict[str, Any]]:
        """One directory level: its subdirectories are collected first (a pass that keeps
        only their names), then its files are streamed with each subdirectory walked at its
        byte-order place. Within one level file names hold no '/', so any server's name order
        is byte order. A level that fits one page is listed once."""
        paginator = (await self._c()).get_paginator("list_objects_v2")
        dirs: list[str] = []
        first_files: list[dict[str, Any]] = []
        pages = 0
        async for page in paginator.paginate(Bucket=self.bucket, Prefix=prefix, Delimiter="/"):
            pages += 1
            dirs.extend(cp["Prefix"] for cp in page.get("CommonPrefixes", ()))
            if pages == 1:
                first_files = page.get("Contents", [])
        dirs.sort()
        files = _aiter(first_files) if pages <= 1 else self._level_files(prefix)
        i = 0
        async for c in files:
            while i < len(dirs) and dirs[i] < c["Key"]:
                async for sub in self._walk(dirs[i]):
                    yield sub
                i += 1
            yield c
        for d in dirs[i:]:
            async for sub in self._walk(d):
                yield sub

    async def _level_files(self, prefix: str) -> AsyncIterator[dict[str, Any]]:
        paginator = (await self._c()).get_paginator("list_objects_v2")
        async for page in paginator.paginate(Bucket=self.bucket, Prefix=prefix, Delimiter="/"):
            for c in page.get("Contents", ()):
                yield c

    def _tree_listing(self) -> bool:
        return _endpoint_key(self) in _TREE_LISTING_ENDPOINTS

    def _use_tree_listing(self) -> None:
        _TREE_LISTING_ENDPOINTS.add(_endpoint_key(self))

    async def head(self, key: str) -> ObjectInfo:
        client = await self._c()
        with self._translate(key):
            r = await client.head_object(Bucket=self.bucket, Key=self._full(key))
        return ObjectInfo(key, r["ContentLength"], _etag(r.get("ETag")),
                          r["LastModified"].timestamp())

    async def get(
        self, key: str, rng: ByteRange | None = None, *, expect: ObjectInfo | None = None
    ) -> Buffer:
        resp = await self._request(key, rng, expect)
        if isinstance(resp, bytes):
            return resp
        with self._translate(key):
            data = await resp.bytes_async()
        expected = rng.length if rng is not None else resp.meta["size"]
        if len(data) != expected:
            raise Transient(f"{self.url}{key}: short read ({len(data)} of {expected} bytes)")
        return data  # obstore.Bytes: a zero-copy buffer

    async def open_range(
        self, key: str, rng: ByteRange, *, expect: ObjectInfo | None = None
    ) -> Iterator[Buffer]:
        resp = await self._request(key, rng, expect)
        if isinstance(resp, bytes):
            return iter((resp,))
        return self._pieces(key, resp, rng.length)

    def _pieces(self, key: str, resp: Any, length: int) -> Iterator[Buffer]:
        got = 0
        with self._translate(key):
            for piece in resp.stream(min_chunk_size=_STREAM_PIECE):
                got += len(piece)
                if got > length:
                    break
                yield piece
        if got != length:
            raise Transient(f"{self.url}{key}: read {got} bytes of a {length}-byte range")

    async def _request(self, key: str, rng: ByteRange | None,
                       expect: ObjectInfo | None) -> Any:
        """A GET, answered up to its headers (obstore's result, body unread), or the whole
        body as bytes for a key obstore cannot spell ("a//b", "x/../y": plain S3 API)."""
        fast = await self._fast()
        if_match = expect.etag if expect is not None else None
        options: dict[str, Any] = {}
        if rng is not None:
            options["range"] = (rng.start, rng.end)
        if if_match:
            options["if_match"] = f'"{if_match}"'
        with self._translate(key):
            try:
                return await obstore.get_async(fast, self._full(key), options=options)
            except ValueError:
                return await self._get_boto(await self._c(), key, rng, if_match)

    async def _get_boto(self, client: Any, key: str, rng: ByteRange | None,
                        if_match: str | None) -> bytes:
        kwargs: dict[str, Any] = {"Bucket": self.bucket, "Key": self._full(key)}
        if rng is not None:
            kwargs["Range"] = f"bytes={rng.start}-{rng.end - 1}"
        if if_match:
            kwargs["IfMatch"] = f'"{if_match}"'
        resp = await client.get_object(**kwargs)
        async with resp["Body"] as body:
            data: bytes = await body.read()
        if len(data) != resp["ContentLength"]:
            raise Transient(f"{self.url}{key}: short read ({len(data)} of "
                            f"{resp['ContentLength']} bytes)")
        return data

    async def put(self, key: str, data: Buffer, *, mtime: float | None = None) -> ObjectInfo:
        fast = await self._fast()
        with self._translate(key):
            try:
                r = await obstore.put_async(fast, self._full(key), data, use_multipart=False)
                etag = r.get("e_tag")
            except ValueError:  # a key obstore cannot spell: plain S3 API
                client = await self._c()
                resp = await self._send_body(key, client.put_object, data, Bucket=self.bucket,
                                             Key=self._full(key))
                etag = resp.get("ETag")
        return ObjectInfo(key, len(data), _etag(etag), None)

    async def copy_object(self, source: S3CopySource, key: str) -> ObjectInfo:
        client = await self._c()
        kwargs: dict[str, Any] = {
            "Bucket": self.bucket, "Key": self._full(key),
            "CopySource": {"Bucket": source.bucket, "Key": source.key},
        }
        if source.etag:
            kwargs["CopySourceIfMatch"] = f'"{source.etag}"'
        with self._translate(key):
            r = await client.copy_object(**kwargs)
        return ObjectInfo(key, -1, _etag(r.get("CopyObjectResult", {}).get("ETag")), None)

    async def open_upload(self, key: str, size: int, *, mtime: float | None = None) -> S3Upload:
        client = await self._c()
        with self._translate(key):
            r = await client.create_multipart_upload(Bucket=self.bucket, Key=self._full(key))
        return S3Upload(self, key, r["UploadId"], size)

    def validate_key(self, key: str) -> None:
        if len(self._full(key).encode()) > 1024:
            raise UnsafeKey(f"{key!r}: longer than S3's 1024-byte key limit with the prefix")

    async def resume_upload(
        self, key: str, upload_id: str, size: int, *, mtime: float | None = None
    ) -> S3Upload | None:
        upload = S3Upload(self, key, upload_id, size)
        try:
            await upload.list_parts()
        except NotFound:  # completed or aborted since
            return None
        return upload

    async def abort_upload(self, key: str, upload_id: str) -> None:
        await S3Upload(self, key, upload_id, 0).abort()

    async def clear(self, prefix: str) -> None:
        """Abort every open upload and delete every object under ``prefix`` (mcsync's own
        scratch space, e.g. the staging objects a killed delta left)."""
        client = await self._c()
        full = self._full(prefix)
        uploads = client.get_paginator("list_multipart_uploads")
        objects = client.get_paginator("list_objects_v2")
        with self._translate(prefix):
            async for page in uploads.paginate(Bucket=self.bucket, Prefix=full):
                for u in page.get("Uploads", ()):
                    # completed or aborted meanwhile (a per-key clear running alongside)
                    with contextlib.suppress(NotFound), self._translate(u["Key"]):
                        await client.abort_multipart_upload(Bucket=self.bucket, Key=u["Key"],
                                                            UploadId=u["UploadId"])
            async for page in objects.paginate(Bucket=self.bucket, Prefix=full):
                for obj in page.get("Contents", ()):
                    await client.delete_object(Bucket=self.bucket, Key=obj["Key"])

    async def delete(self, key: str) -> None:
        fast = await self._fast()
        with self._translate(key):
            try:
                await obstore.delete_async(fast, self._full(key))
            except ValueError:  # a key obstore cannot spell: plain S3 API
                client = await self._c()
                await client.delete_object(Bucket=self.bucket, Key=self._full(key))

    async def _send_body(self, key: str, call: Callable[..., Awaitable[dict[str, Any]]],
                         data: Buffer, **kwargs: Any) -> dict[str, Any]:
        """``call(Body=data, **kwargs)`` with a checksum of the body that the target verifies:
        ``x-amz-checksum-crc32c``, or ``Content-MD5`` on an endpoint that refused the former
        once (some S3 implementations want the algorithm declared at CreateMultipartUpload).
        What an endpoint takes, per operation, is remembered for the process, and a fallback is
        logged once."""
        from botocore.exceptions import ClientError  # loaded already: ``call`` is botocore's

        endpoint = (_endpoint_key(self), getattr(call, "__name__", ""))
        body = _as_bytes(data)
        if _BODY_CHECKSUM.get(endpoint) != "md5":
            crc = await _crc32c_header(data)
            try:
                r = await call(Body=body, ChecksumCRC32C=crc, **kwargs)
            except ClientError as exc:
                if _BODY_CHECKSUM.get(endpoint) == "crc32c" or not _refuses_header(exc):
                    with self._translate(key):
                        raise
                if endpoint not in _BODY_CHECKSUM:
                    _BODY_CHECKSUM[endpoint] = "md5"
                    log.warning("%s refuses x-amz-checksum-crc32c on %s (%s); sending "
                                "Content-MD5 instead", self.endpoint_url or "S3", endpoint[1],
                                exc.response.get("Error", {}).get("Code"))
            else:
                _BODY_CHECKSUM.setdefault(endpoint, "crc32c")
                return r
        md5 = await _md5_header(data)
        with self._translate(key):
            return await call(Body=body, ContentMD5=md5, **kwargs)

    # -- error translation --------------------------------------------------------------------

    @contextlib.contextmanager
    def _translate(self, key: str | None, *, preflight: bool = False) -> Iterator[None]:
        what = f"{self.url}{key}" if key is not None else self.url
        try:
            yield
        except MCSyncError:
            raise
        except (obstore_exc.NotFoundError, FileNotFoundError) as exc:  # obstore raises both
            if preflight:
                raise ConfigError(f"{what}: bucket {self.bucket!r} does not exist") from exc
            raise NotFound(f"{what}: no such object") from exc
        except obstore_exc.PreconditionError as exc:
            raise PreconditionFailed(f"{what}: changed since it was listed") from exc
        except (obstore_exc.PermissionDeniedError, obstore_exc.UnauthenticatedError) as exc:
            cls = ConfigError if preflight else Permanent
            raise cls(f"{what}: access denied: check credentials") from exc
        except obstore_exc.BaseError as exc:  # already retried by obstore's RetryConfig
            code = _s3_error_code(exc)
            if code in _NO_BUCKET:
                cls = ConfigError if preflight else Permanent
                raise cls(f"{what}: bucket {self.bucket!r} does not exist") from exc
            if code in _DENIED:
                cls = ConfigError if preflight else Permanent
                raise cls(f"{what}: access denied ({code}): check credentials") from exc
            if code in _BAD_DIGEST:
                raise IntegrityError(f"{what}: the target refused the bytes: they do not match "
                                     f"the checksum sent with them ({code})") from exc
            if preflight and code is None:  # no S3 error document: no S3 answered
                raise ConfigError(f"{what}: cannot reach {self.endpoint_url or 'S3'} "
                                  f"({_first_line(exc).rsplit(' - ', 1)[-1].strip()})") from exc
            detail = f" ({code})" if code else ""
            cls = ConfigError if preflight else Transient
            raise cls(f"{what}: {type(exc).__name__}: {_first_line(exc)}{detail}") from exc
        except Exception as exc:
            # botocore's first: some of its timeouts are OSErrors too
            translated = self._botocore_error(exc, what, preflight)
            if translated is not None:
                raise translated from exc
            if isinstance(exc, OSError):  # aiohttp payload / socket errors past the retries
                raise Transient(f"{what}: {type(exc).__name__}: {exc}") from exc
            raise

    def _botocore_error(self, exc: Exception, what: str, preflight: bool) -> MCSyncError | None:
        """The mcsync error for a botocore exception; None for any other exception. botocore
        is imported only once a request needs it, and no botocore error exists before."""
        boto = sys.modules.get("botocore.exceptions")
        if boto is None:
            return None
        if isinstance(exc, boto.ClientError):
            err = exc.response.get("Error", {})
            code = str(err.get("Code", ""))
            status = str(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", ""))
            msg = err.get("Message") or code or status
            if code in _NO_BUCKET or (preflight and status == "404"):
                return ConfigError(f"{what}: bucket {self.bucket!r} does not exist")
            if code in _NOT_FOUND or status == "404":
                return NotFound(f"{what}: no such object")
            if code in _PRECONDITION or status == "412":
                return PreconditionFailed(f"{what}: changed since it was listed")
            if code in _BAD_DIGEST:
                return IntegrityError(f"{what}: the target refused the bytes: they do not match "
                                      f"the checksum sent with them ({code})")
            if code in _DENIED or status == "403":
                cls: type[MCSyncError] = ConfigError if preflight else Permanent
                return cls(f"{what}: access denied ({code or status}): check credentials")
            if code in _THROTTLED or status.startswith("5"):
                if preflight:
                    return ConfigError(f"{what}: server error {code or status}: {msg}")
                return Transient(f"{what}: {code or status}: {msg}")
            cls = ConfigError if preflight else Permanent
            return cls(f"{what}: {code or status}: {msg}")
        if isinstance(exc, boto.NoCredentialsError | boto.PartialCredentialsError):
            return ConfigError(f"{what}: no usable credentials ({type(exc).__name__})")
        if isinstance(exc, boto.ConnectionError | boto.HTTPClientError):
            if preflight:
                return ConfigError(f"{what}: cannot connect to {self.endpoint_url or 'S3'}")
            return Transient(f"{what}: connection failed: {type(exc).__name__}")
        if isinstance(exc, boto.BotoCoreError):
            cls = ConfigError if preflight else Permanent
            return cls(f"{what}: {exc}")
        return None


class S3Upload:
    def __init__(self, store: S3Store, key: str, upload_id: str, size: int) -> None:
        self.store = store
        self.key = key
        self.upload_id = upload_id
        self.size = size

    async def put_part(self, number: int, offset: int, data: Buffer) -> PartRef:
        s = self.store
        client = await s._c()
        with s._translate(self.key):  # what _send_body leaves untranslated (connection errors)
            r = await s._send_body(self.key, client.upload_part, data, Bucket=s.bucket,
                                   Key=s._full(self.key), UploadId=self.upload_id,
                                   PartNumber=number)
        return PartRef(number, _etag(r["ETag"]) or "", len(data))

    async def list_parts(self) -> list[PartRef]:
        s = self.store
        client = await s._c()
        parts: list[PartRef] = []
        paginator = client.get_paginator("list_parts")
        with s._translate(self.key):
            async for page in paginator.paginate(Bucket=s.bucket, Key=s._full(self.key),
                                                 UploadId=self.upload_id):
                parts.extend(PartRef(p["PartNumber"], _etag(p["ETag"]) or "", p["Size"])
                             for p in page.get("Parts", ()))
        return parts

    async def confirm_parts(self, claims: Sequence[PartClaim]) -> set[int]:
        held = {(p.number, p.etag, p.size) for p in await self.list_parts()}
        return {c.ref.number for c in claims if (c.ref.number, c.ref.etag, c.ref.size) in held}

    async def copy_part(self, number: int, offset: int, source: S3CopySource,
                        rng: ByteRange) -> PartRef:
        s = self.store
        client = await s._c()
        kwargs: dict[str, Any] = {
            "Bucket": s.bucket, "Key": s._full(self.key), "UploadId": self.upload_id,
            "PartNumber": number, "CopySource": {"Bucket": source.bucket, "Key": source.key},
            "CopySourceRange": f"bytes={rng.start}-{rng.end - 1}",
        }
        if source.etag:
            kwargs["CopySourceIfMatch"] = f'"{source.etag}"'
        with s._translate(self.key):
            r = await client.upload_part_copy(**kwargs)
        return PartRef(number, _etag(r["CopyPartResult"]["ETag"]) or "", rng.length)

    async def complete(self, parts: Sequence[PartRef]) -> ObjectInfo:
        s = self.store
        client = await s._c()
        ordered = sorted(parts, key=lambda p: p.number)
        with s._translate(self.key):
            r = await client.complete_multipart_upload(
                Bucket=s.bucket, Key=s._full(self.key), UploadId=self.upload_id,
                MultipartUpload={"Parts": [{"PartNumber": p.number, "ETag": f'"{p.etag}"'}
                                           for p in ordered]},
            )
        return ObjectInfo(self.key, self.size, _etag(r.get("ETag")), None)

    async def abort(self) -> None:
        s = self.store
        client = await s._c()
        with contextlib.suppress(NotFound), s._translate(self.key):
            await client.abort_multipart_upload(Bucket=s.bucket, Key=s._full(self.key),
                                                UploadId=self.upload_id)


_TREE_LISTING_ENDPOINTS: set[str] = set()
# A streamed range (open_range) comes in pieces of at least this size: obstore joins the
# socket's reads up to it. Small pieces are written while still in the CPU's cache: 64 x 32 MiB
# downloaded at once took 4.0 s in 1 MiB pieces, 3.1 s in 256 KiB, 2.8 s in 64 KiB (2 GiB
# checkpoint: 2.46, 2.59, 2.52 s; medians of 5), with no more CPU in Python.
_STREAM_PIECE = 64 * 1024
# Per (endpoint, operation), the body checksum it takes: "crc32c" once one was accepted, "md5"
# once it refused x-amz-checksum-crc32c (AWS may take it on PutObject but not on UploadPart).
_BODY_CHECKSUM: dict[tuple[str, str], str] = {}


@contextlib.contextmanager
def _aws_env_hidden() -> Iterator[None]:
    """obstore's constructors read every ``AWS_*`` variable, and some of them beat explicit
    arguments (``AWS_ENDPOINT_URL_S3`` overrides ``endpoint``; ``AWS_SESSION_TOKEN`` would be
    attached to Meta Storage keys). Its settings come from us alone, so it is built with them
    hidden. The constructor is synchronous and runs once per store on the event-loop thread."""
    saved = {k: os.environ.pop(k) for k in list(os.environ) if k.startswith("AWS_")}
    try:
        yield
    finally:
        os.environ.update(saved)


def _endpoint_key(store: S3Store) -> str:
    return store.endpoint_url or "aws"


async def _aiter(items: list[dict[str, Any]]) -> AsyncIterator[dict[str, Any]]:
    for item in items:
        yield item


def _s3_error_code(exc: BaseException) -> str | None:
    """The ``<Code>`` of the S3 error document that obstore quotes in its message (it exposes
    neither the status nor the code otherwise)."""
    match = re.search(r"<Code>([^<]{1,100})</Code>", str(exc))
    return match.group(1) if match else None


def _first_line(exc: BaseException) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else ""


def _refuses_header(exc: ClientError) -> bool:
    """Could this be an endpoint refusing x-amz-checksum-crc32c itself? (AWS answers
    InvalidRequest "Checksum Type mismatch" when an upload was created without the algorithm;
    others may not implement the header.) A wrong checksum is BadDigest, never this."""
    code = str(exc.response.get("Error", {}).get("Code", ""))
    return code in {"InvalidRequest", "InvalidArgument", "NotImplemented"}


async def _md5_header(data: Buffer) -> str:
    digest = await asyncio.to_thread(lambda: hashlib.md5(data, usedforsecurity=False).digest())
    return base64.b64encode(digest).decode("ascii")


async def _crc32c_header(data: Buffer) -> str:
    """The ``x-amz-checksum-crc32c`` value of ``data``: the target refuses the body (400
    BadDigest) if what it receives has another CRC. Sent without ChecksumAlgorithm at
    CreateMultipartUpload, so CompleteMultipartUpload needs no part checksums (SeaweedFS then
    refuses a Complete that lacks them, and a resumed part's CRC is not journalled)."""
    return checksums.to_base64(await checksums.crc32c_async(data))


def _as_bytes(data: Buffer) -> bytes | bytearray:
    # botocore signs and sends bytes; other buffers (obstore.Bytes, memoryview) are copied once.
    return data if isinstance(data, bytes | bytearray) else bytes(data)


def _parse_timestamp(value: Any) -> datetime:
    """Timestamps of S3 responses: ISO 8601 in XML bodies, RFC 1123 in headers. botocore's
    default parser (dateutil) takes ~0.15 ms a value, a tenth of the client CPU of a small
    CopyObject; the standard library parses both forms in microseconds. Anything else goes to
    botocore's parser. Naive times are UTC, as botocore has them."""
    parsed: datetime | None = None
    if isinstance(value, str):
        with contextlib.suppress(ValueError):
            parsed = datetime.fromisoformat(value)
        if parsed is None:
            with contextlib.suppress(TypeError, ValueError):
                parsed = email.utils.parsedate_to_datetime(value)
    if parsed is None:
        from botocore.utils import parse_timestamp

        parsed = parse_timestamp(value)
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)


def _etag(value: str | None) -> str | None:
    return value.strip('"') if value else None
