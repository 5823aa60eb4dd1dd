"""Scale: planning many keys costs memory flat in their number.

``mcsync plan`` runs as a child process against a synthetic bucket (``testbed.synthetic``,
a server process of its own that computes each listing page) or a local tree of empty files; its
peak RSS is read by ``testbed/rusage.py`` (``ru_maxrss`` of the mcsync process, and the
sampled sum of its process tree) and its counts from ``--json``. The fast cases compare 20k
with 200k keys: memory per key (rclone's ~1 KB an object) would show as ~180 MB, per-key state
of a few dozen bytes as ~10 MB. The slow cases plan a million keys under 300 MiB.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.config import Config

from mcsync.events import ObjectDone, StatsCollector
from mcsync.report import MAX_LISTED_OBJECTS, ObjectResult
from testbed.rusage import launcher_argv
from testbed.synthetic import SyntheticBucket, serve_in_thread, synthetic_server

MCSYNC = [sys.executable, "-m", "mcsync.cli.main"]
MiB = 1024 * 1024


def measured(argv: list[str], env: dict[str, str], tmp: Path, name: str) -> dict[str, Any]:
    """Run ``argv`` under the launcher: its report (wall, CPU, RSS in KiB) and its stdout."""
    out = tmp / f"{name}.rusage.json"
    proc = subprocess.run(launcher_argv(out, argv),
                          env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    usage = json.loads(out.read_text())
    usage["peak_kib"] = max(usage["maxrss_kib"], usage["tree_rss_peak_kib"] or 0)
    usage["stdout"] = proc.stdout
    return usage


def child_env(tmp: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "MCSYNC_"))}
    env.update(extra or {})
    env["XDG_STATE_HOME"] = str(tmp / "state")
    return env


def plan_s3(keys: int, tmp: Path) -> tuple[dict[str, Any], SyntheticBucket]:
    bucket = SyntheticBucket(keys)
    with synthetic_server(keys, log_path=tmp / f"syn-{keys}.log") as ep:
        empty = tmp / f"empty-{keys}"
        usage = measured([*MCSYNC, "plan", "meta://synthetic/", str(empty), "--json"],
                         child_env(tmp, ep.meta_env()), tmp, f"plan-s3-{keys}")
    return usage, bucket


def make_tree(root: Path, bucket: SyntheticBucket) -> None:
    last = None
    for i in range(bucket.keys):
        directory, _, name = bucket.key(i).rpartition("/")
        if directory != last:
            (root / directory).mkdir(parents=True)
            last = directory
        os.close(os.open(root / directory / name, os.O_CREAT | os.O_WRONLY, 0o644))


SHM = Path("/dev/shm")


@pytest.fixture
def tree_dir(tmp_path: Path) -> Iterator[Path]:
    """Where a tree of empty files is made: tmpfs when there is one with inodes to spare.

    Creates and deletes cost twice as much on this project's ext4 disks as on tmpfs when the
    disk is fresh, more after a day of tests (the million-file test: 138 s in the suite, 27 s
    on tmpfs), and a million of them leave ext4 slow for minutes after (freed inodes are
    searched on every create), which would bill every later test. The tree is walked the
    same way on either.
    """
    try:
        free = os.statvfs(SHM).f_favail
    except OSError:
        free = 0
    if free < 2_000_000 or not os.access(SHM, os.W_OK):
        yield tmp_path
        return
    with tempfile.TemporaryDirectory(prefix="mcsync-tree-", dir=SHM) as d:
        yield Path(d)


def plan_local(keys: int, tmp: Path, trees: Path) -> dict[str, Any]:
    tree = trees / f"tree-{keys}"
    make_tree(tree, SyntheticBucket(keys))
    try:
        return measured([*MCSYNC, "plan", str(tree), str(tmp / f"empty-{keys}"), "--json"],
                        child_env(tmp), tmp, f"plan-local-{keys}")
    finally:
        shutil.rmtree(tree)


def report_of(usage: dict[str, Any]) -> dict[str, Any]:
    report: dict[str, Any] = json.loads(usage["stdout"])
    return report


# -- the synthetic server --------------------------------------------------------------------


def test_synthetic_server_lists_pages_like_s3():
    bucket = SyntheticBucket(2_345, per_dir=1000)
    with serve_in_thread(bucket) as ep:
        s3 = boto3.client("s3", endpoint_url=ep.url, aws_access_key_id="k",
                          aws_secret_access_key="s", region_name="us-east-1",
                          config=Config(s3={"addressing_style": "path"}))
        pages = s3.get_paginator("list_objects_v2")
        for size in (1000, 7):
            keys = [o["Key"] for p in pages.paginate(Bucket="synthetic",
                                                     PaginationConfig={"PageSize": size})
                    for o in p.get("Contents", ())]
            assert keys == [bucket.key(i) for i in range(bucket.keys)]
        assert keys == sorted(keys, key=str.encode)
        dirs = [c["Prefix"] for p in pages.paginate(Bucket="synthetic", Delimiter="/",
                                                     PaginationConfig={"PageSize": 2})
                for c in p.get("CommonPrefixes", ())]
        assert dirs == ["shard-000000/", "shard-000001/", "shard-000002/"]
        page = s3.list_objects_v2(Bucket="synthetic", Prefix="shard-000002/",
                                  StartAfter="shard-000002/part-0343.bin")
        assert [o["Key"] for o in page["Contents"]] == ["shard-000002/part-0344.bin"]
        head = s3.head_object(Bucket="synthetic", Key=bucket.key(1234))
        assert head["ContentLength"] == bucket.size(1234)
        body = s3.get_object(Bucket="synthetic", Key=bucket.key(1234), Range="bytes=5-9")
        assert body["Body"].read() == bucket.body(1234)[5:10]


def test_small_sync_from_the_synthetic_bucket_is_byte_exact(tmp_path):
    bucket = SyntheticBucket(1_500, per_dir=500, max_size=3000)
    with serve_in_thread(bucket) as ep:
        target = tmp_path / "target"
        proc = subprocess.run([*MCSYNC, "sync", "meta://synthetic/", str(target), "--json",
                               "--quiet"], env=child_env(tmp_path, ep.meta_env()),
                              capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    assert report["objects_copied"] == bucket.keys
    assert report["bytes_copied"] == bucket.total_size()
    for i in range(0, bucket.keys, 97):
        assert (target / bucket.key(i)).read_bytes() == bucket.body(i)


# -- the report names a bounded number of objects ----------------------------------------------


def test_report_counts_every_object_but_names_the_first_ones():
    stats = StatsCollector("src", "dst")
    n = MAX_LISTED_OBJECTS + 2_500
    for i in range(n):
        stats.emit(ObjectDone(ObjectResult(f"k{i:06d}", "copy", 10, 10)))
    report = stats.finish()
    assert report.objects_copied == n and report.bytes_copied == 10 * n
    assert len(report.objects) == MAX_LISTED_OBJECTS
    assert report.objects_not_listed == n - MAX_LISTED_OBJECTS
    doc = report.to_dict()
    assert len(doc["objects"]) == MAX_LISTED_OBJECTS
    assert doc["objects_not_listed"] == 2_500


# -- memory flat in the number of keys ---------------------------------------------------------


def test_planning_an_s3_listing_costs_memory_flat_in_the_number_of_keys(tmp_path):
    small, small_bucket = plan_s3(20_000, tmp_path)
    large, large_bucket = plan_s3(200_000, tmp_path)
    for usage, bucket in ((small, small_bucket), (large, large_bucket)):
        report = report_of(usage)
        assert report["objects_copied"] == bucket.keys
        assert report["bytes_copied"] == bucket.total_size()
        assert report["objects_failed"] == 0 and report["objects"] == []
    grown = (large["peak_kib"] - small["peak_kib"]) * 1024
    assert grown < 30 * MiB, (small["peak_kib"], large["peak_kib"])


def test_planning_a_local_tree_costs_memory_flat_in_the_number_of_keys(tmp_path, tree_dir):
    small = plan_local(20_000, tmp_path, tree_dir)
    large = plan_local(200_000, tmp_path, tree_dir)
    for usage, keys in ((small, 20_000), (large, 200_000)):
        report = report_of(usage)
        assert report["objects_copied"] == keys and report["bytes_copied"] == 0
    grown = (large["peak_kib"] - small["peak_kib"]) * 1024
    assert grown < 30 * MiB, (small["peak_kib"], large["peak_kib"])


@pytest.mark.slow
def test_planning_a_million_s3_keys_stays_under_300_mib(tmp_path):
    usage, bucket = plan_s3(1_000_000, tmp_path)
    report = report_of(usage)
    assert report["objects_copied"] == 1_000_000
    assert report["bytes_copied"] == bucket.total_size()
    assert usage["peak_kib"] * 1024 < 300 * MiB, usage


@pytest.mark.slow
def test_planning_a_million_local_files_stays_under_300_mib(tmp_path, tree_dir):
    usage = plan_local(1_000_000, tmp_path, tree_dir)
    report = report_of(usage)
    assert report["objects_copied"] == 1_000_000
    assert usage["peak_kib"] * 1024 < 300 * MiB, usage
