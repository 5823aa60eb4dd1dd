import os

import pytest

from mcsync.config import GiB, MiB, SyncOptions, parse_size
from mcsync.errors import UsageError


@pytest.mark.parametrize("size", [0, 1, 8 * MiB, 80 * GiB, 5 * 1024 * GiB])
def test_part_size_keeps_objects_within_10000_parts(size):
    opts = SyncOptions(memory_limit=64 * GiB)
    part = opts.part_size_for(size)
    assert part >= 8 * MiB
    assert -(-size // part) <= 10_000


def test_part_size_never_exceeds_memory_budget():
    assert SyncOptions(memory_limit=16 * MiB).part_size_for(1000 * GiB) <= 16 * MiB


def test_explicit_part_size_wins_for_small_objects():
    assert SyncOptions(part_size=5 * MiB).part_size_for(100 * MiB) == 5 * MiB


@pytest.mark.parametrize("text,value", [("8MiB", 8 * MiB), ("512k", 512 * 1024),
                                        ("2G", 2 * GiB), ("100", 100), ("1.5MiB", 3 * MiB // 2)])
def test_parse_size(text, value):
    assert parse_size(text) == value


@pytest.mark.parametrize("text", ["", "MiB", "8XB", "-", "abc"])
def test_parse_size_rejects(text):
    with pytest.raises(UsageError):
        parse_size(text)


def test_bad_options_are_usage_errors():
    with pytest.raises(UsageError):
        SyncOptions(concurrency=0)
    with pytest.raises(UsageError):
        SyncOptions(part_size=1 * MiB)


def test_workers_auto_is_the_cores_this_process_may_run_on():
    from mcsync.config import parse_workers

    assert parse_workers("auto") == len(os.sched_getaffinity(0))
    assert parse_workers(" 3 ") == 3
    for bad in ("0", "-2", "many", ""):
        with pytest.raises(UsageError, match="--workers"):
            parse_workers(bad)


def test_workers_take_the_limits_as_the_runs_total():
    assert SyncOptions(workers=4).workers == 4
    for limit in ({"tps_limit": 100.0}, {"bw_limit": "50MiB"}):
        assert SyncOptions(workers=2, **limit).workers == 2  # split: ratelimit.limits_share
    with pytest.raises(UsageError, match="--workers"):
        SyncOptions(workers=-1)
