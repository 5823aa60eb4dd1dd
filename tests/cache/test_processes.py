"""The node cache shared by several real processes: one fetch for four readers, a limit that
holds while a warm brings in more than fits, SIGKILL in the middle of a warm, and the
command's exit codes."""

from __future__ import annotations

import json
import random
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mcsync.cache import Cache
from testbed.faultproxy import Rule, Stall

from ..integration.helpers import run_cli
from .conftest import Source, mcsync, sampled_disk_usage, sha

MiB = 1 << 20


def _blob(n: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(n)


def test_four_processes_opening_one_cold_object_fetch_it_once(source: Source, tmp_path):
    data = _blob(12 * MiB + 5, 1)
    source.put("shard-0.tar", data)
    start = tmp_path / "go"
    children = [subprocess.Popen(
        [sys.executable, "-m", "tests.cache.child", str(tmp_path / "c"), "read",
         source.url("shard-0.tar"), str(start)],
        env=source.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(4)]
    time.sleep(1.0)  # let all four import and wait for the start
    start.touch()
    results = [c.communicate(timeout=120) for c in children]
    assert [c.returncode for c in children] == [0] * 4, [err for _, err in results]
    digests = {out.split()[0] for out, _ in results}
    fetched = sorted(int(out.split()[1]) for out, _ in results)
    assert digests == {sha(data)}
    # 13 parts of 1 MiB, each fetched once by whichever process was filling at the time
    assert source.gets() == 13
    assert sum(fetched) == len(data)


def test_the_limit_holds_while_a_warm_brings_in_more_than_fits(source: Source, tmp_path):
    for i in range(12):
        source.put(f"ds/{i:02d}", _blob(2 * MiB + i, 100 + i))
    limit = 12 * MiB
    cache_dir = tmp_path / "c"
    Cache(cache_dir, max_size=limit).close()  # the node's limit, set before anyone reads
    with sampled_disk_usage(cache_dir, 0.002) as samples:
        # a reader in another process, reading other objects at random meanwhile
        reader = subprocess.Popen(
            [sys.executable, "-c", "import random, sys\nfrom mcsync.cache import Cache\n"
             "with Cache(sys.argv[1]) as c:\n"
             "    for k in random.Random(1).choices(range(12), k=30):\n"
             "        c.path(f'{sys.argv[2]}ds/{k:02d}')\n",
             str(cache_dir), source.url()], env=source.env(), stderr=subprocess.PIPE,
            text=True)
        warm = mcsync("cache", "warm", source.url("ds/"), "--cache-dir", str(cache_dir),
                      "--max-size", str(limit), "--json", env=source.env())
        out, err = warm.communicate(timeout=180)
        reader_err = reader.communicate(timeout=180)[1]
    assert warm.returncode == 0, err
    report = json.loads(out)
    assert report["left_out"] and "needs" in report["why_stopped"], report
    assert len(samples) > 20 and max(samples) <= limit, (max(samples), limit)
    # The reader may meet a full cache (CacheFull, said so) but never a wrong byte
    assert "Traceback" not in reader_err or "CacheFull" in reader_err, reader_err
    with Cache(cache_dir, validate="never") as cache:
        for e in cache.entries():
            key = e.url.split("/", 3)[3]
            assert cache.layout.object(e.id).read_bytes() == source.objects[key]


def _complete(cache_dir: Path) -> set[str]:
    path = cache_dir / "v1" / "index.sqlite"
    if not path.exists():
        return set()
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return {r[0] for r in db.execute("SELECT url FROM entries WHERE state = 'complete'")}
    except sqlite3.OperationalError:  # not made yet
        return set()
    finally:
        db.close()


def _partial(cache_dir: Path) -> dict[str, int]:
    if not (cache_dir / "v1" / "index.sqlite").exists():
        return {}
    db = sqlite3.connect(f"file:{cache_dir / 'v1' / 'index.sqlite'}?mode=ro", uri=True)
    try:
        return {url: n for url, n in db.execute(
            "SELECT url, (SELECT COUNT(*) FROM parts WHERE entry = id) FROM entries "
            "WHERE state = 'filling'")}
    finally:
        db.close()


def test_sigkill_mid_warm_and_again_refetches_no_complete_entry(source: Source, tmp_path):
    keys = [f"ds/{i:02d}" for i in range(10)]
    for i, key in enumerate(keys):
        source.put(key, _blob(3 * MiB + i, 200 + i))
    # every GET answers a little late, some much later, so a warm is under way long enough
    # to be killed, with objects of which some parts are on disk and some not
    source.proxy.add(Rule(Stall(0.5), op="GetObject", probability=0.4))
    source.proxy.add(Rule(Stall(0.05), op="GetObject"))
    cache_dir = tmp_path / "c"
    order = tmp_path / "order.txt"
    order.write_text("".join(k.removeprefix("ds/") + "\n" for k in reversed(keys)))
    args = ("cache", "warm", source.url("ds/"), "--cache-dir", str(cache_dir),
            "--order", str(order), "--part-size", "1MiB")
    before: set[str] = set()
    for kill in (2, 5):  # killed once after 2 complete entries, again after 5
        run = mcsync(*args, env=source.env())
        deadline = time.monotonic() + 120
        while (len(_complete(cache_dir)) < kill or not any(_partial(cache_dir).values())) \
                and time.monotonic() < deadline:
            assert run.poll() is None, run.communicate()
            time.sleep(0.005)
        run.send_signal(signal.SIGKILL)
        run.communicate()
        now = _complete(cache_dir)
        assert before <= now and len(now) >= kill
        gets_before = {u: source.gets(u.split("/", 3)[3]) for u in now}
        before = now
    partial = _partial(cache_dir)  # entries the last kill left half-filled: URL → parts done
    time.sleep(0.5)  # requests the killed process had sent reach the proxy's log
    last_conn = max(e.conn for e in source.proxy.exchanges())
    source.proxy.clear()
    run = mcsync(*args, "--json", env=source.env())
    out, err = run.communicate(timeout=180)
    assert run.returncode == 0, err
    report = json.loads(out)
    assert sorted(report["present"]) == sorted(before)
    for url, n in gets_before.items():  # complete before the last kill: fetched zero times more
        assert source.gets(url.split("/", 3)[3]) == n, url
    assert any(partial.values()), partial  # (the kill did leave parts to take up)
    for url, done in partial.items():  # taken up: only the missing parts, pinned (If-Match)
        key = url.split("/", 3)[3]
        final = [e for e in source.proxy.exchanges("GetObject", key=key) if e.conn > last_conn]
        parts = -(-len(source.objects[key]) // MiB)
        assert len(final) == parts - done, (url, done, [e.headers.get("range") for e in final])
        assert all("if-match" in e.headers for e in source.proxy.exchanges("GetObject", key=key))
    with Cache(cache_dir, validate="never") as cache:
        for key in keys:
            assert cache.path(source.url(key)).read_bytes() == source.objects[key]
        assert len(cache.entries()) == len(keys)
        assert all(e.state == "complete" for e in cache.entries())


def test_verify_finds_a_flipped_byte_and_drops_the_entry(source: Source, tmp_path):
    for i in range(3):
        source.put(f"v/{i}", _blob(MiB + i, 300 + i))
    cache_dir = str(tmp_path / "c")
    warm = run_cli("cache", "warm", source.url("v/"), "--cache-dir", cache_dir)
    assert warm.exit_code == 0, warm.output
    with Cache(cache_dir, validate="never") as cache:
        victim = next(e for e in cache.entries() if e.url.endswith("v/1"))
        path = cache.layout.object(victim.id)
    with open(path, "r+b") as f:
        f.seek(12345)
        byte = f.read(1)
        f.seek(12345)
        f.write(bytes([byte[0] ^ 1]))
    check = run_cli("cache", "verify", "--cache-dir", cache_dir)
    assert check.exit_code == 1
    assert f"corrupt: {source.url('v/1')}: digest mismatch" in check.stderr
    again = run_cli("cache", "verify", "--cache-dir", cache_dir)
    assert again.exit_code == 0 and "2 entries: 0 corrupt entries" in again.stderr
    listing = run_cli("cache", "ls", "--cache-dir", cache_dir, "--json")
    assert sorted(json.loads(line)["url"] for line in listing.stdout.splitlines()) == [
        source.url("v/0"), source.url("v/2")]
    evict = run_cli("cache", "evict", "--cache-dir", cache_dir)
    assert evict.exit_code == 0 and "evicted 2 entries" in evict.stderr


@pytest.mark.parametrize(("args", "message"), [
    (("cache", "warm", "s3://b/x/"), "Missing option '--cache-dir'"),
    (("cache", "warm", "s3://b/x/", "--cache-dir", "{tmp}", "--validate", "often"),
     "not a validation"),
    (("cache", "warm", "./local/", "--cache-dir", "{tmp}"), "remote objects"),
    (("cache", "warm", "s3://b/x/", "--cache-dir", "{tmp}", "--max-size", "lots"),
     "not a size"),
])
def test_usage_errors_exit_2_in_one_line(args, message, tmp_path, monkeypatch):
    monkeypatch.delenv("MCSYNC_CACHE_DIR", raising=False)
    run = run_cli(*(a.replace("{tmp}", str(tmp_path / "c")) for a in args))
    assert run.exit_code == 2 and message in run.stderr, run.output


def test_warm_keeps_or_refetches_a_changed_object_as_validate_says(source: Source, tmp_path):
    source.put("w/a", _blob(MiB, 400))
    cache_dir = str(tmp_path / "c")
    assert run_cli("cache", "warm", source.url("w/"), "--cache-dir", cache_dir).exit_code == 0
    source.put("w/a", _blob(MiB, 401))
    kept = run_cli("cache", "warm", source.url("w/"), "--cache-dir", cache_dir, "--validate",
                   "never", "--json", "--metrics-file", str(tmp_path / "cache.prom"))
    assert json.loads(kept.stdout)["present"] == [source.url("w/a")]
    prom = (tmp_path / "cache.prom").read_text()
    assert "mcsync_cache_hits_total 1.0" in prom and "mcsync_cache_fetched_bytes_total 0.0" in prom
    fresh = run_cli("cache", "warm", source.url("w/"), "--cache-dir", cache_dir, "--validate",
                    "always", "--json")
    assert json.loads(fresh.stdout)["fetched"] == [source.url("w/a")]
    with Cache(cache_dir, validate="never") as cache:
        assert cache.path(source.url("w/a")).read_bytes() == source.objects["w/a"]
