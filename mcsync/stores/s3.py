"""S3 and S3-compatible object stores (Amazon S3, Meta Storage, SeaweedFS, MinIO...).

The store says what to send; its clients (``s3_store_clients.S3Clients``) say which client
sends it: obstore for listing pages, whole-object PUTs, GETs, HEAD and DELETE; the AWS CRT for
CopyObject and the multipart upload requests to an explicit endpoint (``s3_transport``,
``s3_upload``); botocore for the rest and for keys obstore cannot spell. Why each, and the
keys they share: ``s3_store_clients``; figures: benchmarks/README.md.

SDK errors are translated into ``mcsync.errors`` by one table (``s3_errors``); only ``check``
makes a configuration error of one. Retries of single requests are the SDKs' (configured once,
in ``mcsync.retry``); the engine never loops.

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
import secrets
from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING, Any

import obstore

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
from ..types import REMOTE, Buffer, ByteRange, Capabilities, Level, ObjectInfo
from .base import CheckMode, ReadStore
from .obstore_body import fill, pieces, whole
from .s3_body import S3CopySource, botocore_body, unquote_etag
from .s3_clients import ClientCert
from .s3_fanout import Fanout
from .s3_keys import S3Credentials
from .s3_listing import tree_walk
from .s3_store_clients import S3Clients
from .s3_transport import UploadIds
from .s3_upload import S3Upload

if TYPE_CHECKING:
    from obstore import GetOptions

__all__ = ["S3CopySource", "S3Credentials", "S3Store", "S3Upload"]

CHECK_PAGE = 1000  # keys a check lists at most: one page


class S3Store:
    """A bucket and prefix on an S3-compatible endpoint. Implements ``Store`` and the
    abilities ``RangeStreamer``, ``ServerSideCopier``, ``Composer`` and ``ScratchSpace``."""

    caps = Capabilities(send_copies=2)  # S3's limits (the defaults)
    facts = REMOTE

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
        client_cert: str | None = None,
        client_key: str | None = None,
    ) -> None:
        """``ca_bundle``: a PEM file of the CAs an https endpoint's certificate may chain
        to (a private CA), trusted by every client. ``crt``: CopyObject, the multipart
        upload requests and a listing's delimited levels to an explicit endpoint go through
        the CRT (``s3_crt``); False:
        through botocore, as they do without an endpoint or keys. ``client_cert`` and
        ``client_key``: PEM files of a certificate and its key that every request over
        https presents (mutual TLS; the key may be in the certificate's file), checked
        here, before any request."""
        if client_key and not client_cert:
            raise ConfigError(f"client key {client_key}: given without its certificate "
                              "(--client-cert / client_cert)")
        self.bucket = bucket
        self.prefix = prefix  # "" or ends with "/"
        self.url = f"{scheme}://{bucket}/{prefix}"
        self.endpoint_url = endpoint_url
        if path_style is None:
            path_style = endpoint_url is not None  # custom endpoints rarely do virtual hosts
        self._clients = S3Clients(
            url=self.url, bucket=bucket, endpoint_url=endpoint_url, region=region,
            credentials=credentials, credential_process=credential_process, profile=profile,
            path_style=path_style, max_connections=max_connections,
            retry=retry or RetryPolicy(), ca_bundle=ca_bundle, crt=crt,
            client_cert=ClientCert.read(client_cert, client_key) if client_cert else None)
        # Found out per store, by ``check`` or the first out-of-order key: whether the
        # endpoint lists in byte order (see ``list``).
        self._tree_listing = False

    async def aclose(self) -> None:
        await self._clients.aclose()

    def full_key(self, key: str) -> str:
        return self.prefix + key

    def _what(self, key: str) -> str:
        """``key`` as errors name it."""
        return f"{self.url}{key}"

    def translating(self, key: str | None) -> contextlib.AbstractContextManager[None]:
        """SDK errors raised inside become mcsync errors about ``key`` (None: the store)."""
        return self._clients.translating(self._what(key) if key is not None else self.url)

    # -- identity for server-side copy ----------------------------------------------------------

    def endpoint_identity(self) -> tuple[str | None, str]:
        """The endpoint and who signs (``s3_keys.KeySource``), known from construction:
        two stores with the same can copy server-side."""
        return self._clients.identity

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
        clients = self._clients
        try:
            entries: list[dict[str, Any]] = []
            async with contextlib.aclosing(clients.list_flat(self.prefix, check=True)) as page:
                async for c in page:
                    entries.append(c)
                    if len(entries) >= CHECK_PAGE:
                        break
            if not entries:
                await self._answers_as_s3()
        except Unreachable as exc:  # no answer at all: a wrong address, most likely
            raise as_config_error(exc, self.url, self.endpoint_url or "S3") from exc
        except Transient:
            # Busy (throttled), credentials renewed, an answer broken off: not a wrong
            # configuration. mcsync.stores.resilience tries the check again.
            raise
        except MCSyncError as exc:
            raise as_config_error(exc, self.url, self.endpoint_url or "S3") from exc
        if any(a["Key"] >= b["Key"] for a, b in itertools.pairwise(entries)):
            self._tree_listing = True

    async def _answers_as_s3(self) -> None:
        """An empty listing is also what obstore makes of a web page answered with 200. S3
        answers a GET of a key that does not exist with 404; anything that hands over a body
        instead is not S3 (a proxy's login page, a wrong port): ConfigError, before a run
        could take the empty listing for an empty bucket and, with --delete, act on it."""
        key = f".mcsync/probe-{secrets.token_hex(8)}"  # under mcsync's own prefix

        async def slow(client: Any) -> None:
            r = await client.get_object(Bucket=self.bucket, Key=self.full_key(key))
            async with r["Body"]:
                pass

        try:
            await self._clients.either(
                self._what(key), lambda fast: obstore.get_async(fast, self.full_key(key)), slow,
                check=True)
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
        Otherwise the flat listing is fanned out over the prefixes (``s3_fanout``): several
        prefixes' pages requested at once, in the same order. Which one an endpoint needs is
        found out by ``check`` and, failing that, by the first out-of-order key (the engine
        then starts again)."""
        if self._tree_listing:
            walk = tree_walk(self._clients.level_pages, self.prefix)
        else:
            clients = self._clients
            walk = Fanout(lambda prefix, after: clients.list_pages(prefix, after=after),
                          lambda prefix, after: clients.level_pages(prefix, after=after)
                          ).list(self.prefix)
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

    async def list_level(self, prefix: str) -> Level:
        """One level under ``prefix``, delimited by "/": through obstore (one answer, however
        many pages), or botocore where obstore cannot (mutual TLS, a key it cannot spell)."""
        full = self.prefix + prefix
        cut = len(self.prefix)

        def kept(key: str) -> bool:  # not the level's own "directory marker"
            return len(key) > len(full) and not key.endswith("/")

        async def fast(client: Any) -> Level:
            found = await obstore.list_with_delimiter_async(client, full.rstrip("/") or None)
            files = tuple(ObjectInfo(m["path"][cut:], m["size"], unquote_etag(m["e_tag"]),
                                     m["last_modified"].timestamp())
                          for m in found["objects"] if kept(m["path"]))
            dirs = tuple(p.rstrip("/")[cut:] + "/" for p in found["common_prefixes"])
            return _sorted_level(files, dirs)

        async def slow(client: Any) -> Level:
            files: list[ObjectInfo] = []
            dirs: list[str] = []
            async for page in self._clients.level_pages(full):
                files += (ObjectInfo(c["Key"][cut:], c["Size"], unquote_etag(c.get("ETag")),
                                     c["LastModified"].timestamp())
                          for c in page.get("Contents", ()) if kept(c["Key"]))
                dirs += (d["Prefix"][cut:] for d in page.get("CommonPrefixes", ()))
            return _sorted_level(tuple(files), tuple(dirs))

        return await self._clients.either(self._what(prefix), fast, slow)

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

        return await self._clients.either(self._what(key), fast, slow)

    async def get(
        self, key: str, rng: ByteRange | None = None, *, expect: ObjectInfo | None = None
    ) -> Buffer:
        # A whole object by the wire is a range of its listed size: pinned to its ETag, so a
        # changed object is refused (412), never cut to the old size.
        known = rng if rng is not None else (
            ByteRange(0, expect.size) if expect is not None and expect.size >= 0
            and expect.etag else None)
        if known is not None and await self._clients.wire(known.length) is not None:
            return await self.read_into(key, known, bytearray(known.length), expect=expect)
        resp = await self._request(key, rng, expect)
        if isinstance(resp, bytes):
            return resp
        return await whole(resp, rng.length if rng is not None else None, self._what(key),
                           lambda: self.translating(key))

    async def open_range(
        self, key: str, rng: ByteRange, *, expect: ObjectInfo | None = None
    ) -> Iterator[Buffer]:
        resp = await self._request(key, rng, expect)
        if isinstance(resp, bytes):
            return iter((resp,))
        return pieces(resp, rng.length, self._what(key), lambda: self.translating(key))

    async def read_into(self, key: str, rng: ByteRange, buf: bytearray, *,
                        expect: ObjectInfo | None = None) -> memoryview:
        """Bytes ``rng`` of ``key`` into ``buf`` (pinned as ``get``): by the wire, the socket
        reading into it; else obstore's pieces copied in (a part read whole would be a new
        buffer of obstore's, fresh pages each, where the run's buffers are reused)."""
        wire = await self._clients.wire(rng.length)
        if wire is not None:
            what = self._what(key)
            with self._clients.translating(what):
                return await wire.read_into(self.bucket, self.full_key(key), what, rng, buf,
                                            expect.etag if expect is not None else None)
        body = await self.open_range(key, rng, expect=expect)
        return await asyncio.to_thread(fill, body, buf)

    async def _request(self, key: str, rng: ByteRange | None,
                       expect: ObjectInfo | None) -> Any:
        """A GET, answered up to its headers (obstore's result, body unread), or the whole
        body as bytes for a key obstore cannot spell."""
        if_match = expect.etag if expect is not None else None
        options: GetOptions = {}
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
                raise Transient(f"{self._what(key)}: short read ({len(data)} of "
                                f"{resp['ContentLength']} bytes)")
            return data

        return await self._clients.either(
            self._what(key),
            lambda fast: obstore.get_async(fast, self.full_key(key), options=options), slow)

    # -- writes -----------------------------------------------------------------------------------

    async def put(self, key: str, data: Buffer, *, mtime: float | None = None,
                  crc32c: int | None = None) -> ObjectInfo:
        wire = await self._clients.wire(memoryview(data).nbytes)
        if wire is not None:
            what = self._what(key)
            with self._clients.translating(what):
                etag = await wire.put_object(self.bucket, self.full_key(key), data,
                                             self._clients.body_checksums, what, crc32c=crc32c)
            return ObjectInfo(key, len(data), unquote_etag(etag), None)

        async def fast(client: Any) -> str | None:
            r = await obstore.put_async(client, self.full_key(key), data, use_multipart=False)
            return r.get("e_tag")

        async def slow(client: Any) -> str | None:
            r = await self._clients.body_checksums.send("put_object", data, botocore_body(
                client.put_object, data, Bucket=self.bucket, Key=self.full_key(key)),
                crc32c=crc32c)
            return r.get("ETag")

        etag = unquote_etag(await self._clients.either(self._what(key), fast, slow))
        return ObjectInfo(key, len(data), etag, None)

    async def delete(self, key: str) -> None:
        async def slow(client: Any) -> None:
            await client.delete_object(Bucket=self.bucket, Key=self.full_key(key))

        await self._clients.either(
            self._what(key), lambda fast: obstore.delete_async(fast, self.full_key(key)), slow)

    async def copy_object(self, source: S3CopySource, key: str) -> ObjectInfo:
        etag = await self._clients.multipart().copy_object(
            source, self.bucket, self.full_key(key), self._what(key))
        return ObjectInfo(key, -1, etag, None)

    async def open_upload(self, key: str, size: int, *, mtime: float | None = None) -> S3Upload:
        return await S3Upload.create(self._clients.multipart(), key, self.bucket,
                                     self.full_key(key), self._what(key), size)

    def _upload(self, key: str, upload_id: str, size: int) -> S3Upload:
        ids = UploadIds(self.bucket, self.full_key(key), upload_id, self._what(key))
        return S3Upload(self._clients.multipart(), key, ids, size)

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
        upload = self._upload(key, upload_id, size)
        try:
            await upload.list_parts()
        except NotFound:  # completed or aborted since
            return None
        return upload

    async def abort_upload(self, key: str, upload_id: str) -> None:
        await self._upload(key, upload_id, 0).abort()

    async def clear(self, prefix: str) -> None:
        """Abort every open upload and delete every object under ``prefix`` (mcsync's own
        scratch space, e.g. the staging objects a killed delta left)."""
        client = await self._clients.botocore()  # the only one that lists open uploads
        full = self.full_key(prefix)
        uploads = client.get_paginator("list_multipart_uploads")
        objects = client.get_paginator("list_objects_v2")
        with self.translating(prefix):
            async for page in uploads.paginate(Bucket=self.bucket, Prefix=full):
                for u in page.get("Uploads", ()):
                    # completed or aborted meanwhile (a per-key clear running alongside)
                    with contextlib.suppress(NotFound), self._clients.translating(
                            f"{self.url}{u['Key']}"):
                        await client.abort_multipart_upload(Bucket=self.bucket, Key=u["Key"],
                                                            UploadId=u["UploadId"])
            async for page in objects.paginate(Bucket=self.bucket, Prefix=full):
                for obj in page.get("Contents", ()):
                    await client.delete_object(Bucket=self.bucket, Key=obj["Key"])


def _sorted_level(files: tuple[ObjectInfo, ...], dirs: tuple[str, ...]) -> Level:
    # Byte order whatever the server's (SeaweedFS walks its own tree).
    return Level(tuple(sorted(files, key=lambda f: f.key.encode())),
                 tuple(sorted(dirs, key=str.encode)))
