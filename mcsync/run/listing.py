"""Pair source and target listings in one pass (both sorted by key), holding a page, not a list."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from ..errors import MCSyncError
from ..tasks import cancel_and_wait

T = TypeVar("T")
_DONE = object()


class Keyed(Protocol):
    @property
    def key(self) -> str: ...


A = TypeVar("A", bound=Keyed)
B = TypeVar("B", bound=Keyed)


async def merge_join(
    src: AsyncIterator[A], dst: AsyncIterator[B],
    *, src_name: str = "source", dst_name: str = "target",
) -> AsyncIterator[tuple[str, A | None, B | None]]:
    """Pair two key-sorted streams: one tuple per key, with None on the side that lacks it.
    Each side must be strictly sorted: a merge-join of unsorted input would silently plan
    wrong copies and, with --delete, wrong deletes, so the first key out of order raises
    (checked inline, not by a generator per side: this loop runs once per key)."""
    s_key = d_key = ""
    s = await anext(src, None)
    d = await anext(dst, None)
    while s is not None or d is not None:
        if s is not None and d is not None and s.key == d.key:
            yield s.key, s, d
            s_key, d_key = s.key, d.key
            s = await anext(src, None)
            d = await anext(dst, None)
        elif d is None or (s is not None and s.key < d.key):
            assert s is not None
            yield s.key, s, None
            s_key = s.key
            s = await anext(src, None)
        else:
            yield d.key, None, d
            d_key = d.key
            d = await anext(dst, None)
        if s is not None and s.key <= s_key and s_key:
            _out_of_order(src_name, s_key, s.key)
        if d is not None and d.key <= d_key and d_key:
            _out_of_order(dst_name, d_key, d.key)


def _out_of_order(where: str, last: str, key: str) -> None:
    raise MCSyncError(f"{where}: listing is not in key order ({last!r} before {key!r}); "
                      "refusing to continue")


class Handoff(Generic[T]):
    """A listing started ahead of its consumer, handed over once: a second taker (a run
    started again, listing in another order) lists afresh."""

    def __init__(self, items: AsyncIterator[T]) -> None:
        self._items: AsyncIterator[T] | None = items

    def take(self) -> AsyncIterator[T] | None:
        items, self._items = self._items, None
        return items


@contextlib.asynccontextmanager
async def prefetched(items: AsyncIterator[T], depth: int = 2000,
                     batch: int = 256) -> AsyncIterator[AsyncIterator[T]]:
    """Run ``items`` ahead in its own task through a bounded queue, so two listings proceed in
    parallel (page requests overlap) while memory stays bounded by ``depth`` items. Items go
    through the queue in batches of up to ``batch`` (a queue hand-off per key cost a fair
    share of planning the key: benchmarks/results/figures-from-code.md); a batch is handed over
    at once whenever the consumer is waiting, so batching never delays it."""
    queue: asyncio.Queue[object] = asyncio.Queue(maxsize=max(1, depth // batch))

    async def pump() -> None:
        held: list[T] = []
        try:
            async for item in items:
                held.append(item)
                if len(held) >= batch or queue.empty():
                    await queue.put(held)
                    held = []
        except asyncio.CancelledError:
            # The consumer left (a stopped run): a put into the full queue would wait forever.
            raise
        except BaseException as exc:  # hand the failure to the consumer
            if held:
                await queue.put(held)
            await queue.put(_Failure(exc))
            return
        if held:
            await queue.put(held)
        await queue.put(_DONE)

    task = asyncio.create_task(pump())

    async def drain() -> AsyncIterator[T]:
        while True:
            got = await queue.get()
            if got is _DONE:
                return
            if isinstance(got, _Failure):
                raise got.exc
            for item in got:  # type: ignore[attr-defined]
                yield item

    try:
        yield drain()
    finally:
        await cancel_and_wait(task)


@dataclass(frozen=True, slots=True)
class _Failure:
    exc: BaseException
