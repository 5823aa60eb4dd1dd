"""Rate limits: requests per second (``--tpslimit``) and bytes per second (``--bwlimit``), with
an rclone-like timetable for the bandwidth (``"08:00,100MiB 20:00,off"``).

A token bucket that may go into debt: ``take(n)`` waits until the bucket is not in debt, then
takes ``n`` at once, so a part larger than a second's worth of bytes is let through and the
bucket then waits out the time it took, as s3transfer's LeakyBucket does. The clock and the
sleep are injected, so the tests run on a fake clock.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from .config import SyncOptions, parse_size
from .errors import UsageError

Clock = Callable[[], float]
Sleep = Callable[[float], Awaitable[None]]


class TokenBucket:
    """At most ``rate`` units per second on average, bursts of at most ``burst``."""

    def __init__(self, rate: float, *, burst: float | None = None, clock: Clock = time.monotonic,
                 sleep: Sleep = asyncio.sleep, start_full: bool = True) -> None:
        self._clock, self._sleep = clock, sleep
        self._rate = rate
        self._burst = burst if burst is not None else max(rate, 1.0)
        # Empty at first for bytes: a run shorter than a few seconds would otherwise move
        # a whole second's worth more than the rate says.
        self._tokens = self._burst if start_full else 0.0
        self._stamp = clock()
        self._lock = asyncio.Lock()

    def set_rate(self, rate: float | None) -> None:
        """Change the rate (None: unlimited) from now on."""
        self._refill()
        self._rate = rate if rate is not None else 0.0
        if rate is not None and self._burst < rate:
            self._burst = rate

    def _refill(self) -> None:
        now = self._clock()
        if self._rate > 0:
            self._tokens = min(self._burst, self._tokens + (now - self._stamp) * self._rate)
        self._stamp = now

    async def take(self, n: float = 1.0) -> None:
        async with self._lock:  # FIFO: asyncio.Lock wakes its waiters in order
            if self._rate <= 0:  # unlimited
                return
            self._refill()
            if self._tokens < 0:
                await self._sleep(-self._tokens / self._rate)
                self._refill()
                self._tokens = max(self._tokens, 0.0)  # the wait paid the debt (rounding)
            self._tokens -= n


_ENTRY = re.compile(r"^(\d{1,2}):(\d{2}),(\S+)$")


@dataclass(frozen=True, slots=True)
class Timetable:
    """A rate by time of day: ``[(minute of the day, rate or None for off), ...]``, sorted.
    A single rate is a timetable of one entry."""

    entries: tuple[tuple[int, float | None], ...]

    @classmethod
    def parse(cls, text: str, *, what: str = "--bwlimit", unit: str = "size") -> Timetable:
        """``"50MiB"``, ``"off"``, or ``"08:00,100MiB 20:00,off"`` (each rate holds from its
        time until the next entry's, the last one until the first entry's next day)."""
        def rate(value: str) -> float | None:
            if value.lower() == "off":
                return None
            try:
                number = float(parse_size(value)) if unit == "size" else float(value)
            except (UsageError, ValueError):
                raise UsageError(f"{what}: {value!r} is not a rate (examples: 50MiB, 1.5G, "
                                 "off)") from None
            if number <= 0:
                raise UsageError(f"{what}: a rate must be positive (or off), got {value!r}")
            return number

        words = text.split()
        if len(words) == 1 and "," not in words[0]:
            return cls(((0, rate(words[0])),))
        entries = []
        for word in words:
            m = _ENTRY.match(word)
            if not m or int(m.group(1)) > 23 or int(m.group(2)) > 59:
                raise UsageError(f"{what}: {word!r} is not HH:MM,RATE (a timetable is like "
                                 "'08:00,100MiB 20:00,off')")
            entries.append((int(m.group(1)) * 60 + int(m.group(2)), rate(m.group(3))))
        entries.sort()
        if len({minute for minute, _ in entries}) != len(entries):
            raise UsageError(f"{what}: two entries for the same time in {text!r}")
        return cls(tuple(entries))

    def divided(self, n: int) -> Timetable:
        """Each rate divided by ``n`` (a worker's share of the run's limit)."""
        return Timetable(tuple((start, None if rate is None else rate / n)
                               for start, rate in self.entries))

    def text(self) -> str:
        """As ``parse`` reads it back (rates in whole bytes per second, at least 1)."""
        def rate(value: float | None) -> str:
            return "off" if value is None else str(max(1, int(value)))

        if len(self.entries) == 1 and self.entries[0][0] == 0:
            return rate(self.entries[0][1])
        return " ".join(f"{start // 60:02d}:{start % 60:02d},{rate(value)}"
                        for start, value in self.entries)

    def rate_at(self, when: datetime.datetime) -> float | None:
        minute = when.hour * 60 + when.minute
        current = self.entries[-1][1]  # before the first entry of the day: the last one's
        for start, rate in self.entries:
            if start <= minute:
                current = rate
        return current


def limits_share(options: SyncOptions, n: int) -> SyncOptions:
    """``options`` with 1/``n`` of ``--tpslimit`` and of each rate of ``--bwlimit``: what one
    of ``n`` processes that pace themselves (``--workers``: each worker and the driver) may
    take, so that the run's total is the limit asked for."""
    if n <= 1 or not (options.tps_limit or options.bw_limit):
        return options
    return dataclasses.replace(
        options, tps_limit=options.tps_limit / n if options.tps_limit else None,
        bw_limit=(Timetable.parse(options.bw_limit).divided(n).text()
                  if options.bw_limit else None))


class Bandwidth:
    """Bytes per second through the client, following a timetable (local time)."""

    def __init__(self, timetable: Timetable, *, clock: Clock = time.monotonic,
                 sleep: Sleep = asyncio.sleep,
                 now: Callable[[], datetime.datetime] = datetime.datetime.now) -> None:
        self._timetable, self._now = timetable, now
        rate = timetable.rate_at(now())
        self._bucket = TokenBucket(rate or 0.0, clock=clock, sleep=sleep, start_full=False)
        self._rate = rate

    async def take(self, nbytes: int) -> None:
        rate = self._timetable.rate_at(self._now())
        if rate != self._rate:
            self._rate = rate
            self._bucket.set_rate(rate)
        await self._bucket.take(nbytes)
