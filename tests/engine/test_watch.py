"""--watch on in-process stores: cycles pick up what appears, a failed cycle does not end the
watch, a stop ends it, and the pair stays locked for the whole watch."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from mcsync.config import SyncOptions
from mcsync.errors import Permanent
from mcsync.run.engine import run_sync
from mcsync.run.watching import Cycle, watch
from mcsync.state.lock import Locked
from mcsync.stores.memory import MemoryEndpoint, MemoryStore
from mcsync.testing.faults import Faults, Rule, faulty

from .test_engine import contents, seed


def options(tmp_path: Path) -> SyncOptions:
    return SyncOptions(manifest=str(tmp_path / "m.sqlite"), grace_s=5)


def test_cycles_pick_up_new_objects_until_stopped(tmp_path):
    src = MemoryStore("s", endpoint=MemoryEndpoint("a"))
    dst = MemoryStore("d", endpoint=MemoryEndpoint("b"))
    seed(src, {"step-1/w.bin": b"one"})
    stop = asyncio.Event()
    cycles: list[Cycle] = []

    def seen(cycle: Cycle) -> None:
        cycles.append(cycle)
        if cycle.number == 1:
            seed(src, {"step-2/w.bin": b"two"})  # the trainer writes a new step meanwhile
        if cycle.number == 3:
            stop.set()

    last = asyncio.run(watch(src, dst, options(tmp_path), None, stop, interval_s=0.05,
                             on_cycle=seen))
    assert [c.number for c in cycles] == [1, 2, 3] and last is cycles[-1]
    assert [c.report.objects_copied for c in cycles if c.report] == [1, 1, 0]
    assert contents(dst) == {"step-1/w.bin": b"one", "step-2/w.bin": b"two"}


def test_a_failed_cycle_is_tried_again_and_does_not_end_the_watch(tmp_path):
    src = MemoryStore("s", endpoint=MemoryEndpoint("a"))
    seed(src, {"a.bin": b"a"})
    flaky = faulty(src, Faults([Rule("list", error=Permanent("listing broke (test)"))]))
    dst = MemoryStore("d", endpoint=MemoryEndpoint("b"))
    stop = asyncio.Event()
    cycles: list[Cycle] = []

    def seen(cycle: Cycle) -> None:
        cycles.append(cycle)
        if len(cycles) == 2:
            stop.set()

    asyncio.run(watch(flaky, dst, options(tmp_path), None, stop, interval_s=0.05,
                      on_cycle=seen))
    assert cycles[0].report is None and "listing broke" in (cycles[0].error or "")
    assert cycles[1].report is not None and cycles[1].report.objects_copied == 1
    assert contents(dst) == {"a.bin": b"a"}


def test_the_pair_stays_locked_for_the_whole_watch(tmp_path):
    src = MemoryStore("s", endpoint=MemoryEndpoint("a"))
    dst = MemoryStore("d", endpoint=MemoryEndpoint("b"))
    seed(src, {"a.bin": b"a"})

    async def go() -> None:
        stop = asyncio.Event()
        first = asyncio.Event()
        task = asyncio.create_task(watch(src, dst, options(tmp_path), None, stop,
                                         interval_s=0.05, on_cycle=lambda c: first.set()))
        await first.wait()
        with pytest.raises(Locked):  # between cycles too, a second run is refused
            await run_sync(src, dst, options(tmp_path))
        stop.set()
        await task
        report = await run_sync(src, dst, options(tmp_path))  # free once the watch ended
        assert report.ok and report.objects_skipped == 1

    asyncio.run(go())


def test_later_cycles_ask_the_target_nothing_when_nothing_changed(tmp_path):
    src = MemoryStore("s", endpoint=MemoryEndpoint("a"))
    seed(src, {"a.bin": b"a"})
    counted = Faults([Rule("*", times=None, skip=".mcsync/*")])
    dst = faulty(MemoryStore("d", endpoint=MemoryEndpoint("b")), counted)
    stop = asyncio.Event()
    calls: list[int] = []

    def seen(cycle: Cycle) -> None:
        calls.append(sum(counted.calls.values()))
        if cycle.number == 4:
            stop.set()

    asyncio.run(watch(src, dst, options(tmp_path), None, stop, interval_s=0.02,
                      on_cycle=seen))
    # cycle 1 checks the target and copies; cycles 2-4 found nothing to do and asked nothing
    assert calls[1] == calls[2] == calls[3], calls


def test_a_watch_with_retention_waits_for_the_first_checkpoint_then_prunes(tmp_path):
    import dataclasses
    import json

    src = MemoryStore("s", endpoint=MemoryEndpoint("a"))
    dst = MemoryStore("d", endpoint=MemoryEndpoint("b"))
    seed(src, {"runs/events.out": b"tensorboard"})  # the trainer's logs come first
    stop = asyncio.Event()
    cycles: list[Cycle] = []

    def step(n: int) -> dict[str, bytes]:
        d = f"checkpoint-{n}/"
        return {d + "model.safetensors": b"w%d" % n,
                d + "trainer_state.json": json.dumps({"global_step": n}).encode()}

    def seen(cycle: Cycle) -> None:
        cycles.append(cycle)
        if cycle.number <= 3:
            seed(src, step(cycle.number * 100))
        else:
            stop.set()

    asyncio.run(watch(src, dst, dataclasses.replace(options(tmp_path), keep_last=2), None,
                      stop, interval_s=0.05, on_cycle=seen))
    assert cycles[0].report is None and "no checkpoint directory" in (cycles[0].error or "")
    assert all(c.report is not None for c in cycles[1:])
    assert contents(dst) == {"runs/events.out": b"tensorboard", **step(200), **step(300)}
    assert sum(c.report.checkpoints_pruned for c in cycles if c.report) == 1


def test_a_change_during_a_cycle_or_a_file_coming_of_age_starts_the_next_cycle_early():
    import time

    from mcsync.run.watching import _until_next

    async def waited(wake_set: bool, due: float | None, began_ago: float) -> float:
        wake, stop = asyncio.Event(), asyncio.Event()
        if wake_set:  # the trainer's events arrived while the cycle ran
            wake.set()
        clock = time.monotonic()
        await _until_next(60.0, time.time() - began_ago, wake, stop, due)
        return time.monotonic() - clock

    assert asyncio.run(waited(True, None, began_ago=10)) < 1  # at once, not in 50 s
    soon = asyncio.run(waited(False, time.time() + 0.5, began_ago=10))
    assert 0.4 < soon < 3  # when the deferred file comes of age
    assert asyncio.run(waited(False, None, began_ago=59.5)) < 2  # the interval, as before
