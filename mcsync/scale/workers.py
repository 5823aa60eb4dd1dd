"""Worker processes (``--workers N``): the executor seam of a run, the driver's side.

The driver (``driver``) lists and plans every key and is the only writer of the manifest. The
actions that are one request each (``Dispatch.is_whole``: a whole-object PUT, one CopyObject, a
delete) it hands to ``Workers``, which cuts them into tasks balanced by bytes (many more tasks
than workers, sent as workers free up: DistCp's dynamic strategy) and returns each action's
``Outcome`` for the driver to commit as its task comes back.

Where the tasks run is a ``WorkerPool``: processes on this machine (``local_pool``), each
running a ``worker_runner.TaskRunner``. Multipart uploads, block deltas and uploads a killed run
left stay in the driver's process, which journals them: a worker has no journal, so an object
that grew past one request since it was listed comes back ``handed_back``. The parts of a copy
in parts the driver opened go to workers all the same, as part tasks (``part_tasks``:
``send_parts``), and so do the byte ranges of a large object's hashing read for a delta or a
content-defined cut, as hash tasks (``hash_tasks``: ``send_hashes``), retried like any task.

A task whose worker died goes to another, each at most ``MAX_TRIES`` times, and the report
names it; so does one that ran past its deadline (``task_deadline``: ``--task-timeout``, else
from its bytes), whose worker the pool kills. A task that raised in its worker (``TaskFailed``)
fails its objects with that cause, and is not run again. ``BREAKER`` workers in a row that could
not start stop the run (exit 2, the cause in one line) instead of each task trying again. A
killed driver takes its workers with it; the same command resumes as any run does.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from ..batching import Batcher
from ..bottleneck import WorkersSpent
from ..config import SyncOptions
from ..errors import Interrupted, Transient, UsageError
from ..events import BytesMoved, Event, ObjectFailed
from ..move.dispatch import Outcome, kind_of
from ..move.hash_tasks import HashDone, HashJob
from ..move.part_tasks import PartJob, PartSent
from ..ratelimit import Timetable
from ..records import Action
from ..state.task_log import NO_WORKER, TaskDone
from ..types import MiB
from .worker_runner import (
    Result,
    TaskFailed,
    TaskItem,
    TaskResult,
    WorkerLost,
    WorkerUnavailable,
    worker_options,
)

log = logging.getLogger(__name__)

# A task closes at this many bytes or this many objects (or a worker's requests in flight, if
# more), whichever comes first: small objects cost a request each, large ones their bytes. A
# part-full task goes after LINGER_S.
TASK_BYTES = 64 * 2**20
TASK_OBJECTS = 32
LINGER_S = 0.05
TASKS_AHEAD = 3  # tasks per worker planned ahead (in flight or waiting): memory flat in keys
MAX_TRIES = 3  # a task whose worker died this often fails its objects (retryable next run)
MAX_NAMED = 1000  # retried tasks the report names
BREAKER = 3  # workers in a row that could not start: the run stops (exit 2)
# A task's deadline, unless --task-timeout sets it: the time its bytes take at SLOWEST_BPS
# (or at the worker's share of --bwlimit, if lower) and its requests at its share of
# --tpslimit, never under DEADLINE_FLOOR_S. Generous on purpose: a deadline that kills a
# worker that was only slow costs the task a try, and three such fail its objects.
DEADLINE_FLOOR_S = 60.0
SLOWEST_BPS = 1 * MiB


class WorkerPool(Protocol):
    """Where tasks run. ``run`` raises ``WorkerLost`` when a worker died under the task, or
    ran past ``deadline_s`` and was killed (the pool replaces what it lost), ``TaskFailed``
    when the task's own code raised, and ``WorkerUnavailable`` (fast) when no worker could be
    started to run it, naming the node and the cause."""

    size: int

    def describe(self) -> str: ...

    async def run(self, items: list[TaskItem], *,
                  deadline_s: float | None = None) -> TaskResult: ...

    async def aclose(self, *, wait: bool) -> None: ...


def refuse_in_a_starting_worker() -> None:
    """A worker process starts by importing the caller's main script (``spawn``): a script
    that calls ``mcsync.sync(..., workers=N)`` unguarded would start a sync in each worker.
    Refused there, before any lock or listing, with what to change."""
    if getattr(multiprocessing.current_process(), "_inheriting", False):
        raise UsageError("workers: a worker process is importing the script that started the "
                         "sync; call mcsync.sync(..., workers=N) under "
                         "if __name__ == '__main__':")


def task_deadline(nbytes: int, requests: int, share: SyncOptions) -> float:
    """Seconds a task of ``nbytes`` in ``requests`` requests may take on a worker whose share
    of the run's limits is ``share`` before it is taken for stuck: ``--task-timeout`` when
    given; else ``max(60 s, nbytes / rate + requests / tps)``, where ``rate`` is 1 MiB/s or
    the worker's share of ``--bwlimit`` (its lowest rate), if lower, and the second term only
    with ``--tpslimit`` (the worker's share)."""
    if share.task_timeout is not None:
        return share.task_timeout
    rate = float(SLOWEST_BPS)
    if share.bw_limit:
        rates = [r for _, r in Timetable.parse(share.bw_limit).entries if r is not None]
        rate = min([rate, *rates])
    seconds = nbytes / rate
    if share.tps_limit:
        seconds += requests / share.tps_limit
    return max(DEADLINE_FLOOR_S, seconds)


@dataclass
class _Task:
    number: int
    actions: list[TaskItem]
    tries: int = 0

    def name(self) -> str:
        first, last = self.actions[0], self.actions[-1]
        if isinstance(first, PartJob):
            numbers = ", ".join(str(j.part.number) for j in self.actions
                                if isinstance(j, PartJob))
            return f"task {self.number} (parts {numbers} of {first.key})"
        if isinstance(first, HashJob):
            return (f"task {self.number} (hashing {first.key} from byte {first.rng.start} "
                    f"to {first.rng.end})")
        keys = first.key if first.key == last.key else f"{first.key} .. {last.key}"
        return f"task {self.number} ({len(self.actions)} objects, {keys})"

    def objects(self) -> int:
        """Whole objects it carries (a part or hash task carries none: its object is the
        driver's)."""
        return sum(1 for a in self.actions if isinstance(a, Action))


class Workers:
    """The driver's side of a pool: actions batched into tasks, tasks run on the pool and
    retried when their worker died, outcomes handed back per action, the workers' counters
    summed for the report, and what they spent (``spent``) for its verdict."""

    def __init__(self, pool: WorkerPool, options: SyncOptions,
                 emit: Callable[[Event], None], stop: asyncio.Event,
                 on_task: Callable[[TaskDone], None] | None = None) -> None:
        self.pool = pool
        self.size = pool.size
        self.task_bytes = TASK_BYTES
        self.on_task = on_task  # told of each task's end (task_log.TaskLog)
        self.emit = emit
        self.stop = stop
        # A task holds enough objects to keep its worker's requests busy.
        self.share = worker_options(options, pool.size)  # for the tasks' deadlines
        self.task_objects = max(TASK_OBJECTS, self.share.in_flight)
        # Actions handed to workers and not yet come back, at most: the driver waits for room.
        self.room = asyncio.Semaphore(pool.size * TASKS_AHEAD * self.task_objects)
        self._batcher: Batcher[Action, Outcome] = Batcher(
            self._send, size=lambda action: action.size, max_items=self.task_objects,
            max_size=TASK_BYTES, linger_s=LINGER_S)
        self._numbered = 0
        self.tasks = 0
        self.retried: list[str] = []
        self.tasks_retried = 0
        self.throttled = self.requests_retried = self.expired = 0
        # What the workers spent, for the verdict: each result's since its worker's last one,
        # so a task run again adds only its new run's (a killed worker's last is lost).
        self.spent = WorkersSpent()
        self.unavailable = 0  # workers in a row that could not start (BREAKER)
        self.broken: UsageError | None = None  # what stopped the run once BREAKER was reached

    async def run(self, action: Action) -> Outcome:
        """``action``'s outcome, from a worker (``handed_back`` when it is not one request
        after all). The caller holds a unit of ``room`` meanwhile."""
        return await self._batcher.submit(action)

    async def _send(self, actions: list[Action]) -> list[Outcome]:
        """One task of whole-object actions (the batcher closed it), an outcome per action."""
        self._numbered += 1
        outcomes = await self._outcomes(_Task(self._numbered, list(actions)))
        assert all(isinstance(o, Outcome) for o in outcomes)
        return [o for o in outcomes if isinstance(o, Outcome)]

    async def send_parts(self, jobs: list[PartJob]) -> list[PartSent]:
        """One task of part jobs (``part_tasks.RemoteParts`` batched them), run on a worker
        and on another when its worker died; a ``PartSent`` per job."""
        self._numbered += 1
        results = await self._outcomes(_Task(self._numbered, list(jobs)))
        assert all(isinstance(r, PartSent) for r in results)
        return [r for r in results if isinstance(r, PartSent)]

    async def send_hashes(self, jobs: list[HashJob]) -> list[HashDone]:
        """One task of hash jobs (``hash_tasks.RemoteScan``): ranges read and hashed on a
        worker, on another when its worker died; a ``HashDone`` per job."""
        self._numbered += 1
        results = await self._outcomes(_Task(self._numbered, list(jobs)))
        assert all(isinstance(r, HashDone) for r in results)
        return [r for r in results if isinstance(r, HashDone)]

    async def _outcomes(self, task: _Task) -> list[Result]:
        deadline = task_deadline(sum(a.size for a in task.actions), len(task.actions),
                                 self.share)
        while True:
            if self.broken is not None:
                raise self.broken
            task.tries += 1
            try:
                result = await self.pool.run(task.actions, deadline_s=deadline)
            except WorkerLost as exc:
                self.unavailable = 0
                ended = self._after_death(task, exc)
                if ended is None:
                    continue
                return ended
            except WorkerUnavailable as exc:
                self._unavailable(exc)
                if task.tries < MAX_TRIES and not self.stop.is_set():
                    continue
                return self._failed(task, str(exc), NO_WORKER)
            except TaskFailed as exc:  # its own code raised: the same would happen elsewhere
                self.unavailable = 0
                return self._failed(task, f"failed {exc}", exc.worker, "TaskFailed")
            self.unavailable = 0
            self.tasks += 1
            self.throttled += result.throttled
            self.requests_retried += result.retried
            self.expired += result.expired
            for key, nbytes in result.moved:
                self.emit(BytesMoved(key, nbytes))
            if result.requests is not None:  # for the metrics: the worker's requests
                self.emit(result.requests)
            if result.spent is not None:
                self.spent = self.spent.plus(result.spent, result.worker)
            self._ended(TaskDone(task.name(), "done", result.worker, task.objects(),
                                 sum(n for _, n in result.moved), result.seconds))
            return result.outcomes

    def _after_death(self, task: _Task, exc: WorkerLost) -> list[Result] | None:
        """A worker died under ``task``: another takes it (None), unless the run is stopping
        or the task has had its tries."""
        if self.stop.is_set():  # interrupted: the next run takes these (an upload stays open)
            stopped = Interrupted(f"{task.name()}: stopped")
            return [Outcome(a.key, None) if isinstance(a, Action) else _errored(a, stopped)
                    for a in task.actions]
        if task.tries >= MAX_TRIES:
            return self._failed(task, f"a worker died running it {task.tries} times ({exc})",
                                exc.worker)
        self.tasks_retried += 1
        self._ended(TaskDone(task.name(), "retried", exc.worker))
        if len(self.retried) < MAX_NAMED:
            self.retried.append(f"{task.name()}: {exc}; run again")
        return None

    def _unavailable(self, exc: WorkerUnavailable) -> None:
        """One more worker could not start: at ``BREAKER`` in a row the run stops, in one line
        naming where and why, rather than every task trying again."""
        self.unavailable += 1
        if self.unavailable >= BREAKER and self.broken is None:
            self.broken = UsageError(f"workers: {exc} ({self.unavailable} times in a row; "
                                     "stopping the run)")
            raise self.broken

    def _failed(self, task: _Task, why: str, worker: str,
                kind: str = "WorkerDied") -> list[Result]:
        self._ended(TaskDone(task.name(), "failed", worker, objects=task.objects()))
        return [_errored(a, Transient(f"{task.name()}: {why}"))
                if not isinstance(a, Action) else
                Outcome(a.key, ObjectFailed(a.key, kind_of(a), a.size, f"{task.name()}: {why}",
                                            kind, retryable=True))
                for a in task.actions]

    def _ended(self, done: TaskDone) -> None:
        if self.on_task is not None:
            self.on_task(done)

    async def aclose(self) -> None:
        """After the run (or its cancellation): no task left waiting, the workers gone."""
        await self._batcher.aclose()
        # Tasks still running (a cancelled run) finish their few objects, then the workers
        # end; a run that ended normally has none.
        await self.pool.aclose(wait=not self.stop.is_set())


def _errored(job: PartJob | HashJob, error: BaseException) -> PartSent | HashDone:
    """A part or hash job's result that is ``error``: the driver's to act on."""
    if isinstance(job, PartJob):
        return PartSent(job.part.number, None, error=error)
    return HashDone(error=error)
