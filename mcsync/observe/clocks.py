"""A run's clocks, read on its event loop's thread (``Meter``: what the run measured of itself,
a ``RunTimings``), for ``bottleneck.judge`` to weigh."""

from __future__ import annotations

import os
import time

from ..bottleneck import RunTimings

__all__ = ["Meter"]


class Meter:
    """A run's clocks, started on its event loop's thread with the request times so far
    (``Pacing.timings()``: a watch's cycles share them); ``timings`` at its end, on the same
    thread, gives what the run itself measured."""

    def __init__(self, waited: dict[str, float], paced: float) -> None:
        self._waited = waited
        self._paced = paced
        self._wall = time.monotonic()
        self._loop = _runnable_s()
        self._cpu = time.process_time()

    def timings(self, waited: dict[str, float], paced: float, source: str,
                target: str) -> RunTimings:
        def side(url: str) -> float:
            return waited.get(url, 0.0) - self._waited.get(url, 0.0)

        try:
            cores = len(os.sched_getaffinity(0))
        except AttributeError:  # not Linux
            cores = os.cpu_count() or 1
        return RunTimings(time.monotonic() - self._wall, side(source), side(target),
                          paced - self._paced, _runnable_s() - self._loop,
                          time.process_time() - self._cpu, cores)


def _runnable_s() -> float:
    """Seconds this thread ran or waited to run (Linux's schedstat): a loop starved of CPU
    by other processes is as much the limit as one busy with its own work. Elsewhere, the
    thread's CPU time."""
    try:
        with open("/proc/thread-self/schedstat", "rb") as f:
            on_cpu, waiting, _ = f.read().split()
        return (int(on_cpu) + int(waiting)) / 1e9
    except (OSError, ValueError):
        return time.thread_time()
