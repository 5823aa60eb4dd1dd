"""A file of the node cache opened for reading while it may still be filling.

The bytes of a part are read once the index records the part (its bytes are on disk:
fdatasync came first), or, where this process fills it, as its pieces are written: a reader
never sees a byte the filler has not written, and reads the object front to back as it
lands instead of waiting for the whole of it. The
file descriptor is the partial file's inode, which the filler renames into place: it stays
valid. An entry dropped while read (its source changed, so its bytes are of a version no
longer current) ends the read with an error rather than a mix of versions.
"""

from __future__ import annotations

import concurrent.futures
import fcntl
import io
import os
import time
from collections.abc import Callable
from typing import Any

from .index import Entry, Index

POLL_S = 0.002


class FillingReader(io.RawIOBase):
    """Raw binary reads of ``entry`` through ``fd`` (which it owns and closes)."""

    def __init__(self, fd: int, entry: Entry, index: Index,
                 filling: concurrent.futures.Future[Any] | None,
                 landed: Callable[[int], int] = lambda part: 0) -> None:
        super().__init__()
        self._fd = fd
        self._entry = entry
        self._index = index
        self._filling = filling
        self._landed = landed  # bytes of a part this process's filler wrote so far
        self._pos = 0
        self._done: set[int] = set()
        self._complete = entry.state == "complete"
        self.name = entry.url

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._entry.size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def tell(self) -> int:
        return self._pos

    def fileno(self) -> int:
        return self._fd

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        size = self._entry.size
        if self._pos >= size or not len(view):
            if self._pos >= size and not self._complete and self._filling is not None:
                self._wait_for_the_fill()
            return 0
        end = size if self._complete else self._available()
        want = min(len(view), end - self._pos)
        got = os.preadv(self._fd, [view[:want]], self._pos)
        self._pos += got
        return got

    def _wait_for_the_fill(self) -> None:
        """The end of an entry this process fills is its end once the fill has committed it:
        a reader that had every piece as it landed and then closed the cache would otherwise
        cancel the fill's last fdatasync and commit, and other processes fetch its unrecorded
        parts again."""
        assert self._filling is not None
        try:
            self._filling.result()
        except Exception as exc:
            raise OSError(f"{self._entry.url}: filling failed: {exc}") from exc
        fcntl.flock(self._fd, fcntl.LOCK_SH)  # held against eviction as any open entry
        self._complete = True

    def _available(self) -> int:
        """Where the bytes readable now from the position end (beyond it), waiting for one."""
        part_size = self._entry.part_size
        part = self._pos // part_size
        start = part * part_size
        whole = min(self._entry.size, start + part_size)
        while True:
            if part in self._done:
                return whole
            landed = start + self._landed(part)
            if landed > self._pos:
                return landed
            now = self._index.get(self._entry.id)
            if now is None:
                raise OSError(f"{self._entry.url}: dropped while it was read (its source "
                              "changed, or it could not be filled); open it again")
            if now.state == "complete":
                # From here its bytes are whole: held as any open entry is, against eviction.
                fcntl.flock(self._fd, fcntl.LOCK_SH)
                self._complete = True
                return self._entry.size
            self._done = set(self._index.parts_done(self._entry.id))
            if part in self._done:
                return whole
            if self._filling is not None and self._filling.done():
                exc = self._filling.exception()
                if exc is not None:
                    raise OSError(f"{self._entry.url}: filling failed: {exc}") from exc
            time.sleep(POLL_S)

    def close(self) -> None:
        if not self.closed:
            os.close(self._fd)
        super().close()
