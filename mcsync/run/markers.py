"""Completion markers across shards (``--shard I/N``): written by whichever shard finishes last,
and only once every file of their checkpoint is at the target.

A key is one shard's by a hash of its own, so the files of one checkpoint are written by every
shard of a Job, and the shards share nothing but the source and the target. So every shard
plans every marker (``plan``) and holds it back with the rest; once its own copies succeeded, it
asks the target. A marker is written only when every file of its scope is there — the keys under
the marker's directory (markers of deeper directories among them; not the markers beside it)
that the source lists now and that a run would copy (selected, of a complete checkpoint by the
frameworks' own signals), each found at the target as a sync finds a current object (``plan``'s
skip: same ETag, or same size and not older). A marker whose scope is not complete yet is
deferred, not failed: the shard still writing files of it writes it when it finishes.

Why the last shard always writes it: each shard lists the scope only after its own copies
completed, and S3's listings are strongly consistent after a write, so the shard whose copies
complete last finds every other shard's files. Shards finishing together may both write it:
the same bytes, which is harmless; what never happens is a marker before its files. A shard
killed and rerun (a replaced pod) asks again when it finishes. Markers go deepest first, so a
marker beside the checkpoints (DeepSpeed's ``latest``) waits for the markers inside them.

Deletes (``--delete``, every run's): markers first, so a reader never finds a marker whose
files are going; a shard that deferred a marker leaves the deletes under its directory to a
later run, since the target's older marker may name what they remove.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Callable, Collection, Iterable
from typing import TYPE_CHECKING

from ..checkpoints.frameworks import Completion, is_commit_marker
from ..checkpoints.latest import listed_under
from ..config import SyncOptions
from ..events import Event, ObjectDeferred, ObjectPlanned
from ..records import Action, Pair
from ..state.spool import Spool
from ..stores.base import FileTarget, LevelLister, ReadStore
from ..types import RESERVED_PREFIX, ObjectInfo
from .listing import merge_join
from .plan import plan

if TYPE_CHECKING:
    from .driver import Driver


def directory_of(key: str) -> str:
    return key.rpartition("/")[0]


@dataclasses.dataclass
class Scope:
    """One directory's markers and what the target lacks of the files under it."""

    directory: str
    missing: int = 0
    example: str | None = None  # the first key missing, for the message
    files: int = 0
    # the markers beside it: each as the source and the target list it now
    markers: dict[str, tuple[ObjectInfo, ObjectInfo | None]] = dataclasses.field(
        default_factory=dict)


async def commit_when_complete(driver: Driver, markers: Iterable[Action]) -> set[str]:
    """Write the held-back ``markers`` whose scopes are complete at the target, deepest
    first; defer the others (another shard writes them when it finishes). Returns the
    directories of the markers deferred: the target's marker there may still name what a
    delete would remove, so deletes under them wait too (``deletes_in_order``)."""
    waiting: set[str] = set()
    by_depth: dict[int, list[Action]] = {}
    for action in markers:
        by_depth.setdefault(action.key.count("/"), []).append(action)
    files = isinstance(driver.dst, FileTarget)
    for depth in sorted(by_depth, reverse=True):
        actions = by_depth[depth]
        if driver.stop.is_set():
            return waiting
        if driver.failed:  # held back, as a run that is not sharded holds them
            await driver.commit_markers(actions)
            continue
        scopes = await survey(driver, {directory_of(a.key) for a in actions})
        ready = []
        for action in actions:
            verdict, why = _verdict(action, scopes[directory_of(action.key)], files)
            if verdict == "write":
                ready.append(action)
            elif verdict == "defer":
                waiting.add(directory_of(action.key))
                driver.emit(ObjectDeferred(action.key, action.size, why))
            else:  # recorded, so this shard's next run trusts it without asking again
                src, dst = scopes[directory_of(action.key)].markers[action.key]
                assert src is not None and dst is not None
                driver.adopt(src, dst)
                driver.emit(ObjectPlanned(action.key, "skip", action.size, why))
        await driver.commit_markers(ready)
    return waiting


def deletes_in_order(deletes: Spool, waiting: Collection[str],
                     emit: Callable[[Event], None]) -> tuple[Spool, Spool]:
    """A run's deletes in two waves: markers first, so a reader never finds a marker whose
    files are being deleted; then the rest, but for those under a directory of ``waiting``
    (its marker at the target may be an older one that names them), left to a later run."""
    first, then = Spool(), Spool()
    for action in deletes:
        if is_commit_marker(action.key):
            first.add(action)
        elif any(action.key.startswith(f"{d}/") or not d for d in waiting):
            emit(ObjectDeferred(action.key, action.size, "not deleted yet: the marker of its "
                                "directory waits for files of other shards, and the one at "
                                "the target may still name it"))
        else:
            then.add(action)
    return first, then


def _verdict(action: Action, scope: Scope, files: bool) -> tuple[str, str]:
    """("write" | "there" | "defer", why)."""
    if scope.missing:
        return "defer", (f"{scope.missing} of the {scope.files} files of its checkpoint are "
                         f"not at the target yet (e.g. {scope.example}): the shard that "
                         "writes the last of them writes it")
    src, dst = scope.markers.get(action.key, (None, None))
    listed = action.src
    if src is None or listed is None or (src.size, src.etag, src.mtime) != (
            listed.size, listed.etag, listed.mtime):
        return "defer", "changed at the source since it was listed: the next run takes it"
    if dst is not None and _current(src, dst, files):
        return "there", "at the target already (another shard wrote it)"
    return "write", ""


async def survey(driver: Driver, directories: set[str]) -> dict[str, Scope]:
    """What the source holds and the target lacks under each of ``directories`` (all of one
    depth, so no two nest), read now: each side listed under each directory where it lists
    by level, else listed once for all of them."""
    options = driver.options
    files = isinstance(driver.dst, FileTarget)
    completion = Completion(driver.src, min_age_s=options.min_age_s,
                            atomic_renames=driver.src.facts.atomic_renames)
    scopes = {d: Scope(d) for d in directories}
    # --latest-checkpoint's source lists the chosen checkpoint alone: its own listing, cut
    source = _Under(driver.src, by_level=not options.latest_checkpoint)
    target = _Under(driver.dst)
    try:
        for directory in sorted(directories, key=lambda d: f"{d}/" if d else ""):
            await _one(scopes[directory], source, target, completion, driver, files)
    finally:
        await source.aclose()
        await target.aclose()
    return scopes


async def _one(scope: Scope, source: _Under, target: _Under, completion: Completion,
               driver: Driver, files: bool) -> None:
    directory, options = scope.directory, driver.options
    prefix = f"{directory}/" if directory else ""
    async for key, src, dst in merge_join(source.under(prefix), target.under(prefix),
                                          src_name=driver.src.url, dst_name=driver.dst.url):
        if src is None:
            continue
        completion.listed(key)
        if key.startswith(RESERVED_PREFIX) or not options.selects(key):
            continue
        if is_commit_marker(key) and directory_of(key) == directory:
            scope.markers[key] = (src, dst)  # a marker beside it: written with it
            continue
        if await completion.waiting(src):
            continue  # not complete at the source: no shard copies it this run
        if files and src.size == 0 and key.endswith("/"):
            continue  # an S3 "directory marker": no file to write into a file system
        scope.files += 1
        if dst is None or not _current(src, dst, files):
            scope.missing += 1
            scope.example = scope.example or key


class _Under:
    """A store's objects under one prefix after another (prefixes in byte order, none under
    another): a level at a time where the store lists by level, else one listing of the whole
    store cut into windows, so N directories cost one listing, not N."""

    def __init__(self, store: ReadStore, *, by_level: bool = True) -> None:
        self._store = store
        self._by_level = by_level and isinstance(store, LevelLister)
        self._listing: AsyncIterator[ObjectInfo] | None = None
        self._ahead: ObjectInfo | None = None  # the first key past the last window

    async def under(self, prefix: str) -> AsyncIterator[ObjectInfo]:
        if self._by_level:
            async for each in listed_under(self._store, prefix):
                yield each
            return
        if self._listing is None:
            self._listing = self._store.list()
        while True:
            info: ObjectInfo | None = self._ahead or await anext(self._listing, None)
            self._ahead = None
            if info is None:
                return
            if info.key.startswith(prefix):
                yield info
            elif info.key > prefix:
                self._ahead = info
                return

    async def aclose(self) -> None:
        close = getattr(self._listing, "aclose", None)
        if close is not None:
            await close()


def _current(src: ObjectInfo, dst: ObjectInfo, files: bool) -> bool:
    """Would a sync find ``dst`` current, copying nothing (``plan``'s skip: the same ETag, or
    the same size and a target no older than the source)?"""
    action = plan(Pair(src.key, src, dst, None), _PLAIN, server_side=False, files=files)
    return action is not None and action.kind == "skip"


_PLAIN = SyncOptions()  # what is current by metadata alone, whatever the run's options
