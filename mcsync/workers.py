"""Worker processes on this machine (``--workers N``): the executor seam of a run.

The driver (``driver``) lists and plans every key and is the only writer of the manifest. The
actions that are one request each (``Dispatch.is_whole``: a whole-object PUT, one CopyObject, a
delete) it hands to ``LocalWorkers``, which cuts them into tasks balanced by bytes (many more
tasks than workers, sent as workers free up: DistCp's dynamic strategy) and returns each
action's ``Outcome`` for the driver to commit as its task comes back.

What crosses to a worker: the two addresses and each side's ``StoreOptions`` once, when the
process starts (credentials come from the environment and config files the child inherits,
as the driver's did: never in a task), then, per task, the planned actions. What comes back:
the outcomes (each record with its block hashes, each event), the bytes moved per key, and the
worker's request counters for the report. Multipart uploads, block deltas and uploads a
killed run left stay in the driver's process, which journals them: a worker has no journal,
so an object that grew past one request since it was listed comes back ``handed_back``.

A worker that dies (OOM, SIGKILL) breaks its pool: the tasks in flight go to a fresh pool,
each at most ``MAX_TRIES`` times, and the report names them. A killed driver takes its
workers with it (PR_SET_PDEATHSIG); the same command resumes as any run does.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import dataclasses
import logging
import multiprocessing
import os
import signal
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from multiprocessing.util import Finalize

from .config import SyncOptions
from .dispatch import Dispatch, Outcome, kind_of
from .errors import UsageError
from .events import BytesMoved, Event, ObjectFailed
from .limits import Limits
from .plan import Action
from .resilience import Pacing, resilient
from .stores.base import ReadStore, Store
from .stores.registry import StoreOptions, open_store
from .stores.single import is_one_object
from .stores.wrap import innermost
from .types import MiB

log = logging.getLogger(__name__)

# A task closes at this many bytes or this many objects (or a worker's requests in flight, if
# more), whichever comes first: small objects cost a request each, large ones their bytes. A
# part-full task goes after LINGER_S.
TASK_BYTES = 64 * MiB
TASK_OBJECTS = 32
LINGER_S = 0.05
TASKS_AHEAD = 3  # tasks per worker planned ahead (in flight or waiting): memory flat in keys
MAX_TRIES = 3  # a task whose worker died this often fails its objects (retryable next run)
MAX_NAMED = 1000  # retried tasks the report names


@dataclass(frozen=True, slots=True)
class Addresses:
    """What a worker process opens its stores from: each side's address and options."""

    source: str
    target: str
    source_options: StoreOptions
    target_options: StoreOptions


def reopenable(source: ReadStore, target: ReadStore,
               options: SyncOptions) -> tuple[SyncOptions, Addresses | None]:
    """A run's options and the addresses its workers reopen ``source`` and ``target`` from,
    for stores opened from addresses (their ``url``s open the same stores): the options
    without workers when the pair is one object (``stores.single``: nothing to share out)."""
    if not options.workers:
        return options, None
    if is_one_object(source) or is_one_object(target):
        log.info("one object: moved without worker processes")
        return dataclasses.replace(options, workers=0), None
    return options, Addresses(source.url, target.url, options.store_options("source"),
                              options.store_options("target"))


def folds_case(target: ReadStore) -> bool:
    """Does ``target`` (a directory whose filesystem folds case) tell two keys apart only by
    what one process remembers writing? Its whole objects then stay in the driver's process:
    two workers could each write one of two names that differ only by case, one file."""
    probe = getattr(innermost(target), "folds_case", None)
    if not callable(probe):
        return False
    try:
        return bool(probe())
    except OSError:  # cannot tell: as if it did
        return True


def refuse_in_a_starting_worker() -> None:
    """A worker process starts by importing the caller's main script (``spawn``): a script
    that calls ``mcsync.sync(..., workers=N)`` unguarded would start a sync in each worker.
    Refused there, before any lock or listing, with what to change."""
    if getattr(multiprocessing.current_process(), "_inheriting", False):
        raise UsageError("workers: a worker process is importing the script that started the "
                         "sync; call mcsync.sync(..., workers=N) under "
                         "if __name__ == '__main__':")


def worker_options(options: SyncOptions, n: int) -> SyncOptions:
    """A worker's share of the run's limits: requests in flight and memory split N ways (a
    worker never holds less than 5 MiB; the driver keeps the whole budget for what it moves
    itself)."""
    return dataclasses.replace(
        options, workers=0, concurrency=max(1, -(-options.concurrency // n)),
        memory_limit=max(options.memory_limit // n, 5 * MiB))


@dataclass(frozen=True, slots=True)
class TaskResult:
    """What a worker sends back for one task."""

    outcomes: list[Outcome]
    moved: list[tuple[str, int]]  # BytesMoved, in order
    throttled: int
    retried: int
    expired: int


# -- in the worker process ----------------------------------------------------------------------

_worker: _Worker | None = None


class _Worker:
    """A worker process's stores and dispatch unit, opened at its first task, kept for the
    next ones on one event loop."""

    def __init__(self, addresses: Addresses, options: SyncOptions) -> None:
        self.addresses = addresses
        self.options = options
        self.runner = asyncio.Runner(loop_factory=_loop_factory())
        self.stores: list[ReadStore] = []
        self.dispatch: Dispatch | None = None
        self.pacing = Pacing.for_options(options)
        self.moved: list[tuple[str, int]] = []
        Finalize(self, self.close, exitpriority=10)

    def _open(self) -> Dispatch:
        a = self.addresses
        src = resilient(open_store(a.source, a.source_options), self.pacing)
        dst = resilient(open_store(a.target, a.target_options), self.pacing)
        self.stores = [src, dst]
        assert isinstance(dst, Store)
        return Dispatch(src, dst, self.options,
                        Limits(self.options.concurrency, self.options.memory_limit),
                        self._emit, journal=None, known=None, open_uploads={},
                        stop=asyncio.Event(), whole_only=True)

    def _emit(self, event: Event) -> None:
        if isinstance(event, BytesMoved):
            self.moved.append((event.key, event.nbytes))

    async def run(self, actions: list[Action]) -> TaskResult:
        if self.dispatch is None:
            self.dispatch = self._open()
        p = self.pacing
        before = (p.throttled, p.retried, p.expired)
        self.moved = []
        async with asyncio.TaskGroup() as tg:
            running = [tg.create_task(self.dispatch.run(action)) for action in actions]
        return TaskResult([t.result() for t in running], self.moved,
                          p.throttled - before[0], p.retried - before[1], p.expired - before[2])

    def close(self) -> None:
        async def closing() -> None:
            for store in self.stores:
                with contextlib.suppress(Exception):
                    await store.aclose()

        with contextlib.suppress(Exception):
            self.runner.run(closing())
            self.runner.close()


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency off Windows
        return None
    return uvloop.new_event_loop


def _start_worker(addresses: Addresses, options: SyncOptions, parent: int) -> None:
    """A worker process starts: it dies with the driver, leaves stop signals to the driver
    (which lets tasks in flight finish), and opens its stores at its first task."""
    global _worker
    _die_with(parent)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _worker = _Worker(addresses, options)


def _die_with(parent: int) -> None:
    """SIGKILL when the driver dies (Linux): a worker outliving a killed driver would still
    write objects that no manifest will hear of while the next run starts."""
    with contextlib.suppress(OSError, AttributeError, TypeError):  # no prctl: not Linux
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:  # died before prctl took effect
        os._exit(1)


def _run_task(actions: list[Action]) -> TaskResult:
    assert _worker is not None, "not a worker process"
    return _worker.runner.run(_worker.run(actions))


# -- in the driver ------------------------------------------------------------------------------


@dataclass
class _Task:
    number: int
    actions: list[Action]
    futures: list[asyncio.Future[Outcome]]
    tries: int = 0

    def name(self) -> str:
        first, last = self.actions[0].key, self.actions[-1].key
        keys = first if first == last else f"{first} .. {last}"
        return f"task {self.number} ({len(self.actions)} objects, {keys})"


class LocalWorkers:
    """N worker processes of a standard-library process pool (started by ``spawn``: nothing
    of the driver's state, its event loop and manifest among it, is forked into them),
    started at the first task."""

    def __init__(self, addresses: Addresses, options: SyncOptions, n: int,
                 emit: Callable[[Event], None], stop: asyncio.Event) -> None:
        self.n = n
        self.addresses = addresses
        self.options = worker_options(options, n)
        self.emit = emit
        self.stop = stop
        # A task holds enough objects to keep its worker's requests busy.
        self.task_objects = max(TASK_OBJECTS, self.options.concurrency)
        # Actions handed to workers and not yet come back, at most: the driver waits for room.
        self.room = asyncio.Semaphore(n * TASKS_AHEAD * self.task_objects)
        self._batch: list[tuple[Action, asyncio.Future[Outcome]]] = []
        self._batch_bytes = 0
        self._timer: asyncio.TimerHandle | None = None
        self._sending: set[asyncio.Task[None]] = set()
        self._pool: ProcessPoolExecutor | None = None
        self._numbered = 0
        self.tasks = 0
        self.retried: list[str] = []
        self.tasks_retried = 0
        self.throttled = self.requests_retried = self.expired = 0

    async def run(self, action: Action) -> Outcome:
        """``action``'s outcome, from a worker (``handed_back`` when it is not one request
        after all). The caller holds a unit of ``room`` meanwhile."""
        fut: asyncio.Future[Outcome] = asyncio.get_running_loop().create_future()
        self._batch.append((action, fut))
        self._batch_bytes += action.size
        if len(self._batch) >= self.task_objects or self._batch_bytes >= TASK_BYTES:
            self._flush()
        elif self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(LINGER_S, self._flush)
        return await fut

    def _flush(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        # Actions whose driver task was cancelled (a stop's grace over) are not sent.
        batch = [(a, f) for a, f in self._batch if not f.cancelled()]
        self._batch, self._batch_bytes = [], 0
        if not batch:
            return
        self._numbered += 1
        task = _Task(self._numbered, [a for a, _ in batch], [f for _, f in batch])
        sending = asyncio.create_task(self._send(task))
        self._sending.add(sending)
        sending.add_done_callback(self._sending.discard)

    async def _send(self, task: _Task) -> None:
        try:
            outcomes = await self._outcomes(task)
        except BaseException as exc:
            for fut in task.futures:
                if fut.done():
                    continue
                if isinstance(exc, asyncio.CancelledError):
                    fut.cancel()
                else:
                    fut.set_exception(exc)
            raise
        for fut, outcome in zip(task.futures, outcomes, strict=True):
            if not fut.done():
                fut.set_result(outcome)

    async def _outcomes(self, task: _Task) -> list[Outcome]:
        while True:
            pool = self._pool_now()
            task.tries += 1
            try:
                result: TaskResult = await asyncio.wrap_future(pool.submit(_run_task,
                                                                           task.actions))
            except BrokenProcessPool as exc:
                ended = self._after_death(task, pool, exc)
                if ended is None:
                    continue
                return ended
            except (OSError, RuntimeError) as exc:  # could not start a worker
                if task.tries < MAX_TRIES and not self.stop.is_set():
                    continue
                return self._failed(task, f"no worker process could run it: {exc}")
            if not isinstance(result, TaskResult):
                raise TypeError(f"a worker returned {type(result).__name__}")
            self.tasks += 1
            self.throttled += result.throttled
            self.requests_retried += result.retried
            self.expired += result.expired
            for key, nbytes in result.moved:
                self.emit(BytesMoved(key, nbytes))
            return result.outcomes

    def _after_death(self, task: _Task, pool: ProcessPoolExecutor,
                     exc: BrokenProcessPool) -> list[Outcome] | None:
        """The pool broke under ``task`` (one of its processes died): a fresh pool takes the
        task again (None), unless the run is stopping or the task has had its tries."""
        if self._pool is pool:
            log.warning("a worker process died (%s); its tasks go to a fresh pool", exc)
            pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
        if self.stop.is_set():  # interrupted: the next run takes these
            return [Outcome(a.key, None) for a in task.actions]
        if task.tries >= MAX_TRIES:
            return self._failed(task, f"a worker process died running it {task.tries} times")
        self.tasks_retried += 1
        if len(self.retried) < MAX_NAMED:
            # A process pool breaks whole: the dead worker's task and those the other workers
            # were running go to the fresh pool alike.
            self.retried.append(f"{task.name()}: a worker process died ({exc}); run again "
                                "on a fresh pool")
        return None

    def _failed(self, task: _Task, why: str) -> list[Outcome]:
        return [Outcome(a.key, ObjectFailed(a.key, kind_of(a), a.size, f"{task.name()}: {why}",
                                            "WorkerDied", retryable=True))
                for a in task.actions]

    def _pool_now(self) -> ProcessPoolExecutor:
        if self._pool is None:
            self._pool = ProcessPoolExecutor(
                self.n, mp_context=multiprocessing.get_context("spawn"),
                initializer=_start_worker,
                initargs=(self.addresses, self.options, os.getpid()))
        return self._pool

    async def aclose(self) -> None:
        """After the run (or its cancellation): no task left waiting, the processes gone."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for sending in list(self._sending):
            sending.cancel()
        if self._sending:
            await asyncio.gather(*self._sending, return_exceptions=True)
        if self._pool is not None:
            pool, self._pool = self._pool, None
            # Tasks still running (a cancelled run) finish their few objects, then the
            # processes end; a run that ended normally has none.
            await asyncio.to_thread(pool.shutdown, wait=not self.stop.is_set(),
                                    cancel_futures=True)

