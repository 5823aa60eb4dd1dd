"""What bounded a run's throughput, judged from what the run measured of itself.

azcopy's benchmark mode guesses ("disk may be limiting speed"); a run here measures each side
instead. The retry layer (``stores.resilience``) adds up, per store, the time requests spent
waiting on that store's answers and bodies, and the time the rate limits held requests back;
the engine adds the CPU this process and its event loop spent. The verdict is the first of:

- ``bwlimit``: ``--bwlimit`` / ``--tpslimit`` held requests back for a large share of their time;
- ``client``: this client's CPU was the ceiling (the event loop's thread busy nearly all the
  run, or every core busy);
- ``target`` / ``source``: most request time was spent waiting on that side's answers;
- ``network``: neither side dominates and the client was idle: what both wait on is the link
  (or both servers alike; a client cannot tell those apart).

Pure: a record in, a record out. The clocks are read in ``observe.clocks`` (``Meter``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
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
    process_cpu_s: float  # the whole process, its threads included
    cores: int  # cores this process may run on


@dataclass(frozen=True, slots=True)
class LimitedBy:
    verdict: Verdict
    source_share: float  # of the request time, waiting on the source
    target_share: float
    paced_share: float  # of request and pacing time, held back by the rate limits
    loop_busy: float  # the event loop's thread busy, as a fraction of the wall time
    cores_busy: float  # the process's CPU in cores (1.0: one core all the time)
    cores: int

    def to_dict(self) -> dict[str, Any]:
        return {k: round(v, 3) if isinstance(v, float) else v for k, v in asdict(self).items()}

    def describe(self) -> str:
        """One line for a person: the verdict and the figures behind it."""
        cpu = f"client CPU {self.cores_busy:.1f} cores of {self.cores}"
        if self.verdict == "none":
            return "limited by: nothing measured (no request took time)"
        if self.verdict == "bwlimit":
            return (f"limited by --bwlimit/--tpslimit: requests held back "
                    f"{self.paced_share:.0%} of their time; {cpu}")
        if self.verdict == "client":
            return (f"limited by this client's CPU: event loop busy {self.loop_busy:.0%} of "
                    f"the run; {cpu}")
        if self.verdict in ("source", "target"):
            share = self.source_share if self.verdict == "source" else self.target_share
            return (f"limited by the {self.verdict}: {share:.0%} of request time waiting on "
                    f"its answers; {cpu}")
        return (f"limited by the network: request time split source {self.source_share:.0%}"
                f" / target {self.target_share:.0%}; {cpu}")


def judge(t: RunTimings) -> LimitedBy:
    waited = t.source_s + t.target_s
    wall = max(t.wall_s, 1e-9)
    source_share = t.source_s / waited if waited > 0 else 0.0
    target_share = t.target_s / waited if waited > 0 else 0.0
    paced_share = t.paced_s / (waited + t.paced_s) if waited + t.paced_s > 0 else 0.0
    loop_busy = min(t.loop_cpu_s / wall, 1.0)
    cores_busy = t.process_cpu_s / wall
    verdict: Verdict
    if waited + t.paced_s <= 0 and loop_busy < BUSY:
        verdict = "none"
    elif paced_share >= PACED_SHARE:
        verdict = "bwlimit"
    elif loop_busy >= BUSY or cores_busy >= BUSY * max(t.cores, 1):
        verdict = "client"
    elif target_share >= SIDE_SHARE:
        verdict = "target"
    elif source_share >= SIDE_SHARE:
        verdict = "source"
    else:
        verdict = "network"
    return LimitedBy(verdict, source_share, target_share, paced_share, loop_busy, cores_busy,
                     t.cores)
