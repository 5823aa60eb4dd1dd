"""What disks do to a local target: full (ENOSPC), over quota (EDQUOT), a directory that refuses
writes (EACCES), a filesystem remounted read-only mid-run (EROFS). For each: the object fails
with one line naming the key and the cause, nothing half-written is visible (no file, no hidden
temporary file), the manifest records nothing for it, and the next run, with the fault gone,
finishes it byte for byte.

Where the kernel can do it for real in this sandbox it does (a tmpfs of 8 MiB, a bind mount
remounted read-only, a process without CAP_DAC_OVERRIDE); each such test skips, saying why,
where it cannot. The same faults are also injected with ``mcsync.testing.faults``."""

from __future__ import annotations

import errno
import json
import os
import shutil
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mcsync.stores.local import LocalStore
from mcsync.stores.registry import StoreOptions, open_store
from mcsync.testing.faults import Call, Faults, Rule, faulty

from .helpers import (
    crashed_run,
    new_bucket,
    payload,
    put_objects,
    read_tree,
    sync_stores,
    write_tree,
)

MiB = 1 << 20
BIG = "m/big.bin"
FILES = {"a-small": b"a" * 1000, "b-small": b"b" * 2000, BIG: payload(12 * MiB, 7),
         "z-after": b"z" * 3000}


def hidden(root: Path) -> list[str]:
    return [str(Path(d, f)) for d, _, fs in os.walk(root) for f in fs if ".mcsync-tmp-" in f]


def recorded(manifest: str | Path) -> dict[str, int]:
    """Keys the manifest records an object for, with their sizes, and the journalled uploads
    (as ``upload:<key>``)."""
    db = sqlite3.connect(manifest)
    try:
        rows = dict(db.execute("SELECT key, dst_size FROM objects").fetchall())
        rows |= {f"upload:{k}": 0 for (k,) in db.execute("SELECT key FROM uploads")}
    finally:
        db.close()
    return rows


def assert_failed_cleanly(report: Any, root: Path, failed: dict[str, str],
                          written: dict[str, bytes]) -> None:
    assert report.exit_code == 1
    assert dict(report.failures) == failed
    tree = read_tree(root)
    assert {k: v for k, v in tree.items() if k in written} == written
    assert not set(failed) & set(tree), "a failed object must not be visible"
    assert hidden(root) == [], "nor its hidden temporary file"
    on_record = recorded(report.manifest)
    assert not {k for k in on_record if k.removeprefix("upload:") in failed}, on_record


def assert_next_run_finishes(src: str, root: Path, expected: dict[str, bytes],
                             failed: set[str]) -> None:
    report = sync_stores(src, LocalStore(root), part_size=5 * MiB)
    assert report.exit_code == 0, report.failures
    assert report.objects_copied == len(failed)
    assert read_tree(root) == expected  # byte for byte
    assert hidden(root) == []


# --------------------------------------------------------------------------------------------
# Injected: the target store answers ENOSPC / EDQUOT / EROFS


@pytest.mark.parametrize("err", [errno.ENOSPC, errno.EDQUOT, errno.EROFS])
@pytest.mark.parametrize(("op", "key"), [("put", "b-small"), ("put_part", BIG)])
def test_injected_disk_errors_from_a_local_source(tmp_path, err, op, key):
    write_tree(tmp_path / "src", FILES)
    root = tmp_path / "root"
    fault = Rule(op, key=key, nth=2 if op == "put_part" else 1,
                 error=OSError(err, os.strerror(err)))
    report = sync_stores(str(tmp_path / "src"), faulty(LocalStore(root), Faults([fault])),
                         part_size=5 * MiB)
    assert fault.seen >= fault.nth
    others = {k: v for k, v in FILES.items() if k != key}
    assert_failed_cleanly(report, root, {key: os.strerror(err)}, others)
    assert_next_run_finishes(str(tmp_path / "src"), root, FILES, {key})


@pytest.mark.parametrize("err", [errno.ENOSPC, errno.EDQUOT])
def test_injected_disk_full_while_a_download_streams_in(moto, tmp_path, monkeypatch, err):
    """S3 → file: ranges stream into the hidden file (``write_at``), which fills up mid-way."""
    bucket = new_bucket(moto)
    put_objects(moto, bucket, FILES)
    for name, value in moto.aws_env().items():
        monkeypatch.setenv(name, value)
    root = tmp_path / "root"
    fault = Rule("write_at", key=BIG, nth=5, error=OSError(err, os.strerror(err)))
    report = sync_stores(open_store(f"s3://{bucket}/", StoreOptions()),
                         faulty(LocalStore(root), Faults([fault])), part_size=5 * MiB)
    assert fault.seen >= 5
    others = {k: v for k, v in FILES.items() if k != BIG}
    assert_failed_cleanly(report, root, {BIG: os.strerror(err)}, others)
    assert_next_run_finishes(f"s3://{bucket}/", root, FILES, {BIG})


# --------------------------------------------------------------------------------------------
# For real: mounts


def _mount(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["mount", *args], capture_output=True, text=True, check=False)


@pytest.fixture
def mounted(tmp_path: Path) -> Iterator[Any]:
    """``mount(args..., where)``: mounts for the test, all unmounted after it (lazily, so a
    failing test cannot leave one behind)."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting needs root and mount(8)")
    done: list[Path] = []

    def mount(*args: str, where: Path) -> None:
        where.mkdir(parents=True, exist_ok=True)
        result = _mount(*args, str(where))
        if result.returncode != 0:
            pytest.skip(f"mount {' '.join(args)} is not allowed here: {result.stderr.strip()}")
        done.append(where)

    yield mount
    for where in reversed(done):
        subprocess.run(["umount", "-l", str(where)], check=False)


def test_a_real_full_disk(tmp_path, mounted):
    """A tmpfs of 8 MiB: the 12 MiB file cannot fit; the rest does. Given room, the next run
    finishes it."""
    root = tmp_path / "small-disk"
    mounted("-t", "tmpfs", "-o", "size=8m", "tmpfs", where=root)
    write_tree(tmp_path / "src", FILES)
    # one object at a time, in key order: the small files are written before the big one
    # fills the disk, and z-after after its hidden file was removed again
    report = sync_stores(str(tmp_path / "src"), LocalStore(root), part_size=5 * MiB,
                         concurrency=1)
    others = {k: v for k, v in FILES.items() if k != BIG}
    assert_failed_cleanly(report, root, {BIG: "No space left on device"}, others)
    assert _mount("-o", "remount,size=32m", str(root)).returncode == 0
    assert_next_run_finishes(str(tmp_path / "src"), root, FILES, {BIG})


def test_a_read_only_remount_in_the_middle_of_a_run(tmp_path, mounted):
    """The target is a bind mount; after the second file it is remounted read-only (Linux
    refuses that while a file on it is open for writing, so it happens between two files).
    Every file after that fails naming the cause; remounted read-write, the next run
    finishes them."""
    real, root = tmp_path / "real", tmp_path / "mnt"
    real.mkdir()
    mounted("--bind", str(real), where=root)
    files = {f"f{i:02d}": payload(1000 + i, i) for i in range(6)}
    write_tree(tmp_path / "src", files)

    def remount_ro(call: Call) -> None:
        result = _mount("-o", "remount,ro,bind", str(root))
        assert result.returncode == 0, result.stderr

    target = faulty(LocalStore(root), Faults([Rule("put", key="f02", action=remount_ro)]))
    report = sync_stores(str(tmp_path / "src"), target, concurrency=1)
    written = {k: files[k] for k in ("f00", "f01")}
    failed = {k: f"Read-only file system ({root})" for k in files if k not in written}
    assert_failed_cleanly(report, root, failed, written)
    assert _mount("-o", "remount,rw,bind", str(root)).returncode == 0
    assert_next_run_finishes(str(tmp_path / "src"), root, files, set(failed))


# --------------------------------------------------------------------------------------------
# For real: permissions. The tests run as root, whom permissions do not stop; the run is made
# in a child process without CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH (setpriv), where root is
# held to the mode bits like anyone else.

DROP_DAC = ["setpriv", "--bounding-set=-dac_override,-dac_read_search", "--"]


@pytest.fixture
def without_dac(tmp_path: Path) -> list[str]:
    if os.geteuid() != 0:
        return []  # not root: the mode bits already apply
    if shutil.which("setpriv") is None:
        pytest.skip("root ignores file permissions, and setpriv is not here to drop that")
    probe = tmp_path / "probe-555"
    probe.mkdir()
    probe.chmod(0o555)
    tried = subprocess.run([*DROP_DAC, "touch", str(probe / "x")], capture_output=True,
                           check=False)
    probe.chmod(0o755)
    if tried.returncode == 0:
        pytest.skip("setpriv could not drop CAP_DAC_OVERRIDE here")
    return DROP_DAC


def mcsync_cli(prefix: list[str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*prefix, sys.executable, "-m", "mcsync.cli.main", *args],
                          capture_output=True, text=True, check=False, timeout=120,
                          cwd=Path(__file__).parents[2])


def test_a_target_directory_that_refuses_writes(tmp_path, without_dac):
    files = {"open/a": b"a", "locked/b": b"b", "locked/deeper/c": b"c", "z": b"z"}
    write_tree(tmp_path / "src", files)
    root = tmp_path / "root"
    (root / "locked").mkdir(parents=True)
    (root / "locked").chmod(0o555)
    try:
        run = mcsync_cli(without_dac, "sync", str(tmp_path / "src"), str(root), "--json")
    finally:
        (root / "locked").chmod(0o755)
    assert run.returncode == 1, run.stderr
    report = json.loads(run.stdout)
    assert {f["key"]: f["error"] for f in report["failures"]} == {
        "locked/b": f"Permission denied ({root / 'locked'})",
        "locked/deeper/c": f"Permission denied ({root / 'locked' / 'deeper'})",
    }
    assert [line for line in run.stderr.splitlines() if line.startswith("failed:")] == [
        f"failed: locked/b: Permission denied ({root / 'locked'})",
        f"failed: locked/deeper/c: Permission denied ({root / 'locked' / 'deeper'})"]
    assert read_tree(root) == {"open/a": b"a", "z": b"z"} and hidden(root) == []
    assert set(recorded(report["manifest"])) == {"open/a", "z"}
    assert_next_run_finishes(str(tmp_path / "src"), root, files, {"locked/b", "locked/deeper/c"})


def test_a_source_file_that_cannot_be_read(tmp_path, without_dac):
    files = {"a": b"a", "secret": b"s", "z": b"z"}
    write_tree(tmp_path / "src", files)
    (tmp_path / "src" / "secret").chmod(0o000)
    root = tmp_path / "root"
    try:
        run = mcsync_cli(without_dac, "sync", str(tmp_path / "src"), str(root), "--json")
    finally:
        (tmp_path / "src" / "secret").chmod(0o644)
    assert run.returncode == 1, run.stderr
    report = json.loads(run.stdout)
    assert {f["key"]: f["error"] for f in report["failures"]} == {
        "secret": f"Permission denied ({tmp_path / 'src' / 'secret'})"}
    assert read_tree(root) == {"a": b"a", "z": b"z"}
    assert_next_run_finishes(str(tmp_path / "src"), root, files, {"secret"})


def test_a_source_directory_that_cannot_be_listed(tmp_path, without_dac):
    """What an unreadable directory holds is unknown: the run stops (a --delete must never
    act on a listing with a hole in it), one line naming the directory."""
    write_tree(tmp_path / "src", {"a": b"a", "private/p": b"p"})
    write_tree(tmp_path / "root", {"stale": b"old"})
    (tmp_path / "src" / "private").chmod(0o000)
    try:
        run = mcsync_cli(without_dac, "sync", str(tmp_path / "src"), str(tmp_path / "root"),
                         "--delete")
    finally:
        (tmp_path / "src" / "private").chmod(0o755)
    assert run.returncode == 1, run.stderr
    assert [line for line in run.stderr.splitlines() if line.startswith("mcsync: error:")] == [
        f"mcsync: error: {tmp_path / 'src' / 'private'}: cannot list this directory: "
        "Permission denied"]
    assert "Traceback" not in run.stderr
    assert read_tree(tmp_path / "root")["stale"] == b"old"  # nothing deleted


# --------------------------------------------------------------------------------------------
# Leftovers of a killed run


def test_hidden_files_of_a_killed_run_are_swept_by_the_next(moto, tmp_path):
    bucket = new_bucket(moto)
    objects = {f"shard-{i}.bin": payload(6 * MiB, i) for i in range(4)}
    put_objects(moto, bucket, objects)
    root = tmp_path / "root"
    args = ("sync", f"s3://{bucket}/", str(root), "--part-size", "5MiB", "-c", "4", "--quiet")
    # killed after the third hidden file was made, before its upload was journalled: a file
    # no journal knows of, which no resume will ever take up
    killed = crashed_run("begin:3", *args, env=dict(os.environ) | moto.aws_env())
    assert killed.returncode == -9, killed.stderr
    assert hidden(root), "the killed run left hidden files behind"
    rerun = subprocess.run([sys.executable, "-m", "mcsync.cli.main", *args],
                           env=dict(os.environ) | moto.aws_env(), capture_output=True,
                           text=True, check=False, cwd=Path(__file__).parents[2])
    assert rerun.returncode == 0, rerun.stderr
    assert {k: v for k, v in read_tree(root).items() if ".mcsync-tmp-" not in k} == objects
    assert hidden(root) == []
