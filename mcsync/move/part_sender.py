"""The mover of parts whose bytes pass through the client, for one object: a ranged GET then
UploadPart (or, into a file, the range streamed in as it arrives), every chunk hashed on the
way. The driver's process runs it (``transfer``), and so does a worker sent part tasks
(``part_tasks``): both record the same block hashes, chunk for chunk.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from typing import cast

from .. import checksums
from ..delta.match import Part
from ..errors import IntegrityError
from ..hashing import chunk_digests_async
from ..limits import Limits
from ..records import WrittenPart
from ..stores.base import FileUpload, RangeStreamer, ReadsInto, ReadStore, Upload, has
from ..streaming import drain_into
from ..types import Buffer, ByteRange, ObjectInfo, PartRef


class PartSender:
    """Moves the parts whose bytes pass through the client, for one object: a ranged GET then
    UploadPart, or, into a file, the range streamed in as it arrives (one worker thread per
    part in flight: a streamed part holds its thread until done). Hashes every chunk; checks a
    GCS source's CRC32C over the whole object before Complete."""

    def __init__(self, store: ReadStore, key: str, src: ObjectInfo,
                 cut_digests: list[bytes] | None, limits: Limits, *, streams: bool,
                 check_crc: bool, threads: int) -> None:
        self.store = store
        self.key = key
        self.src = src
        self.cut_digests = cut_digests
        self.limits = limits
        self.streams = streams
        self._range_streamer = has(store, RangeStreamer)
        self._reads_into = has(store, ReadsInto)
        self.check_crc = check_crc
        self.n_parts = 0
        self._crcs: dict[int, tuple[int, int]] = {}
        self._threads = threads
        self._pool: ThreadPoolExecutor | None = None

    async def __call__(self, spec: Part, upload: Upload) -> WrittenPart:
        rng = spec.rng
        chunks = list(spec.chunks or (rng,))
        # One request slot from read to acknowledgement: a part read ahead of a free slot to
        # send it would only hold memory.
        async with self.limits.requests:
            if self.streams and self._range_streamer and has(upload, FileUpload):
                # Into the hidden file as the bytes arrive; a part failing a check is never
                # journalled, so never completed.
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(self._threads, "mcsync-stream")
                into = cast(FileUpload, upload)
                body = await cast(RangeStreamer, self.store).open_range(self.key, rng,
                                                                       expect=self.src)
                pieces = await asyncio.get_running_loop().run_in_executor(
                    self._pool, drain_into, body, into, rng, chunks)
                self._check_second_read(spec, pieces)
                ref = into.part_written(spec.number, rng.length)
            elif self._reads_into:  # into a buffer of the run's, reused
                with self.limits.buffers.lent(rng.length) as buf:
                    data: Buffer = await cast(ReadsInto, self.store).read_into(
                        self.key, rng, buf, expect=self.src)
                    ref, pieces = await self._send(spec, upload, data, chunks)
                    del data
            else:
                data = await self.store.get(self.key, rng, expect=self.src)
                ref, pieces = await self._send(spec, upload, data, chunks)
                del data
        return WrittenPart.of(ref, pieces)

    async def _send(self, spec: Part, upload: Upload, data: Buffer,
                    chunks: list[ByteRange]) -> tuple[PartRef, list[bytes]]:
        """Hash a part read whole, check it, and send it."""
        pieces = await chunk_digests_async(data, spec.rng.start, chunks)
        self._check_second_read(spec, pieces)
        crc = None
        if self.check_crc:  # summed once: the target's checksum header is this one too
            crc = await checksums.crc32c_async(data)
            self._crcs[spec.number] = (crc, len(data))
        return await upload.put_part(spec.number, spec.rng.start, data, crc32c=crc), pieces

    def _check_second_read(self, spec: Part, pieces: list[bytes]) -> None:
        """Cutting by content read these bytes once already: a second read that hashes
        differently is never sent."""
        first = spec.first_chunk
        if self.cut_digests is not None and first is not None and (
                pieces != self.cut_digests[first:first + len(pieces)]):
            raise IntegrityError(f"{self.store.url}{self.key}: bytes {spec.rng.start}-"
                                 f"{spec.rng.end} read differently twice")

    def crc_of(self, number: int) -> tuple[int, int] | None:
        """Part ``number``'s CRC32C and length, when it was summed (a worker sends it back)."""
        return self._crcs.get(number)

    def took_crc(self, number: int, crc: tuple[int, int]) -> None:
        """Part ``number`` was read elsewhere (a worker): its CRC32C, for ``verify``."""
        self._crcs[number] = crc

    async def verify(self) -> None:
        """Before Complete: the parts' CRC32Cs, combined, are the source's (when every part
        was read by this run; parts kept from a killed one were checked by none)."""
        if not self.check_crc or len(self._crcs) != self.n_parts:
            return
        crcs = [self._crcs[n] for n in sorted(self._crcs)]
        checksums.verify(self.src.crc32c, checksums.combine_parts(crcs),
                         f"{self.store.url}{self.key}")

    def close(self) -> None:
        if self._pool is not None:  # a thread still draining a cancelled part ends with it
            self._pool.shutdown(wait=False)
