"""Prometheus metrics of sync runs, on a registry of their own.

``Metrics`` is an event sink (what the runs did: objects, bytes, runs) and wraps stores
(``metrics.wrap(store, "target")``: every request they answer, by operation and outcome, timed).
Everything is kept on ``metrics.registry``, a ``prometheus_client.CollectorRegistry`` made for
it, never the process-global default one: a library caller's own metrics are left alone, and
two ``Metrics`` never share a figure. The CLI serves it over HTTP (``--metrics-addr``) and
writes it in the node_exporter textfile format at the end of a run (``--metrics-file``).

Labels are closed sets: operation names (the Store protocol's methods), outcome class names
(``ok``, an mcsync error class such as ``NotFound`` or ``Throttled``), object results and run
results. Never a key, an address or a message: nothing that can carry a credential.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Literal, TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import start_http_server, write_to_textfile
from prometheus_client.parser import text_string_to_metric_families

from ..errors import MCSyncError, Throttled, UsageError
from ..events import (
    CacheEvicted,
    CacheFetched,
    CacheServed,
    CacheUsage,
    Event,
    ObjectDeferred,
    ObjectDone,
    ObjectFailed,
    ObjectPlanned,
    RunFinished,
    RunStarted,
)
from ..report import SyncReport
from ..stores.base import ReadStore
from ..stores.wrap import Op, wrap
from ..types import Buffer, ObjectInfo

__all__ = ["OBJECT_RESULTS", "RUN_RESULTS", "Metrics", "parse_addr", "status_of"]

log = logging.getLogger(__name__)

T = TypeVar("T")
Role = Literal["source", "target"]

OBJECT_RESULTS = ("copied", "server_copied", "skipped", "failed", "deleted")
RUN_RESULTS = ("ok", "failed", "interrupted", "error", "locked", "dry_run")
_DONE = {"copy": "copied", "server_copy": "server_copied", "delete": "deleted"}
# A request: a small HEAD in milliseconds up to a 64 MiB range or part on a slow link.
REQUEST_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
                   120.0, 300.0)
# A run: a no-op incremental run in a second up to a day-long first copy.
RUN_BUCKETS = (1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0, 7200.0,
               21600.0, 86400.0)
_BOOKKEEPING = frozenset({"part_written"})  # no request: the bytes went with write_at


class Metrics:
    """The metrics of one process's runs: ``emit`` them the engine's events, ``wrap`` the
    stores they use. ``clock`` gives the wall-clock time of a successful run's end."""

    def __init__(self, registry: CollectorRegistry | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self._clock = clock
        self._dry_run = False
        self._waiting: set[str] = set()  # directories of the objects this run deferred
        r = self.registry
        self.sent = Counter("mcsync_sent_bytes", "Bytes of object data sent to the target "
                            "through this client (as the report's bytes_sent), counted as each "
                            "object completes.", registry=r)
        self.received = Counter("mcsync_received_bytes", "Bytes read from the source through "
                                "this client (copies, delta scans, comparisons).", registry=r)
        self.reused = Counter("mcsync_reused_bytes", "Bytes the block delta had the target "
                              "compose from objects it held instead of sending them.",
                              registry=r)
        self.objects = Counter("mcsync_objects", "Objects by what the runs did with them.",
                               ["result"], registry=r)
        self.requests = Counter("mcsync_requests", "Requests to the stores, by store (source "
                                "or target), operation and status (ok or the error's class).",
                                ["store", "operation", "status"], registry=r)
        self.request_seconds = Histogram("mcsync_request_duration_seconds", "Time from a "
                                         "request's start to its answer (a streamed range: to "
                                         "its body's end).", ["store", "operation"],
                                         buckets=REQUEST_BUCKETS, registry=r)
        self.throttled = Counter("mcsync_throttled_requests", "Requests a store answered "
                                 "Throttled (SlowDown, 429) after the SDK's own retries.",
                                 ["store", "operation"], registry=r)
        self.in_flight = Gauge("mcsync_requests_in_flight", "Requests to the stores awaiting "
                               "their answer now.", ["store"], registry=r)
        self.run_seconds = Histogram("mcsync_run_duration_seconds", "Duration of the sync "
                                     "runs (cycles) that ended with a report.",
                                     buckets=RUN_BUCKETS, registry=r)
        self.runs = Counter("mcsync_runs", "Runs by result: ok, failed (some objects), "
                            "interrupted, error (usage, configuration, unexpected), locked "
                            "(another run held the pair), dry_run.", ["result"], registry=r)
        self.last_success = Gauge("mcsync_last_success_timestamp_seconds", "When the last run "
                                  "that synced everything ended (Unix time; 0: none yet).",
                                  registry=r)
        self.checkpoints_waiting = Gauge("mcsync_checkpoints_waiting", "Directories whose "
                                         "objects the last run left for a later one: a "
                                         "checkpoint not complete yet, or files still being "
                                         "written (--min-age).", registry=r)
        # The node cache's (mcsync.cache, told by its events), beside the sync's.
        self.cache_hits = Counter("mcsync_cache_hits", "Cache lookups served from a complete "
                                  "entry, with no byte fetched.", registry=r)
        self.cache_misses = Counter("mcsync_cache_misses", "Cache lookups that fetched the "
                                    "object, took a fill over or waited for another process's.",
                                    registry=r)
        self.cache_fetched = Counter("mcsync_cache_fetched_bytes", "Bytes the cache fetched "
                                     "from the stores (this process's fills).", registry=r)
        self.cache_evictions = Counter("mcsync_cache_evictions", "Entries this process evicted "
                                       "to make room.", registry=r)
        self.cache_in_use = Gauge("mcsync_cache_bytes_in_use", "Bytes charged to the cache's "
                                  "entries (complete and filling), as of this process's last "
                                  "reservation.", registry=r)
        self.cache_limit = Gauge("mcsync_cache_limit_bytes", "The cache's limit (0: none).",
                                 registry=r)
        for result in OBJECT_RESULTS:
            self.objects.labels(result)
        for result in RUN_RESULTS:
            self.runs.labels(result)

    # -- the event sink ---------------------------------------------------------------------------

    def emit(self, event: Event) -> None:
        match event:
            case CacheServed(hit=hit):
                (self.cache_hits if hit else self.cache_misses).inc()
            case CacheFetched(nbytes=nbytes):
                self.cache_fetched.inc(nbytes)
            case CacheEvicted():
                self.cache_evictions.inc()
            case CacheUsage(in_use=in_use, limit=limit):
                self.cache_in_use.set(in_use)
                self.cache_limit.set(limit)
            case RunStarted(dry_run=dry_run):
                self._dry_run = dry_run
                self._waiting.clear()
            case ObjectDeferred(key=key):
                self._waiting.add(key.rpartition("/")[0])
            case _ if self._dry_run and not isinstance(event, RunFinished):
                pass  # a plan moves nothing: its requests count, its objects do not
            case ObjectPlanned(action="skip"):
                self.objects.labels("skipped").inc()
            case ObjectDone(result=result):
                self.objects.labels(_DONE.get(result.action, result.action)).inc()
                self.sent.inc(result.bytes_sent)
                self.reused.inc(result.bytes_reused)
            case ObjectFailed():
                self.objects.labels("failed").inc()
            case RunFinished(report=report):
                self._run_finished(report)
            case _:
                pass

    def _run_finished(self, report: SyncReport) -> None:
        self.run_seconds.observe(report.elapsed_s)
        self.checkpoints_waiting.set(len(self._waiting))
        if report.dry_run:
            result = "dry_run"
        elif report.interrupted:
            result = "interrupted"
        else:
            result = "failed" if report.objects_failed else "ok"
        self.runs.labels(result).inc()
        if result == "ok":
            self.last_success.set(self._clock())

    def run_aborted(self, result: Literal["error", "locked", "interrupted"]) -> None:
        """A run that ended without a report (exit 2, 3, or a second signal)."""
        self.runs.labels(result).inc()

    # -- stores -----------------------------------------------------------------------------------

    def wrap(self, store: ReadStore, role: Role) -> ReadStore:
        """``store`` with its requests counted and timed under ``store=role``; the bytes read
        from a source count as received. The same abilities as ``store``."""
        self.in_flight.labels(role)
        return wrap(store, _RequestHooks(self, role), name="Metered")

    # -- exposition -------------------------------------------------------------------------------

    @contextlib.contextmanager
    def serving(self, host: str, port: int) -> Iterator[tuple[str, int]]:
        """Serve ``/metrics`` on ``host:port`` (a thread) while the block runs; yields the
        address bound (port 0: one the system chose). Raises OSError when it cannot bind."""
        server, thread = start_http_server(port, host, registry=self.registry)
        try:
            bound = str(server.server_address[0]), int(server.server_address[1])
            log.info("serving metrics at http://%s:%d/metrics", *bound)
            yield bound
        finally:
            server.shutdown()
            server.server_close()
            thread.join(timeout=5)

    def write_textfile(self, path: Path) -> None:
        """The registry in the text format node_exporter's textfile collector reads, written
        to a temporary file in the same directory and renamed over ``path``: a reader never
        sees half a file."""
        path.parent.mkdir(parents=True, exist_ok=True)
        write_to_textfile(str(path), self.registry)

    def carry_over(self, path: Path) -> None:
        """Take the last success time from a textfile an earlier run wrote, so a failed run
        does not reset it to 0 when it rewrites the file."""
        try:
            text = path.read_text()
            for family in text_string_to_metric_families(text):
                if family.name == "mcsync_last_success_timestamp_seconds":
                    for sample in family.samples:
                        self.last_success.set(sample.value)
        except (OSError, ValueError, UnicodeDecodeError):
            return  # none yet, or not ours: start from 0


def status_of(exc: BaseException) -> str:
    """The status label of a request that raised ``exc``: its class's name for an mcsync error
    or a built-in one (OSError, ...), never its message."""
    if isinstance(exc, asyncio.CancelledError | GeneratorExit):
        return "Cancelled"
    if isinstance(exc, MCSyncError) or type(exc).__module__ == "builtins":
        return type(exc).__name__
    return "Error"


def parse_addr(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:9108`` for IPv6; ``:9108`` for every interface)."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise UsageError(f"{text!r}: expected HOST:PORT, e.g. 127.0.0.1:9108")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host or "0.0.0.0", int(port)


class _RequestHooks:
    """Counts, times and tracks in flight every request of one store (``stores.wrap.Hooks``)."""

    def __init__(self, metrics: Metrics, role: Role) -> None:
        self.m = metrics
        self.role = role
        self.in_flight = metrics.in_flight.labels(role)

    def done(self, name: str, seconds: float, exc: BaseException | None) -> None:
        m, status = self.m, "ok" if exc is None else status_of(exc)
        m.requests.labels(self.role, name, status).inc()
        m.request_seconds.labels(self.role, name).observe(seconds)
        if isinstance(exc, Throttled):
            m.throttled.labels(self.role, name).inc()

    def received(self, nbytes: int) -> None:
        if self.role == "source":
            self.m.received.inc(nbytes)

    async def call(self, op: Op, fn: Callable[[], Awaitable[T]]) -> T:
        result, started = await self._answered(op, fn)
        self.in_flight.dec()
        self.done(op.name, time.perf_counter() - started, None)
        return result

    async def read(self, op: Op, fn: Callable[[], Awaitable[Buffer]]) -> Buffer:
        data = await self.call(op, fn)
        self.received(len(data))
        return data

    async def stream(self, op: Op,
                     fn: Callable[[], Awaitable[Iterator[Buffer]]]) -> Iterator[Buffer]:
        pieces, started = await self._answered(op, fn)
        # Answered; the request lasts until its body is read.
        assert op.rng is not None
        return _Body(self, pieces, op.rng.length, started)

    async def _answered(self, op: Op, fn: Callable[[], Awaitable[T]]) -> tuple[T, float]:
        """``fn()``'s answer and when it was asked, the request in flight meanwhile (and
        after, for the caller to end); a request that raised is ended here."""
        self.in_flight.inc()
        started = time.perf_counter()
        try:
            return await fn(), started
        except BaseException as exc:
            self.in_flight.dec()
            self.done(op.name, time.perf_counter() - started, exc)
            raise

    def call_blocking(self, op: Op, fn: Callable[[], T]) -> T:
        if op.name in _BOOKKEEPING:
            return fn()
        self.in_flight.inc()
        started = time.perf_counter()
        try:
            result = fn()
        except BaseException as exc:
            self.done(op.name, time.perf_counter() - started, exc)
            raise
        finally:
            self.in_flight.dec()
        self.done(op.name, time.perf_counter() - started, None)
        return result

    async def listing(self, entries: AsyncIterator[ObjectInfo]) -> AsyncIterator[ObjectInfo]:
        """A listing is one request here (its pages are the store's own): timed while it waits
        for the store, not while the engine works through the entries."""
        waited, error = 0.0, None
        it = aiter(entries)
        try:
            while True:
                self.in_flight.inc()
                started = time.perf_counter()
                try:
                    info = await anext(it)
                except StopAsyncIteration:
                    break
                finally:
                    self.in_flight.dec()
                    waited += time.perf_counter() - started
                yield info
        except BaseException as exc:
            error = exc
            raise
        finally:
            self.done("list", waited, error)


class _Body:
    """A streamed range's body: counted as received piece by piece, and its request finished
    (in flight no more, timed, its status counted) when the body ends, fails, or is dropped:
    once every byte was read, dropping it is a success."""

    def __init__(self, hooks: _RequestHooks, pieces: Iterator[Buffer], length: int,
                 started: float) -> None:
        self._hooks = hooks
        self._pieces = iter(pieces)
        self._left = length
        self._started = started
        self._open = True

    def __iter__(self) -> _Body:
        return self

    def __next__(self) -> Buffer:
        try:
            piece = next(self._pieces)
        except StopIteration:
            self._finish(None)
            raise
        except BaseException as exc:
            self._finish(exc)
            raise
        self._left -= len(piece)
        self._hooks.received(len(piece))
        return piece

    def _finish(self, exc: BaseException | None) -> None:
        if getattr(self, "_open", False):
            self._open = False
            self._hooks.in_flight.dec()
            self._hooks.done("open_range", time.perf_counter() - self._started, exc)

    def close(self) -> None:
        self._finish(None if self._left <= 0 else GeneratorExit())
        close = getattr(self._pieces, "close", None)
        if close is not None:
            close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # late in interpreter shutdown, say
            self.close()
