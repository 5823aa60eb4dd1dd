import asyncio

import pytest

from mcsync.limits import ByteBudget


def test_budget_blocks_until_release_and_is_fifo():
    async def go():
        b = ByteBudget(10)
        await b.acquire(8)
        order = []

        async def want(n, tag):
            await b.acquire(n)
            order.append(tag)

        t1 = asyncio.create_task(want(5, "big"))
        await asyncio.sleep(0)
        t2 = asyncio.create_task(want(1, "small"))  # fits now, but must queue behind "big"
        await asyncio.sleep(0)
        assert order == []
        b.release(8)
        await asyncio.gather(t1, t2)
        return order, b.in_use, b.peak

    order, in_use, peak = asyncio.run(go())
    assert order == ["big", "small"]
    assert in_use == 6 and peak == 8


def test_oversized_request_is_clamped_to_capacity():
    async def go():
        b = ByteBudget(10)
        got = await b.acquire(100)
        return got, b.in_use

    assert asyncio.run(go()) == (10, 10)


def test_cancelled_waiter_returns_nothing_and_unblocks_others():
    async def go():
        b = ByteBudget(10)
        await b.acquire(10)
        waiter = asyncio.create_task(b.acquire(10))
        await asyncio.sleep(0)
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        b.release(10)
        assert b.in_use == 0
        await asyncio.wait_for(b.acquire(10), 1)
        return b.in_use

    assert asyncio.run(go()) == 10
