"""One sync run: list → plan → transfer → verify → commit, with every stage streaming.

The engine holds the run: its stores and their retry layer, the lock, the manifest and its copy
at the target, the watchdog of a stop, the work after the last copy and the report. Each key is
planned by the driver (``driver``), which hands moves to a dispatch unit (``dispatch``) and is
the only writer of object records. It owns no terminal and no log format: all it says, it says
as events to the sink it was given.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from ..bottleneck import LimitedBy, RunTimings, WorkersSpent, judge, with_workers
from ..checkpoints.frameworks import Completion
from ..checkpoints.latest import Chosen, choose, only_chosen
from ..config import SyncOptions
from ..errors import ListingOrderError, UsageError, first_error
from ..events import (
    Bottleneck,
    CheckpointChosen,
    EventSink,
    FanOut,
    NullSink,
    ObjectFailed,
    RequestThrottled,
    RunFinished,
    RunStarted,
    StatsCollector,
)
from ..limits import Limits
from ..move.context import RunContext
from ..move.dispatch import Dispatch
from ..object_slots import TUNED_INTERVAL_S
from ..observe.clocks import Meter
from ..ratelimit import limits_share
from ..report import RunTotals, SettledConcurrency, SyncReport
from ..retry import RetryPolicy, retrying
from ..scale.worker_runner import Addresses
from ..scale.workers import Workers, refuse_in_a_starting_worker
from ..state.holdings import ManifestHoldings
from ..state.lock import read_lock, run_lock
from ..state.manifest import Manifest, default_path, pair_id
from ..state.shard import Shard, sharded, suffix
from ..state.spool import Spool
from ..state.task_log import TaskLog
from ..stores.base import ReadStore, ServerSideCopier, Store, TempFileSweeper
from ..stores.registry import StoreOptions, open_store
from ..stores.resilience import Pacing, pacing_of, resilient
from ..tasks import cancel_and_wait
from ..types import RESERVED_PREFIX, ObjectInfo
from . import manifest_copy, prune
from .driver import Driver
from .listing import Handoff, prefetched
from .markers import commit_when_complete, deletes_in_order
from .pools import folds_case, has_workers, open_pool
from .preflight import check_stores, writable_pair

log = logging.getLogger(__name__)

BOTTLENECK_EVERY_S = 5.0  # the progress display's "limited by", judged over this window

ManifestFactory = Callable[[Path, str, str], Manifest]


def target_lock_key(src: ReadStore, dst: ReadStore, shard: Shard | None = None) -> str:
    """Each shard of a pair has a lock of its own (1 of 1 takes the pair's), so shards
    never wait for each other."""
    return f"{RESERVED_PREFIX}lock-{pair_id(src.url, dst.url)}{suffix(shard)}.json"


async def run_sync(src: str | ReadStore, dst: str | ReadStore, options: SyncOptions,
                   sink: EventSink | None = None, *, stop: asyncio.Event | None = None,
                   manifest_factory: ManifestFactory = Manifest, preflight: bool = True,
                   check_manifest_copy: bool = True,
                   addresses: Addresses | None = None) -> SyncReport:
    """Sync ``src`` to ``dst``, each an address or a store object (the caller keeps a store it
    passed in: it is not closed here). Raises UsageError/ConfigError (exit 2) before any byte
    moves when either side cannot be used, and Locked (exit 3) when another run holds the
    pair; per-object failures are in the report (exit 1). Setting ``stop`` asks the run to
    wind down: work in flight gets ``options.grace_s`` seconds, the rest resumes next run.
    ``manifest_factory`` opens the pair's manifest (tests hand in one that crashes). A watch's
    later cycles skip the stores' checks (``preflight``) and, mostly, the look for the
    manifest's copy at the target (``check_manifest_copy``): they cost a listing of the source
    and nothing at the target. ``options.workers`` needs the addresses a worker process opens
    its stores from: ``src`` and ``dst`` as addresses, or, for store objects opened from
    addresses (the command's), ``addresses``."""
    stop = stop or asyncio.Event()
    if options.workers:
        refuse_in_a_starting_worker()
    if options.workers and addresses is None:
        if not (isinstance(src, str) and isinstance(dst, str)):
            raise UsageError("workers: give SRC and DST as addresses, not store objects: a "
                             "worker process opens its own stores from them")
        addresses = Addresses(src, dst, options.store_options("source"),
                              options.store_options("target"))
    async with contextlib.AsyncExitStack() as opened:
        source = await _store(src, options.store_options("source"), opened)
        target = await _store(dst, options.store_options("target"), opened)
        # Every request of the run, the checks and the lock's among them, goes through one
        # retry layer; a watch wraps its stores once, for all its cycles.
        # With workers, each paces itself at 1/N of the limits and so does this process,
        # which moves bytes itself only for deltas and uploads a killed run left.
        paced = limits_share(options, options.workers) if has_workers(options) else options
        pacing = pacing_of(source) or pacing_of(target) or Pacing.for_options(paced)
        source, target = resilient(source, pacing), resilient(target, pacing)
        pacing.begin_run()
        if preflight:
            target = writable_pair(source, target)
        assert isinstance(target, Store)
        path = manifest_path(source, target, options)
        locking = not options.dry_run and options.lock
        # Over a WAN each request is a round trip, so the lock object is read while the stores
        # are checked (then the source is listed while the lock is put; an S3 target's check
        # page, kept through that PUT, starts its listing). Nothing is written before the
        # checks pass, and what was read is used only once the lock is held. A local target
        # costs no round trip to wait for.
        early = locking and target.facts.round_trips
        held = (asyncio.create_task(read_lock(target, target_lock_key(source, target,
                                                                    options.shard)))
                if early else None)
        try:
            if preflight:
                await check_stores(source, target, options)
            chosen = None
            if options.latest_checkpoint:  # a first pass finds it; the run lists only it
                chosen = await choose(source, atomic_renames=source.facts.atomic_renames)
                source = only_chosen(source, chosen)
            retention = None
            if (policy := prune.policy_of(options)) is not None:
                retention = prune.Retention(policy, target, lambda event: None,
                                            atomic_renames=target.facts.atomic_renames)
                # Without what it would delete on arrival; no checkpoint under SRC: exit 2.
                source = await retention.prepare(source, require=preflight)
            if not locking:
                return await _run_with_manifest(source, target, options, sink, stop, path,
                                                manifest_factory, check_manifest_copy,
                                                addresses=addresses, chosen=chosen,
                                                retention=retention)
            # The source is listed while the lock is taken too: each page of a listing is a
            # round trip, and a source's listing needs nothing the lock guards (the target's
            # state and the manifest). Locked out, it is dropped unread.
            async with (prefetched(source.list()) as listing,
                        pair_lock(source, target, options, held=held)):
                return await _run_with_manifest(source, target, options, sink, stop, path,
                                                manifest_factory, check_manifest_copy,
                                                Handoff(listing), addresses=addresses,
                                                chosen=chosen, retention=retention)
        finally:
            await cancel_and_wait(held, quiet=True)
    raise AssertionError("unreachable")  # the exit stack does not swallow exceptions


def manifest_path(source: ReadStore, target: ReadStore, options: SyncOptions) -> Path:
    if options.manifest:
        return Path(options.manifest)
    return default_path(source.url, target.url, suffix(options.shard))


def pair_lock(source: ReadStore, target: Store, options: SyncOptions, *,
              held: Awaitable[dict[str, object]] | None = None,
              ) -> contextlib.AbstractAsyncContextManager[None]:
    """The lock that keeps a second run of the pair away (exit 3): see ``lock``. ``held``:
    its lock object, being read already."""
    path = manifest_path(source, target, options)
    return run_lock(path.with_name(path.name + ".lock"), target,
                    target_lock_key(source, target, options.shard), held=held)


async def _store(where: str | ReadStore, options: StoreOptions,
                 opened: contextlib.AsyncExitStack) -> ReadStore:
    """The store for an address (opened here with its side's ``options``, closed when the run
    ends), or the one given."""
    if not isinstance(where, str):
        return where
    store = open_store(where, options)
    opened.push_async_callback(close_quietly, store)
    return store


async def close_quietly(store: ReadStore) -> None:
    with contextlib.suppress(Exception):
        await store.aclose()


async def _run_with_manifest(src: ReadStore, dst: Store, options: SyncOptions,
                             sink: EventSink | None, stop: asyncio.Event, path: Path,
                             manifest_factory: ManifestFactory, check_manifest_copy: bool,
                             listing: Handoff[ObjectInfo] | None = None, *,
                             addresses: Addresses | None = None,
                             chosen: Chosen | None = None,
                             retention: prune.Retention | None = None) -> SyncReport:
    """``listing``: the source's, started already (see run_sync); ``chosen``: the checkpoint
    ``--latest-checkpoint`` restores (``src`` lists it alone)."""
    manifest: Manifest | None = None
    # A copy just fetched from the target is there: no need to look for it again.
    look = check_manifest_copy
    if options.use_manifest and (path.exists() or not options.dry_run):
        if not path.exists() and (
                data := await manifest_copy.fetch(src, dst, options.shard)) is not None:
            manifest_copy.install(data, path)
            look = False
        manifest = manifest_factory(path, src.url, dst.url)
    def list_in_order(exc: ListingOrderError) -> None:
        if exc.fallback is None:
            raise exc
        log.warning("%s; listing it directory by directory and starting again", exc)
        exc.fallback()

    def attempt() -> Awaitable[SyncReport]:
        # Each attempt is a run of its own: its report, limits and workers fresh.
        stats = StatsCollector(src.url, dst.url, options.dry_run)
        ctx = RunContext(src, dst, options, Limits.for_options(options),
                         FanOut([stats, sink or NullSink()]).emit, stop)
        return _Run(ctx, stats, manifest, look=look, addresses=addresses,
                    chosen=chosen, retention=retention).run(listing)

    try:  # each side may need to switch to an ordered listing once
        return await retrying(attempt, RetryPolicy.immediate(3), retry_on=ListingOrderError,
                              before_retry=list_in_order)
    finally:
        if manifest is not None:
            manifest.close()


class _Run:
    """One run's lifecycle around its driver and dispatch unit: the run's record in the
    manifest, the watchdog of a stop, the manifest's copy at the target, the work after the
    last copy (markers, deletes, leftovers, --verify) and the report."""

    def __init__(self, ctx: RunContext, stats: StatsCollector, manifest: Manifest | None, *,
                 look: bool, addresses: Addresses | None = None,
                 chosen: Chosen | None = None,
                 retention: prune.Retention | None = None) -> None:
        """``stats``: the report, one of ``ctx.emit``'s sinks; ``look``: for the manifest's
        copy at the target before trusting the manifest; ``addresses``: where workers reopen
        the stores from (None: no workers); ``chosen``: the checkpoint
        ``--latest-checkpoint`` restores; ``retention``: the prune after the run (None: none)."""
        src, dst, options, stop = ctx.src, ctx.dst, ctx.options, ctx.stop
        self.look = look
        self.src = src
        self.dst = dst
        self.options = options
        self.manifest = manifest
        self.stop = stop
        self.stats = stats
        self.emit = ctx.emit
        self.limits = ctx.limits
        self.pacing = pacing_of(src) or Pacing.for_options(options)
        writing = manifest if not options.dry_run else None
        open_uploads = writing.open_uploads() if writing else {}
        # A killed run's upload of the manifest's copy is the keeper's to abort.
        self.keeper = (manifest_copy.Keeper(src, dst, writing, options,
                                          open_uploads.pop(manifest_copy.target_manifest_key(
                                              src, dst, options.shard), None))
                       if writing is not None else None)
        holdings = (ManifestHoldings(manifest, writing=writing is not None)
                    if manifest is not None else None)
        # --workers: worker processes take the actions of one request each, the parts of
        # copies in parts and the hashing reads of large objects (a dry run's delta previews
        # alone: nothing moves; its target is not probed for case). Each task's end goes into
        # the manifest too, for `mcsync status` (task_log).
        self.task_log = TaskLog(writing)
        self.workers = (Workers(open_pool(addresses, options), options, self.emit, stop,
                                on_task=self.task_log)
                        if addresses is not None and has_workers(options)
                        and (options.dry_run or not self._folds_case(dst)) else None)
        self.dispatch = Dispatch(ctx, journal=writing, known=holdings,
                                 open_uploads=open_uploads, part_tasks=self.workers)
        self.driver = Driver(ctx, self.dispatch, manifest=manifest, holdings=holdings,
                             completion=Completion(src, min_age_s=options.min_age_s,
                                                   atomic_renames=src.facts.atomic_renames,
                                                   source=chosen.source if chosen else None),
                             workers=self.workers)
        self.interrupted = False
        self.chosen = chosen
        self.retention = retention
        if retention is not None:
            retention.emit = self.emit
            if writing is not None:
                retention.forget = writing.forget

    @staticmethod
    def _folds_case(dst: Store) -> bool:
        if not folds_case(dst):
            return False
        log.warning("%s: its filesystem folds case, so one process writes it: moving every "
                    "object without worker processes", dst.url)
        return True

    async def run(self, listing: Handoff[ObjectInfo] | None = None) -> SyncReport:
        """``listing``: the source's, started already (see run_sync)."""
        writing = self.manifest is not None and not self.options.dry_run
        # A killed run may have left hidden temporary files that no journal names.
        sweep = (writing and self.manifest is not None and isinstance(self.dst, TempFileSweeper)
                 and self.manifest.last_status() in ("running", "interrupted"))
        started = time.time()
        meter = Meter(*self.pacing.timings())
        run_id = self.manifest.start_run() if writing and self.manifest else 0
        self.task_log.run_id = run_id
        self.emit(RunStarted(self.src.url, self.dst.url, self.options.dry_run))
        if (c := self.chosen) is not None:
            self.emit(CheckpointChosen(c.directory, c.framework, c.step,
                                       c.marker.key if c.marker else None, c.passed_over))
        server_side = (self.options.server_side_copy and isinstance(self.dst, ServerSideCopier)
                       and self.dst.can_copy_from(self.src))
        trust = (self.manifest is not None and self.manifest.established
                 and not (self.options.delete or self.options.verify or self.options.checksum)
                 and (not self.look
                      or await manifest_copy.kept(self.src, self.dst, self.limits,
                                                  self.options.shard)))
        deletes, markers = Spool(), Spool()  # held back until every copy is done
        main = asyncio.current_task()
        self.pacing.listeners.append(self._throttled)
        watchdog = asyncio.create_task(self._watchdog(main)) if main else None
        judging = asyncio.create_task(self._judge_every(BOTTLENECK_EVERY_S, self._shown))
        tuning = (asyncio.create_task(self._judge_every(TUNED_INTERVAL_S, self._told))
                  if self.limits.tuned else None)
        keeper = self.keeper
        uploader = asyncio.create_task(keeper.refresh()) if keeper else None
        try:
            await self.driver.plan_and_copy(server_side, trust, deletes, markers, listing)
            waiting: set[str] = set()  # directories whose markers wait for other shards
            if markers and not self.stop.is_set():
                if sharded(self.options.shard):  # the shard that finishes last writes them
                    waiting = await commit_when_complete(self.driver, markers)
                else:
                    await self.driver.commit_markers(markers)
            if deletes and not self.stop.is_set():
                await self._delete(deletes, waiting)
            if (self.retention is not None and not self.stop.is_set()
                    and not self.stats.failed):
                # Only once every copy and marker of the run is at the target.
                await self.retention.prune(dry_run=self.options.dry_run)
            if not self.stop.is_set():
                await self.dispatch.finish()
                if keeper is not None:
                    await keeper.abort_stale()
            if sweep and not self.stop.is_set():
                await self._sweep_leftovers(started)
            if self.options.verify and self.manifest is not None and not self.stop.is_set():
                await self._verify()
        except BaseExceptionGroup as group:  # a TaskGroup wraps what its body raised
            raise first_error(group) from None
        except asyncio.CancelledError:
            if not (watchdog and watchdog.done()):
                raise  # cancelled by our caller, not by the grace period running out
            self.interrupted = True
        finally:
            self.pacing.listeners.remove(self._throttled)
            await cancel_and_wait(watchdog, uploader, judging, tuning)
            if self.workers is not None:
                await self.workers.aclose()
            deletes.close()
            markers.close()
            if self.manifest is not None:
                self.manifest.commit()
        if self.workers is not None and self.workers.broken is not None:
            raise self.workers.broken  # workers could not start (parts failed on it: exit 2)
        p = self.pacing
        throttled, retried, expired = (p.throttled - p.run_began[0], p.retried - p.run_began[1],
                                       p.expired - p.run_began[2])
        w = self.workers
        if w is not None:  # the workers' requests, counted in their processes
            throttled, retried, expired = (throttled + w.throttled, retried + w.requests_retried,
                                           expired + w.expired)
        report = self.stats.finish(RunTotals(
            interrupted=self.interrupted or self.driver.interrupted or self.stop.is_set(),
            manifest=str(self.manifest.path) if self.manifest is not None else None,
            manifest_note=self.manifest.rebuilt if self.manifest is not None else None,
            objects_compared=self.driver.compared, bytes_compared=self.driver.bytes_compared,
            requests_throttled=throttled, requests_retried=retried,
            requests_credentials_expired=expired,
            requests_in_flight_low=p.lowest_limit() if throttled else None,
            requests_in_flight_end=p.current_limit() if throttled else None,
            parts_in_flight_peak=self.limits.parts.most_busy,
            parts_in_flight_limit_peak=self.limits.parts.peak,
            tasks=w.tasks if w else 0, tasks_retried=w.tasks_retried if w else 0,
            retried_tasks=tuple(w.retried) if w else (),
            deferred_until=self.driver.completion.young_until,
            limited_by=None if self.options.dry_run else judge(self._timings(meter)),
            concurrency=self._settled()))
        if keeper is not None and self.manifest is not None:
            self.manifest.finish_run(run_id, "interrupted" if report.interrupted else
                                     ("failed" if report.objects_failed else "ok"),
                                     report.to_dict())
            if self.manifest.records_changed or not self.manifest.established:
                # A run that changed nothing leaves the target's copy as it is: a no-op run
                # writes nothing at the target but its lock.
                await keeper.send()
        self.emit(RunFinished(report))
        return report

    async def _delete(self, deletes: Spool, waiting: set[str]) -> None:
        """Markers first, then the rest (``markers.deletes_in_order``)."""
        first, then = deletes_in_order(deletes, waiting, self.emit)
        try:
            for wave in (first, then):
                if wave and not self.stop.is_set():
                    await self.driver.delete(wave)
        finally:
            first.close()
            then.close()

    def _throttled(self, store: str, operation: str, limit: int) -> None:
        """A store said slow down: fewer parts (and, tuned, objects) on the wire too, and the
        report hears of it."""
        self.limits.parts.throttled()
        self.limits.objects.throttled()
        self.emit(RequestThrottled(store, operation, limit))

    async def _sweep_leftovers(self, started: float) -> None:
        assert isinstance(self.dst, TempFileSweeper) and self.manifest is not None
        keep = {u.upload_id for u in self.manifest.open_uploads().values()}
        try:
            swept = await self.dst.sweep_temp_files(keep, older_than=started)
        except OSError as exc:
            log.warning("could not sweep the temporary files a killed run left in %s: %s",
                        self.dst.url, exc)
            return
        if swept:
            log.info("removed %d temporary files a killed run left in %s", len(swept),
                     self.dst.url)

    async def _judge_every(self, seconds: float, found: Callable[[LimitedBy], None]) -> None:
        """What bounded the run over each last ``seconds``, handed to ``found`` when something
        did (on the loop's thread: the meter reads that thread's clock)."""
        while True:
            meter = Meter(*self.pacing.timings())
            workers = self.workers.spent if self.workers is not None else WorkersSpent()
            await asyncio.sleep(seconds)
            verdict = judge(self._timings(meter, since=workers))
            if verdict.verdict != "none":
                found(verdict)

    def _shown(self, found: LimitedBy) -> None:
        """For the progress display."""
        self.emit(Bottleneck(found.verdict, found.describe()))

    def _told(self, found: LimitedBy) -> None:
        """--concurrency auto: the limits that tune themselves grow no further where more
        in flight cannot help."""
        self.limits.objects.bound_by(found.verdict)
        self.limits.parts.bound_by(found.verdict)

    def _timings(self, meter: Meter, since: WorkersSpent | None = None) -> RunTimings:
        """What the run measured since ``meter`` started, with what its workers spent; over a
        window (the workers' figures ``since`` its start), their request times only."""
        t = meter.timings(*self.pacing.timings(), self.src.url, self.dst.url)
        w = self.workers
        if w is None:
            return t
        spent = w.spent if since is None else w.spent.since(since)
        return with_workers(t, spent, w.size, socket.gethostname(), cpu=since is None)

    def _settled(self) -> SettledConcurrency | None:
        limits = self.limits
        if not limits.tuned:
            return None
        return SettledConcurrency(limits.objects.limit, limits.objects.peak, limits.parts.limit,
                                  limits.parts.peak)

    async def _watchdog(self, main: asyncio.Task[Any]) -> None:
        await self.stop.wait()
        await asyncio.sleep(self.options.grace_s)
        log.warning("grace period of %.0fs is over: cancelling work in flight",
                    self.options.grace_s)
        main.cancel()

    async def _verify(self) -> None:
        assert self.manifest is not None
        from ..move.verify import verify_entries  # --verify runs only

        _, problems = await verify_entries(self.dst, self.manifest.entries(), self.limits,
                                           selects=self.options.selects)
        for key, problem in problems:
            self.emit(ObjectFailed(key, "copy", 0, f"verify: {problem}"))
