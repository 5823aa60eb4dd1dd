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


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def saturate(slots) -> None:
    """Make the current interval one in which requests waited for a slot."""
    slots._waited()


def limits_after(slots, clock, rates) -> list[int]:
    """The limit after each interval of ``rates`` (bytes per second), every one saturated."""
    limits = []
    for rate in rates:
        saturate(slots)
        clock.now += 1.0
        slots.moved(rate)
        limits.append(slots.limit)
    return limits


def test_goodput_slots_grow_while_goodput_grows_then_hold_the_best_on_a_plateau():
    from mcsync.limits import GoodputSlots

    clock = FakeClock()
    slots = GoodputSlots(8, 128, interval_s=1.0, clock=clock)
    # MB/s per interval: the first is the baseline; grows, then flat: 18 gave no more than 12
    assert limits_after(slots, clock, (100, 150, 200, 205, 198, 203)) == [8, 12, 18, 12, 12, 12]
    assert slots.peak == 18


def test_goodput_slots_take_back_a_growth_that_did_not_pay():
    from mcsync.limits import GoodputSlots

    clock = FakeClock()
    slots = GoodputSlots(8, 128, interval_s=1.0, clock=clock)
    # start-up, full speed at 8, then 12 in flight for 7% more: not worth their memory
    assert limits_after(slots, clock, (60, 100, 107, 104)) == [8, 12, 8, 8]


def test_goodput_slots_step_back_when_more_in_flight_made_it_slower():
    from mcsync.limits import GoodputSlots

    clock = FakeClock()
    slots = GoodputSlots(8, 128, interval_s=1.0, clock=clock)
    # the baseline at 8, then 8 → 12 → 18 (200 was the best, at 12)
    assert limits_after(slots, clock, (100, 140, 200)) == [8, 12, 18]
    saturate(slots)
    clock.now += 1.0
    slots.moved(90)  # contention: much worse at 18
    assert slots.limit == 12


def test_goodput_slots_do_not_move_when_nobody_waited():
    from mcsync.limits import GoodputSlots

    clock = FakeClock()
    slots = GoodputSlots(8, 128, interval_s=1.0, clock=clock)
    for rate in (100, 500, 1000):  # the slots were not what limited the run
        clock.now += 1.0
        slots.moved(rate)
    assert slots.limit == 8


def test_goodput_slots_halve_on_throttling_within_floor_and_ceiling():
    from mcsync.limits import GoodputSlots

    slots = GoodputSlots(8, 10, floor=3, clock=FakeClock())
    slots.throttled()
    assert slots.limit == 4
    slots.throttled()
    assert slots.limit == 3
    slots._set(1000)
    assert slots.limit == 10


def test_goodput_slots_are_fifo_and_survive_cancellation():
    from mcsync.limits import GoodputSlots

    async def go():
        slots = GoodputSlots(1, 4, floor=1, clock=FakeClock())
        await slots.acquire()
        order = []

        async def want(tag):
            async with slots.slot():
                order.append(tag)

        first = asyncio.create_task(want("first"))
        cancelled = asyncio.create_task(want("cancelled"))
        last = asyncio.create_task(want("last"))
        await asyncio.sleep(0)
        cancelled.cancel()
        await asyncio.sleep(0)
        slots.release()
        await asyncio.gather(first, last)
        with pytest.raises(asyncio.CancelledError):
            await cancelled
        return order, slots.busy

    order, busy = asyncio.run(go())
    assert order == ["first", "last"] and busy == 0


MIB = 1 << 20


def test_goodput_slots_count_the_most_parts_that_were_in_flight_not_the_most_allowed():
    from mcsync.limits import GoodputSlots

    async def go():
        slots = GoodputSlots(8, 8)  # eight allowed from the start
        await slots.acquire()
        await slots.acquire()
        slots.release()
        await asyncio.gather(*(slots.acquire() for _ in range(4)))  # five at once, no more
        slots.release()
        await slots.acquire()
        return slots.most_busy, slots.peak

    assert asyncio.run(go()) == (5, 8)


def test_buffer_pool_serves_a_part_from_the_smallest_free_buffer_that_holds_it():
    from mcsync.limits import BufferPool

    pool = BufferPool(keep=8)
    big, small = pool.take(9 * MIB), pool.take(3 * MIB + 1)
    assert (len(big), len(small)) == (9 * MIB, 4 * MIB)  # rounded up to whole MiB
    pool.give(big)
    pool.give(small)
    assert pool.take(2 * MIB) is small  # not a fresh buffer, and not the larger one
    assert pool.take(5 * MIB) is big


def test_buffer_pool_keeps_no_more_buffers_than_were_ever_lent_at_once():
    from mcsync.limits import BufferPool

    pool = BufferPool(keep=8)
    # Parts of many sizes, two in hand at a time, each larger than the last: a pool kept per
    # size would end holding one buffer of each.
    held = [pool.take(1 * MIB)]
    for mib in range(2, 12):
        held.append(pool.take(mib * MIB))
        pool.give(held.pop(0))
    pool.give(held.pop())
    assert pool.kept == (10 + 11) * MIB


def test_buffer_pool_keeps_at_most_keep_free_buffers():
    from mcsync.limits import BufferPool

    pool = BufferPool(keep=2)
    held = [pool.take(MIB) for _ in range(5)]
    for buf in held:
        pool.give(buf)
    assert pool.kept == 2 * MIB


def test_a_buffer_whose_borrower_failed_is_never_lent_again():
    """A read into it may still be under way in a worker thread (a cancelled ``read_into``):
    the next part must get another buffer."""
    from mcsync.limits import BufferPool

    pool = BufferPool(keep=8)
    with pool.lent(MIB) as first:
        pass
    with pool.lent(MIB) as again:
        assert again is first  # returned whole: reused
    with pytest.raises(asyncio.CancelledError), pool.lent(MIB) as taken:
        raise asyncio.CancelledError
    assert taken is first
    with pool.lent(MIB) as after:
        assert after is not first
    assert pool.kept == MIB  # the one that came back; the dropped one is not kept


def test_tuned_parts_climb_from_the_baseline_at_once_and_step_back_when_it_stops_paying():
    from mcsync.limits import GoodputSlots

    clock = FakeClock()
    slots = GoodputSlots(16, 256, floor=4, interval_s=1.0, probe_after=8, clock=clock)
    # the baseline at 16 is tried 1.5x higher at once; 24 paid (+50%), 36 did not (+7%)
    assert limits_after(slots, clock, (100, 150, 160)) == [24, 36, 24]
    assert slots.peak == 36


def test_tuned_parts_try_a_plateau_higher_after_a_while_and_keep_it_if_it_pays():
    from mcsync.limits import GoodputSlots

    clock = FakeClock()
    slots = GoodputSlots(16, 256, floor=4, interval_s=1.0, probe_after=8, clock=clock)
    assert limits_after(slots, clock, (100, 104)) == [24, 16]  # 24 gave nothing: held at 16
    # seven intervals held, the eighth tries 20; the target got faster meanwhile: 20 pays,
    # so it climbs on (x1.5)
    assert limits_after(slots, clock, [100] * 7) == [16] * 7
    assert limits_after(slots, clock, (101, 130)) == [20, 30]
    assert limits_after(slots, clock, (131,)) == [20]  # 30 gave no more than 20: back
    # a plateau's probe that does not pay is taken back too
    assert limits_after(slots, clock, [130] * 8) == [20] * 7 + [25]
    assert limits_after(slots, clock, (129,)) == [20]


def test_tuned_parts_grow_no_further_while_the_client_or_a_rate_limit_bounds_the_run():
    from mcsync.limits import GoodputSlots

    clock = FakeClock()
    slots = GoodputSlots(16, 256, floor=4, interval_s=1.0, probe_after=2, clock=clock)
    slots.bound_by("client")
    # no climb from the baseline, none on a rising rate, no probe on a plateau
    assert limits_after(slots, clock, (100, 150, 150, 150, 150)) == [16] * 5
    slots.bound_by("bwlimit")
    assert limits_after(slots, clock, (200, 200, 200)) == [16] * 3
    slots.bound_by("target")  # waiting on the target again: more in flight may help
    assert limits_after(slots, clock, (250,)) == [24]


def test_a_hold_gives_back_what_it_took_however_its_body_ends():
    async def go():
        b = ByteBudget(10)
        async with b.hold(100):  # clamped to the whole budget
            inside = b.in_use
        with pytest.raises(ValueError):
            async with b.hold(4):
                raise ValueError("the part failed")
        async with b.hold(10):
            waiting = asyncio.create_task(_hold(b, 3))
            await asyncio.sleep(0)
            waiting.cancel()  # cancelled while it waits: it took nothing
            with pytest.raises(asyncio.CancelledError):
                await waiting
        return inside, b.in_use, b.peak

    assert asyncio.run(go()) == (10, 0, 10)


async def _hold(b, n):
    async with b.hold(n):
        await asyncio.sleep(10)


def test_a_gate_is_its_own_context():
    from mcsync.limits import GoodputSlots

    async def go():
        slots = GoodputSlots(2, 2)
        async with slots.slot(), slots.slot():
            held = slots.busy
            third = asyncio.create_task(_enter(slots))
            await asyncio.sleep(0)
            assert not third.done()  # two is the limit
        await third
        with pytest.raises(ValueError):
            async with slots.slot():
                raise ValueError("the request failed")
        return held, slots.busy

    assert asyncio.run(go()) == (2, 0)


async def _enter(slots):
    async with slots.slot():
        pass
