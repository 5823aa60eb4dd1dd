"""``--concurrency auto``: objects in flight tuned from what the run measures. Each case is
built so that one answer is right — a target slow to answer wants many objects in flight, a
client whose CPU is the limit wants no more — and the report's ``concurrency`` (what the
tuning settled on, the most it allowed) is asserted, never a time."""

from __future__ import annotations

import json
from pathlib import Path

from mcsync.limits import TUNED_OBJECTS_START
from testbed.faultproxy import FaultProxy, Rule, Stall
from testbed.servers import S3Endpoint

from .helpers import new_bucket, payload, read_bucket, read_tree, run_cli, write_tree


def sync_json(*args: str, env: dict[str, str]) -> tuple[dict, str]:
    result = run_cli("sync", *args, "--json", env=env)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout), result.stderr


def test_a_target_slow_to_answer_gets_more_objects_in_flight(
        tmp_path: Path, seaweed: S3Endpoint, seaweed_proxy: FaultProxy) -> None:
    # Every PUT held 100 ms: objects per second grow with the objects in flight, so no climb
    # costs throughput and the tuning keeps doubling (32 -> 64 -> 128 ...).
    files = {f"d{i % 10}/obj-{i:04d}": payload(1024, i) for i in range(1500)}
    write_tree(tmp_path / "src", files)
    bucket = new_bucket(seaweed)
    seaweed_proxy.add(Rule(Stall(0.1), op="PutObject"))
    doc, stderr = sync_json(str(tmp_path / "src"), f"meta://{bucket}/", "-c", "auto",
                            env=seaweed_proxy.endpoint.meta_env())
    settled = doc["concurrency"]
    assert settled["objects_peak"] >= 4 * TUNED_OBJECTS_START, settled  # doubled twice
    assert settled["objects"] > TUNED_OBJECTS_START, settled
    assert doc["limited_by"]["verdict"] == "target", doc["limited_by"]
    assert "--concurrency auto settled on" in stderr
    assert read_bucket(seaweed, bucket) == files


def test_a_client_bound_run_grows_no_further(shm_dir: Path) -> None:
    # Many tiny files between two tmpfs trees: this process's CPU is the limit, and more
    # objects in flight cannot help. The tuning may climb once before the run's first verdict
    # (a second in), never after it.
    files = {f"d{i % 20:02d}/f{i:05d}": payload(256, i) for i in range(4000)}
    write_tree(shm_dir / "src", files)
    doc, _ = sync_json(str(shm_dir / "src"), str(shm_dir / "dst"), "-c", "auto", env={})
    assert doc["limited_by"]["verdict"] == "client", doc["limited_by"]
    settled = doc["concurrency"]
    assert settled["objects_peak"] <= 2 * TUNED_OBJECTS_START, settled
    assert read_tree(shm_dir / "dst") == files


def test_a_fixed_concurrency_reports_no_tuning(tmp_path: Path) -> None:
    files = {f"f{i}": payload(100, i) for i in range(5)}
    write_tree(tmp_path / "src", files)
    doc, stderr = sync_json(str(tmp_path / "src"), str(tmp_path / "dst"), "-c", "8", env={})
    assert doc["concurrency"] is None
    assert "settled on" not in stderr
    assert read_tree(tmp_path / "dst") == files
