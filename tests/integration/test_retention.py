"""Retention at the target (``--keep-last``, ``--keep-every``) against SeaweedFS, as a training
job's sidecar runs it: a trainer thread writes checkpoints at steps 100…800 into a local
directory while ``mcsync sync --watch`` mirrors them; a poller lists the target every 100 ms and
asserts what a preempted trainer relies on (once one checkpoint has landed there is always a
complete one; ``latest`` names a complete one; no checkpoint shows its marker without all its
files). At the end the target holds exactly steps 400, 700 and 800, and the source is as the
trainer left it. Then: kill -9 at ten points of a prune and a restart; the refusals; the lag
from a marker at the source to the marker at the target with a long interval."""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from testbed.servers import S3Endpoint

from .helpers import new_bucket, payload, put_objects, read_bucket, read_tree, run_cli
from .test_watch import start_watch, stop_watch, wait_for, write_slowly

CRASHING_MCSYNC = Path(__file__).with_name("crashing_mcsync.py")
STEPS = range(100, 900, 100)
KEPT = (400, 700, 800)


def files_of(framework: str, step: int) -> tuple[dict[str, bytes], str]:
    """A checkpoint's files but its marker, and the marker's key (DeepSpeed: ``latest``)."""
    seed = step
    if framework == "deepspeed":
        d = f"global_step{step}/"
        return ({d + "mp_rank_00_model_states.pt": payload(60_000, seed),
                 d + "zero_pp_rank_0_mp_rank_00_optim_states.pt": payload(90_000, seed + 1)},
                "latest")
    if framework == "hf":
        d = f"checkpoint-{step}/"
        return ({d + "model.safetensors": payload(60_000, seed),
                 d + "optimizer.pt": payload(90_000, seed + 1)}, d + "trainer_state.json")
    d = f"step-{step}/"
    return ({d + "__0_0.distcp": payload(60_000, seed), d + "__1_0.distcp": payload(90_000, seed)},
            d + ".metadata")


def marker_text(framework: str, step: int) -> bytes:
    if framework == "deepspeed":
        return b"global_step%d" % step
    if framework == "hf":
        return json.dumps({"global_step": step}).encode()
    return b"dcp-meta-%d" % step


def checkpoint(framework: str, step: int) -> dict[str, bytes]:
    files, marker = files_of(framework, step)
    return {**files, marker: marker_text(framework, step)}


def final(framework: str, steps: tuple[int, ...] = KEPT) -> dict[str, bytes]:
    out: dict[str, bytes] = {}
    for step in steps:
        out |= checkpoint(framework, step)
    return out


def holds(ep: S3Endpoint, bucket: str, want: dict[str, bytes]) -> bool:
    """Does the bucket hold exactly ``want``? (False while a key listed is deleted before it
    is read: the watch is pruning.)"""
    client = ep.client()
    try:
        return read_bucket(ep, bucket) == want
    except client.exceptions.NoSuchKey:
        return False


class Trainer(threading.Thread):
    def __init__(self, root: Path, framework: str, pause: float = 0.3) -> None:
        super().__init__(daemon=True)
        self.root, self.framework, self.pause = root, framework, pause
        self.written: dict[str, bytes] = {}
        self.error: BaseException | None = None
        self.marker_times: dict[int, float] = {}

    def run(self) -> None:
        try:
            for step in STEPS:
                files, marker = files_of(self.framework, step)
                for key, data in files.items():
                    write_slowly(self.root / key, data, pieces=2, pause=0.02)
                text = marker_text(self.framework, step)
                tmp = self.root / (marker + ".tmp")
                tmp.parent.mkdir(parents=True, exist_ok=True)
                tmp.write_bytes(text)
                os.replace(tmp, self.root / marker)  # as DCP and HF publish: by rename
                self.marker_times[step] = time.time()
                self.written |= files | {marker: text}
                time.sleep(self.pause)
        except BaseException as exc:
            self.error = exc


class Poller(threading.Thread):
    """Lists the target every 100 ms; ``violations``: what a reader would have found broken."""

    def __init__(self, ep: S3Endpoint, bucket: str, framework: str) -> None:
        super().__init__(daemon=True)
        self.client, self.bucket, self.framework = ep.client(), bucket, framework
        self.stop = threading.Event()
        self.violations: list[str] = []
        self.landed = False
        self.listings = 0

    def complete(self, step: int, there: dict[str, int]) -> bool:
        files, _ = files_of(self.framework, step)
        return all(there.get(k) == len(v) for k, v in files.items())

    def run(self) -> None:
        while not self.stop.is_set():
            latest = None
            if self.framework == "deepspeed":  # read before listing: files go before it
                with contextlib.suppress(self.client.exceptions.NoSuchKey):
                    latest = self.client.get_object(Bucket=self.bucket,
                                                    Key="latest")["Body"].read().decode()
            there: dict[str, int] = {}
            for page in self.client.get_paginator("list_objects_v2").paginate(
                    Bucket=self.bucket):
                there |= {o["Key"]: o["Size"] for o in page.get("Contents", [])}
            self.listings += 1
            complete = []
            if latest is not None:
                step = int(latest.removeprefix("global_step"))
                if not self.complete(step, there):
                    self.violations.append(f"latest names {latest}, not complete")
                complete.append(step)
            for key in there:
                m = re.fullmatch(r"(?:checkpoint-|step-)(\d+)/(?:trainer_state\.json|\.metadata)",
                                 key)
                if m:
                    if self.complete(int(m.group(1)), there):
                        complete.append(int(m.group(1)))
                    else:
                        self.violations.append(f"{key} there, its checkpoint is not")
            if complete:
                self.landed = True
            elif self.landed:
                self.violations.append(f"no complete checkpoint: {sorted(there)[:8]}")
            time.sleep(0.1)


@pytest.mark.parametrize("framework", ["deepspeed", "hf", "dcp"])
def test_watch_beside_a_trainer_keeps_the_last_two_and_every_400th(seaweed, tmp_path,
                                                                   framework):
    bucket = new_bucket(seaweed)
    src = tmp_path / "ckpt"
    src.mkdir()
    trainer = Trainer(src, framework, pause=0.6)
    # --min-age 1s for the Trainer's files, which its marker does not vouch for.
    proc = start_watch(str(src), f"meta://{bucket}/", "--interval", "1s", "--keep-last", "2",
                       "--keep-every", "400", "--min-age", "1s", env=seaweed.meta_env())
    poller = Poller(seaweed, bucket, framework)
    want = final(framework) | ({"latest": b"global_step800"} if framework == "deepspeed"
                               else {})
    try:
        poller.start()
        time.sleep(3)  # the watch is up: it meets the checkpoints one by one
        trainer.start()
        trainer.join(timeout=120)
        assert trainer.error is None and not trainer.is_alive()
        wait_for(lambda: holds(seaweed, bucket, want), 60,
                 "exactly steps 400, 700, 800 at the target")
    finally:
        poller.stop.set()
        poller.join(timeout=30)
        code, err = stop_watch(proc)
    assert code == 0, err
    assert poller.violations == [], poller.violations[:5]
    assert poller.landed and poller.listings > 10
    assert read_tree(src) == trainer.written  # the source untouched
    cycles = [line for line in err.splitlines() if re.match(r"\d\d:\d\d:\d\d cycle \d+", line)]
    assert cycles and all("failed 0" in line for line in cycles), err[-2000:]
    assert "pruned checkpoint" in err, err[-2000:]  # pruned as newer ones landed


# Ten instants of a prune of five Hugging Face checkpoints (15 deletes, markers first).
KILL_POINTS = ["prune:1", "prune-done:1", "prune:2", "prune:3", "prune-done:4", "prune:5",
               "prune:7", "prune-done:9", "prune:12", "prune-done:15"]


@pytest.fixture(scope="module")
def trained_tree(tmp_path_factory):
    root = tmp_path_factory.mktemp("trained")
    for step in STEPS:
        for key, data in checkpoint("hf", step).items():
            (root / key).parent.mkdir(parents=True, exist_ok=True)
            (root / key).write_bytes(data)
    return root


@pytest.mark.parametrize("point", KILL_POINTS)
def test_kill_9_of_the_watch_during_a_prune_then_a_restart_finishes_it(
        seaweed, tmp_path, trained_tree, point):
    bucket = new_bucket(seaweed)
    everything = read_tree(trained_tree)
    put_objects(seaweed, bucket, everything)  # all eight there: five to prune
    env = dict(os.environ) | seaweed.meta_env() | {"CRASH_AT": point}
    args = [str(trained_tree), f"meta://{bucket}/", "--keep-last", "2", "--keep-every", "400",
            "--manifest", str(tmp_path / "m.sqlite"), "--interval", "1s"]
    crashed = subprocess.run([sys.executable, str(CRASHING_MCSYNC), "sync", *args, "--watch"],
                             env=env, capture_output=True, text=True, timeout=120)
    assert crashed.returncode == -9, crashed.stderr  # the watch, killed mid-prune

    held = read_bucket(seaweed, bucket)
    for key in held:  # no checkpoint shows its marker without all its files
        if key.endswith("/trainer_state.json"):
            d = key.rsplit("/", 1)[0] + "/"
            assert {k for k in everything if k.startswith(d)} <= set(held), key
    restored = run_cli("sync", f"meta://{bucket}/", str(tmp_path / "restore"),
                       "--latest-checkpoint", "--json", "--manifest",
                       str(tmp_path / "restore.sqlite"), env=seaweed.meta_env())
    assert restored.exit_code == 0, restored.output
    assert json.loads(restored.stdout)["latest_checkpoint"] == "checkpoint-800/"
    assert read_tree(tmp_path / "restore") == checkpoint("hf", 800)

    report = tmp_path / "report.json"
    again = start_watch(*args, "--report", str(report), env=seaweed.meta_env())  # restarted
    try:
        wait_for(lambda: report.exists(), 60, "the restarted watch's first cycle")
        wait_for(lambda: read_bucket(seaweed, bucket) == final("hf"), 60,
                 "exactly steps 400, 700, 800")
    finally:
        code, err = stop_watch(again)
    assert code == 0, err
    assert read_tree(trained_tree) == everything


def test_refusals_in_one_line(seaweed, tmp_path, trained_tree):
    bucket = new_bucket(seaweed)
    dst = f"meta://{bucket}/"
    zero = run_cli("sync", str(trained_tree), dst, "--keep-last", "0", env=seaweed.meta_env())
    assert zero.exit_code == 2
    assert zero.stderr.strip() == ("mcsync: error: --keep-last must be at least 1 (the newest "
                                   "complete checkpoint is always kept), got 0")
    data = tmp_path / "dataset"
    (data / "shards").mkdir(parents=True)
    (data / "shards" / "part-0001.parquet").write_bytes(b"rows")
    none = run_cli("sync", str(data), dst, "--keep-last", "2", env=seaweed.meta_env())
    assert none.exit_code == 2
    lines = none.stderr.strip().splitlines()
    assert len(lines) == 1 and "no checkpoint directory of" in lines[0], none.stderr
    assert read_bucket(seaweed, bucket) == {}
    # Keys outside any checkpoint directory are left alone.
    put_objects(seaweed, bucket, {"notes.txt": b"mine", "eval/results.json": b"{}",
                                  "checkpoint-x/readme": b"no step"})
    kept = run_cli("sync", str(trained_tree), dst, "--keep-last", "1", "--quiet",
                   env=seaweed.meta_env())
    assert kept.exit_code == 0, kept.stderr
    held = read_bucket(seaweed, bucket)
    assert {"notes.txt", "eval/results.json", "checkpoint-x/readme"} <= set(held)
    assert {k.split("/")[0] for k in held if k.startswith("checkpoint-")} == {
        "checkpoint-800", "checkpoint-x"}


def test_a_marker_reaches_the_target_by_events_not_the_interval(seaweed, tmp_path):
    """With --interval 60s and the default --min-age (30s), a DCP checkpoint's marker is at
    the target within seconds of its marker at the source: the marker vouches for its files,
    and the trainer's events wake the watch (also those during a cycle)."""
    bucket = new_bucket(seaweed)
    src = tmp_path / "ckpt"
    src.mkdir()
    proc = start_watch(str(src), f"meta://{bucket}/", "--interval", "60s",
                       env=seaweed.meta_env())
    client = seaweed.client()
    lags: list[float] = []
    try:
        time.sleep(3)  # the first cycle, of an empty source, is over
        for step in (100, 200):
            files, marker = files_of("dcp", step)
            for key, data in files.items():
                write_slowly(src / key, data, pieces=2, pause=0.02)
            (src / marker).write_bytes(marker_text("dcp", step))
            written = time.time()

            def there(marker: str = marker) -> bool:
                try:
                    client.head_object(Bucket=bucket, Key=marker)
                except client.exceptions.ClientError:
                    return False
                return True

            wait_for(there, 50, f"{marker} at the target")
            lags.append(time.time() - written)
    finally:
        code, err = stop_watch(proc)
    assert code == 0, err
    assert all(lag < 15 for lag in lags), (lags, err[-2000:])  # well under the 60 s interval


def test_plan_shows_what_would_be_pruned_and_why(seaweed, trained_tree):
    bucket = new_bucket(seaweed)
    put_objects(seaweed, bucket, read_tree(trained_tree))
    plan = run_cli("plan", str(trained_tree), f"meta://{bucket}/", "--keep-last", "2",
                   "--keep-every", "400", env=seaweed.meta_env())
    assert plan.exit_code == 0, plan.output
    fates = dict(re.findall(r"^  (checkpoint-\d+/)\s+(kept: [^\n]+|pruned)", plan.stdout, re.M))
    assert fates == {"checkpoint-800/": "kept: last 2", "checkpoint-700/": "kept: last 2",
                     "checkpoint-400/": "kept: every 400",
                     **{f"checkpoint-{s}/": "pruned" for s in (100, 200, 300, 500, 600)}}
    assert read_bucket(seaweed, bucket) == read_tree(trained_tree)  # a plan deletes nothing
