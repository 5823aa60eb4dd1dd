"""What a worker runs, wherever it runs (a local process, a Ray actor): its stores, reopened
from ``Addresses``, and a dispatch unit with no manifest; a task's planned actions in, a
``TaskResult`` out.

What crosses to a worker: the two addresses and each side's ``StoreOptions`` once, when it
starts (credentials come from the environment and config files the worker inherits, as the
driver's did: never in a task), then, per task, the planned actions, the part jobs of an
upload the driver opened (``part_tasks``), or the byte ranges of an object to read and hash
(``hash_tasks``). What comes back: the outcomes (each record with its block hashes, each
event; a ``PartSent`` per part job, a ``HashDone`` per hash job: digests, never bytes), the
bytes moved per key, the worker's request counters for the report, its requests as the
metrics count them (``observe.requests.RequestTally``: the driver's metrics add them), and what
it spent since its last result for the run's "limited by" verdict (``bottleneck.Spent``: request
time per side, time paced, CPU, its loop's busy time; the driver adds them to its own).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass

from ..bottleneck import Spent
from ..config import SyncOptions
from ..events import BytesMoved, Event, RequestsCounted
from ..limits import Limits
from ..move.context import RunContext
from ..move.dispatch import Dispatch, Outcome
from ..move.hash_tasks import HashDone, HashJob, WorkerHashes
from ..move.part_tasks import PartJob, PartSent, WorkerParts
from ..observe.clocks import WorkerClock
from ..observe.requests import RequestTally, meter
from ..ratelimit import limits_share
from ..records import Action
from ..stores.base import ReadStore, Store
from ..stores.registry import StoreOptions, open_store
from ..stores.resilience import Pacing, resilient
from ..types import MiB

# What a task carries: planned actions of one request each, parts of an upload, or ranges of
# an object to read and hash (``hash_tasks``).
TaskItem = Action | PartJob | HashJob
Result = Outcome | PartSent | HashDone


@dataclass(frozen=True, slots=True)
class Addresses:
    """What a worker opens its stores from: each side's address and options."""

    source: str
    target: str
    source_options: StoreOptions
    target_options: StoreOptions


def worker_options(options: SyncOptions, n: int) -> SyncOptions:
    """A worker's share of the run's limits: requests in flight and memory split N ways (a
    worker never holds less than 5 MiB; the driver keeps the whole budget for what it moves
    itself), and ``--tpslimit`` / ``--bwlimit`` (each rate of a timetable) split N ways too
    (the driver paces itself at a share as well: ``ratelimit.limits_share``)."""
    return dataclasses.replace(
        limits_share(options, n), workers=0, concurrency=max(1, -(-options.in_flight // n)),
        memory_limit=max(options.memory_limit // n, 5 * MiB))


class WorkerLost(Exception):
    """A worker died running a task (OOM, SIGKILL, its node gone), or was killed for running
    past the task's deadline: the task may go to another. ``worker``: which ("pid P on HOST",
    as ``TaskResult.worker``), "" when the pool cannot tell."""

    def __init__(self, message: str, worker: str = "") -> None:
        super().__init__(message)
        self.worker = worker


class WorkerUnavailable(Exception):
    """No worker could be started or reached to run a task."""


class TaskFailed(Exception):
    """A task raised inside its worker: the task's own failure, with its cause's text (the
    worker is fine and keeps running; the task is not run again by another). ``worker``: the
    one it raised in, as ``WorkerLost.worker``."""

    def __init__(self, message: str, worker: str = "") -> None:
        super().__init__(message)
        self.worker = worker


@dataclass(frozen=True, slots=True)
class TaskResult:
    """What a worker sends back for one task."""

    outcomes: list[Result]  # one per item of the task, in order
    moved: list[tuple[str, int]]  # BytesMoved, in order
    throttled: int
    retried: int
    expired: int
    worker: str = ""  # who ran it, "pid P on HOST" (for the run's task log)
    seconds: float = 0.0  # from its first action to its last outcome
    # The worker's requests since its last task's result (those of a task that raised too).
    requests: RequestsCounted | None = None
    # What the worker spent since its last task's result, as ``requests`` (the verdict's).
    spent: Spent | None = None


class TaskRunner:
    """A worker's stores and dispatch unit, opened at its first task, kept for the next ones
    on one event loop of its own."""

    def __init__(self, addresses: Addresses, options: SyncOptions) -> None:
        self.addresses = addresses
        self.options = options
        self.runner = asyncio.Runner(loop_factory=loop_factory())
        self.stores: list[ReadStore] = []
        self.dispatch: Dispatch | None = None
        self.parts: WorkerParts | None = None
        self.hashes: WorkerHashes | None = None
        self.pacing = Pacing.for_options(options)
        self.moved: list[tuple[str, int]] = []
        self.tally = RequestTally()
        self.clock: WorkerClock | None = None  # started on the loop's thread, at a first task

    def _open(self) -> Dispatch:
        a = self.addresses
        # Metered inside the retry layer, as the driver's stores are: each try counts.
        src = resilient(meter(open_store(a.source, a.source_options), self.tally, "source"),
                        self.pacing)
        dst = resilient(meter(open_store(a.target, a.target_options), self.tally, "target"),
                        self.pacing)
        self.stores = [src, dst]
        assert isinstance(dst, Store)
        limits = Limits.for_options(self.options)
        self.parts = WorkerParts(src, dst, limits)
        self.hashes = WorkerHashes(src, limits)
        ctx = RunContext(src, dst, self.options, limits, self._emit, asyncio.Event())
        return Dispatch(ctx, journal=None, known=None, open_uploads={}, whole_only=True)

    def _emit(self, event: Event) -> None:
        if isinstance(event, BytesMoved):
            self.moved.append((event.key, event.nbytes))

    def run(self, items: list[TaskItem]) -> TaskResult:
        """One task, start to end (blocking: the worker's loop is its own)."""
        return self.runner.run(self._run(items))

    async def _run(self, items: list[TaskItem]) -> TaskResult:
        if self.clock is None:
            self.clock = WorkerClock(*self.pacing.timings())
        if self.dispatch is None:
            self.dispatch = self._open()
        assert self.parts is not None and self.hashes is not None
        p = self.pacing
        before = (p.throttled, p.retried, p.expired)
        self.moved = []
        began = time.monotonic()
        outcomes = await run_items(self.dispatch, self.parts, self.hashes, items)
        worker = f"pid {os.getpid()} on {socket.gethostname()}"
        src, dst = self.stores
        return TaskResult(outcomes, self.moved,
                          p.throttled - before[0], p.retried - before[1], p.expired - before[2],
                          worker, time.monotonic() - began, self.tally.take(worker),
                          self.clock.take(*p.timings(), src.url, dst.url))

    def close(self) -> None:
        async def closing() -> None:
            for store in self.stores:
                with contextlib.suppress(Exception):
                    await store.aclose()

        with contextlib.suppress(Exception):
            self.runner.run(closing())
            self.runner.close()


async def run_items(dispatch: Dispatch, parts: WorkerParts, hashes: WorkerHashes,
                    items: list[TaskItem]) -> list[Result]:
    """A task's items run at once, each result in its item's place (none raises)."""
    async def one(item: TaskItem) -> Result:
        if isinstance(item, PartJob):
            return await parts.send(item)
        if isinstance(item, HashJob):
            return await hashes.run(item)
        return await dispatch.run(item)

    async with asyncio.TaskGroup() as tg:
        running = [tg.create_task(one(item)) for item in items]
    return [t.result() for t in running]


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency off Windows
        return None
    return uvloop.new_event_loop
