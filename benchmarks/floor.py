"""The floor under mcsync: the least a Python process can do on each benchmark path with the
libraries mcsync is built on (asyncio, uvloop, obstore, and the CRT for CopyObject across
buckets), to tell what a run costs because it is Python from what it costs because of mcsync.

It lists the source and moves every object at once, and nothing else: no manifest, no lock, no
checks, no hashing, no retries of its own, no pinning to the listed version. Not a tool: a
yardstick, in the harness as ``--tools floor`` (never a peer) and by hand
(``benchmarks/README.md``, *The floor*).

    python benchmarks/floor.py upload   DIR        ENDPOINT BUCKET PREFIX
    python benchmarks/floor.py download ENDPOINT BUCKET PREFIX   DIR
    python benchmarks/floor.py copy     ENDPOINT BUCKET PREFIX   [BUCKET2] PREFIX2
    python benchmarks/floor.py cross    ENDPOINT BUCKET PREFIX   ENDPOINT2 BUCKET2 PREFIX2

The source's keys come from AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, the target's from
MCSYNC_META_ACCESS_KEY_ID / MCSYNC_META_SECRET_ACCESS_KEY when set (as mcsync's are). ``copy``
within one bucket is obstore's CopyObject; into another bucket (which obstore cannot name) it
goes through the CRT's S3 client, as mcsync's does, so the CRT's import is in that floor too.
Neither sends mcsync's ``x-amz-copy-source-if-match``.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from urllib.parse import quote, urlsplit

import obstore
import uvloop
from obstore.store import S3Store

PIECE = 64 * 1024  # what mcsync asks obstore's streams for
CROSS_IN_FLIGHT = 8  # objects read whole at once (one PUT each); the rest wait


def keys_of(side: str) -> tuple[str, str]:
    env = os.environ
    if side == "target" and env.get("MCSYNC_META_ACCESS_KEY_ID"):
        return env["MCSYNC_META_ACCESS_KEY_ID"], env["MCSYNC_META_SECRET_ACCESS_KEY"]
    return env["AWS_ACCESS_KEY_ID"], env["AWS_SECRET_ACCESS_KEY"]


def store(endpoint: str, bucket: str, prefix: str, side: str = "source") -> S3Store:
    key_id, secret = keys_of(side)
    # The endpoint under the key AWS_ENDPOINT_URL_S3 sets, as mcsync gives it: an explicit
    # ``endpoint=`` lost to that variable, and a target on B was written to A.
    return S3Store(bucket, prefix=prefix.strip("/") or None,
                   config={"aws_endpoint_url_s3": endpoint, "aws_region": "us-east-1",
                           "aws_virtual_hosted_style_request": False,
                           "aws_access_key_id": key_id, "aws_secret_access_key": secret},
                   client_options={"allow_http": True})


def listed(src: S3Store) -> list[str]:
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

    root.mkdir(parents=True, exist_ok=True)
    await asyncio.gather(*(one(k) for k in listed(src)))


async def copy(endpoint: str, bucket: str, prefix: str, bucket2: str, prefix2: str) -> None:
    a, b = prefix.strip("/"), prefix2.strip("/")
    names = listed(store(endpoint, bucket, a))
    full = [(f"{a}/{k}" if a else k, f"{b}/{k}" if b else k) for k in names]
    if bucket2 == bucket:
        whole = store(endpoint, bucket, "")
        await asyncio.gather(*(obstore.copy_async(whole, s, d) for s, d in full))
        return
    from awscrt import auth, http, io, s3

    client = s3.S3Client(bootstrap=io.ClientBootstrap.get_or_create_static_default(),
                         region="us-east-1", tls_mode=s3.S3RequestTlsMode.DISABLED)
    signer = auth.AwsCredentialsProvider.new_static(*keys_of("target"))
    host = urlsplit(endpoint).netloc
    loop = asyncio.get_running_loop()

    async def one(src_key: str, dst_key: str) -> None:
        done: asyncio.Future[tuple[object, int | None]] = loop.create_future()

        def on_done(error: object = None, status_code: int | None = None, **_: object) -> None:
            loop.call_soon_threadsafe(done.set_result, (error, status_code))

        headers = http.HttpHeaders([
            ("Host", host), ("Content-Length", "0"),
            ("x-amz-copy-source", quote(f"{bucket}/{src_key}", safe="/~")),
        ])
        request = http.HttpRequest("PUT", "/" + quote(f"{bucket2}/{dst_key}", safe="/~"),
                                   headers)
        pending = client.make_request(type=s3.S3RequestType.DEFAULT, request=request,
                                      operation_name="CopyObject", credential_provider=signer,
                                      on_done=on_done)
        error, status = await done
        del pending
        if error is not None or status != 200:
            raise SystemExit(f"CopyObject {src_key}: {error or status}")

    await asyncio.gather(*(one(s, d) for s, d in full))


async def cross(src: S3Store, dst: S3Store) -> None:
    slots = asyncio.Semaphore(CROSS_IN_FLIGHT)

    async def one(key: str) -> None:
        async with slots:
            data = await (await obstore.get_async(src, key)).bytes_async()
            await obstore.put_async(dst, key, data)

    await asyncio.gather(*(one(k) for k in listed(src)))


def main(argv: list[str]) -> None:
    mode, *args = argv
    if mode == "upload" and len(args) == 4:
        run = upload(Path(args[0]), store(*args[1:4], side="target"))
    elif mode == "download" and len(args) == 4:
        run = download(store(*args[0:3]), Path(args[3]))
    elif mode == "copy" and len(args) in (4, 5):
        endpoint, bucket, prefix, *rest = args
        run = copy(endpoint, bucket, prefix, *(rest if len(rest) == 2 else [bucket, *rest]))
    elif mode == "cross" and len(args) == 6:
        run = cross(store(*args[0:3]), store(*args[3:6], side="target"))
    else:
        raise SystemExit(__doc__)
    uvloop.install()
    asyncio.run(run)


if __name__ == "__main__":
    main(sys.argv[1:])
