"""--shard I/N on in-process stores: the shards of a Job together write exactly the source,
each key once, each shard reporting only its own keys; each shard's manifest, lock and copy at
the target are its own; --delete deletes only a shard's own keys; a large object and a whole
checkpoint each stay in one shard."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import mcsync
from mcsync.run.engine import target_lock_key
from mcsync.run.manifest_copy import target_manifest_key
from mcsync.state.manifest import default_path
from mcsync.state.shard import shard_of
from mcsync.stores.memory import MemoryEndpoint, MemoryStore
from mcsync.testing.faults import Call, Faults, Rule, faulty

from .test_engine import PART, contents, payload, seed


def state(store: MemoryStore) -> set[str]:
    cut = len(store.prefix)
    return {k[cut:] for k in store.endpoint.objects
            if k.startswith(store.prefix) and k[cut:].startswith(".mcsync/")}


OBJECTS = {
    **{f"data/{i:04}.bin": payload(1 + i % 37, i) for i in range(500)},
    "big/weights.bin": payload(2 * PART + 123, 1),  # moves in parts
    **{f"run/checkpoint-{step}/{name}": payload(50 + step // 100, step)
       for step in (100, 200) for name in ("model-00001-of-00002.safetensors",
                                           "model-00002-of-00002.safetensors",
                                           "model.safetensors.index.json", "config.json",
                                           "trainer_state.json")},
}


class Writes:
    """Every object write the target was asked for, by key (whole PUTs and completed
    uploads)."""

    def __init__(self) -> None:
        self.keys: Counter[str] = Counter()

    def rules(self) -> list[Rule]:
        def record(call: Call) -> None:
            if not call.key.startswith(".mcsync/"):
                self.keys[call.key] += 1

        return [Rule(op, phase="after", times=None, action=record)
                for op in ("put", "complete", "copy_object")]


def run(src: Any, dst: Any, **options: Any) -> mcsync.SyncReport:
    options.setdefault("part_size", PART)
    report: mcsync.SyncReport = asyncio.run(mcsync.async_sync(src, dst, **options))
    return report


@pytest.mark.parametrize("count", [1, 3, 8])
def test_the_shards_together_write_the_source_each_key_once(count: int) -> None:
    src, dst = MemoryStore(), MemoryStore(endpoint=MemoryEndpoint("target"))
    seed(src, OBJECTS)
    writes = Writes()
    target = faulty(dst, Faults(writes.rules()))
    for index in range(count):
        report = run(src, target, shard=(index, count))
        assert report.exit_code == 0, report.failures
        mine = {k for k in OBJECTS if shard_of(k, count) == index}
        assert {o.key for o in report.objects} == mine
        assert report.objects_copied == len(mine)
    assert contents(dst) == OBJECTS
    assert set(writes.keys) == set(OBJECTS) and set(writes.keys.values()) == {1}
    if count == 1:
        assert state(dst) == {target_manifest_key(src, dst)}
    else:
        assert state(dst) == {target_manifest_key(src, dst, (i, count)) for i in range(count)}
    # and again: every shard finds its own keys done, and writes nothing
    for index in range(count):
        again = run(src, target, shard=(index, count))
        assert again.objects_copied == 0
    assert set(writes.keys.values()) == {1}


def test_one_shard_of_one_is_the_run_without_shards() -> None:
    src, dst = MemoryStore(), MemoryStore(endpoint=MemoryEndpoint("target"))
    seed(src, {"a": b"1", "b": b"2"})
    first = run(src, dst, shard=(0, 1))
    assert first.manifest == str(default_path(src.url, dst.url))
    assert state(dst) == {target_manifest_key(src, dst)}
    again = run(src, dst)
    assert again.objects_copied == 0 and again.manifest == first.manifest
    assert target_lock_key(src, dst, (0, 1)) == target_lock_key(src, dst)


def test_each_shard_has_its_own_manifest_and_lock() -> None:
    src, dst = MemoryStore(), MemoryStore(endpoint=MemoryEndpoint("target"))
    for i in range(4):
        path = run(src, dst, shard=(i, 4)).manifest
        assert path == str(default_path(src.url, dst.url, f".shard-{i}-of-4"))
    locks = {target_lock_key(src, dst, (i, 4)) for i in range(4)}
    assert len(locks | {target_lock_key(src, dst)}) == 5


def test_a_replaced_pod_resumes_from_its_shard_s_copy_at_the_target(tmp_path: Path,
                                                                    monkeypatch: Any) -> None:
    """A fresh pod of the same index (empty state directory) fetches its own shard's manifest
    from the target and trusts it: nothing is copied again."""
    src, dst = MemoryStore(), MemoryStore(endpoint=MemoryEndpoint("target"))
    seed(src, OBJECTS)
    for index in range(3):
        run(src, dst, shard=(index, 3))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "fresh-pod"))
    writes = Writes()
    again = run(src, faulty(dst, Faults(writes.rules())), shard=(1, 3))
    assert again.objects_copied == 0 and not writes.keys
    assert again.objects_skipped == sum(1 for k in OBJECTS if shard_of(k, 3) == 1)


def test_delete_removes_only_the_shard_s_own_keys() -> None:
    src, dst = MemoryStore(), MemoryStore(endpoint=MemoryEndpoint("target"))
    keep = {f"keep/{i:03}": b"k" for i in range(60)}
    gone = {f"gone/{i:03}": b"g" for i in range(60)}
    seed(src, keep)
    seed(dst, gone)
    report = run(src, dst, shard=(1, 3), delete=True)
    mine = {k for k in gone if shard_of(k, 3) == 1}
    assert 0 < len(mine) < len(gone)
    assert report.objects_deleted == len(mine)
    left = contents(dst)
    assert set(gone) - set(left) == mine
    assert {k for k in keep if shard_of(k, 3) == 1} <= set(left)
    assert not {k for k in keep if shard_of(k, 3) != 1} & set(left)


def test_a_checkpoint_s_markers_wait_for_its_files_in_the_same_shard() -> None:
    """Every file of checkpoint-100/ is one shard's, so its markers are still written after
    its other files, and held back when one of them fails."""
    src, dst = MemoryStore(), MemoryStore(endpoint=MemoryEndpoint("target"))
    ckpt = {k: v for k, v in OBJECTS.items() if k.startswith("run/checkpoint-100/")}
    seed(src, ckpt)
    (index,) = {shard_of(k, 4) for k in ckpt}
    fail = Rule("put", key="*model-00002-of-00002.safetensors",
                error=mcsync.Permanent("refused"))
    report = run(src, faulty(dst, Faults([fail])), shard=(index, 4))
    assert report.exit_code == 1
    held = {f.key for f in report.failures if "held back" in f.error}
    assert held == {"run/checkpoint-100/model.safetensors.index.json",
                    "run/checkpoint-100/config.json", "run/checkpoint-100/trainer_state.json"}
    assert not set(contents(dst)) & held


def test_status_reads_each_shard_s_state_at_the_target(tmp_path: Path) -> None:
    import json
    import time

    from mcsync.state.status import status

    src, dst = MemoryStore(), MemoryStore(endpoint=MemoryEndpoint("target"))
    objects = {f"k{i:03}": payload(10 + i, i) for i in range(90)}
    seed(src, objects)
    run(src, dst, shard=(0, 4))
    bad = next(k for k in objects if shard_of(k, 4) == 2)
    fail = Rule("put", key=bad, error=mcsync.Permanent("refused"))
    run(src, faulty(dst, Faults([fail])), shard=(2, 4))
    # shard 3: a run holding its lock now, on another machine
    holder = {"host": "pod-3", "pid": 7, "started_at": time.time(),
              "expires_at": time.time() + 600}
    seed(dst, {target_lock_key(src, dst, (3, 4)): json.dumps(holder).encode()})

    rows = asyncio.run(status(MemoryStore(".mcsync/", endpoint=dst.endpoint), tmp_path))
    by_shard = {r.shard: r for r in rows}
    assert sorted(by_shard) == [(0, 4), (1, 4), (2, 4), (3, 4)]
    mine = [k for k in objects if shard_of(k, 4) == 0]
    done = by_shard[(0, 4)]
    assert (done.state, done.objects, done.bytes, done.failed) == (
        "done", len(mine), sum(len(objects[k]) for k in mine), 0)
    assert done.last_success is not None and done.src == src.url
    failed = by_shard[(2, 4)]
    assert (failed.state, failed.failed) == ("failed", 1)
    assert failed.objects == sum(1 for k in objects if shard_of(k, 4) == 2) - 1
    assert failed.last_success is None
    assert by_shard[(1, 4)].state == "not started"
    assert (by_shard[(3, 4)].state, by_shard[(3, 4)].holder) == ("running", "pid 7 on pod-3")
    # an expired lock is a run that died: not running
    holder["expires_at"] = time.time() - 1
    seed(dst, {target_lock_key(src, dst, (3, 4)): json.dumps(holder).encode()})
    rows = asyncio.run(status(MemoryStore(".mcsync/", endpoint=dst.endpoint), tmp_path))
    assert {r.shard: r.state for r in rows}[(3, 4)] == "not started"


def test_a_shards_sweep_clears_its_own_staging_space_only(tmp_path):
    """After a kill, a shard's run sweeps the staging objects its deltas may have left; another
    shard's, in flight beside it, are not its to clear."""
    from mcsync.limits import Limits
    from mcsync.move.context import RunContext
    from mcsync.move.delta_sender import DeltaSender, staging_space

    dst = MemoryStore("ckpt", endpoint=MemoryEndpoint("t"))
    spaces = {shard: staging_space(shard) for shard in (None, (0, 2), (1, 2))}
    assert len(set(spaces.values())) == 3
    assert not any(a != b and b.startswith(a) for a in spaces.values() for b in spaces.values())
    for space in spaces.values():
        seed(dst, {f"{space}0123-1": b"staged"})

    async def sweep(shard: tuple[int, int] | None) -> None:
        options = mcsync.SyncOptions(shard=shard)
        ctx = RunContext(dst, dst, options, Limits(4, options.memory_limit),
                         lambda event: None, asyncio.Event())
        await DeltaSender(ctx).sweep()

    asyncio.run(sweep((0, 2)))
    assert state(dst) == {f"{spaces[None]}0123-1", f"{spaces[1, 2]}0123-1"}
    asyncio.run(sweep(None))
    assert state(dst) == {f"{spaces[1, 2]}0123-1"}
