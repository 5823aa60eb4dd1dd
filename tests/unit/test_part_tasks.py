"""Part tasks, the pure parts: how many parts a task holds, how ``RemoteParts`` batches one
upload's parts and hands back what workers return, and how ``Workers`` retries a part task
whose worker died, fails it after its tries, or leaves it to the next run when stopping."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import pytest

from mcsync.config import SyncOptions
from mcsync.delta.match import Part
from mcsync.errors import Interrupted, MCSyncError, PreconditionFailed, Transient
from mcsync.limits import Limits
from mcsync.move.part_sender import PartSender
from mcsync.move.part_tasks import PartJob, PartSent, RemoteParts, parts_per_task, portable
from mcsync.records import WrittenPart
from mcsync.scale.worker_runner import TaskResult, WorkerLost
from mcsync.scale.workers import MAX_TRIES, Workers
from mcsync.state.task_log import TaskLog
from mcsync.types import ByteRange, ObjectInfo

MiB = 1 << 20
SRC = ObjectInfo("big.bin", 40 * MiB, "etag", 1.0)


@dataclass
class Tasks:
    """A ``PartTasks`` that answers every job itself and keeps each task it was sent."""

    size: int = 3
    task_bytes: int = 64 * MiB
    sent: list[list[PartJob]] = field(default_factory=list)
    fail: dict[int, Exception] = field(default_factory=dict)

    async def send_parts(self, jobs: list[PartJob]) -> list[PartSent]:
        self.sent.append(jobs)
        await asyncio.sleep(0)
        return [PartSent(j.part.number, None, error=self.fail[j.part.number])
                if j.part.number in self.fail else
                PartSent(j.part.number, WrittenPart(j.part.number, f"e{j.part.number}", j.size,
                                                    b"d" * 16), crc=(j.part.number, j.size),
                         worker="1@here")
                for j in jobs]


class Upload:
    upload_id = "up-1"


def parts(n: int, size: int = 8 * MiB) -> list[Part]:
    return [Part(i + 1, ByteRange(i * size, (i + 1) * size), first_chunk=i) for i in range(n)]


def sender(cut: list[bytes] | None = None) -> PartSender:
    return PartSender(None, "big.bin", SRC, cut, Limits(8, 64 * MiB),  # type: ignore[arg-type]
                      streams=False, check_crc=True, threads=1)


@pytest.mark.parametrize(("workers", "n", "part", "conc", "want"), [
    (3, 3, 5 * MiB, 8, 1),  # 3 parts, 3 workers: one each
    (2, 3, 5 * MiB, 8, 2),  # ceil(3 / 2)
    (3, 100, 8 * MiB, 8, 2),  # the object's 8 parts in flight over 3 workers
    (2, 100, 8 * MiB, 32, 8),  # a task's 64 MiB
    (8, 100, 64 * MiB, 8, 1),
    (4, 100, 1024 * MiB, 64, 1),  # a part larger than a task: one
])
def test_parts_per_task(workers, n, part, conc, want):
    assert parts_per_task(Tasks(size=workers), n, part, conc) == want


def test_remote_parts_batches_one_uploads_parts_and_returns_each_receipt():
    tasks, s = Tasks(), sender(cut=[bytes([i]) * 16 for i in range(6)])
    remote = RemoteParts(tasks, s, per_task=2)

    async def go() -> list[WrittenPart]:
        got = await asyncio.gather(*(remote(p, Upload()) for p in parts(5)))  # type: ignore[arg-type]
        await remote.aclose()
        return got

    written = asyncio.run(go())
    assert [w.number for w in written] == [1, 2, 3, 4, 5]
    assert [[j.part.number for j in t] for t in tasks.sent] == [[1, 2], [3, 4], [5]]
    job = tasks.sent[0][1]
    # What a worker needs: the upload's id, the pinned version, the cut's digests of its chunk.
    assert (job.key, job.upload_id, job.src, job.check_crc) == ("big.bin", "up-1", SRC, True)
    assert job.expect == (bytes([1]) * 16,)
    assert s.crc_of(5) == (5, 8 * MiB)  # kept for the check before Complete


def test_a_parts_error_from_a_worker_is_raised_to_the_upload():
    tasks = Tasks(fail={2: PreconditionFailed("big.bin changed")})
    remote = RemoteParts(tasks, sender(), per_task=1)

    async def go() -> None:
        await asyncio.gather(*(remote(p, Upload()) for p in parts(2)))  # type: ignore[arg-type]

    with pytest.raises(PreconditionFailed, match="changed"):
        asyncio.run(go())


def test_an_error_that_cannot_cross_to_the_driver_keeps_its_message():
    class Odd(Exception):
        def __init__(self, a: int, b: int) -> None:  # not rebuilt from its args: no pickle
            super().__init__(f"{a}/{b}")

    assert isinstance(portable(PreconditionFailed("x")), PreconditionFailed)
    crossed = portable(Odd(1, 2))
    assert type(crossed) is MCSyncError and "Odd: 1/2" in str(crossed)


class DyingPool:
    """A pool whose worker dies under the first ``deaths`` tasks."""

    size = 2

    def __init__(self, deaths: int, stop: asyncio.Event | None = None) -> None:
        self.deaths = deaths
        self.stop = stop
        self.runs = 0

    def describe(self) -> str:
        return "dying"

    async def run(self, items):
        self.runs += 1
        if self.runs <= self.deaths:
            if self.stop is not None:
                self.stop.set()
            raise WorkerLost("killed", f"pid {self.runs} on node-a")
        return TaskResult([PartSent(j.part.number, WrittenPart(j.part.number, "e", j.size))
                           for j in items], [], 0, 0, 0, "pid 9 on node-b")

    async def aclose(self, *, wait: bool) -> None:
        pass


def jobs(n: int) -> list[PartJob]:
    return [PartJob("big.bin", "up-1", SRC, p, None, False) for p in parts(n)]


def send(pool: DyingPool, stop: asyncio.Event | None = None,
         log: TaskLog | None = None) -> tuple[list[PartSent], Workers]:
    async def go() -> tuple[list[PartSent], Workers]:
        workers = Workers(pool, SyncOptions(), lambda event: None, stop or asyncio.Event(),
                          on_task=log)
        return await workers.send_parts(jobs(2)), workers

    return asyncio.run(go())


def test_a_part_task_whose_worker_died_goes_to_another_and_is_named():
    sent, workers = send(DyingPool(deaths=1))
    assert [s.written.number for s in sent if s.written] == [1, 2]
    assert workers.tasks_retried == 1
    assert workers.retried == ["task 1 (parts 1, 2 of big.bin): killed; run again"]


def test_the_task_log_names_the_worker_of_every_try_retried_and_failed_ones_too():
    log = TaskLog(None)
    send(DyingPool(deaths=1), log=log)
    assert {w: (t.tasks, t.retried, t.failed) for w, t in log.workers.items()} == {
        "pid 1 on node-a": (0, 1, 0), "pid 9 on node-b": (1, 0, 0)}
    log = TaskLog(None)
    send(DyingPool(deaths=MAX_TRIES), log=log)
    assert {w: (t.tasks, t.retried, t.failed) for w, t in log.workers.items()} == {
        "pid 1 on node-a": (0, 1, 0), "pid 2 on node-a": (0, 1, 0),
        "pid 3 on node-a": (0, 0, 1)}
    assert "" not in log.workers


def test_a_part_task_that_kept_killing_workers_fails_its_parts_retryably():
    sent, _ = send(DyingPool(deaths=MAX_TRIES))
    assert all(isinstance(s.error, Transient) and "died" in str(s.error) for s in sent)


def test_a_part_task_whose_worker_died_while_stopping_is_left_to_the_next_run():
    stop = asyncio.Event()
    sent, workers = send(DyingPool(deaths=1, stop=stop), stop)
    assert all(isinstance(s.error, Interrupted) for s in sent) and workers.tasks_retried == 0
