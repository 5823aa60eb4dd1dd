"""xxh3-128 digests of the bytes mcsync moves.

An object's digest is the digest of its single block, or, for an object moved in several blocks,
the xxh3-128 of the concatenated block digests (a one-level hash tree, so blocks are hashed in
parallel as they stream). The block size is reported beside it.
"""

from __future__ import annotations

import xxhash

from .tasks import off_loop
from .types import Buffer, ByteRange

DIGEST_SIZE = 16  # bytes of an xxh3-128 digest
_OFF_LOOP = 1 << 20  # hash buffers of 1 MiB and more in a worker thread (xxhash drops the GIL)


async def block_digest_async(data: Buffer) -> bytes:
    if len(data) >= _OFF_LOOP:
        return await off_loop(xxhash.xxh3_128_digest, data)
    return xxhash.xxh3_128_digest(data)


def object_digest(blocks: list[bytes]) -> str:
    if len(blocks) == 1:
        return blocks[0].hex()
    return xxhash.xxh3_128_hexdigest(b"".join(blocks))


def chunk_digests(data: Buffer, base: int, chunks: list[ByteRange]) -> list[bytes]:
    """The digest of each chunk of ``data``, which holds the object's bytes from ``base``."""
    view = memoryview(data)
    return [xxhash.xxh3_128_digest(view[c.start - base:c.end - base]) for c in chunks]


async def chunk_digests_async(data: Buffer, base: int, chunks: list[ByteRange]) -> list[bytes]:
    if len(data) >= _OFF_LOOP:
        return await off_loop(chunk_digests, data, base, chunks)
    return chunk_digests(data, base, chunks)
