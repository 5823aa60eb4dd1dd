"""Events the engine emits, and the sinks that consume them.

The engine knows nothing of terminals or logs: it calls ``sink.emit(event)`` on the event-loop
thread, and progress bars, log lines and metrics are sinks. ``emit`` must not block; sinks ignore
event types they do not know, so adding an event never breaks a subscriber.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, fields
from typing import Literal, Protocol, runtime_checkable

from .errors import failure_kind
from .report import (
    MAX_LISTED_FAILURES,
    MAX_LISTED_OBJECTS,
    ObjectFailure,
    ObjectResult,
    RunTotals,
    SyncReport,
)

MAX_LISTED_DEFERRED = 1000  # deferred objects named in the report; all are counted

ActionKind = Literal["copy", "server_copy", "skip", "delete"]


@dataclass(frozen=True, slots=True)
class RunStarted:
    src: str
    dst: str
    dry_run: bool


@dataclass(frozen=True, slots=True)
class ObjectPlanned:
    key: str
    action: ActionKind
    size: int
    reason: str = ""


@dataclass(frozen=True, slots=True)
class DeltaPlanned:
    """A changed object goes as a block delta: what changed, what is sent, and what the
    target composes from the version it holds."""

    key: str
    size: int
    bytes_changed: int
    bytes_to_send: int
    bytes_reused: int
    parts: int
    changed_tensors: tuple[str, ...] = ()  # safetensors files: tensors with new bytes
    reused_from: tuple[tuple[str, int], ...] = ()  # (key, bytes composed from it), largest first
    reused_own: int = 0  # of bytes_reused: from the key's own previous version


@dataclass(frozen=True, slots=True)
class ListingDone:
    """Both listings are exhausted: the totals in the progress display are now final."""


@dataclass(frozen=True, slots=True)
class BytesMoved:
    key: str
    nbytes: int


@dataclass(frozen=True, slots=True)
class ObjectDone:
    result: ObjectResult


@dataclass(frozen=True, slots=True)
class ObjectFailed:
    key: str
    action: ActionKind
    size: int
    error: str
    kind: str | None = None  # see report.ObjectFailure
    retryable: bool = False

    @classmethod
    def of(cls, key: str, action: ActionKind, size: int, exc: BaseException,
           error: str | None = None) -> ObjectFailed:
        """The failure ``exc`` caused, classified (``errors.failure_kind``); ``error`` the
        line that describes it (``str(exc)`` unless given)."""
        return cls(key, action, size, str(exc) if error is None else error, *failure_kind(exc))


@dataclass(frozen=True, slots=True)
class ObjectDeferred:
    """Not copied this run, by design: its checkpoint is not complete yet, or it is still
    being written (a later run picks it up), or it was deleted at the source after it was
    listed (nothing to pick up). Not recorded and not a failure."""

    key: str
    size: int
    reason: str


@dataclass(frozen=True, slots=True)
class RequestThrottled:
    """A store answered "slow down" (SlowDown, 503, 429); the request is tried again, with
    ``limit`` requests in flight to that store from now on."""

    store: str
    operation: str
    limit: int


@dataclass(frozen=True, slots=True)
class Bottleneck:
    """What bounded the run over the last few seconds (``bottleneck.judge``): ``verdict`` one
    of bwlimit, client, source, target, network; ``line`` the verdict with its figures."""

    verdict: str
    line: str


@dataclass(frozen=True, slots=True)
class RequestGroup:
    """Requests of one kind another process made: each one's seconds, start to answer."""

    store: str  # "source" or "target"
    operation: str  # the Store protocol's method
    status: str  # "ok" or the error's class name
    throttled: bool  # the error was a Throttled
    seconds: tuple[float, ...]


@dataclass(frozen=True, slots=True)
class RequestsCounted:
    """The requests a worker process made for the run (``--workers``) since it last said, for
    the metrics to count as if the driver had made them (``observe.requests.RequestTally``):
    grouped by kind, the bytes it read from the source, and the most it had in flight at
    once, per store. Labels only: never a key or an address."""

    worker: str  # "pid P on HOST"
    requests: tuple[RequestGroup, ...]
    received: int
    in_flight_peak: tuple[tuple[str, int], ...]


@dataclass(frozen=True, slots=True)
class CheckpointChosen:
    """``--latest-checkpoint`` chose the checkpoint ``directory`` (a key prefix ending in
    "/") of ``framework``; ``marker``: the file beside it naming it, copied too; newer ones
    ``passed_over`` as not complete: (directory, why)."""

    directory: str
    framework: str
    step: int | None
    marker: str | None
    passed_over: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class CheckpointKept:
    """Retention (``--keep-last``) keeps the checkpoint ``directory`` at the target:
    ``reason`` names the rule ("kept: last 3", "kept: every 1000"); ``thinned``: its
    optimizer files are deleted (``--prune-optimizer-older-than``), or would be in a plan."""

    directory: str
    step: int | None
    reason: str
    thinned: bool = False


@dataclass(frozen=True, slots=True)
class CheckpointPruned:
    """Retention deleted the checkpoint ``directory`` from the target (in a plan: would),
    ``objects`` of ``bytes``, its marker first; or, ``thinned``, its optimizer files only."""

    directory: str
    step: int | None
    objects: int
    bytes: int
    thinned: bool = False


@dataclass(frozen=True, slots=True)
class CheckpointDurable:
    """The newest complete checkpoint at the target, as retention found it after a run."""

    directory: str
    step: int | None


@dataclass(frozen=True, slots=True)
class RunFinished:
    report: SyncReport


# -- the node cache's (mcsync.cache): what a process's cache did, for its metrics ------------


@dataclass(frozen=True, slots=True)
class CacheServed:
    """An entry was served: ``hit`` when it was complete already (no byte fetched)."""

    url: str
    size: int
    hit: bool


@dataclass(frozen=True, slots=True)
class CacheFetched:
    """Bytes of an entry fetched from its store by this process (a part at a time)."""

    url: str
    nbytes: int


@dataclass(frozen=True, slots=True)
class CacheEvicted:
    url: str
    size: int


@dataclass(frozen=True, slots=True)
class WarmListed:
    """A warm's objects, listed: how many it will bring in or find cached, and their bytes."""

    objects: int
    nbytes: int


@dataclass(frozen=True, slots=True)
class CacheUsage:
    """The bytes the cache's entries are charged now, and its limit (0: none)."""

    in_use: int
    limit: int


Event = (
    RunStarted | ObjectPlanned | DeltaPlanned | ListingDone | BytesMoved | ObjectDone
    | ObjectFailed | ObjectDeferred | RequestThrottled | RequestsCounted | Bottleneck
    | CheckpointChosen | RunFinished | CheckpointKept | CheckpointPruned | CheckpointDurable
    | CacheServed | CacheFetched | CacheEvicted | CacheUsage | WarmListed
)


@runtime_checkable
class EventSink(Protocol):
    def emit(self, event: Event) -> None: ...


class NullSink:
    def emit(self, event: Event) -> None:
        pass


class FanOut:
    """Deliver every event to several sinks, in order."""

    def __init__(self, sinks: Iterable[EventSink]) -> None:
        self._sinks = tuple(sinks)

    def emit(self, event: Event) -> None:
        for sink in self._sinks:
            sink.emit(event)


class CallbackSink:
    """Adapts a plain function, for library users: ``on_event=print``."""

    def __init__(self, fn: Callable[[Event], None]) -> None:
        self._fn = fn

    def emit(self, event: Event) -> None:
        self._fn(event)


@dataclass
class StatsCollector:
    """Builds the run's ``SyncReport``: from its events, then what the run knows of itself at
    its end (``finish``). The one place a report is filled in."""

    src: str
    dst: str
    dry_run: bool = False
    clock: Callable[[], float] = time.monotonic
    _started: float = field(default=0.0, init=False)
    _report: SyncReport = field(init=False)

    def __post_init__(self) -> None:
        self._started = self.clock()
        self._report = SyncReport(src=self.src, dst=self.dst, dry_run=self.dry_run)

    def emit(self, event: Event) -> None:
        r = self._report
        match event:
            case ObjectPlanned(action="skip", size=size):
                r.objects_skipped += 1
                r.bytes_skipped += size
            case ObjectPlanned(action=action, size=size) if self.dry_run:
                self._planned(action, size)
            case DeltaPlanned() if self.dry_run:
                self._planned_delta(event)
            case ObjectDone(result=result):
                self._done(result)
            case ObjectFailed():
                r.objects_failed += 1
                if len(r.failures) < MAX_LISTED_FAILURES:
                    r.failures.append(ObjectFailure(event.key, event.error, event.kind,
                                                    event.retryable))
                else:
                    r.failures_not_listed += 1
            case ObjectDeferred(key=key, size=size, reason=reason):
                r.objects_deferred += 1
                r.bytes_deferred += size
                if len(r.deferred) < MAX_LISTED_DEFERRED:
                    r.deferred.append((key, reason))
            case CheckpointChosen(directory=directory):
                r.latest_checkpoint = directory
            case CheckpointPruned(thinned=False, objects=objects, bytes=size):
                r.checkpoints_pruned += 1
                r.objects_pruned += objects
                r.bytes_pruned += size
            case CheckpointPruned(thinned=True, objects=objects, bytes=size):
                r.checkpoints_thinned += 1
                r.objects_pruned += objects
                r.bytes_pruned += size
            case CheckpointDurable(directory=directory):
                r.newest_checkpoint = directory
            case _:
                pass

    @property
    def failed(self) -> int:
        return self._report.objects_failed

    def finish(self, totals: RunTotals | None = None) -> SyncReport:
        """The report, with what the run knows of itself at its end (``totals``)."""
        r = self._report
        r.elapsed_s = self.clock() - self._started
        if totals is not None:  # the same names, field by field
            for name in _TOTALS:
                setattr(r, name, getattr(totals, name))
        return r

    def _planned(self, action: str, size: int) -> None:
        """Dry run: count what would move as if it had."""
        r = self._report
        if action == "copy":
            r.objects_copied += 1
            r.bytes_copied += size
            r.bytes_changed += size
            r.bytes_sent += size
        elif action == "server_copy":
            r.objects_server_copied += 1
            r.bytes_server_copied += size
        elif action == "delete":
            r.objects_deleted += 1

    def _planned_delta(self, event: DeltaPlanned) -> None:
        """Dry run: a copy planned as a delta; ``_planned`` counted it as a full copy."""
        r = self._report
        r.bytes_changed += event.bytes_changed - event.size
        r.bytes_sent += event.bytes_to_send - event.size
        r.bytes_reused += event.bytes_reused
        r.bytes_reused_same_key += event.reused_own
        r.bytes_reused_cross_object += event.bytes_reused - event.reused_own

    def _done(self, result: ObjectResult) -> None:
        r = self._report
        if len(r.objects) < MAX_LISTED_OBJECTS:
            r.objects.append(result)
        else:
            r.objects_not_listed += 1
        r.bytes_sent += result.bytes_sent
        r.bytes_reused += result.bytes_reused
        r.bytes_reused_same_key += result.bytes_reused_own
        r.bytes_reused_cross_object += result.bytes_reused - result.bytes_reused_own
        if result.bytes_changed is not None:
            r.bytes_changed += result.bytes_changed
        if result.action == "copy":
            r.objects_copied += 1
            r.bytes_copied += result.size
        elif result.action == "server_copy":
            r.objects_server_copied += 1
            r.bytes_server_copied += result.size
        elif result.action == "delete":
            r.objects_deleted += 1


_TOTALS = tuple(f.name for f in fields(RunTotals))
