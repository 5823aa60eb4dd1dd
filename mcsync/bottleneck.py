"""What bounded a run's throughput, judged from what the run measured of itself.

azcopy's benchmark mode guesses ("disk may be limiting speed"); a run here measures each side
instead. The retry layer (``stores.resilience``) adds up, per store, the time requests spent
waiting on that store's answers and bodies, and the time the rate limits held requests back;
the engine adds the CPU this process and its event loop spent. With ``--workers``, each worker
process measures the same of itself (``observe.clocks.WorkerClock``) and sends what it spent
since it last said (``Spent``) with each task's result; the driver sums them (``WorkersSpent``)
and adds them to its own (``with_workers``) before judging. The verdict is the first of:

- ``bwlimit``: ``--bwlimit`` / ``--tpslimit`` held requests back for a large share of their time;
- ``client``: this client's CPU was the ceiling (the driver's event loop's thread busy nearly
  all the run, or the workers' loops on average over the pool's slots, or every core busy);
- ``target`` / ``source``: most request time was spent waiting on that side's answers;
- ``network``: neither side dominates and the client was idle: what both wait on is the link
  (or both servers alike; a client cannot tell those apart).

Pure: a record in, a record out. The clocks are read in ``observe.clocks``: ``Meter`` (the
driver's) and ``WorkerClock`` (a worker's).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any, Literal

Verdict = Literal["bwlimit", "client", "source", "target", "network", "none"]

# A side whose share of the request time is at least this is the one the run waited on.
SIDE_SHARE = 0.6
# Rate limits holding requests back this share of the waiting: the run was paced.
PACED_SHARE = 0.3
# The event loop's thread (one core at most) or all cores busy this fraction of the wall time.
BUSY = 0.8


@dataclass(frozen=True, slots=True)
class RunTimings:
    """What a run measured of itself: seconds of request time summed over requests (two
    requests in flight for a second count two), and CPU seconds."""

    wall_s: float
    source_s: float  # waiting on the source's answers and bodies
    target_s: float  # waiting on the target's answers (and its bodies taken)
    paced_s: float  # held back by --bwlimit / --tpslimit before a request went out
    loop_cpu_s: float  # the event loop's thread: running, or waiting for a core to run on
    process_cpu_s: float  # the whole process, its threads included (and the workers')
    cores: int  # cores this process may run on (and the workers': ``with_workers``)
    workers_loop_s: float = 0.0  # the workers' event loops' threads, summed over workers
    workers: int = 0  # the pool's slots: workers that could run at once
    processes: int = 1  # processes whose figures these are: the driver and its workers


@dataclass(frozen=True, slots=True)
class LimitedBy:
    verdict: Verdict
    source_share: float  # of the request time, waiting on the source
    target_share: float
    paced_share: float  # of request and pacing time, held back by the rate limits
    loop_busy: float  # the event loop's thread busy, as a fraction of the wall time
    cores_busy: float  # the process's CPU in cores (1.0: one core all the time)
    cores: int
    source_s: float = 0.0  # request time waiting on the source, summed over requests
    target_s: float = 0.0
    workers_loop_busy: float = 0.0  # the workers' loops, on average over the pool's slots
    processes: int = 1  # the driver and the workers that reported

    def to_dict(self) -> dict[str, Any]:
        return {k: round(v, 3) if isinstance(v, float) else v for k, v in asdict(self).items()}

    def describe(self) -> str:
        """One line for a person: the verdict and the figures behind it."""
        cpu = f"client CPU {self.cores_busy:.1f} cores of {self.cores}" + (
            f" in {self.processes} processes" if self.processes > 1 else "")
        if self.verdict == "none":
            return "limited by: nothing measured (no request took time)"
        if self.verdict == "bwlimit":
            return (f"limited by --bwlimit/--tpslimit: requests held back "
                    f"{self.paced_share:.0%} of their time; {cpu}")
        if self.verdict == "client":
            if self.workers_loop_busy >= BUSY > self.loop_busy:
                return (f"limited by this client's CPU: the workers' event loops busy "
                        f"{self.workers_loop_busy:.0%} of the run; {cpu}")
            return (f"limited by this client's CPU: event loop busy {self.loop_busy:.0%} of "
                    f"the run; {cpu}")
        if self.verdict in ("source", "target"):
            share = self.source_share if self.verdict == "source" else self.target_share
            return (f"limited by the {self.verdict}: {share:.0%} of request time waiting on "
                    f"its answers; {cpu}")
        return (f"limited by the network: request time split source {self.source_share:.0%}"
                f" / target {self.target_share:.0%}; {cpu}")


@dataclass(frozen=True, slots=True)
class Spent:
    """What one worker process spent since it last said (``observe.clocks.WorkerClock``): its
    requests' seconds per side and held by its rate limits, its process's CPU seconds and its
    event loop's thread's runnable seconds; and where it runs: its ``host`` and the ``cores``
    it may run on there."""

    source_s: float
    target_s: float
    paced_s: float
    cpu_s: float
    loop_s: float
    host: str
    cores: int


@dataclass(frozen=True, slots=True)
class WorkersSpent:
    """What a run's workers said they spent (``Spent``), summed, with each host they ran on
    (and its cores) once, and which workers said."""

    source_s: float = 0.0
    target_s: float = 0.0
    paced_s: float = 0.0
    cpu_s: float = 0.0
    loop_s: float = 0.0
    hosts: tuple[tuple[str, int], ...] = ()  # (host, its cores), in the order first heard
    processes: frozenset[str] = frozenset()  # the workers that said ("pid P on HOST")

    def plus(self, s: Spent, worker: str) -> WorkersSpent:
        hosts = self.hosts
        if all(h != s.host for h, _ in hosts):
            hosts = (*hosts, (s.host, s.cores))
        return WorkersSpent(self.source_s + s.source_s, self.target_s + s.target_s,
                            self.paced_s + s.paced_s, self.cpu_s + s.cpu_s,
                            self.loop_s + s.loop_s, hosts, self.processes | {worker})

    def since(self, earlier: WorkersSpent) -> WorkersSpent:
        """What was added after ``earlier`` (a window of the run); hosts and workers: all."""
        return replace(self, source_s=self.source_s - earlier.source_s,
                       target_s=self.target_s - earlier.target_s,
                       paced_s=self.paced_s - earlier.paced_s, cpu_s=self.cpu_s - earlier.cpu_s,
                       loop_s=self.loop_s - earlier.loop_s)


def with_workers(t: RunTimings, w: WorkersSpent, slots: int, host: str, *,
                 cpu: bool = True) -> RunTimings:
    """The driver's ``t`` (on ``host``) with what its ``slots`` workers spent added.

    Request and paced times add up as the driver's do. CPU: the workers' adds to the
    process's, against the cores of every machine the run ran on, each once: the driver's, and
    each other host a worker said it ran on, with the cores it may run on there. Local workers
    share the driver's machine, so its cores are the run's. On Ray, a node's cores count,
    not the one CPU each actor declared: that is a reservation for Ray's scheduling, not a
    limit on the cores its process runs on; a worker held to its one Python thread shows as
    its loop instead (``workers_loop_s``). ``cpu`` False (a window of the run: a task's CPU
    arrives when the task ends, and would overstate the window it ends in): the request times
    only."""
    added = replace(t, source_s=t.source_s + w.source_s, target_s=t.target_s + w.target_s,
                    paced_s=t.paced_s + w.paced_s, processes=1 + len(w.processes))
    if not cpu:
        return added
    return replace(added, process_cpu_s=t.process_cpu_s + w.cpu_s,
                   workers_loop_s=w.loop_s, workers=slots,
                   cores=t.cores + sum(c for h, c in w.hosts if h != host))


def judge(t: RunTimings) -> LimitedBy:
    waited = t.source_s + t.target_s
    wall = max(t.wall_s, 1e-9)
    source_share = t.source_s / waited if waited > 0 else 0.0
    target_share = t.target_s / waited if waited > 0 else 0.0
    paced_share = t.paced_s / (waited + t.paced_s) if waited + t.paced_s > 0 else 0.0
    loop_busy = min(t.loop_cpu_s / wall, 1.0)
    # One worker's loop pegged while the others idle is a straggling task, not the ceiling:
    # the workers' loops count when they are busy on average over the pool's slots.
    workers_loop_busy = min(t.workers_loop_s / (wall * t.workers), 1.0) if t.workers else 0.0
    cores_busy = t.process_cpu_s / wall
    verdict: Verdict
    if waited + t.paced_s <= 0 and max(loop_busy, workers_loop_busy) < BUSY:
        verdict = "none"
    elif paced_share >= PACED_SHARE:
        verdict = "bwlimit"
    elif (max(loop_busy, workers_loop_busy) >= BUSY
          or cores_busy >= BUSY * max(t.cores, 1)):
        verdict = "client"
    elif target_share >= SIDE_SHARE:
        verdict = "target"
    elif source_share >= SIDE_SHARE:
        verdict = "source"
    else:
        verdict = "network"
    return LimitedBy(verdict, source_share, target_share, paced_share, loop_busy, cores_busy,
                     t.cores, t.source_s, t.target_s, workers_loop_busy, t.processes)
