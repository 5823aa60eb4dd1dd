"""Render engine events for a person: a tqdm bar on a terminal, a plain line every few seconds
in a log, and a summary at the end. The only module that imports tqdm."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import IO, TYPE_CHECKING

from ..config import format_size
from ..events import (
    Bottleneck,
    BytesMoved,
    CacheFetched,
    CacheServed,
    CheckpointChosen,
    CheckpointPruned,
    Event,
    ListingDone,
    ObjectDone,
    ObjectFailed,
    ObjectPlanned,
    RequestThrottled,
    WarmListed,
)
from ..report import SyncReport

if TYPE_CHECKING:
    from ..run.watching import Cycle


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """``1 object``, ``2 objects``, ``0 objects``: a count with its noun agreeing, for every
    line the command prints (``plural`` where adding an s is wrong)."""
    return f"{n} {noun if n == 1 else plural or noun + 's'}"


class _Totals:
    def __init__(self) -> None:
        self.objects_total = 0
        self.objects_done = 0
        self.bytes_total = 0
        self.bytes_done = 0
        self.listing_done = False
        self.throttled = 0  # answers that said slow down
        self.in_flight_limit = 0  # requests in flight to the store that said it, since
        self.bound_by = ""  # what limited the run over the last few seconds

    def throttling(self) -> str:
        bound = f", limited by {self.bound_by}" if self.bound_by else ""
        if not self.throttled:
            return bound
        return f", throttled {self.throttled}x (now {self.in_flight_limit} in flight){bound}"

    def count(self, event: Event) -> int:
        """Update the totals; returns the bytes this event moved."""
        match event:
            case ObjectPlanned(action=action, size=size) if action in ("copy", "server_copy"):
                self.objects_total += 1
                self.bytes_total += size
            case ObjectPlanned(action="delete"):
                self.objects_total += 1
            case ListingDone():
                self.listing_done = True
            # A cache warm's: its objects listed, each served (already cached: its bytes
            # done at once), the bytes fetched.
            case WarmListed(objects=n, nbytes=size):
                self.objects_total += n
                self.bytes_total += size
                self.listing_done = True
            case CacheServed(size=size, hit=hit):
                self.objects_done += 1
                if hit:
                    self.bytes_done += size
                    return size
            case CacheFetched(nbytes=n):
                self.bytes_done += n
                return n
            case Bottleneck(verdict=verdict):
                self.bound_by = verdict
            case RequestThrottled(limit=limit):
                self.throttled += 1
                self.in_flight_limit = limit
            case BytesMoved(nbytes=n):
                self.bytes_done += n
                return n
            case ObjectDone() | ObjectFailed():
                self.objects_done += 1
        return 0


class TerminalProgress:
    """A byte-progress bar whose total grows while the listing runs."""

    def __init__(self, stream: IO[str] | None = None) -> None:
        self._t = _Totals()
        # On a terminal only: a run that logs lines need not pay tqdm's import at start-up
        # (figures: benchmarks/results/figures-from-code.md).
        from tqdm import tqdm

        self._bar = tqdm(total=0, unit="B", unit_scale=True, unit_divisor=1024,
                         dynamic_ncols=True, file=stream or sys.stderr, leave=True,
                         desc="listing")

    def emit(self, event: Event) -> None:
        moved = self._t.count(event)
        bar = self._bar
        if isinstance(event, ObjectPlanned | WarmListed) and bar.total != self._t.bytes_total:
            bar.total = self._t.bytes_total
            bar.refresh()
        if moved:
            bar.update(moved)
        if isinstance(event, ObjectDone | ObjectFailed | ListingDone | RequestThrottled
                      | Bottleneck | WarmListed | CacheServed):
            doing = "warming" if isinstance(event, WarmListed | CacheServed) else "syncing"
            desc = doing if self._t.listing_done else f"listing+{doing}"
            bar.set_description_str(f"{desc} {self._t.objects_done}/{self._t.objects_total} obj"
                                    f"{self._t.throttling()}", refresh=False)
        if isinstance(event, ObjectFailed):
            bar.write(f"failed: {event.key}: {event.error}", file=sys.stderr)

    def close(self) -> None:
        self._bar.close()


class LogProgress:
    """For a log or a pipe: one line every ``interval`` seconds, never a carriage return."""

    def __init__(self, stream: IO[str] | None = None, interval: float = 5.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._t = _Totals()
        self._out = stream or sys.stderr
        self._interval = interval
        self._clock = clock
        self._start = clock()
        self._next = self._start + interval

    def emit(self, event: Event) -> None:
        self._t.count(event)
        if isinstance(event, ObjectFailed):
            print(f"failed: {event.key}: {event.error}", file=self._out, flush=True)
        now = self._clock()
        if now >= self._next:
            self._next = now + self._interval
            self._line(now)

    def _line(self, now: float) -> None:
        t = self._t
        elapsed = max(now - self._start, 1e-9)
        rate = t.bytes_done / elapsed
        total = f"{format_size(t.bytes_total)}" + ("" if t.listing_done else "+")
        eta = ""
        if t.listing_done and rate > 0:
            eta = f", eta {max(t.bytes_total - t.bytes_done, 0) / rate:.0f}s"
        print(f"progress: {t.objects_done}/{counted(t.objects_total, 'object')}, "
              f"{format_size(t.bytes_done)}/{total}, {format_size(rate)}/s{eta}"
              f"{t.throttling()}",
              file=self._out, flush=True)

    def close(self) -> None:
        pass


class ChosenLine:
    """``--latest-checkpoint``: which checkpoint is restored, and the newer ones passed over."""

    def __init__(self, stream: IO[str] | None = None) -> None:
        self._out = stream or sys.stderr

    def emit(self, event: Event) -> None:
        if not isinstance(event, CheckpointChosen):
            return
        step = f", step {event.step}" if event.step is not None else ""
        named = f", named by {event.marker}" if event.marker else ""
        print(f"latest checkpoint: {event.directory} ({event.framework}{step}{named})",
              file=self._out, flush=True)
        for directory, why in event.passed_over:
            print(f"  passed over {directory}: {why}", file=self._out, flush=True)


class PrunedLines:
    """``--keep-last``: a line for each checkpoint retention deleted from the target."""

    def __init__(self, stream: IO[str] | None = None) -> None:
        self._out = stream or sys.stderr

    def emit(self, event: Event) -> None:
        if isinstance(event, CheckpointPruned):
            what = "optimizer files of" if event.thinned else "checkpoint"
            print(f"pruned {what} {event.directory} ({counted(event.objects, 'object')}, "
                  f"{format_size(event.bytes)})", file=self._out, flush=True)

    def close(self) -> None:
        pass


class FailureLines:
    """With --quiet: only failures are printed."""

    def __init__(self, stream: IO[str] | None = None) -> None:
        self._out = stream or sys.stderr

    def emit(self, event: Event) -> None:
        if isinstance(event, ObjectFailed):
            print(f"failed: {event.key}: {event.error}", file=self._out, flush=True)

    def close(self) -> None:
        pass


def summary(report: SyncReport) -> str:
    verb = "would copy" if report.dry_run else "copied"
    parts = [
        f"{verb} {counted(report.objects_copied, 'object')} "
        f"({format_size(report.bytes_copied)})",
        f"server-side {report.objects_server_copied} ({format_size(report.bytes_server_copied)})",
        f"skipped {report.objects_skipped}",
        f"deleted {report.objects_deleted}",
        f"failed {report.objects_failed}",
        f"{report.elapsed_s:.1f}s",
    ]
    if not report.dry_run:
        parts.append(f"{format_size(report.throughput_bps)}/s")
    if report.requests_throttled:
        parts.append(f"throttled {report.requests_throttled}x: requests in flight down to "
                     f"{report.requests_in_flight_low}, back to {report.requests_in_flight_end}")
    if report.tasks_retried:
        parts.append(f"{counted(report.tasks_retried, 'task')} of {report.tasks} run again: a "
                     "worker process died")
    if report.bytes_reused:
        sent = "to send" if report.dry_run else "sent"
        parts.append(f"delta: {format_size(report.bytes_changed)} changed, "
                     f"{format_size(report.bytes_sent)} {sent}, "
                     f"{format_size(report.bytes_reused)} reused at the target")
    return " · ".join(parts)


def cycle_line(cycle: Cycle) -> str:
    """One line per cycle of a watch, for its log."""
    when = time.strftime("%H:%M:%S", time.localtime(cycle.started))
    r = cycle.report
    if r is None:
        return (f"{when} cycle {cycle.number} failed after {cycle.elapsed_s:.1f}s: "
                f"{cycle.error}; trying again at the next interval")
    parts = [f"copied {r.objects_copied + r.objects_server_copied} "
             f"({format_size(r.bytes_copied + r.bytes_server_copied)})",
             f"sent {format_size(r.bytes_sent)}"]
    if r.bytes_reused:
        parts.append(f"reused {format_size(r.bytes_reused)}")
    parts += [f"skipped {r.objects_skipped}", f"deleted {r.objects_deleted}",
              f"failed {r.objects_failed}", f"waiting {r.objects_deferred}"]
    if r.checkpoints_pruned or r.checkpoints_thinned:
        parts.append(f"pruned {counted(r.checkpoints_pruned, 'checkpoint')} "
                     f"({format_size(r.bytes_pruned)})")
    if r.requests_throttled:
        parts.append(f"throttled {r.requests_throttled}x")
    parts.append(f"{cycle.elapsed_s:.1f}s")
    state = " (interrupted)" if r.interrupted else ""
    return f"{when} cycle {cycle.number}{state}: " + " · ".join(parts)
