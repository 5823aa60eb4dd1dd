"""Prometheus metrics of sync runs, on a registry of their own.

``Metrics`` is an event sink (what the runs did: objects, bytes, runs) and wraps stores
(``metrics.wrap(store, "target")``: every request they answer, by operation and outcome, timed;
the hooks are ``observe.requests``'). With ``--workers``, each worker counts its own requests
with the same hooks and sends them back with each task (``events.RequestsCounted``), which this
sink adds: the request and byte figures are those of every process of the run, as if one had
made every request. Two are per process by nature: requests in flight *now* is the driver's;
the in-flight *peak* is the driver's peak plus each worker's, at least the true peak.
Everything is kept on ``metrics.registry``, a ``prometheus_client.CollectorRegistry`` made for
it, never the process-global default one: a library caller's own metrics are left alone, and
two ``Metrics`` never share a figure. The CLI serves it over HTTP (``--metrics-addr``) and
writes it in the node_exporter textfile format at the end of a run (``--metrics-file``).

Labels are closed sets: operation names (the Store protocol's methods), outcome class names
(``ok``, an mcsync error class such as ``NotFound`` or ``Throttled``), object results and run
results. Never a key, an address or a message: nothing that can carry a credential.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import Counter as Tally
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Literal

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import start_http_server, write_to_textfile
from prometheus_client.parser import text_string_to_metric_families

from ..errors import UsageError
from ..events import (
    CacheEvicted,
    CacheFetched,
    CacheServed,
    CacheUsage,
    CheckpointDurable,
    CheckpointPruned,
    Event,
    ObjectDeferred,
    ObjectDone,
    ObjectFailed,
    ObjectPlanned,
    RequestsCounted,
    RunFinished,
    RunStarted,
)
from ..report import SyncReport
from ..stores.base import ReadStore
from .requests import Role, meter, status_of

__all__ = ["OBJECT_RESULTS", "RUN_RESULTS", "Metrics", "parse_addr", "status_of"]

log = logging.getLogger(__name__)

OBJECT_RESULTS = ("copied", "server_copied", "skipped", "failed", "deleted")
RUN_RESULTS = ("ok", "failed", "interrupted", "error", "locked", "dry_run")
_DONE = {"copy": "copied", "server_copy": "server_copied", "delete": "deleted"}
# A request: a small HEAD in milliseconds up to a 64 MiB range or part on a slow link.
REQUEST_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
                   120.0, 300.0)
# A run: a no-op incremental run in a second up to a day-long first copy.
RUN_BUCKETS = (1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0, 7200.0,
               21600.0, 86400.0)


class Metrics:
    """The metrics of one process's runs: ``emit`` them the engine's events, ``wrap`` the
    stores they use. ``clock`` gives the wall-clock time of a successful run's end."""

    def __init__(self, registry: CollectorRegistry | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self._clock = clock
        self._dry_run = False
        self._waiting: set[str] = set()  # directories of the objects this run deferred
        # Requests in flight now (this process) and the run's peaks, per store; the workers'
        # peaks per worker (a sum of per-process peaks: no process sees the others' moments).
        self._lock = threading.Lock()
        self._now: Tally[str] = Tally()
        self._peak: Tally[str] = Tally()
        self._worker_peaks: dict[str, Tally[str]] = {}
        r = self.registry
        self.sent = Counter("mcsync_sent_bytes", "Bytes of object data sent to the target "
                            "through this client (as the report's bytes_sent), counted as each "
                            "object completes.", registry=r)
        self.received_bytes = Counter("mcsync_received_bytes", "Bytes read from the source "
                                      "(copies, delta scans, comparisons), by every process of "
                                      "the run.", registry=r)
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
        self.in_flight_gauge = Gauge("mcsync_requests_in_flight", "Requests to the stores awaiting "
                               "their answer now, in this process (the driver's; a worker's "
                               "count in the peak).", ["store"], registry=r)
        self.in_flight_peak = Gauge("mcsync_requests_in_flight_peak", "The most requests to "
                                    "the store in flight at once during the current or last "
                                    "run: the driver's peak plus each worker process's, so at "
                                    "least the true peak.", ["store"], registry=r)
        self.retried = Counter("mcsync_retried_requests", "Requests tried again after a "
                               "transient error or throttling (by mcsync's retry layer, "
                               "every process of the run), counted as each run ends.",
                               registry=r)
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
        # Retention (--keep-last): for an alert "no new checkpoint for an hour".
        self.checkpoints_pruned = Counter("mcsync_checkpoints_pruned", "Checkpoints retention "
                                          "deleted from the target.", registry=r)
        self.durable_step = Gauge("mcsync_checkpoint_durable_step", "The step of the newest "
                                  "complete checkpoint at the target, as retention last found "
                                  "it.", registry=r)
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
                self._restart_peaks()
            case RequestsCounted():
                self.add(event)
            case ObjectDeferred(key=key):
                self._waiting.add(key.rpartition("/")[0])
            case _ if self._dry_run and not isinstance(event, RunFinished):
                pass  # a plan moves nothing: its requests count, its objects do not
            case CheckpointPruned(thinned=False):
                self.checkpoints_pruned.inc()
            case CheckpointDurable(step=step) if step is not None:
                self.durable_step.set(step)
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
        self.retried.inc(report.requests_retried)
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
        return meter(store, self, role)

    # -- requests (observe.requests.Recorder): this process's, and the workers' ---------------

    def in_flight(self, role: Role, delta: int) -> None:
        self.in_flight_gauge.labels(role).inc(delta)
        with self._lock:
            self._now[role] += delta
            if self._now[role] > self._peak[role] or delta == 0:
                self._peak[role] = max(self._peak[role], self._now[role])
                self._show_peak(role)

    def request(self, role: Role, operation: str, status: str, throttled: bool,
                seconds: float) -> None:
        self.requests.labels(role, operation, status).inc()
        self.request_seconds.labels(role, operation).observe(seconds)
        if throttled:
            self.throttled.labels(role, operation).inc()

    def received(self, nbytes: int) -> None:
        self.received_bytes.inc(nbytes)

    def add(self, counted: RequestsCounted) -> None:
        """A worker's requests, counted as if this process had made them."""
        for group in counted.requests:
            role = group.store
            self.requests.labels(role, group.operation, group.status).inc(len(group.seconds))
            timed = self.request_seconds.labels(role, group.operation)
            for seconds in group.seconds:
                timed.observe(seconds)
            if group.throttled:
                self.throttled.labels(role, group.operation).inc(len(group.seconds))
        self.received_bytes.inc(counted.received)
        with self._lock:
            peaks = self._worker_peaks.setdefault(counted.worker, Tally())
            for role, peak in counted.in_flight_peak:
                if peak > peaks[role]:
                    peaks[role] = peak
                    self._show_peak(role)

    def _restart_peaks(self) -> None:
        with self._lock:
            shown = set(self._peak) | {r for p in self._worker_peaks.values() for r in p}
            self._peak = Tally(self._now)
            self._worker_peaks.clear()
            for role in shown | set(self._now):
                self._show_peak(role)

    def _show_peak(self, role: str) -> None:
        """The peak gauge from the peaks (under the lock)."""
        self.in_flight_peak.labels(role).set(
            self._peak[role] + sum(p[role] for p in self._worker_peaks.values()))

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


def parse_addr(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:9108`` for IPv6; ``:9108`` for every interface)."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise UsageError(f"{text!r}: expected HOST:PORT, e.g. 127.0.0.1:9108")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host or "0.0.0.0", int(port)
