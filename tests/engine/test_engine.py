"""The engine on in-process stores: whole runs of list → plan → transfer → commit, with no
server, each in milliseconds. Every transfer is checked byte for byte; faults come from
``mcsync.testing.faults``. The same behaviours are tested over HTTP in tests/integration."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import random
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import mcsync
from mcsync.errors import NotFound, Permanent
from mcsync.stores.memory import MemoryEndpoint, MemoryObject, MemoryStore
from mcsync.testing.faults import Call, Faults, Rule, faulty

MiB = 1 << 20
PART = 5 * MiB


def payload(size: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(size)


def seed(store: MemoryStore, objects: dict[str, bytes]) -> None:
    """Write objects straight into the store's endpoint, as another writer would (callable
    from inside a running run, where the store's async put is not)."""
    for key, data in objects.items():
        store.endpoint.objects[store.prefix + key] = MemoryObject(
            data, hashlib.md5(data).hexdigest(), store.endpoint.clock())


def contents(store: MemoryStore) -> dict[str, bytes]:
    """Every object under the store's root, mcsync's own state (.mcsync/) left out."""
    cut = len(store.prefix)
    return {k[cut:]: o.data for k, o in store.endpoint.objects.items()
            if k.startswith(store.prefix) and not k[cut:].startswith(".mcsync/")}


def sync(src: Any, dst: Any, tmp_path: Path, **options: Any) -> mcsync.SyncReport:
    options.setdefault("manifest", str(tmp_path / "manifest.sqlite"))
    report: mcsync.SyncReport = asyncio.run(mcsync.async_sync(src, dst, **options))
    return report


OBJECTS = {
    "ckpt/model-00001-of-00002.safetensors": payload(3 * PART + 17, 1),
    "ckpt/model-00002-of-00002.safetensors": payload(PART + 1, 2),
    "ckpt/model.safetensors.index.json": b'{"weight_map": {}}',
    "ckpt/config.json": b'{"hidden": 64}',
    "data/a-b": b"dash",
    "data/a/b": b"slash",
    "empty": b"",
    **{f"small/{i:03d}.bin": payload(100 + i, 10 + i) for i in range(20)},
}


@pytest.fixture
def pair() -> tuple[MemoryStore, MemoryStore]:
    return MemoryStore("src", endpoint=MemoryEndpoint("a")), MemoryStore(
        "dst", endpoint=MemoryEndpoint("b"))


def test_a_sync_copies_every_object_byte_for_byte_and_a_second_run_skips_them(pair, tmp_path):
    src, dst = pair
    seed(src, OBJECTS)
    first = sync(src, dst, tmp_path, part_size=PART)
    assert first.ok and first.objects_copied == len(OBJECTS)
    assert contents(dst) == OBJECTS
    assert first.bytes_sent == sum(map(len, OBJECTS.values()))

    calls: dict[str, int] = {}

    def count(call: Call) -> None:
        calls[call.op] = calls.get(call.op, 0) + 1

    watched = faulty(dst, Faults([Rule(op, times=None, skip=".mcsync/*", action=count)
                                  for op in ("list", "head", "get", "put", "open_upload")]))
    again = sync(src, watched, tmp_path, part_size=PART)
    assert again.ok and again.objects_skipped == len(OBJECTS) and again.objects_copied == 0
    assert calls == {}, "a run that trusts its manifest asks the target nothing"


def test_checkpoint_markers_are_written_after_every_other_object(pair, tmp_path):
    src, dst = pair
    seed(src, OBJECTS)
    order: list[str] = []
    record = Rule("*", phase="after", times=None, skip=".mcsync/*",
                  action=lambda call: order.append(call.key) if call.op in (
                      "put", "complete") else None)
    report = sync(src, faulty(dst, Faults([record])), tmp_path, part_size=PART)
    assert report.ok and contents(dst) == OBJECTS
    markers = {"ckpt/model.safetensors.index.json", "ckpt/config.json"}
    assert set(order[-2:]) == markers and not markers & set(order[:-2]), order


def test_a_failed_object_holds_back_the_markers_and_the_deletes(pair, tmp_path):
    src, dst = pair
    seed(src, OBJECTS)
    seed(dst, {"stale.bin": b"old"})
    boom = Rule("put_part", key="ckpt/model-00002*", times=None,  # refused: not retried
                error=Permanent("ckpt/model-00002-of-00002.safetensors: refused (test)"))
    report = sync(src, faulty(dst, Faults([boom])), tmp_path, part_size=PART, delete=True,
                  manifest=None, use_manifest=False)
    assert report.exit_code == 1
    failed = dict(report.failures)
    assert "refused (test)" in failed["ckpt/model-00002-of-00002.safetensors"]
    assert "held back" in failed["ckpt/config.json"]
    there = contents(dst)
    assert "ckpt/model-00002-of-00002.safetensors" not in there  # nothing half-written
    assert "ckpt/config.json" not in there and there["stale.bin"] == b"old"  # nothing deleted
    assert not dst.endpoint.uploads, "the failed upload was aborted"
    assert there["ckpt/model-00001-of-00002.safetensors"] == OBJECTS[
        "ckpt/model-00001-of-00002.safetensors"]


def test_delete_removes_only_what_the_source_lacks(pair, tmp_path):
    src, dst = pair
    seed(src, {"keep": b"k", "new": b"n"})
    seed(dst, {"keep": b"k", "gone/1": b"x", "gone/2": b"y"})
    report = sync(src, dst, tmp_path, delete=True)
    assert report.ok and report.objects_deleted == 2
    assert contents(dst) == {"keep": b"k", "new": b"n"}


def test_a_source_changed_mid_copy_is_copied_again_from_its_new_version(pair, tmp_path):
    src, dst = pair
    old, new = payload(2 * PART + 5, 1), payload(2 * PART + 5, 2)
    seed(src, {"big.bin": old})

    def overwrite(_: Call) -> None:
        if src.endpoint.objects[src.prefix + "big.bin"].data == old:
            seed(src, {"big.bin": new})

    reader = faulty(src, Faults([Rule("get", phase="after", action=overwrite)]))
    report = sync(reader, dst, tmp_path, part_size=PART, part_concurrency=1)
    assert report.ok and contents(dst) == {"big.bin": new}


@pytest.mark.parametrize("size", [100, 3 * PART], ids=["whole", "parts"])
def test_an_object_deleted_at_the_source_after_listing_is_reported_not_failed(pair, tmp_path,
                                                                                size):
    """A trainer rotating its checkpoints deletes step-1 while a run copies it: the run ends
    with exit 0, the object reported as deferred with why, nothing of it at the target and no
    upload left open; the other objects copied byte for byte."""
    src, dst = pair
    seed(src, {"ckpt/step-1/a.bin": payload(size, 1), "ckpt/step-2/a.bin": payload(size, 2)})

    def rotate(_: Call) -> None:
        src.endpoint.objects.pop(src.prefix + "ckpt/step-1/a.bin", None)

    reader = faulty(src, Faults([Rule("get", key="ckpt/step-1/*", action=rotate)]))
    report = sync(reader, dst, tmp_path, part_size=PART)
    assert report.ok and report.exit_code == 0 and report.objects_failed == 0
    assert [(k, "deleted at the source" in why) for k, why in report.deferred] == [
        ("ckpt/step-1/a.bin", True)]
    assert contents(dst) == contents(src) == {"ckpt/step-2/a.bin": payload(size, 2)}
    assert not dst.endpoint.uploads


def test_a_target_side_not_found_is_still_a_failure(pair, tmp_path):
    src, dst = pair
    seed(src, {"a.bin": b"a"})
    lost = Rule("put", key="a.bin", times=None, error=NotFound("a.bin: no such upload (test)"))
    report = sync(src, faulty(dst, Faults([lost])), tmp_path)
    assert report.exit_code == 1 and dict(report.failures)["a.bin"].endswith("(test)")
    assert not report.deferred


def test_a_stopped_run_resumes_its_upload_sending_only_the_missing_parts(pair, tmp_path):
    src, dst = pair
    big = payload(6 * PART, 3)
    seed(src, {"big.bin": big})
    stop = asyncio.Event()
    stopper = Rule("put_part", phase="after", nth=2, action=lambda _: stop.set())

    async def first_run() -> mcsync.SyncReport:
        from mcsync.config import SyncOptions
        from mcsync.run.engine import run_sync

        options = SyncOptions(part_size=PART, part_concurrency=1, grace_s=5,
                              manifest=str(tmp_path / "manifest.sqlite"))
        return await run_sync(src, faulty(dst, Faults([stopper])), options, stop=stop)

    stopped = asyncio.run(first_run())
    assert stopped.interrupted and stopped.exit_code == 130
    assert "big.bin" not in contents(dst) and len(dst.endpoint.uploads) == 1
    resumed = sync(src, dst, tmp_path, part_size=PART, part_concurrency=1)
    assert resumed.ok and contents(dst) == {"big.bin": big}
    assert resumed.bytes_sent == 4 * PART, "the two parts sent before the stop are kept"
    assert not dst.endpoint.uploads


def test_a_changed_block_goes_as_a_delta_composed_at_the_target(pair, tmp_path):
    src, dst = pair
    old = payload(8 * PART, 4)
    seed(src, {"opt.bin": old})
    assert sync(src, dst, tmp_path, part_size=PART).ok
    new = bytearray(old)
    new[3 * PART + 10:3 * PART + 20] = b"0123456789"  # ten bytes of the fourth block
    seed(src, {"opt.bin": bytes(new)})
    report = sync(src, dst, tmp_path, part_size=PART)
    assert report.ok and contents(dst) == {"opt.bin": bytes(new)}
    assert report.bytes_changed == PART and report.bytes_sent == PART
    assert report.bytes_reused == 7 * PART
    assert not [k for k in dst.endpoint.objects if "/.mcsync/stage/" in k]


def test_one_endpoint_copies_server_side(tmp_path):
    shared = MemoryEndpoint("one")
    src, dst = MemoryStore("a", endpoint=shared), MemoryStore("b", endpoint=shared)
    seed(src, {"x": payload(PART + 3, 5), "y": b"y"})
    report = sync(src, dst, tmp_path)
    assert report.ok and report.objects_server_copied == 2 and report.bytes_sent == 0
    assert contents(dst) == contents(src)


def test_a_store_without_a_write_side_is_refused_as_a_target(pair, tmp_path):
    src, _ = pair

    class ReadOnly:
        def __init__(self, inner: MemoryStore) -> None:
            self.url, self.facts, self._inner = "ro://x/", inner.facts, inner
            self.list, self.head, self.get = inner.list, inner.head, inner.get

        async def check(self, *, mode: str) -> None:
            pass

        async def aclose(self) -> None:
            pass

    with pytest.raises(mcsync.UsageError, match="a source only"):
        sync(src, ReadOnly(src), tmp_path)


class MeetingCheck(MemoryStore):
    """A store whose check() waits until the other side's check() has started too: two
    checks made one after the other never meet, and time out."""

    def __init__(self, name: str, started: dict[str, asyncio.Event], fail: bool = False) -> None:
        super().__init__(name)
        self.name, self.started, self.fail = name, started, fail

    async def check(self, *, mode: str) -> None:
        self.started[self.name].set()
        other = next(e for n, e in self.started.items() if n != self.name)
        await asyncio.wait_for(other.wait(), timeout=5)
        if self.fail:
            raise mcsync.ConfigError(f"{self.url}: {self.name} refused")
        await super().check(mode=mode)


def test_two_remote_sides_are_checked_at_once(tmp_path):
    # Over a WAN each check is a round trip or two before anything else can start.
    started = {"src": asyncio.Event(), "dst": asyncio.Event()}
    src, dst = MeetingCheck("src", started), MeetingCheck("dst", started)
    seed(src, {"a": b"alpha"})
    report = sync(src, dst, tmp_path)
    assert report.exit_code == 0 and contents(dst) == {"a": b"alpha"}


class CheckAwaitsLockRead(MemoryStore):
    """A target whose check() returns only once the lock object is being read (or fails, as
    told): a lock read made after the check would never come, and the check times out."""

    def __init__(self, name: str, fail: bool = False) -> None:
        super().__init__(name)
        self.lock_read, self.fail = asyncio.Event(), fail

    async def get(self, key: str, *args: Any, **kwargs: Any) -> Any:
        if key.startswith(".mcsync/lock-"):
            self.lock_read.set()
        return await super().get(key, *args, **kwargs)

    async def check(self, *, mode: str) -> None:
        await asyncio.wait_for(self.lock_read.wait(), timeout=5)
        if self.fail:
            raise mcsync.ConfigError(f"{self.url}: refused")
        await super().check(mode=mode)


def test_the_lock_object_is_read_while_the_target_is_checked(tmp_path):
    src, dst = MemoryStore("src"), CheckAwaitsLockRead("dst")
    seed(src, OBJECTS)
    assert sync(src, dst, tmp_path).ok and contents(dst) == OBJECTS


def test_nothing_is_written_before_the_checks_pass(tmp_path):
    src, dst = MemoryStore("src"), CheckAwaitsLockRead("dst", fail=True)
    seed(src, OBJECTS)
    with pytest.raises(mcsync.ConfigError, match="refused"):
        sync(src, dst, tmp_path)
    assert dst.endpoint.objects == {}, "no lock object, no copy, nothing"


def test_a_wiped_target_costs_no_extra_reads_of_the_source(tmp_path):
    # Its manifest kept, a target emptied since: the chunk index names objects that are gone,
    # so no new object's chunks are sampled (read) to look for them there before it is sent.
    src = MemoryStore("src", endpoint=MemoryEndpoint("a"))
    dst = MemoryStore("dst", endpoint=MemoryEndpoint("b"))
    big = {f"shard-{i}.bin": payload(2 * PART + 3, 10 + i) for i in range(3)}
    seed(src, big)

    def reads(state: Path) -> Counter[str]:
        made: Counter[str] = Counter()
        faults = Faults([Rule("*", times=None, action=lambda c: made.update([c.op]))])
        report = sync(faulty(src, faults), dst, state, part_size=PART)
        assert report.ok and contents(dst) == big
        return Counter({op: n for op, n in made.items() if op in ("get", "open_range",
                                                                   "read_into")})

    fresh = reads(tmp_path / "kept")
    assert sum(fresh.values()) >= len(big)
    dst.endpoint.objects.clear()  # wiped, .mcsync/ and all; the local manifest is kept
    assert reads(tmp_path / "kept") == fresh


def test_a_holder_deleted_behind_mcsyncs_back_costs_no_read_of_the_whole_object(tmp_path):
    # The index names step-1's shard, which a retention rule deleted at the target: step-2's
    # shard (the same bytes) has its chunks sampled, then goes whole, read once, not also
    # scanned whole to be matched against a holder that is gone.
    src, dst = (MemoryStore("src", endpoint=MemoryEndpoint("a")),
                MemoryStore("dst", endpoint=MemoryEndpoint("b")))
    shard = payload(2 * PART + 3, 21)
    step2 = "run/step-2/shard.bin"

    def reads_of_step2(state: Path) -> int:
        made: list[str] = []
        rule = Rule("*", key=step2, times=None, action=lambda c: made.append(c.op))
        report = sync(faulty(src, Faults([rule])), dst, state, part_size=PART)
        assert report.ok and contents(dst) == contents(src)
        return sum(op in ("get", "open_range", "read_into") for op in made)

    seed(src, {step2: shard})
    fresh = reads_of_step2(tmp_path / "fresh")  # no index: sent whole
    dst.endpoint.objects.clear()
    src.endpoint.objects.clear()
    seed(src, {"run/step-1/shard.bin": shard})
    assert sync(src, dst, tmp_path / "kept", part_size=PART).ok
    dst.endpoint.objects.pop(dst.prefix + "run/step-1/shard.bin")  # the retention rule
    src.endpoint.objects.clear()
    seed(src, {step2: shard})
    assert reads_of_step2(tmp_path / "kept") <= fresh + 2  # the two sampled chunks, no more


def test_the_source_is_listed_while_the_lock_is_taken(tmp_path):
    src, dst = MemoryStore("src"), MemoryStore("dst")
    seed(src, OBJECTS)
    seen: list[tuple[str, str]] = []
    record = Rule("*", times=None, action=lambda c: seen.append((c.op, c.key)))
    slow_lock = Rule("get", key=".mcsync/lock-*", times=None, delay_s=0.05)
    report = sync(faulty(src, Faults([record])), faulty(dst, Faults([slow_lock, record])),
                  tmp_path)
    assert report.ok and contents(dst) == OBJECTS
    first_listed = next(i for i, (op, _) in enumerate(seen) if op == "list")
    lock_put = seen.index(next(c for c in seen if c[0] == "put" and "lock-" in c[1]))
    assert first_listed < lock_put


@pytest.mark.parametrize("failing", [("src", "dst"), ("dst",)], ids=["both", "target"])
def test_checks_at_once_tell_the_source_failure_first(tmp_path, failing):
    started = {"src": asyncio.Event(), "dst": asyncio.Event()}
    src = MeetingCheck("src", started, fail="src" in failing)
    dst = MeetingCheck("dst", started, fail="dst" in failing)
    with pytest.raises(mcsync.ConfigError, match=f"{failing[0]} refused"):
        sync(src, dst, tmp_path)
    assert contents(dst) == {}


@pytest.mark.parametrize("make_src", [lambda: MemoryStore("s")], ids=["memory"])
def test_an_unsafe_key_fails_that_object_only(make_src: Callable[[], MemoryStore], tmp_path):
    src = make_src()
    seed(src, {"ok": b"fine", "../escape": b"bad"})
    report = sync(src, str(tmp_path / "target"), tmp_path)
    assert report.exit_code == 1
    assert [k for k, _ in report.failures] == ["../escape"]
    assert (tmp_path / "target" / "ok").read_bytes() == b"fine"
    assert not (tmp_path / "escape").exists()


def test_a_target_emptied_behind_mcsyncs_back_is_listed_and_filled_again(pair, tmp_path):
    src, dst = pair
    seed(src, {"a": b"a", "big.bin": payload(PART + 9, 6)})
    assert sync(src, dst, tmp_path, part_size=PART).objects_copied == 2
    dst.endpoint.objects.clear()  # the prefix wiped, mcsync's copy of the manifest with it
    again = sync(src, dst, tmp_path, part_size=PART)
    assert again.ok and again.objects_copied == 2 and again.objects_skipped == 0
    assert contents(dst) == contents(src)
    third = sync(src, dst, tmp_path, part_size=PART)  # and the manifest is trusted again
    assert third.objects_skipped == 2


def test_a_new_step_directory_is_composed_from_the_previous_one(pair, tmp_path):
    src, dst = pair
    step1 = payload(8 * PART, 7)
    seed(src, {"run/step-1/model.bin": step1})
    assert sync(src, dst, tmp_path, part_size=PART).ok
    step2 = bytearray(step1)
    step2[5 * PART:5 * PART + 100] = payload(100, 8)  # one block of eight changed
    seed(src, {"run/step-2/model.bin": bytes(step2)})
    report = sync(src, dst, tmp_path, part_size=PART)
    assert report.ok and contents(dst) == contents(src)
    assert report.bytes_sent == PART and report.bytes_reused == 7 * PART
    assert report.bytes_reused_cross_object == 7 * PART and report.bytes_reused_same_key == 0
    (result,) = [r for r in report.objects if r.key == "run/step-2/model.bin"]
    assert result.reused_from == (("run/step-1/model.bin", 7 * PART),)


def test_a_renamed_object_is_copied_at_the_target_not_sent(pair, tmp_path):
    src, dst = pair
    data = payload(6 * PART + 3, 9)
    seed(src, {"old-name.bin": data})
    assert sync(src, dst, tmp_path, part_size=PART).ok
    del src.endpoint.objects[src.prefix + "old-name.bin"]
    seed(src, {"new-name.bin": data})
    report = sync(src, dst, tmp_path, part_size=PART, delete=True)
    assert report.ok and contents(dst) == {"new-name.bin": data}
    assert report.bytes_sent == 0 and report.bytes_reused_cross_object == len(data)
    assert report.objects_deleted == 1  # the base may go once the copy is complete


def test_a_base_changed_behind_mcsyncs_back_is_not_composed_from(pair, tmp_path):
    src, dst = pair
    step1 = payload(4 * PART, 10)
    seed(src, {"a/step-1/w.bin": step1})
    assert sync(src, dst, tmp_path, part_size=PART).ok
    seed(dst, {"a/step-1/w.bin": payload(4 * PART, 11)})  # overwritten at the target
    seed(src, {"a/step-2/w.bin": step1})
    report = sync(src, dst, tmp_path, part_size=PART)
    assert report.ok and contents(dst)["a/step-2/w.bin"] == step1
    assert report.bytes_sent == 4 * PART and report.bytes_reused == 0


def test_scope_key_and_no_delta_send_a_new_object_whole(pair, tmp_path):
    src, dst = pair
    data = payload(4 * PART, 12)
    seed(src, {"x/1/w.bin": data})
    assert sync(src, dst, tmp_path, part_size=PART).ok
    seed(src, {"x/2/w.bin": data, "x/3/w.bin": data})
    report = sync(src, dst, tmp_path, part_size=PART, delta_scope="key")
    assert report.bytes_reused == 0 and report.bytes_sent == 8 * PART
    seed(src, {"x/4/w.bin": data})
    report = sync(src, dst, tmp_path, part_size=PART, delta=False)
    assert report.bytes_reused == 0 and report.bytes_sent == 4 * PART
    assert contents(dst) == contents(src)


def test_scope_prefix_stays_within_the_run(pair, tmp_path):
    src, dst = pair
    data = payload(4 * PART, 13)
    seed(src, {"run-a/1/w.bin": data})
    assert sync(src, dst, tmp_path, part_size=PART).ok
    seed(src, {"run-b/1/w.bin": data, "run-a/2/w.bin": data})
    report = sync(src, dst, tmp_path, part_size=PART, delta_scope="prefix")
    by_key = {r.key: r for r in report.objects}
    assert by_key["run-a/2/w.bin"].bytes_sent == 0
    assert by_key["run-b/1/w.bin"].bytes_sent == 4 * PART
    assert contents(dst) == contents(src)


def test_workers_with_store_objects_are_refused_in_one_line(pair, tmp_path):
    """A worker process opens its own stores from addresses: a store object cannot go to it."""
    src, dst = pair
    seed(src, {"a": b"a"})
    with pytest.raises(mcsync.UsageError) as refused:
        sync(src, dst, tmp_path, workers=2)
    assert "\n" not in str(refused.value) and "addresses" in str(refused.value)
    assert contents(dst) == {}


def in_process_pool(src, dst, ran: list[list[Any]], before: Callable[[list[Any]], None]):
    """The executor seam in one process: a pool whose tasks run as a worker's do (a
    whole-objects-only dispatch and a ``WorkerParts`` on the same stores), behind the real
    ``Workers``; ``ran`` gets each task's items."""
    from mcsync.limits import Limits
    from mcsync.move.context import RunContext
    from mcsync.move.dispatch import Dispatch
    from mcsync.move.hash_tasks import WorkerHashes
    from mcsync.move.part_tasks import WorkerParts
    from mcsync.scale.worker_runner import TaskResult, run_items

    class InProcessPool:
        size = 2

        def __init__(self, options):
            limits = Limits(4, options.memory_limit)
            ctx = RunContext(src, dst, options, limits, lambda event: None, asyncio.Event())
            self.dispatch = Dispatch(ctx, journal=None, known=None, open_uploads={},
                                     whole_only=True)
            self.parts = WorkerParts(src, dst, limits)
            self.hashes = WorkerHashes(src, limits)

        def describe(self) -> str:
            return "in this process"

        async def run(self, items, *, deadline_s=None) -> TaskResult:
            before(items)
            ran.append(list(items))
            return TaskResult(await run_items(self.dispatch, self.parts, self.hashes, items),
                              [], 0, 0, 0)

        async def aclose(self, *, wait: bool) -> None:
            pass

    return InProcessPool


def run_with_pool(monkeypatch, pool, src, dst, manifest: Path,
                  **options: Any) -> mcsync.SyncReport:
    from mcsync.run import engine
    from mcsync.scale.worker_runner import Addresses

    monkeypatch.setattr(engine, "open_pool", lambda addresses, options: pool(options))
    here = Addresses("src", "dst", mcsync.StoreOptions(), mcsync.StoreOptions())

    async def go() -> mcsync.SyncReport:
        opts = mcsync.SyncOptions(part_size=PART, workers=2, manifest=str(manifest), **options)
        return await engine.run_sync(src, dst, opts, addresses=here)

    return asyncio.run(go())


def test_the_driver_commits_what_workers_return_and_moves_what_they_hand_back(
        pair, tmp_path, monkeypatch):
    """An object that grew past one request after it was listed comes back handed back; the
    driver opens and journals its upload and its parts go to the pool as part tasks. Every
    object is recorded, so a second run moves nothing."""
    from mcsync.move.part_tasks import PartJob
    from mcsync.records import Action

    src, dst = pair
    seed(src, {**{f"small/{i:02d}": payload(100 + i, i) for i in range(30)}, "grows": b"x"})
    grown = payload(2 * PART + 3, 99)
    ran: list[list[Any]] = []

    def rewrite(items) -> None:
        if any(getattr(a, "kind", "") == "copy" and a.key == "grows" for a in items):
            seed(src, {"grows": grown})  # rewritten after it was listed

    pool = in_process_pool(src, dst, ran, rewrite)
    report = run_with_pool(monkeypatch, pool, src, dst, tmp_path / "manifest.sqlite")
    assert report.ok and report.tasks == len(ran) >= 1, report.failures
    whole = [a.key for task in ran for a in task if isinstance(a, Action)]
    assert sorted(whole) == sorted(contents(src))
    parts = [j for task in ran for j in task if isinstance(j, PartJob)]
    assert sorted(j.part.number for j in parts) == [1, 2, 3]
    assert {j.key for j in parts} == {"grows"} and len({j.upload_id for j in parts}) == 1
    assert contents(dst) == contents(src) and contents(dst)["grows"] == grown
    assert report.objects_copied == 31
    ran.clear()
    again = run_with_pool(monkeypatch, pool, src, dst, tmp_path / "manifest.sqlite")
    assert again.objects_copied == 0 and again.tasks == 0
    # The manifest holds the tasks of the last run with workers (for `mcsync status`).
    from mcsync.state.status import summary

    recorded = summary(tmp_path / "manifest.sqlite")
    assert recorded["tasks_run"] == (1, "ok")
    (worker,) = recorded["tasks"]  # a pool that does not say who ran its tasks: ""
    assert (worker.worker, worker.tasks, worker.retried, worker.failed, worker.objects) == (
        "", report.tasks, 0, 0, 31)
    assert worker.slowest is not None and worker.slowest.startswith("task ")


def records(manifest: Path) -> dict[str, tuple]:
    import sqlite3

    with contextlib.closing(sqlite3.connect(manifest)) as db:
        return {row[0]: row[1:] for row in db.execute(
            "SELECT key, block_size, block_hashes, chunk_sizes, chunker, xxh3, dst_size "
            "FROM objects")}


@pytest.mark.parametrize("chunker", ["fixed", "cdc"])
def test_parts_sent_by_workers_are_recorded_as_one_process_records_them(
        pair, tmp_path, monkeypatch, chunker):
    """Large objects split across the pool by parts (2 workers: each object's parts in two
    tasks or more), the records' block hashes exactly those of a run without workers
    (with a content-defined cut, the workers' reads checked against the driver's cut)."""
    from mcsync.move.part_tasks import PartJob

    src, dst = pair
    big = {"big/a.bin": payload(3 * PART - 5, 7), "big/b.bin": payload(2 * PART + 9, 8)}
    seed(src, big | {"small.bin": b"small"})
    ran: list[list[Any]] = []
    pool = in_process_pool(src, dst, ran, lambda items: None)
    report = run_with_pool(monkeypatch, pool, src, dst, tmp_path / "w.sqlite", chunker=chunker)
    assert report.ok and contents(dst) == contents(src), report.failures
    part_tasks = [t for t in ran if isinstance(t[0], PartJob)]
    sent = sorted((j.key, j.part.number) for t in part_tasks for j in t)
    assert len(sent) == len(set(sent)) and {k for k, _ in sent} == set(big)
    if chunker == "fixed":
        assert sent == sorted((k, n) for k, d in big.items()
                              for n in range(1, -(-len(d) // PART) + 1))
    # 2 workers: each object's parts in tasks of at most half of them, so both take some.
    for key in big:
        tasks = [t for t in part_tasks if t[0].key == key]
        assert len(tasks) >= 2 and all(len(t) <= -(-sum(map(len, tasks)) // 2) for t in tasks)

    alone = MemoryStore("dst", endpoint=MemoryEndpoint("c"))
    single = sync(src, alone, tmp_path, manifest=str(tmp_path / "one.sqlite"), part_size=PART,
                  chunker=chunker)
    assert single.ok and single.tasks == 0
    mine, theirs = records(tmp_path / "w.sqlite"), records(tmp_path / "one.sqlite")
    assert mine == theirs and set(mine) >= set(big)
    assert all(len(mine[k][1]) > 16 for k in big)  # several block hashes each
