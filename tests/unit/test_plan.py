import pytest

from mcsync.config import SyncOptions
from mcsync.plan import Pair, is_commit_marker, plan
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


def test_size_change_copies_even_when_target_is_newer():
    assert kind(Pair("a", o("a", 10, mtime=1), o("a", 11, mtime=9))) == "copy"


def test_same_etag_skips():
    assert kind(Pair("a", o("a", etag="x", mtime=9), o("a", etag="x", mtime=1))) == "skip"


def test_same_size_newer_target_skips_older_target_copies():
    assert kind(Pair("a", o("a", mtime=5), o("a", mtime=5))) == "skip"
    assert kind(Pair("a", o("a", mtime=6), o("a", mtime=5))) == "copy"


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
