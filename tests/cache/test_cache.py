"""The node cache on SeaweedFS, in this process: bytes, validation, pins, verify."""

from __future__ import annotations

import os
import random

import pytest
import xxhash

from mcsync.cache import Cache, CacheFull
from mcsync.cache.index import version_of
from mcsync.errors import NotFound, UsageError

from .conftest import Source, sha

MiB = 1 << 20


def _blob(n: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(n)


def test_a_path_is_the_object_and_a_second_use_fetches_nothing(source: Source, tmp_path):
    source.put("ds/a.bin", _blob(5 * MiB + 3, 1))
    source.put("ds/empty", b"")
    with Cache(tmp_path / "c", part_size=MiB) as cache:
        for key in ("ds/a.bin", "ds/empty"):
            assert cache.path(source.url(key)).read_bytes() == source.objects[key]
        gets = source.gets()
        assert gets == 6  # 6 parts of the 5 MiB object; the empty one needs no GET
        with cache.open(source.url("ds/a.bin")) as f:
            f.seek(MiB + 1)
            assert f.read(10) == source.objects["ds/a.bin"][MiB + 1:MiB + 11]
        assert cache.path(source.url("ds/a.bin")).read_bytes() == source.objects["ds/a.bin"]
        assert source.gets() == gets
        assert cache.stats.hits == 2 and cache.stats.misses == 2


def test_prefetch_fetches_in_the_background_and_apath_serves_it(source: Source, tmp_path):
    import asyncio

    for i in range(5):
        source.put(f"pre/{i}", _blob(MiB // 2 + i, 50 + i))
    urls = [source.url(f"pre/{i}") for i in range(5)]
    with Cache(tmp_path / "c") as cache:
        paths = cache.prefetch(urls).result(timeout=60)
        assert [p.read_bytes() for p in paths] == [source.objects[f"pre/{i}"] for i in range(5)]
        gets = source.gets()

        async def read_all() -> list[bytes]:
            return [(await cache.apath(u)).read_bytes() for u in urls]

        assert asyncio.run(read_all()) == [source.objects[f"pre/{i}"] for i in range(5)]
        assert source.gets() == gets == 5


def test_open_streams_while_the_object_fills(source: Source, tmp_path):
    data = _blob(6 * MiB, 2)
    source.put("big", data)
    with (Cache(tmp_path / "c", part_size=MiB, concurrency=2) as cache,
          cache.open(source.url("big")) as f):
        assert f.read() == data
    with Cache(tmp_path / "c", validate="never") as cache:
        assert cache.path(source.url("big")).read_bytes() == data  # committed whole


def test_an_overwritten_object_always_new_never_old_never_a_mix(source: Source, tmp_path):
    old, new = _blob(3 * MiB, 3), _blob(3 * MiB, 4)
    source.put("k", old)
    with Cache(tmp_path / "c", part_size=MiB) as cache:
        assert cache.path(source.url("k")).read_bytes() == old
    source.put("k", new)
    heads = len(source.proxy.exchanges("HeadObject"))
    with Cache(tmp_path / "c", validate="never") as cache:
        assert cache.path(source.url("k")).read_bytes() == old
        assert len(source.proxy.exchanges("HeadObject")) == heads  # no request at all
    with Cache(tmp_path / "c", validate="ttl:1h") as cache:
        assert cache.path(source.url("k")).read_bytes() == old  # checked less than 1 h ago
    with Cache(tmp_path / "c", validate="always") as cache:
        assert cache.path(source.url("k")).read_bytes() == new
        with cache.open(source.url("k")) as f:
            assert f.read() == new
        versions = [e for e in cache.entries() if e.url == source.url("k")]
        assert len(versions) == 2  # the old one ages out; never overwritten


def test_a_partial_of_an_old_version_is_dropped_not_mixed(source: Source, tmp_path):
    """A fill that stopped half-way (its parts recorded), then the object changed: taking it
    up is refused by the store (If-Match), so the entry goes and the new version is fetched
    whole."""
    old, new = _blob(4 * MiB, 5), _blob(4 * MiB, 6)
    source.put("k", old)
    with Cache(tmp_path / "c", part_size=MiB) as cache:
        info = cache.run(cache.store_for(f"s3://{source.bucket}/").head("k"))
        got = cache.run(cache._reserve(source.url("k"), info, None, None))
        assert got is not None
        entry, fd = got
        os.pwrite(fd, old[:MiB], 0)
        cache.index.part_done(entry.id, 0, xxhash.xxh3_128_digest(old[:MiB]))
        os.close(fd)  # the filler "dies": its lock is free
        source.put("k", new)
        # taken up as a listing of the old version would (warm): pinned to it, refused
        entry = cache.run(cache.obtain(source.url("k"), info))
        assert cache.layout.object(entry.id).read_bytes() == new
        assert cache.index.find(source.url("k"), version_of(info)) is None
        assert len(source.proxy.exchanges("GetObject", fault="")) >= 1


def test_pins_that_cannot_fit_fail_at_once_with_the_numbers(source: Source, tmp_path):
    for i in range(4):
        source.put(f"p/{i}", _blob(2 * MiB, 10 + i))
    with Cache(tmp_path / "c", max_size=9 * MiB) as cache:
        with pytest.raises(CacheFull, match=r"pin s3://.*/p/ \(4 objects\): needs 8\.0 MiB "
                                            r"but the cache's limit is 9\.0 MiB"):
            cache.pin(source.url("p/"))
        assert source.gets() == 0 and cache.index.pins() == []
        assert cache.pin(source.url("p/0")) == 1
        # what is pinned is never evicted: the rest must make do with what is left
        for i in (1, 2, 3):
            cache.path(source.url(f"p/{i}"))
        held = sorted(e.url.rpartition("/")[2] for e in cache.entries())
        assert held == ["0", "2", "3"]  # 1 was the least recently used unpinned entry
        assert cache.unpin(source.url("p/0"))


def test_an_object_larger_than_the_cache_is_refused_with_the_numbers(source: Source, tmp_path):
    source.put("huge", _blob(5 * MiB, 20))
    with Cache(tmp_path / "c", max_size=4 * MiB) as cache:
        with pytest.raises(CacheFull, match=r"huge: needs 5\.0 MiB but the cache's limit is "
                                            r"4\.0 MiB"):
            cache.path(source.url("huge"))
        assert cache.entries() == [] and source.gets() == 0


def test_a_missing_object_and_bad_addresses(source: Source, tmp_path, monkeypatch):
    with Cache(tmp_path / "c") as cache:
        with pytest.raises(NotFound):
            cache.path(source.url("nope"))
        with pytest.raises(UsageError, match="remote objects"):
            cache.path(str(tmp_path / "file"))
    monkeypatch.delenv("MCSYNC_CACHE_DIR", raising=False)
    with pytest.raises(UsageError, match="MCSYNC_CACHE_DIR"):
        Cache()
    with pytest.raises(UsageError, match="not a validation"):
        Cache(tmp_path / "c", validate="sometimes")


def test_metrics_count_hits_misses_fetched_bytes_evictions_and_use(source: Source, tmp_path):
    from mcsync.observe.metrics import Metrics

    for i in range(3):
        source.put(f"m/{i}", _blob(2 * MiB, 30 + i))
    metrics = Metrics()
    with Cache(tmp_path / "c", max_size=7 * MiB, on_event=metrics) as cache:
        for i in (0, 1, 0, 2):
            cache.path(source.url(f"m/{i}"))

    def value(name: str) -> float:
        found = metrics.registry.get_sample_value(name)
        assert found is not None, name
        return found

    assert value("mcsync_cache_hits_total") == 1
    assert value("mcsync_cache_misses_total") == 3
    assert value("mcsync_cache_fetched_bytes_total") == 6 * MiB
    assert value("mcsync_cache_evictions_total") == 1  # m/1, the least recently used
    assert value("mcsync_cache_limit_bytes") == 7 * MiB
    assert 4 * MiB < value("mcsync_cache_bytes_in_use") <= 5 * MiB


def test_a_cache_handed_to_worker_processes_works_there(source: Source, tmp_path):
    """A data loader's workers get the cache pickled (spawn): each opens its own, on the
    same directory. Forked after the cache was used, a worker opens its own index and
    clients (obstore's runtime does not survive a fork: botocore sends there)."""
    import multiprocessing

    from .child import digest_of

    source.put("w/0", _blob(2 * MiB, 40))
    source.put("w/1", _blob(MiB, 41))
    with Cache(tmp_path / "c", part_size=MiB) as cache:
        cache.path(source.url("w/0"))
        with multiprocessing.get_context("spawn").Pool(2) as pool:
            got = pool.starmap(digest_of, [(cache, source.url("w/0")), (cache, source.url("w/1"))])
            # (while the workers live: the one that read w/1 may still be committing it)
            assert cache.path(source.url("w/1")).read_bytes() == source.objects["w/1"]
        assert [g[0] for g in got] == [sha(source.objects["w/0"]), sha(source.objects["w/1"])]
        assert source.gets("w/0") == 2 and source.gets("w/1") == 1  # each part fetched once
        source.put("w/2", _blob(MiB + 7, 42))
        with multiprocessing.get_context("fork").Pool(2) as pool:
            forked = pool.starmap(digest_of, [(cache, source.url("w/0")),
                                              (cache, source.url("w/2"))])
        assert [g[0] for g in forked] == [sha(source.objects["w/0"]), sha(source.objects["w/2"])]
        assert forked[0][1] == 0 and forked[1][1] == MiB + 7  # a hit; a fill of its own
        assert cache.path(source.url("w/2")).read_bytes() == source.objects["w/2"]
