"""The manifest: what mcsync wrote at a target, and the journal of uploads still open.

One SQLite database (WAL) per sync pair. Per target key it holds the source identity the object
was made from, what the target answered, and the block hashes of the bytes written, so a later
run can (a) skip an unchanged object without asking the target, (b) resume an interrupted
multipart upload from its missing parts, and (c) send only changed blocks (the delta). Losing it
costs time, never correctness: a missing, truncated or garbage file is set aside and rebuilt.

Only finished, verified objects are recorded; an upload's journal rows go away in the same
transaction that records its object.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import sqlite3
import struct
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from ..errors import ConfigError, UsageError
from ..hashing import object_digest
from ..records import ManifestEntry, OpenUpload, WrittenPart
from ..types import ObjectInfo
from .chunk_index import SCHEMA as INDEX_SCHEMA
from .chunk_index import ChunkIndex
from .schema import OBJECT_COLUMNS, SCHEMA, Damaged, check_rows, refuse_unless_damaged

log = logging.getLogger(__name__)

SCHEMA_VERSION = 3


_PAGE = 1000
_COMMIT_EVERY_S = 0.2


def _migrate(db: sqlite3.Connection, version: str) -> None:
    """Bring a manifest of an older schema up to this one, in place, step by step."""
    if version == "1":  # version 2 added chunk maps cut by content, and upload layouts
        db.execute("ALTER TABLE objects ADD COLUMN chunk_sizes BLOB NOT NULL DEFAULT x''")
        db.execute("ALTER TABLE objects ADD COLUMN chunker TEXT NOT NULL DEFAULT 'fixed'")
        db.execute("ALTER TABLE uploads ADD COLUMN layout TEXT")
        version = "2"
    if version == "2":  # version 3 added the chunk index (created empty by SCHEMA)
        rows = db.execute(f"SELECT {OBJECT_COLUMNS} FROM objects").fetchall()
        entries = (ManifestEntry(*row) for row in rows)
        ChunkIndex(db).rebuild((e.key, e.dst_size, e.chunks()) for e in entries)
    db.execute("UPDATE meta SET v = ? WHERE k = 'schema_version'", (str(SCHEMA_VERSION),))


def entry_for(src: ObjectInfo, written: ObjectInfo, *, digests: Sequence[bytes] = (),
              block_size: int = 0, chunk_sizes: bytes = b"",
              chunker: str = "fixed") -> ManifestEntry:
    """The record of an object at the target: made from ``src``, held as ``written`` (what the
    target answered, or what it listed for an object found current), with the xxh3-128
    ``digests`` of its chunks where its bytes were hashed (none for a server-side copy or an
    object adopted unread: then a later change is sent whole). The one place a record of a
    written object is made."""
    return ManifestEntry(
        key=src.key, src_size=src.size, src_etag=src.etag, src_mtime=src.mtime,
        src_version=src.version, dst_size=src.size, dst_etag=written.etag,
        dst_mtime=written.mtime, block_size=block_size if digests else 0,
        block_hashes=b"".join(digests), xxh3=object_digest(list(digests)) if digests else None,
        crc32c=src.crc32c, written_at=time.time(), chunk_sizes=chunk_sizes, chunker=chunker)


def manifest_dir() -> Path:
    state = Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state")
    return state / "mcsync" / "manifests"


def default_path(src_url: str, dst_url: str, suffix: str = "") -> Path:
    """``suffix``: a shard's (``shard.suffix``), so each shard of a pair has its own."""
    return manifest_dir() / f"{pair_id(src_url, dst_url)}{suffix}.sqlite"


def pair_of(path: Path) -> tuple[str, str] | None:
    """The (source, target) a manifest file belongs to, or None if it is not readable."""
    try:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            meta = dict(db.execute("SELECT k, v FROM meta").fetchall())
        finally:
            db.close()
    except sqlite3.Error:
        return None
    if "src" in meta and "dst" in meta:
        return meta["src"], meta["dst"]
    return None


def last_run_status(path: Path) -> tuple[float, str] | None:
    """(started_at, status) of the newest run a manifest records."""
    try:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            row = db.execute(
                "SELECT started_at, status FROM runs ORDER BY id DESC LIMIT 1").fetchone()
        finally:
            db.close()
    except sqlite3.Error:
        return None
    return (float(row[0]), str(row[1])) if row else None


def pair_id(src_url: str, dst_url: str) -> str:
    return hashlib.sha256(f"{src_url}\0{dst_url}".encode()).hexdigest()[:20]


class Manifest:
    """One sync pair's state. Used from the event-loop thread only; every call is short."""

    def __init__(self, path: Path, src_url: str, dst_url: str) -> None:
        self.path = path
        self.src_url = src_url
        self.dst_url = dst_url
        self.rebuilt: str | None = None  # why a damaged manifest was replaced, if it was
        self.existed = path.exists()
        # Set when this process changed an object record or the journal: then the copy kept at
        # the target is out of date.
        self.records_changed = False
        self._journalled: set[str] = set()  # keys with upload rows, so others skip the DELETEs
        self._last_commit = time.monotonic()
        if self.existed and not path.is_file():  # never set a directory or a device aside
            raise UsageError(f"manifest {path}: not a file (a directory?); give --manifest "
                             "the path of a file, or of none yet")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(f"manifest {path}: cannot create its directory: "
                              f"{exc.strerror}") from None
        try:
            self._db = self._connect()
        except sqlite3.DatabaseError as exc:
            refuse_unless_damaged(path, exc)
            self._set_aside(str(exc) if isinstance(exc, Damaged) else f"unreadable ({exc})")
            try:
                self._db = self._connect()
            except sqlite3.DatabaseError as again:
                refuse_unless_damaged(path, again)
                raise ConfigError(f"manifest {path}: cannot be created: {again}") from None
        self.index = ChunkIndex(self._db)  # the chunks of recorded objects (compose)

    # -- opening --------------------------------------------------------------------------------

    def _connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            if self.existed:
                (verdict,) = db.execute("PRAGMA quick_check").fetchone()
                if verdict != "ok":
                    raise sqlite3.DatabaseError(f"quick_check: {verdict}")
            db.executescript(SCHEMA + INDEX_SCHEMA)
            meta = dict(db.execute("SELECT k, v FROM meta").fetchall())
            version = str(meta.get("schema_version", ""))  # checked below before use
            if not meta:
                db.executemany("INSERT INTO meta VALUES (?, ?)", [
                    ("schema_version", str(SCHEMA_VERSION)), ("src", self.src_url),
                    ("dst", self.dst_url), ("created_at", str(time.time()))])
            elif not all(isinstance(meta.get(k), str) for k in ("schema_version", "src", "dst")):
                raise Damaged("damaged (its meta table names no schema version or pair)")
            elif (meta["src"], meta["dst"]) != (self.src_url, self.dst_url):
                # Not damaged: another pair's state, which setting aside would throw away
                # (its journal of open uploads among it), run after run if both pairs use it.
                raise UsageError(f"manifest {self.path} records the sync {meta['src']} -> "
                                 f"{meta['dst']}, not {self.src_url} -> {self.dst_url}: give "
                                 "each pair its own --manifest")
            elif version in ("1", "2"):
                try:
                    _migrate(db, version)
                except (TypeError, ValueError, OverflowError, struct.error) as exc:
                    raise Damaged(f"damaged (schema {version} rows that cannot be migrated: "
                                   f"{exc})") from None
            elif not version.isdigit() or int(version) > SCHEMA_VERSION:
                raise Damaged(f"written by a newer mcsync (schema version {version[:20]}; "
                               f"this one reads versions up to {SCHEMA_VERSION})")
            elif version != str(SCHEMA_VERSION):
                raise Damaged(f"of an unknown schema version {version[:20]}")
            if self.existed:
                check_rows(db)
            # The write lock now, waiting sqlite3's busy timeout (5 s): a live process holding
            # it is found here (Locked, exit 3), not by the first write in the middle of a run.
            db.execute("BEGIN IMMEDIATE")
        except BaseException:
            db.close()
            raise
        return db

    def _set_aside(self, why: str) -> None:
        bad = self.path.with_name(self.path.name + f".bad-{int(time.time())}")
        n = 1
        while bad.exists():  # two set aside within a second: keep both
            bad = self.path.with_name(self.path.name + f".bad-{int(time.time())}-{n}")
            n += 1
        for suffix in ("", "-wal", "-shm"):
            try:
                os.replace(f"{self.path}{suffix}", f"{bad}{suffix}")
            except FileNotFoundError:
                pass
            except OSError as exc:
                raise ConfigError(f"manifest {self.path} is {why}, and cannot be set aside: "
                                  f"{exc.strerror}") from None
        self.rebuilt = f"manifest {self.path} was {why}; set aside as {bad.name} and rebuilt"
        self.existed = False
        log.warning("%s", self.rebuilt)

    @property
    def established(self) -> bool:
        """True when this manifest predates the run and records at least one object: then it
        can stand in for a listing of the target."""
        if not self.existed or self.rebuilt:
            return False
        return self._db.execute("SELECT 1 FROM objects LIMIT 1").fetchone() is not None

    # -- objects --------------------------------------------------------------------------------

    def entries(self) -> Iterator[ManifestEntry]:
        """Every recorded object in key order (SQLite's BINARY collation is UTF-8 byte order),
        a page at a time."""
        last = ""  # keys are never empty
        while True:
            rows = self._db.execute(
                f"SELECT {OBJECT_COLUMNS} FROM objects WHERE key > ? ORDER BY key LIMIT ?",
                (last, _PAGE)).fetchall()
            if not rows:
                return
            for row in rows:
                yield ManifestEntry(*row)
            last = rows[-1][0]

    def get(self, key: str) -> ManifestEntry | None:
        try:
            row = self._db.execute(f"SELECT {OBJECT_COLUMNS} FROM objects WHERE key = ?",
                                   (key,)).fetchone()
        except UnicodeEncodeError:  # a file name that is not UTF-8: never recorded; the
            return None             # target refuses it as that object's failure
        return ManifestEntry(*row) if row else None

    def record_object(self, e: ManifestEntry, *, durable: bool = True) -> None:
        """Record a finished object. Object records are committed in batches (at most
        ``_COMMIT_EVERY_S`` apart): one commit per object cost 0.3 ms, a third of the client
        CPU of a small-file run. A kill loses at most that window: a multipart object's
        journal rows are removed in the same transaction, so the next run finds the upload
        completed and records it without sending a byte; a small object is sent again.
        ``durable=False`` leaves even that to a later commit (adopted records)."""
        self._db.execute(
            f"INSERT OR REPLACE INTO objects ({OBJECT_COLUMNS}) "
            "VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
            (e.key, e.src_size, e.src_etag, e.src_mtime, e.src_version, e.dst_size, e.dst_etag,
             e.dst_mtime, e.block_size, e.block_hashes, e.xxh3, e.crc32c, e.written_at,
             e.chunk_sizes, e.chunker))
        self.index.replace(e.key, e.dst_size, e.chunks())
        self.records_changed = True
        if e.key in self._journalled:
            self._drop_upload_rows(e.key)
        if durable:
            self._changed()

    def forget(self, key: str) -> None:
        self.records_changed = True
        self._db.execute("DELETE FROM objects WHERE key = ?", (key,))
        self.index.drop(key)
        self._changed()

    # -- journal of open uploads ------------------------------------------------------------------

    def open_uploads(self) -> dict[str, OpenUpload]:
        uploads = {row[0]: OpenUpload(*row) for row in self._db.execute(
            "SELECT key, upload_id, src_size, src_etag, src_mtime, part_size, created_at, layout "
            "FROM uploads").fetchall()}
        self._journalled.update(uploads)
        for key, number, etag, size, digest in self._db.execute("SELECT * FROM parts"):
            if key in uploads:
                uploads[key].parts[number] = WrittenPart(number, etag, size, digest)
        return uploads

    def begin_upload(self, key: str, upload_id: str, src: ObjectInfo, part_size: int,
                     layout: str | None = None) -> None:
        """Recorded durably before the first part is sent, so no upload is ever untracked."""
        self._drop_upload_rows(key)
        self._db.execute(
            "INSERT INTO uploads (key, upload_id, src_size, src_etag, src_mtime, part_size, "
            "created_at, layout) VALUES (?,?,?,?,?,?,?,?)",
            (key, upload_id, src.size, src.etag, src.mtime, part_size, time.time(), layout))
        self._journalled.add(key)
        self.records_changed = True
        self.commit()

    def record_part(self, key: str, part: WrittenPart) -> None:
        self._db.execute("INSERT OR REPLACE INTO parts VALUES (?,?,?,?,?)",
                         (key, part.number, part.etag, part.size, part.digest))
        self.commit()  # a part is megabytes sent: record it at once

    def drop_upload(self, key: str) -> None:
        self._drop_upload_rows(key)
        self._changed()

    def _drop_upload_rows(self, key: str) -> None:
        self._db.execute("DELETE FROM uploads WHERE key = ?", (key,))
        self._db.execute("DELETE FROM parts WHERE key = ?", (key,))
        self._journalled.discard(key)

    # -- runs -------------------------------------------------------------------------------------

    def last_status(self) -> str | None:
        """The status of the newest run recorded: 'running' for one that was killed."""
        row = self._db.execute("SELECT status FROM runs ORDER BY id DESC LIMIT 1").fetchone()
        return str(row[0]) if row else None

    def start_run(self) -> int:
        cur = self._db.execute("INSERT INTO runs (started_at, status) VALUES (?, 'running')",
                               (time.time(),))
        self.commit()
        return int(cur.lastrowid or 0)

    def finish_run(self, run_id: int, status: str, report: dict[str, Any]) -> None:
        report = {k: v for k, v in report.items() if k != "objects"}
        self._db.execute("UPDATE runs SET finished_at = ?, status = ?, report = ? WHERE id = ?",
                         (time.time(), status, json.dumps(report), run_id))
        self.commit()

    def record_worker_tasks(self, run_id: int, row: tuple[object, ...]) -> None:
        """One worker's tally of a run's tasks (``task_log.WorkerTasks``), replacing the last."""
        self._db.execute("INSERT OR REPLACE INTO run_workers VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, "
                         "?)", (run_id, *row))
        self._changed()

    # -- durability -------------------------------------------------------------------------------

    def _changed(self) -> None:
        if time.monotonic() - self._last_commit >= _COMMIT_EVERY_S:
            self.commit()

    def commit(self) -> None:
        """In WAL mode with synchronous=NORMAL a commit writes the WAL without fsync and
        survives a killed process (not a machine crash)."""
        self._db.execute("COMMIT")
        self._db.execute("BEGIN IMMEDIATE")
        self._last_commit = time.monotonic()

    def snapshot(self, dest: Path) -> None:
        """A consistent copy of the database in one file (for the copy kept at the target)."""
        self.commit()
        with contextlib.suppress(FileNotFoundError):
            dest.unlink()
        self._db.execute("COMMIT")
        try:
            self._db.execute("VACUUM INTO ?", (str(dest),))
        finally:
            self._db.execute("BEGIN IMMEDIATE")

    def close(self) -> None:
        with contextlib.suppress(sqlite3.Error):
            self._db.execute("COMMIT")
        self._db.close()
