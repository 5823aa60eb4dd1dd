"""The library's surface: the names it exports (pinned: a change here is a change for every
caller), how options and overrides combine, what each side of a sync is told, and how a
failure's cause is classified."""

from __future__ import annotations

import errno
import json

import pytest

import mcsync
import mcsync.cache
import mcsync.errors
import mcsync.stores
from mcsync import StoreOptions, SyncOptions
from mcsync.errors import (
    AccessDenied,
    IntegrityError,
    Locked,
    NoSuchBucket,
    PreconditionFailed,
    Throttled,
    Transient,
    Unreachable,
    UnsafeKey,
    UsageError,
    failure_kind,
)
from mcsync.events import ObjectFailed, StatsCollector
from mcsync.retry import RetryPolicy

MCSYNC = [
    "ConfigError", "Cycle", "Event", "EventSink", "IntegrityError", "Locked", "MCSyncError",
    "NoCheckpoint", "NotFound", "ObjectFailure", "ObjectResult", "Permanent",
    "PreconditionFailed", "ReadStore", "Store", "StoreOptions", "SyncOptions", "SyncReport",
    "Transient", "UnsafeKey",
    "UsageError", "__version__", "async_sync", "async_watch", "sync", "tune_process", "watch",
]
ERRORS = [
    "AccessDenied", "CacheFull", "ComposeRefused", "ConfigError", "CredentialsExpired",
    "IntegrityError", "Interrupted", "ListingOrderError", "Locked", "MCSyncError", "NoCheckpoint",
    "NoSuchBucket",
    "NotFound",
    "Permanent", "PreconditionFailed", "SourceGone", "Throttled", "Transient", "Unreachable",
    "UnsafeKey", "UsageError", "failure_kind",
]
STORES = ["ObjectInfo", "ReadStore", "Store", "StoreOptions", "open_store"]
CACHE = ["Cache", "CacheFull", "Validation"]


@pytest.mark.parametrize(("module", "names"), [(mcsync, MCSYNC), (mcsync.errors, ERRORS),
                                               (mcsync.stores, STORES),
                                               (mcsync.cache, CACHE)])
def test_exported_names_are_pinned_and_each_resolves(module, names) -> None:
    assert sorted(module.__all__) == sorted(names)
    for name in names:
        assert getattr(module, name) is not None, name


def test_the_error_set_is_closed_under_mcsync_error_and_moved_names_still_import() -> None:
    from mcsync.move.delta_sender import ComposeRefused
    from mcsync.state.lock import Locked as LockLocked

    assert LockLocked is Locked and ComposeRefused is mcsync.errors.ComposeRefused
    for name in ERRORS:
        value = getattr(mcsync.errors, name)
        if isinstance(value, type) and name != "Interrupted":  # a stop, not a failure
            assert issubclass(value, mcsync.errors.MCSyncError), name


def test_mcsync_watch_stays_the_function_once_its_module_is_imported() -> None:
    import mcsync.run.watching

    assert callable(mcsync.watch) and mcsync.watch.__module__ == "mcsync"
    assert mcsync.Cycle is mcsync.run.watching.Cycle


# -- options ---------------------------------------------------------------------------------


def test_overrides_apply_over_the_options_record() -> None:
    base = SyncOptions(concurrency=4, include=("*.txt",), delete=True)
    got = mcsync._options(base, {"include": "*.bin", "concurrency": 8})
    assert got == SyncOptions(concurrency=8, include=("*.bin",), delete=True)
    assert mcsync._options(None, {}) == SyncOptions()
    assert mcsync._options(base, {}) is base
    assert mcsync._options(None, {"exclude": ["a", "b"]}).exclude == ("a", "b")


def test_an_unknown_override_is_a_type_error_naming_it() -> None:
    with pytest.raises(TypeError, match=r"unknown option 'concurency'.*'concurrency'"):
        mcsync._options(None, {"concurency": 8})
    with pytest.raises(TypeError, match="unknown option 'xyzzy'"):
        mcsync.sync("/nonexistent-src", "/nonexistent-dst", xyzzy=1)  # before anything runs
    with pytest.raises(TypeError, match=r"options must be mcsync\.SyncOptions, got dict"):
        mcsync._options({"concurrency": 8}, {})  # type: ignore[arg-type]


def test_a_bad_value_is_the_usage_error_the_command_gives() -> None:
    with pytest.raises(UsageError, match="--concurrency must be at least 1"):
        mcsync._options(None, {"concurrency": 0})
    with pytest.raises(TypeError, match=r"target must be mcsync\.StoreOptions, got str"):
        SyncOptions(target="http://x")  # type: ignore[arg-type]


def test_each_side_takes_its_own_store_options_or_the_runs() -> None:
    both = SyncOptions(endpoint_url="http://both", profile="p", concurrency=32)
    for side in ("source", "target"):
        assert both.store_options(side) == StoreOptions("http://both", "p", 32)
    patient = RetryPolicy(max_attempts=3)
    split = SyncOptions(endpoint_url="http://both", concurrency=32,
                        source=StoreOptions(endpoint_url="https://aws"),
                        target=StoreOptions(endpoint_url="http://onprem", profile="onprem",
                                            max_connections=8, retry=patient))
    assert split.store_options("source") == StoreOptions("https://aws", None, 32)
    assert split.store_options("target") == StoreOptions("http://onprem", "onprem", 8, patient)


# -- failures --------------------------------------------------------------------------------


class DeniedByPolicy(AccessDenied):
    """A store's own subclass: reported as the errors class it refines."""


@pytest.mark.parametrize(("exc", "kind", "retryable"), [
    (Throttled("slow down"), "Throttled", True),
    (Unreachable("reset"), "Unreachable", True),
    (Transient("500"), "Transient", True),
    (IntegrityError("BadDigest"), "IntegrityError", True),
    (PreconditionFailed("changed"), "PreconditionFailed", True),
    (AccessDenied("no"), "AccessDenied", False),
    (DeniedByPolicy("no"), "AccessDenied", False),
    (NoSuchBucket("gone"), "NoSuchBucket", False),
    (UnsafeKey("../x"), "UnsafeKey", False),
    (OSError(errno.ENOSPC, "No space left on device"), "OSError", False),
    (PermissionError(errno.EACCES, "Permission denied"), "OSError", False),
    (OSError(errno.ESTALE, "Stale file handle"), "OSError", True),
    (ValueError("a bug"), "InternalError", False),
])
def test_failure_kind(exc, kind, retryable) -> None:
    assert failure_kind(exc) == (kind, retryable)


def test_a_classified_failure_reaches_the_report_and_its_json() -> None:
    stats = StatsCollector("s3://a/", "s3://b/")
    stats.emit(ObjectFailed.of("k", "copy", 5, AccessDenied("k: access denied")))
    stats.emit(ObjectFailed.of("t", "copy", 5, Throttled("x"), "t: slow down (after 5 min)"))
    stats.emit(ObjectFailed("m", "copy", 5, "held back: 2 other objects failed"))
    report = stats.finish()
    assert [(f.key, f.kind, f.retryable) for f in report.failures] == [
        ("k", "AccessDenied", False), ("t", "Throttled", True), ("m", None, False)]
    assert json.loads(json.dumps(report.to_dict()))["failures"][1] == {
        "key": "t", "error": "t: slow down (after 5 min)", "kind": "Throttled",
        "retryable": True}

