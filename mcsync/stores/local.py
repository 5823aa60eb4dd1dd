"""A local or mounted filesystem (Meta Storage Direct mounts a bucket as a path).

A whole file is written without a name (``O_TMPFILE``) and linked into place; a file written
in parts goes to a hidden temporary file in the target directory and is renamed into place. So
a reader never sees a half-written file. Keys are untrusted: ``..``, absolute paths, empty
components and NUL bytes are refused, and the resolved parent directory must stay inside the
root even when the target tree holds symlinks.
"""

from __future__ import annotations

import asyncio
import os
import re
import stat
from collections.abc import AsyncIterator, Callable, Collection, Iterator
from pathlib import Path
from typing import TypeVar

from ..errors import ConfigError, NotFound, Permanent, PreconditionFailed
from ..types import LOCAL_DISK, ByteRange, Capabilities, Level, ObjectInfo
from .base import Buffer, CheckMode
from .local_files import (
    TMP_MARK,
    LocalCopySource,
    LocalUpload,
    nameless_file,
    on_this_machine,
    pread_exact,
    preadinto_exact,
    publish,
    pwrite_all,
    tmp_name,
    write_nameless,
)
from .local_paths import RootedPaths, is_tmp_name

T = TypeVar("T")

# Exactly the names mcsync gives its hidden files: "." + up to 100 bytes of the file's name +
# TMP_MARK + 12 hex digits (``tmp_name``), or the case probe's 8 (``local_paths``). Only these are
# ever swept (``sweep_temp_files``).
_TMP_NAME = re.compile(r"\..*" + re.escape(TMP_MARK) + r"[0-9a-f]{8}(?:[0-9a-f]{4})?", re.S)
_LIST_BATCH = 256  # entries handed from the walker thread to the event loop at a time
# Files up to this size are read and written on the event loop's thread when the root is on a
# local filesystem: there open + write + rename cost less than handing the work to a worker
# thread and back, whose futex wake-ups, context switches and GIL hand-offs made a download of
# many small files use far more CPU (figures: benchmarks/results/figures-from-code.md). A network
# or FUSE mount (a Meta Storage Direct mount among them) can block for a long time per call,
# so there every file goes to a thread.
_INLINE_MAX = 256 * 1024


class LocalStore:
    """A directory. Implements ``Store`` and the abilities ``Composer``, ``FileTarget`` and
    ``ReadsInto``."""

    # Parts are offsets in one file: any size, any number; nothing is copied on the way out.
    caps = Capabilities(min_part_size=1, max_part_size=1 << 62, max_parts=1 << 31,
                        max_copy_size=1 << 62, send_copies=0)
    # A mounted bucket (FUSE) is treated as a directory too: renames there are the mount's.
    facts = LOCAL_DISK

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(os.path.abspath(root))
        self.url = str(self.root)
        # A small file on a local disk is written right on the event loop (a thread hand-off
        # costs more); the root's filesystem is known when the store is made.
        self._inline_max = _INLINE_MAX if on_this_machine(self.root) else 0
        # Hidden files this store is writing now (their paths): never swept.
        self._in_flight: set[str] = set()
        self._paths = RootedPaths(self.root)  # keys as paths, directories checked
        # New whole files are written nameless and linked into place (``put``) until the
        # filesystem turns out to make no nameless files.
        self._nameless = True

    async def _off_loop(self, size: int, work: Callable[[], T]) -> T:
        """``work()`` in a worker thread, or right here for a small file on a local disk."""
        if size <= self._inline_max:
            return work()
        return await asyncio.to_thread(work)

    # -- keys -------------------------------------------------------------------------------

    def path_for(self, key: str) -> Path:
        """The filesystem path of ``key`` (``RootedPaths.path_for``)."""
        return self._paths.path_for(key)

    def validate_key(self, key: str) -> None:
        self._paths.path_for(key)

    def _hidden_file(self, path: Path, key: str, flags: int,
                     first: Callable[[int], None]) -> tuple[Path, int]:
        """A new hidden temporary file beside ``path`` (its directory made and checked to be
        inside the root), opened with ``flags``, after ``first(fd)``; nothing is left behind
        when that fails. Blocking."""
        parent = self._paths.checked_parent(path, key)
        tmp = parent / tmp_name(path.name)
        self._in_flight.add(str(tmp))  # before it exists: a sweep never sees it unclaimed
        try:
            try:
                fd = os.open(tmp, flags | os.O_CREAT | os.O_EXCL, 0o644)
            except FileNotFoundError:  # its directory was removed since it was checked
                self._paths.recheck_dir(path, key)
                fd = os.open(tmp, flags | os.O_CREAT | os.O_EXCL, 0o644)
        except OSError as exc:  # named by the directory that refused, not the hidden name
            self._in_flight.discard(str(tmp))
            raise OSError(exc.errno, exc.strerror, str(parent)) from None
        except BaseException:
            self._in_flight.discard(str(tmp))
            raise
        try:
            first(fd)
        except BaseException:
            os.close(fd)
            self._done_with(tmp)
            raise
        return tmp, fd

    def _nameless_file(self, path: Path, key: str) -> int | None:
        """A nameless file in the checked directory of ``path`` (``nameless_file``), or None
        where the filesystem makes none. Blocking."""
        parent = self._paths.checked_dir(path, key)
        try:
            try:
                return nameless_file(parent)
            except FileNotFoundError:  # its directory was removed since it was checked
                self._paths.recheck_dir(path, key)
                return nameless_file(parent)
        except OSError as exc:  # named by the directory that refused
            raise OSError(exc.errno, exc.strerror, str(parent)) from None

    def _done_with(self, tmp: Path) -> None:
        """The hidden file is published or given up: remove what is left of it."""
        try:
            tmp.unlink(missing_ok=True)
        finally:
            self._in_flight.discard(str(tmp))

    # -- leftovers --------------------------------------------------------------------------

    async def sweep_temp_files(self, keep: Collection[str] = (), *,
                               older_than: float | None = None) -> list[str]:
        """Remove the hidden temporary files a killed run left under the root; the paths
        removed. Only files named exactly as mcsync names them (``_TMP_NAME``), only regular
        files (never a symlink, never through one: the walk does not follow them), never one
        this store is writing now, never one in ``keep`` (the upload ids of uploads a
        manifest journals for resuming: their temporary paths), and, with ``older_than`` (a
        time.time()), never one modified since then: pass the run's start, so that a
        temporary file of another pair's run writing into the same directories is left to it.
        """

        def sweep() -> list[str]:
            kept = {os.path.abspath(p) for p in keep}
            removed = []
            for dirpath, _, files in os.walk(self.root):
                for name in files:
                    if not _TMP_NAME.fullmatch(name):
                        continue
                    path = os.path.join(dirpath, name)
                    if path in kept or path in self._in_flight:
                        continue
                    try:
                        st = os.lstat(path)
                        if not stat.S_ISREG(st.st_mode) or (
                                older_than is not None and st.st_mtime >= older_than):
                            continue
                        if path in self._in_flight:  # claimed while we looked
                            continue
                        os.unlink(path)
                    except FileNotFoundError:
                        continue
                    removed.append(path)
            return removed

        return await asyncio.to_thread(sweep)

    # -- listing ----------------------------------------------------------------------------

    @staticmethod
    def _names(directory: str) -> list[str]:
        """The names in ``directory`` in key order, a subdirectory's ending in "/" (none when
        it is gone); mcsync's hidden temporary files left out."""
        names: list[str] = []
        try:
            with os.scandir(directory) as it:
                for e in it:
                    name = e.name
                    if is_tmp_name(name):
                        continue
                    if e.is_dir(follow_symlinks=False):
                        names.append(name + "/")
                    elif e.is_file():  # follows file symlinks; skips sockets, fifos, dangling
                        names.append(name)
        except FileNotFoundError:
            return []
        except OSError as exc:  # unreadable: what is in it is unknown, so no run may go on
            raise Permanent(f"{directory}: cannot list this directory: {exc.strerror}") from None
        names.sort()
        return names

    async def list_level(self, prefix: str) -> Level:
        def level() -> Level:
            directory = os.path.join(str(self.root), prefix) if prefix else str(self.root)
            files: list[ObjectInfo] = []
            dirs: list[str] = []
            for name in self._names(directory):
                if name[-1] == "/":
                    dirs.append(prefix + name)
                    continue
                try:
                    st = os.stat(os.path.join(directory, name))
                except (FileNotFoundError, NotADirectoryError):
                    continue  # removed while we listed
                files.append(ObjectInfo(prefix + name, st.st_size, None, st.st_mtime))
            return Level(tuple(files), tuple(dirs))

        return await asyncio.to_thread(level)

    def _walk(self, directory: str, prefix: str) -> Iterator[ObjectInfo]:
        """Depth-first walk in UTF-8 byte order of the *keys*: a directory sorts as
        ``name/``, so ``a/b`` comes after ``a-b`` just as S3 lists them. A directory is held
        as its sorted names only (a fraction of what as many ``DirEntry`` objects hold:
        benchmarks/results/figures-from-code.md), so memory is bounded by the largest directory
        and the depth, never by the number of keys."""
        names = self._names(directory)
        base = directory + os.sep
        stat_ = os.stat
        for name in names:
            if name[-1] == "/":
                yield from self._walk(base + name[:-1], prefix + name)
                continue
            try:
                st = stat_(base + name)
            except (FileNotFoundError, NotADirectoryError):
                continue  # removed (or replaced) while we listed
            yield ObjectInfo(prefix + name, st.st_size, None, st.st_mtime)

    async def list(self) -> AsyncIterator[ObjectInfo]:
        walker = self._walk(str(self.root), "")
        if self._inline_max:
            # A local filesystem (``check`` found out): scandir and stat take microseconds,
            # less than handing batches to a thread, which then holds the GIL against the
            # planner (a million files planned much slower that way:
            # benchmarks/results/2026-12-01.md, *Scale*). The loop is given back every batch.
            n = 0
            for info in walker:
                yield info
                n += 1
                if n >= _LIST_BATCH:
                    n = 0
                    await asyncio.sleep(0)
            return

        def next_batch() -> list[ObjectInfo]:
            batch = []
            for info in walker:
                batch.append(info)
                if len(batch) >= _LIST_BATCH:
                    break
            return batch

        while batch := await asyncio.to_thread(next_batch):
            for info in batch:
                yield info

    # -- reads ------------------------------------------------------------------------------

    async def head(self, key: str) -> ObjectInfo:
        path = self.path_for(key)
        try:
            st = await asyncio.to_thread(os.stat, path)
        except (FileNotFoundError, NotADirectoryError):  # NotADirectory: "f/x", f a file
            raise NotFound(f"{self.url}/{key}: no such file") from None
        if not stat.S_ISREG(st.st_mode):  # a directory is no object (listing shows none)
            raise NotFound(f"{self.url}/{key}: not a file")
        return ObjectInfo(key, st.st_size, None, st.st_mtime)

    async def get(
        self, key: str, rng: ByteRange | None = None, *, expect: ObjectInfo | None = None
    ) -> bytes:
        def read(fd: int, size: int) -> bytes:
            if rng is None:
                return pread_exact(fd, size, 0, key)
            return pread_exact(fd, rng.length, rng.start, key)

        size = rng.length if rng is not None else expect.size if expect is not None else -1
        return await self._off_loop(size if size >= 0 else _INLINE_MAX + 1,
                                    lambda: self._pinned_read(key, expect, read))

    async def read_into(self, key: str, rng: ByteRange, buf: bytearray, *,
                        expect: ObjectInfo | None = None) -> memoryview:
        """Bytes ``rng`` of ``key`` into ``buf`` (pinned as ``get``): no buffer is made."""
        view = memoryview(buf)[:rng.length]

        def read(fd: int, size: int) -> memoryview:
            preadinto_exact(fd, view, rng.start, key)
            return view

        return await self._off_loop(rng.length, lambda: self._pinned_read(key, expect, read))

    def _pinned_read(self, key: str, expect: ObjectInfo | None,
                     read: Callable[[int, int], T]) -> T:
        """``read(fd, size)`` of the file of ``key``, refused (PreconditionFailed) when the
        file is not the version listed as ``expect`` (size + mtime), before or after. Blocking."""
        path = self.path_for(key)
        try:
            fd = os.open(path, os.O_RDONLY)
        except (FileNotFoundError, NotADirectoryError):
            raise NotFound(f"{self.url}/{key}: no such file") from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise NotFound(f"{self.url}/{key}: not a file")
            if expect is not None and (st.st_size != expect.size
                                       or st.st_mtime != expect.mtime):
                raise PreconditionFailed(f"{self.url}/{key}: file changed since it was listed")
            data = read(fd, st.st_size)
            if expect is not None and os.fstat(fd).st_mtime != expect.mtime:
                raise PreconditionFailed(f"{self.url}/{key}: file changed while it was read")
            return data
        finally:
            os.close(fd)

    # -- writes -----------------------------------------------------------------------------

    async def put(self, key: str, data: Buffer, *, mtime: float | None = None,
                  crc32c: int | None = None) -> ObjectInfo:
        path = self.path_for(key)

        def write() -> ObjectInfo:
            if self._nameless:
                fd = self._nameless_file(path, key)
                written = (write_nameless(fd, path, key, data, mtime, self._in_flight)
                           if fd is not None else None)
                if written is not None:
                    return written
                self._nameless = False  # none made or named here: hidden files from now on
            tmp, fd = self._hidden_file(path, key, os.O_WRONLY,
                                        lambda fd: pwrite_all(fd, data, 0))
            try:
                return publish(tmp, fd, path, key, mtime)
            finally:
                self._in_flight.discard(str(tmp))

        return await self._off_loop(len(data), write)

    async def open_upload(
        self, key: str, size: int, *, mtime: float | None = None
    ) -> LocalUpload:
        return await self.open_file(key, size, mtime=mtime)

    async def open_file(self, key: str, size: int, *, mtime: float | None = None) -> LocalUpload:
        path = self.path_for(key)

        def create() -> LocalUpload:
            # sparse; parts land at their offsets in any order
            tmp, fd = self._hidden_file(path, key, os.O_RDWR, lambda fd: os.ftruncate(fd, size))
            return LocalUpload(key, path, tmp, fd, mtime, self._in_flight.discard)

        return await asyncio.to_thread(create)

    async def resume_upload(
        self, key: str, upload_id: str, size: int, *, mtime: float | None = None
    ) -> LocalUpload | None:
        path = self.path_for(key)
        tmp = Path(upload_id)
        if tmp.parent != path.parent or not is_tmp_name(tmp.name):
            return None  # not one of ours for this key: never reopen an arbitrary path

        def reopen() -> LocalUpload | None:
            self._in_flight.add(str(tmp))
            try:
                fd = os.open(tmp, os.O_RDWR)
            except FileNotFoundError:
                self._in_flight.discard(str(tmp))
                return None
            if os.fstat(fd).st_size != size:
                os.close(fd)
                self._in_flight.discard(str(tmp))
                return None
            return LocalUpload(key, path, tmp, fd, mtime, self._in_flight.discard)

        return await asyncio.to_thread(reopen)

    async def abort_upload(self, key: str, upload_id: str) -> None:
        tmp = Path(upload_id)
        if tmp.parent == self.path_for(key).parent and is_tmp_name(tmp.name):
            await asyncio.to_thread(tmp.unlink, missing_ok=True)

    async def delete(self, key: str) -> None:
        path = self.path_for(key)

        def remove() -> None:
            try:
                path.unlink()
            except FileNotFoundError:
                return
            # Tidy directories that the delete emptied, never the root itself.
            parent = path.parent
            while parent != self.root:
                try:
                    parent.rmdir()
                except OSError:
                    break
                self._paths.forget_dir(parent)
                parent = parent.parent

        await asyncio.to_thread(remove)

    def compose_source(self, current: ObjectInfo) -> LocalCopySource:
        return LocalCopySource(current.key, self.path_for(current.key), current.size,
                               current.mtime)

    async def check(self, *, mode: CheckMode) -> None:
        def probe() -> None:
            if mode == "plan":
                existing = self.root
                while not existing.exists() and existing != existing.parent:
                    existing = existing.parent
                if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
                    raise ConfigError(f"{self.url}: cannot create or write this directory")
                return
            if mode == "read":
                if self.root.exists() and not self.root.is_dir():
                    raise ConfigError(f"{self.url}: not a directory (a source is a directory "
                                      "of files)")
                if not self.root.is_dir():
                    raise ConfigError(f"{self.url}: no such directory")
                if not os.access(self.root, os.R_OK | os.X_OK):
                    raise ConfigError(f"{self.url}: directory is not readable")
                return
            try:
                self.root.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise ConfigError(f"{self.url}: cannot create directory: {exc.strerror}") from None
            if not self.root.is_dir():
                raise ConfigError(f"{self.url}: not a directory")
            try:
                self._paths.folds_names()  # the probe a first write would make: a file in the root
            except OSError as exc:
                raise ConfigError(
                    f"{self.url}: directory is not writable: {exc.strerror}") from None

        await asyncio.to_thread(probe)

    def folds_case(self) -> bool:
        """Whether this filesystem finds a file by another case of its name (``CaseFolding``:
        then only one process may write here, the names this process wrote are kept, not
        another's). A probe file in the root, made once; blocking."""
        return self._paths.folds_names()

    async def aclose(self) -> None:
        pass
