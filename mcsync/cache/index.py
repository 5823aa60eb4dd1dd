"""The node cache's index: one SQLite database (WAL) that every process sharing the cache
directory reads and writes. It is the truth of what the cache holds; start-up reads it and
never walks the directories.

An entry is one version of one object (URL, version: the ETag, or a GCS generation), filling
or complete; each part of a filling entry is recorded once its bytes are on disk (after
fdatasync), with its digest, so a filler that died is taken up where it stopped and a reader
may read what landed. Space is reserved by inserting a filling entry with its charge, in the
transaction that found room for it (``BEGIN IMMEDIATE``: one writer at a time).

Reads go through a connection of each thread's own, outside any lock of this process: in WAL
mode they neither wait for a writer nor make one wait, so a hit in one thread never queues
behind another thread's reservation (which may wait for another process's transaction).
"""

from __future__ import annotations

import fcntl
import os
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from ..types import ObjectInfo

SCHEMA_VERSION = 1
State = Literal["filling", "complete"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS settings (name TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS entries (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    url TEXT NOT NULL,
    version TEXT NOT NULL,
    size INTEGER NOT NULL CHECK (size >= 0),
    etag TEXT, generation TEXT, mtime REAL,
    state TEXT NOT NULL CHECK (state IN ('filling', 'complete')),
    charge INTEGER NOT NULL CHECK (charge >= size),
    part_size INTEGER NOT NULL CHECK (part_size > 0),
    digest TEXT CHECK (state = 'filling' OR digest IS NOT NULL),
    last_access REAL NOT NULL,
    checked_at REAL NOT NULL,
    warmed_by TEXT,
    UNIQUE (url, version)
);
CREATE INDEX IF NOT EXISTS entries_by_access ON entries (state, last_access);
CREATE TABLE IF NOT EXISTS parts (
    entry INTEGER NOT NULL REFERENCES entries (id) ON DELETE CASCADE,
    number INTEGER NOT NULL,
    digest BLOB NOT NULL,
    PRIMARY KEY (entry, number)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS pins (prefix TEXT PRIMARY KEY);
"""


def version_of(info: ObjectInfo) -> str:
    """What tells two versions of an object apart: its generation where the store has one
    (GCS), else its ETag, else size and mtime."""
    if info.version:
        return f"g:{info.version}"
    if info.etag:
        return f"e:{info.etag}"
    return f"s:{info.size}:{info.mtime}"


def pinned(url: str, pins: list[str]) -> bool:
    """Whether a pin holds ``url``: a pin is an object's URL, or a prefix ending in ``/``."""
    return any(url == p or (p.endswith("/") and url.startswith(p)) for p in pins)


@dataclass(frozen=True, slots=True)
class Entry:
    id: int
    url: str
    version: str
    size: int
    etag: str | None
    generation: str | None
    mtime: float | None
    state: State
    charge: int
    part_size: int
    digest: str | None
    last_access: float
    checked_at: float
    warmed_by: str | None

    @property
    def parts(self) -> int:
        return max(1, -(-self.size // self.part_size))

    def info(self, key: str) -> ObjectInfo:
        """The version this entry holds, as a store's ``expect=`` pins a read to it."""
        return ObjectInfo(key, self.size, self.etag, self.mtime, self.generation)


_COLUMNS = ("id, url, version, size, etag, generation, mtime, state, charge, part_size, digest, "
            "last_access, checked_at, warmed_by")


class Index:
    """The database, shared by this process's threads (one connection, a lock) and, through
    SQLite's own locks, by other processes."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.RLock()
        self._local = threading.local()
        self._readers: list[sqlite3.Connection] = []
        self._gate = Gate()
        self._generation = 0  # of the connections: a fork closes them all (``suspend``)
        # Setting WAL on a new file takes a lock SQLite does not wait for (no busy handler): a
        # second process opening the same new cache failed "database is locked". The openers
        # take turns for the setup instead.
        with _setup_turn(path):
            self._db: sqlite3.Connection | None = self._connect()
            self._db.execute("PRAGMA journal_mode=WAL")
            # The WAL is checkpointed every 64 pages and cut back after, so the index stays near
            # its own size: its bytes count against the cache's limit (space.INDEX_HEADROOM).
            with self.transaction() as db:
                for statement in _SCHEMA.split(";"):
                    if statement.strip():
                        db.execute(statement)
                found = db.execute("SELECT value FROM settings WHERE name='schema'").fetchone()
                if found is None:
                    db.execute("INSERT INTO settings VALUES ('schema', ?)",
                               (str(SCHEMA_VERSION),))
                elif int(found[0]) != SCHEMA_VERSION:
                    raise RuntimeError(f"{path}: cache index of schema {found[0]}, this mcsync "
                                       f"reads {SCHEMA_VERSION}")

    def _connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, timeout=60.0, isolation_level=None,
                             check_same_thread=False)
        # The WAL is checkpointed every 64 pages and cut back after, so the index stays near
        # its own size: its bytes count against the cache's limit (space.INDEX_HEADROOM).
        db.execute("PRAGMA wal_autocheckpoint=64")
        db.execute("PRAGMA journal_size_limit=262144")
        # Commits are durable against a killed process without an fsync each (WAL); after a
        # power loss the last ones may be missing, which costs refetched parts, never wrong
        # bytes: a part is recorded after its own fdatasync, an entry complete after its fsync.
        db.execute("PRAGMA synchronous=NORMAL")
        db.execute("PRAGMA foreign_keys=ON")
        return db

    def close(self) -> None:
        with self._gate.exclusive(), self._lock:
            self._close_all()

    def _close_all(self) -> None:
        for reader in self._readers:
            reader.close()
        self._readers.clear()
        if self._db is not None:
            self._db.close()
            self._db = None
        self._generation += 1

    def suspend(self) -> None:
        """Before a fork: wait for this process's index work to end, and close every
        connection, so the child inherits no SQLite state (SQLite shares its locks' bookkeeping
        between the connections of a process by file; a child that opened the index again
        beside an inherited connection would rely on locks its parent holds, not it). Until
        ``resume``, index work waits; then it reopens its connections."""
        self._gate.acquire_exclusive()
        with self._lock:
            self._close_all()

    def resume(self) -> None:
        self._gate.release_exclusive()

    def _read(self) -> sqlite3.Connection:
        """This thread's connection for reads (autocommit: each statement sees the latest
        commit); the caller is inside the gate."""
        db: sqlite3.Connection | None = getattr(self._local, "db", None)
        if db is None or getattr(self._local, "generation", -1) != self._generation:
            db = sqlite3.connect(self.path, timeout=60.0, isolation_level=None,
                                 check_same_thread=False)
            db.execute("PRAGMA query_only=ON")
            # A hit reads a page or two of an index: a page cache of its own per thread (the
            # default's 2 MiB, times the loop's worker threads) is memory and no speed
            db.execute("PRAGMA cache_size=-128")
            with self._lock:
                self._readers.append(db)
            self._local.db, self._local.generation = db, self._generation
        return db

    def _fetch(self, sql: str, args: tuple[Any, ...] = ()) -> list[Any]:
        with self._gate.shared():
            return self._read().execute(sql, args).fetchall()

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """One write transaction (taken at once: no deadlock between two upgrading readers)."""
        with self._gate.shared(), self._lock:
            if self._db is None:
                self._db = self._connect()
            db = self._db
            db.execute("BEGIN IMMEDIATE")
            try:
                yield db
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")

    def _one(self, sql: str, args: tuple[Any, ...]) -> Entry | None:
        rows = self._fetch(f"SELECT {_COLUMNS} FROM entries WHERE {sql}", args)
        return Entry(*rows[0]) if rows else None

    # -- reads -----------------------------------------------------------------------------

    def get(self, entry_id: int) -> Entry | None:
        return self._one("id = ?", (entry_id,))

    def find(self, url: str, version: str) -> Entry | None:
        return self._one("url = ? AND version = ?", (url, version))

    def newest_complete(self, url: str) -> Entry | None:
        """The complete entry of ``url`` most recently found current (its other versions
        age out)."""
        # (+state: the url index, not entries_by_access, which would scan every entry)
        return self._one("url = ? AND +state = 'complete' ORDER BY checked_at DESC, id DESC "
                         "LIMIT 1", (url,))

    def entries(self, prefix: str = "") -> list[Entry]:
        rows = self._fetch(
            f"SELECT {_COLUMNS} FROM entries WHERE substr(url, 1, ?) = ? ORDER BY url, id",
            (len(prefix), prefix))
        return [Entry(*r) for r in rows]

    def entries_of(self, url: str) -> list[Entry]:
        """The entries (every version) of one object."""
        rows = self._fetch(f"SELECT {_COLUMNS} FROM entries WHERE url = ?", (url,))
        return [Entry(*r) for r in rows]

    def by_last_use(self) -> Iterator[Entry]:
        """Every entry, filling ones first (a dead filler's partial is the first to go), then
        the least recently used: LRU's order, read a page at a time."""
        after: tuple[int, float, int] = (-1, float("-inf"), -1)
        while True:
            rows = self._fetch(
                f"SELECT {_COLUMNS}, state = 'complete' FROM entries "
                "WHERE (state = 'complete', last_access, id) > (?, ?, ?) "
                "ORDER BY state = 'complete', last_access, id LIMIT 256", after)
            if not rows:
                return
            for row in rows:
                yield Entry(*row[:-1])
            last = rows[-1]
            after = (last[-1], last[11], last[0])

    def parts_done(self, entry_id: int) -> dict[int, bytes]:
        rows = self._fetch("SELECT number, digest FROM parts WHERE entry = ?", (entry_id,))
        return {n: bytes(d) for n, d in rows}

    def totals(self, db: sqlite3.Connection | None = None) -> tuple[int, int]:
        """(bytes charged to entries, number of entries)."""
        sql = "SELECT COALESCE(SUM(charge), 0), COUNT(*) FROM entries"
        charged, count = db.execute(sql).fetchone() if db is not None else self._fetch(sql)[0]
        return int(charged), int(count)

    def pins(self) -> list[str]:
        return [r[0] for r in self._fetch("SELECT prefix FROM pins ORDER BY prefix")]

    def setting(self, name: str) -> str | None:
        rows = self._fetch("SELECT value FROM settings WHERE name = ?", (name,))
        row = rows[0] if rows else None
        return str(row[0]) if row else None

    # -- writes ----------------------------------------------------------------------------

    def set_setting(self, name: str, value: str) -> None:
        with self.transaction() as db:
            db.execute("INSERT OR REPLACE INTO settings VALUES (?, ?)", (name, value))

    @staticmethod
    def insert_filling(db: sqlite3.Connection, url: str, info: ObjectInfo, charge: int,
                       part_size: int, warmed_by: str | None) -> int:
        now = time.time()
        cur = db.execute(
            "INSERT INTO entries (url, version, size, etag, generation, mtime, state, charge, "
            "part_size, last_access, checked_at, warmed_by) "
            "VALUES (?, ?, ?, ?, ?, ?, 'filling', ?, ?, ?, ?, ?)",
            (url, version_of(info), info.size, info.etag, info.version, info.mtime, charge,
             part_size, now, now, warmed_by))
        assert cur.lastrowid is not None
        return cur.lastrowid

    def part_done(self, entry_id: int, number: int, digest: bytes) -> None:
        with self.transaction() as db:
            db.execute("INSERT OR REPLACE INTO parts VALUES (?, ?, ?)",
                       (entry_id, number, digest))

    def forget_parts(self, entry_id: int) -> None:
        with self.transaction() as db:
            db.execute("DELETE FROM parts WHERE entry = ?", (entry_id,))

    def complete(self, entry_id: int, digest: str) -> None:
        with self.transaction() as db:
            db.execute("UPDATE entries SET state = 'complete', digest = ?, last_access = ? "
                       "WHERE id = ?", (digest, time.time(), entry_id))

    def touch(self, entry_id: int, *, checked: bool, warmed_by: str | None = None) -> None:
        now = time.time()
        with self.transaction() as db:
            db.execute("UPDATE entries SET last_access = ?, "
                       "checked_at = CASE WHEN ? THEN ? ELSE checked_at END, "
                       "warmed_by = COALESCE(?, warmed_by) WHERE id = ?",
                       (now, checked, now, warmed_by, entry_id))

    @staticmethod
    def touch_many(db: sqlite3.Connection,
                   touches: dict[int, tuple[float, float | None]]) -> None:
        """Record hits kept in memory (``holds.Recency``): entry id → (last use, last
        validation or None), never moving a time back."""
        db.executemany(
            "UPDATE entries SET last_access = MAX(last_access, ?), "
            "checked_at = MAX(checked_at, COALESCE(?, checked_at)) WHERE id = ?",
            [(used, checked, entry_id) for entry_id, (used, checked) in touches.items()])

    @staticmethod
    def drop(db: sqlite3.Connection, entry_id: int) -> None:
        db.execute("DELETE FROM entries WHERE id = ?", (entry_id,))

    def pin(self, prefix: str) -> None:
        with self.transaction() as db:
            db.execute("INSERT OR IGNORE INTO pins VALUES (?)", (prefix,))

    def unpin(self, prefix: str) -> bool:
        with self.transaction() as db:
            return db.execute("DELETE FROM pins WHERE prefix = ?", (prefix,)).rowcount > 0


class Gate:
    """Many holders at once (index work in this process's threads), or one exclusive (a fork
    about to happen), which waits for the others to leave and keeps new ones out."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._inside = 0
        self._closed = False
        self._depth = threading.local()  # a thread inside already enters again at once

    @contextmanager
    def shared(self) -> Iterator[None]:
        depth = getattr(self._depth, "n", 0)
        if depth:
            self._depth.n = depth + 1
            try:
                yield
            finally:
                self._depth.n = depth
            return
        with self._cond:
            while self._closed:
                self._cond.wait()
            self._inside += 1
        self._depth.n = 1
        try:
            yield
        finally:
            self._depth.n = 0
            with self._cond:
                self._inside -= 1
                if not self._inside:
                    self._cond.notify_all()

    def acquire_exclusive(self) -> None:
        with self._cond:
            while self._closed:
                self._cond.wait()
            self._closed = True
            while self._inside:
                self._cond.wait()

    def release_exclusive(self) -> None:
        with self._cond:
            self._closed = False
            self._cond.notify_all()

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        self.acquire_exclusive()
        try:
            yield
        finally:
            self.release_exclusive()


@contextmanager
def _setup_turn(path: Path) -> Iterator[None]:
    """One process at a time opens and sets up the index at ``path`` (an flock on a file
    beside it, released with the process if it dies)."""
    fd = os.open(f"{path}.setup", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
