"""The manifest as the target's state: no-op runs that ask the target nothing, a lost or
damaged manifest that costs time but never correctness, locks, and changes behind our back."""

from __future__ import annotations

import fcntl
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import mcsync
from mcsync.errors import Transient
from mcsync.state.manifest import default_path
from mcsync.stores.registry import open_store
from mcsync.testing.faults import Call, Faults, Rule, faulty

from .helpers import (
    new_bucket,
    payload,
    put_objects,
    read_bucket,
    run_cli,
    sync_stores,
    write_tree,
)

MiB = 1 << 20
OBJECTS = {
    "ckpt/model.safetensors": payload(12 * MiB, 1),
    "ckpt/config.json": b'{"hidden": 4096}',
    **{f"data/{i:03d}.bin": payload(5000 + i, i) for i in range(40)},
}


TARGET_OPS = ("list", "head", "get", "put", "open_upload", "delete")


def counted(url: str, calls: dict[str, int]) -> Any:
    """The store at ``url``, counting the calls the engine makes to it (not to mcsync's own
    state under .mcsync/: the lock and the manifest's copy)."""

    def count(call: Call) -> None:
        calls[call.op] = calls.get(call.op, 0) + 1

    faults = Faults([Rule(op, times=None, skip=".mcsync/*", action=count) for op in TARGET_OPS])
    return faulty(open_store(url), faults)


def sync_counting(src: str, dst: str, calls: dict[str, int], **options: Any) -> Any:
    return sync_stores(src, counted(dst, calls), **options)


def sync_env(env: dict[str, str], monkeypatch) -> None:
    for k, v in env.items():
        monkeypatch.setenv(k, v)


def test_noop_resync_asks_the_target_nothing(seaweed, tmp_path, monkeypatch):
    write_tree(tmp_path / "src", OBJECTS)
    bucket = new_bucket(seaweed)
    sync_env(seaweed.meta_env(), monkeypatch)
    calls: dict[str, int] = {}
    first = sync_counting(str(tmp_path / "src"), f"meta://{bucket}/", calls, part_size=5 * MiB)
    assert first.objects_copied == len(OBJECTS)
    assert calls["put"] + calls["open_upload"] == len(OBJECTS)  # the counting counts
    calls.clear()

    again = sync_counting(str(tmp_path / "src"), f"meta://{bucket}/", calls, part_size=5 * MiB)
    assert again.objects_skipped == len(OBJECTS) and again.objects_copied == 0
    assert calls == {}, "a no-op run with a manifest must not list or read the target"
    assert read_bucket(seaweed, bucket) == OBJECTS


def test_changed_source_file_is_found_from_the_manifest(seaweed, tmp_path, monkeypatch):
    write_tree(tmp_path / "src", OBJECTS)
    bucket = new_bucket(seaweed)
    sync_env(seaweed.meta_env(), monkeypatch)
    mcsync.sync(str(tmp_path / "src"), f"meta://{bucket}/", part_size=5 * MiB)
    changed = dict(OBJECTS) | {"data/007.bin": b"rewritten"}
    write_tree(tmp_path / "src", {"data/007.bin": b"rewritten"})
    report = mcsync.sync(str(tmp_path / "src"), f"meta://{bucket}/", part_size=5 * MiB)
    assert report.objects_copied == 1
    assert read_bucket(seaweed, bucket) == changed


@pytest.mark.parametrize("damage", ["deleted", "truncated", "garbage"])
def test_damaged_manifest_costs_time_not_correctness(damage, seaweed, tmp_path):
    write_tree(tmp_path / "src", OBJECTS)
    bucket = new_bucket(seaweed)
    dst = f"meta://{bucket}/m/"
    env = seaweed.meta_env()
    first = run_cli("sync", str(tmp_path / "src"), dst, "--json", "-q", env=env)
    manifest = Path(json.loads(first.stdout)["manifest"])
    assert manifest.exists()

    # the source changes, and the manifest (and, for "deleted", its copy at the target) is lost
    write_tree(tmp_path / "src", {"data/001.bin": b"new content", "data/new.bin": b"added"})
    expected = dict(OBJECTS) | {"data/001.bin": b"new content", "data/new.bin": b"added"}
    for suffix in ("-wal", "-shm"):
        Path(f"{manifest}{suffix}").unlink(missing_ok=True)
    if damage == "deleted":
        manifest.unlink()
        client = seaweed.client()
        for key in read_bucket(seaweed, bucket, "m/", with_state=True):
            if key.startswith(".mcsync/"):
                client.delete_object(Bucket=bucket, Key=f"m/{key}")
    elif damage == "truncated":
        with open(manifest, "r+b") as f:
            f.truncate(manifest.stat().st_size // 3)
    else:
        manifest.write_bytes(os.urandom(50_000))

    result = run_cli("sync", str(tmp_path / "src"), dst, "--json", "-q", env=env)
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert read_bucket(seaweed, bucket, "m/") == expected
    if damage != "deleted":
        assert "rebuilt" in (report["manifest_note"] or "")
    # and the run after that trusts the rebuilt manifest again
    again = json.loads(run_cli("sync", str(tmp_path / "src"), dst, "--json", "-q",
                               env=env).stdout)
    assert again["objects_copied"] == 0 and again["objects_skipped"] == len(expected)


def test_fresh_machine_finds_the_manifest_at_the_target(seaweed, tmp_path, monkeypatch):
    write_tree(tmp_path / "src", OBJECTS)
    bucket = new_bucket(seaweed)
    sync_env(seaweed.meta_env(), monkeypatch)
    mcsync.sync(str(tmp_path / "src"), f"meta://{bucket}/", part_size=5 * MiB)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "another-machine"))
    calls: dict[str, int] = {}
    report = sync_counting(str(tmp_path / "src"), f"meta://{bucket}/", calls,
                           part_size=5 * MiB)
    assert report.objects_skipped == len(OBJECTS) and report.objects_copied == 0
    assert "list" not in calls
    assert report.manifest and report.manifest.startswith(str(tmp_path / "another-machine"))


def test_second_run_of_a_pair_exits_3_naming_the_holder(tmp_path):
    write_tree(tmp_path / "src", {"a": b"a"})
    src, dst = str(tmp_path / "src"), str(tmp_path / "dst")
    lock = default_path(src, str(tmp_path / "dst")).with_suffix(".sqlite.lock")
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        held.write(json.dumps({"host": "trainer-3", "pid": 4242, "started_at": time.time()}))
        held.flush()
        result = run_cli("sync", src, dst, env={})
    assert result.exit_code == 3, result.output
    assert "pid 4242 on trainer-3" in result.output
    assert not (tmp_path / "dst" / "a").exists()
    assert run_cli("sync", src, dst, env={}).exit_code == 0  # released: the next run goes


def test_target_lock_of_another_machine_blocks_until_it_expires(seaweed, tmp_path):
    write_tree(tmp_path / "src", {"a": b"a"})
    bucket = new_bucket(seaweed)
    dst = f"meta://{bucket}/"
    env = seaweed.meta_env()
    first = run_cli("sync", str(tmp_path / "src"), dst, "--json", "-q", env=env)
    assert first.exit_code == 0
    pair = Path(json.loads(first.stdout)["manifest"]).stem
    lock_key = f".mcsync/lock-{pair}.json"
    other = {"host": f"not-{socket.gethostname()}", "pid": 7, "started_at": time.time()}
    put_objects(seaweed, bucket, {lock_key: json.dumps(other | {
        "expires_at": time.time() + 600}).encode()})
    blocked = run_cli("sync", str(tmp_path / "src"), dst, env=env)
    assert blocked.exit_code == 3 and f"not-{socket.gethostname()}" in blocked.output
    put_objects(seaweed, bucket, {lock_key: json.dumps(other | {
        "expires_at": time.time() - 1}).encode()})
    assert run_cli("sync", str(tmp_path / "src"), dst, env=env).exit_code == 0


def test_target_changed_behind_mcsyncs_back(seaweed, tmp_path):
    write_tree(tmp_path / "src", OBJECTS)
    bucket = new_bucket(seaweed)
    dst = f"meta://{bucket}/"
    env = seaweed.meta_env()
    first = run_cli("sync", str(tmp_path / "src"), dst, "--part-size", "5MiB", env=env)
    assert first.exit_code == 0, first.output
    tampered = bytearray(OBJECTS["ckpt/model.safetensors"])
    tampered[6 * MiB] ^= 0xFF
    put_objects(seaweed, bucket, {"ckpt/model.safetensors": bytes(tampered),
                                  "data/003.bin": b"x" * len(OBJECTS["data/003.bin"])})

    check = run_cli("verify", dst, env=env)
    assert check.exit_code == 1, check.output
    assert "mismatch: ckpt/model.safetensors" in check.output
    assert "mismatch: data/003.bin" in check.output

    fixed = run_cli("sync", str(tmp_path / "src"), dst, "--verify", "--part-size", "5MiB",
                    "--json", "-q", env=env)
    assert fixed.exit_code == 0, fixed.output
    assert json.loads(fixed.stdout)["objects_copied"] == 2
    assert read_bucket(seaweed, bucket) == OBJECTS
    assert run_cli("verify", dst, env=env).exit_code == 0


def test_source_overwritten_mid_copy_is_never_stitched(seaweed, tmp_path, monkeypatch):
    bucket = new_bucket(seaweed)
    old, new = payload(16 * MiB, 1), payload(16 * MiB, 2)
    put_objects(seaweed, bucket, {"big.bin": old})
    overwritten: list[bool] = []

    def overwrite(_: Call) -> None:  # a writer replaces it right after mcsync's first read
        if not overwritten:
            overwritten.append(True)
            put_objects(seaweed, bucket, {"big.bin": new})

    # parts bound for a file stream in (open_range); others are read whole (get)
    faults = Faults([Rule("get", phase="after", action=overwrite),
                     Rule("open_range", phase="after", action=overwrite)])
    sync_env(seaweed.aws_env(), monkeypatch)
    report = sync_stores(faulty(open_store(f"s3://{bucket}/"), faults), str(tmp_path / "dst"),
                         part_size=5 * MiB, part_concurrency=1)
    assert overwritten and report.ok
    assert (tmp_path / "dst" / "big.bin").read_bytes() == new


def test_download_broken_off_mid_part_shows_nothing_and_resumes(seaweed, tmp_path,
                                                                 monkeypatch):
    bucket = new_bucket(seaweed)
    big = payload(40 * MiB, 3)
    put_objects(seaweed, bucket, {"ckpt/big.bin": big, "small.txt": b"small"})
    # The first streamed range stops after its first piece, as a dropped connection would.
    broken = Rule("range_piece", nth=2,
                  error=Transient("ckpt/big.bin: connection reset by peer (test)"))
    sync_env(seaweed.aws_env(), monkeypatch)
    dst = tmp_path / "dst"
    report = sync_stores(faulty(open_store(f"s3://{bucket}/"), Faults([broken])), str(dst),
                         part_size=8 * MiB)
    assert broken.seen >= 2 and not report.ok
    ((key, why),) = report.failures
    assert key == "ckpt/big.bin" and "connection reset" in why, report.failures
    files = {p.relative_to(dst).as_posix() for p in dst.rglob("*") if p.is_file()}
    # the other object landed; of the broken one not even its hidden file is left
    assert {f for f in files if not f.startswith(".mcsync/")} == {"small.txt"}, files

    again = mcsync.sync(f"s3://{bucket}/", str(dst), part_size=8 * MiB)
    assert again.ok and again.objects_copied == 1
    assert (dst / "ckpt" / "big.bin").read_bytes() == big


NOOP_PROBE = """
import sys
from mcsync.cli.main import main
try:
    main()
except SystemExit as exc:
    print("exit", exc.code, "botocore" in sys.modules)
"""


def test_noop_resync_to_meta_never_starts_botocore(seaweed, tmp_path):
    """A scheduled no-op run is mostly start-up; importing and starting botocore would be
    ~0.2 s of it. With meta:// keys given, the lock, the check and the listing go by obstore."""
    write_tree(tmp_path / "src", OBJECTS)
    bucket = new_bucket(seaweed)
    env = dict(os.environ) | seaweed.meta_env() | {"XDG_STATE_HOME": str(tmp_path / "state")}
    argv = ["sync", str(tmp_path / "src"), f"meta://{bucket}/", "--part-size", "5MiB", "-q"]
    runs = [subprocess.run([sys.executable, "-c", NOOP_PROBE, *argv], env=env, text=True,
                           capture_output=True, timeout=120, check=False) for _ in range(2)]
    # The first run uploads multipart objects (through the CRT, not botocore); the second has
    # nothing to do.
    assert [r.stdout.split() for r in runs] == [["exit", "0", "False"], ["exit", "0", "False"]], \
        [r.stderr for r in runs]
    assert read_bucket(seaweed, bucket) == OBJECTS
