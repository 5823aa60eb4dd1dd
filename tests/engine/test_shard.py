"""--shard I/N on in-process stores: the shards of a Job together write exactly the source,
each key once, each shard reporting only its own keys and the markers it wrote; each shard's
manifest, lock and copy at the target are its own; --delete deletes only a shard's own keys; a
large object stays in one shard; a checkpoint's markers are written by the shard that finishes
its files last, never before."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import mcsync
from mcsync.checkpoints.frameworks import is_commit_marker
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


MARKERS = {k for k in OBJECTS if is_commit_marker(k)}


def writer(marker: str, count: int) -> int:
    """The shard whose file of the marker's checkpoint comes last in shard order."""
    directory = marker.rpartition("/")[0] + "/"
    return max(shard_of(k, count) for k in OBJECTS
               if k.startswith(directory) and not is_commit_marker(k))


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
        mine = {k for k in OBJECTS if shard_of(k, count) == index and not is_commit_marker(k)}
        # run one after another, a checkpoint's markers are written by the shard of its last
        # file, and deferred by the shards before it
        written = {m for m in MARKERS if writer(m, count) == index}
        assert {o.key for o in report.objects} == mine | written
        assert report.objects_copied == len(mine | written)
        assert {k for k, _ in report.deferred} == {m for m in MARKERS
                                                   if writer(m, count) > index}
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
    # its own keys, and every marker, which every shard plans (found at the target)
    assert again.objects_skipped == sum(1 for k in OBJECTS
                                        if shard_of(k, 3) == 1 or is_commit_marker(k))


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


def test_a_checkpoint_s_markers_wait_for_every_shard_s_files() -> None:
    """checkpoint-100/'s files are spread over the shards: its markers are held back by the
    shard whose copy failed, deferred by every other shard, and written once that shard's
    rerun brings the missing file."""
    src, dst = MemoryStore(), MemoryStore(endpoint=MemoryEndpoint("target"))
    ckpt = {k: v for k, v in OBJECTS.items() if k.startswith("run/checkpoint-100/")}
    seed(src, ckpt)
    bad = "run/checkpoint-100/model-00002-of-00002.safetensors"
    fail = Rule("put", key=bad, error=mcsync.Permanent("refused"))
    count = 4
    assert len({shard_of(k, count) for k in ckpt if not is_commit_marker(k)}) > 1
    markers = {k for k in ckpt if is_commit_marker(k)}
    for index in range(count):
        report = run(src, faulty(dst, Faults([fail])), shard=(index, count))
        if index == shard_of(bad, count):
            assert report.exit_code == 1
            assert {f.key for f in report.failures if "held back" in f.error} == markers
        else:
            assert report.exit_code == 0, report.failures
            assert {k for k, why in report.deferred if "not at the target yet" in why} == markers
        assert not set(contents(dst)) & markers
    again = run(src, dst, shard=(shard_of(bad, count), count))
    assert again.exit_code == 0
    assert {o.key for o in again.objects} == {bad} | markers
    assert contents(dst) == ckpt


def test_a_root_marker_waits_for_the_markers_inside_the_checkpoint() -> None:
    """DeepSpeed's latest names global_step100/, whose own marker (an index) is in its scope:
    the deepest markers go first, and the shard finishing last writes both, in that order."""
    src, dst = MemoryStore(), MemoryStore(endpoint=MemoryEndpoint("target"))
    ckpt = {**{f"ds/global_step100/zero_pp_rank_{i}_mp_rank_00_optim_states.pt":
               payload(40 + i, i) for i in range(12)},
            "ds/global_step100/model.safetensors.index.json": b"{}",
            "ds/latest": b"global_step100", "ds/zero_to_fp32.py": b"# script"}
    seed(src, ckpt)
    order: list[str] = []
    note = [Rule("put", phase="after", times=None, key=k, action=lambda c: order.append(c.key))
            for k in ("ds/latest", "ds/global_step100/model.safetensors.index.json")]
    for index in range(3):
        report = run(src, faulty(dst, Faults(note)), shard=(index, 3))
        assert report.exit_code == 0, report.failures
        if index < 2:
            assert "ds/latest" not in contents(dst)
    assert order == ["ds/global_step100/model.safetensors.index.json", "ds/latest"]
    assert contents(dst) == ckpt


def test_a_marker_changed_at_the_source_since_it_was_listed_waits(monkeypatch: Any) -> None:
    """The marker's scope is read again at the end; a marker whose text changed since the
    shard listed it (a newer checkpoint named) is left to the next run."""
    from mcsync.run import markers as cross

    src, dst = MemoryStore(), MemoryStore(endpoint=MemoryEndpoint("target"))
    ckpt = {"ds/global_step100/a.pt": b"a" * 10, "ds/latest": b"global_step100"}
    seed(src, ckpt)
    survey = cross.survey

    async def later(driver: Any, directories: set[str]) -> Any:
        seed(src, {"ds/latest": b"global_step101"})  # same size: told apart by its ETag
        return await survey(driver, directories)

    monkeypatch.setattr(cross, "survey", later)
    report = run(src, dst, shard=(0, 2))
    report = run(src, dst, shard=(1, 2))
    assert ("ds/latest", "changed at the source since it was listed: the next run takes it"
            ) in report.deferred
    assert "ds/latest" not in contents(dst)


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


def test_latest_checkpoint_s_shards_write_its_marker_over_the_chosen_checkpoint() -> None:
    """--latest-checkpoint lists the chosen checkpoint alone: the older one beside it, not
    copied, does not keep latest waiting."""
    src, dst = MemoryStore(), MemoryStore(endpoint=MemoryEndpoint("target"))
    older = {f"global_step50/rank_{i}.pt": payload(30, i) for i in range(6)}
    chosen = {f"global_step100/rank_{i}.pt": payload(30, 100 + i) for i in range(6)}
    seed(src, {**older, **chosen, "latest": b"global_step100"})
    for index in range(2):
        report = run(src, dst, shard=(index, 2), latest_checkpoint=True)
        assert report.exit_code == 0, report.failures
    assert contents(dst) == {**chosen, "latest": b"global_step100"}


@pytest.mark.parametrize("case", ["newer checkpoint being written", "excluded files"])
def test_what_no_shard_copies_does_not_keep_a_marker_waiting(case: str) -> None:
    """latest's scope is what a run would copy: not a newer step still being written (latest
    does not name it yet: every shard defers it), not files left out by --exclude."""
    src, dst = MemoryStore(), MemoryStore(endpoint=MemoryEndpoint("target"))
    done = {f"ds/global_step100/rank_{i}.pt": payload(30, i) for i in range(8)}
    left = ({f"ds/global_step200/rank_{i}.pt": payload(30, 200 + i) for i in range(3)}
            if case.startswith("newer") else
            {f"ds/global_step100/rank_{i}.tmp": payload(30, 300 + i) for i in range(3)})
    seed(src, {**done, **left, "ds/latest": b"global_step100"})
    options = {} if case.startswith("newer") else {"exclude": ["*.tmp"]}
    for index in range(3):
        report = run(src, dst, shard=(index, 3), **options)
        assert report.exit_code == 0, report.failures
    assert contents(dst) == {**done, "ds/latest": b"global_step100"}


def named_complete(dst: MemoryStore, steps: dict[str, set[str]]) -> bool:
    """Does the target's latest name a step whose files are all there?"""
    have = contents(dst)
    named = have.get("ds/latest")
    return named is None or steps[named.decode()] <= set(have)


def test_deletes_under_a_waiting_marker_wait_for_it() -> None:
    """The source moved on (latest names step 100, step 50 pruned). A shard that must leave
    latest to another shard does not delete step 50's files, which the target's latest still
    names; the shard that writes latest deletes its own after it; a later run the rest."""
    src, dst = MemoryStore(), MemoryStore(endpoint=MemoryEndpoint("target"))
    old = {f"ds/global_step50/rank_{i}.pt": payload(30, i) for i in range(8)}
    new = {f"ds/global_step100/rank_{i}.pt": payload(30, 100 + i) for i in range(8)}
    seed(dst, {**old, "ds/latest": b"global_step50"})
    seed(src, {**new, "ds/latest": b"global_step100"})
    steps = {"global_step50": set(old), "global_step100": set(new)}
    for _ in range(2):  # the Job, and the next one
        for index in range(3):
            report = run(src, dst, shard=(index, 3), delete=True)
            assert report.exit_code == 0, report.failures
            assert named_complete(dst, steps)
    assert contents(dst) == {**new, "ds/latest": b"global_step100"}


@pytest.mark.parametrize("shard", [None, (0, 2)])
def test_a_marker_is_deleted_before_the_files_it_names(shard: tuple[int, int] | None) -> None:
    src, dst = MemoryStore(), MemoryStore(endpoint=MemoryEndpoint("target"))
    gone = {f"run/checkpoint-50/model-0000{i}-of-00008.safetensors": payload(30, i)
            for i in range(8)}
    seed(dst, {**gone, "run/checkpoint-50/trainer_state.json": b"{}"})
    seed(src, {"run/other.bin": b"x"})
    order: list[str] = []
    note = Rule("delete", phase="after", times=None, action=lambda c: order.append(c.key))
    report = run(src, faulty(dst, Faults([note])), shard=shard, delete=True)
    assert report.exit_code == 0, report.failures
    assert order[0] == "run/checkpoint-50/trainer_state.json" and len(order) > 1


def test_a_target_that_cannot_list_a_level_is_listed_once_for_every_marker() -> None:
    """Markers in many directories: a target that lists only as a whole (no levels) is listed
    once per depth of markers at the end of a shard, not once per directory."""
    from mcsync.stores.base import LevelLister
    from mcsync.stores.wrap import PassThrough, wrap

    class Count(PassThrough):
        lists = 0

        def listing(self, entries: Any) -> Any:
            Count.lists += 1
            return entries

    src, dst = MemoryStore(), MemoryStore(endpoint=MemoryEndpoint("target"))
    ckpts = {f"run/checkpoint-{s}/{n}": payload(20, s + i) for s in range(100, 600, 100)
             for i, n in enumerate(("model.safetensors", "optimizer.pt", "config.json",
                                    "trainer_state.json"))}
    seed(src, ckpts)
    target = wrap(dst, Count(), without=(LevelLister,))
    assert not isinstance(target, LevelLister)
    for index in range(2):
        Count.lists = 0
        report = run(src, target, shard=(index, 2))
        assert report.exit_code == 0, report.failures
        assert Count.lists == 2  # the run's listing, and the markers' (one depth)
    assert contents(dst) == ckpts


@pytest.mark.parametrize("shard", [None, (0, 1), "each of 2"])
def test_a_marker_changed_while_the_run_copied_its_checkpoint_is_left_to_the_next_run(
        shard: Any) -> None:
    """The trainer writes step 200 and points latest at it while the run copies step 100:
    latest's new version names files this run never listed, so it is not taken (a copy of
    any other object takes the new version); the next run copies step 200, then latest."""
    src, dst = MemoryStore(), MemoryStore(endpoint=MemoryEndpoint("target"))
    step100 = {f"ds/global_step100/rank_{i}.pt": payload(30, i) for i in range(6)}
    step200 = {f"ds/global_step200/rank_{i}.pt": payload(30, 200 + i) for i in range(6)}
    seed(src, {**step100, "ds/latest": b"global_step100"})

    def trainer_moves_on(_: Call) -> None:
        seed(src, {**step200, "ds/latest": b"global_step200"})

    moved = Rule("put", key="ds/global_step100/*", phase="after", action=trainer_moves_on)
    shards = [(0, 2), (1, 2)] if shard == "each of 2" else [shard]
    for one in shards:
        report = run(src, faulty(dst, Faults([moved])), shard=one)
        assert report.exit_code == 0, report.failures
        have = contents(dst)
        assert have.get("ds/latest", b"global_step100") == b"global_step100"
    assert "ds/latest" in {k for k, _ in report.deferred}
    for one in shards:
        assert run(src, dst, shard=one).exit_code == 0
    assert contents(dst) == {**step100, **step200, "ds/latest": b"global_step200"}
