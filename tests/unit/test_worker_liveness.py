"""Liveness of ``--workers``, the pure parts: a task's deadline (``workers.task_deadline``),
what ``Workers`` does with a task that raised in its worker (``TaskFailed``: its objects fail
with the cause, no other worker runs it), and the breaker (``BREAKER`` workers in a row that
could not start stop the run with a ``UsageError``, exit 2)."""

from __future__ import annotations

import asyncio

import pytest

from mcsync.config import SyncOptions
from mcsync.errors import UsageError
from mcsync.move.dispatch import Outcome
from mcsync.records import Action
from mcsync.scale.worker_runner import (
    TaskFailed,
    TaskResult,
    WorkerLost,
    WorkerUnavailable,
    worker_options,
)
from mcsync.scale.workers import BREAKER, DEADLINE_FLOOR_S, Workers, task_deadline
from mcsync.state.task_log import TaskDone
from mcsync.types import ObjectInfo

MiB = 1 << 20


@pytest.mark.parametrize(("nbytes", "requests", "options", "want"), [
    (0, 1, SyncOptions(), DEADLINE_FLOOR_S),  # a small task: the floor
    (64 * MiB, 32, SyncOptions(), 64.0),  # a full task: its bytes at 1 MiB/s
    (600 * MiB, 1, SyncOptions(), 600.0),
    # The worker's share of --bwlimit, when slower than 1 MiB/s: 4 MiB/s over 8 workers.
    (64 * MiB, 1, worker_options(SyncOptions(bw_limit="4MiB", workers=8), 8), 128.0),
    # A timetable: its lowest rate ("off" is none).
    (32 * MiB, 1, SyncOptions(bw_limit="08:00,256KiB 20:00,off"), 128.0),
    # --tpslimit: a request per 1/tps seconds on top, 2 per second here.
    (0, 200, SyncOptions(tps_limit=2), 100.0),
    # --task-timeout is the deadline, whatever the task.
    (600 * MiB, 1, SyncOptions(task_timeout=15), 15.0),
])
def test_a_tasks_deadline(nbytes: int, requests: int, options: SyncOptions,
                          want: float) -> None:
    assert task_deadline(nbytes, requests, options) == pytest.approx(want)


def test_task_timeout_must_be_positive() -> None:
    with pytest.raises(UsageError, match="--task-timeout"):
        SyncOptions(task_timeout=0)


class Pool:
    """A pool that answers each task from a script of what happens to it."""

    size = 2

    def __init__(self, *script: BaseException | None) -> None:
        self.script = list(script)
        self.deadlines: list[float | None] = []

    def describe(self) -> str:
        return "scripted"

    async def run(self, items, *, deadline_s=None):
        self.deadlines.append(deadline_s)
        await asyncio.sleep(0)
        what = self.script.pop(0) if self.script else None
        if what is not None:
            raise what
        return TaskResult([Outcome(a.key, None) for a in items], [], 0, 0, 0, "pid 7 on here")

    async def aclose(self, *, wait: bool) -> None:
        pass


def action(key: str, size: int = 1000) -> Action:
    return Action("copy", key, ObjectInfo(key, size, "e", 1.0), None, "new")


def run_task(pool: Pool, options: SyncOptions | None = None,
             n: int = 3) -> tuple[list[Outcome | BaseException], Workers, list[TaskDone]]:
    ended: list[TaskDone] = []
    options = options or SyncOptions()

    async def go() -> tuple[list[Outcome | BaseException], Workers]:
        workers = Workers(pool, options, lambda event: None, asyncio.Event(), ended.append)
        got = await asyncio.gather(*(workers.run(action(f"k{i}")) for i in range(n)),
                                   return_exceptions=True)
        await workers.aclose()
        return got, workers

    got, workers = asyncio.run(go())
    return got, workers, ended


def test_the_pool_is_given_the_tasks_deadline() -> None:
    pool = Pool()
    run_task(pool, SyncOptions(task_timeout=42))
    assert pool.deadlines == [42.0]


def test_a_task_that_raised_fails_its_objects_with_the_cause_and_runs_nowhere_else() -> None:
    pool = Pool(TaskFailed("in worker pid 7 on here: RuntimeError: boom"))
    got, workers, ended = run_task(pool)
    assert len(pool.deadlines) == 1 and workers.tasks_retried == 0
    for outcome in got:
        assert isinstance(outcome, Outcome) and outcome.event is not None
        assert outcome.event.kind == "TaskFailed"
        assert outcome.event.error.endswith(
            "failed in worker pid 7 on here: RuntimeError: boom")
    assert [d.state for d in ended] == ["failed"]


def test_a_lost_task_is_retried_under_the_worker_that_died() -> None:
    pool = Pool(WorkerLost("worker pid 5 on here died (killed by SIGKILL)", "pid 5 on here"))
    got, workers, ended = run_task(pool)
    assert workers.tasks_retried == 1 and all(isinstance(o, Outcome) for o in got)
    assert [(d.state, d.worker) for d in ended] == [("retried", "pid 5 on here"),
                                                    ("done", "pid 7 on here")]


def test_workers_that_cannot_start_trip_the_breaker() -> None:
    pool = Pool(*[WorkerUnavailable("could not start a worker process on here: boom")] * 9)
    got, workers, _ = run_task(pool)
    assert len(pool.deadlines) == BREAKER  # the third in a row stops the run
    assert all(isinstance(o, UsageError) for o in got)
    assert str(got[0]) == ("workers: could not start a worker process on here: boom "
                           f"({BREAKER} times in a row; stopping the run)")
    assert workers.broken is got[0]


def test_a_started_worker_resets_the_breaker() -> None:
    down = WorkerUnavailable("could not start")
    pool = Pool(*[down] * (BREAKER - 1), None, *[down] * (BREAKER - 1), None)

    async def go() -> Workers:
        workers = Workers(pool, SyncOptions(), lambda event: None, asyncio.Event())
        for i in range(2):
            await workers.run(action(f"k{i}"))
        return workers

    workers = asyncio.run(go())
    assert workers.broken is None and workers.tasks == 2
