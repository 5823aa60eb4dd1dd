"""Token buckets and the bandwidth timetable, on a fake clock."""

import asyncio
import datetime

import pytest

from mcsync.errors import UsageError
from mcsync.ratelimit import Bandwidth, Timetable, TokenBucket

MiB = 1 << 20


class FakeTime:
    def __init__(self) -> None:
        self.now = 0.0
        self.slept: list[float] = []

    def clock(self) -> float:
        return self.now

    async def sleep(self, s: float) -> None:
        self.slept.append(s)
        self.now += s


def test_requests_per_second_are_capped_after_the_burst():
    t = FakeTime()
    bucket = TokenBucket(10, burst=10, clock=t.clock, sleep=t.sleep)

    async def go() -> None:
        for _ in range(30):
            await bucket.take(1)

    asyncio.run(go())
    # 10 at once (the burst), then 20 more at 10 a second: two seconds
    assert t.now == pytest.approx(2.0, abs=0.11)


def test_a_take_larger_than_the_burst_goes_through_and_is_paid_for_after():
    t = FakeTime()
    bucket = TokenBucket(50 * MiB, clock=t.clock, sleep=t.sleep)  # 1 s of burst

    async def go() -> None:
        await bucket.take(8 * MiB)
        await bucket.take(200 * MiB)  # no wait: the bucket was not in debt
        assert t.now == 0.0
        await bucket.take(1)  # in debt by 158 MiB: waits 158/50 s
        assert t.now == pytest.approx(158 / 50)

    asyncio.run(go())


def test_concurrent_takers_share_the_rate():
    t = FakeTime()
    bucket = TokenBucket(100, burst=100, clock=t.clock, sleep=t.sleep)

    async def go() -> None:
        await asyncio.gather(*(bucket.take(50) for _ in range(10)))  # 500 units

    asyncio.run(go())
    # 100 at once (the burst), then 400 at 100 a second, the last take going into debt
    assert t.now == pytest.approx(3.5, abs=0.01)


def test_unlimited_never_waits():
    t = FakeTime()
    bucket = TokenBucket(0, clock=t.clock, sleep=t.sleep)
    asyncio.run(bucket.take(10**12))
    assert t.slept == []


@pytest.mark.parametrize("text,at,rate", [
    ("50MiB", "12:00", 50 * MiB), ("off", "12:00", None),
    ("08:00,100MiB 20:00,off", "07:59", None), ("08:00,100MiB 20:00,off", "08:00", 100 * MiB),
    ("08:00,100MiB 20:00,off", "19:59", 100 * MiB), ("08:00,100MiB 20:00,off", "20:00", None),
    ("20:00,off 08:00,1G", "03:00", None), ("20:00,off 08:00,1G", "09:30", 1 << 30),
])
def test_the_timetable_gives_the_rate_of_the_time_of_day(text, at, rate):
    hour, minute = map(int, at.split(":"))
    when = datetime.datetime(2026, 12, 1, hour, minute)
    assert Timetable.parse(text).rate_at(when) == rate


@pytest.mark.parametrize("text", ["fast", "25:00,1M", "08:00", "08:00,1M 08:00,2M", "-5M",
                                  "08:00,1M nonsense"])
def test_a_bad_bandwidth_is_a_usage_error_naming_it(text):
    with pytest.raises(UsageError, match="--bwlimit"):
        Timetable.parse(text)


def test_the_bandwidth_follows_the_timetable_as_time_passes():
    t = FakeTime()
    day = [datetime.datetime(2026, 12, 1, 7, 59)]
    bw = Bandwidth(Timetable.parse("08:00,10 20:00,off"), clock=t.clock, sleep=t.sleep,
                   now=lambda: day[0])

    async def go() -> None:
        await bw.take(1000)  # off before 08:00
        assert t.slept == []
        day[0] = datetime.datetime(2026, 12, 1, 8, 0)
        await bw.take(10)
        await bw.take(30)  # 10/s now
        await bw.take(1)
        assert t.now > 2.0

    asyncio.run(go())


def test_workers_and_the_driver_each_pace_themselves_at_a_share_of_the_limits():
    from mcsync.config import SyncOptions
    from mcsync.ratelimit import limits_share
    from mcsync.scale.worker_runner import worker_options

    opts = SyncOptions(workers=4, tps_limit=100.0, bw_limit="08:00,100MiB 20:00,off 23:30,2MiB")
    each = worker_options(opts, 4)
    assert each.workers == 0 and each.tps_limit == 25.0
    share = Timetable.parse(each.bw_limit or "")
    assert share.entries == ((8 * 60, 25 * MiB), (20 * 60, None), (23 * 60 + 30, MiB // 2))
    assert limits_share(opts, 4).tps_limit == 25.0  # the driver's share
    assert worker_options(SyncOptions(workers=3, bw_limit="10MiB"), 3).bw_limit == str(
        10 * MiB // 3)
    assert limits_share(SyncOptions(bw_limit="10MiB"), 1).bw_limit == "10MiB"
    assert worker_options(SyncOptions(workers=2), 2).bw_limit is None

