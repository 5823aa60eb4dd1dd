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


def test_concurrency_is_a_number_or_auto_whose_ceiling_sizes_the_pools():
    from mcsync.config import AUTO_CONCURRENCY_CEILING, parse_concurrency

    assert parse_concurrency(" AUTO ") == "auto" and parse_concurrency("12") == 12
    for bad in ("0", "-2", "fast", "", "1.5"):
        with pytest.raises(UsageError, match="--concurrency"):
            parse_concurrency(bad)
    auto = SyncOptions(concurrency="auto")
    assert auto.tuned and auto.in_flight == AUTO_CONCURRENCY_CEILING
    assert auto.store_options("target").max_connections == AUTO_CONCURRENCY_CEILING
    fixed = SyncOptions(concurrency=12)
    assert not fixed.tuned and fixed.in_flight == 12
    for bad_value in (0, "fast", 2.5, True):
        with pytest.raises(UsageError, match="--concurrency"):
            SyncOptions(concurrency=bad_value)  # type: ignore[arg-type]


def test_workers_take_the_limits_as_the_runs_total():
    assert SyncOptions(workers=4).workers == 4
    for limit in ({"tps_limit": 100.0}, {"bw_limit": "50MiB"}):
        assert SyncOptions(workers=2, **limit).workers == 2  # split: ratelimit.limits_share
    with pytest.raises(UsageError, match="--workers"):
        SyncOptions(workers=-1)


def test_ray_takes_a_worker_per_cpu_of_the_cluster_unless_told_a_number():
    """On Ray, --workers auto (or none) is the cluster's CPUs, counted once connected
    (WORKERS_AUTO); here, auto is this machine's cores and none is no workers."""
    from mcsync.config import WORKERS_AUTO, workers_for

    assert workers_for("auto", "ray") == workers_for(0, "ray") == WORKERS_AUTO
    assert workers_for(3, "ray") == 3 and workers_for("3", "ray") == 3
    assert workers_for("auto", "local") == len(os.sched_getaffinity(0))
    assert workers_for(0, "local") == 0
    assert SyncOptions(executor="ray", workers=WORKERS_AUTO).workers == WORKERS_AUTO
    with pytest.raises(UsageError, match="--workers"):
        SyncOptions(workers=WORKERS_AUTO)  # the cluster's CPUs: only Ray has a cluster
    with pytest.raises(UsageError, match="--executor must be one of local, ray"):
        SyncOptions(executor="dask")
    with pytest.raises(UsageError, match="--ray-address"):
        SyncOptions(ray_address="127.0.0.1:6379")
    assert SyncOptions(executor="ray", ray_address="ray://head:10001").ray_address


def test_the_library_runs_ray_with_a_worker_per_cpu_by_default():
    import mcsync
    from mcsync.config import WORKERS_AUTO

    assert mcsync._options(None, {"executor": "ray"}).workers == WORKERS_AUTO
    assert mcsync._options(SyncOptions(executor="ray"), {}).workers == WORKERS_AUTO
    assert mcsync._options(None, {"executor": "ray", "workers": "auto"}).workers == WORKERS_AUTO
    assert mcsync._options(None, {"executor": "ray", "workers": 2}).workers == 2
    assert mcsync._options(None, {"workers": "auto"}).workers == len(os.sched_getaffinity(0))


def test_what_a_ray_worker_is_told_says_where_never_who(monkeypatch):
    """ray_pool.settings_of: the driver's endpoints and regions go to the workers, its keys
    do not (each node signs with its own)."""
    from mcsync.config import StoreOptions
    from mcsync.scale.ray_pool import settings_of
    from mcsync.scale.worker_runner import Addresses

    env = {"AWS_ENDPOINT_URL": "http://s3.example:9000", "AWS_REGION": "eu-west-1",
           "AWS_ACCESS_KEY_ID": "AKIDEXAMPLE", "AWS_SECRET_ACCESS_KEY": "secret-aws",
           "AWS_SESSION_TOKEN": "token", "AWS_PROFILE": "prod",
           "MCSYNC_META_ENDPOINT_URL": "https://meta.example", "MCSYNC_META_REGION": "r1",
           "MCSYNC_META_ACCESS_KEY_ID": "meta-id", "MCSYNC_META_SECRET_ACCESS_KEY": "secret-meta",
           "MCSYNC_CONFIG": "/nonexistent/config.toml"}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    both = Addresses("s3://src/a/", "meta://dst/b/", StoreOptions(), StoreOptions())
    assert settings_of(both) == {
        "AWS_ENDPOINT_URL": "http://s3.example:9000", "AWS_REGION": "eu-west-1",
        "MCSYNC_META_ENDPOINT_URL": "https://meta.example", "MCSYNC_META_REGION": "r1"}
    no_meta = Addresses("s3://src/a/", "/tmp/x", StoreOptions(), StoreOptions())
    assert "MCSYNC_META_ENDPOINT_URL" not in settings_of(no_meta)
