"""The driver's per-key loop: pairs the source's listing with the target's (or with the
manifest's records), plans each key, holds deletes and checkpoint markers back, hands every
move to the dispatch unit (``dispatch``) and commits what it returns. The only writer of
object records to the manifest.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from ..checkpoints.frameworks import Completion, is_commit_marker
from ..events import (
    Event,
    ListingDone,
    ObjectDeferred,
    ObjectFailed,
    ObjectPlanned,
)
from ..move.context import RunContext
from ..move.dispatch import Dispatch, Outcome, kind_of
from ..object_slots import OBJECT_WORK
from ..records import Action, ManifestEntry, Pair, split_digests
from ..state.holdings import ManifestHoldings
from ..state.manifest import Manifest, entry_for
from ..state.spool import Spool
from ..stores.base import FileTarget
from ..types import RESERVED_PREFIX, ObjectInfo
from .listing import Handoff, merge_join, prefetched
from .named_markers import not_yet
from .plan import plan

if TYPE_CHECKING:
    from ..move.compare import Verdict
    from ..scale.workers import Workers

log = logging.getLogger(__name__)

MOVES = ("copy", "server_copy", "compare")  # actions that would write the key at the target


class Driver:
    """Plans the keys of one run and commits what the dispatch unit returns."""

    def __init__(self, ctx: RunContext, dispatch: Dispatch, *, manifest: Manifest | None,
                 holdings: ManifestHoldings | None, completion: Completion,
                 workers: Workers | None = None) -> None:
        """``dispatch``: where actions are carried out; ``manifest``: the run's, which only
        the driver writes (None: no manifest); ``holdings``: the delta's view of it, told when
        the target is found empty; ``completion``: which source objects are complete enough
        to copy (checkpoints, ``--min-age``); ``workers``: worker processes that take the
        actions of one request each (see ``workers``); everything else is dispatched here."""
        self.src = ctx.src
        self.dst = ctx.dst
        self.options = ctx.options
        self.emit = ctx.emit
        self.stop = ctx.stop
        self.manifest = manifest
        self.dispatch = dispatch
        self.holdings = holdings
        self.completion = completion
        self.workers = workers
        # Objects in motion at once (tuned with --concurrency auto); their parts share the
        # requests limit beneath.
        self.objects = ctx.limits.objects
        self.interrupted = False
        # Objects of this run that failed, each told by this driver (every ObjectFailed before
        # the markers and deletes is): a failure holds the markers and deletes back.
        self.failed = 0
        self.compared = 0  # objects whose content was read and hashed (--checksum)
        self.bytes_compared = 0
        self._adopted = 0

    # -- pairs ------------------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def _pairs(self, trust: bool,
                     listing: Handoff[ObjectInfo] | None) -> AsyncIterator[AsyncIterator[Pair]]:
        manifest = self.manifest
        if trust:
            assert manifest is not None
            targets: AsyncIterator[Any] = _aiter(manifest.entries())
        early = listing.take() if listing is not None else None
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
        target = _TargetListing(dst_list)
        async for key, s, d in merge_join(src_list, target, src_name=self.src.url,
                                          dst_name=self.dst.url):
            # merge_join reads the target's first entry before its first pair, so a wiped
            # target whose manifest was kept is known to be empty before its first object.
            if self.holdings is not None:
                self.holdings.target_empty = target.empty
            yield Pair(key, s, d, get(key) if s is not None else None,
                       journalled=s is not None and self.dispatch.journalled(key))

    async def _manifest_pairs(self, src_list: AsyncIterator[Any],
                              entries: AsyncIterator[ManifestEntry]) -> AsyncIterator[Pair]:
        async for key, s, known in merge_join(src_list, entries, src_name=self.src.url,
                                              dst_name=f"manifest of {self.dst.url}"):
            yield Pair(key, s, None, known)

    # -- the loop ---------------------------------------------------------------------------------

    async def plan_and_copy(self, server_side: bool, trust: bool, deletes: Spool,
                            markers: Spool, listing: Handoff[ObjectInfo] | None = None) -> None:
        """``listing``: the source's, started already by the engine (None: listed here)."""
        files = isinstance(self.dst, FileTarget)  # once: a protocol check costs microseconds
        listed = self.completion.listed  # every source key, in order: markers passed need no HEAD
        async with self._pairs(trust, listing) as pairs, asyncio.TaskGroup() as tg:
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
                        self._emit(ObjectDeferred(action.key, action.size, why))
                        continue
                if action.kind == "compare":  # --checksum: read and hash, then decide
                    await self.objects.acquire()
                    tg.create_task(self._compare(pair, server_side, markers))
                    continue
                self._emit(ObjectPlanned(action.key, action.kind, action.size,
                                             action.reason))
                if action.kind == "skip":
                    if pair.known is None and pair.dst is not None and pair.src is not None:
                        self.adopt(pair.src, pair.dst)
                    continue
                if self.options.dry_run:
                    if self.dispatch.may_go_as_delta(action):
                        await self.objects.acquire()
                        tg.create_task(self._preview_delta(action))
                    continue
                if action.kind == "delete":
                    deletes.add(action)  # deleted after every copy succeeded
                    continue
                if is_commit_marker(action.key):
                    markers.add(action)  # written last, see commit_markers
                    continue
                await self._start(tg, action)
            else:
                self._emit(ListingDone())

    async def _compare(self, pair: Pair, server_side: bool, markers: Spool) -> None:
        """Hash what the planner could not decide from metadata; skip (and record the hashes,
        so the next --checksum run reads only the source) or copy."""
        src, dst = pair.src, pair.dst
        assert src is not None and dst is not None
        executing = False
        try:
            verdict = await self.dispatch.compare(pair)
            if isinstance(verdict, ObjectFailed):
                self._emit(verdict)
                return
            self.compared += 1
            self.bytes_compared += verdict.bytes_read
            if verdict.same:
                action = Action("skip", pair.key, src, dst, verdict.reason)
            else:
                action = Action("server_copy" if server_side else "copy", pair.key, src, dst,
                                verdict.reason)
            self._emit(ObjectPlanned(action.key, kind_of(action), action.size,
                                         action.reason))
            if verdict.same:
                self.adopt(src, dst, verdict)
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
        try:
            found = await self.dispatch.preview_delta(action)
        finally:
            self.objects.release()
        if found is not None:
            self._emit(found)

    def adopt(self, src: ObjectInfo, dst: ObjectInfo, content: Verdict | None = None) -> None:
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

    async def commit_markers(self, markers: Iterable[Action]) -> None:
        """Index files, config.json and latest/COMMIT markers go last, and only when every
        other object arrived: a reader that finds them finds the whole checkpoint."""
        if self.failed:
            for action in markers:
                self._emit(ObjectFailed(
                    action.key, kind_of(action), action.size,
                    f"held back: {self.failed} other objects of this sync failed, and "
                    "this file tells readers the checkpoint is complete"))
            return
        if self.options.latest_checkpoint:
            # The choice read the marker before it listed the directory it names: no race.
            await self._execute_all(markers)
            return
        await self._execute_all(await self._ready(markers))

    async def _ready(self, markers: Iterable[Action]) -> list[Action]:
        """The markers that may go: one naming another directory only once that directory is
        complete at the target (``named_markers.not_yet``); the others wait, deferred."""
        ready: list[Action] = []
        for action in markers:
            why = await not_yet(self.src, self.dst, action, self.options.selects)
            if why:
                self._emit(ObjectDeferred(action.key, action.size, why))
            else:
                ready.append(action)
        return ready

    async def delete(self, deletes: Spool) -> None:
        if self.failed:
            log.warning("not deleting %d target objects: %d objects failed",
                        len(deletes), self.failed)
            return
        await self._execute_all(deletes)

    async def _execute_all(self, actions: Iterable[Action]) -> None:
        async with asyncio.TaskGroup() as tg:
            for action in actions:
                if self.stop.is_set():
                    break
                await self._start(tg, action)

    # -- one object -------------------------------------------------------------------------------

    async def _start(self, tg: asyncio.TaskGroup, action: Action) -> None:
        """Set ``action`` going once there is room: on a worker process when it is one
        request, else here."""
        workers = self.workers
        if workers is not None and self.dispatch.is_whole(action):
            await workers.room.acquire()
            tg.create_task(self._on_worker(workers, action))
            return
        await self.objects.acquire()
        tg.create_task(self._execute(action))

    async def _on_worker(self, workers: Workers, action: Action) -> None:
        try:
            outcome = await workers.run(action)
        finally:
            workers.room.release()
        if outcome.handed_back:  # grew past one request since it was listed: moved here
            await self.objects.acquire()
            await self._execute(action)
            return
        self.commit(outcome)

    async def _execute(self, action: Action) -> None:
        try:
            outcome = await self.dispatch.run(action)
            self.commit(outcome)
            self.objects.moved(action.size + OBJECT_WORK)
        finally:
            self.objects.release()

    def _emit(self, event: Event) -> None:
        if isinstance(event, ObjectFailed):
            self.failed += 1
        self.emit(event)

    def commit(self, outcome: Outcome) -> None:
        """Record what an action came to (the record first, so an object reported done is
        recorded), then report it."""
        if outcome.event is None:
            self.interrupted = True
            return
        if self.manifest is not None:
            if outcome.record is not None:
                self.manifest.record_object(outcome.record)
            elif outcome.forget:
                self.manifest.forget(outcome.key)
        self._emit(outcome.event)


class _TargetListing:
    """A target listing passed through: ``empty`` once it ended without one object of data
    (mcsync's own ``.mcsync/`` keys, its lock among them, aside)."""

    def __init__(self, items: AsyncIterator[ObjectInfo]) -> None:
        self._items = items
        self._data = False
        self.empty = False

    def __aiter__(self) -> _TargetListing:
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
