"""Server-side copies (CopyObject) to an explicit endpoint go by the CRT's client
(``stores/s3_crt.py``): a run that only copies server-side starts neither aiohttp nor botocore,
and either client copies the same bytes, refuses a changed source and names a missing one;
copies refused for a while are tried again, and copies in flight stop on a second Ctrl-C."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from mcsync.errors import AccessDenied, NotFound, PreconditionFailed
from mcsync.stores.s3 import S3Store
from mcsync.stores.s3_keys import S3Credentials
from testbed.faultproxy import INTERNAL_ERROR, SLOW_DOWN, FaultProxy, Rule, Stall
from testbed.servers import S3Endpoint

from ...integration.helpers import new_bucket, payload, put_objects, read_bucket, sync_stores

MiB = 1 << 20
OBJECTS = {f"model-0000{i}-of-00003.safetensors": payload(3 * MiB, i) for i in range(1, 4)} | {
    f"tokenizer/part-{i:03d}.json": payload(2000 + i, 100 + i) for i in range(40)}

# The command, run as `mcsync` runs it; after it, the SDK modules the process imported.
RUN_AND_REPORT_IMPORTS = """
import json, sys
from mcsync.cli.main import main
try:
    main()
except SystemExit as done:
    code = done.code
loaded = sorted(m for m in ("aiohttp", "botocore", "aiobotocore") if m in sys.modules)
print(json.dumps({"exit": code, "loaded": loaded}), file=sys.stderr)
"""


def test_a_server_side_copy_run_starts_neither_aiohttp_nor_botocore(
        seaweed: S3Endpoint, tmp_path: Path) -> None:
    source, target = new_bucket(seaweed), new_bucket(seaweed, "copy")
    put_objects(seaweed, source, OBJECTS, "ckpt/")
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), **seaweed.aws_env(),
           **seaweed.meta_env(), "XDG_STATE_HOME": str(tmp_path / "state"),
           "XDG_CACHE_HOME": str(tmp_path / "cache")}
    done = subprocess.run(
        [sys.executable, "-c", RUN_AND_REPORT_IMPORTS, "sync", f"s3://{source}/ckpt/",
         f"meta://{target}/ckpt/", "--json", "--quiet"],
        env=env, capture_output=True, text=True, timeout=120, check=False)
    after = json.loads(done.stderr.strip().splitlines()[-1])
    assert after["exit"] == 0, done.stderr
    report = json.loads(done.stdout)
    assert {o["key"]: o["action"] for o in report["objects"]} == dict.fromkeys(
        OBJECTS, "server_copy")
    assert report["bytes_sent"] == 0
    assert read_bucket(seaweed, target, "ckpt/") == OBJECTS
    assert after["loaded"] == [], "a server-side copy imported an SDK it does not need"
    assert seaweed.secret_key not in done.stdout + done.stderr


def store(ep: S3Endpoint, bucket: str, *, crt: bool, secret: str | None = None) -> S3Store:
    return S3Store(scheme="s3", bucket=bucket, prefix="p/", endpoint_url=ep.url,
                   region=ep.region,
                   credentials=S3Credentials(ep.access_key, secret or ep.secret_key),
                   crt=crt)


def run(coro: Any) -> Any:
    return asyncio.run(coro)


@pytest.mark.parametrize("crt", [True, False], ids=["crt", "botocore"])
def test_either_client_copies_the_bytes_and_refuses_a_changed_source(
        seaweed: S3Endpoint, crt: bool) -> None:
    bucket = new_bucket(seaweed)
    first, second = payload(6 * MiB, 1), payload(6 * MiB, 2)
    put_objects(seaweed, bucket, {"k": first, "dir/ü b+c.bin": second}, "p/")

    async def go() -> tuple[Any, ...]:
        s = store(seaweed, bucket, crt=crt)
        try:
            listed = {o.key: o for o in [o async for o in s.list()]}
            whole = await s.copy_object(s.copy_source("k", listed["k"].etag), "copy")
            odd = await s.copy_object(s.copy_source("dir/ü b+c.bin", None), "odd copy+1")
            await s.put("k", b"changed since it was listed")
            with pytest.raises(PreconditionFailed, match=r"s3://.*/p/again: changed since"):
                await s.copy_object(s.copy_source("k", listed["k"].etag), "again")
            with pytest.raises(NotFound, match=r"s3://.*/p/missing: no such object"):
                await s.copy_object(s.copy_source("gone", None), "missing")
            return listed["k"].etag, whole.etag, odd.etag
        finally:
            await s.aclose()

    etag, copied, odd = run(go())
    assert copied == etag and odd  # a one-part object's copy has its ETag (its MD5)
    got = read_bucket(seaweed, bucket, "p/")
    assert got["copy"] == first and got["odd copy+1"] == second
    assert "again" not in got and "missing" not in got


def test_a_refused_signature_is_access_denied_and_shows_no_secret(seaweed: S3Endpoint) -> None:
    bucket = new_bucket(seaweed)
    put_objects(seaweed, bucket, {"k": b"x" * 1000}, "p/")
    wrong = "not-the-secret-MARK"

    async def go() -> None:
        s = store(seaweed, bucket, crt=True, secret=wrong)
        try:
            await s.copy_object(s.copy_source("k", None), "copy")
        finally:
            await s.aclose()

    with pytest.raises(AccessDenied) as refused:
        run(go())
    assert "s3://" in str(refused.value) and "/p/copy" in str(refused.value)
    assert wrong not in str(refused.value) and seaweed.secret_key not in str(refused.value)
    assert "copy" not in read_bucket(seaweed, bucket, "p/")


def test_copies_refused_for_a_while_are_tried_again(seaweed: S3Endpoint,
                                                    seaweed_proxy: FaultProxy) -> None:
    """503 SlowDown and 500 InternalError on CopyObject: tried again (the CRT's few quick
    tries, then the retry layer's), every object copied server-side, byte for byte."""
    objects = {f"shard-{i}.bin": payload(100_000 + i, i) for i in range(12)}
    bucket = new_bucket(seaweed)
    put_objects(seaweed, bucket, objects, "src/")
    seaweed_proxy.add(Rule(SLOW_DOWN, op="CopyObject", count=6))
    seaweed_proxy.add(Rule(INTERNAL_ERROR, op="CopyObject", count=4))
    ep = seaweed_proxy.endpoint

    def at(prefix: str) -> S3Store:
        return S3Store(scheme="s3", bucket=bucket, prefix=prefix, endpoint_url=ep.url,
                       region=ep.region, credentials=S3Credentials(ep.access_key, ep.secret_key))

    report = sync_stores(at("src/"), at("dst/"))
    assert report.exit_code == 0, report.failures
    assert report.objects_server_copied == len(objects) and report.bytes_sent == 0
    assert read_bucket(seaweed, bucket, "dst/") == objects
    assert len(seaweed_proxy.exchanges("CopyObject", fault="SlowDown")) == 6
    assert len(seaweed_proxy.exchanges("CopyObject", fault="InternalError")) == 4
    assert len(seaweed_proxy.exchanges("CopyObject", fault="")) == len(objects)


def test_ctrl_c_twice_stops_copies_in_flight_and_the_rerun_finishes(
        seaweed: S3Endpoint, seaweed_proxy: FaultProxy, tmp_path: Path) -> None:
    """Every CopyObject's answer is held back, so the CRT's requests are in flight when the
    second SIGINT comes: the run stops at once with 130 (the requests cancelled, no callback
    left to crash the exiting process), and the same command then copies every object."""
    objects = {f"shard-{i}.bin": payload(200_000 + i, 50 + i) for i in range(6)}
    bucket = new_bucket(seaweed)
    put_objects(seaweed, bucket, objects, "src/")
    stall = seaweed_proxy.add(Rule(Stall(30.0), op="CopyObject"))
    ep = seaweed_proxy.endpoint
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), **ep.aws_env(), **ep.meta_env(),
           "XDG_STATE_HOME": str(tmp_path / "state"), "XDG_CACHE_HOME": str(tmp_path / "cache")}
    argv = [sys.executable, "-m", "mcsync.cli.main", "sync", f"s3://{bucket}/src/",
            f"meta://{bucket}/dst/", "--quiet"]
    run = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True)
    deadline = time.monotonic() + 20
    while len(seaweed_proxy.exchanges("CopyObject", fault="stall")) < len(objects):
        assert time.monotonic() < deadline and run.poll() is None, run.communicate()
        time.sleep(0.05)
    run.send_signal(signal.SIGINT)
    time.sleep(0.3)
    run.send_signal(signal.SIGINT)
    began = time.monotonic()
    _, err = run.communicate(timeout=20)
    assert run.returncode == 130, err
    assert time.monotonic() - began < 5, "the second SIGINT waited for the copies"
    assert "Traceback" not in err and "Fatal" not in err

    seaweed_proxy.remove(stall)
    again = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60,
                           check=False)
    assert again.returncode == 0, again.stderr
    assert read_bucket(seaweed, bucket, "dst/") == objects
