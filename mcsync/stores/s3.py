"""S3 and S3-compatible object stores (Amazon S3, Meta Storage, SeaweedFS, MinIO...).

Three clients, each where it is strongest (measured against SeaweedFS on loopback, 16 KiB objects,
64 in flight: aiobotocore spends ~1.2 ms of client CPU per PUT and ~1.7 ms per GET, obstore's
Rust client ~0.2 ms): obstore carries listing pages, whole-object PUTs, every GET (whole or
ranged), HEAD and DELETE; the AWS CRT, to an explicit endpoint, CopyObject and the multipart
upload requests with their ids, UploadPartCopy included (``s3_crt``, ``s3_upload``);
aiobotocore the rest: listings of open uploads, and what the CRT may not send
(``crt_client``). So a run that uploads, copies or composes a delta never starts botocore
(~0.2 s). obstore refuses keys it cannot spell ("a//b", "x/../y"): those go by botocore.

SDK errors are translated into ``mcsync.errors`` by one table (``s3_errors``); only ``check``
makes a configuration error of one. Retries of single requests are the SDKs' (configured once,
in ``mcsync.retry``); the engine never loops.

Keys that expire mid-run: every client shares one ``Keys`` (``s3_clients``), renewed by
botocore before they expire. A request refused for expired keys (ExpiredToken; or, with
refreshable keys, a refusal of a key that a renewal then replaces) raises
``CredentialsExpired`` and asks for a forced renewal, made before this store's next request
(a fresh obstore client with it, since obstore keeps a credential until near its stated
expiry). The store never tries a request again itself: retries live in one layer above it.

Every body sent carries a checksum the target verifies on receipt: UploadPart (and the S3 API
PUT) an ``x-amz-checksum-crc32c`` (``s3_body``); obstore's PUT an ``x-amz-checksum-sha256``
(the digest it computes anyway to sign the payload, so it costs no extra pass). The signed
``x-amz-content-sha256`` alone is not enough: SeaweedFS does not check it against the body
(tests/integration/test_servers.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any, TypeVar

import obstore
import obstore.exceptions as obstore_exc

from ..errors import (
    ConfigError,
    ListingOrderError,
    MCSyncError,
    NotFound,
    Transient,
    Unreachable,
    UnsafeKey,
    as_config_error,
)
from ..retry import RetryPolicy
from ..types import Buffer, ByteRange, Capabilities, ObjectInfo
from .base import CheckMode, ReadStore
from .obstore_body import fill, pieces, whole
from .s3_body import BodyChecksums, S3CopySource, botocore_body, unquote_etag
from .s3_clients import (
    ClientSettings,
    Keys,
    KeySource,
    Renewals,
    S3Credentials,
    make_obstore,
    open_botocore,
    process_keys,
    read_ca_bundle,
    uses_tls,
)
from .s3_crt import CrtClient
from .s3_errors import checksum_header_refusal, translate
from .s3_listing import tree_walk
from .s3_upload import S3Upload

__all__ = ["S3CopySource", "S3Credentials", "S3Store", "S3Upload"]

log = logging.getLogger(__name__)
T = TypeVar("T")

# What obstore raises for a key it cannot spell (a path it would normalise): plain S3 API then.
_UNSPELLABLE = (ValueError, obstore_exc.InvalidPathError)
CHECK_PAGE = 1000  # keys a check lists at most: one page


class S3Store:
    """A bucket and prefix on an S3-compatible endpoint. Implements ``Store`` and the
    abilities ``RangeStreamer``, ``ServerSideCopier``, ``Composer`` and ``ScratchSpace``."""

    caps = Capabilities(send_copies=2)  # S3's limits (the defaults)

    def __init__(
        self,
        *,
        scheme: str,
        bucket: str,
        prefix: str,
        endpoint_url: str | None = None,
        region: str | None = None,
        credentials: S3Credentials | None = None,
        credential_process: str | None = None,
        profile: str | None = None,
        path_style: bool | None = None,
        max_connections: int = 128,
        retry: RetryPolicy | None = None,
        ca_bundle: str | None = None,
        crt: bool = True,
    ) -> None:
        """``ca_bundle``: a PEM file of the CAs an https endpoint's certificate may chain
        to (a private CA), trusted by every client. ``crt``: CopyObject and the multipart
        upload requests to an explicit endpoint go through the CRT (``s3_crt``); False:
        through botocore, as they do without an endpoint or keys."""
        self.bucket = bucket
        self.prefix = prefix  # "" or ends with "/"
        self.url = f"{scheme}://{bucket}/{prefix}"
        self.endpoint_url = endpoint_url
        self._region = region
        self._profile = profile
        self._source = KeySource.of(credentials, credential_process, profile, os.environ)
        if path_style is None:
            path_style = endpoint_url is not None  # custom endpoints rarely do virtual hosts
        self._path_style = path_style
        self._retry = retry or RetryPolicy()
        self._max_connections = max_connections
        self._ca_bundle = ca_bundle
        # Plain HTTP checks no certificate: a bundle is not read for it (this machine's
        # AWS_CA_BUNDLE is the system's own, 220 KB).
        self._ca_pem = (read_ca_bundle(ca_bundle) if ca_bundle and uses_tls(endpoint_url)
                        else None)
        self._client_lock = asyncio.Lock()
        self._botocore_cm: Any = None
        self._botocore: Any = None
        self._obstore: Any = None
        self._use_crt = crt
        self._crt: CrtClient | None = None
        self._crt_sends_bodies = False  # no payload to sign (see crt_client)
        self._keys: Keys | None = None  # once resolved: what every client signs with
        self._renewals = Renewals(self.url, bucket)  # of the keys, after refusals
        # Found out per store: whether the endpoint lists in byte order (see ``list``), and
        # which body checksum it takes (see ``s3_body``).
        self._tree_listing = False
        self.body_checksums = BodyChecksums(endpoint_url or "S3", checksum_header_refusal)

    # -- clients ------------------------------------------------------------------------------

    async def botocore(self) -> Any:
        """The botocore client (multipart uploads, copies), opened on first use."""
        if self._renewals.wanted:
            await self._renew()
        if self._botocore is None:
            async with self._client_lock:
                if self._botocore is None:
                    cm, client, keys, region = await open_botocore(
                        self._settings(self._region or ""), await self._given_keys(),
                        self._profile)
                    self._keys = keys
                    if self._obstore is None:
                        self._region = region
                        self._obstore = self._make_obstore()
                    self._botocore_cm, self._botocore = cm, client
        return self._botocore

    async def _fast(self) -> Any:
        """The obstore client. Built without botocore when the keys and the region are given
        (meta://, or AWS keys in the environment): importing and starting botocore costs
        ~0.2 s, most of what a no-op scheduled run would otherwise take."""
        if self._renewals.wanted:
            await self._renew()
        if self._obstore is None:
            async with self._client_lock:
                if self._obstore is None and self._region and await self._given_keys():
                    self._obstore = self._make_obstore()
            if self._obstore is None:
                await self.botocore()
        return self._obstore

    async def _given_keys(self) -> Keys | None:
        """Keys known without botocore's chain (None: the chain's; see ``KeySource``). Called
        under the client lock, so a credential process runs once."""
        if self._keys is None:
            if self._source.process:
                self._keys = await process_keys(self._source.process)
            elif self._source.fixed is not None:
                self._keys = Keys(self._source.fixed)
        return self._keys

    # -- expired keys ---------------------------------------------------------------------------

    async def _renew(self) -> None:
        """The renewal a refusal asked for, and a new obstore client (a new credential cache)
        for the requests after it."""
        if await self._renewals.renew(self._keys):
            self._obstore = self._make_obstore()
            log.debug("%s: keys renewed after a refusal", self.url)

    def _settings(self, region: str) -> ClientSettings:
        return ClientSettings(self.bucket, self.endpoint_url, region, self._path_style,
                              self._max_connections, self._retry, self._ca_bundle,
                              self._ca_pem)

    def _make_obstore(self, *, preflight: bool = False) -> Any:
        return make_obstore(self._settings(self._region or "us-east-1"), self._keys or Keys(),
                            preflight=preflight)

    async def aclose(self) -> None:
        if self._crt is not None:
            self._crt.close()
        if self._botocore_cm is not None:
            cm, self._botocore_cm, self._botocore = self._botocore_cm, None, None
            await cm.__aexit__(None, None, None)

    def full_key(self, key: str) -> str:
        return self.prefix + key

    @contextlib.contextmanager
    def translating(self, key: str | None) -> Iterator[None]:
        """SDK errors raised inside become mcsync errors about ``key`` (None: the store)."""
        generation = self._renewals.generation  # the keys the requests inside are sent with
        try:
            yield
        except Exception as exc:
            what = f"{self.url}{key}" if key is not None else self.url
            translated = translate(exc, what, self.bucket)
            if translated is None or translated is exc:
                raise
            raise self._renewals.refused(self._keys, translated, exc, generation) from exc

    async def _either(self, key: str, fast: Callable[[Any], Awaitable[T]],
                      slow: Callable[[Any], Awaitable[T]]) -> T:
        """``fast(obstore client)``, or ``slow(botocore client)`` for a key obstore cannot
        spell; errors translated."""
        client = await self._fast()
        with self.translating(key):
            try:
                return await fast(client)
            except _UNSPELLABLE:
                return await slow(await self.botocore())

    # -- identity for server-side copy ----------------------------------------------------------

    def endpoint_identity(self) -> tuple[str | None, str]:
        """The endpoint and who signs (``s3_clients.KeySource``), known from construction:
        two stores with the same can copy server-side."""
        return (self.endpoint_url.rstrip("/") if self.endpoint_url else None,
                self._source.identity)

    def can_copy_from(self, other: ReadStore) -> bool:
        return (isinstance(other, S3Store)
                and other.endpoint_identity() == self.endpoint_identity())

    def copy_source(self, key: str, etag: str | None) -> S3CopySource:
        return S3CopySource(self.bucket, self.full_key(key), etag)

    def compose_source(self, current: ObjectInfo) -> S3CopySource:
        return self.copy_source(current.key, current.etag)

    # -- listing --------------------------------------------------------------------------------

    async def check(self, *, mode: CheckMode) -> None:
        """One listing request, tried only ``preflight_attempts`` times: a wrong address, key
        or bucket is a one-line error in seconds. Its page also shows whether the endpoint
        lists in byte order (see ``list``)."""
        try:
            fast = await self._fast()
            probe = (fast if self._retry.checks_retry_as_requests
                     else self._make_obstore(preflight=True))
            entries: list[dict[str, Any]] = []
            async with contextlib.aclosing(self._flat(self.prefix, probe)) as page:
                async for c in page:
                    entries.append(c)
                    if len(entries) >= CHECK_PAGE:
                        break
            if not entries:
                await self._answers_as_s3(probe)
        except Unreachable as exc:  # no answer at all: a wrong address, most likely
            raise as_config_error(exc, self.url, self.endpoint_url or "S3") from exc
        except Transient:
            # Busy (throttled), credentials renewed, an answer broken off: not a wrong
            # configuration. mcsync.resilience tries the check again.
            raise
        except MCSyncError as exc:
            raise as_config_error(exc, self.url, self.endpoint_url or "S3") from exc
        if any(a["Key"] >= b["Key"] for a, b in itertools.pairwise(entries)):
            self._tree_listing = True

    async def _answers_as_s3(self, probe: Any) -> None:
        """An empty listing is also what obstore makes of a web page answered with 200. S3
        answers a GET of a key that does not exist with 404; anything that hands over a body
        instead is not S3 (a proxy's login page, a wrong port): ConfigError, before a run
        could take the empty listing for an empty bucket and, with --delete, act on it."""
        key = f".mcsync/probe-{secrets.token_hex(8)}"  # under mcsync's own prefix
        try:
            with self.translating(key):
                await obstore.get_async(probe, self.full_key(key))
        except NotFound:
            return
        raise ConfigError(f"{self.url}: {self.endpoint_url or 'the endpoint'} does not answer "
                          "as S3 (it lists nothing, and answers a GET of a missing key with a "
                          "body): check the endpoint URL")

    async def list(self) -> AsyncIterator[ObjectInfo]:
        """Every key under the prefix in UTF-8 byte order.

        S3 lists a flat, recursive listing in that order; some S3-compatibles (SeaweedFS among
        them) walk their directory tree instead and put ``a/b`` before ``a-b``. Such an endpoint
        is listed directory by directory (``s3_listing.tree_walk``), ordered by construction.
        Which one an endpoint needs is found out by ``check`` and, failing that, by the first
        out-of-order key (the engine then starts again)."""
        if self._tree_listing:
            walk = tree_walk(self._level_pages, self.prefix)
        else:
            walk = self._flat(self.prefix, await self._fast())
        cut = len(self.prefix)
        last = ""
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
            yield ObjectInfo(key, c["Size"], unquote_etag(c.get("ETag")),
                             c["LastModified"].timestamp())

    def _use_tree_listing(self) -> None:
        self._tree_listing = True

    async def _flat(self, prefix: str, fast: Any, *,
                    after: str = "") -> AsyncIterator[dict[str, Any]]:
        """Pages through obstore (parsing 1,000 entries in Rust costs ~1 ms; botocore's XML
        and dateutil parsing ~100 ms), from the first key after ``after`` (a full key; "":
        from the start). obstore refuses a whole page that holds a key it cannot represent
        ("a//b", "x/../y"): the listing then goes on through botocore, after the last key
        already yielded, so no key is lost or repeated."""
        last = after
        with self.translating(None):
            try:
                # obstore's prefix is a path prefix: "run" lists run/..., as our "run/" does
                stream = obstore.list(fast, prefix.rstrip("/") or None, offset=after or None,
                                      chunk_size=1000)
                async for chunk in stream:
                    for meta in chunk:
                        last = meta["path"]
                        yield {"Key": last, "Size": meta["size"], "ETag": meta["e_tag"],
                               "LastModified": meta["last_modified"]}
                return
            except obstore_exc.InvalidPathError:
                log.debug("%s: a key obstore cannot represent; listing on with the S3 API",
                          self.url)
            paginator = (await self.botocore()).get_paginator("list_objects_v2")
            async for page in paginator.paginate(Bucket=self.bucket, Prefix=prefix,
                                                 StartAfter=last or prefix):
                for c in page.get("Contents", ()):
                    yield c

    async def _level_pages(self, prefix: str) -> AsyncIterator[dict[str, Any]]:
        paginator = (await self.botocore()).get_paginator("list_objects_v2")
        with self.translating(None):
            async for page in paginator.paginate(Bucket=self.bucket, Prefix=prefix,
                                                 Delimiter="/"):
                yield page

    # -- reads ------------------------------------------------------------------------------------

    async def head(self, key: str) -> ObjectInfo:
        async def fast(client: Any) -> ObjectInfo:
            meta = await obstore.head_async(client, self.full_key(key))
            return ObjectInfo(key, meta["size"], unquote_etag(meta["e_tag"]),
                              meta["last_modified"].timestamp())

        async def slow(client: Any) -> ObjectInfo:
            r = await client.head_object(Bucket=self.bucket, Key=self.full_key(key))
            return ObjectInfo(key, r["ContentLength"], unquote_etag(r.get("ETag")),
                              r["LastModified"].timestamp())

        return await self._either(key, fast, slow)

    async def get(
        self, key: str, rng: ByteRange | None = None, *, expect: ObjectInfo | None = None
    ) -> Buffer:
        resp = await self._request(key, rng, expect)
        if isinstance(resp, bytes):
            return resp
        return await whole(resp, rng.length if rng is not None else None, f"{self.url}{key}",
                           lambda: self.translating(key))

    async def open_range(
        self, key: str, rng: ByteRange, *, expect: ObjectInfo | None = None
    ) -> Iterator[Buffer]:
        resp = await self._request(key, rng, expect)
        if isinstance(resp, bytes):
            return iter((resp,))
        return pieces(resp, rng.length, f"{self.url}{key}", lambda: self.translating(key))

    async def read_into(self, key: str, rng: ByteRange, buf: bytearray, *,
                        expect: ObjectInfo | None = None) -> memoryview:
        """Bytes ``rng`` of ``key`` into ``buf`` (pinned as ``get``), a piece at a time: a
        part read whole is a new buffer of obstore's, fresh pages each (48% of the page-fault
        samples of an S3-to-S3 copy through the client), where the run's buffers are reused."""
        body = await self.open_range(key, rng, expect=expect)
        return await asyncio.to_thread(fill, body, buf)

    async def _request(self, key: str, rng: ByteRange | None,
                       expect: ObjectInfo | None) -> Any:
        """A GET, answered up to its headers (obstore's result, body unread), or the whole
        body as bytes for a key obstore cannot spell."""
        if_match = expect.etag if expect is not None else None
        options: dict[str, Any] = {}
        if rng is not None:
            options["range"] = (rng.start, rng.end)
        if if_match:
            options["if_match"] = f'"{if_match}"'

        async def slow(client: Any) -> bytes:
            kwargs: dict[str, Any] = {"Bucket": self.bucket, "Key": self.full_key(key)}
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

        return await self._either(
            key, lambda fast: obstore.get_async(fast, self.full_key(key), options=options), slow)

    # -- writes -----------------------------------------------------------------------------------

    async def put(self, key: str, data: Buffer, *, mtime: float | None = None) -> ObjectInfo:
        async def fast(client: Any) -> str | None:
            r = await obstore.put_async(client, self.full_key(key), data, use_multipart=False)
            return r.get("e_tag")

        async def slow(client: Any) -> str | None:
            r = await self.body_checksums.send("put_object", data, botocore_body(
                client.put_object, data, Bucket=self.bucket, Key=self.full_key(key)))
            return r.get("ETag")

        etag = unquote_etag(await self._either(key, fast, slow))
        return ObjectInfo(key, len(data), etag, None)

    async def delete(self, key: str) -> None:
        async def slow(client: Any) -> None:
            await client.delete_object(Bucket=self.bucket, Key=self.full_key(key))

        await self._either(key, lambda fast: obstore.delete_async(fast, self.full_key(key)),
                           slow)

    async def crt_client(self, *, body: bool = False) -> CrtClient | None:
        """The CRT's client for this store's requests (with a ``body``: requests that send
        one), or None where they go through botocore: no endpoint given (AWS's endpoint rules
        are botocore's), anonymous access, or, for a body, a payload that must be SHA-256-
        signed (plain HTTP across a network: the CRT's S3 signer sends UNSIGNED-PAYLOAD)."""
        await self._fast()  # the keys known (and a renewal a refusal asked for, made)
        if not (self._use_crt and self.endpoint_url and self._keys
                and not self._keys.anonymous):
            return None
        if self._crt is None:
            settings = self._settings(self._region or "us-east-1")
            self._crt = CrtClient(settings, self._keys)
            self._crt_sends_bodies = not settings.sign_payload
        return self._crt if self._crt_sends_bodies or not body else None

    async def copy_object(self, source: S3CopySource, key: str) -> ObjectInfo:
        crt = await self.crt_client()
        if crt is not None:
            with self.translating(key):
                etag = await crt.copy_object(source.bucket, source.key, source.etag,
                                             self.bucket, self.full_key(key), f"{self.url}{key}")
            return ObjectInfo(key, -1, unquote_etag(etag), None)
        client = await self.botocore()
        kwargs: dict[str, Any] = {
            "Bucket": self.bucket, "Key": self.full_key(key),
            "CopySource": {"Bucket": source.bucket, "Key": source.key},
        }
        if source.etag:
            kwargs["CopySourceIfMatch"] = f'"{source.etag}"'
        with self.translating(key):
            r = await client.copy_object(**kwargs)
        return ObjectInfo(key, -1, unquote_etag(r.get("CopyObjectResult", {}).get("ETag")), None)

    async def open_upload(self, key: str, size: int, *, mtime: float | None = None) -> S3Upload:
        return await S3Upload.create(self, key, size)

    def validate_key(self, key: str) -> None:
        if not key:  # it would name the prefix itself: a "directory marker" listings hide
            raise UnsafeKey(f"{key!r}: empty key")
        try:
            encoded = self.full_key(key).encode()
        except UnicodeEncodeError:  # a file name of bytes that are not UTF-8 (os.fsdecode)
            raise UnsafeKey(f"{key!r}: not valid UTF-8 (S3 keys are text): rename it") from None
        if len(encoded) > 1024:
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
        client = await self.botocore()
        full = self.full_key(prefix)
        uploads = client.get_paginator("list_multipart_uploads")
        objects = client.get_paginator("list_objects_v2")
        with self.translating(prefix):
            async for page in uploads.paginate(Bucket=self.bucket, Prefix=full):
                for u in page.get("Uploads", ()):
                    # completed or aborted meanwhile (a per-key clear running alongside)
                    with contextlib.suppress(NotFound), self.translating(u["Key"]):
                        await client.abort_multipart_upload(Bucket=self.bucket, Key=u["Key"],
                                                            UploadId=u["UploadId"])
            async for page in objects.paginate(Bucket=self.bucket, Prefix=full):
                for obj in page.get("Contents", ()):
                    await client.delete_object(Bucket=self.bucket, Key=obj["Key"])

