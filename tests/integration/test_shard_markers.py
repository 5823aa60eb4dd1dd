"""--shard I/N over one DeepSpeed checkpoint, as an Indexed Job runs it: three `mcsync sync`
processes at once into one SeaweedFS bucket, the checkpoint's 12 shard files spread over them
(and a Hugging Face, a DCP, a Megatron and an Orbax checkpoint beside it).
A reader polling the target every 100 ms never finds a marker (``latest``, or any framework's)
before every file of its checkpoint is there — whichever shard finishes last (one is slowed by
--bwlimit), and when one is SIGKILLed and run again, as a replaced pod. The target ends
byte-identical."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from mcsync.checkpoints.frameworks import is_commit_marker
from mcsync.state.shard import shard_of
from testbed.servers import S3Endpoint

from .helpers import new_bucket, payload, read_bucket, write_tree

ROOT = Path(__file__).parents[2]
SIZE = 256 * 1024
STEP = "ckpt/global_step100/"
CKPT = {
    **{f"{STEP}mp_rank_00_model_states.pt": payload(SIZE, 99)},
    **{f"{STEP}zero_pp_rank_{i}_mp_rank_00_optim_states.pt": payload(SIZE, i)
       for i in range(11)},
    "ckpt/latest": b"global_step100",
    "ckpt/zero_to_fp32.py": b"# DeepSpeed's converter, written beside the checkpoints\n",
}
FILES = [k for k in CKPT if k.startswith(STEP)]
SMALL = 64 * 1024
# and one checkpoint of each other framework whose markers are files, beside it
OTHERS = {
    **{f"hf/checkpoint-100/model-0000{i}-of-00004.safetensors": payload(SMALL, 20 + i)
       for i in range(1, 5)},
    "hf/checkpoint-100/model.safetensors.index.json": b'{"weight_map": {}}',
    "hf/checkpoint-100/config.json": b'{"model_type": "llama"}',
    "hf/checkpoint-100/trainer_state.json": b'{"global_step": 100}',
    **{f"dcp/step_5/__{i}_0.distcp": payload(SMALL, 30 + i) for i in range(3)},
    "dcp/step_5/.metadata": b"dcp-metadata",
    **{f"mg/iter_0000100/mp_rank_0{i}/model_optim_rng.pt": payload(SMALL, 40 + i)
       for i in range(2)},
    "mg/latest_checkpointed_iteration.txt": b"100",
    "orbax/100/_CHECKPOINT_METADATA": b"{}",
    **{f"orbax/100/state/d/{i}": payload(SMALL, 50 + i) for i in range(3)},
    "orbax/100/commit_success.txt": b"done",
}
CKPT.update(OTHERS)


def test_each_shard_writes_some_of_the_checkpoint_s_files() -> None:
    assert len(FILES) == 12
    assert all(sum(1 for k in FILES if shard_of(k, 3) == i) >= 2 for i in range(3))


class Reader(threading.Thread):
    """Lists the target every 100 ms; notes each time a marker is there while a file of the
    directory it stands in (everything under it, but the markers beside it) is not."""

    def __init__(self, ep: S3Endpoint, bucket: str) -> None:
        super().__init__(daemon=True)
        self.client, self.bucket = ep.client(), bucket
        self.done = threading.Event()
        self.torn: list[tuple[str, list[str]]] = []
        self.polls = 0
        self.saw_marker = False

    def run(self) -> None:
        while not self.done.wait(0.1):
            there: dict[str, int] = {}
            pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket)
            for page in pages:
                there.update((c["Key"], c["Size"]) for c in page.get("Contents", ()))
            self.polls += 1
            for marker in (k for k in there if is_commit_marker(k)):
                self.saw_marker = True
                directory = marker.rpartition("/")[0] + "/"
                lacking = [k for k in CKPT if k.startswith(directory) and not (
                    is_commit_marker(k) and k.rpartition("/")[0] + "/" == directory)
                    and there.get(k) != len(CKPT[k])]
                if lacking:
                    self.torn.append((marker, lacking))


def start(src: Path, dst: str, index: int, env: dict[str, str], tmp: Path,
          *extra: str) -> subprocess.Popen[bytes]:
    # each shard with a state directory of its own, as a pod
    env = dict(os.environ, PYTHONPATH=str(ROOT), XDG_STATE_HOME=str(tmp / f"pod-{index}")) | env
    return subprocess.Popen(
        [sys.executable, "-m", "mcsync.cli.main", "sync", str(src), dst, "--shard",
         f"{index}/3", "--json", "--quiet", *extra],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)


def finish(proc: subprocess.Popen[bytes]) -> dict[str, Any]:
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, err.decode()[-3000:]
    report: dict[str, Any] = json.loads(out)
    return report


def slow(index: int, seconds: float) -> str:
    """A --bwlimit that keeps shard ``index`` busy about ``seconds``."""
    mine = sum(len(v) for k, v in CKPT.items() if shard_of(k, 3) == index)
    return str(max(1, int(mine / seconds)))


@pytest.mark.parametrize("last", [0, 1, 2])
def test_the_shard_finishing_last_writes_latest_and_no_reader_sees_it_early(
        seaweed: S3Endpoint, tmp_path: Path, last: int) -> None:
    write_tree(tmp_path / "src", CKPT)
    bucket = new_bucket(seaweed)
    reader = Reader(seaweed, bucket)
    reader.start()
    try:
        procs = [start(tmp_path / "src", f"meta://{bucket}/", i, seaweed.meta_env(), tmp_path,
                       *(("--bwlimit", slow(i, 6)) if i == last else ()))
                 for i in range(3)]
        reports = [finish(p) for p in procs]
        time.sleep(0.3)  # a poll after the last write
    finally:
        reader.done.set()
        reader.join()
    assert reader.torn == [], reader.torn[:3]
    assert reader.polls > 10 and reader.saw_marker
    for index, report in enumerate(reports):
        written = {o["key"] for o in report["objects"]}
        assert {k for k in FILES if shard_of(k, 3) == index} <= written
        # the slowed shard finished last: it wrote latest, the others left it to it
        deferred = {d["key"] for d in report["deferred"]}
        assert ("ckpt/latest" in written) == (index == last), (index, written, deferred)
        assert ("ckpt/latest" in deferred) == (index != last)
    assert read_bucket(seaweed, bucket) == CKPT


def test_a_shard_killed_and_run_again_writes_latest_and_none_is_seen_early(
        seaweed: S3Endpoint, tmp_path: Path) -> None:
    write_tree(tmp_path / "src", CKPT)
    bucket = new_bucket(seaweed)
    dst, env = f"meta://{bucket}/", seaweed.meta_env()
    killed = 1
    reader = Reader(seaweed, bucket)
    reader.start()
    try:
        victim = start(tmp_path / "src", dst, killed, env, tmp_path,
                       "--bwlimit", slow(killed, 60))
        others = [start(tmp_path / "src", dst, i, env, tmp_path) for i in range(3)
                  if i != killed]
        reports = [finish(p) for p in others]
        assert all("ckpt/latest" in {d["key"] for d in r["deferred"]} for r in reports)
        victim.send_signal(signal.SIGKILL)
        victim.communicate(timeout=30)
        time.sleep(0.3)
        at_target = read_bucket(seaweed, bucket)
        assert "ckpt/latest" not in at_target
        assert {k for k in FILES if shard_of(k, 3) == killed} - set(at_target)
        again = finish(start(tmp_path / "src", dst, killed, env, tmp_path))  # the new pod
        time.sleep(0.3)
    finally:
        reader.done.set()
        reader.join()
    assert reader.torn == [], reader.torn[:3]
    assert reader.saw_marker
    assert "ckpt/latest" in {o["key"] for o in again["objects"]}
    assert read_bucket(seaweed, bucket) == CKPT
