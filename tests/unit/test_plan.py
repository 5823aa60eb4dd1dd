import pytest

from mcsync.checkpoints.frameworks import is_commit_marker
from mcsync.config import SyncOptions
from mcsync.records import Pair
from mcsync.run.plan import plan
from mcsync.types import ObjectInfo

OPTS = SyncOptions()


def o(key: str, size: int = 10, etag: str | None = None, mtime: float | None = 100.0):
    return ObjectInfo(key, size, etag, mtime)


def kind(pair: Pair, options: SyncOptions = OPTS, server_side: bool = False):
    action = plan(pair, options, server_side=server_side)
    return None if action is None else action.kind


def test_new_object_is_copied_or_server_copied():
    assert kind(Pair("a", o("a"), None)) == "copy"
    assert kind(Pair("a", o("a"), None), server_side=True) == "server_copy"


def test_a_directory_marker_is_skipped_only_into_a_file_system():
    marker = Pair("run/", o("run/", 0), None)
    to_files = plan(marker, OPTS, server_side=False, files=True)
    assert to_files is not None and to_files.kind == "skip" and "marker" in to_files.reason
    assert kind(marker) == "copy"  # an object store holds it as it is
    assert plan(Pair("run/", o("run/", 5), None), OPTS, server_side=False,
                files=True).kind == "copy"  # bytes under such a name: refused when written


def test_size_change_copies_even_when_target_is_newer():
    assert kind(Pair("a", o("a", 10, mtime=1), o("a", 11, mtime=9))) == "copy"


def test_same_etag_skips():
    assert kind(Pair("a", o("a", etag="x", mtime=9), o("a", etag="x", mtime=1))) == "skip"


def test_same_size_newer_target_skips_older_target_copies():
    assert kind(Pair("a", o("a", mtime=5), o("a", mtime=5))) == "skip"
    assert kind(Pair("a", o("a", mtime=6), o("a", mtime=5))) == "copy"


def test_a_journalled_upload_is_the_journals_to_decide_not_size_and_time():
    # A killed run's upload of "a": the target's object of the same size, newer, may be that
    # upload's result; the transfer recognises it from the journal (or sends it again).
    newer = Pair("a", o("a", etag="x", mtime=5), o("a", etag="x", mtime=9), journalled=True)
    action = plan(newer, OPTS, server_side=False)
    assert action is not None and action.kind == "copy" and "journal" in action.reason
    assert kind(Pair("a", o("a", 10), o("a", 11), journalled=True)) == "copy"
    assert kind(Pair("a", o("a"), None, journalled=True)) == "copy"


def test_mtimes_within_the_stores_precision_count_as_equal():
    # uploaded within the second the file was written: S3 truncates LastModified
    assert kind(Pair("a", o("a", mtime=5.7), o("a", mtime=5.0))) == "skip"


def test_different_etags_fall_back_to_mtime():
    # multipart ETags of two stores differ for equal content; mtime decides
    assert kind(Pair("a", o("a", etag="x-2", mtime=5), o("a", etag="y", mtime=6))) == "skip"


def test_target_only_deleted_only_with_delete():
    assert kind(Pair("a", None, o("a"))) is None
    assert kind(Pair("a", None, o("a")), SyncOptions(delete=True)) == "delete"


def test_filters_apply_to_copies_and_deletes():
    opts = SyncOptions(include=("*.safetensors",), exclude=("tmp/*",), delete=True)
    assert kind(Pair("m/model.safetensors", o("x"), None), opts) == "copy"
    assert kind(Pair("m/config.json", o("x"), None), opts) is None
    assert kind(Pair("tmp/x.safetensors", o("x"), None), opts) is None
    assert kind(Pair("m/config.json", None, o("x")), opts) is None  # excluded: not deleted


def test_reserved_state_prefix_never_touched():
    assert kind(Pair(".mcsync/manifest", o("x"), None), SyncOptions(delete=True)) is None
    assert kind(Pair(".mcsync/manifest", None, o("x")), SyncOptions(delete=True)) is None


@pytest.mark.parametrize("key,marker", [
    ("ckpt/model.safetensors.index.json", True), ("config.json", True), ("run/latest", True),
    ("step-9/COMMIT", True), ("model-00001-of-00004.safetensors", False),
    ("data/config.json.bak", False),
])
def test_commit_markers(key, marker):
    assert is_commit_marker(key) is marker


# --checksum: skip only on content evidence ------------------------------------------------------

CHECKSUM = SyncOptions(checksum=True)
MD5_A, MD5_B = "0" * 31 + "a", "0" * 31 + "b"


def entry(key: str = "a", size: int = 10, src_etag: str | None = None,
          src_mtime: float | None = 100.0, dst_etag: str | None = "t1",
          xxh3: str | None = "ff" * 16):
    from mcsync.records import ManifestEntry

    return ManifestEntry(key, size, src_etag, src_mtime, None, size, dst_etag, 50.0,
                         size if xxh3 else 0, bytes(16) if xxh3 else b"", xxh3, None, 0.0)


def test_checksum_ignores_mtimes_and_compares_content():
    same_meta = Pair("a", o("a", mtime=5), o("a", etag="t", mtime=5))
    assert kind(same_meta) == "skip"
    assert kind(same_meta, CHECKSUM) == "compare"


def test_checksum_decides_from_metadata_where_it_is_evidence():
    assert kind(Pair("a", o("a", 10), o("a", 11)), CHECKSUM) == "copy"  # sizes differ
    assert kind(Pair("a", o("a", 0), o("a", 0)), CHECKSUM) == "skip"  # both empty
    assert kind(Pair("a", o("a", etag="x-2"), o("a", etag="x-2")), CHECKSUM) == "skip"
    assert kind(Pair("a", o("a", etag=MD5_A), o("a", etag=MD5_B)), CHECKSUM) == "copy"
    # ETags that are not plain MD5s prove no difference: read them
    assert kind(Pair("a", o("a", etag="x-2"), o("a", etag="y-3")), CHECKSUM) == "compare"


def test_checksum_trusts_a_record_only_with_hashes_and_a_content_identity():
    src, dst = o("a", etag="s1"), o("a", etag="t1")
    assert kind(Pair("a", src, dst, entry(src_etag="s1")), CHECKSUM) == "skip"
    # adopted without reading (no hashes): no evidence
    assert kind(Pair("a", src, dst, entry(src_etag="s1", xxh3=None)), CHECKSUM) == "compare"
    # target rewritten since mcsync wrote it
    assert kind(Pair("a", src, o("a", etag="t2"), entry(src_etag="s1")), CHECKSUM) == "copy"
    # source changed since (its ETag names other content)
    assert kind(Pair("a", o("a", etag="s2"), dst, entry(src_etag="s1")), CHECKSUM) == "copy"
    # a file's size + mtime do not name its content: hash the source against the record
    file_src = o("a", etag=None, mtime=100.0)
    assert kind(Pair("a", file_src, dst, entry()), CHECKSUM) == "compare"
    assert kind(Pair("a", file_src, dst, entry()), OPTS) == "skip"
