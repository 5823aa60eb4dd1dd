"""Bad input: one line naming the cause, a documented exit code, nothing written."""

from __future__ import annotations

import errno
import fcntl
import http.server
import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import mcsync
from mcsync.errors import UsageError
from mcsync.stores.registry import StoreOptions
from mcsync.testing.faults import Faults, Rule, faulty

from .helpers import (
    new_bucket,
    put_objects,
    read_bucket,
    read_tree,
    run_cli,
    sync_stores,
    write_tree,
)


def error_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith("mcsync: error:")]


@pytest.mark.parametrize("url", ["s3://", "s3://Bad_Bucket!/x", "ftp://host/x", "meta://"])
def test_malformed_url_is_usage_error(tmp_path, url):
    result = run_cli(
        "sync", str(tmp_path), url, env={"MCSYNC_META_ENDPOINT_URL": "http://127.0.0.1:9"}
    )
    assert result.exit_code == 2
    (line,) = error_lines(result.output)
    assert url.split("://")[0] in line


def test_missing_bucket_on_either_side(seaweed, tmp_path):
    write_tree(tmp_path / "src", {"a": b"a"})
    env = seaweed.aws_env() | seaweed.meta_env()
    for args in (
        [str(tmp_path / "src"), "meta://no-such-bucket-x/"],
        ["s3://no-such-bucket-y/", str(tmp_path / "dst")],
    ):
        result = run_cli("sync", *args, env=env)
        assert result.exit_code == 2, result.output
        (line,) = error_lines(result.output)
        assert "no-such-bucket" in line
    assert not (tmp_path / "dst").exists()


def test_wrong_credentials_exit_2_and_never_echo_the_secret(seaweed, tmp_path):
    write_tree(tmp_path / "src", {"a": b"a"})
    bucket = new_bucket(seaweed)
    env = seaweed.meta_env() | {"MCSYNC_META_SECRET_ACCESS_KEY": "wrong-secret-value-123"}
    result = run_cli("sync", str(tmp_path / "src"), f"meta://{bucket}/", "-v", env=env)
    assert result.exit_code == 2, result.output
    (line,) = error_lines(result.output)
    assert "access denied" in line or "credentials" in line
    assert "wrong-secret-value-123" not in result.output
    assert read_bucket(seaweed, bucket) == {}


def test_secret_never_in_output_of_a_good_verbose_run(seaweed, tmp_path):
    write_tree(tmp_path / "src", {"a": b"a"})
    bucket = new_bucket(seaweed)
    result = run_cli(
        "sync", str(tmp_path / "src"), f"meta://{bucket}/", "-v", "--json", env=seaweed.meta_env()
    )
    assert result.exit_code == 0, result.output
    assert seaweed.secret_key not in result.output


def test_unwritable_local_target(tmp_path):
    write_tree(tmp_path / "src", {"a": b"a"})
    (tmp_path / "file").write_bytes(b"not a directory")
    result = run_cli("sync", str(tmp_path / "src"), str(tmp_path / "file" / "sub"), env={})
    assert result.exit_code == 2, result.output
    (line,) = error_lines(result.output)
    assert "file/sub" in line
    assert (tmp_path / "file").read_bytes() == b"not a directory"


def test_missing_local_source(tmp_path):
    result = run_cli("sync", str(tmp_path / "nope"), str(tmp_path / "dst"), env={})
    assert result.exit_code == 2
    (line,) = error_lines(result.output)
    assert "nope" in line
    assert not (tmp_path / "dst").exists()


def test_keys_that_would_escape_a_filesystem_target(moto, tmp_path):
    bucket = new_bucket(moto)
    evil = {"../../escape-1.txt": b"x", "ok/../../escape-2.txt": b"y"}
    put_objects(moto, bucket, evil | {"good.txt": b"g"}, prefix="p/")
    listed = read_bucket(moto, bucket, "p/")
    assert set(listed) >= set(evil), "the server must keep the keys for this test to mean much"
    root = tmp_path / "deep" / "root"
    result = run_cli("sync", f"s3://{bucket}/p/", str(root), "--json", env=moto.aws_env())
    assert result.exit_code == 1, result.output
    report = json.loads(result.stdout)
    assert {f["key"] for f in report["failures"]} == set(evil)
    assert all("unsafe key" in f["error"] for f in report["failures"])
    assert read_tree(root) == {"good.txt": b"g"}
    everything = {
        str(Path(d, f).relative_to(tmp_path)) for d, _, fs in os.walk(tmp_path) for f in fs
    }
    # the data file, and mcsync's own state kept at the target root
    assert {p for p in everything if "/.mcsync/" not in p} == {"deep/root/good.txt"}
    assert all(p.startswith("deep/root/") for p in everything)


# --------------------------------------------------------------------------------------------
# Options, addresses, configuration: exit 2, one line naming the setting, nothing written.


def files_under(root: Path) -> set[str]:
    return {str(Path(d, f).relative_to(root)) for d, _, fs in os.walk(root) for f in fs}


@pytest.mark.parametrize(("args", "line"), [
    (["--part-size", "1"], "mcsync: error: --part-size must be between 5 MiB and 5 GiB, got 1 B"),
    (["--part-size", "6GiB"],
     "mcsync: error: --part-size must be between 5 MiB and 5 GiB, got 6.0 GiB"),
    (["--memory-limit", "1KiB"],
     "mcsync: error: --memory-limit must be at least 5 MiB, got 1.0 KiB"),
])
def test_part_size_and_memory_limit_out_of_range(tmp_path, args, line):
    write_tree(tmp_path / "src", {"a": b"a"})
    result = run_cli("sync", str(tmp_path / "src"), str(tmp_path / "dst"), *args, env={})
    assert result.exit_code == 2, result.output
    assert error_lines(result.output) == [line]
    assert not (tmp_path / "dst").exists()


@pytest.mark.parametrize("option", ["--part-size", "--memory-limit"])
@pytest.mark.parametrize("value", ["1e400", "-5MiB", "nan", "12parsecs"])
def test_a_size_that_is_no_size_is_a_usage_error(tmp_path, option, value):
    write_tree(tmp_path / "src", {"a": b"a"})
    result = run_cli("sync", str(tmp_path / "src"), str(tmp_path / "dst"), option, value, env={})
    assert result.exit_code == 2, result.output
    (line,) = [x for x in result.output.splitlines() if x.startswith("Error:")]
    assert f"Invalid value for '{option}': not a size: {value!r}" in line
    assert "Traceback" not in result.output
    assert not (tmp_path / "dst").exists()


def test_concurrency_zero_is_a_usage_error(tmp_path):
    write_tree(tmp_path / "src", {"a": b"a"})
    for option, says in (("--concurrency", "must be a number (1 or more) or auto, got '0'"),
                         ("--part-concurrency", "0 is not in the range x>=1")):
        result = run_cli("sync", str(tmp_path / "src"), str(tmp_path / "dst"), option, "0", env={})
        assert result.exit_code == 2, result.output
        (line,) = [x for x in result.output.splitlines() if x.startswith("Error:")]
        assert says in line and option in line
    assert not (tmp_path / "dst").exists()
    # the library says the same, in its own words
    with pytest.raises(UsageError, match=r"^--concurrency must be at least 1 \(or auto\), got 0$"):
        mcsync.sync(str(tmp_path / "src"), str(tmp_path / "dst"), concurrency=0)
    assert not (tmp_path / "dst").exists()


@pytest.mark.parametrize(("src", "dst", "bucket"), [
    ("s3://192.168.1.1/x/", "{tmp}/dst", "192.168.1.1"),
    ("{tmp}/src", "meta://10.0.0.7/", "10.0.0.7"),
    ("{tmp}/src", "s3://127.0.0.1/a/b", "127.0.0.1"),
])
def test_bucket_name_that_is_an_ip_address(tmp_path, src, dst, bucket):
    write_tree(tmp_path / "src", {"a": b"a"})
    args = [a.format(tmp=tmp_path) for a in (src, dst)]
    started = time.monotonic()
    result = run_cli("sync", *args, env={"MCSYNC_META_ENDPOINT_URL": "http://127.0.0.1:9"})
    assert result.exit_code == 2, result.output
    (line,) = error_lines(result.output)
    assert f"{bucket!r} is not a valid bucket name (an IP address" in line
    assert time.monotonic() - started < 5  # refused as written, never sent anywhere
    assert not (tmp_path / "dst").exists()


def test_bucket_name_with_a_newline(tmp_path):
    result = run_cli("sync", str(tmp_path), "s3://bucket\n/x", env={})
    assert result.exit_code == 2
    (line,) = error_lines(result.output)
    assert "'bucket\\n' is not a valid bucket name" in line


@pytest.mark.parametrize(("body", "says"), [
    (b"[meta.default\nendpoint_url = 'http://x'\n",
     "cannot read mcsync config: Expected ']' at the end of a table declaration (at line 1, "
     "column 14)"),
    (b"\xff\xfe[\x00m\x00e\x00t\x00a\x00]\x00", "cannot read mcsync config: not UTF-8 text"),
    (b"meta = 3\n", "'meta' must be a table of profiles ([meta.default])"),
    (b"[meta]\ndefault = 'x'\n", "[meta.default] must be a table of settings"),
    (b"[meta.default]\nendpoint-url = 'http://x'\n", "[meta.default]: unknown setting "
     "'endpoint-url'"),
    (b"[meta.default]\nendpoint_url = ['http://x']\n",
     "[meta.default] endpoint_url must be a string, got list"),
    (None, "cannot read mcsync config: Is a directory"),
])
def test_config_file_that_cannot_be_used(tmp_path, body, says):
    write_tree(tmp_path / "src", {"a": b"a"})
    config = tmp_path / "config.toml"
    if body is None:
        config.mkdir()
    else:
        config.write_bytes(body)
    result = run_cli("sync", str(tmp_path / "src"), "meta://bucket/x/",
                     env={"MCSYNC_CONFIG": str(config)})
    assert result.exit_code == 2, result.output
    (line,) = error_lines(result.output)
    assert line.startswith(f"mcsync: error: {config}: {says}"), line
    assert "Traceback" not in result.output


def test_a_good_config_file_still_works(tmp_path):
    config = tmp_path / "config.toml"
    config.write_text("[meta.default]\nendpoint_url = 'http://127.0.0.1:9'\npath_style = false\n"
                      "region = 'eu-west-1'\n")
    from mcsync.stores.registry import meta_settings

    assert meta_settings({}, config) == {"endpoint_url": "http://127.0.0.1:9",
                                         "path_style": "false", "region": "eu-west-1"}


# A target inside the source would be listed as part of the source and copied into itself, a
# level deeper every run; a source inside the target would be overwritten (and, with --delete,
# deleted). Refused before anything is written
# (mcsync.run.preflight.refuse_nested, before either store's check()).


@pytest.mark.parametrize("where", ["target inside source", "source inside target", "same"])
def test_nested_local_source_and_target_is_a_usage_error(tmp_path, where):
    outer = tmp_path / "outer"
    write_tree(outer, {"a": b"a", "sub/b": b"b"})
    src, dst = {"target inside source": (outer, outer / "out"),
                "source inside target": (outer / "sub", outer),
                "same": (outer, outer)}[where]
    before = read_tree(tmp_path, with_state=True)
    result = run_cli("sync", str(src), str(dst), "--delete", env={})
    assert result.exit_code == 2, result.output
    (line,) = error_lines(result.output)
    assert {"target inside source": "the target is inside the source",
            "source inside target": "the source is inside the target",
            "same": "the target is the source directory itself"}[where] in line
    assert read_tree(tmp_path, with_state=True) == before


def test_nested_local_directories_are_recognised(tmp_path):
    from mcsync.run.preflight import refuse_nested
    from mcsync.stores.local import LocalStore

    (tmp_path / "real").mkdir()
    (tmp_path / "alias").symlink_to(tmp_path / "real")
    ok = [(tmp_path / "a", tmp_path / "b"), (tmp_path / "a", tmp_path / "ab"),
          (tmp_path / "ab", tmp_path / "a")]
    for s, d in ok:
        refuse_nested(LocalStore(s), LocalStore(d))
    refuse_nested(LocalStore(tmp_path), object())  # not two directories: nothing to say
    with pytest.raises(UsageError, match="the target is inside the source"):
        refuse_nested(LocalStore(tmp_path / "real"), LocalStore(tmp_path / "alias" / "out"))
    with pytest.raises(UsageError, match="the source is inside the target"):
        refuse_nested(LocalStore(tmp_path / "real" / "x"), LocalStore(tmp_path / "alias"))
    with pytest.raises(UsageError, match="the source directory itself"):
        refuse_nested(LocalStore(tmp_path / "real"), LocalStore(tmp_path / "alias/"))


def test_source_that_is_a_file_named_as_a_directory(tmp_path):
    """``file/`` asks for a directory; ``file`` is one file (tests/integration/test_single.py)."""
    (tmp_path / "file").write_bytes(b"x")
    result = run_cli("sync", f"{tmp_path / 'file'}/", str(tmp_path / "dst"), env={})
    assert result.exit_code == 2
    assert error_lines(result.output) == [
        f"mcsync: error: {tmp_path / 'file'}: not a directory (a source is a directory of files)"]
    assert not (tmp_path / "dst").exists()


# --------------------------------------------------------------------------------------------
# The manifest and the run lock: damaged, foreign, left by a dead process, held by a live one.


def first_sync(tmp_path: Path, files: dict[str, bytes] | None = None) -> tuple[str, str, Path]:
    """A pair synced once (local to local); its manifest's path."""
    src, dst = tmp_path / "src", tmp_path / "dst"
    write_tree(src, files or {"a": b"alpha", "d/b": b"beta"})
    result = run_cli("sync", str(src), str(dst), "--json", env={})
    assert result.exit_code == 0, result.output
    return str(src), str(dst), Path(json.loads(result.stdout)["manifest"])


def notes(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith("mcsync: note:")]


@pytest.mark.parametrize("damage", ["truncated", "garbage", "empty", "newer schema",
                                    "no schema version", "rows of the wrong type"])
def test_damaged_manifest_is_set_aside_and_rebuilt(tmp_path, damage):
    src, dst, manifest = first_sync(tmp_path)
    write_tree(Path(src), {"new": b"new"})
    for suffix in ("-wal", "-shm"):
        Path(f"{manifest}{suffix}").unlink(missing_ok=True)
    if damage == "truncated":
        with open(manifest, "r+b") as f:
            f.truncate(manifest.stat().st_size // 3)
    elif damage == "garbage":
        manifest.write_bytes(b"SQLite format 3\x00" + os.urandom(8192))
    elif damage == "empty":
        manifest.write_bytes(b"")
    else:
        db = sqlite3.connect(manifest)
        with db:
            if damage == "newer schema":
                db.execute("UPDATE meta SET v = '99' WHERE k = 'schema_version'")
            elif damage == "no schema version":
                db.execute("DELETE FROM meta WHERE k = 'schema_version'")
            else:
                db.execute("UPDATE objects SET dst_size = 'big' WHERE key = 'a'")
        db.close()
    damaged = manifest.read_bytes()

    result = run_cli("sync", src, dst, "--json", env={})
    assert result.exit_code == 0, result.output
    assert read_tree(Path(dst)) == read_tree(Path(src))
    set_aside = sorted(manifest.parent.glob(manifest.name + ".bad-*"))
    if damage == "empty":  # an empty file is an empty database: nothing to set aside
        assert set_aside == [] and notes(result.output) == []
        return
    (note,) = notes(result.output)
    (bad,) = set_aside
    why = {"truncated": "was unreadable (", "garbage": "was unreadable (",
           "newer schema": "was written by a newer mcsync (schema version 99; this one reads "
                           "versions up to 3)",
           "no schema version": "was damaged (its meta table names no schema version or pair)",
           "rows of the wrong type": "was damaged (a row of its objects table holds what "
                                     "mcsync never writes)"}[damage]
    assert note.startswith(f"mcsync: note: manifest {manifest} {why}"), note
    assert note.endswith(f"; set aside as {bad.name} and rebuilt")
    assert bad.read_bytes() == damaged  # kept as it was: nothing is lost
    again = json.loads(run_cli("sync", src, dst, "--json", env={}).stdout)
    assert again["objects_copied"] == 0 and again["manifest_note"] is None


def test_manifest_of_another_pair_is_refused_not_thrown_away(tmp_path):
    src, dst, manifest = first_sync(tmp_path)
    before = manifest.read_bytes()
    other = tmp_path / "other-dst"
    result = run_cli("sync", src, str(other), "--manifest", str(manifest), env={})
    assert result.exit_code == 2, result.output
    assert error_lines(result.output) == [
        f"mcsync: error: manifest {manifest} records the sync {src} -> {dst}, not {src} -> "
        f"{other}: give each pair its own --manifest"]
    assert manifest.read_bytes() == before and not list(manifest.parent.glob("*.bad-*"))
    assert not other.exists() or files_under(other) == set()


def test_manifest_path_that_is_a_directory(tmp_path):
    write_tree(tmp_path / "src", {"a": b"a"})
    write_tree(tmp_path / "state-dir", {"keep.txt": b"mine"})
    result = run_cli("sync", str(tmp_path / "src"), str(tmp_path / "dst"), "--manifest",
                     str(tmp_path / "state-dir"), env={})
    assert result.exit_code == 2, result.output
    assert error_lines(result.output) == [
        f"mcsync: error: manifest {tmp_path / 'state-dir'}: not a file (a directory?); give "
        "--manifest the path of a file, or of none yet"]
    assert read_tree(tmp_path / "state-dir") == {"keep.txt": b"mine"}  # never set aside
    assert not (tmp_path / "dst" / "a").exists()


def test_sqlite_lock_left_by_a_killed_process(tmp_path):
    """A process killed inside a write transaction leaves its -wal and -shm files; SQLite's
    locks die with it, and the uncommitted writes are rolled back on the next open."""
    src, dst, manifest = first_sync(tmp_path)
    write_tree(Path(src), {"new": b"new"})
    killer = (
        "import os, signal, sqlite3, sys\n"
        "db = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
        "db.execute('BEGIN IMMEDIATE')\n"
        "db.execute('DELETE FROM objects')\n"
        "db.execute(\"UPDATE meta SET v = '99' WHERE k = 'schema_version'\")\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n")
    done = subprocess.run([sys.executable, "-c", killer, str(manifest)], check=False)
    assert done.returncode == -signal.SIGKILL
    assert Path(f"{manifest}-wal").exists()  # what a killed writer leaves behind

    result = run_cli("sync", src, dst, "--json", env={})
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["manifest_note"] is None  # sound: nothing set aside
    assert (report["objects_copied"], report["objects_skipped"]) == (1, 2)
    assert read_tree(Path(dst)) == read_tree(Path(src))
    assert not list(manifest.parent.glob("*.bad-*"))


def test_sqlite_lock_held_by_a_live_process_is_exit_3(tmp_path):
    src, dst, manifest = first_sync(tmp_path)
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sqlite3, sys, time\n"
         "db = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
         "db.execute('BEGIN IMMEDIATE'); db.execute(\"INSERT INTO meta VALUES ('x', 'y')\")\n"
         "print('held', flush=True); time.sleep(60)\n", str(manifest)],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        write_tree(Path(src), {"new": b"new"})
        result = run_cli("sync", src, dst, env={})
    finally:
        holder.kill()
        holder.wait()
        if holder.stdout is not None:
            holder.stdout.close()
    assert result.exit_code == 3, result.output
    assert f"manifest {manifest} is locked by another process" in result.output
    assert not list(manifest.parent.glob("*.bad-*"))


def dead_pid() -> int:
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


def test_run_lock_left_by_a_dead_process(tmp_path):
    src, dst, manifest = first_sync(tmp_path)
    write_tree(Path(src), {"new": b"new"})
    holder = {"host": socket.gethostname(), "pid": dead_pid(), "started_at": time.time()}
    lock = manifest.with_name(manifest.name + ".lock")
    lock.write_text(json.dumps(holder))  # the file stays; its flock died with the process
    target_lock = Path(dst, ".mcsync", f"lock-{manifest.stem}.json")
    target_lock.write_text(json.dumps(holder | {"expires_at": time.time() + 600}))

    result = run_cli("sync", src, dst, "--json", env={})
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["objects_copied"] == 1
    assert read_tree(Path(dst)) == read_tree(Path(src))
    assert not target_lock.exists()  # taken over, then released


@pytest.mark.parametrize("content", [b"", b"{trunc", b"[1, 2]", b'"x"',
                                     b'{"pid": "x", "started_at": 1e300}'])
def test_run_lock_file_with_garbage_in_it(tmp_path, content):
    src, dst, manifest = first_sync(tmp_path)
    lock = manifest.with_name(manifest.name + ".lock")
    lock.write_bytes(content)
    target_lock = Path(dst, ".mcsync", f"lock-{manifest.stem}.json")
    target_lock.write_bytes(content)
    assert run_cli("sync", src, dst, env={}).exit_code == 0
    # and while a live process holds it, the message names what it can
    with open(lock, "r+b") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        held.truncate(0)
        held.write(content)
        held.flush()
        result = run_cli("sync", src, dst, env={})
    assert result.exit_code == 3, result.output
    (line,) = [x for x in result.output.splitlines() if x.startswith("mcsync: locked:")]
    assert f"another run of this sync holds {lock} (pid " in line


def test_run_lock_path_that_cannot_be_opened(tmp_path):
    src, dst, manifest = first_sync(tmp_path)
    lock = manifest.with_name(manifest.name + ".lock")
    lock.unlink()
    lock.mkdir()
    result = run_cli("sync", src, dst, env={})
    assert result.exit_code == 2, result.output
    assert error_lines(result.output) == [
        f"mcsync: error: cannot open the run lock {lock}: Is a directory"]


# --------------------------------------------------------------------------------------------
# Keys a file system cannot hold, from a real S3 listing (moto) to a local target: each a
# failure naming the key and the cause; the others written; nothing outside the root.


def failures_of(result: Any) -> dict[str, str]:
    return {f["key"]: f["error"] for f in json.loads(result.stdout)["failures"]}


def test_keys_a_file_system_cannot_hold(moto, tmp_path):
    bucket = new_bucket(moto)
    long_name = "n" * 256
    wide = "é" * 127 + "x"  # 255 bytes: the longest name there is, and it fits
    good = {"ok.txt": b"ok", "x\\y": b"backslash", "..\\..\\z": b"dots and backslashes",
            f"deep/{wide}": b"wide", "sp ace": b"space"}
    bad = {"/abs": b"absolute", "dir/": b"not a marker", f"deep/{long_name}": b"long",
           f"new-dir/{long_name}/x": b"long dir", "a/./b": b"dot", "a//b": b"empty"}
    markers = {"folder/": b"", "deep/": b""}  # the console's "Create folder": skipped, no failure
    put_objects(moto, bucket, good | bad | markers, prefix="p/")
    assert set(read_bucket(moto, bucket, "p/")) == set(good | bad | markers)
    root = tmp_path / "root"
    result = run_cli("sync", f"s3://{bucket}/p/", str(root), "--json", env=moto.aws_env())
    assert result.exit_code == 1, result.output
    assert failures_of(result) == {
        "/abs": "unsafe key refused: '/abs': absolute path",
        "dir/": "unsafe key refused: 'dir/': ends with '/' (an S3 directory marker): a file "
                "system holds no file of that name",
        f"deep/{long_name}": f"unsafe key refused: {'deep/' + long_name!r}: the name "
                             f"{'n' * 40!r}... is 256 bytes; a file name holds at most 255",
        f"new-dir/{long_name}/x": f"unsafe key refused: {'new-dir/' + long_name + '/x'!r}: the "
                                  f"name {'n' * 40!r}... is 256 bytes; a file name holds at "
                                  "most 255",
        "a/./b": "unsafe key refused: 'a/./b': '.', '..' or empty path component",
        "a//b": "unsafe key refused: 'a//b': '.', '..' or empty path component",
    }
    assert json.loads(result.stdout)["objects_skipped"] == len(markers)
    # backslashes are ordinary characters in a Linux file name: the keys arrive as they are
    assert read_tree(root) == good
    assert sorted(os.listdir(root)) == sorted([".mcsync", "..\\..\\z", "deep", "ok.txt",
                                               "sp ace", "x\\y"])  # no new-dir/ made
    assert {p for p in files_under(tmp_path) if "/.mcsync/" not in p} == {
        f"root/{k}" for k in good}


@pytest.mark.parametrize("first", ["a", "a/b"])
def test_a_key_that_is_both_a_file_and_a_directory(moto, tmp_path, first, monkeypatch):
    """``a`` and ``a/b`` at the source: a file system holds one of them. Whichever lands first
    stays; the other fails, naming the one in its way. Here the order is forced."""
    from mcsync.stores.registry import open_store

    bucket = new_bucket(moto)
    put_objects(moto, bucket, {"a": b"file a", "a/b": b"file a/b", "c": b"c"})
    later = "a/b" if first == "a" else "a"
    source = faulty(open_store(f"s3://{bucket}/", StoreOptions(endpoint_url=moto.url)),
                    Faults([Rule("get", key=later, delay_s=0.5)]))
    env = moto.aws_env()
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    report = sync_stores(source, str(tmp_path / "root"))
    assert report.exit_code == 1
    expected = {"a/b": "unsafe key refused: 'a/b': 'a' is a file at the target, so it cannot "
                       "also be a directory",
                "a": "unsafe key refused: 'a': a directory of that name exists at the target "
                     "(keys under 'a/'), so it cannot also be a file"}
    assert dict(report.failures) == {later: expected[later]}
    assert read_tree(tmp_path / "root") == {first: {"a": b"file a", "a/b": b"file a/b"}[first],
                                            "c": b"c"}
    # the next run says the same, and loses nothing
    again = run_cli("sync", f"s3://{bucket}/", str(tmp_path / "root"), "--json", env=env)
    assert again.exit_code == 1 and failures_of(again) == {later: expected[later]}


def test_a_file_and_a_directory_of_one_name_unordered(moto, tmp_path):
    bucket = new_bucket(moto)
    put_objects(moto, bucket, {"a": b"file a", "a/b": b"file a/b"})
    result = run_cli("sync", f"s3://{bucket}/", str(tmp_path / "root"), "--json",
                     env=moto.aws_env())
    assert result.exit_code == 1
    ((key, error),) = failures_of(result).items()
    assert key in ("a", "a/b") and error.startswith("unsafe key refused: ")
    assert ("is a file at the target" if key == "a/b" else "a directory of that name") in error


def test_names_differing_only_by_case_on_a_case_sensitive_target(moto, tmp_path):
    bucket = new_bucket(moto)
    put_objects(moto, bucket, {"readme.md": b"new", "Data/x": b"x", "data/y": b"y"})
    write_tree(tmp_path / "root", {"README.md": b"the user's own"})
    result = run_cli("sync", f"s3://{bucket}/", str(tmp_path / "root"), env=moto.aws_env())
    assert result.exit_code == 0, result.output
    assert read_tree(tmp_path / "root") == {"README.md": b"the user's own", "readme.md": b"new",
                                            "Data/x": b"x", "data/y": b"y"}


@pytest.fixture
def case_insensitive_target(monkeypatch):
    """Local targets that report a filesystem which folds case (vfat, SMB, a casefolded ext4
    directory; this sandbox can mount none). What is simulated is only the answer of the probe
    LocalStore makes before its first write; the names written and refused are real."""
    from mcsync.stores.local_paths import RootedPaths

    monkeypatch.setattr(RootedPaths, "_folds_case", staticmethod(lambda probe: True))


def test_names_differing_only_by_case_on_a_case_insensitive_target(moto, tmp_path,
                                                                   case_insensitive_target):
    bucket = new_bucket(moto)
    put_objects(moto, bucket, {"readme.md": b"new", "Data/x": b"x", "data/y": b"y",
                               "ok": b"ok"})
    write_tree(tmp_path / "root", {"README.md": b"the user's own"})
    result = run_cli("sync", f"s3://{bucket}/", str(tmp_path / "root"), "--json",
                     env=moto.aws_env())
    assert result.exit_code == 1, result.output
    failed = failures_of(result)
    assert failed.pop("readme.md") == (
        "unsafe key refused: 'readme.md': the target holds 'README.md', whose name differs only "
        "by case, and its file system does not tell them apart")
    # of Data/ and data/, the one written first stays and the other is refused
    ((key, error),) = failed.items()
    other = {"Data/x": "data", "data/y": "Data"}[key]
    assert error == (f"unsafe key refused: {key!r}: the target holds {other!r}, whose name "
                     "differs only by case, and its file system does not tell them apart")
    tree = read_tree(tmp_path / "root")
    assert tree.pop("README.md") == b"the user's own"  # never overwritten
    assert tree == {"ok": b"ok", **({"data/y": b"y"} if key == "Data/x" else {"Data/x": b"x"})}


def test_a_name_the_target_refuses(tmp_path):
    """A target that refuses a name (vfat and SMB refuse ':' and '?'): simulated by its
    answer, EINVAL, to creating the file."""
    from mcsync.stores.local import LocalStore

    write_tree(tmp_path / "src", {"ok": b"ok", "what?.txt": b"q"})
    target = faulty(LocalStore(tmp_path / "root"), Faults([Rule(
        "put", key="what?.txt", error=OSError(errno.EINVAL, os.strerror(errno.EINVAL),
                                              str(tmp_path / "root" / "what?.txt")))]))
    report = sync_stores(str(tmp_path / "src"), target)
    assert report.exit_code == 1
    assert dict(report.failures) == {
        "what?.txt": f"Invalid argument ({tmp_path / 'root' / 'what?.txt'})"}
    assert read_tree(tmp_path / "root") == {"ok": b"ok"}


def test_a_nul_byte_in_a_key(tmp_path):
    """S3 cannot list a NUL (XML 1.0 has no such character): an in-process source can."""
    from mcsync.stores.memory import MemoryObject, MemoryStore

    src = MemoryStore("src")
    for key, data in {"a\x00b": b"nul", "ok": b"ok"}.items():
        src.endpoint.objects[src.prefix + key] = MemoryObject(data, "e" * 32, time.time())
    report = sync_stores(src, str(tmp_path / "root"))
    assert report.exit_code == 1
    assert dict(report.failures) == {"a\x00b": "unsafe key refused: 'a\\x00b': empty key or "
                                               "NUL byte"}
    assert read_tree(tmp_path / "root") == {"ok": b"ok"}


BAD_NAME = b"bad\xff\xfe.bin"  # not UTF-8: os.fsdecode makes it 'bad\udcff\udcfe.bin'


def tree_with_a_bad_name(root: Path) -> str:
    write_tree(root, {"ok": b"ok"})
    with open(os.fsencode(root) + b"/" + BAD_NAME, "wb") as f:
        f.write(b"bytes")
    return os.fsdecode(BAD_NAME)


def test_file_name_that_is_not_utf8(tmp_path):
    key = tree_with_a_bad_name(tmp_path / "src")
    result = run_cli("sync", str(tmp_path / "src"), str(tmp_path / "root"), "--no-manifest",
                     "--json", env={})
    assert result.exit_code == 1, result.output
    assert failures_of(result) == {key: (
        "unsafe key refused: 'bad\\udcff\\udcfe.bin': not valid UTF-8 (a file name of the bytes "
        "b'bad\\xff\\xfe.bin': rename it)")}
    assert os.listdir(tmp_path / "root") == ["ok"]
    assert os.listdir(os.fsencode(tmp_path / "src")) != []  # the source is as it was


def test_file_name_that_is_not_utf8_with_a_manifest(tmp_path):
    key = tree_with_a_bad_name(tmp_path / "src")
    result = run_cli("sync", str(tmp_path / "src"), str(tmp_path / "root"), "--json", env={})
    assert result.exit_code == 1, result.output
    assert set(failures_of(result)) == {key}
    assert sorted(os.listdir(tmp_path / "root")) == [".mcsync", "ok"]  # the manifest copy


def test_file_name_that_is_not_utf8_to_s3(moto, tmp_path):
    key = tree_with_a_bad_name(tmp_path / "src")
    bucket = new_bucket(moto)
    result = run_cli("sync", str(tmp_path / "src"), f"s3://{bucket}/", "--no-manifest",
                     "--json", env=moto.aws_env())
    assert result.exit_code == 1, result.output
    assert "not valid UTF-8" in failures_of(result)[key]
    assert read_bucket(moto, bucket) == {"ok": b"ok"}


# --------------------------------------------------------------------------------------------
# An endpoint that is not S3: a web server answering 200 and an HTML page to every request.


@pytest.fixture
def html_endpoint():
    class Page(http.server.BaseHTTPRequestHandler):
        def answer(self) -> None:
            body = b"<html><body><h1>Welcome to nginx!</h1></body></html>"
            length = int(self.headers.get("Content-Length") or 0)
            if length:
                self.rfile.read(length)
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = answer

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Page)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


KEYS = {"AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s"}


def test_html_endpoint_as_target_writes_nothing(html_endpoint, tmp_path):
    write_tree(tmp_path / "src", {"a": b"a"})
    result = run_cli("sync", str(tmp_path / "src"), "s3://bucket/p/", "--endpoint-url",
                     html_endpoint, env=KEYS)
    assert result.exit_code != 0
    assert len(error_lines(result.output)) == 1
    assert read_tree(tmp_path / "src") == {"a": b"a"}


@pytest.mark.parametrize("side", ["source", "target"])
def test_html_endpoint_is_a_configuration_error(html_endpoint, tmp_path, side):
    write_tree(tmp_path / "local", {"precious": b"keep me"})
    remote = "s3://bucket/p/"
    args = [remote, str(tmp_path / "local")] if side == "source" else [
        str(tmp_path / "local"), remote]
    result = run_cli("sync", *args, "--delete", "--endpoint-url", html_endpoint, env=KEYS)
    assert read_tree(tmp_path / "local") == {"precious": b"keep me"}  # nothing deleted
    assert result.exit_code == 2, result.output
    (line,) = error_lines(result.output)
    assert html_endpoint in line and "S3" in line


# --------------------------------------------------------------------------------------------
# A safetensors header that lies: the file is cut in fixed blocks instead, and copied byte for
# byte (the header only decides where chunks begin).

ST_PART = 5 << 20


def safetensors_file(header: bytes | dict[str, Any], data_size: int, *,
                     length: int | None = None) -> bytes:
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    n = len(raw) if length is None else length
    return n.to_bytes(8, "little") + raw + bytes(range(256)) * (data_size // 256) + b"\x01" * (
        data_size % 256)


def chunker_recorded(manifest: Path, key: str) -> str:
    db = sqlite3.connect(manifest)
    try:
        (chunker,) = db.execute("SELECT chunker FROM objects WHERE key = ?", (key,)).fetchone()
    finally:
        db.close()
    return str(chunker)


SIX_MIB = 6 << 20
LYING_HEADERS = {
    "honest": safetensors_file({"w": {"dtype": "U8", "shape": [SIX_MIB],
                                      "data_offsets": [0, SIX_MIB]}}, SIX_MIB),
    "length past EOF": safetensors_file(b'{"w": {}}', SIX_MIB, length=SIX_MIB * 2),
    "overlapping data_offsets": safetensors_file(
        {"w": {"data_offsets": [0, 4 << 20]}, "v": {"data_offsets": [1 << 20, SIX_MIB]}},
        SIX_MIB),
    "data_offsets out of range": safetensors_file(
        {"w": {"data_offsets": [0, SIX_MIB * 3]}}, SIX_MIB),
    "data_offsets not numbers": safetensors_file(
        {"w": {"data_offsets": ["0", float("inf")]}}, SIX_MIB),
    "not JSON": safetensors_file(b"\x89PNG\r\n\x1a\n not json at all", SIX_MIB),
    "JSON nested too deep": safetensors_file(b"[" * 100_000 + b"]" * 100_000, SIX_MIB),
    "a number of 5000 digits": safetensors_file(
        b'{"w": {"data_offsets": [0, ' + b"9" * 5000 + b"]}}", SIX_MIB),
}


@pytest.mark.parametrize("lie", sorted(LYING_HEADERS))
def test_a_safetensors_header_that_lies(tmp_path, lie):
    data = LYING_HEADERS[lie]
    write_tree(tmp_path / "src", {"model.safetensors": data})
    result = run_cli("sync", str(tmp_path / "src"), str(tmp_path / "dst"), "--part-size", "5MiB",
                     "--json", env={})
    assert result.exit_code == 0, result.output
    assert read_tree(tmp_path / "dst") == {"model.safetensors": data}
    manifest = Path(json.loads(result.stdout)["manifest"])
    expected = "safetensors" if lie == "honest" else "fixed"
    assert chunker_recorded(manifest, "model.safetensors") == expected


def test_a_safetensors_header_of_100_mb(tmp_path):
    """The header length says 100 MB (the reference reader's cap, read in one request): read,
    found not to be JSON, cut in fixed blocks. One byte more is refused without reading."""
    src = tmp_path / "src"
    src.mkdir()
    for name, n in (("at-cap.safetensors", 100_000_000), ("over-cap.safetensors", 100_000_001)):
        with open(src / name, "wb") as f:  # sparse: a header of NUL bytes
            f.write(n.to_bytes(8, "little"))
            f.truncate(8 + n + 1024)
            f.seek(8 + n)
            f.write(b"tensor bytes")
    result = run_cli("sync", str(src), str(tmp_path / "dst"), "--json", env={})
    assert result.exit_code == 0, result.output
    manifest = Path(json.loads(result.stdout)["manifest"])
    for name in ("at-cap.safetensors", "over-cap.safetensors"):
        with open(src / name, "rb") as a, open(tmp_path / "dst" / name, "rb") as b:
            while chunk := a.read(8 << 20):
                assert chunk == b.read(8 << 20)
            assert b.read() == b""
        assert chunker_recorded(manifest, name) == "fixed"
