"""``--latest-checkpoint``: of the checkpoints under a source, only the newest complete one.

What a pod restarted after a preemption runs first, so it costs as little as the choice allows:
a first pass finds the directory, level by level where the store lists by level (S3's
delimiter, a directory's entries: one request for the source's top level, one for each
checkpoint looked into, newest first, until a complete one), and the run then lists only that
directory (and the marker beside it) — a bucket of a hundred checkpoints is never listed key
by key. A store that lists only flat (GCS, Azure) is listed whole for each level asked.

The checkpoints are the directories directly under the source that a framework of
``checkpoints.FRAMEWORKS`` recognises, complete by that table's own checks (the ones a sync
defers by). Where a framework keeps a marker beside them naming the one to load (DeepSpeed's
``latest``, Megatron's ``latest_checkpointed_iteration.txt``), the one it names is chosen:
a restarted trainer loads what the marker says. Otherwise the newest is the highest step
number in a directory's name (``global_step1200``, ``iter_0001200``, ``checkpoint-1200``,
``step=1200``), and where no name holds a number, the directory whose newest file is newest.
A newer checkpoint that is not complete is passed over, with the reason.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from ..errors import NoCheckpoint
from ..stores.base import LevelLister, ReadStore
from ..stores.wrap import PassThrough, unstarted, wrap
from ..types import Level, ObjectInfo
from .frameworks import FRAMEWORKS, IN_THE_MAKING, Source, examine

__all__ = ["Chosen", "Levels", "choose", "only_chosen", "step_of"]

_STEP = re.compile(r"(?:step|iter)[_=-]?(\d+)", re.IGNORECASE)
_LAST_NUMBER = re.compile(r"(\d+)(?!.*\d)")
_LOOKED_FOR = ("checkpoint directories of " + ", ".join(f.name for f in FRAMEWORKS)
               + " directly under it")


@dataclass(frozen=True, slots=True)
class Chosen:
    """The checkpoint a run restores: its directory (a key prefix ending in "/"), whose it is,
    its step (None: no number in its name), the marker beside it that names it (copied too),
    and the newer checkpoints passed over as not complete (prefix, why). ``source``: what
    the choice read of the source, so the run's completion checks ask nothing again, and
    ``levels`` the level it listed last (the chosen directory's, when it was looked into), so
    the run's listing does not ask for it again."""

    directory: str
    framework: str
    step: int | None = None
    marker: ObjectInfo | None = None
    passed_over: tuple[tuple[str, str], ...] = ()
    source: Source | None = field(default=None, compare=False, repr=False)
    levels: _Levels | None = field(default=None, compare=False, repr=False)

    def holds(self, key: str) -> bool:
        return key.startswith(self.directory) or (
            self.marker is not None and key == self.marker.key)


def step_of(name: str) -> int | None:
    """The step a checkpoint directory's name carries: after "step" or "iter" where it says
    so (NeMo's ``...-step=1200-consumed_samples=...``), else its last number."""
    found = _STEP.search(name) or _LAST_NUMBER.search(name)
    return int(found.group(1)) if found else None


async def choose(store: ReadStore, *, atomic_renames: bool = False) -> Chosen:
    """The newest complete checkpoint under ``store``; NoCheckpoint (exit 4) when there is
    none, naming what was looked for and what was passed over."""
    levels = _Levels(store)
    root = await levels.get("")
    src = Source(store, atomic_renames)
    src.level("", [f.key for f in root.files])
    files = {f.key: f for f in root.files}
    for framework in FRAMEWORKS:
        if framework.names is None or framework.marker not in files:
            continue
        text = await src.text(framework.marker)
        if not text:
            continue  # an empty marker names nothing: chosen as if it were not there
        name = framework.names(text)
        if name + "/" not in root.dirs:
            raise NoCheckpoint(f"{store.url}: {framework.marker} names {name!r}, which is not "
                               f"there ({framework.name}): no checkpoint to restore")
        step = step_of(name)
        newer = tuple((d, f"{framework.marker} names {name}") for d in root.dirs
                      if framework.recognises(d[:-1], ()) and step is not None
                      and (n := step_of(d[:-1])) is not None and n > step)
        return Chosen(name + "/", framework.name, step, files[framework.marker], newer, src,
                      levels)
    candidates = [d for d in root.dirs
                  if not any(fnmatch.fnmatchcase(d[:-1], p) for p in IN_THE_MAKING)]
    numbered = sorted(((n, d) for d in candidates if (n := step_of(d[:-1])) is not None),
                      reverse=True)
    passed: list[tuple[str, str]] = []
    for step, d in numbered:
        found = await _complete(levels, src, d, passed)
        if found is not None:
            return Chosen(d, found, step, None, tuple(passed), src, levels)
    newest: tuple[float, str, str] | None = None
    for d in candidates:
        if step_of(d[:-1]) is not None:
            continue
        found = await _complete(levels, src, d, passed)
        if found is not None:
            mtime = max([i.mtime or 0.0 async for i in levels.under(d)], default=0.0)
            if newest is None or mtime > newest[0]:
                newest = (mtime, d, found)
    if newest is not None:
        return Chosen(newest[1], newest[2], None, None, tuple(passed), src, levels)
    why = "; ".join(f"{d}: {reason}" for d, reason in passed[:3])
    raise NoCheckpoint(f"{store.url}: no complete checkpoint: looked for {_LOOKED_FOR}"
                       + (f"; passed over {why}" if why else ""))


async def _complete(levels: _Levels, src: Source, directory: str,
                    passed: list[tuple[str, str]]) -> str | None:
    """The framework whose complete checkpoint ``directory`` is, or None (noting in
    ``passed`` why a checkpoint that is not complete was passed over)."""
    level = await levels.get(directory)
    names = [f.key[len(directory):] for f in level.files]
    src.level(directory[:-1], names)
    found = await examine(src, directory[:-1], names)
    if found is None:
        return None
    framework, why = found
    if why:
        passed.append((directory, f"{framework.name} checkpoint not complete: {why}"))
        return None
    return framework.name


class _Levels:
    """A store's levels: asked of it where it lists by level, else cut from its listing."""

    def __init__(self, store: ReadStore) -> None:
        self.store = store
        self._last: tuple[str, Level] | None = None  # the level got last, until it is used

    async def get(self, prefix: str) -> Level:
        if isinstance(self.store, LevelLister):
            level = await self.store.list_level(prefix)
            self._last = (prefix, level)
            return level
        files: list[ObjectInfo] = []
        dirs: list[str] = []
        async for info in self._flat(prefix):
            rest = info.key[len(prefix):]
            if "/" not in rest:
                files.append(info)
            elif not dirs or not info.key.startswith(dirs[-1]):
                dirs.append(prefix + rest.split("/", 1)[0] + "/")
        return Level(tuple(files), tuple(dirs))

    async def under(self, prefix: str) -> AsyncIterator[ObjectInfo]:
        """Every object under ``prefix``, in byte order."""
        if not isinstance(self.store, LevelLister):
            async for info in self._flat(prefix):
                yield info
            return
        last, self._last = self._last, None
        level = last[1] if last and last[0] == prefix else await self.store.list_level(prefix)
        files = iter(level.files)
        pending = next(files, None)
        for d in level.dirs:
            # A file named "a-b" comes before the directory "a/" (keys in byte order).
            while pending is not None and pending.key < d:
                yield pending
                pending = next(files, None)
            async for info in self.under(d):
                yield info
        if pending is not None:
            yield pending
        for info in files:
            yield info

    async def _flat(self, prefix: str) -> AsyncIterator[ObjectInfo]:
        async for info in self.store.list():
            if info.key.startswith(prefix):
                yield info
            elif info.key > prefix:
                break  # past it: keys come in byte order


class _OnlyChosen(PassThrough):
    """Hooks that make a store's listing the chosen checkpoint and its marker, and pass every
    other operation through."""

    def __init__(self, inner: ReadStore, chosen: Chosen) -> None:
        self._levels = chosen.levels or _Levels(inner)
        self._chosen = chosen

    async def listing(self, entries: AsyncIterator[ObjectInfo]) -> AsyncIterator[ObjectInfo]:
        await unstarted(entries)  # the whole source is not listed
        marker = self._chosen.marker
        if marker is not None and marker.key < self._chosen.directory:
            yield marker
            marker = None
        async for info in self._levels.under(self._chosen.directory):
            yield info
        if marker is not None:
            yield marker


def listed_under(store: ReadStore, prefix: str) -> AsyncIterator[ObjectInfo]:
    """Every object of ``store`` under ``prefix`` ("" or ending in "/"), in byte order: a
    level at a time where the store lists by level, else cut from its listing."""
    return _Levels(store).under(prefix)


Levels = _Levels  # a store's levels, for retention's look at a source (run/prune.py)


def only_chosen(store: ReadStore, chosen: Chosen) -> ReadStore:
    """``store`` seen as holding the chosen checkpoint and its marker alone (keys as they are
    in ``store``); every read passes through."""
    return wrap(store, _OnlyChosen(store, chosen), name="Latest")
