"""End-to-end syncs against real servers (moto and SeaweedFS processes on 127.0.0.1), every
one checked byte for byte."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from mcsync.stores.registry import open_store
from mcsync.types import Capabilities

from .helpers import (
    new_bucket,
    payload,
    put_objects,
    read_bucket,
    read_tree,
    run_cli,
    sync_stores,
    write_tree,
)

MiB = 1 << 20
PART = 5 * MiB
SIZES = {"empty": 0, "one": 1, "part-minus-1": PART - 1, "part": PART, "part-plus-1": PART + 1}
TRICKY_KEYS = [
    "with space/a b.bin",
    "unicode/日本語/ファイル.bin",
    "plus+sign.bin",
    "percent%20literal.bin",
    "eq=val/x=1.bin",
    "deep/" + "/".join(f"d{i}" for i in range(12)) + "/leaf.bin",
    "a-b",
    "a/b",
]


def sample_objects() -> dict[str, bytes]:
    objs = {f"sizes/{name}.bin": payload(size, i) for i, (name, size) in enumerate(SIZES.items())}
    objs.update({key: payload(1000 + i, 100 + i) for i, key in enumerate(TRICKY_KEYS)})
    return objs


@pytest.fixture(params=["moto", "seaweed"])
def s3ep(request):
    return request.getfixturevalue(request.param)


def sync_json(*args: str, env: dict[str, str]) -> dict:
    result = run_cli("sync", *args, "--part-size", "5MiB", "--json", "--quiet", env=env)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_local_to_meta_then_nothing_to_do(s3ep, tmp_path):
    objs = sample_objects()
    write_tree(tmp_path / "src", objs)
    bucket = new_bucket(s3ep)
    dst = f"meta://{bucket}/run-7/step-1200/"
    report = sync_json(str(tmp_path / "src"), dst, env=s3ep.meta_env())
    assert read_bucket(s3ep, bucket, "run-7/step-1200/") == objs
    assert report["objects_copied"] == len(objs)
    assert report["bytes_copied"] == sum(map(len, objs.values()))
    assert all(o["xxh3_128"] for o in report["objects"])

    again = sync_json(str(tmp_path / "src"), dst, env=s3ep.meta_env())
    assert again["objects_copied"] == 0 and again["objects_skipped"] == len(objs)


def test_s3_to_local(s3ep, tmp_path):
    objs = sample_objects()
    bucket = new_bucket(s3ep)
    put_objects(s3ep, bucket, objs, prefix="datasets/llama-ft/")
    sync_json(f"s3://{bucket}/datasets/llama-ft", str(tmp_path / "dst"), env=s3ep.aws_env())
    assert read_tree(tmp_path / "dst") == objs


def test_s3_to_meta_on_one_endpoint_is_server_side(s3ep):
    objs = sample_objects()
    src, dst = new_bucket(s3ep, "src"), new_bucket(s3ep, "dst")
    put_objects(s3ep, src, objs)
    report = sync_json(f"s3://{src}/", f"meta://{dst}/copy/", env=s3ep.aws_env() | s3ep.meta_env())
    assert report["objects_server_copied"] == len(objs)
    assert report["bytes_copied"] == 0
    assert read_bucket(s3ep, dst, "copy/") == objs


def test_s3_to_meta_across_endpoints(seaweed, seaweed_b):
    objs = sample_objects()
    src, dst = new_bucket(seaweed, "src"), new_bucket(seaweed_b, "dst")
    put_objects(seaweed, src, objs)
    report = sync_json(
        f"s3://{src}/", f"meta://{dst}/", env=seaweed.aws_env() | seaweed_b.meta_env()
    )
    assert report["objects_copied"] == len(objs)
    assert report["objects_server_copied"] == 0
    assert read_bucket(seaweed_b, dst) == objs


def test_local_to_local(tmp_path):
    objs = sample_objects()
    write_tree(tmp_path / "src", objs)
    report = sync_json(str(tmp_path / "src"), f"file://{tmp_path / 'dst'}", env={})
    assert read_tree(tmp_path / "dst") == objs
    assert report["objects_copied"] == len(objs)


def test_the_json_report_reaches_a_slow_reader_whole(tmp_path):
    # A report of 1,500 objects is ~350 KB, more than a pipe holds: the command has to wait
    # for its reader. Right after uvloop closed its loop that write came back short, and
    # the reader got the first 64 KiB and an exit code of 0.
    objs = {f"d{i // 500}/f{i:04}.txt": payload(10, i) for i in range(1_500)}
    write_tree(tmp_path / "src", objs)
    env = {**os.environ, "XDG_STATE_HOME": str(tmp_path / "state")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "mcsync.cli.main", "sync", str(tmp_path / "src"),
         str(tmp_path / "dst"), "--json", "--quiet"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
    )  # fmt: skip
    time.sleep(1.5)  # not reading yet: the pipe fills
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err.decode()[-3000:]
    assert len(out) > 64 * 1024
    report = json.loads(out)
    assert report["objects_copied"] == len(objs)
    assert read_tree(tmp_path / "dst") == objs


@pytest.mark.slow
def test_100_mib_object_moves_in_parts_both_ways(seaweed, tmp_path):
    big = payload(100 * MiB, 7)
    write_tree(tmp_path / "src", {"model.safetensors": big})
    bucket = new_bucket(seaweed)
    result = run_cli(
        "sync",
        str(tmp_path / "src"),
        f"meta://{bucket}/",
        "--json",
        "--quiet",
        env=seaweed.meta_env(),
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    (obj,) = report["objects"]
    assert obj["hash_block_size"] == 8 * MiB  # default part size: 13 parts
    assert read_bucket(seaweed, bucket) == {"model.safetensors": big}
    head = seaweed.client().head_object(Bucket=bucket, Key="model.safetensors")
    assert head["ETag"].strip('"').endswith("-13")  # really a multipart upload
    # 13 parts, at most as many on the wire at once as the goodput limit allowed
    assert 2 <= report["parts_in_flight_peak"] <= report["parts_in_flight_limit_peak"]

    sync_json(f"s3://{bucket}/", str(tmp_path / "back"), env=seaweed.aws_env())
    assert (tmp_path / "back" / "model.safetensors").read_bytes() == big


@pytest.mark.slow
def test_5000_small_objects(seaweed, tmp_path):
    objs = {f"shard-{i // 500:02d}/{i:05d}.bin": payload(64 + i % 512, i) for i in range(5000)}
    write_tree(tmp_path / "src", objs)
    bucket = new_bucket(seaweed)
    report = sync_json(str(tmp_path / "src"), f"meta://{bucket}/small/", env=seaweed.meta_env())
    assert report["objects_copied"] == 5000
    assert read_bucket(seaweed, bucket, "small/") == objs


def test_include_exclude(tmp_path):
    objs = {
        "m/model.safetensors": b"w",
        "m/config.json": b"{}",
        "tmp/x.safetensors": b"t",
        "m/opt.bin": b"o",
    }
    write_tree(tmp_path / "src", objs)
    sync_json(
        str(tmp_path / "src"),
        str(tmp_path / "dst"),
        "--include",
        "*.safetensors",
        "--include",
        "*.json",
        "--exclude",
        "tmp/*",
        env={},
    )
    assert read_tree(tmp_path / "dst") == {"m/model.safetensors": b"w", "m/config.json": b"{}"}


def test_delete_removes_only_with_flag(s3ep, tmp_path):
    write_tree(tmp_path / "src", {"keep.bin": b"k"})
    bucket = new_bucket(s3ep)
    put_objects(s3ep, bucket, {"keep.bin": b"old", "stale.bin": b"s", "other/x": b"x"})
    env = s3ep.meta_env()
    sync_json(str(tmp_path / "src"), f"meta://{bucket}/", env=env)
    assert read_bucket(s3ep, bucket) == {"keep.bin": b"k", "stale.bin": b"s", "other/x": b"x"}
    report = sync_json(str(tmp_path / "src"), f"meta://{bucket}/", "--delete", env=env)
    assert report["objects_deleted"] == 2
    assert read_bucket(s3ep, bucket) == {"keep.bin": b"k"}


def test_dry_run_and_plan_move_nothing(seaweed, tmp_path):
    objs = sample_objects()
    write_tree(tmp_path / "src", objs)
    bucket = new_bucket(seaweed)
    env = seaweed.meta_env()
    result = run_cli("plan", str(tmp_path / "src"), f"meta://{bucket}/", env=env)
    assert result.exit_code == 0, result.output
    copy_row = next(line for line in result.stdout.splitlines() if line.startswith("copy "))
    assert copy_row.split()[1] == str(len(objs))
    assert "sizes/ " in result.stdout  # the per-directory summary
    long = run_cli("plan", "--long", str(tmp_path / "src"), f"meta://{bucket}/", env=env)
    for key in objs:
        assert key in long.stdout
    report = sync_json(str(tmp_path / "src"), f"meta://{bucket}/", "--dry-run", env=env)
    assert report["dry_run"] and report["objects_copied"] == len(objs)
    assert read_bucket(seaweed, bucket) == {}
    local = run_cli("sync", "--dry-run", str(tmp_path / "src"), str(tmp_path / "never"), env={})
    assert local.exit_code == 0, local.output
    assert not (tmp_path / "never").exists()


def test_ls_lists_keys_and_sizes(seaweed):
    bucket = new_bucket(seaweed)
    put_objects(seaweed, bucket, {"a/b c.bin": b"123", "z": b""})
    result = run_cli("ls", f"s3://{bucket}/", "--json", env=seaweed.aws_env())
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert [(r["key"], r["size"]) for r in rows] == [("a/b c.bin", 3), ("z", 0)]
    # mcsync's own state at a target is listed only with --all
    put_objects(seaweed, bucket, {".mcsync/lock-x.json": b"{}"})
    plain = run_cli("ls", f"s3://{bucket}/", env=seaweed.aws_env())
    assert ".mcsync" not in plain.stdout and "z" in plain.stdout
    assert ".mcsync/lock-x.json" in run_cli("ls", "-a", f"s3://{bucket}/",
                                            env=seaweed.aws_env()).stdout


def test_library_call_matches_cli(seaweed, tmp_path, monkeypatch):
    import mcsync

    objs = sample_objects()
    write_tree(tmp_path / "src", objs)
    bucket = new_bucket(seaweed)
    for k, v in seaweed.meta_env().items():
        monkeypatch.setenv(k, v)
    events = []
    report = mcsync.sync(
        str(tmp_path / "src"),
        f"meta://{bucket}/lib/",
        concurrency=16,
        part_size=PART,
        on_event=events.append,
    )
    assert isinstance(report, mcsync.SyncReport) and report.ok
    assert report.objects_copied == len(objs)
    assert read_bucket(seaweed, bucket, "lib/") == objs
    moved = sum(getattr(e, "nbytes", 0) for e in events)
    assert moved == sum(map(len, objs.values()))


def test_server_side_copy_in_parts_above_the_cutoff(s3ep, monkeypatch):
    # The real cutoff is S3's 5 GiB CopyObject limit; with the target's limits scaled down, the
    # same path runs here.
    objs = {"big.bin": payload(3 * PART + 123, 9), "small.bin": b"s"}
    src, dst = new_bucket(s3ep, "src"), new_bucket(s3ep, "dst")
    put_objects(s3ep, src, objs)
    for name, value in (s3ep.aws_env() | s3ep.meta_env()).items():
        monkeypatch.setenv(name, value)
    target = open_store(f"meta://{dst}/")
    target.caps = Capabilities(max_copy_size=8 * MiB, max_part_size=PART, send_copies=2)
    report = sync_stores(open_store(f"s3://{src}/"), target, part_size=5 * MiB)
    assert report.objects_server_copied == 2 and report.bytes_copied == 0
    assert read_bucket(s3ep, dst) == objs
    head = s3ep.client().head_object(Bucket=dst, Key="big.bin")
    assert head["ETag"].strip('"').endswith("-4")  # really UploadPartCopy, 4 parts
