"""The manifest's tables, and what a damaged manifest looks like: the rules each row must
hold for the code that reads it, and which SQLite errors mean damage (the file is set aside and
rebuilt) rather than a file this process cannot use now (``Locked``, ``ConfigError``)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from ..errors import ConfigError
from ..hashing import DIGEST_SIZE
from .lock import Locked

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (k TEXT PRIMARY KEY, v TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS objects (
    key TEXT PRIMARY KEY,
    src_size INTEGER NOT NULL,
    src_etag TEXT,
    src_mtime REAL,
    src_version TEXT,
    dst_size INTEGER NOT NULL,
    dst_etag TEXT,
    dst_mtime REAL,
    block_size INTEGER NOT NULL,
    block_hashes BLOB NOT NULL,
    xxh3 TEXT,
    crc32c TEXT,
    written_at REAL NOT NULL,
    chunk_sizes BLOB NOT NULL DEFAULT x'',
    chunker TEXT NOT NULL DEFAULT 'fixed'
);
CREATE TABLE IF NOT EXISTS uploads (
    key TEXT PRIMARY KEY,
    upload_id TEXT NOT NULL,
    src_size INTEGER NOT NULL,
    src_etag TEXT,
    src_mtime REAL,
    part_size INTEGER NOT NULL,
    created_at REAL NOT NULL,
    layout TEXT
);
CREATE TABLE IF NOT EXISTS parts (
    key TEXT NOT NULL,
    number INTEGER NOT NULL,
    etag TEXT NOT NULL,
    size INTEGER NOT NULL,
    digest BLOB NOT NULL,
    PRIMARY KEY (key, number)
);
CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY,
    started_at REAL NOT NULL,
    finished_at REAL,
    status TEXT NOT NULL,
    report TEXT
);
CREATE TABLE IF NOT EXISTS run_workers (
    run_id INTEGER NOT NULL,
    worker TEXT NOT NULL,
    tasks INTEGER NOT NULL,
    retried INTEGER NOT NULL,
    failed INTEGER NOT NULL,
    objects INTEGER NOT NULL,
    bytes INTEGER NOT NULL,
    slowest TEXT,
    slowest_s REAL,
    last_done REAL,
    PRIMARY KEY (run_id, worker)
);
"""
# run_workers: a run with workers, per worker, its tasks (mcsync.state.task_log); a table an older
# mcsync ignores, created in any manifest when opened (no schema version of its own).


OBJECT_COLUMNS = ("key, src_size, src_etag, src_mtime, src_version, dst_size, dst_etag, "
                   "dst_mtime, block_size, block_hashes, xxh3, crc32c, written_at, chunk_sizes, "
                   "chunker")


class Damaged(sqlite3.DatabaseError):
    """The database opens but is not a manifest this mcsync can use: set aside and rebuilt."""


_TEXT, _NUM = "('text')", "('real', 'integer')"
_OPT_TEXT, _OPT_NUM = "('text', 'null')", "('real', 'integer', 'null')"
# Per table, what a row must hold for the code that reads it (SQLite keeps any value in any
# column): a row that does not is damage, found when the manifest is opened rather than as an
# exception in the middle of a run. Sizes are never negative; the fixed blocks a record implies
# are bounded by its digests (a damaged size must not make a list of 2**60 blocks).
_ROW_RULES = {
    "objects": f"""typeof(key) != 'text' OR typeof(src_size) != 'integer' OR src_size < 0
        OR typeof(dst_size) != 'integer' OR dst_size < 0 OR typeof(block_size) != 'integer'
        OR block_size < 0 OR typeof(src_etag) NOT IN {_OPT_TEXT}
        OR typeof(src_mtime) NOT IN {_OPT_NUM} OR typeof(src_version) NOT IN {_OPT_TEXT}
        OR typeof(dst_etag) NOT IN {_OPT_TEXT} OR typeof(dst_mtime) NOT IN {_OPT_NUM}
        OR typeof(block_hashes) != 'blob' OR length(block_hashes) % {DIGEST_SIZE} != 0
        OR typeof(xxh3) NOT IN {_OPT_TEXT} OR typeof(crc32c) NOT IN {_OPT_TEXT}
        OR typeof(written_at) NOT IN {_NUM} OR typeof(chunk_sizes) != 'blob'
        OR length(chunk_sizes) % 8 != 0 OR typeof(chunker) NOT IN {_TEXT}
        OR (block_size > 0 AND dst_size / block_size
            > 64 * (length(block_hashes) / {DIGEST_SIZE}) + 1024)""",
    "uploads": f"""typeof(key) != 'text' OR typeof(upload_id) != 'text'
        OR typeof(src_size) != 'integer' OR src_size < 0 OR typeof(src_etag) NOT IN {_OPT_TEXT}
        OR typeof(src_mtime) NOT IN {_OPT_NUM} OR typeof(part_size) != 'integer'
        OR typeof(created_at) NOT IN {_NUM} OR typeof(layout) NOT IN {_OPT_TEXT}""",
    "parts": f"""typeof(key) != 'text' OR typeof(number) != 'integer'
        OR typeof(etag) != 'text' OR typeof(size) != 'integer' OR size < 0
        OR typeof(digest) != 'blob' OR length(digest) % {DIGEST_SIZE} != 0""",
    "runs": f"""typeof(started_at) NOT IN {_NUM} OR typeof(finished_at) NOT IN {_OPT_NUM}
        OR typeof(status) != 'text' OR typeof(report) NOT IN {_OPT_TEXT}""",
    "run_workers": f"""typeof(run_id) != 'integer' OR typeof(worker) != 'text'
        OR typeof(tasks) != 'integer' OR typeof(retried) != 'integer'
        OR typeof(failed) != 'integer' OR typeof(objects) != 'integer'
        OR typeof(bytes) != 'integer' OR typeof(slowest) NOT IN {_OPT_TEXT}
        OR typeof(slowest_s) NOT IN {_OPT_NUM} OR typeof(last_done) NOT IN {_OPT_NUM}""",
    "chunks": f"""typeof(digest) != 'blob' OR length(digest) != {DIGEST_SIZE}
        OR typeof(length) != 'integer' OR length < 0 OR typeof(key) != 'text'
        OR typeof(offset) != 'integer' OR offset < 0""",
}


def check_rows(db: sqlite3.Connection) -> None:
    """Raise Damaged when a row of the manifest is not what mcsync wrote (one pass over each
    table, as ``quick_check`` makes over the file)."""
    for table, bad in _ROW_RULES.items():
        if db.execute(f"SELECT 1 FROM {table} WHERE {bad} LIMIT 1").fetchone():
            raise Damaged(f"damaged (a row of its {table} table holds what mcsync never "
                           "writes)")


# SQLite's primary result codes for a manifest that may well be sound while this process
# cannot use it: setting it aside would throw away good state (and rename a file another
# process has open).
_SQLITE_BUSY, _SQLITE_LOCKED = 5, 6
_SQLITE_UNUSABLE = {3: "permission denied", 7: "out of memory", 8: "read-only", 10: "I/O error",
                    13: "disk full", 14: "cannot open", 22: "no large-file support",
                    23: "authorization denied"}


def refuse_unless_damaged(path: Path, exc: sqlite3.DatabaseError) -> None:
    """Return when ``exc`` says the manifest is damaged (then it is set aside and rebuilt);
    raise Locked when another process holds it, ConfigError when it cannot be used here."""
    if isinstance(exc, Damaged):
        return
    code = getattr(exc, "sqlite_errorcode", None)
    primary = code & 0xFF if isinstance(code, int) else None
    if primary in (_SQLITE_BUSY, _SQLITE_LOCKED):
        raise Locked(f"manifest {path} is locked by another process ({exc})") from None
    if primary in _SQLITE_UNUSABLE:
        raise ConfigError(f"manifest {path}: {_SQLITE_UNUSABLE[primary]}: {exc}") from None
