"""A run says what limited it: each case is built to be bound by one thing, and the verdict in
the report (``--json``'s ``limited_by``) must name that thing. The verdict is asserted, not a
time: the figures behind it are the run's own measurements."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from testbed.faultproxy import FaultProxy, Rule, Stall
from testbed.servers import S3Endpoint

from .helpers import new_bucket, payload, put_objects, read_bucket, read_tree, run_cli, write_tree


def sync_json(*args: str, env: dict[str, str]) -> dict:
    result = run_cli("sync", *args, "--json", env=env)
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["limited_by"] is not None, doc
    return doc


def test_a_bwlimit_well_under_the_servers_rate_is_the_limit(tmp_path: Path,
                                                            seaweed: S3Endpoint) -> None:
    files = {f"shard-{i}.bin": payload(1 << 20, i) for i in range(6)}
    write_tree(tmp_path / "src", files)
    bucket = new_bucket(seaweed)
    doc = sync_json(str(tmp_path / "src"), f"meta://{bucket}/", "--bwlimit", "2MiB",
                    env=seaweed.meta_env())
    assert doc["limited_by"]["verdict"] == "bwlimit", doc["limited_by"]
    assert read_bucket(seaweed, bucket) == files


def test_a_target_slow_to_answer_is_the_limit(tmp_path: Path, seaweed: S3Endpoint,
                                              seaweed_proxy: FaultProxy) -> None:
    files = {f"obj-{i:03d}": payload(64 << 10, i) for i in range(24)}
    write_tree(tmp_path / "src", files)
    bucket = new_bucket(seaweed)
    seaweed_proxy.add(Rule(Stall(0.2), op="PutObject"))
    doc = sync_json(str(tmp_path / "src"), f"meta://{bucket}/", "-c", "4",
                    env=seaweed_proxy.endpoint.meta_env())
    assert doc["limited_by"]["verdict"] == "target", doc["limited_by"]
    assert read_bucket(seaweed, bucket) == files


def test_a_source_slow_to_answer_is_the_limit(tmp_path: Path, seaweed: S3Endpoint,
                                              seaweed_proxy: FaultProxy) -> None:
    files = {f"obj-{i:03d}": payload(64 << 10, i) for i in range(24)}
    bucket = new_bucket(seaweed)
    put_objects(seaweed, bucket, files)
    seaweed_proxy.add(Rule(Stall(0.2), op="GetObject"))
    doc = sync_json(f"meta://{bucket}/", str(tmp_path / "dst"), "-c", "4",
                    env=seaweed_proxy.endpoint.meta_env())
    assert doc["limited_by"]["verdict"] == "source", doc["limited_by"]
    assert read_tree(tmp_path / "dst") == files


def test_many_small_files_one_at_a_time_between_local_trees_are_bound_by_the_client(
        shm_dir: Path) -> None:
    files = {f"d{i % 20:02d}/f{i:05d}": payload(256, i) for i in range(3000)}
    write_tree(shm_dir / "src", files)
    doc = sync_json(str(shm_dir / "src"), str(shm_dir / "dst"), "-c", "1", env={})
    assert doc["limited_by"]["verdict"] == "client", doc["limited_by"]
    assert read_tree(shm_dir / "dst") == files


# With --workers the workers make the requests: what they spent comes back with each task's
# result and is added to the driver's. 64 objects make two tasks (32 objects each), one per
# worker; the driver itself PUTs or GETs none of the objects (only its lock and manifest), so
# a request time at least the proxy's holds of the objects' requests is the workers'.
STALL_S = 0.2


@pytest.mark.parametrize("side", ["target", "source"])
def test_with_workers_the_side_slow_to_answer_is_the_limit_and_the_workers_time_counts(
        side: str, tmp_path: Path, seaweed: S3Endpoint, seaweed_proxy: FaultProxy) -> None:
    files = {f"obj-{i:03d}": payload(64 << 10, i) for i in range(64)}
    bucket = new_bucket(seaweed)
    if side == "target":
        op, args = "PutObject", (str(tmp_path / "src"), f"meta://{bucket}/")
        write_tree(tmp_path / "src", files)
    else:
        op, args = "GetObject", (f"meta://{bucket}/", str(tmp_path / "dst"))
        put_objects(seaweed, bucket, files)
    seaweed_proxy.add(Rule(Stall(STALL_S), op=op))
    doc = sync_json(*args, "-c", "4", "--workers", "2", env=seaweed_proxy.endpoint.meta_env())
    found = doc["limited_by"]
    held = len(seaweed_proxy.exchanges(op, fault="stall", key="obj-*"))
    assert held >= len(files), seaweed_proxy.summary()
    assert found["verdict"] == side, found
    assert found[f"{side}_s"] >= 0.9 * STALL_S * held, (found, held)
    assert found["processes"] == 3, found  # the driver and both workers
    moved = read_bucket(seaweed, bucket) if side == "target" else read_tree(tmp_path / "dst")
    assert moved == files
