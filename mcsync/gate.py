"""A semaphore whose limit may change while requests wait: the gate beneath every limit of a
run that is tuned as it goes (``limits.GoodputSlots``, ``limits.AdaptiveLimit``,
``object_slots``)."""

from __future__ import annotations

import asyncio
import collections
import contextlib


class Gate:
    """A semaphore whose ``limit`` may change while requests wait: FIFO, and correct under
    cancellation, as ByteBudget. ``_waited()`` is told when a request had to wait."""

    limit: int

    def __init__(self) -> None:
        self.busy = 0
        self.most_busy = 0  # the most requests ever holding the gate at once
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()

    def _waited(self) -> None:
        pass

    async def acquire(self) -> None:
        if not self._waiters and self.busy < self.limit:
            self._enter()
            return
        self._waited()
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        try:
            await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self.release()  # granted just as we were cancelled: give it back
            else:
                with contextlib.suppress(ValueError):
                    self._waiters.remove(fut)
            raise

    def release(self) -> None:
        self.busy -= 1
        self._wake()

    def _wake(self) -> None:
        while self._waiters and self.busy < self.limit:
            fut = self._waiters.popleft()
            if not fut.done():
                self._enter()
                fut.set_result(None)

    def _enter(self) -> None:
        self.busy += 1
        self.most_busy = max(self.most_busy, self.busy)
