"""What one process keeps of the node cache in memory: the paths it holds, and the recency of
its hits not yet written to the index.

**Holds.** A path handed out by ``Cache.path`` is held: this process keeps a descriptor of the
entry's file with ``LOCK_SH`` on it (``files.py``), and eviction, which needs ``LOCK_EX``,
passes the entry over in every process. A hold is implicit (``path()``) or explicit
(``with cache.held(url)``). Implicit holds are bounded (``max_held``, the newest kept): the
oldest is released when one more is taken, and when this process's own fill finds no room
the oldest implicit holds go first, before it waits for other processes or fails. An explicit
hold lasts until its ``with`` block ends. ``release(url)`` and ``close()`` release.

**Recency.** A hit writes nothing: its time (and a validation's) is kept here and written in
one transaction a second or so later, or in the next reservation's own transaction, so hits
in many processes do not queue for SQLite's one writer.
"""

from __future__ import annotations

import os
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass

from .index import Entry

MAX_HELD = 64  # implicit holds one process keeps (the newest)


@dataclass(slots=True)
class Hold:
    entry: Entry
    fd: int  # holds LOCK_SH on the entry's file
    implicit: bool = False
    explicit: int = 0  # ``held()`` blocks open on it


class Holds:
    """The entries this process holds, by URL (thread-safe)."""

    def __init__(self, max_held: int = MAX_HELD) -> None:
        self.max_held = max(1, max_held)
        self._by_url: OrderedDict[str, Hold] = OrderedDict()  # oldest use first
        self._implicit = 0  # holds with ``implicit`` set
        self._lock = threading.Lock()

    def get(self, url: str) -> Hold | None:
        with self._lock:
            hold = self._by_url.get(url)
            if hold is not None:
                self._by_url.move_to_end(url)
            return hold

    def add(self, url: str, entry: Entry, fd: int | None, *, explicit: bool) -> bool:
        """Hold ``entry`` (through ``fd``, whose lock is the hold) for ``url``; a hold of
        another version of ``url`` is replaced, a hold of the same one keeps its descriptor.
        ``fd`` None: one more hold of what is held already; False when it no longer is."""
        spare: list[int] = []
        with self._lock:
            hold = self._by_url.get(url)
            if fd is None:
                if hold is None or hold.entry.id != entry.id:
                    return False
            elif hold is not None and hold.entry.id == entry.id:
                spare.append(fd)
            else:
                if hold is not None:
                    spare.append(hold.fd)
                replaced = hold
                hold = Hold(entry, fd) if replaced is None else Hold(
                    entry, fd, replaced.implicit, replaced.explicit)
                self._by_url[url] = hold
            self._by_url.move_to_end(url)
            if explicit:
                hold.explicit += 1
            elif not hold.implicit:
                hold.implicit = True
                self._implicit += 1
            if self._implicit > self.max_held:
                spare.extend(self._trim())
        for f in spare:
            os.close(f)
        return True

    def _trim(self) -> list[int]:
        """Implicit holds over the bound released, oldest first."""
        over = self._implicit - self.max_held
        oldest: list[str] = []
        for url, hold in self._by_url.items():
            if len(oldest) >= over:
                break
            if hold.implicit:
                oldest.append(url)
        freed = []
        for url in oldest:
            freed.extend(self._let_go(url, implicit=True))
        return freed

    def _let_go(self, url: str, *, implicit: bool) -> list[int]:
        hold = self._by_url.get(url)
        if hold is None:
            return []
        if implicit:
            if hold.implicit:
                self._implicit -= 1
            hold.implicit = False
        elif hold.explicit:
            hold.explicit -= 1
        if hold.implicit or hold.explicit:
            return []
        del self._by_url[url]
        return [hold.fd]

    def release(self, url: str, *, explicit: bool = False) -> bool:
        """Release ``url``'s implicit hold (``explicit``: one ``held()`` block's); whether
        its entry is no longer held here."""
        with self._lock:
            freed = self._let_go(url, implicit=not explicit)
        for f in freed:
            os.close(f)
        return bool(freed)

    def release_oldest_implicit(self) -> bool:
        """Release the oldest implicit hold; False when there is none."""
        with self._lock:
            for url, hold in self._by_url.items():
                if hold.implicit:
                    freed = self._let_go(url, implicit=True)
                    break
            else:
                return False
        for f in freed:
            os.close(f)
        return True

    def descriptors(self) -> list[int]:
        """Every held descriptor, read without the lock (in a forked child, where another
        thread of the parent may have held it)."""
        return [h.fd for h in list(self._by_url.values())]

    def __len__(self) -> int:
        return len(self._by_url)

    def close(self) -> None:
        """Release every hold (closing the cache; or a forked child's copies of its parent's
        descriptors, whose locks stay the parent's)."""
        with self._lock:
            fds = [h.fd for h in self._by_url.values()]
            self._by_url.clear()
            self._implicit = 0
        for f in fds:
            os.close(f)


class Recency:
    """Hits not yet written to the index: entry id → (last use, last validation or None)."""

    FLUSH_S = 1.0

    def __init__(self) -> None:
        self._pending: dict[int, tuple[float, float | None]] = {}
        self._lock = threading.Lock()

    def touch(self, entry_id: int, *, checked: bool) -> None:
        now = time.time()
        with self._lock:
            _, was = self._pending.get(entry_id, (0.0, None))
            self._pending[entry_id] = (now, now if checked else was)

    def checked_at(self, entry: Entry) -> float:
        """When ``entry`` was last validated, this process's latest word included."""
        with self._lock:
            pending = self._pending.get(entry.id)
        return max(entry.checked_at, pending[1] or 0.0) if pending else entry.checked_at

    def take(self) -> dict[int, tuple[float, float | None]]:
        with self._lock:
            taken, self._pending = self._pending, {}
        return taken

    def restore(self, taken: dict[int, tuple[float, float | None]]) -> None:
        """Put back what a transaction that failed did not write (newer touches win)."""
        with self._lock:
            for entry_id, value in taken.items():
                self._pending.setdefault(entry_id, value)
