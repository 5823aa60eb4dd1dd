import asyncio

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mcsync.errors import MCSyncError
from mcsync.run.listing import merge_join, prefetched
from mcsync.types import ObjectInfo


async def agen(keys):
    for k in keys:
        yield ObjectInfo(k, 1)


async def join(src, dst):
    return [(k, s is not None, d is not None) async for k, s, d in merge_join(agen(src), agen(dst))]


keys = st.lists(st.text(min_size=1, max_size=6), unique=True).map(sorted)


@given(keys, keys)
def test_merge_join_pairs_every_key_once(src, dst):
    pairs = asyncio.run(join(src, dst))
    assert [k for k, _, _ in pairs] == sorted(set(src) | set(dst))
    for k, in_src, in_dst in pairs:
        assert in_src == (k in src) and in_dst == (k in dst)


def test_unsorted_listing_is_refused():
    with pytest.raises(MCSyncError, match="not in key order"):
        asyncio.run(join(["b", "a"], []))


def test_code_point_order_matches_s3_byte_order():
    # S3 lists in UTF-8 byte order; for str that is code-point order.
    ks = ["a-b", "a/b", "a", "é", "z", "日本", "\U0001f600"]
    assert sorted(ks) == sorted(ks, key=lambda k: k.encode())


def test_prefetched_passes_items_and_errors():
    async def failing():
        yield 1
        raise MCSyncError("boom")

    async def go():
        got = []
        async with prefetched(failing(), depth=1) as it:
            with pytest.raises(MCSyncError, match="boom"):
                async for x in it:
                    got.append(x)
        return got

    assert asyncio.run(go()) == [1]


def test_a_consumer_that_leaves_early_ends_the_listing_ahead_of_it():
    """A stopped run leaves a long listing with its queue full: leaving ends the listing at
    once (it used to wait forever to put what it held, and a SIGTERM never ended the run)."""
    listed = 0

    async def endless():
        nonlocal listed
        while True:
            listed += 1
            yield listed
            await asyncio.sleep(0)

    async def go() -> list[int]:
        async with prefetched(endless(), depth=8, batch=2) as it:
            got = [await anext(it) for _ in range(3)]
            for _ in range(200):  # the queue fills behind the consumer, and the listing waits
                await asyncio.sleep(0)
            assert listed < 50
        return got

    assert asyncio.run(asyncio.wait_for(go(), 5)) == [1, 2, 3]
