"""The floor under mcsync: the least a Python process can do on each benchmark path with the
libraries mcsync is built on (asyncio, uvloop, obstore), to tell what a run costs because it
is Python from what it costs because of mcsync.

It lists the source and moves every object at once, and nothing else: no manifest, no lock, no
checks, no hashing, no retries of its own, no pinning to the listed version. Not a tool: a
yardstick for ``benchmarks/README.md`` (*The floor*), run by hand next to the others.

    python benchmarks/floor.py upload   DIR        ENDPOINT BUCKET PREFIX
    python benchmarks/floor.py download ENDPOINT BUCKET PREFIX   DIR
    python benchmarks/floor.py copy     ENDPOINT BUCKET PREFIX   PREFIX2   (same bucket)
    python benchmarks/floor.py cross    ENDPOINT BUCKET PREFIX   ENDPOINT2 BUCKET2 PREFIX2

Keys come from AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (SeaweedFS on 127.0.0.1 for the
figures). ``copy`` is CopyObject through obstore, which copies only within a bucket and
without mcsync's ``x-amz-copy-source-if-match``: a floor under the server-side copy, which
also spares it the CRT's import.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import obstore
import uvloop
from obstore.store import S3Store

PIECE = 64 * 1024  # what mcsync asks obstore's streams for
CROSS_IN_FLIGHT = 8  # objects read whole at once (one PUT each); the rest wait


def store(endpoint: str, bucket: str, prefix: str) -> S3Store:
    return S3Store(bucket, prefix=prefix.strip("/") or None, endpoint=endpoint,
                   region="us-east-1", virtual_hosted_style_request=False,
                   access_key_id=os.environ["AWS_ACCESS_KEY_ID"],
                   secret_access_key=os.environ["AWS_SECRET_ACCESS_KEY"],
                   client_options={"allow_http": True})


def keys(src: S3Store) -> list[str]:
    return [o["path"] for page in obstore.list(src) for o in page]


async def upload(root: Path, dst: S3Store) -> None:
    files = [p for p in root.rglob("*") if p.is_file()]
    await asyncio.gather(*(obstore.put_async(dst, p.relative_to(root).as_posix(), p)
                           for p in files))


async def download(src: S3Store, root: Path) -> None:
    async def one(key: str) -> None:
        path = root / key
        path.parent.mkdir(parents=True, exist_ok=True)
        body = await obstore.get_async(src, key)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            async for piece in body.stream(min_chunk_size=PIECE):
                os.write(fd, piece)
        finally:
            os.close(fd)

    await asyncio.gather(*(one(k) for k in keys(src)))


async def copy(endpoint: str, bucket: str, prefix: str, prefix2: str) -> None:
    whole = store(endpoint, bucket, "")  # obstore copies within one store
    a, b = prefix.strip("/"), prefix2.strip("/")
    await asyncio.gather(*(obstore.copy_async(whole, f"{a}/{k}", f"{b}/{k}")
                           for k in keys(store(endpoint, bucket, a))))


async def cross(src: S3Store, dst: S3Store) -> None:
    slots = asyncio.Semaphore(CROSS_IN_FLIGHT)

    async def one(key: str) -> None:
        async with slots:
            data = await (await obstore.get_async(src, key)).bytes_async()
            await obstore.put_async(dst, key, data)

    await asyncio.gather(*(one(k) for k in keys(src)))


def main(argv: list[str]) -> None:
    mode, *args = argv
    if mode == "upload":
        run = upload(Path(args[0]), store(*args[1:4]))
    elif mode == "download":
        run = download(store(*args[0:3]), Path(args[3]))
    elif mode == "copy":
        run = copy(*args[0:4])
    elif mode == "cross":
        run = cross(store(*args[0:3]), store(*args[3:6]))
    else:
        raise SystemExit(__doc__)
    uvloop.install()
    asyncio.run(run)


if __name__ == "__main__":
    main(sys.argv[1:])
