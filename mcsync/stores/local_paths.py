"""Keys as paths under a local target's root: a key that could escape the root, or that no
filesystem holds, is refused; a file's directory is made and checked to resolve inside the root
(symlinks in the target tree included) before anything is created in it; and on a filesystem
that does not tell names apart by case, a name that would land on another is refused. Blocking
calls, for the store's worker threads (``local``)."""

from __future__ import annotations

import os
import secrets
import threading
from pathlib import Path

from ..errors import UnsafeKey
from .local_files import TMP_MARK, raw_name

NAME_MAX = 255  # bytes in one file name: Linux's limit on every common filesystem


def is_tmp_name(name: str) -> bool:
    """Is ``name`` one of mcsync's hidden temporary names (never a key's component)?"""
    return name.startswith(".") and TMP_MARK in name


def _inside(path: str, root: str) -> bool:
    """Is the resolved ``path`` under the resolved directory ``root`` (not root itself)?"""
    return path.startswith(root.rstrip(os.sep) + os.sep)


class RootedPaths:
    """The paths of one root's keys, and the directories checked so far."""

    def __init__(self, root: Path) -> None:
        self.root = root
        # Whether the root's filesystem tells names apart by case (not an SMB or vfat mount,
        # a casefolded ext4 directory: there two names that differ only by case would be one
        # file), found by a probe before the first file is written (``folds_names``).
        # ``_names`` holds, per directory, the names in it by their casefold (filled as
        # directories are first written to), under ``_names_lock``.
        self._fold_case: bool | None = None
        self._names: dict[str, dict[str, str]] = {}
        self._names_lock = threading.Lock()
        # Directories made or found, each checked to resolve inside the root: the next file
        # there skips the check (three ``realpath`` walks, a ``mkdir``: most of what a small
        # file cost; benchmarks/results/2026-12-02-stop-24.md). mcsync makes no symlinks, so a
        # checked directory stays inside; one a delete removed is dropped (``forget_dir``),
        # one removed behind our back is checked again when a file cannot be created in it
        # (``recheck_dir``).
        self._checked_dirs: set[str] = set()

    def path_for(self, key: str) -> Path:
        """The filesystem path of ``key``; raises UnsafeKey for anything that could escape,
        and for names no filesystem holds (over 255 bytes) or that are not text."""
        if not key or "\x00" in key:
            raise UnsafeKey(f"{key!r}: empty key or NUL byte")
        if key.startswith("/"):
            raise UnsafeKey(f"{key!r}: absolute path")
        try:
            key.encode("utf-8")
        except UnicodeEncodeError:  # a file name of bytes that are not UTF-8 (os.fsdecode)
            raise UnsafeKey(f"{key!r}: not valid UTF-8 (a file name of the bytes "
                            f"{raw_name(key)!r}: rename it)") from None
        parts = key.split("/")
        if key.endswith("/") and all(p not in ("", ".", "..") for p in parts[:-1]):
            raise UnsafeKey(f"{key!r}: ends with '/' (an S3 directory marker): a file system "
                            "holds no file of that name")
        if any(p in ("", ".", "..") for p in parts):
            raise UnsafeKey(f"{key!r}: '.', '..' or empty path component")
        if any(is_tmp_name(p) for p in parts):
            raise UnsafeKey(f"{key!r}: collides with mcsync's temporary file names")
        for p in parts:
            if len(p.encode()) > NAME_MAX:
                raise UnsafeKey(f"{key!r}: the name {p[:40]!r}... is {len(p.encode())} bytes; "
                                f"a file name holds at most {NAME_MAX}")
        return self.root.joinpath(*parts)

    def checked_dir(self, path: Path, key: str) -> Path:
        """Create the parent directory and make sure it resolves inside the root: the nearest
        directory that exists is checked *before* anything is created, so a symlink inside
        the root that points outside it never gets a directory made at its far end."""
        parent = path.parent
        if str(parent) not in self._checked_dirs:
            self._check_dir(path, key)
        elif self.folds_names():
            self._claim_name(path, key)
        return parent

    def checked_parent(self, path: Path, key: str) -> Path:
        """``checked_dir``, and ``path`` itself is no symlink (a file never replaces one)."""
        parent = self.checked_dir(path, key)
        if os.path.islink(path):
            raise UnsafeKey(f"{key!r}: target is a symlink")
        return parent

    def _check_dir(self, path: Path, key: str) -> None:
        """Make the directory of ``path`` (and its parents) and check that it resolves inside
        the root."""
        parent = path.parent
        real_root = os.path.realpath(self.root)
        existing = parent
        while not existing.exists() and existing != self.root and existing != existing.parent:
            existing = existing.parent
        if existing.exists() and not self._resolves_inside(existing, real_root):
            raise UnsafeKey(f"{key!r}: resolves outside the target root (symlink)")
        if self.folds_names():
            self._claim_name(path, key)
        try:
            parent.mkdir(parents=True, exist_ok=True)
        except (FileExistsError, NotADirectoryError):
            raise UnsafeKey(f"{key!r}: {self._blocking_file(parent)!r} is a file at the target, "
                            "so it cannot also be a directory") from None
        if not self._resolves_inside(parent, real_root):
            raise UnsafeKey(f"{key!r}: resolves outside the target root (symlink)")
        self._checked_dirs.add(str(parent))

    def _resolves_inside(self, directory: Path, real_root: str) -> bool:
        real = os.path.realpath(directory)
        return real == real_root or _inside(real, real_root)

    def _blocking_file(self, parent: Path) -> str:
        """The key of the first file on the way to ``parent`` (which mkdir refused)."""
        for p in reversed([parent, *parent.parents]):
            if p == self.root or self.root not in p.parents:
                continue
            if p.exists() and not p.is_dir():
                return p.relative_to(self.root).as_posix()
        return parent.relative_to(self.root).as_posix()

    def _claim_name(self, path: Path, key: str) -> None:
        """On a filesystem that folds case: refuse ``key`` when one of its names (directories
        and file) differs only by case from a name its directory already holds, or that this
        store wrote this run; else note its names. A file written there would silently
        replace (or land in) the other one. Blocking."""
        rel = path.relative_to(self.root).parts
        with self._names_lock:
            directory = self.root
            for i, name in enumerate(rel):
                names = self._names.get(str(directory))
                if names is None:
                    try:
                        listed = os.listdir(directory)
                    except (FileNotFoundError, NotADirectoryError):
                        listed = []
                    names = {n.casefold(): n for n in listed if not is_tmp_name(n)}
                    self._names[str(directory)] = names
                other = names.setdefault(name.casefold(), name)
                if other != name:
                    where = "/".join((*rel[:i], other))
                    raise UnsafeKey(f"{key!r}: the target holds {where!r}, whose name differs "
                                    "only by case, and its file system does not tell them "
                                    "apart")
                directory = directory / name

    def folds_names(self) -> bool:
        """Whether the root's filesystem finds a file by another case of its name: a probe
        file in the root, made once (blocking), before the first file is written."""
        if self._fold_case is None:
            with self._names_lock:
                if self._fold_case is None:
                    self.root.mkdir(parents=True, exist_ok=True)
                    probe = self.root / f".probe{TMP_MARK}{secrets.token_hex(4)}"
                    probe.touch(exist_ok=False)
                    try:
                        self._fold_case = self._folds_case(probe)
                    finally:
                        probe.unlink()
        return self._fold_case

    @staticmethod
    def _folds_case(probe: Path) -> bool:
        """Does the filesystem of ``probe`` (a file just made) find it by another case?"""
        return probe.with_name(probe.name.upper()).exists()

    def recheck_dir(self, path: Path, key: str) -> None:
        """The directory of ``path`` was removed since it was checked: make and check it
        again."""
        self._checked_dirs.discard(str(path.parent))
        self._check_dir(path, key)

    def forget_dir(self, directory: Path) -> None:
        """``directory`` was removed (a delete emptied it): check it again when next used."""
        self._checked_dirs.discard(str(directory))
