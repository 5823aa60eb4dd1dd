"""The manifest's copy at the target: sent from its snapshot file one part at a time (a
manifest takes ~200 bytes a key, so a million keys would otherwise be ~200 MB held at once),
journalled while its upload is open, and a killed run's open upload of it aborted."""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import sqlite3
import time
from pathlib import Path

import pytest

from mcsync.errors import Permanent
from mcsync.run.engine import target_lock_key
from mcsync.run.manifest_copy import send_file, target_manifest_key
from mcsync.state.lock import Locked
from mcsync.state.manifest import Manifest
from mcsync.stores.memory import MemoryEndpoint, MemoryObject, MemoryStore
from mcsync.testing.faults import Call, Faults, Rule, faulty
from mcsync.types import Capabilities, ObjectInfo

from .test_engine import OBJECTS, contents, seed, sync

PART = 4096
SMALL_PARTS = Capabilities(min_part_size=1024)


def a_file(tmp_path: Path, size: int) -> tuple[Path, bytes]:
    data = random.Random(size).randbytes(size)
    path = tmp_path / "snapshot.sqlite"
    path.write_bytes(data)
    return path, data


def journal(tmp_path: Path) -> Manifest:
    return Manifest(tmp_path / "manifest.sqlite", "memory://a/src/", "memory://b/dst/")


def test_a_file_larger_than_a_part_goes_in_parts_of_at_most_one_part(tmp_path):
    path, data = a_file(tmp_path, 2 * PART + 100)
    store = MemoryStore("dst", caps=SMALL_PARTS)
    sent: list[tuple[str, int]] = []
    faults = Faults([Rule("put*", times=None, action=lambda c: sent.append((c.op, c.nbytes)))])
    manifest = journal(tmp_path)
    asyncio.run(send_file(faulty(store, faults), "copy.sqlite", path, PART, manifest))
    assert store.endpoint.objects["dst/copy.sqlite"].data == data
    assert sent == [("put_part", PART), ("put_part", PART), ("put_part", 100)]
    assert store.endpoint.uploads == {}
    assert "copy.sqlite" not in manifest.open_uploads()


def test_a_file_that_fits_in_a_part_is_one_put(tmp_path):
    path, data = a_file(tmp_path, PART)
    store = MemoryStore("dst", caps=SMALL_PARTS)
    faults = Faults()
    asyncio.run(send_file(faulty(store, faults), "copy.sqlite", path, PART, journal(tmp_path)))
    assert store.endpoint.objects["dst/copy.sqlite"].data == data
    assert dict(faults.calls) == {"put": 1}


def test_while_its_upload_is_open_it_is_journalled_so_a_killed_run_leaves_no_orphan(tmp_path):
    path, _ = a_file(tmp_path, 3 * PART)
    store = MemoryStore("dst", caps=SMALL_PARTS)
    manifest = journal(tmp_path)
    seen: list[str | None] = []

    def look(call: Call) -> None:
        upload = manifest.open_uploads().get("copy.sqlite")
        seen.append(upload.upload_id if upload else None)

    faults = Faults([Rule("put_part", nth=2, action=look)])
    asyncio.run(send_file(faulty(store, faults), "copy.sqlite", path, PART, manifest))
    assert len(seen) == 1 and seen[0] is not None and seen[0].startswith("mem-upload-")
    assert "copy.sqlite" not in manifest.open_uploads()


def test_a_failed_part_aborts_the_upload_and_leaves_nothing_visible(tmp_path):
    path, _ = a_file(tmp_path, 3 * PART)
    store = MemoryStore("dst", caps=SMALL_PARTS)
    manifest = journal(tmp_path)
    faults = Faults([Rule("put_part", nth=2, error=Permanent("disk on fire"))])
    with pytest.raises(Permanent, match="disk on fire"):
        asyncio.run(send_file(faulty(store, faults), "copy.sqlite", path, PART, manifest))
    assert "dst/copy.sqlite" not in store.endpoint.objects
    assert store.endpoint.uploads == {}
    assert manifest.open_uploads() == {}


def test_a_killed_runs_open_upload_of_the_copy_is_aborted_by_the_next_run(tmp_path):
    src = MemoryStore("src", endpoint=MemoryEndpoint("a"))
    dst = MemoryStore("dst", endpoint=MemoryEndpoint("b"))
    seed(src, OBJECTS)
    key = target_manifest_key(src, dst)

    async def left_open() -> str:
        upload = await dst.open_upload(key, 3 * PART)
        return upload.upload_id

    upload_id = asyncio.run(left_open())
    manifest = Manifest(tmp_path / "manifest.sqlite", src.url, dst.url)
    manifest.begin_upload(key, upload_id, ObjectInfo(key, 3 * PART, None, None), PART)
    manifest.close()

    report = sync(src, dst, tmp_path)
    assert report.ok and contents(dst) == OBJECTS
    assert dst.endpoint.uploads == {}, "the killed run's upload of the copy is aborted"
    assert key not in Manifest(tmp_path / "manifest.sqlite", src.url, dst.url).open_uploads()
    copy = tmp_path / "copy.sqlite"  # the copy is the run's manifest: every object recorded
    copy.write_bytes(dst.endpoint.objects[dst.prefix + key].data)
    with contextlib.closing(sqlite3.connect(copy)) as db:
        assert {k for (k,) in db.execute("SELECT key FROM objects")} == set(OBJECTS)


def test_a_copy_that_takes_long_is_refreshed_less_often(tmp_path, monkeypatch):
    """During a run the copy is refreshed every REFRESH_EVERY_S, or after nine times
    as long as the last refresh took: it never takes over a tenth of the run."""
    import mcsync.run.manifest_copy

    monkeypatch.setattr(mcsync.run.manifest_copy, "REFRESH_EVERY_S", 0.01)
    src = MemoryStore("src", endpoint=MemoryEndpoint("a"))
    dst = MemoryStore("dst", endpoint=MemoryEndpoint("b"))
    seed(src, {f"k{i:02d}": b"x" * i for i in range(12)})
    copies: list[Call] = []
    faults = Faults([Rule("get", times=None, delay_s=0.1),  # the run: 12 x 0.1 s, one at a time
                     Rule("put", key=".mcsync/manifest-*", times=None, delay_s=0.05,
                          action=copies.append)])
    report = sync(faulty(src, faults), faulty(dst, faults), tmp_path, concurrency=1)
    assert report.ok and len(contents(dst)) == 12
    # 1.2 s of run: every 0.06 s would be ~20 copies; every 0.45 s (9 x 0.05), 2-3, plus the
    # last one at the end of the run.
    assert 2 <= len(copies) <= 5



def _ops(seen: list[tuple[str, str]]) -> Faults:
    """Every operation on a store, in the order made; the lock's GET slowed, so a request
    that does not wait for the lock is seen before the lock's PUT."""
    return Faults([Rule("get", key=".mcsync/lock-*", times=None, delay_s=0.05),
                   Rule("*", times=None, action=lambda c: seen.append((c.op, c.key)))])


def _first_lock_put(seen: list[tuple[str, str]]) -> int:
    return next(i for i, (op, key) in enumerate(seen)
                if op == "put" and key.startswith(".mcsync/lock-"))


def _pair() -> tuple[MemoryStore, MemoryStore]:
    src = MemoryStore("src", endpoint=MemoryEndpoint("a"))
    dst = MemoryStore("dst", endpoint=MemoryEndpoint("b"))
    seed(src, OBJECTS)
    return src, dst


def test_a_fresh_machine_fetches_the_copy_once_the_lock_is_held_and_trusts_it(tmp_path):
    src, dst = _pair()
    assert sync(src, dst, tmp_path / "first").ok
    key = target_manifest_key(src, dst)
    at_dst: list[tuple[str, str]] = []
    report = sync(src, faulty(dst, _ops(at_dst)), tmp_path / "fresh")
    assert report.ok and report.objects_skipped == len(OBJECTS) and contents(dst) == OBJECTS
    assert at_dst.index(("get", key)) > _first_lock_put(at_dst), "fetched under the lock"
    assert ("head", key) not in at_dst, "a copy just fetched is not looked for again"
    assert not [op for op, _ in at_dst if op == "list"], "the fetched manifest is trusted"
    assert (tmp_path / "fresh" / "manifest.sqlite").exists()


def test_a_run_with_its_manifest_looks_for_the_copy_before_trusting_it(tmp_path):
    src, dst = _pair()
    assert sync(src, dst, tmp_path).ok
    key = target_manifest_key(src, dst)
    at_dst: list[tuple[str, str]] = []
    report = sync(src, faulty(dst, _ops(at_dst)), tmp_path)
    assert report.ok and report.objects_skipped == len(OBJECTS)
    assert at_dst.index(("head", key)) > _first_lock_put(at_dst)
    assert not [op for op, _ in at_dst if op == "list"], "the copy is there: no listing"


def test_a_locked_out_run_installs_no_fetched_copy(tmp_path):
    src, dst = _pair()
    assert sync(src, dst, tmp_path / "first").ok
    held = {"host": "another-host", "pid": 1, "expires_at": time.time() + 600}
    dst.endpoint.objects[dst.prefix + target_lock_key(src, dst)] = MemoryObject(
        json.dumps(held).encode(), "e", dst.endpoint.clock())
    with pytest.raises(Locked):
        sync(src, dst, tmp_path / "fresh")
    assert not (tmp_path / "fresh" / "manifest.sqlite").exists()


@pytest.mark.parametrize("fresh", [True, False])
def test_a_look_at_the_copy_that_fails_is_reported(tmp_path, caplog, fresh):
    """The copy fetched (a fresh machine) or looked for (HEAD) fails: the run says so, and
    lists the target instead."""
    src, dst = _pair()
    assert sync(src, dst, tmp_path / "first").ok
    key = target_manifest_key(src, dst)
    op = "get" if fresh else "head"
    at_dst: list[tuple[str, str]] = []
    faults = Faults([Rule(op, key=key, error=Permanent("refused")), *_ops(at_dst).rules])
    report = sync(src, faulty(dst, faults), tmp_path / ("fresh" if fresh else "first"))
    assert report.ok and report.objects_skipped == len(OBJECTS) and contents(dst) == OBJECTS
    said = ("could not fetch the manifest copy" if fresh
            else "could not look for the manifest's copy")
    assert [r for r in caplog.records if said in r.getMessage() and "refused" in r.getMessage()]
    assert [o for o, _ in at_dst if o == "list"], "the answer was not used: the target is listed"
