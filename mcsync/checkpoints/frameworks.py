"""Only complete checkpoints move: the frameworks' own completion signals, in one table.

A trainer on spot capacity writes a checkpoint every few minutes; a sync that starts while one
is being written must not copy half of it, and a reader at the target must never find a
completion marker whose checkpoint's files are not all there. Each framework tells when a
checkpoint directory is complete in its own way; ``FRAMEWORKS`` holds one line per framework.
A key under a checkpoint that is not complete yet is deferred (not copied, not recorded, not
a failure) with the reason, and picked up by a later run or ``--watch`` cycle. Completion
markers are written after every other object of the run (``is_commit_marker``).

The signals are read from the source, once per directory per run: for the first key of each
checkpoint directory, whether a file is there (the run's listing answers for a key it has
passed, such as Orbax's ``_CHECKPOINT_METADATA`` or DCP's ``.metadata``, which sort before
a directory's other files; a HEAD for one still ahead) and a small GET for the files that
name the latest step.
"""

from __future__ import annotations

import bisect
import fnmatch
import re
import time
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass, field

from ..errors import MCSyncError, NotFound
from ..stores.base import ReadStore
from ..types import ObjectInfo

MarkerCheck = Callable[["Source", str], Awaitable[str | None]]
_UNKNOWN = object()
_CACHED = 4096  # answers of the source kept (per kind), and waiting directories named


def _names_another(key: str) -> bool:
    """A root marker naming another directory (``latest``): written whole, and never ahead of
    the directory it names (``run/named_markers.py`` checks that at the target)."""
    name = key.rsplit("/", 1)[-1]
    return any(f.names is not None and f.marker == name for f in FRAMEWORKS)


class Listed:
    """The last keys of the run's listing of the source (at least ``keep``), which come in
    order: whether a key the listing has passed was in it, known without a request."""

    def __init__(self, keep: int = _CACHED) -> None:
        self._keep = keep
        self._keys: list[str] = []  # in order: searched by bisection
        self._from_start = True  # every key listed so far is still held

    def add(self, key: str) -> None:
        # Called for every key of a run: an append, and now and then a cut of the oldest half.
        self._keys.append(key)
        if len(self._keys) > 2 * self._keep:
            del self._keys[:self._keep]
            self._from_start = False

    def holds(self, key: str) -> bool | None:
        """Was ``key`` listed? None when not known: the listing has not reached it yet, or
        passed it longer ago than the keys held."""
        keys = self._keys
        if not keys or key > keys[-1]:
            return None
        if key < keys[0] and not self._from_start:
            return None
        i = bisect.bisect_left(keys, key)
        return keys[i] == key


@dataclass
class Source:
    """The source as the completion checks read it, with what they read cached.
    ``atomic_renames``: a filesystem, where a framework can publish a directory by rename.
    ``listed``: what the run's listing of it has shown so far."""

    store: ReadStore
    atomic_renames: bool = False
    listed: Listed = field(default_factory=Listed)
    _present: dict[str, bool] = field(default_factory=dict)
    _text: dict[str, str | None] = field(default_factory=dict)
    _levels: dict[str, frozenset[str]] = field(default_factory=dict)

    def level(self, directory: str, names: Collection[str]) -> None:
        """The files directly in ``directory`` ("": the root) are ``names``, as a listing of
        that one level showed: whether a file is there is answered from them, no HEAD."""
        self._levels[directory] = frozenset(names)

    async def has(self, key: str) -> bool:
        parent, _, name = key.rpartition("/")
        if parent in self._levels:
            return name in self._levels[parent]
        if key not in self._present:
            known = self.listed.holds(key)
            if known is not None:
                self._present[key] = known
                return known
            try:
                await self.store.head(key)
                self._present[key] = True
            except NotFound:
                self._present[key] = False
        return self._present[key]

    async def text(self, key: str) -> str | None:
        """A small marker file's text (None when it is not there)."""
        if key not in self._text:
            try:
                data = await self.store.get(key)
                self._text[key] = bytes(data[:4096]).decode("utf-8", "replace").strip()
            except NotFound:
                self._text[key] = None
        return self._text[key]

    def trim(self) -> None:
        """Keep the last ``_CACHED`` answers of each kind: a run of a million directories
        must not remember a HEAD for each (keys come in order, so old answers are not asked
        for again)."""
        for cache in (self._present, self._text):
            while len(cache) > _CACHED:
                del cache[next(iter(cache))]


def has_file(name: str) -> MarkerCheck:
    """Complete once ``<dir>/<name>`` exists (it is written last)."""

    async def check(src: Source, directory: str) -> str | None:
        if await src.has(f"{directory}/{name}"):
            return None
        return f"no {name} yet"

    return check


def named_by(marker: str, number: str) -> MarkerCheck:
    """Complete once ``<parent>/<marker>`` names this directory's step or a later one (a
    trainer writes it after the step's directory): ``number`` finds the step in the
    directory's name and in the marker's text."""
    pattern = re.compile(number)

    async def check(src: Source, directory: str) -> str | None:
        parent, _, name = directory.rpartition("/")
        mine = pattern.search(name)
        text = await src.text(f"{parent}/{marker}" if parent else marker)
        theirs = pattern.search(text or "")
        if mine is None:
            return None
        if theirs is None:
            return f"no {marker} naming it yet"
        if int(theirs.group(1)) < int(mine.group(1)):
            return f"{marker} names step {int(theirs.group(1))}, not yet this one"
        return None

    return check


def committed(name: str) -> MarkerCheck:
    """Orbax: on an object store the directory is final once ``<dir>/<name>`` exists; on a
    filesystem it was renamed from its temporary name when done, so it is final as it is."""
    marker = has_file(name)

    async def check(src: Source, directory: str) -> str | None:
        return None if src.atomic_renames else await marker(src, directory)

    return check


def no_sibling(suffix: str) -> MarkerCheck:
    """Complete while no ``<dir><suffix>`` marker stands beside it (NeMo's ``-unfinished``)."""

    async def check(src: Source, directory: str) -> str | None:
        if await src.has(f"{directory}{suffix}"):
            return f"{directory.rsplit('/', 1)[-1]}{suffix} is there: still being written"
        return None

    return check


@dataclass(frozen=True, slots=True)
class Framework:
    """One framework's checkpoint directories, complete when ``check`` says so. Recognised by
    the directory's name (``directory``, a regex) and/or a file in it (``contains``: a glob,
    matched against the directory's first key, or a plain name, looked for with a HEAD —
    only in directories whose name matched, so no HEAD is spent on ordinary data)."""

    name: str
    check: MarkerCheck
    directory: str | None = None
    contains: str | None = None
    marker: str | None = None  # the file that says "complete": written after all the others
    # A marker beside the checkpoints that names the one to load (``--latest-checkpoint``
    # copies that one): its text → the directory's name.
    names: Callable[[str], str] | None = None
    # The marker is written once every rank's files are (after a barrier, or by the
    # coordinator of a collective save), so it vouches for them whatever their age
    # (``--min-age`` holds only files no marker vouches for).
    vouches: bool = True

    def recognises(self, name: str, files: Collection[str]) -> bool:
        """Is a directory called ``name`` holding ``files`` (the names directly in it) one of
        this framework's checkpoints?"""
        if self.directory is not None and not re.fullmatch(self.directory, name):
            return False
        marker = self.contains
        if marker is None:
            return True
        if any(c in marker for c in "*?["):
            return any(fnmatch.fnmatchcase(f, marker) for f in files)
        return marker in files


def _megatron_dir(text: str) -> str:
    # Megatron writes the iteration as a number, or "release" for a converted checkpoint.
    return f"iter_{int(text):07d}" if text.isdigit() else text


FRAMEWORKS: tuple[Framework, ...] = (
    Framework("PyTorch DCP", has_file(".metadata"), contains="*.distcp", marker=".metadata"),
    # DeepSpeed's ``latest`` holds the tag, which is the directory's name.
    Framework("DeepSpeed", named_by("latest", r"global_step(\d+)"), directory=r"global_step\d+",
              marker="latest", names=str),
    Framework("Megatron-LM", named_by("latest_checkpointed_iteration.txt", r"(\d+)"),
              directory=r"iter_\d{7}", marker="latest_checkpointed_iteration.txt",
              names=_megatron_dir),
    Framework("Orbax", committed("commit_success.txt"), directory=r"(.*[_-])?\d+",
              contains="_CHECKPOINT_METADATA", marker="commit_success.txt"),
    Framework("NeMo", no_sibling("-unfinished"), directory=r".*step=\d+.*"),
    # trainer_state.json is the main process's alone: in a distributed run the other ranks'
    # files (rng_state_N.pth, optimizer shards) may come after it, so it vouches for nothing
    # and the directory's files wait out --min-age.
    Framework("Hugging Face Trainer", has_file("trainer_state.json"),
              directory=r"checkpoint-\d+", marker="trainer_state.json", vouches=False),
)
# Files a reader opens first to discover a checkpoint, of any framework: written after every
# other object of the run, so an index never points at shards that are not there yet.
MARKERS = ("*.index.json", "config.json", "latest", "LATEST", "COMMIT", "_SUCCESS",
           *(f.marker for f in FRAMEWORKS if f.marker))
# The markers' patterns as one expression: asked of every key of a run (11 fnmatch calls a
# key cost 12 us).
_MARKER = re.compile("|".join(fnmatch.translate(p) for p in MARKERS))


def is_commit_marker(key: str) -> bool:
    """A file readers open first to find a checkpoint (``MARKERS``): written after everything
    else of the run."""
    return _MARKER.match(key.rsplit("/", 1)[-1]) is not None


# Never copied: a framework's directories in the making, renamed when done (Orbax; the
# Hugging Face Trainer's staging directory in the versions that stage a checkpoint).
IN_THE_MAKING = ("*.orbax-checkpoint-tmp-*", "tmp-checkpoint-*")


async def examine(src: Source, directory: str,
                  files: Collection[str]) -> tuple[Framework, str | None] | None:
    """Whose checkpoint ``directory`` is (``files``: the names directly in it) and why it is
    not complete yet (None: complete), by the same table and checks a sync defers by; None
    when no framework recognises it."""
    name = directory.rsplit("/", 1)[-1]
    found: Framework | None = None
    for framework in FRAMEWORKS:
        if not framework.recognises(name, files):
            continue
        found = found or framework
        try:
            why = await framework.check(src, directory)
        except MCSyncError as exc:  # the signal could not be read: not complete, as a sync
            why = f"cannot read its completion marker: {exc}"
        if why:
            return framework, why
    return None if found is None else (found, None)


class Completion:
    """Per run: is a key's checkpoint complete? ``waiting(info)`` is None when the key may be
    copied, else why it waits. ``min_age_s``: a file modified more recently than that is
    still being written (the source's clock is compared with this machine's).

    Keys come in listing order, so the keys of a directory come together and a directory
    once left never comes back: the verdict is worked out once per directory, and only the
    verdicts of the directories above the current key (and the source's answers of the last
    ``_CACHED`` lookups) are kept, whatever the number of keys."""

    def __init__(self, store: ReadStore, *, min_age_s: float = 0.0,
                 atomic_renames: bool = False, clock: Callable[[], float] = time.time,
                 source: Source | None = None) -> None:
        """``source``: the source as read already (what ``--latest-checkpoint``'s choice
        read answers again, with no request)."""
        self._src = source or Source(store, atomic_renames)
        self._min_age = min_age_s
        self._clock = clock
        self._dirs: dict[str, str | None] = {}  # the current key's directories → verdict
        self._parent: str | None = None  # the directory of the last key asked about
        self._making: str | None = None  # why it is in the making (IN_THE_MAKING), if it is
        self._verdict: str | object | None = _UNKNOWN  # its checkpoints' verdict
        self.waiting_dirs: dict[str, str] = {}  # checkpoint directory → why it waits
        self._complete: set[str] = set()  # checkpoint directories above the key, complete
        # The earliest time a file deferred for its age alone comes of age (a watch wakes
        # then, not an interval later).
        self.young_until: float | None = None

    def listed(self, key: str) -> None:
        """The run's listing of the source reached ``key`` (every key, in order, before the
        ``waiting`` of any key after it): a marker it has passed needs no HEAD."""
        self._src.listed.add(key)

    async def waiting(self, info: ObjectInfo) -> str | None:
        key = info.key
        parent = key.rpartition("/")[0]
        if parent != self._parent:
            self._enter(parent)
        if self._making:
            return self._making
        if self._verdict is _UNKNOWN:
            self._verdict = await self._directories(key.split("/"))
        if self._verdict is not None:
            return self._verdict  # type: ignore[return-value]
        age = self._clock() - info.mtime if info.mtime is not None else None
        if self._min_age and age is not None and age < self._min_age and not (
                self._vouched(key) or _names_another(key)):
            # Only a file no completion marker vouches for waits out --min-age.
            self.young_until = min(self.young_until or float("inf"),
                                   info.mtime + self._min_age)  # type: ignore[operator]
            return f"modified {age:.0f}s ago, within --min-age"
        return None

    def _vouched(self, key: str) -> bool:
        """Is ``key`` in a checkpoint directory whose framework's marker says it is complete
        (its files are written, whatever their age)?"""
        return any(key.startswith(d + "/") for d in self._complete)

    def _enter(self, parent: str) -> None:
        """The first key of another directory: forget what only the directories left behind
        needed."""
        self._parent = parent
        self._verdict = _UNKNOWN
        self._making = None
        parts = parent.split("/") if parent else []
        for part in parts:
            if any(fnmatch.fnmatchcase(part, p) for p in IN_THE_MAKING):
                self._making = f"{part}/ is a checkpoint still being written"
                break
        above = {"/".join(parts[:depth]) for depth in range(1, len(parts) + 1)}
        self._dirs = {d: why for d, why in self._dirs.items() if d in above}
        self._complete &= above
        self._src.trim()

    async def _directories(self, parts: list[str]) -> str | None:
        # Every directory above the key may be a checkpoint (Megatron's iter_0000100/ holds
        # mp_rank_00/); a file name glob (DCP's *.distcp) only speaks for its own directory.
        for depth in range(1, len(parts)):
            directory = "/".join(parts[:depth])
            first = parts[-1] if depth == len(parts) - 1 else None
            if directory not in self._dirs:
                self._dirs[directory] = await self._check(directory, first)
                if self._dirs[directory] and len(self.waiting_dirs) < _CACHED:
                    self.waiting_dirs[directory] = self._dirs[directory] or ""
            if self._dirs[directory]:
                return self._dirs[directory]
        return None

    async def _check(self, directory: str, first_name: str | None) -> str | None:
        vouched = False
        for framework in FRAMEWORKS:
            if not await self._is_one(framework, directory, first_name):
                continue
            try:
                why = await framework.check(self._src, directory)
            except MCSyncError as exc:  # the signal could not be read: wait, do not guess
                why = f"cannot read its completion marker: {exc}"
            if why:
                return f"{framework.name} checkpoint not complete: {why}"
            # A marker vouches only where the framework has one (NeMo's is an absence) that
            # speaks for every rank's files.
            vouched = vouched or (framework.marker is not None and framework.vouches)
        if vouched:
            self._complete.add(directory)
        return None

    async def _is_one(self, framework: Framework, directory: str,
                      first_name: str | None) -> bool:
        name = directory.rsplit("/", 1)[-1]
        marker = framework.contains
        if marker is None or any(c in marker for c in "*?["):
            if first_name is not None and first_name == framework.marker:
                # A DCP directory's .metadata sorts before its *.distcp files: the marker is
                # the first key of a complete one, and speaks for it.
                return framework.directory is None or re.fullmatch(framework.directory,
                                                                   name) is not None
            return framework.recognises(name, () if first_name is None else (first_name,))
        # A plain name is looked for (a HEAD, unless the listing passed it) only in a
        # directory whose name matched.
        return (framework.recognises(name, (marker,))
                and await self._src.has(f"{directory}/{marker}"))
