"""A large object split across workers by parts (``--workers``): the driver opens, journals and
completes the multipart upload (``upload.Uploads``, unchanged), and its parts go to workers as
*part jobs* instead of being read and sent in the driver's process.

The swap is the mover of parts: ``RemoteParts`` stands where ``part_sender.PartSender`` would,
for one upload. It batches the parts ``Uploads`` hands it into part tasks (a few parts of one
upload each, balanced by bytes like whole-object tasks, and small enough that one object's
parts in flight are spread over the workers), sends them by ``PartTasks`` (``workers.Workers``:
the pool and its retry of a task whose worker died), and returns each part's ``WrittenPart`` to
``Uploads``, which journals it and completes the upload when all are in.

A worker (``WorkerParts``) reopens the upload by its id (``Store.resume_upload``, once per
upload while it keeps sending its parts), reads each range pinned to the listed version and
hashes it as the driver would (the same ``PartSender``: the record's block hashes are a
single-process run's), puts the part and returns its receipt, its chunk digests and, for a
source that keeps a CRC32C, the part's CRC for the driver's check before Complete. Errors come
back as values, so one part's failure is the driver's to act on (abort, or a new version).

Which objects: every copy in parts through the client, from the multipart threshold up (not
deltas, not server-side copies in parts: no byte of theirs passes through a client). A larger
threshold would save an object just past it the reopens (S3: a ListParts per worker that takes
a part of it, 4 requests becoming at most 4 + workers) but leave a data set of 10-100 MiB shards
on the driver's one core, which is what workers are for. One object's parts in flight stay
``--part-concurrency`` (and the driver's goodput slots and memory budget, which bound the
parts of all uploads as in one process), spread over the workers. Uploads into files
(``FileTarget``) stay in the driver: a worker's reopened file upload would hold a descriptor
that the ``Upload`` protocol cannot give back but by ``abort``, which deletes the file.

A killed driver takes its workers with it; the same command takes the journalled upload up
and sends only the parts no journal names (those in flight at the kill among them: the server
may hold them already, the journal cannot say).
"""

from __future__ import annotations

import asyncio
import logging
import os
import pickle
from collections import OrderedDict
from dataclasses import dataclass, replace
from typing import Protocol

from ..batching import Batcher
from ..delta.match import Part
from ..errors import MCSyncError, NotFound
from ..limits import Limits
from ..records import WrittenPart
from ..stores.base import ReadStore, Store, Upload
from ..types import ObjectInfo
from .part_sender import PartSender

log = logging.getLogger(__name__)

# A part task not yet full goes after this long: parts come back to the upload's window a
# few at a time, and each waiting part is megabytes idle, while a task costs far less than a
# part takes to send.
LINGER_S = 0.005
KEEP_UPLOADS = 64  # upload handles a worker keeps reopened (S3: one ListParts each)


@dataclass(frozen=True, slots=True)
class PartJob:
    """One part of an upload the driver opened, for a worker to read and send: the object's
    key, the upload's id, the source version every read is pinned to, the part (its number,
    range and the chunks it is hashed in) and, when the driver's cut read the bytes already (a
    content-defined cut), the digests the worker's read must match."""

    key: str
    upload_id: str
    src: ObjectInfo
    part: Part
    expect: tuple[bytes, ...] | None
    check_crc: bool

    @property
    def size(self) -> int:
        return self.part.rng.length


@dataclass(frozen=True, slots=True)
class PartSent:
    """What came of a part job: the target's receipt with its chunk digests, the part's
    CRC32C (when asked), or the error; and which worker process sent it (``pid@host``)."""

    number: int
    written: WrittenPart | None
    crc: tuple[int, int] | None = None
    error: BaseException | None = None
    worker: str = ""


class PartTasks(Protocol):
    """Where part tasks run (``workers.Workers``): ``send_parts`` runs one task of part jobs
    on a worker, another one if its worker died, and returns one ``PartSent`` per job."""

    size: int  # workers
    task_bytes: int

    async def send_parts(self, jobs: list[PartJob]) -> list[PartSent]: ...


def parts_per_task(tasks: PartTasks, n_parts: int, part_size: int, part_concurrency: int) -> int:
    """Parts in one task: up to a task's bytes, but few enough that the parts of one object in
    flight (``part_concurrency``) and its parts in all (``n_parts``) spread over the workers."""
    spread = max(1, min(part_concurrency // tasks.size, -(-n_parts // tasks.size)))
    return max(1, min(tasks.task_bytes // max(part_size, 1), spread))


class RemoteParts:
    """The mover of one upload's parts on workers (a ``upload.MovePart``): parts in, batched
    into part tasks, each part's ``WrittenPart`` out as its task comes back."""

    def __init__(self, tasks: PartTasks, sender: PartSender, per_task: int) -> None:
        self.tasks = tasks
        self.sender = sender
        self.per_task = per_task
        self._batcher: Batcher[PartJob, PartSent] = Batcher(
            self._send, size=lambda job: job.size, max_items=per_task,
            max_size=tasks.task_bytes, linger_s=LINGER_S)

    async def __call__(self, spec: Part, upload: Upload) -> WrittenPart:
        s = self.sender
        expect = None
        if s.cut_digests is not None and spec.first_chunk is not None:
            n = len(spec.chunks) or 1
            expect = tuple(s.cut_digests[spec.first_chunk:spec.first_chunk + n])
        job = PartJob(s.key, upload.upload_id, s.src, spec, expect, s.check_crc)
        sent = await self._batcher.submit(job)
        if sent.error is not None:
            raise sent.error
        assert sent.written is not None
        if sent.crc is not None:
            s.took_crc(spec.number, sent.crc)
        return sent.written

    async def _send(self, jobs: list[PartJob]) -> list[PartSent]:
        results = await self.tasks.send_parts(jobs)
        if results:
            log.debug("%s: parts %s sent by worker %s", jobs[0].key,
                      ", ".join(str(r.number) for r in results), results[0].worker)
        return results

    async def aclose(self) -> None:
        """After the upload: nothing left waiting (a part task of an upload that failed or
        was stopped is not waited for)."""
        await self._batcher.aclose()


class WorkerParts:
    """A worker's side of part jobs: uploads reopened by id and kept for their next parts,
    each part read, hashed and sent as the driver's ``PartSender`` would."""

    def __init__(self, src: ReadStore, dst: Store, limits: Limits) -> None:
        self.src = src
        self.dst = dst
        self.limits = limits
        self._uploads: OrderedDict[str, asyncio.Task[Upload | None]] = OrderedDict()
        self.me = f"{os.getpid()}@{os.uname().nodename}"

    async def send(self, job: PartJob) -> PartSent:
        """Read and send ``job``'s part; every error is in the result, none raised."""
        number = job.part.number
        try:
            upload = await self._upload(job)
            part = job.part
            if job.expect is not None:  # the digests sent are the part's own, from 0
                part = replace(part, first_chunk=0)
            sender = PartSender(self.src, job.key, job.src,
                                list(job.expect) if job.expect is not None else None,
                                self.limits, streams=False, check_crc=job.check_crc, threads=1)
            charge = job.size * (1 + self.dst.caps.send_copies)
            async with self.limits.memory.hold(charge):
                written = await sender(part, upload)
            return PartSent(number, written, sender.crc_of(number), None, self.me)
        except Exception as exc:
            return PartSent(number, None, None, portable(exc), self.me)

    async def _upload(self, job: PartJob) -> Upload:
        opening = self._uploads.get(job.upload_id)
        if opening is None:
            opening = asyncio.ensure_future(self._reopen(job))
            self._uploads[job.upload_id] = opening
            while len(self._uploads) > KEEP_UPLOADS:
                self._uploads.popitem(last=False)
        self._uploads.move_to_end(job.upload_id)
        try:
            upload = await asyncio.shield(opening)
        except BaseException:
            self._uploads.pop(job.upload_id, None)  # tried again by the next part
            raise
        if upload is None:
            self._uploads.pop(job.upload_id, None)
            raise NotFound(f"{self.dst.url}{job.key}: upload {job.upload_id} is no longer "
                           "open (completed or aborted)")
        return upload

    async def _reopen(self, job: PartJob) -> Upload | None:
        async with self.limits.requests:
            return await self.dst.resume_upload(job.key, job.upload_id, job.src.size,
                                                mtime=job.src.mtime)


def portable(exc: Exception) -> BaseException:
    """``exc`` as it can cross to the driver (pickled, its type kept where it can be)."""
    try:
        pickle.loads(pickle.dumps(exc))
    except Exception:
        return MCSyncError(f"{type(exc).__name__}: {exc}")
    return exc
