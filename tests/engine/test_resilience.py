"""The one retry layer (mcsync.stores.resilience) as the engine runs it, on MemoryStore with faults:
throttling waited out with fewer requests in flight, transient errors retried by type, what
must not be retried left alone, a broken listing resumed, rate limits taken, and all of it in
the report."""

from __future__ import annotations

import asyncio
import logging

import pytest

from mcsync.config import SyncOptions
from mcsync.errors import Throttled, Transient, Unreachable, UsageError
from mcsync.limits import AdaptiveLimit
from mcsync.run.engine import run_sync
from mcsync.stores.memory import MemoryEndpoint, MemoryStore
from mcsync.stores.resilience import Pacing, pacing_of, resilient
from mcsync.testing.faults import Faults, Rule, faulty

from .test_engine import PART, contents, payload, seed

OBJECTS = {f"small/{i:02d}.bin": payload(1000 + i, i) for i in range(12)}
OBJECTS["big.bin"] = payload(3 * PART + 5, 99)


def stores() -> tuple[MemoryStore, MemoryStore]:
    return (MemoryStore("src", endpoint=MemoryEndpoint("a")),
            MemoryStore("dst", endpoint=MemoryEndpoint("b")))


def run(src, dst, tmp_path, **kw):  # type: ignore[no-untyped-def]
    options = SyncOptions(manifest=str(tmp_path / "m.sqlite"), part_size=PART, **kw)
    return asyncio.run(run_sync(src, dst, options))


def test_throttling_is_waited_out_with_fewer_requests_in_flight(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="mcsync")
    src, dst = stores()
    seed(src, OBJECTS)
    slow = Rule("put*", times=6, error=Throttled("SlowDown: Please reduce your request rate."))
    report = run(src, faulty(dst, Faults([slow])), tmp_path, concurrency=16)
    assert report.exit_code == 0, report.failures
    assert contents(dst) == OBJECTS
    assert report.requests_throttled == 6 and report.requests_retried >= 6
    assert report.requests_in_flight_low is not None and report.requests_in_flight_low < 16
    assert report.to_dict()["requests_throttled"] == 6
    assert any("throttling" in r.getMessage() for r in caplog.records)


def test_a_transient_error_is_retried_and_a_lasting_one_fails_the_object_alone(tmp_path):
    src, dst = stores()
    seed(src, OBJECTS)
    flaky = Rule("put", key="small/03.bin", times=2, error=Unreachable("reset (test)"))
    broken = Rule("put", key="small/07.bin", times=None, error=Transient("always (test)"))
    fast = Pacing.for_options(SyncOptions())
    fast.policy = type(fast.policy)(init_backoff_s=0.001, max_backoff_s=0.002)
    target = resilient(faulty(dst, Faults([flaky, broken])), fast)
    report = run(src, target, tmp_path)
    assert [k for k, _ in report.failures] == ["small/07.bin"]
    assert "always (test)" in report.failures[0][1]
    assert contents(dst) == {k: v for k, v in OBJECTS.items() if k != "small/07.bin"}
    assert report.requests_retried == 2 + (fast.policy.max_attempts - 1)


def test_creating_an_upload_is_not_retried_unless_refused(tmp_path):
    src, dst = stores()
    seed(src, {"big.bin": OBJECTS["big.bin"]})
    once = Rule("open_upload", times=1, error=Unreachable("reset after sending (test)"))
    report = run(src, faulty(dst, Faults([once])), tmp_path)
    assert [k for k, _ in report.failures] == ["big.bin"]  # a second create could orphan one
    refused = Rule("open_upload", times=2, error=Throttled("SlowDown (test)"))
    report = run(src, faulty(dst, Faults([refused])), tmp_path)
    assert report.exit_code == 0 and contents(dst) == {"big.bin": OBJECTS["big.bin"]}


def test_a_listing_that_breaks_off_is_listed_again_without_repeating_keys(tmp_path):
    src, dst = stores()
    seed(src, OBJECTS)
    cut = Rule("list", key="small/05.bin", phase="after", times=1,
               error=Unreachable("listing reset (test)"))
    report = run(faulty(src, Faults([cut])), dst, tmp_path)
    assert report.exit_code == 0 and report.objects_copied == len(OBJECTS)
    assert contents(dst) == OBJECTS
    assert report.requests_retried == 1


def test_a_throttled_check_is_waited_out_and_an_unreachable_one_gives_up_soon(tmp_path):
    src, dst = stores()
    seed(src, OBJECTS)
    busy = Rule("check", times=3, error=Throttled("SlowDown (test)"))
    assert run(src, faulty(dst, Faults([busy])), tmp_path).exit_code == 0
    faults = Faults([Rule("check", times=None, error=Unreachable("connection refused (test)"))])
    with pytest.raises(Unreachable):
        run(src, faulty(dst, faults), tmp_path / "2")
    assert faults.calls["check"] == 3


def test_requests_take_from_the_rate_limits(tmp_path):
    src, dst = stores()
    seed(src, OBJECTS)

    class Counting:
        def __init__(self) -> None:
            self.n = 0.0

        async def take(self, n: float = 1.0) -> None:
            self.n += n

    pacing = Pacing.for_options(SyncOptions())
    pacing.tps, pacing.bandwidth = Counting(), Counting()  # type: ignore[assignment]
    report = run(resilient(src, pacing), resilient(dst, pacing), tmp_path)
    assert report.exit_code == 0
    total = sum(map(len, OBJECTS.values()))
    assert pacing.bandwidth.n >= 2 * total  # type: ignore[union-attr]  # read, then sent
    assert pacing.tps.n >= len(OBJECTS) * 2  # type: ignore[union-attr]  # a get and a put each


def test_pacing_from_options():
    p = Pacing.for_options(SyncOptions(tps_limit=50, bw_limit="08:00,100MiB 20:00,off"))
    assert p.tps is not None and p.bandwidth is not None
    assert Pacing.for_options(SyncOptions()).tps is None
    with pytest.raises(UsageError, match="--bwlimit"):
        Pacing.for_options(SyncOptions(bw_limit="fast"))
    store = MemoryStore("x", endpoint=MemoryEndpoint("c"))
    wrapped = resilient(store, p)
    assert pacing_of(wrapped) is p and resilient(wrapped, Pacing()) is wrapped
    assert pacing_of(store) is None


def test_adaptive_limit_cuts_once_per_cooldown_and_grows_back():
    now = [0.0]
    limit = AdaptiveLimit(64, floor=2, cooldown_s=1.0, clock=lambda: now[0])
    assert limit.throttled() and limit.limit == 32
    assert not limit.throttled() and limit.limit == 32  # the same burst of refusals
    now[0] = 1.5
    assert limit.throttled() and limit.limit == 16 and limit.low == 16
    for _ in range(16):
        limit.succeeded()
    assert limit.limit == 18  # an eighth more per window of `limit` successes
    for _ in range(18):
        limit.succeeded()
    assert limit.limit == 20
    for _ in range(10):
        now[0] += 2
        limit.throttled()
    assert limit.limit == 2  # the floor


def test_adaptive_limit_holds_requests_beyond_it():
    async def go() -> list[int]:
        limit = AdaptiveLimit(2)
        seen: list[int] = []

        async def one() -> None:
            await limit.acquire()
            seen.append(limit.busy)
            await asyncio.sleep(0.01)
            limit.release()

        await asyncio.gather(*(one() for _ in range(6)))
        return seen

    assert max(asyncio.run(go())) == 2
