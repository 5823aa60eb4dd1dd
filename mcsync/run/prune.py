"""Retention done: the target's checkpoints scanned, the source seen without what would be
pruned at once, and the checkpoints the rules drop deleted from the target, marker first.

A run with ``--keep-last`` scans the source and the target before it moves anything
(``Retention.prepare``: one listing of each) and lists the source through a view of it without
the checkpoints the rules would delete as soon as they arrived (older than the last N complete
ones at either side, no multiple of K): they are not copied, nor the optimizer files of a
thinned one — else every run would copy back what the last one pruned. After the run's
copies, markers and deletes, ``prune`` scans the target again and deletes what
``checkpoints.retention.decide`` drops: the checkpoint's completion marker and the files
readers open first (``plan.is_commit_marker``) before its other files, so a reader never
takes a half-deleted checkpoint for a complete one. A prune cut short (a kill) leaves a
checkpoint without its marker, or one the rules still drop: the next run's scan finds it and
finishes it. Only directories the frameworks table recognises directly under the target's
root are ever deleted from, never the source, never mcsync's own ``.mcsync/``.
"""

from __future__ import annotations

import asyncio
import fnmatch
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from ..checkpoints.frameworks import FRAMEWORKS, Framework, Source, examine, is_commit_marker
from ..checkpoints.latest import Levels, step_of
from ..checkpoints.retention import Checkpoint, Decision, Policy, decide, fate, is_optimizer_file
from ..config import SyncOptions
from ..errors import MCSyncError, NotFound, UsageError
from ..events import (
    CheckpointDurable,
    CheckpointKept,
    CheckpointPruned,
    Event,
    ObjectFailed,
)
from ..stores.base import ReadStore, Store
from ..stores.wrap import PassThrough, wrap
from ..types import RESERVED_PREFIX, ObjectInfo

log = logging.getLogger(__name__)

DELETES_IN_FLIGHT = 32
_RECOGNISE_WITHIN = 16  # a source directory's first keys in which its framework shows


class NoCheckpoints(UsageError):
    """``--keep-last`` and a source with objects but no checkpoint directory (exit 2; a watch
    logs it as a failed cycle and goes on: the trainer may not have written one yet)."""


def _is_glob(name: str) -> bool:
    return any(c in name for c in "*?[")


def policy_of(options: SyncOptions) -> Policy | None:
    if options.keep_last is None:
        return None
    return Policy(options.keep_last, options.keep_every, options.prune_optimizer_older_than)


@dataclass
class _Dir:
    objects: int = 0
    bytes: int = 0
    names: list[str] = field(default_factory=list)  # its files a completion check asks for


@dataclass
class Holdings:
    """What a scan found at a store: its checkpoints, the directories root markers name, and
    each checkpoint directory's framework."""

    checkpoints: list[Checkpoint]
    named: tuple[str, ...]
    frameworks: dict[str, Framework]
    store: ReadStore
    objects: int  # every object under the root (mcsync's own .mcsync/ aside)


# The names a completion check or a framework's recognition asks about (a scan keeps these
# alone of a directory's files, so a target of millions of keys is not held in memory).
_PLAIN = {n for f in FRAMEWORKS for n in (f.marker, f.contains) if n and not _is_glob(n)}
_GLOBS = tuple(f.contains for f in FRAMEWORKS if f.contains and _is_glob(f.contains))


def _keep_name(name: str, kept: list[str]) -> bool:
    if name in _PLAIN or name.endswith("-unfinished"):
        return True
    return any(fnmatch.fnmatchcase(name, g) and not any(fnmatch.fnmatchcase(k, g) for k in kept)
               for g in _GLOBS)


async def scan(store: ReadStore, *, atomic_renames: bool = False) -> Holdings:
    """The checkpoints directly under ``store``'s root, each complete or not by the frameworks
    table (one listing, and a GET of each root marker)."""
    root: list[str] = []
    dirs: dict[str, _Dir] = {}
    objects = 0
    async for info in store.list():
        if info.key.startswith(RESERVED_PREFIX):
            continue
        objects += 1
        top, sep, rest = info.key.partition("/")
        if not sep:
            if _keep_name(top, root):
                root.append(top)
            continue
        d = dirs.setdefault(top, _Dir())
        d.objects += 1
        d.bytes += info.size
        if "/" not in rest and _keep_name(rest, d.names):
            d.names.append(rest)
    src = Source(store, atomic_renames)
    src.level("", root)
    found: list[Checkpoint] = []
    frameworks: dict[str, Framework] = {}
    for name, d in dirs.items():
        src.level(name, d.names)
        seen = await examine(src, name, d.names)
        if seen is None:
            continue
        framework, why = seen
        directory = name + "/"
        found.append(Checkpoint(directory, framework.name, step_of(name), why is None,
                                d.objects, d.bytes))
        frameworks[directory] = framework
    named: list[str] = []
    for framework in FRAMEWORKS:
        if framework.names is None or framework.marker not in root:
            continue
        text = await src.text(framework.marker)
        if text:
            named.append(framework.names(text) + "/")
    return Holdings(found, tuple(named), frameworks, store, objects)


class Retention:
    """One run's retention: the target as scanned before the run, the source's view without
    what would be pruned at once, and the prune after the run."""

    def __init__(self, policy: Policy, target: Store, emit: Callable[[Event], None], *,
                 atomic_renames: bool = False) -> None:
        self.policy = policy
        self.target = target
        self.emit = emit
        self.atomic_renames = atomic_renames
        self.before: Holdings | None = None  # the target, before the run
        self.coming: Holdings | None = None  # the source
        # What a deleted key's record is forgotten by (the run's manifest), so the manifest
        # and the delta's index hold only what the target holds.
        self.forget: Callable[[str], None] = lambda key: None
        self._steps: list[int] = []

    async def prepare(self, source: ReadStore, *, require: bool = True) -> ReadStore:
        """Scan the target and the source; ``source`` listed without the checkpoints
        retention would delete on arrival, nor the optimizer files of those it would thin.
        ``require``: NoCheckpoints (exit 2) for a source that holds objects but no checkpoint
        directory (an empty one passes: a watch started before the first checkpoint)."""
        self.coming = await scan(source, atomic_renames=source.facts.atomic_renames)
        if require and self.coming.objects and not self.coming.checkpoints:
            raise NoCheckpoints(f"{source.url}: --keep-last: no checkpoint directory of "
                                + ", ".join(f.name for f in FRAMEWORKS) + " directly under it")
        self.before = await scan(self.target, atomic_renames=self.atomic_renames)
        # Once the run's copies are there, the complete ones at either side are at the target.
        there = {c.directory: c.step for c in self.before.checkpoints if c.complete}
        there |= {c.directory: c.step for c in self.coming.checkpoints if c.complete}
        self._steps = sorted(s for s in there.values() if s is not None)
        return wrap(source, _Hiding(self), name="Retained")

    def verdict(self, directory: str, framework: Framework) -> Decision:
        """What retention would do with the source's checkpoint ``directory`` once copied."""
        before = self.before
        assert before is not None
        held = next((c for c in before.checkpoints if c.directory == directory), None)
        if held is None or not held.complete:
            # Once copied, it is complete at the target.
            held = Checkpoint(directory, framework.name, step_of(directory[:-1]), True)
        # The source's root marker may name another one (a trainer resumed from an older
        # step): kept, so the marker can follow it.
        named = (*before.named, *(self.coming.named if self.coming else ()))
        return fate(held, self.policy, self._steps, named)

    async def prune(self, *, dry_run: bool = False) -> None:
        """Scan the target and delete what the rules drop (a plan: say what would be,
        counting the source's checkpoints this run would copy as there)."""
        now = await scan(self.target, atomic_renames=self.atomic_renames)
        checkpoints, named = now.checkpoints, now.named
        frameworks = dict(now.frameworks)
        held = {c.directory for c in checkpoints}
        coming = self.coming
        if dry_run and coming is not None:  # as if this run's copies were there
            complete = {c.directory for c in coming.checkpoints if c.complete}
            checkpoints = [c for c in checkpoints if c.directory not in complete]
            checkpoints += [c for c in coming.checkpoints
                            if c.directory in complete or c.directory not in held]
            frameworks = coming.frameworks | frameworks
            named = (*named, *coming.named)
        decisions = decide(checkpoints, self.policy, named)
        for d in decisions:
            if d.keep:
                c = d.checkpoint
                self.emit(CheckpointKept(c.directory, c.step, d.reason, d.thin))
        for d in sorted(decisions, key=lambda d: d.checkpoint.step or 0):  # oldest first
            c = d.checkpoint
            framework = frameworks[c.directory]
            if not d.keep:
                if dry_run:
                    gone = (c.objects, c.bytes)
                else:
                    gone = await self._delete(framework, await self._under(c.directory))
                self.emit(CheckpointPruned(c.directory, c.step, *gone))
            elif d.thin:
                # In a plan, a checkpoint only the source holds yet is looked at there.
                where = self.target if c.directory in held or coming is None else coming.store
                optim = [k for k in await self._under(c.directory, where)
                         if is_optimizer_file(framework.name, k.key[len(c.directory):])]
                if optim:
                    gone = ((len(optim), sum(k.size for k in optim)) if dry_run
                            else await self._delete(framework, optim))
                    self.emit(CheckpointPruned(c.directory, c.step, *gone, thinned=True))
        newest = max((d.checkpoint for d in decisions if d.keep and d.checkpoint.complete
                      and d.checkpoint.step is not None),
                     key=lambda c: c.step or 0, default=None)
        if newest is not None:
            self.emit(CheckpointDurable(newest.directory, newest.step))

    async def _under(self, directory: str, store: ReadStore | None = None) -> list[ObjectInfo]:
        return [i async for i in Levels(store or self.target).under(directory)
                if not i.key.startswith(RESERVED_PREFIX)]

    async def _delete(self, framework: Framework, keys: list[ObjectInfo]) -> tuple[int, int]:
        """The markers first (each gone before any other file goes), then the rest; the
        objects and bytes deleted."""
        first = [k for k in keys if _marks(framework, k.key)]
        rest = [k for k in keys if not _marks(framework, k.key)]
        gone = [0, 0]

        async def one(info: ObjectInfo) -> bool:
            if await self._gone(info.key):
                gone[0] += 1
                gone[1] += info.size
                return True
            return False

        for info in first:
            if not await one(info):
                return gone[0], gone[1]  # its files stay until its marker is gone
        room = asyncio.Semaphore(DELETES_IN_FLIGHT)

        async def limited(info: ObjectInfo) -> None:
            async with room:
                await one(info)

        async with asyncio.TaskGroup() as tg:
            for info in rest:
                tg.create_task(limited(info))
        return gone[0], gone[1]

    async def _gone(self, key: str) -> bool:
        assert not key.startswith(RESERVED_PREFIX)
        try:
            await self.target.delete(key)
        except NotFound:
            pass  # a prune cut short deleted it already
        except MCSyncError as exc:  # the next run's scan finds the checkpoint and tries again
            self.emit(ObjectFailed.of(key, "delete", 0, exc,
                                           f"retention could not delete it: {exc}"))
            return False
        self.forget(key)
        return True


def _marks(framework: Framework, key: str) -> bool:
    name = key.rsplit("/", 1)[-1]
    return name == framework.marker or is_commit_marker(key)


class _Hiding(PassThrough):
    """A source's listing without the keys of checkpoints retention drops on arrival (and
    optimizer files of those it thins). A directory's first keys wait until its framework
    shows (a DCP directory is one by its ``*.distcp`` files)."""

    def __init__(self, retention: Retention) -> None:
        self._retention = retention

    async def listing(self, entries: AsyncIterator[ObjectInfo]) -> AsyncIterator[ObjectInfo]:
        current: str | None = None
        held: list[ObjectInfo] = []
        verdict: tuple[Framework, Decision] | None = None
        decided = False
        async for info in entries:
            top, sep, _ = info.key.partition("/")
            if not sep:
                for h in held:
                    yield h
                held, current, decided = [], None, True
                yield info
                continue
            if top != current:
                for h in held:
                    yield h
                held, current, verdict, decided = [], top, None, False
            if not decided:
                held.append(info)
                names = [h.key[len(top) + 1:] for h in held if "/" not in h.key[len(top) + 1:]]
                framework = next((f for f in FRAMEWORKS if f.recognises(top, names)), None)
                if framework is not None:
                    verdict = (framework, self._retention.verdict(top + "/", framework))
                if verdict is not None or len(held) >= _RECOGNISE_WITHIN:
                    decided = True
                    for h in held:
                        if self._shows(verdict, top, h):
                            yield h
                    held = []
                continue
            if self._shows(verdict, top, info):
                yield info
        for h in held:
            yield h

    @staticmethod
    def _shows(verdict: tuple[Framework, Decision] | None, top: str, info: ObjectInfo) -> bool:
        if verdict is None:
            return True
        framework, decision = verdict
        if not decision.keep:
            return False
        return not (decision.thin
                    and is_optimizer_file(framework.name, info.key[len(top) + 1:]))
