"""The blocking file work of a local store: whole files written without a name and linked into
place (``O_TMPFILE``), uploads into hidden files (parts written at their offsets, renamed into
place on complete) and the hidden names, range copies between files (``copy_file_range``),
exact reads and writes, and which filesystem a path is on. Called from worker threads (or,
for small files on a local disk, the event loop) by ``stores.local.LocalStore``."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import itertools
import os
import re
import secrets
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..errors import NotFound, PreconditionFailed, UnsafeKey
from ..hashing import chunk_digests
from ..types import Buffer, ByteRange, ObjectInfo, PartClaim, PartRef

TMP_MARK = ".mcsync-tmp-"  # in the name of every hidden file mcsync writes

# Data is written in slices of this size, never a whole part at once. Linux sizes page-cache
# folios by the length of each write: a large write gets large folios, taken from the
# high-order free blocks that a VM's free page reporting has handed back to its host, so each
# first touch faults on the host. Too small a slice costs the other way: each os.pwrite drops
# and retakes the GIL. The sizes measured, and why 128 KiB: benchmarks/results/
# 2026-12-02-stop-25.md and benchmarks/results/figures-from-code.md.
WRITE_SLICE = 128 * 1024


@dataclass(frozen=True, slots=True)
class LocalCopySource:
    """The current version of a file, named by its size and mtime (files have no ETag)."""

    key: str
    path: Path
    size: int
    mtime: float | None


class LocalUpload:
    """A temporary file that parts are written into at their offsets, renamed on complete."""

    def __init__(self, key: str, path: Path, tmp: Path, fd: int, mtime: float | None,
                 release: Callable[[str], None] = lambda tmp: None) -> None:
        self.key = key
        self._release = release  # tells the store the hidden file is no longer written
        self._mtime = mtime
        self.upload_id = str(tmp)
        self._path = path
        self._tmp = tmp
        self._fd = fd
        # Held by every write and by close. Writes to one file go one at a time: a buffered
        # write holds the file's inode lock anyway (ext4, xfs), and writers queued in the
        # kernel spin on that lock's owner; queued here they sleep, for less system CPU where
        # parts contend (figures: benchmarks/results/figures-from-code.md). And a writer
        # left running by a cancelled part can never write after close, into a reused
        # descriptor.
        self._fd_lock = threading.Lock()

    @contextlib.contextmanager
    def _open_fd(self) -> Iterator[int]:
        """The file's descriptor, held for one write; OSError once the upload is closed."""
        with self._fd_lock:
            if self._fd < 0:
                raise OSError(errno.EBADF, f"{self.key}: upload already closed")
            yield self._fd

    def write_at(self, offset: int, data: Buffer) -> None:
        with self._open_fd() as fd:
            pwrite_all(fd, data, offset)

    def part_written(self, number: int, size: int) -> PartRef:
        return PartRef(number, "", size)

    async def put_part(self, number: int, offset: int, data: Buffer, *,
                       crc32c: int | None = None) -> PartRef:
        await asyncio.to_thread(self.write_at, offset, data)
        return self.part_written(number, len(data))

    async def copy_part(self, number: int, offset: int, source: LocalCopySource,
                        rng: ByteRange) -> PartRef:
        """Copy bytes of the current file into the new one in the kernel (copy_file_range:
        no copy through user space, a reflink where the filesystem shares extents)."""

        def copy() -> None:
            try:
                fd = os.open(source.path, os.O_RDONLY)
            except FileNotFoundError:
                raise PreconditionFailed(f"{source.key}: gone from the target") from None
            try:
                st = os.fstat(fd)
                if st.st_size != source.size or st.st_mtime != source.mtime:
                    raise PreconditionFailed(
                        f"{source.key}: the target file changed since mcsync wrote it")
                with self._open_fd() as dst:  # a copy writes into the file as write_at does
                    _copy_range(fd, dst, rng, offset, source.key)
            finally:
                os.close(fd)

        await asyncio.to_thread(copy)
        return PartRef(number, "", rng.length)

    async def confirm_parts(self, claims: Sequence[PartClaim]) -> set[int]:
        def check() -> set[int]:
            good = set()
            for c in claims:
                if not c.digest:
                    continue  # a copied part: copying it again costs no transfer
                data = os.pread(self._fd, c.ref.size, c.offset)
                if len(data) != c.ref.size:
                    continue
                ends = list(itertools.accumulate(c.chunks or (c.ref.size,), initial=c.offset))
                ranges = [ByteRange(a, b) for a, b in itertools.pairwise(ends)]
                if b"".join(chunk_digests(data, c.offset, ranges)) == c.digest:
                    good.add(c.ref.number)
            return good

        return await asyncio.to_thread(check)

    async def complete(self, parts: Sequence[PartRef]) -> ObjectInfo:
        def finish() -> ObjectInfo:
            # No fsync: it cost more than the whole transfer (figures:
            # benchmarks/results/figures-from-code.md) and guards
            # only against a crash of the machine, not of mcsync; the rename alone already
            # keeps a half-written file out of sight, as rclone and s5cmd do.
            with self._fd_lock:
                if self._fd < 0:
                    raise NotFound(f"{self.key}: upload already completed or aborted")
                fd, self._fd = self._fd, -1
            try:
                return publish(self._tmp, fd, self._path, self.key, self._mtime)
            except FileNotFoundError:
                if self._tmp.exists():
                    raise
                # completed through another handle, or aborted by id (abort_upload)
                raise NotFound(f"{self.key}: upload already completed or aborted") from None
            finally:
                self._release(str(self._tmp))

        return await asyncio.to_thread(finish)

    async def abort(self) -> None:
        def drop() -> None:
            with self._fd_lock:
                if self._fd >= 0:
                    os.close(self._fd)
                    self._fd = -1
            try:
                self._tmp.unlink(missing_ok=True)
            finally:
                self._release(str(self._tmp))

        await asyncio.to_thread(drop)


# Filesystems on this machine's own disks or memory; anything else (NFS, SMB, a FUSE mount
# of a bucket such as Meta Storage Direct's) is a mount whose calls may block long.
LOCAL_FILESYSTEMS = frozenset({"ext2", "ext3", "ext4", "xfs", "btrfs", "tmpfs", "f2fs", "zfs",
                               "bcachefs", "overlay", "ramfs", "jfs", "reiserfs"})


def on_this_machine(path: Path) -> bool:
    """Whether ``path`` is on one of ``LOCAL_FILESYSTEMS``: not a network or FUSE mount, where
    each call may wait on a server, and where a change made on the other side of the mount (a
    write through the object store) raises no inotify event here."""
    return filesystem_type(path) in LOCAL_FILESYSTEMS


def filesystem_type(path: Path) -> str | None:
    """The type of the filesystem holding ``path`` (or its nearest existing ancestor); None
    where /proc/self/mountinfo cannot be read (not Linux)."""
    try:
        mountinfo = Path("/proc/self/mountinfo").read_text()
    except OSError:
        return None
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    return mount_fstype(mountinfo, os.path.realpath(existing))


def mount_fstype(mountinfo: str, real: str) -> str | None:
    """The filesystem type of the mount (a line of ``mountinfo``) that holds the resolved path
    ``real``: the one with the longest mount point above it, the last listed among equals."""
    best, fstype = -1, None
    for line in mountinfo.splitlines():
        fields, _, after = line.partition(" - ")
        parts = fields.split()
        if len(parts) < 5 or not after:
            continue
        # mount points escape space, tab, newline and backslash as octal (\040)
        mount = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), parts[4])
        inside = real == mount or real.startswith(mount.rstrip("/") + "/")
        if inside and len(mount) >= best:
            best, fstype = len(mount), after.split()[0]
    return fstype


def raw_name(name: str) -> bytes:
    """The bytes of a name as the filesystem holds them (``os.fsdecode`` in reverse)."""
    try:
        return name.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # a surrogate no file name decodes to
        return name.encode("utf-8", "backslashreplace")


def tmp_name(name: str) -> str:
    """The hidden temporary name for a file called ``name``: at most 100 bytes of the name, cut
    at a character (a name of 255 bytes still gets a temporary name of fewer than 255)."""
    stem = raw_name(name)[:100].decode("utf-8", "ignore")
    return f".{stem}{TMP_MARK}{secrets.token_hex(6)}"


def nameless_file(directory: Path) -> int | None:
    """A new file without a name in ``directory`` (``O_TMPFILE``), open for writing; None where
    the filesystem or kernel makes none (FUSE, NFS, not Linux), or ``/proc`` is missing (the
    file is named through it, ``link_nameless``). Until it is named no reader can see it, and
    a killed run leaves nothing of it behind."""
    flag = getattr(os, "O_TMPFILE", 0)
    if not flag or not _PROC_FDS:
        return None
    try:
        return os.open(directory, os.O_WRONLY | flag, 0o644)
    except OSError as exc:
        # EISDIR: a kernel that predates O_TMPFILE read it as O_DIRECTORY alone
        if exc.errno in (errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL):
            return None
        raise


def link_nameless(fd: int, path: Path) -> bool:
    """Give the nameless file ``fd`` the name ``path``, whole and at once; False when a file (or
    anything) is already called that: ``linkat`` never replaces."""
    try:
        # A directory descriptor makes os.link call linkat(2), which follows the /proc link
        # to the file (link(2) would link the /proc entry itself); both paths are absolute,
        # so which directory does not matter.
        os.link(f"/proc/self/fd/{fd}", path, dst_dir_fd=_any_directory(), follow_symlinks=True)
    except FileExistsError:
        return False
    return True


def write_nameless(fd: int, path: Path, key: str, data: Buffer, mtime: float | None,
                   in_flight: set[str]) -> ObjectInfo | None:
    """Write ``data`` into the nameless file ``fd`` (closed here) and name it ``path``: one
    directory entry made, where a hidden file and its rename make two and remove one. A hidden
    name used on the way is in ``in_flight`` while it exists (the sweep leaves it alone).
    None, with nothing written at ``path``, where the file cannot be named through ``/proc``
    (a sandbox that refuses the link): the caller writes it another way."""
    try:
        pwrite_all(fd, data, 0)
        st = stamp(fd, mtime)
        try:
            linked = link_nameless(fd, path)
        except OSError as exc:
            if exc.errno in _NOT_LINKED_HERE:
                return None
            raise
        if not linked:
            _replace_by_nameless(fd, path, key, in_flight)
    finally:
        os.close(fd)
    return ObjectInfo(key, st.st_size, None, st.st_mtime)


def _replace_by_nameless(fd: int, path: Path, key: str, in_flight: set[str]) -> None:
    """``path`` exists: name the file ``fd`` hidden beside it and rename that over it (a
    link never replaces). A symlink there is refused, as ``_checked_parent`` does."""
    if os.path.islink(path):
        raise UnsafeKey(f"{key!r}: target is a symlink")
    tmp = path.parent / tmp_name(path.name)
    in_flight.add(str(tmp))
    try:
        if not link_nameless(fd, tmp):  # 48 random bits already taken
            raise FileExistsError(errno.EEXIST, "temporary name taken", str(tmp))
        try:
            replace(tmp, path, key)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
    finally:
        in_flight.discard(str(tmp))


_PROC_FDS = os.path.isdir("/proc/self/fd")
# linkat(2) through /proc refused by the kernel or a sandbox rather than by the target: the
# hidden file and its rename still work there (ENOENT too: /proc's link, or the directory
# removed since, which that path makes again).
_NOT_LINKED_HERE = frozenset({errno.EPERM, errno.EACCES, errno.EXDEV, errno.EOPNOTSUPP,
                              errno.EINVAL, errno.ENOENT})


@functools.cache
def _any_directory() -> int:
    return os.open("/", os.O_PATH | os.O_DIRECTORY)


def stamp(fd: int, mtime: float | None) -> os.stat_result:
    """Set a written file's mtime to the source's (so the next run's size + mtime comparison
    sees it as current) and read it back, through ``fd``: no path lookups."""
    if mtime is not None:
        os.utime(fd, (mtime, mtime))
    return os.fstat(fd)


def publish(tmp: Path, fd: int, path: Path, key: str, mtime: float | None) -> ObjectInfo:
    """Rename the finished temporary file ``tmp`` (open as ``fd``, closed here) into place,
    carrying the source's mtime so the next run's size + mtime comparison sees the file as
    current. The time is set and read back through ``fd``, so without two path lookups per
    file (a rename changes neither), which saves system time on small files
    (benchmarks/results/2026-12-03-stop-27.md)."""
    try:
        try:
            st = stamp(fd, mtime)
        finally:
            os.close(fd)
        replace(tmp, path, key)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return ObjectInfo(key, st.st_size, None, st.st_mtime)


def replace(tmp: Path, path: Path, key: str) -> None:
    """Rename ``tmp`` over ``path``; a directory there is the key's error, not an OSError."""
    try:
        os.replace(tmp, path)
    except IsADirectoryError:  # rename(2) puts no file in a directory's place
        raise UnsafeKey(f"{key!r}: a directory of that name exists at the target (keys "
                        f"under {key + '/'!r}), so it cannot also be a file") from None


def _copy_range(src_fd: int, dst_fd: int, rng: ByteRange, offset: int, key: str) -> None:
    done = 0
    while done < rng.length:
        try:
            n = os.copy_file_range(src_fd, dst_fd, rng.length - done, rng.start + done,
                                   offset + done)
        except OSError as exc:  # EXDEV, ENOSYS, EINVAL on some filesystems: copy by hand
            if exc.errno not in (errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
                raise
            n = _copy_by_hand(src_fd, dst_fd, rng.start + done, offset + done,
                              rng.length - done)
        if n == 0:
            raise PreconditionFailed(f"{key}: the target file shrank while it was copied")
        done += n


def _copy_by_hand(src_fd: int, dst_fd: int, src_off: int, dst_off: int, length: int) -> int:
    data = os.pread(src_fd, min(length, 8 << 20), src_off)
    pwrite_all(dst_fd, data, dst_off)
    return len(data)


def pwrite_all(fd: int, data: Buffer, offset: int) -> None:
    view = memoryview(data)
    pos = offset
    while view:
        n = os.pwrite(fd, view[:WRITE_SLICE], pos)
        view = view[n:]
        pos += n


def preadinto_exact(fd: int, view: memoryview, offset: int, key: str) -> None:
    got = 0
    while got < len(view):
        n = os.preadv(fd, [view[got:]], offset + got)
        if n == 0:
            raise PreconditionFailed(f"{key}: file shrank while it was read")
        got += n


def pread_exact(fd: int, length: int, offset: int, key: str) -> bytes:
    data = os.pread(fd, length, offset)
    if len(data) == length:
        return data
    chunks = [data]
    got = len(data)
    while got < length:
        more = os.pread(fd, length - got, offset + got)
        if not more:
            raise PreconditionFailed(f"{key}: file shrank while it was read")
        chunks.append(more)
        got += len(more)
    return b"".join(chunks)
