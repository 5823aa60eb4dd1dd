"""The flat listing of an S3 store fanned out over its prefixes: every key once, in byte order,
with the pages of several prefixes requested at once; it sends no request itself (its pages
come from the caller).

A flat listing is one round trip per 1,000 keys, one after another: against a remote endpoint
the round trips, not the server, set its time. Each prefix of one level (a CommonPrefix of a
listing delimited by "/") holds a contiguous range of byte order that starts at its own name:
every key under "a/" sorts after "a/" and before the level's next name ("a-b" < "a.txt" <
"a/" < "a/x" < "a0": '-' < '.' < '/' < '0'). So the level's files and prefixes merged by name,
each prefix replaced by its own flat listing, are the flat listing. The prefixes' listings run
ahead of the one being handed on, each in its own task through a queue of a few pages.

A listing that fits one page costs what it did (the first page is the flat listing's own); a
longer one costs a delimited request a level walked, and one for the rest of the prefix the
first page ended in. The levels come a page at a time (the caller's CRT or botocore: obstore's
delimited listing is one answer however large, a level of a million files held whole).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from ..tasks import cancel_and_wait

Page = list[dict[str, Any]]
# (prefix, after): the objects under prefix after the full key ``after`` ("": all), page by page
FlatPages = Callable[[str, str], AsyncGenerator[Page]]
# prefix: the pages (Contents, CommonPrefixes) of one level listed with the delimiter "/"
LevelPages = Callable[[str, str], AsyncGenerator[dict[str, Any]]]

PREFIXES_IN_FLIGHT = 8  # prefixes listed at once (rclone's --checkers default is 8 too)
PAGES_AHEAD = 2  # pages a prefix's listing may run ahead of the consumer
FILES_AHEAD = 1000  # the level's files held ahead while prefixes are being started
SINGLE_LEVELS = 4  # levels of one prefix alone walked down before listing it flat


@dataclass
class Fanout:
    """One fanned-out listing: ``list(prefix)``. ``buffered`` counts the pages listed ahead and
    not yet handed on in full (in the queues, waiting to go in, being handed on); ``peak`` its
    most: at most ``in_flight * (ahead + 1) + 1``. A level's names are held a page at a time
    (and up to ``FILES_AHEAD`` of its files)."""

    flat_pages: FlatPages
    level_pages: LevelPages
    in_flight: int = PREFIXES_IN_FLIGHT
    ahead: int = PAGES_AHEAD
    page_size: int = 1000
    buffered: int = field(default=0, init=False)
    peak: int = field(default=0, init=False)

    async def list(self, prefix: str) -> AsyncIterator[dict[str, Any]]:
        """Every object under ``prefix`` (a full key prefix) in byte order, as ``Contents``."""
        # A page's worth of the flat listing first: a listing that ends within it costs what it
        # did, and asks for no level. (Counted in keys, not chunks: a short chunk need not be
        # the last.)
        last = ""
        listed = 0
        async with contextlib.aclosing(self.flat_pages(prefix, "")) as flat:
            async for page in flat:
                for c in page:
                    yield c
                last = page[-1]["Key"] if page else last
                listed += len(page)
                if listed >= self.page_size:
                    break
            else:
                return
        async for c in self._level(prefix, last, 0):
            yield c

    async def _level(self, prefix: str, after: str, depth: int) -> AsyncIterator[dict[str, Any]]:
        """The objects under ``prefix`` after the full key ``after``: the subprefix holding
        ``after`` (if any) listed on from it, then the level's names after it."""
        rest = after[len(prefix):]
        inside = prefix + rest[:rest.index("/") + 1] if "/" in rest else None
        pages = self.level_pages(prefix, after)
        async with contextlib.aclosing(pages):
            first = await anext(pages, None)
            names = _names(first, after, inside)
            dirs = [n for n in names if isinstance(n, str)]
            if first is not None and not first.get("IsTruncated") and (
                    len(dirs) + (inside is not None) <= 1) and depth < SINGLE_LEVELS:
                # One prefix alone at this level: fanning out needs the level below.
                if inside is not None:
                    async for c in self._level(inside, after, depth + 1):
                        yield c
                for n in names:
                    if isinstance(n, str):
                        async for c in self._level(n, "", depth + 1):
                            yield c
                    else:
                        yield n
                return
            async for c in self._fan(_entries(names, pages, after, inside), after, inside):
                yield c

    async def _fan(self, entries: AsyncGenerator[dict[str, Any] | str], after: str,
                   inside: str | None) -> AsyncIterator[dict[str, Any]]:
        """The entries (files, and prefixes as their names) with each prefix replaced by its
        flat listing, up to ``in_flight`` prefixes listed at once, in entry order."""
        window: deque[dict[str, Any] | _Reader] = deque()
        readers = 0
        done = False
        if inside is not None:
            window.append(self._start(inside, after))
            readers += 1
        try:
            while True:
                while not done and readers < self.in_flight and len(window) < FILES_AHEAD:
                    entry = await anext(entries, None)
                    if entry is None:
                        done = True
                    elif isinstance(entry, str):
                        window.append(self._start(entry, ""))
                        readers += 1
                    else:
                        window.append(entry)
                if not window:
                    return
                head = window.popleft()
                if isinstance(head, dict):
                    yield head
                    continue
                async with contextlib.aclosing(head.drain(self)) as got:
                    async for c in got:
                        yield c
                readers -= 1
        finally:
            await cancel_and_wait(*(r.task for r in window if isinstance(r, _Reader)))
            await entries.aclose()

    def _start(self, prefix: str, after: str) -> _Reader:
        queue: asyncio.Queue[Page | BaseException | None] = asyncio.Queue(self.ahead)

        async def read() -> None:
            try:
                async with contextlib.aclosing(self.flat_pages(prefix, after)) as flat:
                    async for page in flat:
                        self.buffered += 1
                        self.peak = max(self.peak, self.buffered)
                        await queue.put(page)
            except asyncio.CancelledError:
                raise
            except BaseException as exc:  # the consumer raises it in its turn
                await queue.put(exc)
                return
            await queue.put(None)

        return _Reader(asyncio.create_task(read(), name=f"list {prefix}"), queue)


@dataclass
class _Reader:
    """One prefix's flat listing running ahead in its own task, through its queue."""

    task: asyncio.Task[None]
    queue: asyncio.Queue[Page | BaseException | None]

    async def drain(self, fanout: Fanout) -> AsyncGenerator[dict[str, Any]]:
        try:
            while (got := await self.queue.get()) is not None:
                if isinstance(got, BaseException):
                    raise got
                for c in got:
                    yield c
                fanout.buffered -= 1
        finally:
            await cancel_and_wait(self.task)


def _names(page: dict[str, Any] | None, after: str,
           inside: str | None) -> list[dict[str, Any] | str]:
    """One level page's files and prefixes after ``after``, merged by name (S3 hands them in
    two lists); ``inside``, listed apart, left out."""
    if page is None:
        return []
    files = [c for c in page.get("Contents", ()) if c["Key"] > after]
    dirs = [p["Prefix"] for p in page.get("CommonPrefixes", ())
            if p["Prefix"] > after and p["Prefix"] != inside]
    merged: list[dict[str, Any] | str] = [*files, *dirs]
    merged.sort(key=lambda n: n if isinstance(n, str) else n["Key"])
    return merged


async def _entries(names: list[dict[str, Any] | str], pages: AsyncGenerator[dict[str, Any]],
                   after: str, inside: str | None) -> AsyncGenerator[dict[str, Any] | str]:
    for n in names:
        yield n
    async for page in pages:
        for n in _names(page, after, inside):
            yield n
