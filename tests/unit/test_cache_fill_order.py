"""The order in which a cache fill fetches an entry's parts: the first missing part alone
until its body has arrived (a reader's header and first tensors are there), then the rest
started in file order, more than one in flight but never more than ``concurrency``; the
bytes and digest as before. Observed through a store that logs when each range is opened
and when its body has been read to the end."""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import xxhash

from mcsync.cache import Cache
from mcsync.cache.fill import fill, part_range
from mcsync.hashing import object_digest
from mcsync.retry import RetryPolicy
from mcsync.types import ByteRange, ObjectInfo

PART = 64 * 1024


class LoggingStore:
    """A range streamer over ``data``: ``("open", part)`` when a range is requested,
    ``("end", part)`` once its body has been read whole. The body of each part after
    ``first`` (but the last) ends only once the next part has been requested: a fill that
    never has two parts in flight leaves it waiting (``stuck``)."""

    def __init__(self, data: bytes, first: int) -> None:
        self.data = data
        self.first = first
        self.last = (len(data) - 1) // PART
        self.log: list[tuple[str, int]] = []
        self.opened = {n: threading.Event() for n in range(self.last + 1)}
        self.stuck: list[int] = []
        self._lock = threading.Lock()

    def _note(self, what: str, rng: ByteRange) -> None:
        with self._lock:
            self.log.append((what, rng.start // PART))

    async def open_range(self, key: str, rng: ByteRange, *, expect: ObjectInfo | None = None,
                         ) -> Iterator[bytes]:
        self._note("open", rng)
        number = rng.start // PART
        self.opened[number].set()
        await asyncio.sleep(0)

        def body() -> Iterator[bytes]:
            for at in range(rng.start, rng.end, 8192):
                yield self.data[at:min(rng.end, at + 8192)]
            if self.first < number < self.last and not self.opened[number + 1].wait(30):
                self.stuck.append(number)  # a guard against a hang, not a timing
            self._note("end", rng)

        return body()

    async def get(self, key: str, rng: ByteRange, *, expect: ObjectInfo | None = None,
                  ) -> bytes:
        raise AssertionError("a range streamer is read by open_range")


def _check_order(log: list[tuple[str, int]], parts: list[int], concurrency: int) -> None:
    assert log[:2] == [("open", parts[0]), ("end", parts[0])], log[:4]
    assert [n for what, n in log if what == "open"] == parts  # file order, each once
    in_flight = most = 0
    for what, _ in log:
        in_flight += 1 if what == "open" else -1
        most = max(most, in_flight)
        assert 0 <= in_flight <= concurrency
    assert most >= 2  # the ramp opens up after the first part


@pytest.mark.parametrize("done_before", [0, 3])
def test_first_missing_part_alone_then_file_order(tmp_path: Path, done_before: int) -> None:
    data = os.urandom(20 * PART + 123)
    store = LoggingStore(data, done_before)
    with Cache(tmp_path / "c") as cache:
        got = cache.room.reserve("s3://b/k", ObjectInfo("k", len(data), etag="e"), PART,
                                 order=None, touches=cache.recency.take())
        assert got is not None
        entry, fd = got.entry, got.fd
        for n in range(done_before):  # a fill a killed filler left: these parts on disk
            rng = part_range(entry, n)
            os.pwrite(fd, data[rng.start:rng.end], rng.start)
            cache.index.part_done(entry.id, n, xxhash.xxh3_128_digest(data[rng.start:rng.end]))
        digest = asyncio.run(fill(store, "k", entry, fd, cache.index, cache.layout,
                                  concurrency=4, policy=RetryPolicy.immediate(2)))
        os.close(fd)
        assert not store.stuck
        _check_order(store.log, list(range(done_before, entry.parts)), 4)
        want = object_digest([xxhash.xxh3_128_digest(data[r.start:r.end])
                              for r in (part_range(entry, n) for n in range(entry.parts))])
        assert digest == want
        assert cache.layout.object(entry.id).read_bytes() == data
