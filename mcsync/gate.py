"""A semaphore whose limit may change while requests wait: the gate beneath every limit of a
run that is tuned as it goes (``limits.GoodputSlots``, ``limits.AdaptiveLimit``,
``object_slots``)."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from collections.abc import Callable

log = logging.getLogger(__name__)


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

    async def __aenter__(self) -> None:
        await self.acquire()

    async def __aexit__(self, *exc: object) -> None:
        self.release()

    def _wake(self) -> None:
        while self._waiters and self.busy < self.limit:
            fut = self._waiters.popleft()
            if not fut.done():
                self._enter()
                fut.set_result(None)

    def _enter(self) -> None:
        self.busy += 1
        self.most_busy = max(self.most_busy, self.busy)


class MeteredGate(Gate):
    """A gate whose limit is tuned by the goodput through it: ``moved(nbytes)`` as work is
    acknowledged, and at the end of every ``interval_s`` in which a request waited for the
    gate (the gate, not something else, held the run back) ``_adapt(rate)`` in bytes per
    second. Between ``floor`` and ``ceiling``; ``peak`` is the most ever allowed; told what
    bounds the run (``bound_by``), it knows whether more in flight could help (``_held``)."""

    def __init__(self, initial: int, ceiling: int, *, floor: int, interval_s: float,
                 clock: Callable[[], float]) -> None:
        self.ceiling = max(ceiling, 1)
        self.floor = min(max(floor, 1), self.ceiling)
        self.limit = self.peak = min(max(initial, self.floor), self.ceiling)
        super().__init__()
        self._clock = clock
        self._interval = interval_s
        self._since = clock()
        self._bytes = 0
        self._waiting = False  # a request waited for the gate in this interval
        self._held = False  # the run is bound by what more in flight cannot help

    def _waited(self) -> None:
        self._waiting = True

    def bound_by(self, verdict: str) -> None:
        """What bounds the run now (``bottleneck.Verdict``): this client's CPU or the rate
        limits, and more in flight cannot help."""
        self._held = verdict in ("client", "bwlimit")

    def moved(self, nbytes: int) -> None:
        """``nbytes`` were acknowledged: the measure the limit is tuned by."""
        self._bytes += nbytes
        now = self._clock()
        elapsed = now - self._since
        if elapsed < self._interval:
            return
        if self._waiting:
            was = self.limit
            self._adapt(self._bytes / elapsed)
            if self.limit != was:
                log.debug("%s in flight: %d -> %d (%.1f MB/s)", type(self).__name__, was,
                          self.limit, self._bytes / elapsed / 1e6)
        self._since, self._bytes, self._waiting = now, 0, False

    def _adapt(self, rate: float) -> None:
        raise NotImplementedError

    def _set(self, limit: int) -> None:
        self.limit = min(max(limit, self.floor), self.ceiling)
        self.peak = max(self.peak, self.limit)
        self._wake()
