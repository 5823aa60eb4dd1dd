"""The fanned-out listing of an S3 store (``s3_fanout.Fanout``) against moto: every key once, in
the order of a sequential flat listing of the same tree, over trees that trip a merge by name
(files beside prefixes, names sorting below '/', an empty prefix, one prefix far larger than
the rest, a prefix obstore cannot spell); at most a bounded count of pages held
ahead; and a whole store's listing (``S3Store.list``) asking for several prefixes at once."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from typing import Any

import pytest

from mcsync.stores.s3 import S3Store
from mcsync.stores.s3_fanout import Fanout
from mcsync.stores.s3_keys import S3Credentials
from mcsync.stores.s3_store_clients import S3Clients
from testbed.faultproxy import FaultProxy, Rule, Stall
from testbed.servers import S3Endpoint

from ...integration.helpers import new_bucket

# Names around '/' in byte order: "a!" < "a-b" < "a.txt" < "a/" < "a0"; "a\t" below them all.
TREE = [
    "a!", "a!/x", "a-b", "a-b/c", "a.txt", "a/1", "a/2/deep/er", "a/3", "a0", "a0/z",
    "c d/e", "c+/f", "q//double", "q/single", "\u00e9/x", "~z",
    *(f"huge/{i:04d}" for i in range(230)),
    *(f"p{j:02d}/k{i:02d}" for j in range(12) for i in range(j * 3)),
]


def _store(ep: S3Endpoint, bucket: str, prefix: str, *, crt: bool = True) -> S3Store:
    return S3Store(scheme="s3", bucket=bucket, prefix=prefix, endpoint_url=ep.url,
                   region=ep.region, credentials=S3Credentials(ep.access_key, ep.secret_key),
                   crt=crt)


def _fanout(clients: S3Clients, page: int, **kw: Any) -> Fanout:
    return Fanout(lambda p, a: clients.list_pages(p, after=a, page=page),
                  lambda p, a: clients.level_pages(p, after=a, page=page), page_size=page, **kw)


async def _keys(fanout: Fanout, prefix: str) -> list[str]:
    async with contextlib.aclosing(fanout.list(prefix)) as listing:
        return [c["Key"] async for c in listing]


def _store_keys(ep: S3Endpoint, bucket: str) -> tuple[list[str], bool]:
    """The keys of ``S3Store.list`` of the whole bucket, and whether botocore was started."""

    async def go() -> tuple[list[str], bool]:
        store = _store(ep, bucket, "")
        try:
            async with contextlib.aclosing(store.list()) as listing:
                return [o.key async for o in listing], store._clients._botocore is not None
        finally:
            await store.aclose()

    return asyncio.run(go())


async def _flat(clients: S3Clients, prefix: str) -> list[str]:
    async with contextlib.aclosing(clients.list_flat(prefix)) as listing:
        return [c["Key"] async for c in listing]


@pytest.fixture(scope="module")
def tree(moto: S3Endpoint) -> tuple[S3Endpoint, str]:
    bucket = new_bucket(moto)
    client = moto.client()
    for root in ("", "r/"):
        for key in TREE:
            client.put_object(Bucket=bucket, Key=root + key, Body=b"x")
    return moto, bucket


@pytest.mark.parametrize(("page", "crt"), [(1, True), (4, True), (25, True), (1000, True),
                                          (4, False)], ids=["1", "4", "25", "1000", "4-botocore"])
@pytest.mark.parametrize("in_flight", [1, 3, 8])
@pytest.mark.parametrize("root", ["", "r/", "r/a/", "r/huge/", "r/empty/", "r/nothing/"])
def test_fanned_out_listing_is_the_flat_listing(tree: tuple[S3Endpoint, str], root: str,
                                                page: int, crt: bool, in_flight: int) -> None:
    """Each level's names by the CRT, or by botocore (a store without the CRT)."""
    ep, bucket = tree

    async def go() -> tuple[list[str], list[str]]:
        store = _store(ep, bucket, root, crt=crt)
        try:
            clients = store._clients
            return (await _keys(_fanout(clients, page, in_flight=in_flight), root),
                    await _flat(clients, root))
        finally:
            await store.aclose()

    got, flat = asyncio.run(go())
    expected = sorted(("r/" + k for k in TREE) if root.startswith("r/") else
                      [*TREE, *("r/" + k for k in TREE)], key=lambda k: k.encode())
    expected = [k for k in expected if k.startswith(root)]
    assert flat == expected  # the sequential listing the fan-out must equal
    assert got == flat


def test_read_ahead_holds_a_bounded_count_of_pages(tree: tuple[S3Endpoint, str]) -> None:
    """A consumer that stops at the first key of "huge/": the prefixes' listings ahead of it
    (huge/ itself, p01/, p02/) fill their queues and stop, never the whole tree (2 keys a
    page: "huge/" alone is 115 pages)."""
    ep, bucket = tree
    in_flight, ahead = 3, 2

    async def go() -> tuple[int, int, int]:
        store = _store(ep, bucket, "r/")
        try:
            fanout = _fanout(store._clients, 2, in_flight=in_flight, ahead=ahead)
            listing = fanout.list("r/")
            seen = 0
            async with contextlib.aclosing(listing):
                async for c in listing:
                    seen += 1
                    if c["Key"].startswith("r/huge/"):
                        break
                # Hold: the readers run ahead until their queues are full.
                stalled = -1
                while stalled != fanout.peak:
                    stalled = fanout.peak
                    await asyncio.sleep(0.5)
                held = fanout.peak
                async for _ in listing:
                    seen += 1
            return held, fanout.peak, seen
        finally:
            await store.aclose()

    held, peak, seen = asyncio.run(go())
    assert seen == len(TREE)
    bound = in_flight * (ahead + 1) + 1
    assert held >= in_flight * ahead, "the prefixes were not listed ahead at all"
    assert peak <= bound, f"{peak} pages held ahead, more than {bound}"


def test_a_store_listing_asks_for_several_prefixes_at_once(moto: S3Endpoint) -> None:
    """Through the fault proxy holding every answer 50 ms: a sequential listing's requests
    arrive at least 50 ms apart; the fan-out's come closer. Every key once, in order, and
    botocore never started (the levels go by the CRT)."""
    bucket = new_bucket(moto)
    client = moto.client()
    keys = [f"d{j:02d}/k{i:03d}" for j in range(6) for i in range(250)]
    for key in keys:
        client.put_object(Bucket=bucket, Key=key, Body=b"x")
    with FaultProxy(moto, [Rule(Stall(0.05), op="ListObjectsV2")]).running() as proxy:
        got, botocore = _store_keys(proxy.endpoint, bucket)
        lists = sorted(e.t for e in proxy.exchanges("ListObjectsV2"))
    assert got == keys
    assert not botocore, "the levels are the CRT's to list, to an endpoint given"
    gaps = [b - a for a, b in itertools.pairwise(lists)]
    assert min(gaps) < 0.04, f"listing requests one after another: {gaps}"
    # A first page (d00/ to d03/), the level after it, the rest of d03/ (nothing), d04/, d05/
    assert len(lists) == 5


def test_a_listing_of_one_page_asks_once(moto: S3Endpoint) -> None:
    """A listing that fits its first page asks nothing more."""
    bucket = new_bucket(moto)
    client = moto.client()
    for key in ("a/1", "b/2", "c"):
        client.put_object(Bucket=bucket, Key=key, Body=b"x")
    with FaultProxy(moto).running() as proxy:
        assert _store_keys(proxy.endpoint, bucket) == (["a/1", "b/2", "c"], False)
        assert len(proxy.exchanges("ListObjectsV2")) == 1


def test_a_directory_marker_keeps_its_slash(moto: S3Endpoint) -> None:
    bucket = new_bucket(moto)
    client = moto.client()
    for key in ("b/", "b/x", "c"):
        client.put_object(Bucket=bucket, Key=key, Body=b"")

    async def go() -> list[str]:
        store = _store(moto, bucket, "")
        try:
            return await _keys(_fanout(store._clients, 1), "")
        finally:
            await store.aclose()

    assert asyncio.run(go()) == ["b/", "b/x", "c"]


@pytest.mark.parametrize("crt", [True, False])
def test_a_directory_marker_keeps_its_slash_in_a_flat_listing_and_the_stores(
        moto: S3Endpoint, crt: bool) -> None:
    # object_store lists "b/" as "b": a page holding an empty object goes on by the S3 API.
    # "e" is an empty file, not a marker; "big" (not empty) comes before it in the first page.
    bucket = new_bucket(moto)
    client = moto.client()
    for key, body in (("big", b"x" * 10), ("b/", b""), ("b/x", b"1"), ("c", b"2"), ("e", b""),
                      *((f"f{i}", b"3") for i in range(5))):
        client.put_object(Bucket=bucket, Key=key, Body=body)
    want = ["b/", "b/x", "big", "c", "e", *(f"f{i}" for i in range(5))]

    async def go() -> tuple[list[str], list[str]]:
        store = _store(moto, bucket, "", crt=crt)
        try:
            flat = [c["Key"] async for page in store._clients.list_pages("", page=2)
                    for c in page]
            async with contextlib.aclosing(store.list()) as listing:
                return flat, [o.key async for o in listing]
        finally:
            await store.aclose()

    assert asyncio.run(go()) == (want, want)
