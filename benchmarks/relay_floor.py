"""The relay with the least Python: what mcsync's libraries cost on the cross path without its
engine. ``relay.py --floor`` runs it beside mcsync and rclone on the same sets, and checks its
target as theirs.

It does what the relay does to every byte, with mcsync's own parts: the listing, ranged GETs
into reused buffers and the bodies sent from them by mcsync's connections
(``stores/s3_wire.WireClient``, signed by ``stores/s3_sign``), the xxh3 of every part and the
CRC32C the target verifies (the same libraries). It leaves out everything else: no plan,
manifest, journal, retry layer, events, pacing or adaptive limits, and no error handling
beyond failing. It runs on mcsync's event loop (uvloop, ``mcsync.run_blocking``). So mcsync's
CPU less the floor's is the engine's cost per part and per object, and the floor's less
rclone's what the interpreter and these libraries cost against Go's.

    relay_floor.py s3://SRC/PREFIX/ meta://DST/PREFIX/

Endpoints and keys come from the variables mcsync reads (``AWS_*`` for s3://, ``MCSYNC_META_*``
for meta://). Parts of 8 MiB above 8 MiB (mcsync's default), 8 requests in flight. Every
object goes by the wire: sets of objects under ``WIRE_FROM`` (1 MiB), which mcsync sends by
obstore, are not its to measure.
"""

from __future__ import annotations

import asyncio
import os
import sys
from urllib.parse import urlsplit

from mcsync import checksums, run_blocking
from mcsync.hashing import block_digest_async
from mcsync.retry import RetryPolicy
from mcsync.stores.s3_body import CRC32C_HEADER
from mcsync.stores.s3_clients import ClientSettings
from mcsync.stores.s3_keys import Keys, S3Credentials
from mcsync.stores.s3_wire import WireClient
from mcsync.types import ByteRange

PART = 8 << 20
IN_FLIGHT = 8


def client(url: str, env: str) -> tuple[WireClient, str, str]:
    """A wire client for ``url``'s bucket, from the variables prefixed ``env``."""
    parts = urlsplit(url)
    e = os.environ.get
    if env == "AWS":
        endpoint, key, secret, region = (e("AWS_ENDPOINT_URL"), e("AWS_ACCESS_KEY_ID"),
                                         e("AWS_SECRET_ACCESS_KEY"), e("AWS_REGION"))
    else:
        endpoint, key, secret, region = (e("MCSYNC_META_ENDPOINT_URL"),
                                         e("MCSYNC_META_ACCESS_KEY_ID"),
                                         e("MCSYNC_META_SECRET_ACCESS_KEY"),
                                         e("MCSYNC_META_REGION"))
    settings = ClientSettings(parts.netloc, endpoint, region or "us-east-1", True,
                              IN_FLIGHT * 2, RetryPolicy())
    return (WireClient(settings, Keys(S3Credentials(key, secret))), parts.netloc,
            parts.path.lstrip("/"))


async def listing(src: WireClient, bucket: str, prefix: str) -> list[tuple[str, int, str]]:
    """(key, size, ETag) of every object under ``prefix``."""
    found: list[tuple[str, int, str]] = []
    token = ""
    while True:
        page = await src.list_level(bucket, prefix, after="", token=token, page=1000,
                                    what=prefix, delimiter="")
        found += [(o["Key"], int(o["Size"]), o["ETag"].strip('"'))
                  for o in page.get("Contents", [])]
        token = page.get("NextContinuationToken") or ""
        if not page.get("IsTruncated") or not token:
            return found


class Relay:
    def __init__(self, src: WireClient, src_bucket: str, dst: WireClient, dst_bucket: str,
                 dst_prefix: str) -> None:
        self.src, self.src_bucket = src, src_bucket
        self.dst, self.dst_bucket, self.dst_prefix = dst, dst_bucket, dst_prefix
        self.slots = asyncio.Semaphore(IN_FLIGHT)
        self.buffers = [bytearray(PART) for _ in range(IN_FLIGHT)]

    async def read(self, key: str, rng: ByteRange, etag: str) -> tuple[memoryview, bytearray]:
        buf = self.buffers.pop()
        view = await self.src.read_into(self.src_bucket, key, key, rng, buf, etag)
        return view, buf

    async def whole(self, key: str, target: str, size: int, etag: str) -> None:
        async with self.slots:
            view, buf = await self.read(key, ByteRange(0, size), etag)
            try:
                await block_digest_async(view)
                crc = checksums.to_base64(await checksums.crc32c_async(view))
                await self.dst.request("PUT", self.dst_bucket, target, target,
                                       operation="PutObject", headers=[(CRC32C_HEADER, crc)],
                                       body=view)
            finally:
                self.buffers.append(buf)

    async def part(self, key: str, target: str, upload: str, number: int, rng: ByteRange,
                   etag: str) -> tuple[int, str]:
        async with self.slots:
            view, buf = await self.read(key, rng, etag)
            try:
                await block_digest_async(view)
                crc = checksums.to_base64(await checksums.crc32c_async(view))
                got = await self.dst.upload_part(self.dst_bucket, target, upload, number, view,
                                                 (CRC32C_HEADER, crc), target)
            finally:
                self.buffers.append(buf)
        return number, got.strip('"')

    async def object(self, key: str, size: int, etag: str, prefix: str) -> None:
        target = self.dst_prefix + key[len(prefix):]
        if size <= PART:
            await self.whole(key, target, size, etag)
            return
        upload = await self.dst.create_upload(self.dst_bucket, target, target)
        ranges = [ByteRange(at, min(at + PART, size)) for at in range(0, size, PART)]
        parts = await asyncio.gather(*(self.part(key, target, upload, n, rng, etag)
                                       for n, rng in enumerate(ranges, 1)))
        await self.dst.complete_upload(self.dst_bucket, target, upload, sorted(parts), target)


async def main(src_url: str, dst_url: str) -> int:
    src, src_bucket, src_prefix = client(src_url, "AWS")
    dst, dst_bucket, dst_prefix = client(dst_url, "META")
    try:
        relay = Relay(src, src_bucket, dst, dst_bucket, dst_prefix)
        objects = await listing(src, src_bucket, src_prefix)
        work = asyncio.Semaphore(IN_FLIGHT * 4)  # objects open at once

        async def one(key: str, size: int, etag: str) -> None:
            async with work:
                await relay.object(key, size, etag, src_prefix)

        await asyncio.gather(*(one(*o) for o in objects))
    finally:
        src.close()
        dst.close()
    return 0


if __name__ == "__main__":
    sys.exit(run_blocking(main(sys.argv[1], sys.argv[2])))  # mcsync's loop: uvloop
