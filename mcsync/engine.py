"""One sync run: list → plan → transfer → verify → commit, with every stage streaming.

The engine is the only place that wires the stages together and the only writer of object
records to the manifest. It owns no terminal and no log format: all it says, it says as
events to the sink it was given.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import target_copy
from .checkpoints import Completion
from .config import SyncOptions
from .errors import (
    Interrupted,
    ListingOrderError,
    MCSyncError,
    PreconditionFailed,
    SourceGone,
    UnsafeKey,
    first_error,
)
from .events import (
    EventSink,
    FanOut,
    ListingDone,
    NullSink,
    ObjectDeferred,
    ObjectDone,
    ObjectFailed,
    ObjectPlanned,
    RequestThrottled,
    RunFinished,
    RunStarted,
    StatsCollector,
)
from .limits import Limits
from .listing import Handoff, merge_join, prefetched
from .lock import read_lock, run_lock
from .manifest import Manifest, ManifestEntry, default_path, entry_for, pair_id, split_digests
from .plan import Action, Pair, is_commit_marker, plan
from .preflight import check_stores, writable_pair
from .report import SyncReport
from .resilience import Pacing, pacing_of, resilient
from .retry import RetryPolicy, retrying
from .spool import Spool
from .stores.base import (
    FileTarget,
    LocalTree,
    ReadStore,
    ServerSideCopier,
    Store,
    TempFileSweeper,
)
from .stores.registry import StoreOptions, open_store
from .tasks import cancel_and_wait
from .transfer import Transfer
from .types import RESERVED_PREFIX, ObjectInfo

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from .compare import Verdict

MOVES = ("copy", "server_copy", "compare")  # actions that would write the key at the target


ManifestFactory = Callable[[Path, str, str], Manifest]


def target_lock_key(src: ReadStore, dst: ReadStore) -> str:
    return f"{RESERVED_PREFIX}lock-{pair_id(src.url, dst.url)}.json"


async def run_sync(src: str | ReadStore, dst: str | ReadStore, options: SyncOptions,
                   sink: EventSink | None = None, *, stop: asyncio.Event | None = None,
                   manifest_factory: ManifestFactory = Manifest, preflight: bool = True,
                   check_manifest_copy: bool = True) -> SyncReport:
    """Sync ``src`` to ``dst``, each an address or a store object (the caller keeps a store it
    passed in: it is not closed here). Raises UsageError/ConfigError (exit 2) before any byte
    moves when either side cannot be used, and Locked (exit 3) when another run holds the
    pair; per-object failures are in the report (exit 1). Setting ``stop`` asks the run to
    wind down: work in flight gets ``options.grace_s`` seconds, the rest resumes next run.
    ``manifest_factory`` opens the pair's manifest (tests hand in one that crashes). A watch's
    later cycles skip the stores' checks (``preflight``) and, mostly, the look for the
    manifest's copy at the target (``check_manifest_copy``): they cost a listing of the source
    and nothing at the target."""
    stop = stop or asyncio.Event()
    async with contextlib.AsyncExitStack() as opened:
        source = await _store(src, options, opened)
        target = await _store(dst, options, opened)
        # Every request of the run, the checks and the lock's among them, goes through one
        # retry layer; a watch wraps its stores once, for all its cycles.
        pacing = pacing_of(source) or pacing_of(target) or Pacing.for_options(options)
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
        early = locking and not isinstance(target, LocalTree)
        held = (asyncio.create_task(read_lock(target, target_lock_key(source, target)))
                if early else None)
        try:
            if preflight:
                await check_stores(source, target, options)
            if not locking:
                return await _run_with_manifest(source, target, options, sink, stop, path,
                                                manifest_factory, check_manifest_copy)
            # The source is listed while the lock is taken too: each page of a listing is a
            # round trip, and a source's listing needs nothing the lock guards (the target's
            # state and the manifest). Locked out, it is dropped unread.
            async with (prefetched(source.list()) as listing,
                        pair_lock(source, target, options, held=held)):
                return await _run_with_manifest(source, target, options, sink, stop, path,
                                                manifest_factory, check_manifest_copy,
                                                Handoff(listing))
        finally:
            await cancel_and_wait(held, quiet=True)
    raise AssertionError("unreachable")  # the exit stack does not swallow exceptions


def manifest_path(source: ReadStore, target: ReadStore, options: SyncOptions) -> Path:
    return Path(options.manifest) if options.manifest else default_path(source.url, target.url)


def pair_lock(source: ReadStore, target: Store, options: SyncOptions, *,
              held: Awaitable[dict[str, object]] | None = None,
              ) -> contextlib.AbstractAsyncContextManager[None]:
    """The lock that keeps a second run of the pair away (exit 3): see ``lock``. ``held``:
    its lock object, being read already."""
    path = manifest_path(source, target, options)
    return run_lock(path.with_name(path.name + ".lock"), target,
                    target_lock_key(source, target), held=held)


async def _store(where: str | ReadStore, options: SyncOptions,
                 opened: contextlib.AsyncExitStack) -> ReadStore:
    """The store for an address (opened here, closed when the run ends), or the one given."""
    if not isinstance(where, str):
        return where
    store = open_store(where, store_options(options))
    opened.push_async_callback(close_quietly, store)
    return store


def store_options(options: SyncOptions) -> StoreOptions:
    """What of a run's options a store opened for it is told."""
    return StoreOptions(endpoint_url=options.endpoint_url, profile=options.profile,
                        max_connections=options.concurrency)


async def close_quietly(store: ReadStore) -> None:
    with contextlib.suppress(Exception):
        await store.aclose()


async def _run_with_manifest(src: ReadStore, dst: Store, options: SyncOptions,
                             sink: EventSink | None, stop: asyncio.Event, path: Path,
                             manifest_factory: ManifestFactory, check_manifest_copy: bool,
                             listing: Handoff[ObjectInfo] | None = None) -> SyncReport:
    """``listing``: the source's, started already (see run_sync)."""
    manifest: Manifest | None = None
    # A copy just fetched from the target is there: no need to look for it again.
    look = check_manifest_copy
    if options.use_manifest and (path.exists() or not options.dry_run):
        if not path.exists() and (data := await target_copy.fetch(src, dst)) is not None:
            target_copy.install(data, path)
            look = False
        manifest = manifest_factory(path, src.url, dst.url)
    def list_in_order(exc: ListingOrderError) -> None:
        if exc.fallback is None:
            raise exc
        log.warning("%s; listing it directory by directory and starting again", exc)
        exc.fallback()

    try:  # each side may need to switch to an ordered listing once
        return await retrying(
            lambda: _Run(src, dst, options, sink or NullSink(), manifest, stop, look,
                         listing).run(),
            RetryPolicy.immediate(3), retry_on=ListingOrderError, before_retry=list_in_order)
    finally:
        if manifest is not None:
            manifest.close()


class _Run:
    def __init__(self, src: ReadStore, dst: Store, options: SyncOptions, sink: EventSink,
                 manifest: Manifest | None, stop: asyncio.Event, look: bool,
                 listing: Handoff[ObjectInfo] | None = None) -> None:
        self.look = look  # for the manifest's copy at the target before trusting the manifest
        self.listing = listing
        self.src = src
        self.dst = dst
        self.options = options
        self.manifest = manifest
        self.stop = stop
        self.stats = StatsCollector(src.url, dst.url, options.dry_run)
        self.sink = FanOut([self.stats, sink])
        self.limits = Limits(options.concurrency, options.memory_limit)
        self.pacing = pacing_of(src) or Pacing.for_options(options)
        writing = manifest if not options.dry_run else None
        self.transfer = Transfer(src, dst, options, self.limits, self.sink.emit,
                                 journal=writing, stop=stop,
                                 open_uploads=writing.open_uploads() if writing else {},
                                 manifest=manifest)
        # Objects in motion at once; their parts share the requests limit beneath.
        self.objects = asyncio.Semaphore(options.concurrency)
        self.interrupted = False
        self._adopted = 0
        self.completion = Completion(src, min_age_s=options.min_age_s,
                                     atomic_renames=isinstance(src, LocalTree))
        self.compared = 0  # objects whose content was read and hashed (--checksum)
        self.bytes_compared = 0

    async def run(self) -> SyncReport:
        report_extra: dict[str, Any] = {}
        if self.manifest is not None:
            report_extra["manifest"] = str(self.manifest.path)
            report_extra["manifest_note"] = self.manifest.rebuilt
        writing = self.manifest is not None and not self.options.dry_run
        # A killed run may have left hidden temporary files that no journal names.
        sweep = (writing and self.manifest is not None and isinstance(self.dst, TempFileSweeper)
                 and self.manifest.last_status() in ("running", "interrupted"))
        started = time.time()
        run_id = self.manifest.start_run() if writing and self.manifest else 0
        self.sink.emit(RunStarted(self.src.url, self.dst.url, self.options.dry_run))
        server_side = (self.options.server_side_copy and isinstance(self.dst, ServerSideCopier)
                       and self.dst.can_copy_from(self.src))
        trust = (self.manifest is not None and self.manifest.established
                 and not (self.options.delete or self.options.verify or self.options.checksum)
                 and (not self.look
                      or await target_copy.kept(self.src, self.dst, self.limits)))
        deletes, markers = Spool(), Spool()  # held back until every copy is done
        main = asyncio.current_task()
        self.pacing.listeners.append(self._throttled)
        watchdog = asyncio.create_task(self._watchdog(main)) if main else None
        keeper = (target_copy.Keeper(self.src, self.dst, self.manifest, self.options,
                                     self.transfer.uploads)
                  if writing and self.manifest is not None else None)
        uploader = asyncio.create_task(keeper.refresh()) if keeper else None
        try:
            await self._plan_and_copy(server_side, trust, deletes, markers)
            if markers and not self.stop.is_set():
                await self._commit_markers(markers)
            if deletes and not self.stop.is_set():
                await self._delete(deletes)
            if not self.stop.is_set():
                await self.transfer.finish()
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
            await cancel_and_wait(watchdog, uploader)
            deletes.close()
            markers.close()
            if self.manifest is not None:
                self.manifest.commit()
        report = self.stats.finish()
        report.interrupted = self.interrupted or self.stop.is_set()
        report.manifest = report_extra.get("manifest")
        report.manifest_note = report_extra.get("manifest_note")
        report.objects_compared = self.compared
        report.requests_throttled = self.pacing.throttled - self.pacing.run_began[0]
        report.requests_retried = self.pacing.retried - self.pacing.run_began[1]
        report.requests_credentials_expired = self.pacing.expired - self.pacing.run_began[2]
        if report.requests_throttled:
            report.requests_in_flight_low = self.pacing.lowest_limit()
            report.requests_in_flight_end = self.pacing.current_limit()
        report.parts_in_flight_peak = self.limits.parts.most_busy
        report.parts_in_flight_limit_peak = self.limits.parts.peak
        report.bytes_compared = self.bytes_compared
        if keeper is not None and self.manifest is not None:
            self.manifest.finish_run(run_id, "interrupted" if report.interrupted else
                                     ("failed" if report.objects_failed else "ok"),
                                     report.to_dict())
            if self.manifest.records_changed or not self.manifest.established:
                # A run that changed nothing leaves the target's copy as it is: a no-op run
                # writes nothing at the target but its lock.
                await keeper.send()
        self.sink.emit(RunFinished(report))
        return report

    def _throttled(self, store: str, operation: str, limit: int) -> None:
        """A store said slow down: fewer parts on the wire too, and the report hears of it."""
        self.limits.parts.throttled()
        self.sink.emit(RequestThrottled(store, operation, limit))

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

    async def _watchdog(self, main: asyncio.Task[Any]) -> None:
        await self.stop.wait()
        await asyncio.sleep(self.options.grace_s)
        log.warning("grace period of %.0fs is over: cancelling work in flight",
                    self.options.grace_s)
        main.cancel()

    # -- planning ---------------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def _pairs(self, trust: bool) -> AsyncIterator[AsyncIterator[Pair]]:
        manifest = self.manifest
        if trust:
            assert manifest is not None
            targets: AsyncIterator[Any] = _aiter(manifest.entries())
        early = self.listing.take() if self.listing is not None else None
        async with (contextlib.nullcontext(early) if early is not None
                    else prefetched(self.src.list())) as src_list:
            if not trust:
                async with prefetched(self.dst.list()) as dst_list:
                    yield self._listing_pairs(src_list, dst_list)
            else:
                yield self._manifest_pairs(src_list, targets)

    async def _listing_pairs(self, src_list: AsyncIterator[Any],
                             dst_list: AsyncIterator[Any]) -> AsyncIterator[Pair]:
        get = self.manifest.get if self.manifest is not None else (lambda key: None)
        target = _DataSeen(dst_list)
        async for key, s, d in merge_join(src_list, target, src_name=self.src.url,
                                          dst_name=self.dst.url):
            # merge_join reads the target's first entry before its first pair, so a wiped
            # target whose manifest was kept is known to be empty before its first object.
            self.transfer.deltas.target_empty = target.empty
            yield Pair(key, s, d, get(key) if s is not None else None)

    async def _manifest_pairs(self, src_list: AsyncIterator[Any],
                              entries: AsyncIterator[ManifestEntry]) -> AsyncIterator[Pair]:
        async for key, s, known in merge_join(src_list, entries, src_name=self.src.url,
                                              dst_name=f"manifest of {self.dst.url}"):
            yield Pair(key, s, None, known)

    async def _plan_and_copy(self, server_side: bool, trust: bool, deletes: Spool,
                             markers: Spool) -> None:
        files = isinstance(self.dst, FileTarget)  # once: a protocol check costs microseconds
        listed = self.completion.listed  # every source key, in order: markers passed need no HEAD
        async with self._pairs(trust) as pairs, asyncio.TaskGroup() as tg:
            async for pair in pairs:
                if self.stop.is_set():
                    break
                if pair.src is not None:
                    listed(pair.key)
                action = plan(pair, self.options, server_side=server_side,
                              target_listed=not trust, files=files)
                if action is None:
                    continue
                if action.kind in MOVES and action.src is not None:
                    why = await self.completion.waiting(action.src)
                    if why:  # a checkpoint not complete yet: a later run takes it
                        self.sink.emit(ObjectDeferred(action.key, action.size, why))
                        continue
                if action.kind == "compare":  # --checksum: read and hash, then decide
                    await self.objects.acquire()
                    tg.create_task(self._compare(pair, server_side, markers))
                    continue
                self.sink.emit(ObjectPlanned(action.key, action.kind, action.size,
                                             action.reason))
                if action.kind == "skip":
                    if pair.known is None and pair.dst is not None and pair.src is not None:
                        self._adopt(pair.src, pair.dst)
                    continue
                if self.options.dry_run:
                    if self.transfer.deltas.possible(action):
                        await self.objects.acquire()
                        tg.create_task(self._preview_delta(action))
                    continue
                if action.kind == "delete":
                    deletes.add(action)  # deleted after every copy succeeded
                    continue
                if is_commit_marker(action.key):
                    markers.add(action)  # written last, see _commit_markers
                    continue
                await self.objects.acquire()
                tg.create_task(self._execute(action))
            else:
                self.sink.emit(ListingDone())

    async def _compare(self, pair: Pair, server_side: bool, markers: Spool) -> None:
        """Hash what the planner could not decide from metadata; skip (and record the hashes,
        so the next --checksum run reads only the source) or copy."""
        src, dst = pair.src, pair.dst
        assert src is not None and dst is not None
        executing = False
        from .compare import compare  # --checksum runs only

        try:
            verdict = await compare(self.src, self.dst, src, dst, pair.known, self.options,
                                    self.limits)
        except (MCSyncError, OSError) as exc:
            self.sink.emit(ObjectFailed(pair.key, "copy", src.size,
                                        f"comparing content: {_describe(exc)}"))
            self.objects.release()
            return
        self.compared += 1
        self.bytes_compared += verdict.bytes_read
        try:
            if verdict.same:
                action = Action("skip", pair.key, src, dst, verdict.reason)
            else:
                action = Action("server_copy" if server_side else "copy", pair.key, src, dst,
                                verdict.reason)
            self.sink.emit(ObjectPlanned(action.key, action.kind, action.size, action.reason))
            if verdict.same:
                self._adopt(src, dst, verdict)
            elif self.options.dry_run:
                pass
            elif is_commit_marker(action.key):
                markers.add(action)
            else:
                executing = True
                await self._execute(action)  # releases the object slot
        finally:
            if not executing:
                self.objects.release()

    async def _preview_delta(self, action: Action) -> None:
        """Dry run: what a block delta of this object would send (reads the source, sends
        nothing), for ``mcsync plan``."""
        assert action.src is not None
        try:
            found = await self.transfer.deltas.plan(action, action.src)
        except (MCSyncError, OSError) as exc:
            log.warning("%s: no delta preview: %s", action.key, _describe(exc))
            return
        finally:
            self.objects.release()
        if isinstance(found, str):
            log.info("%s: would be sent whole: %s", action.key, found)
        else:
            self.sink.emit(found.event(action.key))

    def _adopt(self, src: ObjectInfo, dst: ObjectInfo, content: Verdict | None = None) -> None:
        """A target object mcsync has no record of but found current (same size and ETag, or
        a target no older than the source): record it, so later runs that trust the manifest
        skip it too. Unless --checksum compared it (``content``: the source's block hashes),
        it has no block hashes, so a later change is copied whole."""
        if self.manifest is None or self.options.dry_run:
            return
        entry = (entry_for(src, dst) if content is None else
                 entry_for(src, dst, digests=split_digests(content.block_hashes),
                           block_size=content.block_size, chunk_sizes=content.chunk_sizes,
                           chunker=content.chunker))
        self.manifest.record_object(entry, durable=False)
        self._adopted += 1
        if self._adopted % 1000 == 0:
            self.manifest.commit()

    async def _commit_markers(self, markers: Spool) -> None:
        """Index files, config.json and latest/COMMIT markers go last, and only when every
        other object arrived: a reader that finds them finds the whole checkpoint."""
        if self.stats.failed:
            for action in markers:
                self.sink.emit(ObjectFailed(
                    action.key, action.kind, action.size,
                    f"held back: {self.stats.failed} other objects of this sync failed, and "
                    "this file tells readers the checkpoint is complete"))
            return
        await self._execute_all(markers)

    async def _delete(self, deletes: Spool) -> None:
        if self.stats.failed:
            log.warning("not deleting %d target objects: %d objects failed",
                        len(deletes), self.stats.failed)
            return
        await self._execute_all(deletes)

    async def _execute_all(self, actions: Spool) -> None:
        async with asyncio.TaskGroup() as tg:
            for action in actions:
                if self.stop.is_set():
                    break
                await self.objects.acquire()
                tg.create_task(self._execute(action))

    async def _verify(self) -> None:
        assert self.manifest is not None
        from .verify import verify_entries  # --verify runs only

        _, problems = await verify_entries(self.dst, self.manifest.entries(), self.limits,
                                           selects=self.options.selects)
        for key, problem in problems:
            self.sink.emit(ObjectFailed(key, "copy", 0, f"verify: {problem}"))

    # -- one object -------------------------------------------------------------------------------

    async def _execute(self, action: Action) -> None:
        try:
            done = await self.transfer.run(action)
        except Interrupted:
            self.interrupted = True
        except PreconditionFailed as exc:  # changed again while its new version was copied
            self.sink.emit(ObjectDeferred(action.key, action.size,
                                          f"still being written: {exc}; a later run takes it"))
        except SourceGone as exc:
            self.sink.emit(ObjectDeferred(action.key, action.size, str(exc)))
        except (MCSyncError, OSError) as exc:
            self.sink.emit(ObjectFailed(action.key, action.kind, action.size, _describe(exc)))
        except Exception as exc:  # a bug must not take the other objects down with it
            log.exception("unexpected error on %s", action.key)
            self.sink.emit(ObjectFailed(action.key, action.kind, action.size,
                                        f"internal error: {type(exc).__name__}: {exc}"))
        else:
            if self.manifest is not None:
                if done.entry is not None:
                    self.manifest.record_object(done.entry)
                else:
                    self.manifest.forget(action.key)
            self.sink.emit(ObjectDone(done.result))
        finally:
            self.objects.release()


class _DataSeen:
    """A target listing passed through: ``empty`` once it ended without one object of data
    (mcsync's own ``.mcsync/`` keys, its lock among them, aside)."""

    def __init__(self, items: AsyncIterator[ObjectInfo]) -> None:
        self._items = items
        self._data = False
        self.empty = False

    def __aiter__(self) -> _DataSeen:
        return self

    async def __anext__(self) -> ObjectInfo:
        try:
            item = await anext(self._items)
        except StopAsyncIteration:
            self.empty = not self._data
            raise
        if not self._data and not item.key.startswith(RESERVED_PREFIX):
            self._data = True
        return item


async def _aiter(items: Iterator[ManifestEntry]) -> AsyncIterator[ManifestEntry]:
    for i, item in enumerate(items):
        yield item
        if i % 1000 == 999:
            await asyncio.sleep(0)  # a page of SQLite rows at a time; let transfers run


def _describe(exc: BaseException) -> str:
    if isinstance(exc, UnsafeKey):
        return f"unsafe key refused: {exc}"
    if isinstance(exc, OSError) and exc.strerror:
        where = f" ({exc.filename})" if exc.filename else ""
        return f"{exc.strerror}{where}"
    return str(exc)
