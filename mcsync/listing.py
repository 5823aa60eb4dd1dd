"""Pair source and target listings in one pass (both sorted by key), holding a page, not a list."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Protocol, TypeVar

from .errors import MCSyncError

T = TypeVar("T")
_DONE = object()


class Keyed(Protocol):
    @property
    def key(self) -> str: ...


A = TypeVar("A", bound=Keyed)
B = TypeVar("B", bound=Keyed)


async def _ordered(items: AsyncIterator[A], where: str) -> AsyncIterator[A]:
    """Refuse a listing that is not strictly sorted: a merge-join of unsorted input would
    silently plan wrong copies and, with --delete, wrong deletes."""
    last: str | None = None
    async for info in items:
        if last is not None and info.key <= last:
            raise MCSyncError(f"{where}: listing is not in key order ({last!r} before "
                              f"{info.key!r}); refusing to continue")
        last = info.key
        yield info


async def merge_join(
    src: AsyncIterator[A], dst: AsyncIterator[B],
    *, src_name: str = "source", dst_name: str = "target",
) -> AsyncIterator[tuple[str, A | None, B | None]]:
    """Pair two key-sorted streams: one tuple per key, with None on the side that lacks it."""
    s_it = _ordered(src, src_name)
    d_it = _ordered(dst, dst_name)
    s = await anext(s_it, None)
    d = await anext(d_it, None)
    while s is not None or d is not None:
        if d is None or (s is not None and s.key < d.key):
            assert s is not None
            yield s.key, s, None
            s = await anext(s_it, None)
        elif s is None or d.key < s.key:
            yield d.key, None, d
            d = await anext(d_it, None)
        else:
            yield s.key, s, d
            s = await anext(s_it, None)
            d = await anext(d_it, None)


@contextlib.asynccontextmanager
async def prefetched(items: AsyncIterator[T], depth: int = 2000) -> AsyncIterator[AsyncIterator[T]]:
    """Run ``items`` ahead in its own task through a bounded queue, so two listings proceed in
    parallel (page requests overlap) while memory stays bounded by ``depth``."""
    queue: asyncio.Queue[object] = asyncio.Queue(maxsize=depth)

    async def pump() -> None:
        try:
            async for item in items:
                await queue.put(item)
        except BaseException as exc:  # hand the failure to the consumer
            await queue.put(_Failure(exc))
            return
        await queue.put(_DONE)

    task = asyncio.create_task(pump())

    async def drain() -> AsyncIterator[T]:
        while True:
            item = await queue.get()
            if item is _DONE:
                return
            if isinstance(item, _Failure):
                raise item.exc
            yield item  # type: ignore[misc]

    try:
        yield drain()
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


@dataclass(frozen=True, slots=True)
class _Failure:
    exc: BaseException
