"""A run's clocks, read on its event loop's thread: the driver's (``Meter``: what the run measured
of itself, a ``RunTimings``) and a worker's (``WorkerClock``: what it spent since it last said,
a ``Spent``), for ``bottleneck.judge`` to weigh."""

from __future__ import annotations

import os
import socket
import time

from ..bottleneck import RunTimings, Spent

__all__ = ["Meter", "WorkerClock"]


class Meter:
    """A run's clocks, started on its event loop's thread with the request times so far
    (``Pacing.timings()``: a watch's cycles share them); ``timings`` at its end, on the same
    thread, gives what the run itself measured."""

    def __init__(self, waited: dict[str, float], paced: float) -> None:
        self._waited = dict(waited)
        self._paced = paced
        self._wall = time.monotonic()
        self._loop = _runnable_s()
        self._cpu = time.process_time()

    def timings(self, waited: dict[str, float], paced: float, source: str, target: str, *,
                lap: bool = False) -> RunTimings:
        """``lap``: the clocks start again from these readings (no second lost between)."""
        def side(url: str) -> float:
            return waited.get(url, 0.0) - self._waited.get(url, 0.0)

        wall, loop, cpu = time.monotonic(), _runnable_s(), time.process_time()
        t = RunTimings(wall - self._wall, side(source), side(target), paced - self._paced,
                       loop - self._loop, cpu - self._cpu, _cores())
        if lap:
            self._waited, self._paced = dict(waited), paced
            self._wall, self._loop, self._cpu = wall, loop, cpu
        return t


class WorkerClock:
    """A worker's clocks, started at its first task on its event loop's thread (its imports
    before are not counted: a Ray worker's process may have started before the run) with its
    request times so far (``Pacing.timings()``); ``take``, on the same thread, gives what was
    spent since the last ``take``. Deltas: a task run again on another worker adds only what
    that worker spent, and what a worker killed mid-task spent since its last result is lost
    with it (the verdict undercounts it, never counts a second twice); a task that raised has
    no result, and what it spent goes with its worker's next one."""

    def __init__(self, waited: dict[str, float], paced: float) -> None:
        self._meter = Meter(waited, paced)

    def take(self, waited: dict[str, float], paced: float, source: str,
             target: str) -> Spent:
        t = self._meter.timings(waited, paced, source, target, lap=True)
        return Spent(t.source_s, t.target_s, t.paced_s, t.process_cpu_s, t.loop_cpu_s,
                     socket.gethostname(), t.cores)


def _cores() -> int:
    """Cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


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
