"""The limits every transfer runs under: requests in flight, bytes buffered, and how many
data-bearing requests (parts, large objects) are on the wire at once."""

from __future__ import annotations

import asyncio
import bisect
import collections
import contextlib
import math
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from .gate import Gate, MeteredGate
from .object_slots import TUNED_OBJECTS_START, TUNED_PROBE_AFTER, FixedSlots, TunedObjects

if TYPE_CHECKING:
    from .config import SyncOptions


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

    def hold(self, n: int) -> _Holding:
        """``async with budget.hold(n)``: ``n`` bytes (at most the capacity) for its body."""
        return _Holding(self, n)


class _Holding:
    """``ByteBudget.hold``'s context: a class, not a generator, since the relay enters one
    for every object and part and contextlib's machinery cost twice as much
    (benchmarks/results/2026-12-07-thread-handoff.md)."""

    __slots__ = ("_budget", "_got", "_n")

    def __init__(self, budget: ByteBudget, n: int) -> None:
        self._budget, self._n, self._got = budget, n, 0

    async def __aenter__(self) -> None:
        self._got = await self._budget.acquire(self._n)

    async def __aexit__(self, *exc: object) -> None:
        self._budget.release(self._got)


class GoodputSlots(MeteredGate):
    """How many data-bearing requests are on the wire at once, found by measuring.

    More parts in flight help until the link, or the server, is full; past that they only
    hold memory and contend, while a real link to a distant region needs dozens (figures:
    benchmarks/results/figures-from-code.md). So the limit starts
    at ``initial`` and climbs: every ``interval_s`` in which requests had to wait for a slot,
    the bytes acknowledged per second are compared with the best rate seen (the first such
    interval, which holds the run's start-up, only sets it). At least 10% more, and the limit
    grows by half (up to ``ceiling``); less above the limit that gave the best rate, and it
    steps back to that limit: a growth that did not pay is taken back, as parts in flight are
    memory (before, a large upload peaked far above the parts it needed, for no more
    throughput). At that limit a plateau is held.
    ``throttled()`` (the store said slow down) halves it. ``peak`` is the most ever allowed.
    FIFO, and correct under cancellation, as ByteBudget.

    Told what bounds the run (``bound_by``, the run's own verdict, bottleneck.py), it grows
    no further while that is this client's CPU or the rate limits: more in flight cannot
    help there, and costs memory. With ``probe_after`` (``--concurrency auto``) it climbs
    from its baseline at once rather than waiting for the rate to rise at the same limit, and
    a plateau held that many intervals is tried again a quarter higher (kept if it pays,
    taken back if not): a long migration's source or target changes under it."""

    GROW, GAIN, PROBE = 1.5, 1.10, 1.25

    def __init__(self, initial: int, ceiling: int, *, floor: int = 2, interval_s: float = 0.5,
                 probe_after: int | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(initial, ceiling, floor=floor, interval_s=interval_s, clock=clock)
        self._best_rate = 0.0
        self._best_limit = self.limit
        self._probe_after = probe_after
        self._plateau = 0  # intervals held at the best limit since it last changed

    def slot(self) -> GoodputSlots:
        """``async with slots.slot()``: one data-bearing request on the wire for its body
        (the gate itself is the context: ``Gate.__aenter__``)."""
        return self

    def _adapt(self, rate: float) -> None:
        if not self._best_rate:  # the first interval (or the first after throttling) is the
            self._best_rate, self._best_limit = rate, self.limit  # baseline: it holds start-up
            if self._probe_after is not None and not self._held:
                self._set(math.ceil(self.limit * self.GROW))  # tuned: find out, from here
            return
        if rate > self._best_rate * self.GAIN:
            self._best_rate, self._best_limit = rate, self.limit
            if not self._held:
                self._set(math.ceil(self.limit * self.GROW))
        elif self.limit > self._best_limit:
            self._set(self._best_limit)
        elif (self._probe_after is not None and not self._held
              and self.limit < self.ceiling):
            self._plateau += 1
            if self._plateau >= self._probe_after:  # measured afresh: conditions change
                self._best_rate, self._best_limit = rate, self.limit
                self._set(math.ceil(self.limit * self.PROBE))

    def throttled(self) -> None:
        """The store asked us to slow down: half as many in flight, and measure afresh."""
        self._set(self.limit // 2)
        self._best_rate, self._best_limit = 0.0, self.limit

    def _set(self, limit: int) -> None:
        self._plateau = 0
        super()._set(limit)


class AdaptiveLimit(Gate):
    """Requests in flight to one endpoint, cut when it throttles and grown back as requests
    succeed (AIMD, as TCP and botocore's adaptive mode do): a SlowDown or 429 halves the
    limit — once per ``cooldown_s``, so one burst of refusals is one cut, not a collapse to the
    floor — and every ``limit`` successes since add an eighth (at least one), up to
    ``ceiling``: back from 4 to 128 in ~1,000 successes rather than the ~8,000 that one at a
    time would take, so a short episode of throttling does not slow the rest of a run.
    ``peak`` and ``low`` are the most and the fewest ever allowed."""

    def __init__(self, ceiling: int, *, floor: int = 1, cooldown_s: float = 1.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.ceiling = max(ceiling, 1)
        self.floor = min(max(floor, 1), self.ceiling)
        self.limit = self.peak = self.low = self.ceiling
        self._cooldown_s = cooldown_s
        self._clock = clock
        self._cut_at = -math.inf
        self._credit = 0
        super().__init__()

    def succeeded(self) -> None:
        if self.limit >= self.ceiling:
            return
        self._credit += 1
        if self._credit >= self.limit:
            self._credit = 0
            self.limit = min(self.ceiling, self.limit + max(1, self.limit // 8))
            self.peak = max(self.peak, self.limit)
            self._wake()

    def throttled(self) -> bool:
        """Cut the limit (unless cut within the cooldown); whether it was cut."""
        now = self._clock()
        if now - self._cut_at < self._cooldown_s:
            return False
        self._cut_at = now
        self._credit = 0
        self.limit = max(self.floor, self.limit // 2)
        self.low = min(self.low, self.limit)
        return True


class BufferPool:
    """Buffers for parts, reused from part to part instead of made for each: a fresh buffer
    is a page fault per page when the allocator maps it anew, or, kept in the allocator's
    heaps, stays behind in whichever worker thread's arena freed it, as RSS far above the live
    buffers (figures: benchmarks/results/figures-from-code.md).

    A free buffer serves any part it can hold (the smallest that can), and no more buffers are
    kept, lent and free together, than were ever lent at once (and never more than ``keep``
    free): a checkpoint's tensor-aligned parts come in many sizes, and a pool kept per size
    ended a large upload holding several times more free buffers than it ever had parts in
    hand. Sizes are rounded up to whole MiB."""

    def __init__(self, keep: int) -> None:
        self.keep = keep
        self._free: list[bytearray] = []  # smallest first
        self._lent = 0
        self._most_lent = 0

    def take(self, size: int) -> bytearray:
        self._lent += 1
        self._most_lent = max(self._most_lent, self._lent)
        i = bisect.bisect_left(self._free, size, key=len)
        if i < len(self._free):
            return self._free.pop(i)
        self._trim()  # every free buffer is too small for this part: let the smallest go
        return bytearray(-(-size // (1 << 20)) << 20)

    def give(self, buf: bytearray) -> None:
        self._lent -= 1
        bisect.insort(self._free, buf, key=len)
        self._trim()

    def drop(self) -> None:
        """A lent buffer is not coming back (its borrower failed or was cancelled)."""
        self._lent -= 1

    def _trim(self) -> None:
        while self._free and (len(self._free) > self.keep
                              or len(self._free) + self._lent > self._most_lent):
            del self._free[0]  # the smallest: a larger one serves its parts as well

    @property
    def kept(self) -> int:
        """Bytes held in free buffers."""
        return sum(len(b) for b in self._free)

    def lent(self, size: int) -> _Lent:
        """A buffer of at least ``size`` bytes for the body of the ``with``. One whose borrower
        failed or was cancelled is dropped, never lent again: a worker thread reading into it
        (``ReadsInto``) may still be writing, and a part given it next would be sent with
        those bytes, under checksums computed over them."""
        return _Lent(self, size)


class _Lent:
    """``BufferPool.lent``'s context (a class for the reason ``_Holding`` is one)."""

    __slots__ = ("_buf", "_pool", "_size")

    def __init__(self, pool: BufferPool, size: int) -> None:
        self._pool, self._size = pool, size

    def __enter__(self) -> bytearray:
        self._buf = self._pool.take(self._size)
        return self._buf

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> None:
        if kind is None:
            self._pool.give(self._buf)
        else:
            self._pool.drop()


# Data-bearing requests on the wire when a run starts; GoodputSlots grows it while that pays.
# In the peers' range (rclone 4 transfers x 4 chunks, s5cmd 5 parts a file, aws 10). 4 beat 8
# on the benchmark machine: more parts in flight held memory and made the server contend
# (figures: benchmarks/results/figures-from-code.md).
INITIAL_PARTS_IN_FLIGHT = 4


class Limits:
    """Shared by every task of a run. ``tuned`` (``--concurrency auto``): the objects in
    flight are found by measuring (``object_slots.TunedObjects``) up to ``concurrency``, and
    the parts on the wire probe their plateau."""

    def __init__(self, concurrency: int, memory_limit: int, *, tuned: bool = False) -> None:
        self.requests = asyncio.Semaphore(concurrency)
        self.memory = ByteBudget(memory_limit)
        self.parts = GoodputSlots(min(INITIAL_PARTS_IN_FLIGHT, concurrency), concurrency,
                                  probe_after=TUNED_PROBE_AFTER if tuned else None)
        self.objects: TunedObjects | FixedSlots = (
            TunedObjects(TUNED_OBJECTS_START, concurrency) if tuned else FixedSlots(concurrency))
        self.buffers = BufferPool(keep=INITIAL_PARTS_IN_FLIGHT * 2)
        self.tuned = tuned

    @classmethod
    def for_options(cls, options: SyncOptions) -> Limits:
        return cls(options.in_flight, options.memory_limit, tuned=options.tuned)
