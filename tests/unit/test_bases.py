"""Choosing what a delta composes from: scope, preference, samples."""

from mcsync.chunking import fixed_chunks
from mcsync.delta.bases import MAX_BASES, in_scope, rank, samples, scope_root
from mcsync.records import ManifestEntry
from mcsync.types import ByteRange


def record(key: str, written_at: float) -> ManifestEntry:
    return ManifestEntry(key, 10, None, 1.0, None, 10, "e", 1.0, 10, b"\0" * 16, None, None,
                         written_at)


def test_scope_roots_and_what_is_in_scope():
    assert scope_root("run-7/step-1300/model.bin") == "run-7"
    assert scope_root("step-1300/model.bin") == ""
    assert scope_root("model.bin") == ""
    key = "run-7/step-1300/model.bin"
    assert in_scope("run-7/step-1200/model.bin", key, "prefix")
    assert not in_scope("run-8/step-1200/model.bin", key, "prefix")
    assert in_scope("run-8/step-1200/model.bin", key, "target")
    assert not in_scope("run-7/step-1200/model.bin", key, "key")
    assert not in_scope(key, key, "target")  # its own version is the own base, not another


def test_the_same_name_in_a_sibling_directory_comes_first_most_recent_first():
    key = "run/step-3/model.bin"
    hits = {"run/step-1/model.bin": 5, "run/step-2/model.bin": 2, "run/step-2/optim.bin": 9,
            "other/x.bin": 20}
    records = {k: record(k, t) for k, t in [("run/step-1/model.bin", 1.0),
                                            ("run/step-2/model.bin", 2.0),
                                            ("run/step-2/optim.bin", 3.0),
                                            ("other/x.bin", 4.0)]}
    assert rank(key, hits, records, "target") == [
        "run/step-2/model.bin", "run/step-1/model.bin", "other/x.bin", "run/step-2/optim.bin"]
    assert rank(key, hits, records, "prefix") == [
        "run/step-2/model.bin", "run/step-1/model.bin", "run/step-2/optim.bin"]
    assert rank(key, hits, records, "key") == []


def test_no_more_than_max_bases_and_none_without_a_record():
    key = "k"
    hits = {f"o{i}": i for i in range(MAX_BASES + 5)} | {"gone": 100}
    records = {k: record(k, 1.0) for k in hits if k != "gone"}
    ranked = rank(key, hits, records, "target")
    assert len(ranked) == MAX_BASES and "gone" not in ranked and ranked[0] == f"o{MAX_BASES + 4}"


def test_samples_are_the_first_data_chunk_and_the_middle_one():
    chunks = fixed_chunks(100, 10)
    assert samples(chunks, header=False) == [ByteRange(0, 10), ByteRange(50, 60)]
    assert samples(chunks, header=True) == [ByteRange(10, 20), ByteRange(50, 60)]
    assert samples([ByteRange(0, 7)], header=False) == [ByteRange(0, 7)]
