"""Held paths across real processes: a path handed out stays until its process releases it;
other processes' fills evict something else, wait (``wait=``), or fail with the numbers;
data loader pools (spawn and fork) reading a cache a third the size of their data; a warm
leaves mcsync's own ``.mcsync/`` state out."""

from __future__ import annotations

import contextlib
import multiprocessing
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mcsync.cache import Cache
from mcsync.cache.space import charge

from ..integration.helpers import run_cli
from .child import read_random
from .conftest import Source, sampled_disk_usage, sha

KiB, MiB = 1 << 10, 1 << 20
INDEX_SLACK = 600 * KiB  # the index's own bytes beside its 2 MiB headroom (space.py)


def _blob(n: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(n)


def _paths(source: Source, cache_dir: Path, wait: float, *keys: str) -> subprocess.Popen[str]:
    """Another process taking the paths of ``keys`` (``child.py paths``)."""
    return subprocess.Popen(
        [sys.executable, "-m", "tests.cache.child", str(cache_dir), "paths", str(wait),
         *(source.url(k) for k in keys)], env=source.env(), stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)


def test_a_held_path_outlives_other_processes_fills_until_it_is_released(source: Source,
                                                                          tmp_path):
    one = MiB - 8 * KiB  # charged 1 MiB - 4 KiB: two fit beside the index, three do not
    for i in range(3):
        source.put(f"h/{i}", _blob(one, 10 + i))
    source.put("h/big", _blob(2 * one, 19))  # fits only once nothing else is there
    cache_dir = tmp_path / "c"
    with Cache(cache_dir, max_size=4 * MiB + INDEX_SLACK, part_size=MiB) as a:
        held = a.path(source.url("h/0"))
        b = _paths(source, cache_dir, 0, "h/1", "h/2")  # h/2 only fits if one goes: h/1
        out, err = b.communicate(timeout=120)
        assert b.returncode == 0, err
        assert out.split() == [sha(source.objects["h/1"]), sha(source.objects["h/2"])]
        assert held.read_bytes() == source.objects["h/0"]  # still there, whole
        # while A holds h/0, nothing frees room for h/big: refused with the numbers...
        refused = _paths(source, cache_dir, 0, "h/big")
        err = refused.communicate(timeout=120)[1]
        assert refused.returncode != 0 and "CacheFull" in err and "needs 2.0 MiB" in err, err
        # ... or after waiting, when told to wait
        patient = _paths(source, cache_dir, 1, "h/big")
        err = patient.communicate(timeout=120)[1]
        assert patient.returncode != 0 and "after waiting 1 s for held entries" in err, err
        assert "needs 2.0 MiB" in err and "evictable" in err, err
        assert held.read_bytes() == source.objects["h/0"]
        # a fill waiting when A lets go succeeds
        waiting = _paths(source, cache_dir, 60, "h/big")
        time.sleep(1.5)
        assert waiting.poll() is None, waiting.communicate()
        assert a.release(source.url("h/0"))
        out, err = waiting.communicate(timeout=120)
        assert waiting.returncode == 0, err
        assert out.split() == [sha(source.objects["h/big"])]
        assert not held.exists()  # evicted once released
        assert [e.url for e in a.entries()] == [source.url("h/big")]


def test_held_blocks_and_the_bound_on_implicit_holds(source: Source, tmp_path):
    for i in range(3):
        source.put(f"b/{i}", _blob(64 * KiB + i, 20 + i))
    urls = [source.url(f"b/{i}") for i in range(3)]
    with Cache(tmp_path / "c", max_held=2) as mine, Cache(tmp_path / "c") as other:
        # (two caches in one process lock as two processes do: flock is per open file)
        for url in urls:
            mine.path(url)  # three taken, the bound is two: the oldest, b/0, released
        assert [e.url for e in other.evict()] == [urls[0]]
        with mine.held(urls[0]) as p:
            assert mine.release(urls[0]) is False  # a block's hold is not the implicit one
            assert other.evict() == [] and p.read_bytes() == source.objects["b/0"]
        assert [e.url for e in other.evict()] == [urls[0]]
        assert mine.release(urls[1]) and mine.release(urls[2]) and not mine.release(urls[2])
        assert sorted(e.url for e in other.evict()) == urls[1:]


@pytest.mark.parametrize("start", ["spawn", "fork"])
def test_eight_workers_read_a_cache_a_third_of_their_data(source: Source, tmp_path, start):
    """8 workers started as a data loader starts them, each reading random objects by path
    while the others fill: every read whole and right, the limit never exceeded."""
    size, count = 128 * KiB, 48
    for i in range(count):
        source.put(f"d/{i:02d}", _blob(size - 1 - i, 1000 + i))
    urls = [source.url(f"d/{i:02d}") for i in range(count)]
    limit = 2 * MiB + INDEX_SLACK + (count // 3) * charge(size)
    cache_dir = tmp_path / "c"
    with Cache(cache_dir, max_size=limit, wait=60, max_held=1) as cache:
        assert cache.path(urls[0]).read_bytes() == source.objects["d/00"]  # used before
        with sampled_disk_usage(cache_dir, 0.005) as samples, \
                multiprocessing.get_context(start).Pool(8) as pool:
            got = pool.starmap(read_random, [(cache, urls, seed, 12) for seed in range(8)])
    reads = 0
    for seen in got:
        for url, digest in seen.items():
            assert digest == sha(source.objects[url.split("/", 3)[3]]), url
            reads += 1
    assert reads > 48  # (distinct URLs per worker, summed)
    assert len(samples) > 20 and max(samples) <= limit, (max(samples), limit)


def test_a_warm_leaves_mcsync_state_out(source: Source, tmp_path):
    source.put("s/a", _blob(KiB, 1))
    source.put("s/.mcsync/manifest.sqlite", _blob(KiB, 2))
    source.put("s/sub/.mcsync/manifest.sqlite", _blob(KiB, 3))
    source.put("s/sub/b", _blob(KiB, 4))
    cache_dir = str(tmp_path / "c")
    run = run_cli("cache", "warm", source.url("s/"), "--cache-dir", cache_dir, "--wait", "1s")
    assert run.exit_code == 0, run.output
    with Cache(cache_dir) as cache:
        assert sorted(e.url for e in cache.entries()) == [source.url("s/a"),
                                                          source.url("s/sub/b")]


def test_no_sqlite_connection_crosses_a_fork(source: Source, tmp_path):
    """The cache's index connections are closed before a fork and reopened after: a child
    starts with no descriptor of the index (SQLite's corruption case is a connection carried
    across a fork), and the parent goes on."""
    import os

    source.put("f/0", _blob(KiB, 1))
    with Cache(tmp_path / "c") as cache:
        cache.path(source.url("f/0"))  # the index opened, in this thread and the loop's
        pid = os.fork()
        if pid == 0:  # the child: which of its descriptors name the index's files?
            code = 0
            for fd in os.listdir("/proc/self/fd"):
                with contextlib.suppress(OSError):
                    if "index.sqlite" in os.readlink(f"/proc/self/fd/{fd}"):
                        code = 3
            os._exit(code)
        assert os.waitpid(pid, 0)[1] == 0  # (3: an index descriptor was inherited)
        assert cache.path(source.url("f/0")).read_bytes() == source.objects["f/0"]
        assert len(cache.entries()) == 1
