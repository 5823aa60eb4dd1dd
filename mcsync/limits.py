"""The two global limits every transfer runs under: requests in flight and bytes buffered."""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import AsyncIterator


class ByteBudget:
    """A counting semaphore over bytes, first come first served, so a large part is not starved
    by a stream of small objects. A request larger than the whole budget is clamped to it."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._free = capacity
        self._waiters: collections.deque[tuple[int, asyncio.Future[None]]] = collections.deque()
        self.peak = 0

    @property
    def in_use(self) -> int:
        return self.capacity - self._free

    async def acquire(self, n: int) -> int:
        n = min(n, self.capacity)
        if not self._waiters and self._free >= n:
            self._free -= n
        else:
            fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._waiters.append((n, fut))
            try:
                await fut
            except asyncio.CancelledError:
                if fut.done() and not fut.cancelled():
                    self.release(n)  # granted just as we were cancelled: give it back
                else:
                    with contextlib.suppress(ValueError):  # _wake may have dropped it already
                        self._waiters.remove((n, fut))
                    self._wake()
                raise
        self.peak = max(self.peak, self.in_use)
        return n

    def release(self, n: int) -> None:
        self._free += n
        self._wake()

    def _wake(self) -> None:
        while self._waiters and self._waiters[0][0] <= self._free:
            n, fut = self._waiters.popleft()
            if fut.done():
                continue
            self._free -= n
            fut.set_result(None)

    @contextlib.asynccontextmanager
    async def hold(self, n: int) -> AsyncIterator[None]:
        got = await self.acquire(n)
        try:
            yield
        finally:
            self.release(got)


class Limits:
    """Shared by every task of a run."""

    def __init__(self, concurrency: int, memory_limit: int) -> None:
        self.requests = asyncio.Semaphore(concurrency)
        self.memory = ByteBudget(memory_limit)
