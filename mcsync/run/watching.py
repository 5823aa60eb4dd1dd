"""``--watch``: keep a target current while training runs.

Incremental cycles until stopped, under one lock for the whole watch. Each cycle is an
ordinary run — manifest, delta, resume, checkpoint completion — with ``--min-age`` keeping
files still being written for a later cycle; a cycle with nothing to do costs a listing of
the source and nothing at the target (the stores are checked, and the manifest's copy at the
target looked for, on the first cycle and every ``COPY_CHECK_EVERY`` cycles only). A failed
cycle is logged and tried again at the next interval; it never ends the watch. For a local or
mounted source, file-system events (``watchfiles``: inotify) start a cycle early, debounced,
and events during a cycle start another right after it; a cycle that deferred files for their
age (``--min-age``; a checkpoint whose completion marker vouches for it does not wait) starts
the next when the first of them comes of age. The interval is the fallback, and the pace for
object-store sources.
A stop (SIGTERM, SIGINT) lets the cycle in flight finish or checkpoint within ``--grace`` and
ends the watch normally.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from ..config import SyncOptions
from ..errors import MCSyncError, UsageError
from ..events import EventSink
from ..report import SyncReport
from ..state.lock import Locked
from ..state.manifest import Manifest
from ..stores.base import LocalTree, ReadStore
from ..stores.local_files import on_this_machine
from ..stores.resilience import Pacing, pacing_of, resilient
from ..tasks import cancel_and_wait
from .engine import ManifestFactory, pair_lock, run_sync
from .preflight import check_pair
from .prune import NoCheckpoints

log = logging.getLogger(__name__)

COPY_CHECK_EVERY = 10  # cycles between looks for the manifest's copy at the target
DEBOUNCE_MS = 2000  # file-system events this close together wake one cycle
MIN_SPACING_S = 5.0  # an early wake never starts cycles closer together than this
MIN_CYCLE_S = 1.0  # nor a wake for files coming of age
DUE_SLACK_S = 0.1  # past the moment a deferred file comes of age: the clocks' rounding


@dataclass(frozen=True, slots=True)
class Cycle:
    """One cycle's outcome, for the caller's log line, report and metrics."""

    number: int
    report: SyncReport | None  # None: the cycle failed as a whole (``error``)
    error: str | None
    started: float  # time.time()
    elapsed_s: float


async def watch(source: ReadStore, target: ReadStore, options: SyncOptions,
                sink: EventSink | None, stop: asyncio.Event, *, interval_s: float,
                on_cycle: Callable[[Cycle], Awaitable[None] | None] | None = None,
                manifest_factory: ManifestFactory = Manifest) -> Cycle | None:
    """Run cycles of ``source`` → ``target`` until ``stop`` is set; the last cycle."""
    if options.workers:
        raise UsageError("--workers cannot be combined with --watch yet: a watch's cycles run "
                         "in one process")
    # One retry layer and one set of rate limits for the whole watch, its lock among it.
    pacing = pacing_of(source) or pacing_of(target) or Pacing.for_options(options)
    source, target = resilient(source, pacing), resilient(target, pacing)
    store = await check_pair(source, target, options)  # a bad setup ends the watch (exit 2)
    cycle_options = dataclasses.replace(options, lock=False)  # the watch holds the lock
    wake = asyncio.Event()
    watcher = _watch_files(source, wake, stop)
    last: Cycle | None = None
    async with pair_lock(source, store, options):
        try:
            number = 0
            while not stop.is_set():
                number += 1
                # Cleared before the cycle, not after: a change during it (the trainer
                # finishing the next step) starts another cycle right after.
                wake.clear()
                last = await _one(source, store, cycle_options, sink, stop, number,
                                  manifest_factory)
                if on_cycle is not None:
                    pending = on_cycle(last)
                    if pending is not None:
                        await pending
                due = last.report.deferred_until if last.report is not None else None
                await _until_next(interval_s, last.started, wake, stop, due)
        finally:
            await cancel_and_wait(watcher)
    return last


async def _one(source: ReadStore, target: ReadStore, options: SyncOptions,
               sink: EventSink | None, stop: asyncio.Event, number: int,
               manifest_factory: ManifestFactory) -> Cycle:
    started, clock = time.time(), time.monotonic()
    recheck = number == 1 or number % COPY_CHECK_EVERY == 0
    try:
        report = await run_sync(source, target, options, sink, stop=stop,
                                manifest_factory=manifest_factory, preflight=recheck,
                                check_manifest_copy=recheck)
    except NoCheckpoints as exc:  # none yet: the trainer writes its first one later
        log.warning("cycle %d: %s; the next cycle syncs without looking again", number, exc)
        return Cycle(number, None, str(exc), started, time.monotonic() - clock)
    except (UsageError, Locked):
        raise  # the setup is wrong: no later cycle would do better
    except MCSyncError as exc:
        log.warning("cycle %d failed: %s; trying again at the next interval", number, exc)
        return Cycle(number, None, str(exc), started, time.monotonic() - clock)
    return Cycle(number, report, None, started, time.monotonic() - clock)


async def _until_next(interval_s: float, started: float, wake: asyncio.Event,
                      stop: asyncio.Event, due: float | None = None) -> None:
    """Until the interval since the cycle started is over, or a file the cycle deferred for
    its age comes of age (``due``), or the source changed (but not sooner than MIN_SPACING_S
    after it started), or a stop."""
    deadline = started + interval_s
    if due is not None:
        deadline = min(deadline, max(due + DUE_SLACK_S, started + MIN_CYCLE_S))
    while not stop.is_set():
        left = deadline - time.time()
        if left <= 0:
            return
        waiters = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(wake.wait())]
        try:
            await asyncio.wait(waiters, timeout=left, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waiters:
                w.cancel()
        if wake.is_set():
            early = min(started + MIN_SPACING_S, deadline) - time.time()
            if early > 0:
                await asyncio.wait([asyncio.ensure_future(stop.wait())], timeout=early)
            return


def _watch_files(source: ReadStore, wake: asyncio.Event,
                 stop: asyncio.Event) -> asyncio.Task[None] | None:
    """A task setting ``wake`` when files under a local source change; None for others."""
    if not isinstance(source, LocalTree):
        return None

    async def run(root: Path) -> None:
        from watchfiles import awatch  # imported on use: only a local source is watched

        if not await asyncio.to_thread(on_this_machine, root):
            log.info("%s is a network or FUSE mount: files changed on its other side (through "
                     "the object store) raise no event here, so each cycle's listing finds "
                     "them, every interval", root)

        try:
            async for _ in awatch(root, stop_event=stop, debounce=DEBOUNCE_MS,
                                  recursive=True):
                wake.set()
        except (OSError, RuntimeError) as exc:  # e.g. out of inotify watches
            log.warning("not watching %s for changes (%s); cycles start on the interval",
                        root, exc)

    return asyncio.create_task(run(source.root))
