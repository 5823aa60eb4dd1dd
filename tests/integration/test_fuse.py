"""The filesystem target and source on a real FUSE mount: a SeaweedFS bucket mounted with
``weed mount`` (``weed_mounted``), the stand-in for a Meta Storage Direct mount. Every result is
read twice: through the mount, and through the S3 view of the same bucket, as a reader on the
other side of the mount sees it, byte for byte.

What the mount does differently from a local disk (docs/ARCHITECTURE.md, *Mounted targets*):
it makes no nameless files (``O_TMPFILE``: EOPNOTSUPP), so every file goes through a hidden
name and a rename; ``copy_file_range`` is not the mount's (the kernel copies through the page
cache); and a change made through the object store reaches the mount's listing but raises no
inotify event, so ``--watch`` finds it by the interval's listing.
"""

from __future__ import annotations

import json
import os
import random
import signal
import threading
import time
from pathlib import Path

import pytest

from mcsync.stores.local_files import on_this_machine

from ..conftest import MountedBucket
from .helpers import crashed_run, payload, put_objects, read_tree, run_cli, write_tree
from .test_delta import safetensors
from .test_watch import start_watch, stop_watch, wait_for

MiB = 1 << 20
HIDDEN = ".mcsync-tmp-"


def tensors(seed: int = 0) -> dict[str, bytes]:
    """A small checkpoint: 8 layers of two tensors and a norm, ~12 MiB."""
    rnd = random.Random(seed)
    return {f"layers.{i}.{name}.weight": rnd.randbytes(size)
            for i in range(8) for name, size in (("attn", MiB), ("mlp", MiB // 2), ("norm", 4096))}


def changed(old: dict[str, bytes], name: str) -> dict[str, bytes]:
    return {k: random.Random(k).randbytes(len(v)) if k == name else v for k, v in old.items()}


def sync(src: Path, dst: Path, *args: str) -> dict:
    result = run_cli("sync", str(src), str(dst), "--part-size", "5MiB", "-q", "--json", *args)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def listed(m: MountedBucket, prefix: str = "") -> list[str]:
    """Every key under ``prefix`` as the S3 side lists them, relative to it."""
    pages = m.endpoint.client().get_paginator("list_objects_v2").paginate(
        Bucket=m.bucket, Prefix=prefix)
    return [c["Key"][len(prefix):] for page in pages for c in page.get("Contents", ())]


def s3_view(m: MountedBucket, prefix: str) -> dict[str, bytes]:
    """The objects under ``prefix/`` read through S3, mcsync's state and hidden files left
    out. A hidden file the mount holds is an object there too, listed; one a killed run made
    and never wrote into (a hole its whole length) cannot even be read: SeaweedFS's gateway
    answers InternalError for a file of no chunks."""
    client = m.endpoint.client()
    return {key: client.get_object(Bucket=m.bucket, Key=f"{prefix}/{key}")["Body"].read()
            for key in listed(m, prefix + "/")
            if not key.startswith(".mcsync/") and HIDDEN not in key}


def both_views(m: MountedBucket, prefix: str) -> tuple[dict[str, bytes], dict[str, bytes]]:
    """The tree under ``prefix`` read through the mount (hidden files included) and through
    S3 (hidden files left out; mcsync's state left out of both)."""
    return read_tree(m.root / prefix), s3_view(m, prefix)


def hidden_objects(m: MountedBucket) -> list[str]:
    """Hidden temporary names anywhere in the bucket, as the S3 side lists them."""
    return [k for k in listed(m) if HIDDEN in k]


@pytest.fixture
def src(tmp_path: Path) -> Path:
    return tmp_path / "src"


def test_the_mount_is_a_fuse_mount_and_makes_no_nameless_files(weed_mounted):
    assert not on_this_machine(weed_mounted.root)  # every file to a worker thread
    fd = None
    try:
        fd = os.open(weed_mounted.root, os.O_WRONLY | os.O_TMPFILE, 0o644)
    except OSError as exc:  # what local_files.nameless_file takes as "none made here"
        assert exc.errno == 95  # EOPNOTSUPP
    finally:
        if fd is not None:
            os.close(fd)


def test_whole_files_and_files_in_parts_read_the_same_through_s3(weed_mounted, src):
    files = {
        "ckpt/model-00001-of-00002.safetensors": payload(12 * MiB + 17, 1),  # three parts
        "ckpt/model-00002-of-00002.safetensors": payload(6 * MiB, 2),  # two parts
        "ckpt/model.safetensors.index.json": b'{"weight_map": {}}',
        **{f"data/shard-{i:02d}.jsonl": payload(3000 * (i + 1), 10 + i) for i in range(8)},
        "empty": b"",
    }
    write_tree(src, files)
    report = sync(src, weed_mounted.root / "run1")
    assert report["objects_copied"] == len(files)
    assert both_views(weed_mounted, "run1") == (files, files)
    assert hidden_objects(weed_mounted) == []
    # the mtime carried over survives the mount: a second run has nothing to do
    again = sync(src, weed_mounted.root / "run1")
    assert again["objects_copied"] == 0 and again["bytes_sent"] == 0

    # mcsync's state at the target: the manifest's copy, no lock once the run is over
    state = listed(weed_mounted, "run1/.mcsync/")
    assert any(k.startswith("manifest") for k in state), state
    assert not any(k.startswith("lock") for k in state), state


def test_a_changed_tensor_sends_its_bytes_only(weed_mounted, src):
    old = tensors()
    write_tree(src, {"model.safetensors": safetensors(old)})
    sync(src, weed_mounted.root / "run1")
    new = safetensors(changed(old, "layers.3.attn.weight"))
    write_tree(src, {"model.safetensors": new})
    report = sync(src, weed_mounted.root / "run1")
    assert both_views(weed_mounted, "run1") == ({"model.safetensors": new},) * 2
    assert MiB <= report["bytes_sent"] <= MiB + 64 * 1024
    assert report["bytes_reused"] >= len(new) - MiB - 64 * 1024
    assert hidden_objects(weed_mounted) == []


def test_a_changed_block_of_a_bin_sends_that_block(weed_mounted, src):
    rnd = random.Random(3)
    old = rnd.randbytes(11 * MiB + 123)
    write_tree(src, {"optimizer.bin": old})
    sync(src, weed_mounted.root / "run1")
    new = old[:7 * MiB] + rnd.randbytes(100) + old[7 * MiB + 100:]
    write_tree(src, {"optimizer.bin": new})
    report = sync(src, weed_mounted.root / "run1")
    assert both_views(weed_mounted, "run1") == ({"optimizer.bin": new},) * 2
    # fixed blocks of the part size (5 MiB): the one block holding the change is sent
    assert 0 < report["bytes_sent"] <= 5 * MiB
    assert report["bytes_reused"] == len(new) - report["bytes_sent"]


def test_a_new_step_is_composed_from_the_last_one_on_the_mount(weed_mounted, src):
    """The cross-checkpoint delta: copy_file_range between two files of the mount."""
    old = tensors()
    write_tree(src, {"run-7/step-100/model.safetensors": safetensors(old)})
    sync(src, weed_mounted.root / "runs")
    step2 = safetensors(changed(old, "layers.5.mlp.weight"))
    write_tree(src, {"run-7/step-200/model.safetensors": step2})
    report = sync(src, weed_mounted.root / "runs")
    expected = read_tree(src)
    assert both_views(weed_mounted, "runs") == (expected, expected)
    assert report["bytes_sent"] <= MiB // 2 + 64 * 1024
    assert report["bytes_reused_cross_object"] >= len(step2) - MiB // 2 - 64 * 1024
    (obj,) = [o for o in report["objects"] if o["key"].endswith("step-200/model.safetensors")]
    assert [k for k, _ in obj["reused_from"]] == ["run-7/step-100/model.safetensors"]


def test_delete_removes_files_and_emptied_directories_from_the_bucket(weed_mounted, src):
    write_tree(src, {"keep.bin": payload(1000, 1), "old/a.bin": payload(2000, 2),
                     "old/deeper/b.bin": payload(3000, 3)})
    sync(src, weed_mounted.root / "run1")
    for key in ("old/a.bin", "old/deeper/b.bin"):
        (src / key).unlink()
    report = sync(src, weed_mounted.root / "run1", "--delete")
    assert report["objects_deleted"] == 2
    assert both_views(weed_mounted, "run1") == ({"keep.bin": payload(1000, 1)},) * 2
    assert not (weed_mounted.root / "run1" / "old").exists()


def test_verify_rereads_the_mount_and_finds_a_file_changed_through_s3(weed_mounted, src):
    files = {"a.bin": payload(7 * MiB, 1), "b.bin": payload(5000, 2)}
    write_tree(src, files)
    sync(src, weed_mounted.root / "run1", "--verify")
    # changed on the other side of the mount, same size: the manifest still trusts it
    weed_mounted.endpoint.client().put_object(Bucket=weed_mounted.bucket, Key="run1/b.bin",
                                              Body=payload(5000, 99))
    wait_for(lambda: (weed_mounted.root / "run1" / "b.bin").read_bytes() == payload(5000, 99),
             10, "the change made through S3 to show in the mount")
    os.utime(weed_mounted.root / "run1" / "b.bin", (1e9, 1e9))  # older: no plain rerun fixes it
    report = sync(src, weed_mounted.root / "run1", "--verify")
    assert report["objects_copied"] >= 1
    assert both_views(weed_mounted, "run1") == (files, files)


# kill -9 at named points of the file writes (crashing_mcsync.py), then a plain rerun.
OBJECTS = {
    "ckpt/model-00001-of-00002.safetensors": payload(11 * MiB, 1),
    "ckpt/model-00002-of-00002.safetensors": payload(11 * MiB, 2),
    "ckpt/model.safetensors.index.json": b'{"weight_map": {}}',
    **{f"data/part-{i:02d}.jsonl": payload(20_000 * (i + 1), 100 + i) for i in range(6)},
}
KILL_POINTS = ["put:3", "part:2", "part-done:3", "complete:1", "commit:2", "lock:1"]


@pytest.mark.parametrize("point", KILL_POINTS)
def test_killed_sync_onto_the_mount_resumes_byte_identical(point, weed_mounted, src,
                                                           tmp_path):
    write_tree(src, OBJECTS)
    dst = weed_mounted.root / "run1"
    args = ("sync", str(src), str(dst), "--part-size", "5MiB", "-c", "2", "-q", "--json")
    acked = tmp_path / "acked"
    killed = crashed_run(point, *args, env=dict(os.environ), acked=acked)
    assert killed.returncode == -signal.SIGKILL, killed.stderr

    # whatever a reader on either side sees after the kill is whole; the rest is hidden
    for view in both_views(weed_mounted, "run1"):
        for key, data in view.items():
            assert HIDDEN in key or data == OBJECTS[key], f"{key} visible but not whole"
    if point == "lock:1":  # the lock the killed run held, as the S3 side sees it
        state = listed(weed_mounted, "run1/.mcsync/")
        assert any(k.startswith("lock") for k in state), state

    result = run_cli(*args)  # the same command, run to its end
    assert result.exit_code == 0, result.output
    assert both_views(weed_mounted, "run1") == (OBJECTS, OBJECTS)
    # the parts the mount held when the run died were kept: at most what was in flight again
    before = int(acked.read_text()) if acked.exists() else 0
    resent = before + json.loads(result.stdout)["bytes_sent"] - sum(map(len, OBJECTS.values()))
    assert resent <= 2 * 5 * MiB, f"{before} written before the kill, {resent} twice"
    assert hidden_objects(weed_mounted) == []  # the killed run's hidden files swept
    state = listed(weed_mounted, "run1/.mcsync/")
    assert not any(k.startswith("lock") for k in state), state
    assert any(k.startswith("manifest") for k in state), state


def test_watch_of_a_mounted_source_finds_s3_side_changes_by_the_interval(weed_mounted,
                                                                          tmp_path):
    """Files put through the object store (not through the mount) raise no inotify event at
    the mount: a watch of the mount finds them at its next interval's listing, not sooner."""
    put_objects(weed_mounted.endpoint, weed_mounted.bucket, {"out/a.bin": payload(1000, 1)})
    wait_for(lambda: (weed_mounted.root / "out" / "a.bin").exists(), 10, "a.bin in the mount")
    dst = tmp_path / "dst"
    interval = 3.0
    proc = start_watch(str(weed_mounted.root / "out"), str(dst), "--interval", f"{interval:g}s",
                       "--min-age", "0", "-v", env={})
    try:
        wait_for(lambda: (dst / "a.bin").exists(), 60, "the first cycle")
        put = time.monotonic()
        put_objects(weed_mounted.endpoint, weed_mounted.bucket,
                    {"out/later/b.bin": payload(5000, 2)})
        wait_for(lambda: (dst / "later" / "b.bin").exists(), 4 * interval + 10,
                 "the object put through S3")
        took = time.monotonic() - put
    finally:
        code, err = stop_watch(proc)
    assert code == 0, err
    assert "raise no event here" in err, err[-2000:]  # the user is told what to expect
    assert read_tree(dst) == {"a.bin": payload(1000, 1), "later/b.bin": payload(5000, 2)}
    # found by a listing: within an interval (and a cycle's own time), never by an event
    assert took <= 2 * interval + 5, took


def test_a_file_replaced_on_the_mount_is_never_seen_half_written(weed_mounted, src):
    """Each run replaces the file (a hidden file renamed over it) while a reader on each side
    reads it in a loop: both only ever see a whole version. Through S3 the object is always
    there; through the mount the rename is not atomic (weed mount drops the old name before
    the new one shows), so a reader there may find no file for an instant: counted, not
    failed."""
    versions = [payload(2 * MiB, seed) for seed in range(5)]
    write_tree(src, {"f.bin": versions[0]})
    sync(src, weed_mounted.root / "run1")
    client = weed_mounted.endpoint.client()
    seen: dict[str, int] = {}
    stop = threading.Event()

    def note(what: str) -> None:
        seen[what] = seen.get(what, 0) + 1

    def through_mount() -> None:
        while not stop.is_set():
            try:
                data = (weed_mounted.root / "run1" / "f.bin").read_bytes()
            except FileNotFoundError:
                note("mount: no file")
                continue
            note("mount: whole" if data in versions else "mount: PARTIAL")

    def through_s3() -> None:
        while not stop.is_set():
            try:
                data = client.get_object(Bucket=weed_mounted.bucket,
                                         Key="run1/f.bin")["Body"].read()
            except client.exceptions.NoSuchKey:
                note("s3: NO OBJECT")
                continue
            note("s3: whole" if data in versions else "s3: PARTIAL")

    readers = [threading.Thread(target=through_mount), threading.Thread(target=through_s3)]
    for t in readers:
        t.start()
    try:
        for data in versions[1:]:
            write_tree(src, {"f.bin": data})
            sync(src, weed_mounted.root / "run1", "--no-delta")
    finally:
        stop.set()
        for t in readers:
            t.join()
    assert seen.get("mount: whole") and seen.get("s3: whole"), seen
    assert not any("PARTIAL" in k or "NO OBJECT" in k for k in seen), seen
    assert both_views(weed_mounted, "run1") == ({"f.bin": versions[-1]},) * 2
