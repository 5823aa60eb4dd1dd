"""The hashing read of a large object split across workers by byte ranges (``--workers``): what
the block delta (and a content-defined cut) reads whole to find what changed. A worker reads
its range, pinned to the listed version, and returns the chunks' xxh3 digests, never the
bytes; the driver puts them in order and plans as it would have alone (``delta.read.Scan``).

Fixed blocks (and a safetensors file's tensor pieces) are cut before any byte is read: each
job is a run of whole chunks, independent of the others. Content-defined chunks are not: a
boundary depends on the bytes since the previous one. Each worker cuts its range from its
start (taken for a boundary) up to the first cut ``OVERLAP`` past its end. Cutting from a true
boundary gives the true cuts that follow, so the driver, holding the true cuts up to some
point ``p`` past the next range's start, takes that range's cuts from ``p`` on when ``p`` is one
of them: a cut from an arbitrary start meets the true ones within a chunk or two on most data,
well inside the overlap. When it is not, the driver cuts from ``p`` itself, in small reads,
until its cuts meet the range's (on data where they never meet, long runs of zeros cut at the
maximum, it cuts the range whole). The result is the one sequential cut, chunk for chunk.

A job is retried, timed out and failed like any part task (``workers.Workers``); its errors
come back as values and fail the object, which nothing was written for yet: a stop or a
failure leaves nothing to resume but the object's copy, which the next run makes.
"""

from __future__ import annotations

import asyncio
import itertools
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from .. import checksums
from ..chunking import CDC_AVG, CDC_MAX, group_parts
from ..delta.read import cdc_from, covers, scan_cdc, scan_chunks, scan_span
from ..errors import IntegrityError, first_error
from ..limits import Limits
from ..stores.base import ReadStore
from ..types import ByteRange, ObjectInfo
from .part_tasks import PartTasks, portable

# Jobs of one object in flight per worker: one read and hashed while the next is sent.
JOBS_PER_WORKER = 2
# A content-defined range is cut this far past its end, where the next range's cuts have met
# the true ones (a few average chunks), so the driver reads nothing to join them.
OVERLAP = CDC_MAX


@dataclass(frozen=True, slots=True)
class HashJob:
    """A byte range of an object for a worker to read and hash: the key, the version every
    read is pinned to, the range, and either its chunks (fixed) or ``cdc`` (cut it from
    ``rng.start`` to the first boundary at or past ``rng.end``); ``crc``: return the range's
    CRC32C, for the driver's check of a source that keeps one."""

    key: str
    src: ObjectInfo
    rng: ByteRange
    chunks: tuple[ByteRange, ...]
    read_size: int
    cdc: bool = False
    crc: bool = False

    @property
    def size(self) -> int:
        return self.rng.length + (OVERLAP + CDC_MAX if self.cdc else 0)


@dataclass(frozen=True, slots=True)
class HashDone:
    """What came of a hash job: the chunks (those of a ``cdc`` cut; else the job's own) and
    their digests, the range's CRC32C and length (when asked), or the error; who read it."""

    chunks: tuple[ByteRange, ...] = ()
    digests: tuple[bytes, ...] = ()
    crc: tuple[int, int] | None = None
    error: BaseException | None = None
    worker: str = ""


class HashTasks(Protocol):
    """Where hash jobs run (``workers.Workers``): one task each, retried when its worker died."""

    size: int  # workers
    task_bytes: int

    async def send_hashes(self, jobs: list[HashJob]) -> list[HashDone]: ...


class WorkerTasks(PartTasks, HashTasks, Protocol):
    """Workers that take part tasks and hash tasks (``workers.Workers``)."""


class RemoteScan:
    """A ``delta.read.Scan`` whose reads run on workers, in jobs of ``job_bytes``; an object
    of fewer than two jobs is read here, where it costs less than a task."""

    def __init__(self, tasks: HashTasks, src: ReadStore, limits: Limits,
                 job_bytes: int | None = None) -> None:
        self.tasks = tasks
        self.src = src
        self.limits = limits
        self.job_bytes = job_bytes or tasks.task_bytes

    async def chunks(self, info: ObjectInfo, chunks: list[ByteRange],
                     read_size: int) -> list[bytes]:
        back_to_back = all(a.end == b.start for a, b in itertools.pairwise(chunks))
        if not back_to_back or sum(c.length for c in chunks) < 2 * self.job_bytes:
            return await scan_chunks(self.src, info, chunks, read_size, self.limits)
        crc = info.crc32c is not None and covers(info, chunks)
        jobs = [HashJob(info.key, info, ByteRange(chunks[a].start, chunks[b - 1].end),
                        tuple(chunks[a:b]), read_size, crc=crc)
                for a, b in group_parts(chunks, self.job_bytes)]
        done = await self._run(jobs)
        digests = [d for r in done for d in r.digests]
        if len(digests) != len(chunks):
            raise IntegrityError(f"{info.key}: {len(digests)} digests for {len(chunks)} chunks")
        if crc:
            self._verify(info, done)
        return digests

    async def cdc(self, info: ObjectInfo) -> tuple[list[ByteRange], list[bytes]]:
        step = max(self.job_bytes, 2 * CDC_MAX)
        if info.size < 2 * step:
            return await scan_cdc(self.src, info, self.limits)
        jobs = [HashJob(info.key, info, ByteRange(at, min(at + step, info.size)), (), 0,
                        cdc=True, crc=info.crc32c is not None)
                for at in range(0, info.size, step)]
        done = await self._run(jobs)
        if info.crc32c is not None:
            self._verify(info, done)
        chunks: list[ByteRange] = []
        digests: list[bytes] = []
        p = 0  # the true cuts are known up to here
        for r in done:
            if not r.chunks or p >= r.chunks[-1].end:
                continue  # the driver's own cut covered this range
            starts = {c.start: i for i, c in enumerate(r.chunks)}
            if p not in starts:  # not met yet: cut from p until the cuts meet the range's
                own, own_digests = await self._meet(info, p, starts, r.chunks[-1].end)
                chunks += own
                digests += own_digests
                p = chunks[-1].end
                if p not in starts:
                    continue
            i = starts[p]
            chunks += r.chunks[i:]
            digests += r.digests[i:]
            p = chunks[-1].end
        if p != info.size:
            raise IntegrityError(f"{info.key}: content-defined cut ended at {p} of {info.size}")
        return chunks, digests

    async def _meet(self, info: ObjectInfo, p: int, starts: dict[int, int],
                    last: int) -> tuple[list[ByteRange], list[bytes]]:
        """Cut here from the true boundary ``p`` until a cut is one of ``starts`` (a range's
        cuts, true from there on) or reaches ``last``; small reads, none ahead."""
        own, digests, _ = await cdc_from(
            self.src, info, self.limits, p, last, window=CDC_AVG,
            done=lambda end: end in starts or end >= last, ahead=False)
        return own, digests

    async def _run(self, jobs: list[HashJob]) -> list[HashDone]:
        """Every job's result, in order; a few per worker in flight. The first error is raised
        once all are back (none is left running)."""
        room = asyncio.Semaphore(max(1, self.tasks.size * JOBS_PER_WORKER))

        async def one(job: HashJob) -> HashDone:
            async with room:
                (done,) = await self.tasks.send_hashes([job])
                return done

        results = await asyncio.gather(*map(one, jobs))
        for r in results:
            if r.error is not None:
                raise r.error
        return list(results)

    def _verify(self, info: ObjectInfo, done: Sequence[HashDone]) -> None:
        crcs = [r.crc for r in done]
        assert all(c is not None for c in crcs)
        checksums.verify(info.crc32c, checksums.combine_parts([c for c in crcs if c]),
                         f"{self.src.url}{info.key}")


class WorkerHashes:
    """A worker's side of hash jobs: the range read pinned and hashed, digests back."""

    def __init__(self, src: ReadStore, limits: Limits) -> None:
        self.src = src
        self.limits = limits
        self.me = f"{os.getpid()}@{os.uname().nodename}"

    async def run(self, job: HashJob) -> HashDone:
        """Every error is in the result, none raised."""
        try:
            if job.cdc:
                end = min(job.rng.end + OVERLAP, job.src.size)
                # Smaller windows than the driver's cut: a worker holds a few jobs at once
                # within its share of the memory budget.
                chunks, digests, crc = await cdc_from(self.src, job.src, self.limits,
                                                      job.rng.start, end, crc_to=job.rng.end,
                                                      window=2 * CDC_MAX)
                span = job.rng.length
                return HashDone(tuple(chunks), tuple(digests),
                                (crc, span) if job.crc else None, None, self.me)
            found, crc_of = await scan_span(self.src, job.src, list(job.chunks), job.read_size,
                                            self.limits, crc=job.crc)
            return HashDone(job.chunks, tuple(found), crc_of, None, self.me)
        except Exception as exc:  # a TaskGroup's group: its first error, as a read raised it
            cause = first_error(exc)
            return HashDone(error=portable(cause if isinstance(cause, Exception) else exc),
                            worker=self.me)
