"""Parts of an S3 store's listing that send no request themselves: the page its check listed,
kept as the start of the listing that follows, and the directory-by-directory walk for an
endpoint that does not list in byte order.

A run checks its stores, takes its lock, then lists: without the kept page every run would
list the first page of each S3 store twice. The page stands for the start of the listing
once, while fresh, and only while it is exact for what this client wrote: a write of data
drops it, while a write of mcsync's own state (``.mcsync/``, never data: the lock, written
between a run's check and its listing) is entered into it, so the lock costs the run no second
listing.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from ..types import RESERVED_PREFIX


@dataclass
class CheckPage:
    """The first keys under a prefix (full keys, in byte order, as ``list_objects_v2``'s
    ``Contents``). ``rest_after``: the page was full, so the listing goes on after this key
    (None: the page is the whole listing)."""

    entries: list[dict[str, Any]]
    rest_after: str | None
    taken_at: float = field(default_factory=time.monotonic)

    def fresh(self, within_s: float) -> bool:
        return time.monotonic() - self.taken_at < within_s

    def _covers(self, full_key: str) -> bool:
        return self.rest_after is None or full_key <= self.rest_after

    def _index(self, full_key: str) -> int:
        return bisect.bisect_left(self.entries, full_key, key=lambda c: c["Key"])

    def wrote(self, full_key: str, size: int, etag: str | None) -> None:
        """An object this client just wrote: in the page, as a listing would now show it."""
        if not self._covers(full_key):
            return  # beyond the page: the rest of the listing, asked later, holds it
        i = self._index(full_key)
        entry = {"Key": full_key, "Size": size, "ETag": etag, "LastModified": datetime.now(UTC)}
        if i < len(self.entries) and self.entries[i]["Key"] == full_key:
            self.entries[i] = entry
        else:
            self.entries.insert(i, entry)

    def deleted(self, full_key: str) -> None:
        i = self._index(full_key)
        if i < len(self.entries) and self.entries[i]["Key"] == full_key:
            del self.entries[i]


def own_state(key: str) -> bool:
    """A key of mcsync's own state at a target: a write of it leaves a check's page standing."""
    return key.startswith(RESERVED_PREFIX)


async def tree_walk(level_pages: Callable[[str], AsyncIterator[dict[str, Any]]],
                    prefix: str) -> AsyncIterator[dict[str, Any]]:
    """Every object under ``prefix`` in byte order, from ``level_pages(prefix)``: the pages
    (``Contents``, ``CommonPrefixes``) of one level listed with the delimiter "/". A level's
    subdirectories are collected first (a pass that keeps only their names), then its files
    are streamed with each subdirectory walked at its byte-order place. Within one level file
    names hold no '/', so any server's name order is byte order. A level that fits one page
    is listed once."""
    dirs: list[str] = []
    first_files: list[dict[str, Any]] = []
    pages = 0
    async for page in level_pages(prefix):
        pages += 1
        dirs.extend(cp["Prefix"] for cp in page.get("CommonPrefixes", ()))
        if pages == 1:
            first_files = page.get("Contents", [])
    dirs.sort()
    files = _aiter(first_files) if pages <= 1 else _contents(level_pages(prefix))
    i = 0
    async for c in files:
        while i < len(dirs) and dirs[i] < c["Key"]:
            async for sub in tree_walk(level_pages, dirs[i]):
                yield sub
            i += 1
        yield c
    for d in dirs[i:]:
        async for sub in tree_walk(level_pages, d):
            yield sub


async def _contents(pages: AsyncIterator[dict[str, Any]]) -> AsyncIterator[dict[str, Any]]:
    async for page in pages:
        for c in page.get("Contents", ()):
            yield c


async def _aiter(items: list[dict[str, Any]]) -> AsyncIterator[dict[str, Any]]:
    for item in items:
        yield item
