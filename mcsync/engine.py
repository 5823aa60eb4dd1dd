"""One sync run: list → plan → transfer, with every stage streaming.

The engine is the only place that wires the stages together. It owns no terminal and no log
format: all it says, it says as events to the sink it was given.
"""

from __future__ import annotations

import asyncio
import logging

from .config import SyncOptions
from .errors import ListingOrderError, MCSyncError, UnsafeKey, first_error
from .events import (
    EventSink,
    FanOut,
    ListingDone,
    NullSink,
    ObjectDone,
    ObjectFailed,
    ObjectPlanned,
    RunFinished,
    RunStarted,
    StatsCollector,
)
from .limits import Limits
from .listing import merge_join, prefetched
from .plan import Action, is_commit_marker, plan
from .report import SyncReport
from .stores.base import Store
from .stores.registry import open_store
from .transfer import Transfer

log = logging.getLogger(__name__)


async def run_sync(src_url: str, dst_url: str, options: SyncOptions,
                   sink: EventSink | None = None) -> SyncReport:
    """Sync ``src_url`` to ``dst_url``. Raises UsageError/ConfigError (exit 2) before any byte
    moves when either side cannot be used; per-object failures are in the report (exit 1)."""
    src = open_store(src_url, options)
    try:
        dst = open_store(dst_url, options)
    except BaseException:
        await src.aclose()
        raise
    try:
        for _ in range(3):  # each side may need to switch to an ordered listing once
            try:
                return await _Run(src, dst, options, sink or NullSink()).run()
            except ListingOrderError as exc:
                if exc.fallback is None:
                    raise
                log.warning("%s; listing it directory by directory and starting again", exc)
                exc.fallback()
        raise MCSyncError("listings stayed out of order after switching listing mode")
    finally:
        await asyncio.gather(src.aclose(), dst.aclose(), return_exceptions=True)


class _Run:
    def __init__(self, src: Store, dst: Store, options: SyncOptions, sink: EventSink) -> None:
        self.src = src
        self.dst = dst
        self.options = options
        self.stats = StatsCollector(src.url, dst.url, options.dry_run)
        self.sink = FanOut([self.stats, sink])
        self.limits = Limits(options.concurrency, options.memory_limit)
        self.transfer = Transfer(src, dst, options, self.limits, self.sink.emit)
        # Objects in motion at once; their parts share the requests limit beneath.
        self.objects = asyncio.Semaphore(options.concurrency)

    async def run(self) -> SyncReport:
        await self.src.check(mode="read")
        await self.dst.check(mode="plan" if self.options.dry_run else "write")
        self.sink.emit(RunStarted(self.src.url, self.dst.url, self.options.dry_run))
        server_side = self.options.server_side_copy and self.dst.can_copy_from(self.src)
        deletes: list[Action] = []
        markers: list[Action] = []
        try:
            await self._plan_and_copy(server_side, deletes, markers)
            if markers:
                await self._commit_markers(markers)
            if deletes:
                await self._delete(deletes)
        except BaseExceptionGroup as group:  # a TaskGroup wraps what its body raised
            raise first_error(group) from None
        report = self.stats.finish()
        self.sink.emit(RunFinished(report))
        return report

    async def _plan_and_copy(self, server_side: bool, deletes: list[Action],
                             markers: list[Action]) -> None:
        async with (
            prefetched(self.src.list()) as src_list,
            prefetched(self.dst.list()) as dst_list,
            asyncio.TaskGroup() as tg,
        ):
            async for pair in merge_join(src_list, dst_list,
                                         src_name=self.src.url, dst_name=self.dst.url):
                action = plan(pair, self.options, server_side=server_side)
                if action is None:
                    continue
                self.sink.emit(ObjectPlanned(action.key, action.kind, action.size,
                                             action.reason))
                if action.kind == "skip" or self.options.dry_run:
                    continue
                if action.kind == "delete":
                    deletes.append(action)  # deleted after every copy succeeded
                    continue
                if is_commit_marker(action.key):
                    markers.append(action)  # written last, see _commit_markers
                    continue
                await self.objects.acquire()
                tg.create_task(self._execute(action))
            self.sink.emit(ListingDone())

    async def _commit_markers(self, markers: list[Action]) -> None:
        """Index files, config.json and latest/COMMIT markers go last, and only when every
        other object arrived: a reader that finds them finds the whole checkpoint."""
        if self.stats.failed:
            for action in markers:
                self.sink.emit(ObjectFailed(
                    action.key, action.kind, action.size,
                    f"held back: {self.stats.failed} other objects of this sync failed, and "
                    "this file tells readers the checkpoint is complete"))
            return
        async with asyncio.TaskGroup() as tg:
            for action in markers:
                await self.objects.acquire()
                tg.create_task(self._execute(action))

    async def _delete(self, deletes: list[Action]) -> None:
        if self.stats.failed:
            log.warning("not deleting %d target objects: %d objects failed",
                        len(deletes), self.stats.failed)
            return
        async with asyncio.TaskGroup() as tg:
            for action in deletes:
                await self.objects.acquire()
                tg.create_task(self._execute(action))

    async def _execute(self, action: Action) -> None:
        try:
            result = await self.transfer.run(action)
        except (MCSyncError, OSError) as exc:
            self.sink.emit(ObjectFailed(action.key, action.kind, action.size, _describe(exc)))
        except Exception as exc:  # a bug must not take the other objects down with it
            log.exception("unexpected error on %s", action.key)
            self.sink.emit(ObjectFailed(action.key, action.kind, action.size,
                                        f"internal error: {type(exc).__name__}: {exc}"))
        else:
            self.sink.emit(ObjectDone(result))
        finally:
            self.objects.release()


def _describe(exc: BaseException) -> str:
    if isinstance(exc, UnsafeKey):
        return f"unsafe key refused: {exc}"
    if isinstance(exc, OSError) and exc.strerror:
        where = f" ({exc.filename})" if exc.filename else ""
        return f"{exc.strerror}{where}"
    return str(exc)
