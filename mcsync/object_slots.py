"""How many objects a run keeps in flight: a fixed ``--concurrency N``, or ``auto``, found by
measuring as the run goes."""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from .gate import Gate, MeteredGate

# Objects in flight when a tuned run (--concurrency auto) starts, and the fewest it goes to:
# low enough that more is measured, not assumed; high enough that doubling reaches the
# ceiling of a run of small objects in a few seconds.
TUNED_OBJECTS_START, TUNED_OBJECTS_FLOOR = 32, 4
# A tuned run measures every second (objects complete in bursts), and after a climb that did
# not pay, or a throttle, tries again eight intervals later.
TUNED_INTERVAL_S, TUNED_PROBE_AFTER = 1.0, 8
# What one object done adds, besides its bytes, to the goodput measured: its requests take
# time whatever its size, and a run of empty files must measure a rate too.
OBJECT_WORK = 4096


class FixedSlots(Gate):
    """Objects in flight at a fixed limit (``--concurrency N``): TunedObjects' interface, with
    nothing measured."""

    def __init__(self, limit: int) -> None:
        self.limit = self.peak = max(limit, 1)
        super().__init__()

    def moved(self, nbytes: int) -> None:
        pass

    def bound_by(self, verdict: str) -> None:
        pass

    def throttled(self) -> None:
        pass


class TunedObjects(MeteredGate):
    """Objects in flight under ``--concurrency auto``, found by measuring.

    Unlike parts (``limits.GoodputSlots``, grown only where growth pays, since each part in
    flight is a buffer), an object in flight holds little: its bytes come from the memory
    budget as any other's. Too few, though, cost a whole run's throughput where the target
    answers slowly; and on a shared machine the rate of one second swings by a third, so a
    climb asked to prove a 10% gain is mostly refused by noise. So this climbs while climbing
    does not hurt: at the end of every ``interval_s`` in which objects waited for a slot, the
    rate (bytes acknowledged, and OBJECT_WORK an object) is compared with the rate one step
    below. Not clearly lower (``HURT``), and the limit doubles, up to ``ceiling``; clearly
    lower, and it goes back down that step and stays ``probe_after`` intervals before
    trying again (a long migration's target changes under it). It climbs no further while
    the run's own verdict (``bound_by``, bottleneck.py) is this client's CPU or the rate
    limits: more in flight cannot help there. ``throttled()`` halves it. ``peak`` is the
    most ever allowed. FIFO, and correct under cancellation (``Gate``)."""

    GROW, HURT = 2.0, 0.8

    def __init__(self, initial: int, ceiling: int, *, floor: int = TUNED_OBJECTS_FLOOR,
                 interval_s: float = TUNED_INTERVAL_S, probe_after: int = TUNED_PROBE_AFTER,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(initial, ceiling, floor=floor, interval_s=interval_s, clock=clock)
        self._probe_after = probe_after
        self._below: tuple[int, float] | None = None  # the step below: its limit and rate
        self._resting = 0  # intervals left before the next climb is tried

    def _adapt(self, rate: float) -> None:
        below = self._below
        if below is not None and rate < below[1] * self.HURT:  # the climb cost throughput
            self._below = None
            self._set(below[0])
            self._resting = self._probe_after
            return
        if self._resting:
            self._resting -= 1
            return
        if self._held or self.limit >= self.ceiling:
            return
        self._below = (self.limit, rate)
        self._set(math.ceil(self.limit * self.GROW))

    def throttled(self) -> None:
        """The store asked us to slow down: half as many in flight, a while before more."""
        self._below = None
        self._set(self.limit // 2)
        self._resting = self._probe_after
