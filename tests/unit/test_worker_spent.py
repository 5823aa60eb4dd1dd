"""What ``--workers`` spent, for the run's verdict: a worker's clock gives what it spent since it
last said (``observe.clocks.WorkerClock``), each task's result carries it, and ``Workers`` sums
the results that came back (``bottleneck.WorkersSpent``): a task its worker died under, run
again, adds only the run that answered."""

from __future__ import annotations

import asyncio
import socket
import time

from mcsync.bottleneck import Spent
from mcsync.config import SyncOptions
from mcsync.move.dispatch import Outcome
from mcsync.observe.clocks import WorkerClock
from mcsync.records import Action
from mcsync.scale.worker_runner import TaskResult, WorkerLost
from mcsync.scale.workers import Workers
from mcsync.types import ObjectInfo


def test_a_workers_clock_gives_what_was_spent_since_it_last_said() -> None:
    clock = WorkerClock({"src": 1.0, "dst": 2.0}, 0.5)
    first = clock.take({"src": 3.0, "dst": 2.5, "other": 9.0}, 1.5, "src", "dst")
    assert (first.source_s, first.target_s, first.paced_s) == (2.0, 0.5, 1.0)
    assert first.host == socket.gethostname() and first.cores >= 1
    began = time.process_time()
    while time.process_time() - began < 0.2:  # CPU of this thread, the "loop's"
        pass
    second = clock.take({"src": 3.5, "dst": 2.5}, 1.5, "src", "dst")
    assert (second.source_s, second.target_s, second.paced_s) == (0.5, 0.0, 0.0)
    assert second.cpu_s >= 0.2 and second.loop_s >= 0.19
    assert first.cpu_s < 0.2  # the spin is the second's alone


def spent(seconds: float, host: str = "here") -> Spent:
    return Spent(source_s=seconds, target_s=2 * seconds, paced_s=0.0, cpu_s=seconds,
                 loop_s=seconds, host=host, cores=4)


class Pool:
    """Two workers: each task's first try dies under "pid 5" when told to; the answer's
    figures come from the worker that answers."""

    size = 2

    def __init__(self, lose: int) -> None:
        self.lose = lose
        self.answered = 0

    def describe(self) -> str:
        return "scripted"

    async def run(self, items, *, deadline_s=None):
        await asyncio.sleep(0)
        if self.lose:
            self.lose -= 1
            raise WorkerLost("worker pid 5 on here died (killed by SIGKILL)", "pid 5 on here")
        self.answered += 1
        worker = f"pid {6 + self.answered % 2} on here"
        return TaskResult([Outcome(a.key, None) for a in items], [], 0, 0, 0, worker,
                          spent=spent(1.0))

    async def aclose(self, *, wait: bool) -> None:
        pass


def action(key: str) -> Action:
    return Action("copy", key, ObjectInfo(key, 1000, "e", 1.0), None, "new")


def test_workers_sum_what_each_answered_task_spent_and_a_lost_try_adds_nothing() -> None:
    pool = Pool(lose=1)

    async def go() -> Workers:
        workers = Workers(pool, SyncOptions(), lambda event: None, asyncio.Event())
        for batch in ([f"k{i}" for i in range(2)], [f"k{i}" for i in range(2, 6)]):
            await asyncio.gather(*(workers.run(action(k)) for k in batch))
        await workers.aclose()
        return workers

    workers = asyncio.run(go())
    assert workers.tasks_retried == 1 and pool.answered == workers.tasks == 2
    s = workers.spent
    assert s.source_s == workers.tasks * 1.0 and s.target_s == workers.tasks * 2.0
    assert s.cpu_s == s.loop_s == workers.tasks * 1.0
    # Who said: the two that answered, not the one that died; their host once.
    assert s.processes == {"pid 6 on here", "pid 7 on here"} and s.hosts == (("here", 4),)
