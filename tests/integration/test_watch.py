"""``mcsync sync --watch`` as a training job's sidecar would run it, against SeaweedFS and moto.

A writer thread plays the trainer: every step it writes a new checkpoint directory for three
frameworks (PyTorch DCP, DeepSpeed, Hugging Face Trainer), its files slowly and its completion
marker last, as each framework does. A poller lists the target all the while and asserts the
one thing a preempted trainer relies on: whenever a completion marker is visible at the target,
every file of its checkpoint is there, whole. At the end the watch is sent SIGTERM and exits 0,
and the target is the source, byte for byte.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from testbed.servers import S3Endpoint

from .helpers import new_bucket, payload, put_objects, read_bucket, read_tree

REPO = Path(__file__).parents[2]
STEPS = 3


def start_watch(*args: str, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "mcsync.cli.main", "sync", *args, "--watch"],
                            env=dict(os.environ) | env, cwd=REPO, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def stop_watch(proc: subprocess.Popen[str], timeout: float = 60) -> tuple[int, str]:
    proc.send_signal(signal.SIGTERM)
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
    return proc.returncode, err


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def write_slowly(path: Path, data: bytes, pieces: int = 4, pause: float = 0.1) -> None:
    """A file written in pieces, as a trainer streams a shard out."""
    path.parent.mkdir(parents=True, exist_ok=True)
    step = -(-len(data) // pieces)
    with open(path, "wb") as f:
        for i in range(0, len(data), step):
            f.write(data[i:i + step])
            f.flush()
            time.sleep(pause)


def publish(path: Path, data: bytes) -> None:
    """A marker written by rename, as DCP writes .metadata."""
    tmp = path.with_name(path.name + ".tmp-writing")
    tmp.write_bytes(data)
    os.replace(tmp, path)


class Trainer(threading.Thread):
    """Writes STEPS checkpoints of each framework under ``root``; ``expected`` is every file's
    final content."""

    def __init__(self, root: Path) -> None:
        super().__init__(daemon=True)
        self.root = root
        self.expected: dict[str, bytes] = {}
        self.error: BaseException | None = None
        self.finished_at = float("inf")

    def put(self, key: str, data: bytes, *, marker: bool = False) -> None:
        (publish if marker else write_slowly)(self.root / key, data)
        self.expected[key] = data

    def run(self) -> None:
        try:
            for step in range(1, STEPS + 1):
                seed = step * 10
                for rank in range(2):  # PyTorch DCP: shards, then .metadata by rename
                    self.put(f"dcp/step-{step}/__{rank}_0.distcp", payload(300_000, seed + rank))
                self.put(f"dcp/step-{step}/.metadata", b"dcp-meta-%d" % step, marker=True)
                for rank in range(2):  # DeepSpeed: global_stepN/, then `latest` naming it
                    self.put(f"ds/global_step{step}/mp_rank_0{rank}_model_states.pt",
                             payload(200_000, seed + 5 + rank))
                self.put("ds/latest", b"global_step%d" % step, marker=True)
                # Hugging Face Trainer: weights, optimizer, then trainer_state.json
                self.put(f"hf/checkpoint-{step * 100}/model.safetensors", payload(400_000, seed))
                self.put(f"hf/checkpoint-{step * 100}/optimizer.pt", payload(100_000, seed + 1))
                self.put(f"hf/checkpoint-{step * 100}/trainer_state.json",
                         json.dumps({"global_step": step * 100}).encode(), marker=True)
                time.sleep(0.5)
        except BaseException as exc:
            self.error = exc
        self.finished_at = time.monotonic()


class Poller(threading.Thread):
    """Lists the target until stopped; every listing must show each visible checkpoint whole.
    ``violations`` holds what a reader would have found broken."""

    def __init__(self, ep: S3Endpoint, bucket: str, expected: dict[str, bytes]) -> None:
        super().__init__(daemon=True)
        self.client = ep.client()
        self.bucket = bucket
        self.expected = expected
        self.stop = threading.Event()
        self.listings = 0
        self.markers_seen: set[str] = set()
        self.first_marker_at = float("inf")
        self.violations: list[str] = []

    def sizes(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket):
            out |= {o["Key"]: o["Size"] for o in page.get("Contents", [])}
        return out

    def check(self, marker: str, directory: str, there: dict[str, int]) -> None:
        self.first_marker_at = min(self.first_marker_at, time.monotonic())
        self.markers_seen.add(marker if marker != "ds/latest" else f"ds/latest->{directory}")
        files = {k: len(v) for k, v in self.expected.items()
                 if k.startswith(directory + "/") and k != marker}
        broken = {k: there.get(k) for k, n in files.items() if there.get(k) != n}
        if not files or broken:
            self.violations.append(f"{marker} visible, but {directory}/ holds "
                                   f"{broken or 'nothing'}")

    def run(self) -> None:
        while not self.stop.is_set():
            latest = None
            # read before listing: a checkpoint's files are always written before its marker
            with contextlib.suppress(self.client.exceptions.NoSuchKey):
                latest = self.client.get_object(Bucket=self.bucket, Key="ds/latest")["Body"].read()
            there = self.sizes()
            self.listings += 1
            if latest is not None:
                self.check("ds/latest", f"ds/{latest.decode()}", there)
            for key in there:
                if re.fullmatch(r"dcp/step-\d+/\.metadata", key):
                    self.check(key, key.rsplit("/", 1)[0], there)
                if re.fullmatch(r"hf/checkpoint-\d+/trainer_state\.json", key):
                    self.check(key, key.rsplit("/", 1)[0], there)
            time.sleep(0.05)


def wait_for(condition, timeout: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


def test_a_trainer_writing_checkpoints_is_mirrored_marker_last(seaweed, tmp_path):
    bucket = new_bucket(seaweed)
    src = tmp_path / "ckpt"
    src.mkdir()
    trainer = Trainer(src)
    port = free_port()
    report_path = tmp_path / "report.json"
    proc = start_watch(str(src), f"meta://{bucket}/", "--interval", "1s", "--min-age", "1s",
                       "--report", str(report_path), "--metrics-addr", f"127.0.0.1:{port}",
                       env=seaweed.meta_env())
    poller = Poller(seaweed, bucket, trainer.expected)
    try:
        poller.start()
        trainer.start()
        wait_for(lambda: report_path.exists(), 60, "the first cycle's report")
        first = json.loads(report_path.read_text())["cycle"]
        scraped = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
        trainer.join(timeout=120)
        assert trainer.error is None and not trainer.is_alive()
        wait_for(lambda: read_bucket(seaweed, bucket) == trainer.expected, 90,
                 "the target to hold every checkpoint")
        cycle = json.loads(report_path.read_text())
    finally:
        poller.stop.set()
        poller.join(timeout=30)
        code, err = stop_watch(proc)
    assert code == 0, err
    assert poller.violations == [], poller.violations[:5]
    # checkpoints reached the target while the trainer was still writing later ones
    assert poller.listings > 20 and poller.first_marker_at < trainer.finished_at
    assert f"ds/latest->ds/global_step{STEPS}" in poller.markers_seen
    assert cycle["cycle"] > first and cycle["exit_code"] == 0  # rewritten after each cycle
    text = scraped.decode()
    assert re.search(r'^mcsync_runs_total\{result="ok"\} [1-9]', text, re.M), text[:2000]
    assert "mcsync_checkpoints_waiting" in text
    lines = [line for line in err.splitlines() if re.match(r"\d\d:\d\d:\d\d cycle \d+", line)]
    assert len(lines) >= 2 and all("failed 0" in line for line in lines), err[-2000:]
    assert "SIGTERM" in err


def test_a_growing_file_is_never_copied_half(tmp_path):
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.mkdir()
    final = payload(2_000_000, 3)
    seen: list[int] = []
    stop = threading.Event()

    def poll() -> None:
        while not stop.is_set():
            target = dst / "growing.bin"
            if target.exists():
                seen.append(target.stat().st_size)
            time.sleep(0.02)

    proc = start_watch(str(src), str(dst), "--interval", "1s", "--min-age", "2s", env={})
    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    try:
        write_slowly(src / "growing.bin", final, pieces=20, pause=0.2)  # 4 s of appends
        wait_for(lambda: (dst / "growing.bin").exists()
                 and (dst / "growing.bin").read_bytes() == final, 60, "the whole file")
        wait_for(lambda: bool(seen), 10, "the poller to see the file too")
    finally:
        stop.set()
        poller.join(timeout=10)
        code, err = stop_watch(proc)
    assert code == 0, err
    assert seen and set(seen) == {len(final)}, sorted(set(seen))[:10]


def test_watching_an_s3_source_picks_up_new_objects(moto, tmp_path):
    bucket = new_bucket(moto)
    put_objects(moto, bucket, {"a.bin": payload(1000, 1)})
    dst = tmp_path / "dst"
    proc = start_watch(f"s3://{bucket}/", str(dst), "--interval", "2s", "--min-age", "0",
                       env=moto.aws_env())
    try:
        wait_for(lambda: (dst / "a.bin").exists(), 60, "the first object")
        put_objects(moto, bucket, {"later/b.bin": payload(5000, 2)})
        # a new object is found by the next listing: within an interval or two of slack
        wait_for(lambda: (dst / "later" / "b.bin").exists(), 30, "the object put later")
    finally:
        code, err = stop_watch(proc)
    assert code == 0, err
    assert read_tree(dst) == {"a.bin": payload(1000, 1), "later/b.bin": payload(5000, 2)}


@pytest.mark.parametrize("args", [("--interval", "5s"), ("--watch", "--dry-run")],
                         ids=["interval-without-watch", "watch-dry-run"])
def test_watch_options_that_make_no_sense_are_usage_errors(tmp_path, args):
    (tmp_path / "src").mkdir()
    result = subprocess.run([sys.executable, "-m", "mcsync.cli.main", "sync", str(tmp_path / "src"),
                             str(tmp_path / "dst"), *args], cwd=REPO, capture_output=True,
                            text=True, check=False)
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("\n") == 1 and "error:" in result.stderr
    assert not (tmp_path / "dst").exists()
