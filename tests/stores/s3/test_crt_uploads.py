"""Multipart uploads to an explicit endpoint go by the CRT's client (``stores/s3_crt.py``): a
run that uploads starts neither aiohttp nor botocore, and an upload one client opened is
resumed and completed by the other (the journal of a killed run names the upload by its id,
whichever client a later run has). Everything else of the uploads (parts out of order,
confirmed parts, aborts, refused checksums, damaged bodies, expired keys, Ctrl-C, kill -9) is
tested through the CRT by the suites that run them, and through botocore by the conformance
suite's ``seaweed-botocore`` backend."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from mcsync.stores.s3 import S3Store
from mcsync.stores.s3_keys import S3Credentials
from testbed.servers import S3Endpoint

from ...integration.helpers import new_bucket, payload, read_bucket, write_tree
from .test_server_copy import RUN_AND_REPORT_IMPORTS

MiB = 1 << 20
OBJECTS = {"ckpt/model-00001-of-00002.safetensors": payload(21 * MiB, 1),
           "ckpt/model-00002-of-00002.safetensors": payload(9 * MiB + 17, 2),
           "ckpt/config.json": payload(900, 3)} | {
    f"ckpt/tokenizer/part-{i:02d}.json": payload(3000 + i, 10 + i) for i in range(12)}


def test_an_upload_and_a_delta_start_neither_aiohttp_nor_botocore(
        seaweed: S3Endpoint, tmp_path: Path) -> None:
    write_tree(tmp_path / "src", OBJECTS)
    target = new_bucket(seaweed, "up")
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), **seaweed.meta_env(),
           "XDG_STATE_HOME": str(tmp_path / "state"), "XDG_CACHE_HOME": str(tmp_path / "cache")}

    def sync() -> tuple[dict[str, Any], list[str], str]:
        done = subprocess.run(
            [sys.executable, "-c", RUN_AND_REPORT_IMPORTS, "sync", str(tmp_path / "src"),
             f"meta://{target}/", "--json", "--quiet"],
            env=env, capture_output=True, text=True, timeout=120, check=False)
        after = json.loads(done.stderr.strip().splitlines()[-1])
        assert after["exit"] == 0, done.stderr
        return json.loads(done.stdout), after["loaded"], done.stdout + done.stderr

    report, loaded, output = sync()
    assert report["objects_copied"] == len(OBJECTS)
    assert read_bucket(seaweed, target) == OBJECTS
    assert loaded == [], "an upload run imported an SDK it does not need"
    assert seaweed.secret_key not in output
    # 64 KiB rewritten in the middle of the first shard: the re-sync composes it at the target
    # from the parts it holds (UploadPartCopy), sending about one block.
    shard = "ckpt/model-00001-of-00002.safetensors"
    changed = bytearray(OBJECTS[shard])
    changed[10 * MiB:10 * MiB + 65536] = payload(65536, 99)
    (tmp_path / "src" / shard).write_bytes(changed)
    report, loaded, output = sync()
    assert report["objects_copied"] == 1 and 0 < report["bytes_sent"] < 9 * MiB, report
    assert read_bucket(seaweed, target) == OBJECTS | {shard: bytes(changed)}
    assert loaded == [], "a delta run imported an SDK it does not need"
    assert seaweed.secret_key not in output


def store(ep: S3Endpoint, bucket: str, *, crt: bool) -> S3Store:
    return S3Store(scheme="s3", bucket=bucket, prefix="p/", endpoint_url=ep.url,
                   region=ep.region, credentials=S3Credentials(ep.access_key, ep.secret_key),
                   crt=crt)


@pytest.mark.parametrize("first_crt", [True, False], ids=["crt-then-botocore",
                                                          "botocore-then-crt"])
def test_an_upload_opened_by_one_client_is_finished_by_the_other(
        seaweed: S3Endpoint, first_crt: bool) -> None:
    bucket = new_bucket(seaweed)
    parts = [payload(5 * MiB, 40), payload(5 * MiB, 41), payload(123, 42)]

    async def go() -> None:
        one = store(seaweed, bucket, crt=first_crt)
        other = store(seaweed, bucket, crt=not first_crt)
        try:
            upload = await one.open_upload("k", sum(map(len, parts)))
            ref1 = await upload.put_part(1, 0, parts[0])
            ref3 = await upload.put_part(3, 10 * MiB, parts[2])
            later = await other.resume_upload("k", upload.upload_id, sum(map(len, parts)))
            assert later is not None
            assert sorted(p.number for p in await later.list_parts()) == [1, 3]
            ref2 = await later.put_part(2, 5 * MiB, parts[1])
            info = await later.complete([ref1, ref2, ref3])
            assert info.etag and info.etag.endswith("-3")
        finally:
            await one.aclose()
            await other.aclose()

    asyncio.run(go())
    assert read_bucket(seaweed, bucket, "p/") == {"k": b"".join(parts)}
