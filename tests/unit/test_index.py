"""The chunk index: rows follow the object's record, lookups find every holder, and a manifest
from before the index had it is indexed when opened."""

import sqlite3

from mcsync.chunking import fixed_chunks
from mcsync.records import ManifestEntry
from mcsync.state.chunk_index import MIN_INDEXED
from mcsync.state.manifest import SCHEMA_VERSION, Manifest

MiB = 1 << 20


def entry(key: str, size: int, digests: list[bytes], block: int) -> ManifestEntry:
    return ManifestEntry(key, size, None, 1.0, None, size, f"etag-{key}", 2.0, block,
                         b"".join(digests), None, None, 3.0)


def digest(i: int) -> bytes:
    return i.to_bytes(16, "big")


def test_rows_follow_the_record_and_lookups_count_holders(tmp_path):
    m = Manifest(tmp_path / "m.sqlite", "/a", "meta://b/")
    try:
        assert m.index.empty
        m.record_object(entry("step-1/model.bin", 4 * MiB, [digest(i) for i in range(4)], MiB))
        m.record_object(entry("step-2/model.bin", 4 * MiB, [digest(i) for i in (0, 1, 9, 8)],
                              MiB))
        m.record_object(entry("small.txt", 1000, [digest(0)], 1000))  # too small to index
        want = [(MiB, digest(i)) for i in (0, 1, 2, 7)]
        assert m.index.holders(want) == {"step-1/model.bin": 3, "step-2/model.bin": 2}
        assert m.index.holders([(MiB - 1, digest(0))]) == {}  # the length must match too
        # a new record replaces the object's rows; forgetting it drops them
        m.record_object(entry("step-1/model.bin", 2 * MiB, [digest(7), digest(8)], MiB))
        assert m.index.holders(want) == {"step-1/model.bin": 1, "step-2/model.bin": 2}
        m.forget("step-2/model.bin")
        assert m.index.holders(want) == {"step-1/model.bin": 1}
        m.index.drop("step-1/model.bin")
        assert m.index.empty
    finally:
        m.close()


def test_a_version_2_manifest_gets_its_chunks_indexed_when_opened(tmp_path):
    path = tmp_path / "m.sqlite"
    m = Manifest(path, "/a", "meta://b/")
    big = entry("ckpt/shard.bin", 3 * MiB, [digest(i) for i in range(3)], MiB)
    m.record_object(big)
    m.commit()
    m.close()
    db = sqlite3.connect(path)  # as version 2 left it: no chunks table
    db.execute("DROP TABLE chunks")
    db.execute("UPDATE meta SET v = '2' WHERE k = 'schema_version'")
    db.commit()
    db.close()

    m = Manifest(path, "/a", "meta://b/")
    try:
        assert m.rebuilt is None and m.get("ckpt/shard.bin") == big
        ranges = fixed_chunks(3 * MiB, MiB)
        assert m.index.holders([(r.length, digest(i)) for i, r in enumerate(ranges)]) == {
            "ckpt/shard.bin": 3}
    finally:
        m.close()
    version = sqlite3.connect(path).execute(
        "SELECT v FROM meta WHERE k = 'schema_version'").fetchone()[0]
    assert version == str(SCHEMA_VERSION) == "3"


def test_objects_below_the_threshold_are_not_indexed(tmp_path):
    m = Manifest(tmp_path / "m.sqlite", "/a", "meta://b/")
    try:
        m.record_object(entry("a", MIN_INDEXED - 1, [digest(1)], MIN_INDEXED - 1))
        m.record_object(entry("b", MIN_INDEXED, [digest(2)], MIN_INDEXED))
        assert m.index.holders([(MIN_INDEXED - 1, digest(1)), (MIN_INDEXED, digest(2))]) == {
            "b": 1}
    finally:
        m.close()
