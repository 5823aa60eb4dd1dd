"""S3 and S3-compatible object stores (Amazon S3, Meta Storage, SeaweedFS, MinIO...).

Two clients, each where it is strongest (measured against SeaweedFS on loopback, 16 KiB objects,
64 in flight: aiobotocore spends ~1.2 ms of client CPU per PUT and ~1.7 ms per GET, obstore's
Rust client ~0.2 ms): obstore carries whole-object PUTs and every GET (whole or ranged),
aiobotocore everything obstore lacks: listing pages, HEAD, multipart uploads with their ids,
UploadPartCopy, CopyObject, DELETE. For parts of 8 MiB and more the per-request cost is noise.

SDK errors are translated into ``mcsync.errors`` here and nowhere else. Retries of single
requests are botocore's (configured once, in ``mcsync.retry``); the engine never loops.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import obstore
import obstore.exceptions as obstore_exc
from aiobotocore.config import AioConfig
from aiobotocore.session import AioSession, get_session
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    HTTPClientError,
    NoCredentialsError,
    PartialCredentialsError,
    ProfileNotFound,
)
from botocore.exceptions import (
    ConnectionError as BotoConnectionError,
)

from ..config import S3_MAX_PART_SIZE, S3_MIN_PART_SIZE
from ..errors import (
    ConfigError,
    MCSyncError,
    NotFound,
    Permanent,
    PreconditionFailed,
    Transient,
)
from ..retry import RetryPolicy
from ..types import ByteRange, Capabilities, ObjectInfo, PartRef
from .base import Buffer, CheckMode, Store

_NOT_FOUND = {"NoSuchKey", "NotFound", "404"}
_PRECONDITION = {"PreconditionFailed", "412"}
_NO_BUCKET = {"NoSuchBucket"}
_DENIED = {"AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "403",
           "InvalidToken", "ExpiredToken", "AccessDeniedException"}
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
                        max_part_size=S3_MAX_PART_SIZE, max_parts=10_000)

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
        self._config = AioConfig(
            max_pool_connections=max_connections,
            retries=(retry or RetryPolicy()).botocore(),
            s3={"addressing_style": "path" if path_style else "auto"},
            connect_timeout=10,
            read_timeout=120,
            tcp_keepalive=True,
            # Per-request CRC headers are negotiated per endpoint later (integrity issue);
            # botocore's default would add aws-chunked trailers some S3-compatibles reject.
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required",
        )
        self._retry = retry or RetryPolicy()
        self._max_connections = max_connections
        self._client_cm: Any = None
        self._client: Any = None
        self._fast_client: Any = None
        self._path_style = path_style
        self._access_key_seen: str | None = None

    # -- lifecycle ----------------------------------------------------------------------------

    async def _c(self) -> Any:
        if self._client is None:
            session: AioSession = get_session()
            if self._profile:
                try:
                    session = AioSession(profile=self._profile)
                    await session.get_credentials()
                except ProfileNotFound:
                    raise ConfigError(f"AWS profile {self._profile!r} not found") from None
            creds = self._credentials
            if not creds.access_key_id:
                resolved = await session.get_credentials()
                if resolved is not None:
                    frozen = await resolved.get_frozen_credentials()
                    creds = S3Credentials(frozen.access_key, frozen.secret_key, frozen.token)
            self._access_key_seen = creds.access_key_id
            self._fast_client = self._make_fast_client(creds)
            self._client_cm = session.create_client(
                "s3",
                endpoint_url=self.endpoint_url,
                region_name=self._region or "us-east-1",
                aws_access_key_id=creds.access_key_id,
                aws_secret_access_key=creds.secret_access_key,
                aws_session_token=creds.session_token,
                config=self._config,
            )
            self._client = await self._client_cm.__aenter__()
        return self._client

    def _make_fast_client(self, creds: S3Credentials) -> Any:
        from obstore.store import S3Store as ObStore

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
            retry_config=self._retry.obstore(),
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
        the client exists (``check`` creates it)."""
        return (self.endpoint_url.rstrip("/") if self.endpoint_url else None,
                self._access_key_seen)

    def can_copy_from(self, other: Store) -> bool:
        return (isinstance(other, S3Store) and self._client is not None
                and other._client is not None
                and other.endpoint_identity() == self.endpoint_identity())

    def copy_source(self, key: str, etag: str | None) -> S3CopySource:
        return S3CopySource(self.bucket, self._full(key), etag)

    # -- operations -----------------------------------------------------------------------------

    async def check(self, *, mode: CheckMode) -> None:
        client = await self._c()
        with self._translate(None, preflight=True):
            await client.list_objects_v2(Bucket=self.bucket, Prefix=self.prefix, MaxKeys=1)

    async def list(self) -> AsyncIterator[ObjectInfo]:
        client = await self._c()
        paginator = client.get_paginator("list_objects_v2")
        cut = len(self.prefix)
        with self._translate(None, preflight=True):
            async for page in paginator.paginate(Bucket=self.bucket, Prefix=self.prefix):
                for c in page.get("Contents", ()):
                    key = c["Key"][cut:]
                    if not key:
                        continue  # the prefix's own "directory marker"
                    yield ObjectInfo(key, c["Size"], _etag(c.get("ETag")),
                                     c["LastModified"].timestamp())

    async def head(self, key: str) -> ObjectInfo:
        client = await self._c()
        with self._translate(key):
            r = await client.head_object(Bucket=self.bucket, Key=self._full(key))
        return ObjectInfo(key, r["ContentLength"], _etag(r.get("ETag")),
                          r["LastModified"].timestamp())

    async def get(
        self, key: str, rng: ByteRange | None = None, *, if_match: str | None = None
    ) -> Buffer:
        await self._c()
        options: dict[str, Any] = {}
        if rng is not None:
            options["range"] = (rng.start, rng.end)
        if if_match:
            options["if_match"] = f'"{if_match}"'
        with self._translate(key):
            resp = await obstore.get_async(self._fast_client, self._full(key), options=options)
            data = await resp.bytes_async()
        expected = rng.length if rng is not None else resp.meta["size"]
        if len(data) != expected:
            raise Transient(f"{self.url}{key}: short read ({len(data)} of {expected} bytes)")
        return data  # obstore.Bytes: a zero-copy buffer

    async def put(self, key: str, data: Buffer, *, mtime: float | None = None) -> ObjectInfo:
        await self._c()
        with self._translate(key):
            r = await obstore.put_async(self._fast_client, self._full(key), data,
                                        use_multipart=False)
        return ObjectInfo(key, len(data), _etag(r.get("e_tag")), None)

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

    async def delete(self, key: str) -> None:
        client = await self._c()
        with self._translate(key):
            await client.delete_object(Bucket=self.bucket, Key=self._full(key))

    # -- error translation --------------------------------------------------------------------

    @contextlib.contextmanager
    def _translate(self, key: str | None, *, preflight: bool = False) -> Iterator[None]:
        what = f"{self.url}{key}" if key is not None else self.url
        try:
            yield
        except MCSyncError:
            raise
        except obstore_exc.NotFoundError as exc:
            if preflight:
                raise ConfigError(f"{what}: bucket {self.bucket!r} does not exist") from exc
            raise NotFound(f"{what}: no such object") from exc
        except obstore_exc.PreconditionError as exc:
            raise PreconditionFailed(f"{what}: changed since it was listed") from exc
        except (obstore_exc.PermissionDeniedError, obstore_exc.UnauthenticatedError) as exc:
            cls = ConfigError if preflight else Permanent
            raise cls(f"{what}: access denied: check credentials") from exc
        except obstore_exc.BaseError as exc:  # already retried by obstore's RetryConfig
            raise Transient(f"{what}: {type(exc).__name__}: {_first_line(exc)}") from exc
        except ClientError as exc:
            err = exc.response.get("Error", {})
            code = str(err.get("Code", ""))
            status = str(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", ""))
            msg = err.get("Message") or code or status
            if code in _NO_BUCKET or (preflight and status == "404"):
                raise ConfigError(f"{what}: bucket {self.bucket!r} does not exist") from exc
            if code in _NOT_FOUND or status == "404":
                raise NotFound(f"{what}: no such object") from exc
            if code in _PRECONDITION or status == "412":
                raise PreconditionFailed(f"{what}: changed since it was listed") from exc
            if code in _DENIED or status == "403":
                cls = ConfigError if preflight else Permanent
                raise cls(f"{what}: access denied ({code or status}): check credentials") from exc
            if code in _THROTTLED or status.startswith("5"):
                if preflight:
                    raise ConfigError(f"{what}: server error {code or status}: {msg}") from exc
                raise Transient(f"{what}: {code or status}: {msg}") from exc
            cls = ConfigError if preflight else Permanent
            raise cls(f"{what}: {code or status}: {msg}") from exc
        except (NoCredentialsError, PartialCredentialsError) as exc:
            raise ConfigError(f"{what}: no usable credentials ({type(exc).__name__})") from exc
        except (BotoConnectionError, HTTPClientError) as exc:
            if preflight:
                raise ConfigError(f"{what}: cannot connect to {self.endpoint_url or 'S3'}") from exc
            raise Transient(f"{what}: connection failed: {type(exc).__name__}") from exc
        except BotoCoreError as exc:
            cls = ConfigError if preflight else Permanent
            raise cls(f"{what}: {exc}") from exc
        except OSError as exc:  # aiohttp payload / socket errors that escaped botocore's retries
            raise Transient(f"{what}: {type(exc).__name__}: {exc}") from exc


class S3Upload:
    def __init__(self, store: S3Store, key: str, upload_id: str, size: int) -> None:
        self.store = store
        self.key = key
        self.upload_id = upload_id
        self.size = size

    async def put_part(self, number: int, offset: int, data: Buffer) -> PartRef:
        s = self.store
        client = await s._c()
        with s._translate(self.key):
            r = await client.upload_part(Bucket=s.bucket, Key=s._full(self.key),
                                         UploadId=self.upload_id, PartNumber=number,
                                         Body=_as_bytes(data))
        return PartRef(number, _etag(r["ETag"]) or "", len(data))

    async def copy_part(self, number: int, source: S3CopySource, rng: ByteRange) -> PartRef:
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


def _first_line(exc: BaseException) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else ""


def _as_bytes(data: Buffer) -> bytes | bytearray:
    # botocore signs and sends bytes; other buffers (obstore.Bytes, memoryview) are copied once.
    return data if isinstance(data, bytes | bytearray) else bytes(data)


def _etag(value: str | None) -> str | None:
    return value.strip('"') if value else None
