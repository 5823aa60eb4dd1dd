"""The node cache's files: where each lives, and the ``flock`` locks that say who uses one.

``v1/objects/<id>`` holds a complete entry, ``v1/partial/<id>`` one being filled (the same
inode: the filler renames it into ``objects/`` once its bytes are fsynced). Locks are
``flock`` locks, which belong to an open file description and die with the process that
held them, so a lock found free means its holder is gone:

* the filler holds ``LOCK_EX`` on its file from the reservation that created it until the
  entry is marked complete (a waiter that can take it knows the filler died, and takes over);
* a reader of a complete entry holds ``LOCK_SH`` while its file is open, or while its path is
  held (``holds.py``: a descriptor kept open for it), and eviction takes ``LOCK_EX`` without
  waiting, so an open or held entry is never evicted (its blocks would stay allocated,
  uncounted, until the reader closed it; a held path would vanish under its user);
* the filler turns its ``LOCK_EX`` into ``LOCK_SH`` once the entry is complete, so the path it
  hands out is held from the first instant (flock's conversion is not atomic: an eviction may
  take the file in between, which ``downgrade`` sees by its link count).

Eviction renames its victims into ``v1/trash/`` inside its transaction and unlinks them once
it has committed: a large file's unlink does not lengthen the one writer's turn.

Such locks hold only where the kernel that runs every user of the directory keeps them: a
local filesystem. On NFS, Lustre or a FUSE mount they may succeed without excluding anyone
(huggingface_hub#4306), so the cache refuses such a directory.
"""

from __future__ import annotations

import errno
import fcntl
import os
from dataclasses import dataclass
from pathlib import Path

from ..errors import ConfigError
from ..stores.local_files import LOCAL_FILESYSTEMS, filesystem_type

LAYOUT = "v1"


@dataclass(frozen=True, slots=True)
class Layout:
    root: Path  # the cache directory

    @property
    def base(self) -> Path:
        return self.root / LAYOUT

    @property
    def index(self) -> Path:
        return self.base / "index.sqlite"

    def partial(self, entry_id: int) -> Path:
        return Path(f"{self.root}/{LAYOUT}/partial/{entry_id}")  # (one parse: a hit's cost)

    def object(self, entry_id: int) -> Path:
        return Path(f"{self.root}/{LAYOUT}/objects/{entry_id}")

    @property
    def trash(self) -> Path:
        return self.base / "trash"

    def make(self) -> None:
        """Create the directories, refusing a filesystem where locks may not exclude."""
        self.root.mkdir(parents=True, exist_ok=True)
        kind = filesystem_type(self.root)
        if kind is not None and kind not in LOCAL_FILESYSTEMS:
            raise ConfigError(f"{self.root}: the cache directory is on a {kind} filesystem, "
                              "where file locks may not exclude other processes; use a local "
                              f"disk ({', '.join(sorted(LOCAL_FILESYSTEMS))})")
        for sub in ("partial", "objects", "trash"):
            (self.base / sub).mkdir(parents=True, exist_ok=True)

    def index_bytes(self) -> int:
        """The index's files as they stand (the database, its WAL and shared memory)."""
        total = 0
        for suffix in ("", "-wal", "-shm", "-journal"):
            try:
                st = os.stat(f"{self.index}{suffix}")
            except FileNotFoundError:
                continue
            total += max(st.st_size, st.st_blocks * 512)
        return total

    def sync_dir(self, directory: Path) -> None:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def try_lock(path: Path, *, exclusive: bool = True, create: bool = False) -> int | None:
    """An open descriptor of ``path`` holding its lock, taken without waiting; None when
    another holds it. Raises FileNotFoundError when there is no such file (and not
    ``create``)."""
    flags = (os.O_RDWR | os.O_CREAT if create else os.O_RDWR if exclusive else os.O_RDONLY)
    fd = os.open(path, flags | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            return None
        raise
    return fd


def open_shared(path: Path) -> int | None:
    """A read descriptor of a complete entry's file holding ``LOCK_SH`` (waiting out an
    eviction that is deciding on it); None when it is gone or was evicted meanwhile."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    fcntl.flock(fd, fcntl.LOCK_SH)
    if os.fstat(fd).st_nlink == 0:  # evicted while we waited for the lock
        os.close(fd)
        return None
    return fd


def holder_gone(layout: Layout, entry_id: int) -> tuple[int | None, bool]:
    """For an entry marked filling: a descriptor of its file holding ``LOCK_EX`` when its
    filler is gone (the caller takes over), None when the filler is alive; and whether the
    file had to be made. Its file is the partial one, or the object already renamed into
    place by a filler that died before it marked the entry complete; when neither exists
    (an eviction that died between its unlink and its commit), an empty partial file is made,
    and no part recorded for the entry may be trusted."""
    for path in (layout.partial(entry_id), layout.object(entry_id)):
        try:
            return try_lock(path), False
        except FileNotFoundError:
            continue
    return try_lock(layout.partial(entry_id), create=True), True


def downgrade(fd: int) -> int | None:
    """A filler's descriptor, its ``LOCK_EX`` turned into ``LOCK_SH`` (a hold); None, closed,
    when an eviction took the file in the instant between the two."""
    fcntl.flock(fd, fcntl.LOCK_SH)
    if os.fstat(fd).st_nlink == 0:
        os.close(fd)
        return None
    return fd


def to_trash(layout: Layout, entry_id: int) -> list[Path]:
    """Move an entry's files into the trash (inside the transaction that drops it); the paths
    to unlink once it has committed."""
    moved = []
    for kind, path in (("p", layout.partial(entry_id)), ("o", layout.object(entry_id))):
        dest = layout.trash / f"{entry_id}.{kind}"
        try:
            os.rename(path, dest)
        except FileNotFoundError:
            continue
        moved.append(dest)
    return moved


def empty(paths: list[Path]) -> None:
    for path in paths:
        path.unlink(missing_ok=True)


def empty_trash(layout: Layout) -> None:
    """What a process killed between an eviction's commit and its unlinks left behind."""
    with os.scandir(layout.trash) as found:
        empty([Path(e.path) for e in found])
