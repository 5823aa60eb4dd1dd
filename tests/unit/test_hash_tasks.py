"""Hash tasks, the pure parts: an object read and hashed in byte ranges by workers gives the
chunks and digests one sequential read gives — fixed chunks, and content-defined chunks cut
range by range and met again at the ranges' edges — with the driver reading only what it must
to meet them; a failed job fails the scan; the CRC32C of a source that keeps one is checked."""

from __future__ import annotations

import asyncio
import dataclasses
import random
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from mcsync import checksums
from mcsync.chunking import CDC_MAX, fixed_chunks
from mcsync.errors import IntegrityError, PreconditionFailed
from mcsync.limits import Limits
from mcsync.move.hash_tasks import HashDone, HashJob, RemoteScan, WorkerHashes
from mcsync.stores.local import LocalStore
from mcsync.types import ByteRange, ObjectInfo

MiB = 1 << 20


def limits() -> Limits:
    return Limits(8, 512 * MiB)


@dataclass
class Tasks:
    """A ``HashTasks`` that runs each job as a worker does, on its own view of the store."""

    store: LocalStore
    size: int = 2
    task_bytes: int = 16 * MiB
    sent: list[HashJob] = field(default_factory=list)
    fail: BaseException | None = None

    async def send_hashes(self, jobs: list[HashJob]) -> list[HashDone]:
        self.sent.extend(jobs)
        if self.fail is not None:
            return [HashDone(error=self.fail) for _ in jobs]
        worker = WorkerHashes(self.store, limits())
        return [await worker.run(j) for j in jobs]


class Counted:
    """The driver's view of the source: counts the bytes it reads."""

    def __init__(self, store: LocalStore) -> None:
        self.store = store
        self.url = store.url
        self.read = 0

    async def get(self, key, rng=None, *, expect=None):
        data = await self.store.get(key, rng, expect=expect)
        self.read += len(data)
        return data


def source(tmp_path: Path, data: bytes, *, crc: bool = False) -> tuple[LocalStore, ObjectInfo]:
    (tmp_path / "f.bin").write_bytes(data)
    store = LocalStore(tmp_path)
    info = asyncio.run(store.head("f.bin"))
    if crc:
        info = dataclasses.replace(info, crc32c=checksums.to_base64(checksums.crc32c(data)))
    return store, info


def sequential_cdc(store: LocalStore, info: ObjectInfo):
    from mcsync.delta.read import scan_cdc

    return asyncio.run(scan_cdc(store, info, limits()))


def data_of(kind: str, seed: int, size: int) -> bytes:
    rnd = random.Random(seed)
    if kind == "random":
        return rnd.randbytes(size)
    # Runs of zeros, where FastCDC cuts at its maximum from wherever it starts: ranges whose
    # edges are not a multiple of it never meet the sequential cut there by themselves.
    out = bytearray()
    while len(out) < size:
        out += rnd.randbytes(rnd.randrange(1, 6 * MiB)) + bytes(rnd.randrange(1, 30 * MiB))
    return bytes(out[:size])


@pytest.mark.parametrize(("kind", "seed", "size", "job"), [
    ("random", 1, 41 * MiB + 77, 16 * MiB),
    ("random", 2, 64 * MiB, 17 * MiB + 3),
    ("random", 3, 70 * MiB + 5, 23 * MiB),
    ("zeros", 4, 72 * MiB + 11, 16 * MiB),
    ("zeros", 5, 90 * MiB, 19 * MiB + 1),
])
def test_cdc_in_ranges_cuts_as_one_pass_does(tmp_path, kind, seed, size, job):
    data = data_of(kind, seed, size)
    store, info = source(tmp_path, data, crc=True)
    tasks = Tasks(store, task_bytes=job)
    driver = Counted(store)
    scan = RemoteScan(tasks, driver, limits())  # type: ignore[arg-type]
    chunks, digests = asyncio.run(scan.cdc(info))
    assert (chunks, digests) == sequential_cdc(store, info)
    assert len(tasks.sent) == -(-size // job) >= 2  # every range went to a worker
    if kind == "random":  # met within the overlap, or a few small reads past it
        assert driver.read <= (len(tasks.sent) - 1) * CDC_MAX
    else:
        assert driver.read > 0  # it had to cut to meet some edge itself


def test_a_cdc_range_never_met_is_cut_by_the_driver(tmp_path):
    """All zeros: no range's cuts ever meet the sequential ones (cut at the maximum from a
    start that is not a multiple of it); the driver cuts it all, and the result still holds."""
    data = bytes(40 * MiB + 3)
    store, info = source(tmp_path, data)
    driver = Counted(store)
    scan = RemoteScan(Tasks(store, task_bytes=16 * MiB + 5), driver, limits())  # type: ignore[arg-type]
    assert asyncio.run(scan.cdc(info)) == sequential_cdc(store, info)
    # From the first range's last cut (its end + the overlap, + at most a chunk) to the end.
    assert driver.read >= len(data) - (16 * MiB + 5) - 2 * CDC_MAX


@pytest.mark.parametrize(("block", "job"), [(1 * MiB, 4 * MiB), (3 * MiB + 1, 5 * MiB),
                                            (512 * 1024, 7 * MiB + 3)])
def test_fixed_chunks_in_ranges_hash_as_one_read_does(tmp_path, block, job):
    from mcsync.delta.read import scan_chunks

    data = random.Random(block).randbytes(30 * MiB + 17)
    store, info = source(tmp_path, data, crc=True)
    chunks = fixed_chunks(len(data), block)
    tasks = Tasks(store, task_bytes=job)
    driver = Counted(store)
    scan = RemoteScan(tasks, driver, limits())  # type: ignore[arg-type]
    found = asyncio.run(scan.chunks(info, chunks, 2 * MiB))
    assert found == asyncio.run(scan_chunks(store, info, chunks, 2 * MiB, limits()))
    assert driver.read == 0 and len(tasks.sent) >= 2
    # Whole chunks per job, back to back, covering the object once.
    assert [c for j in tasks.sent for c in j.chunks] == chunks
    assert all(j.rng == ByteRange(j.chunks[0].start, j.chunks[-1].end) for j in tasks.sent)


def test_a_small_object_is_hashed_by_the_driver(tmp_path):
    data = random.Random(9).randbytes(3 * MiB)
    store, info = source(tmp_path, data)
    tasks = Tasks(store, task_bytes=16 * MiB)
    scan = RemoteScan(tasks, store, limits())
    asyncio.run(scan.chunks(info, fixed_chunks(len(data), MiB), MiB))
    asyncio.run(scan.cdc(info))
    assert tasks.sent == []


def test_a_crc_that_does_not_match_fails_the_scan(tmp_path):
    data = random.Random(5).randbytes(20 * MiB)
    store, info = source(tmp_path, data)
    info = dataclasses.replace(info, crc32c=checksums.to_base64(checksums.crc32c(b"other")))
    scan = RemoteScan(Tasks(store, task_bytes=4 * MiB), store, limits())
    with pytest.raises(IntegrityError):
        asyncio.run(scan.chunks(info, fixed_chunks(len(data), MiB), MiB))
    with pytest.raises(IntegrityError):
        asyncio.run(RemoteScan(Tasks(store, task_bytes=4 * MiB), store, limits()).cdc(info))


def test_a_failed_job_fails_the_scan_with_its_error(tmp_path):
    data = random.Random(6).randbytes(20 * MiB)
    store, info = source(tmp_path, data)
    tasks = Tasks(store, task_bytes=4 * MiB, fail=PreconditionFailed("changed"))
    with pytest.raises(PreconditionFailed):
        asyncio.run(RemoteScan(tasks, store, limits()).chunks(
            info, fixed_chunks(len(data), MiB), MiB))


def test_a_worker_reads_pinned_to_the_listed_version(tmp_path):
    data = random.Random(7).randbytes(4 * MiB)
    store, info = source(tmp_path, data)
    (tmp_path / "f.bin").write_bytes(data[::-1])  # changed since listed
    done = asyncio.run(WorkerHashes(store, limits()).run(HashJob(
        "f.bin", info, ByteRange(0, MiB), (ByteRange(0, MiB),), MiB)))
    assert isinstance(done.error, PreconditionFailed) and done.digests == ()
    cdc = asyncio.run(WorkerHashes(store, limits()).run(HashJob(
        "f.bin", info, ByteRange(0, 2 * CDC_MAX), (), 0, cdc=True)))
    assert isinstance(cdc.error, PreconditionFailed)


class DyingPool:
    """A pool whose first ``deaths`` tries lose their worker (killed, or past the deadline),
    the next answers every hash job."""

    size = 2

    def __init__(self, deaths: int, stop: asyncio.Event | None = None,
                 raises: BaseException | None = None) -> None:
        self.deaths = deaths
        self.stop = stop
        self.raises = raises
        self.runs = 0
        self.deadlines: list[float | None] = []

    async def run(self, items, *, deadline_s=None):
        from mcsync.scale.worker_runner import TaskResult, WorkerLost

        self.runs += 1
        self.deadlines.append(deadline_s)
        if self.raises is not None:
            raise self.raises
        if self.runs <= self.deaths:
            if self.stop is not None:
                self.stop.set()
            raise WorkerLost("killed at its deadline", f"pid {self.runs} on node-a")
        return TaskResult([HashDone(j.chunks, tuple(b"d" * 16 for _ in j.chunks))
                           for j in items], [], 0, 0, 0, "pid 9 on node-b")

    async def aclose(self, *, wait: bool) -> None:
        pass


def hashed(pool: DyingPool, stop: asyncio.Event | None = None):
    from mcsync.config import SyncOptions
    from mcsync.scale.workers import Workers

    info = ObjectInfo("big.bin", 8 * MiB, "etag", 1.0)
    job = HashJob("big.bin", info, ByteRange(0, 8 * MiB), tuple(fixed_chunks(8 * MiB, MiB)),
                  MiB)

    async def go():
        workers = Workers(pool, SyncOptions(), lambda event: None, stop or asyncio.Event())
        return await workers.send_hashes([job]), workers

    return asyncio.run(go())


def test_a_hash_task_whose_worker_died_goes_to_another_and_is_named():
    (done,), workers = hashed(DyingPool(deaths=1))
    assert done.error is None and len(done.digests) == 8
    assert workers.tasks_retried == 1
    assert workers.retried == [
        "task 1 (hashing big.bin from byte 0 to 8388608): killed at its deadline; run again"]


def test_a_hash_task_has_a_deadline_and_fails_retryably_after_its_tries():
    from mcsync.errors import Transient
    from mcsync.scale.workers import MAX_TRIES

    pool = DyingPool(deaths=MAX_TRIES)
    (done,), _ = hashed(pool)
    assert isinstance(done.error, Transient) and "died" in str(done.error)
    assert pool.runs == MAX_TRIES and all(d is not None and d >= 60 for d in pool.deadlines)


def test_a_hash_task_cut_off_by_a_stop_is_left_to_the_next_run():
    from mcsync.errors import Interrupted

    stop = asyncio.Event()
    (done,), workers = hashed(DyingPool(deaths=1, stop=stop), stop)
    assert isinstance(done.error, Interrupted) and workers.tasks_retried == 0


def test_a_hash_task_that_raised_fails_with_its_cause():
    from mcsync.scale.worker_runner import TaskFailed

    (done,), _ = hashed(DyingPool(deaths=0, raises=TaskFailed("ValueError: boom")))
    assert done.error is not None and "boom" in str(done.error)
