"""Belady's eviction order over a known order of reads (a warm's ``--order``), built once per
warm: what is never read again goes first (least recently used among it), then what is read
furthest in the future. A max-heap of the order's URLs by next use, popped as reservations
need victims; what a reservation looked at but could not take (open, held, being filled) is
put back. Entries the structure never saw (made by another process meanwhile, not named by the
order) are found by the caller's LRU scan once it is exhausted.
"""

from __future__ import annotations

import heapq
import threading
from collections import deque
from collections.abc import Callable, Iterator, Mapping

from .index import Entry


class NextUse:
    """``next_use``: URL → its next position in the order of reads."""

    def __init__(self, next_use: Mapping[str, int], cached: Callable[[], Iterator[Entry]]
                 ) -> None:
        self.next_use = next_use
        # entries the order never names, least recently used first (the index's order)
        self._never: deque[Entry] = deque(e for e in cached() if e.url not in next_use)
        self._heap = [(-pos, url) for url, pos in next_use.items()]
        heapq.heapify(self._heap)
        self._lock = threading.Lock()

    def candidates(self, entries_of: Callable[[str], list[Entry]],
                   seen: list[tuple[str, Entry | None]]) -> Iterator[Entry]:
        """Victims in Belady's order; each one handed out is noted in ``seen``, for
        ``settle``. Entries named by the order and no longer cached leave the heap."""
        while True:
            with self._lock:
                entry = self._never.popleft() if self._never else None
            if entry is None:
                break
            seen.append(("", entry))
            yield entry
        while True:
            with self._lock:
                if not self._heap:
                    return
                _, url = heapq.heappop(self._heap)
            seen.append((url, None))
            yield from entries_of(url)

    def settle(self, seen: list[tuple[str, Entry | None]], taken: set[int],
               entries_of: Callable[[str], list[Entry]]) -> None:
        """Put back what was handed out and not evicted."""
        with self._lock:
            for url, entry in reversed(seen):
                if entry is not None:
                    if entry.id not in taken:
                        self._never.appendleft(entry)
                elif any(e.id not in taken for e in entries_of(url)):
                    heapq.heappush(self._heap, (-self.next_use[url], url))
