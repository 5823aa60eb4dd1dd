"""The node cache's space, as arithmetic: what an entry is charged, what the index and the
directories cost, and which entries go to make room. Pure: no IO.

Every byte the cache can hold on disk is charged before it is written (``charge``), so the
sum of the charges plus the index and directory overhead is an upper bound of ``du`` of the
cache directory; eviction picks victims from candidates the caller found evictable
(complete, not pinned, not open).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ..types import KiB, MiB

BLOCK = 4 * KiB  # the allocation unit ext4, xfs and btrfs use on common disks
# A file written at offsets in parallel is cut into extents; their tree's blocks count in its
# st_blocks. One block per 32 MiB is far more than a file written in parts of MiB needs.
_EXTENT_SPAN = 32 * MiB
# What the index may grow to between two reservations (a transaction's WAL pages before the
# next checkpoint: wal_autocheckpoint is set low, see index.py), above its size measured now.
INDEX_HEADROOM = 2 * MiB
# The cache's directories (v1, objects, partial) and a directory entry per file, generously.
DIRS = 4 * BLOCK
PER_ENTRY = 128


def charge(size: int) -> int:
    """The most bytes an object of ``size`` bytes occupies on disk, its metadata included."""
    blocks = -(-size // BLOCK) * BLOCK
    return blocks + BLOCK * (1 + size // _EXTENT_SPAN)


def overhead(index_bytes: int, entries: int) -> int:
    """Disk the cache uses besides its entries' data: the index files as measured, room for
    them to grow until the next reservation, the directories."""
    return index_bytes + INDEX_HEADROOM + DIRS + PER_ENTRY * entries


@dataclass(frozen=True, slots=True)
class Candidate:
    """An entry eviction may take: complete, unpinned (and not open: checked by the caller
    when it comes to it, since another process may open it meanwhile)."""

    id: int
    url: str
    charge: int
    last_access: float


def eviction_order(candidates: Sequence[Candidate],
                   next_use: Mapping[str, int] | None = None) -> list[Candidate]:
    """The order to evict in, as a specification: least recently used first; with
    ``next_use`` (a URL → its next position in a known order of reads), Belady's: entries
    never needed again first (least recently used among them), then the one needed furthest in
    the future. A reservation does not sort: ``room`` reads LRU's order from the index a page
    at a time, ``order.NextUse`` keeps Belady's as a heap built once per warm."""
    if next_use is None:
        return sorted(candidates, key=lambda c: (c.last_access, c.id))
    never = [c for c in candidates if c.url not in next_use]
    later = [c for c in candidates if c.url in next_use]
    return (sorted(never, key=lambda c: (c.last_access, c.id))
            + sorted(later, key=lambda c: (-next_use[c.url], c.id)))


@dataclass(frozen=True, slots=True)
class Shortfall:
    """Why a reservation cannot be made: the numbers a CacheFull error gives."""

    need: int  # bytes the new entry is charged
    limit: int
    in_use: int  # charged to entries now
    overhead: int
    freeable: int | None  # what evicting every candidate would free (None: not asked)
    held: str = "held by entries"

    def message(self, what: str) -> str:
        from ..config import format_size

        evictable = ("" if self.freeable is None else f" (of which "
                     f"{format_size(self.freeable)} evictable: the rest pinned, open or "
                     "being filled)")
        return (f"{what}: needs {format_size(self.need)} but the cache's limit is "
                f"{format_size(self.limit)}: {format_size(self.in_use)} {self.held}"
                f"{evictable}, {format_size(self.overhead)} index and directories")


def to_free(limit: int, in_use: int, overhead_bytes: int, need: int) -> int:
    """Bytes to evict before ``need`` more fit (0: they fit now)."""
    return max(0, in_use + overhead_bytes + need - limit)
