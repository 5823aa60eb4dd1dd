"""The node cache's pure parts and its reservations, on tmp_path: what an entry is charged,
the eviction order (LRU; Belady's with a known order), which entries a reservation may
evict (never pinned, open or being filled) and a refusal that evicts nothing."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from mcsync.cache import Cache, CacheFull, Validation
from mcsync.cache import files as cache_files
from mcsync.cache.index import Entry
from mcsync.cache.space import BLOCK, Candidate, charge, eviction_order, overhead, to_free
from mcsync.errors import ConfigError
from mcsync.types import MiB, ObjectInfo


def test_charge_covers_blocks_and_metadata() -> None:
    assert charge(0) == BLOCK
    assert charge(1) == 2 * BLOCK
    assert charge(BLOCK) == 2 * BLOCK
    assert charge(64 * MiB) == 64 * MiB + 3 * BLOCK  # one block per 32 MiB of extents
    assert to_free(100, 50, 20, 30) == 0 and to_free(100, 50, 20, 31) == 1
    assert overhead(1000, 2) > 1000


def _c(i: int, url: str, last: float) -> Candidate:
    return Candidate(i, url, 10, last)


def test_lru_and_belady_orders() -> None:
    cands = [_c(1, "a", 3.0), _c(2, "b", 1.0), _c(3, "c", 2.0), _c(4, "d", 0.5)]
    assert [c.url for c in eviction_order(cands)] == ["d", "b", "c", "a"]
    # known future: a at 5, b at 1, c never again, d at 9: c first, then furthest first
    order = {"a": 5, "b": 1, "d": 9}
    assert [c.url for c in eviction_order(cands, order)] == ["c", "d", "a", "b"]


def test_validation_parse_and_freshness(tmp_path: Path) -> None:
    assert Validation.parse("never").mode == "never"
    assert Validation.parse("ttl:90s") == Validation("ttl", 90.0)
    with pytest.raises(Exception, match="not a validation"):
        Validation.parse("ttl")


@pytest.fixture
def cache(tmp_path: Path):
    # three entries of 1 MiB fit beside the index's 2 MiB headroom and its own few hundred
    # KiB; a fourth does not
    with Cache(tmp_path / "c", max_size=5 * MiB + 600 * 1024) as c:
        yield c


def _add(cache: Cache, name: str, size: int = MiB - 2 * BLOCK, *, keep: bool = False) -> int:
    """An entry of ``size`` bytes made complete as a fill would (``keep``: left filling, its
    filler alive)."""
    url = f"s3://bucket/{name}"
    got = cache.room.reserve(url, ObjectInfo(name, size, etag=name), MiB,
                             order=cache._belady(), touches=cache.recency.take())
    assert got is not None
    entry, fd = got.entry, got.fd
    os.pwrite(fd, b"x" * size, 0)
    if keep:
        return fd
    os.rename(cache.layout.partial(entry.id), cache.layout.object(entry.id))
    cache.index.complete(entry.id, "d")
    os.close(fd)
    return entry.id


def _names(cache: Cache) -> list[str]:
    return sorted(e.url.rpartition("/")[2] for e in cache.entries())


def test_least_recently_used_goes_first(cache: Cache) -> None:
    a = _add(cache, "a")
    _add(cache, "b")
    _add(cache, "c")
    cache.index.touch(a, checked=False)
    _add(cache, "d")
    assert _names(cache) == ["a", "c", "d"]
    assert not any(p.name for p in (cache.layout.base / "objects").iterdir()
                   if p.name not in {str(e.id) for e in cache.entries()})


def test_belady_with_a_known_order(cache: Cache) -> None:
    for n in "abc":
        _add(cache, n)
    cache.next_use = {"s3://bucket/a": 1, "s3://bucket/b": 7, "s3://bucket/c": 3}
    _add(cache, "d")
    assert _names(cache) == ["a", "c", "d"]


def test_pinned_open_and_filling_entries_stay_and_a_refusal_evicts_nothing(cache) -> None:
    a = _add(cache, "a")
    _add(cache, "b")
    live = _add(cache, "c", keep=True)  # being filled by a live filler
    cache.index.pin("s3://bucket/b")
    reader = cache_files.open_shared(cache.layout.object(a))  # a is open
    assert reader is not None
    with pytest.raises(CacheFull, match=r"s3://bucket/d: needs 1020\.0 KiB .* \(of which 0 B "
                                        r"evictable"):
        _add(cache, "d")
    assert _names(cache) == ["a", "b", "c"]
    os.close(reader)
    _add(cache, "d")  # a, closed, may go now
    assert _names(cache) == ["b", "c", "d"]
    os.close(live)  # its filler dies: a partial left, evictable
    _add(cache, "e")
    assert _names(cache) == ["b", "d", "e"]


def test_a_cache_directory_on_a_network_filesystem_is_refused(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(cache_files, "filesystem_type", lambda path: "nfs4")
    with pytest.raises(ConfigError, match="on a nfs4 filesystem, where file locks may not"):
        Cache(tmp_path / "c")


def test_a_pinned_object_is_not_a_prefix() -> None:
    from mcsync.cache.index import pinned

    assert pinned("s3://b/p/0", ["s3://b/p/0"]) and not pinned("s3://b/p/01", ["s3://b/p/0"])
    assert pinned("s3://b/p/01", ["s3://b/p/"]) and not pinned("s3://b/q/0", ["s3://b/p/"])


def test_the_index_yields_entries_in_lru_order_a_page_at_a_time(tmp_path: Path) -> None:
    import random

    from mcsync.cache.index import Index

    index = Index(tmp_path / "index.sqlite")
    rng = random.Random(3)
    with index.transaction() as db:
        for i in range(600):
            entry = Index.insert_filling(db, f"s3://b/{i}", ObjectInfo(str(i), 1, etag=str(i)),
                                         BLOCK, MiB, None)
            if i % 7:  # the others stay filling
                db.execute("UPDATE entries SET state = 'complete', digest = 'd', "
                           "last_access = ? WHERE id = ?", (rng.choice([1.0, 2.0, rng.random()]),
                                                            entry))
    got = list(index.by_last_use())
    assert len(got) == 600
    keys = [(e.state == "complete", e.last_access if e.state == "complete" else 0, e.id)
            for e in got]
    assert [k[0] for k in keys] == sorted(k[0] for k in keys)  # filling ones first
    complete = [k for k in keys if k[0]]
    assert complete == sorted(complete)
    index.close()


def _entry(i: int, url: str, last: float) -> Entry:
    return Entry(i, url, "e:x", 1, "x", None, None, "complete", BLOCK, MiB, "d", last, last,
                 None)


def test_belady_heap_gives_eviction_orders_order_and_puts_back_what_was_not_taken() -> None:
    from mcsync.cache.order import NextUse

    rng = random.Random(5)
    entries = [_entry(i, f"u{i}", rng.random()) for i in range(200)]
    order = {f"u{i}": rng.randrange(1000) for i in range(0, 200, 3)}  # a third never again
    by_url = {e.url: [e] for e in entries}
    lru = sorted(entries, key=lambda e: (e.last_access, e.id))
    heap = NextUse(order, lambda: iter(lru))
    seen: list = []
    got = list(heap.candidates(lambda u: by_url.get(u, []), seen))
    want = eviction_order([Candidate(e.id, e.url, e.charge, e.last_access) for e in entries],
                          order)
    # the same order, but for ties of next use (the heap breaks them by URL)
    assert [e.id for e in got[:len(got) - len(order)]] == [c.id for c in want[:len(got) -
                                                                                len(order)]]
    assert [order[e.url] for e in got[-len(order):]] == [order[c.url]
                                                          for c in want[-len(order):]]
    # nothing taken: all put back, handed out again in the same order
    heap.settle(seen, set(), lambda u: by_url.get(u, []))
    again: list = []
    assert [e.id for e in heap.candidates(lambda u: by_url.get(u, []), again)] == \
        [e.id for e in got]
    taken = {e.id for e in got[:10]} | {got[-1].id}
    heap.settle(again, taken, lambda u: [e for e in by_url.get(u, []) if e.id not in taken])
    third: list = []
    assert [e.id for e in heap.candidates(lambda u: by_url.get(u, []), third)] == \
        [e.id for e in got if e.id not in taken]
