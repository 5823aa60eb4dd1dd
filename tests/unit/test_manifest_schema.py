"""A manifest written by an older mcsync is migrated in place, its records and open uploads
kept (losing them would cost a full re-copy and every resumable upload)."""

import sqlite3

from mcsync.records import ManifestEntry
from mcsync.state.manifest import SCHEMA_VERSION, Manifest
from mcsync.types import ByteRange

V1 = """
CREATE TABLE meta (k TEXT PRIMARY KEY, v TEXT NOT NULL);
CREATE TABLE objects (key TEXT PRIMARY KEY, src_size INTEGER NOT NULL, src_etag TEXT,
    src_mtime REAL, src_version TEXT, dst_size INTEGER NOT NULL, dst_etag TEXT, dst_mtime REAL,
    block_size INTEGER NOT NULL, block_hashes BLOB NOT NULL, xxh3 TEXT, crc32c TEXT,
    written_at REAL NOT NULL);
CREATE TABLE uploads (key TEXT PRIMARY KEY, upload_id TEXT NOT NULL, src_size INTEGER NOT NULL,
    src_etag TEXT, src_mtime REAL, part_size INTEGER NOT NULL, created_at REAL NOT NULL);
CREATE TABLE parts (key TEXT NOT NULL, number INTEGER NOT NULL, etag TEXT NOT NULL,
    size INTEGER NOT NULL, digest BLOB NOT NULL, PRIMARY KEY (key, number));
CREATE TABLE runs (id INTEGER PRIMARY KEY, started_at REAL NOT NULL, finished_at REAL,
    status TEXT NOT NULL, report TEXT);
"""


def test_a_version_1_manifest_is_migrated_with_its_records(tmp_path):
    path = tmp_path / "m.sqlite"
    db = sqlite3.connect(path)
    db.executescript(V1)
    db.executemany("INSERT INTO meta VALUES (?, ?)", [("schema_version", "1"), ("src", "/a"),
                                                      ("dst", "meta://b/")])
    db.execute("INSERT INTO objects VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
               ("k", 20, None, 5.0, None, 20, "e", 6.0, 10, b"A" * 16 + b"B" * 16, "x", None, 7))
    db.execute("INSERT INTO uploads VALUES (?,?,?,?,?,?,?)", ("big", "u1", 99, None, 1.0, 8, 2))
    db.execute("INSERT INTO parts VALUES (?,?,?,?,?)", ("big", 1, "p1", 8, b"C" * 16))
    db.commit()
    db.close()

    m = Manifest(path, "/a", "meta://b/")
    try:
        assert m.rebuilt is None and m.established
        entry = m.get("k")
        assert entry is not None and entry.chunk_sizes == b"" and entry.chunker == "fixed"
        assert entry.chunks() == [(ByteRange(0, 10), b"A" * 16), (ByteRange(10, 20), b"B" * 16)]
        uploads = m.open_uploads()
        assert uploads["big"].upload_id == "u1" and uploads["big"].layout is None
        assert uploads["big"].parts[1].digest == b"C" * 16
        m.record_object(ManifestEntry("n", 1, None, 1.0, None, 1, None, 1.0, 1, b"D" * 16, None,
                                      None, 1.0, chunk_sizes=b"\x01" + bytes(7)))
        m.commit()
        assert m.get("n").chunks() == [(ByteRange(0, 1), b"D" * 16)]
    finally:
        m.close()
    version = sqlite3.connect(path).execute(
        "SELECT v FROM meta WHERE k = 'schema_version'").fetchone()[0]
    assert version == str(SCHEMA_VERSION)


def test_a_record_whose_hashes_do_not_fit_its_size_offers_no_chunks():
    entry = ManifestEntry("k", 30, None, 1.0, None, 30, None, 1.0, 10, b"A" * 16, None, None, 1)
    assert entry.chunks() == []  # 3 blocks of 10 bytes, 1 hash: never compose from it
