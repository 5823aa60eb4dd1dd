"""An S3 store's check (``Store.check``) against SeaweedFS through the fault proxy: it tries its
listing as often as the retry policy lets a check (``preflight_attempts``), and the run's own
requests are still tried as often as a request may (``sdk_attempts``), whether the check had
a client of its own (the two differ) or asked with the run's (they are equal, the default).
A check that saw every key stands in for the listing that follows it, once, while fresh, and
stays exact through the writes of mcsync's own state (the lock) between check and listing."""

from __future__ import annotations

import asyncio
import contextlib
import urllib.parse
from pathlib import Path

import pytest

import mcsync
from mcsync.errors import Transient
from mcsync.retry import RetryPolicy
from mcsync.stores import s3
from mcsync.stores.s3 import S3Store
from mcsync.stores.s3_clients import S3Credentials
from testbed.faultproxy import INTERNAL_ERROR, FaultProxy, Rule
from testbed.servers import S3Endpoint

from ...integration.helpers import new_bucket, put_objects, read_bucket, write_tree


async def _check_then_list(store: S3Store) -> tuple[BaseException | None, BaseException | None]:
    """What the check raised, then what a listing raised (None: nothing)."""
    outcomes: list[BaseException | None] = []
    try:
        await store.check(mode="read")
        outcomes.append(None)
    except Exception as exc:
        outcomes.append(exc)
    try:
        async with contextlib.aclosing(store.list()) as listing:
            async for _ in listing:
                pass
        outcomes.append(None)
    except Exception as exc:
        outcomes.append(exc)
    await store.aclose()
    return outcomes[0], outcomes[1]


@pytest.mark.parametrize(("sdk", "preflight"), [(3, 3), (4, 2), (2, 4)])
def test_a_check_tries_as_often_as_a_check_may_and_a_listing_as_a_request_may(
        seaweed: S3Endpoint, seaweed_proxy: FaultProxy, sdk: int, preflight: int) -> None:
    bucket = new_bucket(seaweed)
    seaweed_proxy.add(Rule(INTERNAL_ERROR, op="ListObjectsV2"))
    policy = RetryPolicy(sdk_attempts=sdk, preflight_attempts=preflight,
                         init_backoff_s=0.01, max_backoff_s=0.02)
    store = S3Store(scheme="s3", bucket=bucket, prefix="p/", endpoint_url=seaweed_proxy.url,
                    region=seaweed.region,
                    credentials=S3Credentials(seaweed.access_key, seaweed.secret_key),
                    retry=policy)

    checked, listed = asyncio.run(_check_then_list(store))

    assert isinstance(checked, Transient) and isinstance(listed, Transient)
    tried = [e.op for e in seaweed_proxy.exchanges("ListObjectsV2")]
    assert len(tried) == preflight + sdk, tried


KEYS = {f"k{i}": bytes([i]) * (i + 1) for i in range(5)}


def _store(ep: S3Endpoint, proxy: FaultProxy, bucket: str) -> S3Store:
    return S3Store(scheme="s3", bucket=bucket, prefix="p/", endpoint_url=proxy.url,
                   region=ep.region, credentials=S3Credentials(ep.access_key, ep.secret_key))


async def _check_and_list(store: S3Store, listings: int) -> list[list[tuple[str, int]]]:
    """Check, then list ``listings`` times: (key, size) of each listing."""
    await store.check(mode="read")
    seen = []
    for _ in range(listings):
        async with contextlib.aclosing(store.list()) as listing:
            seen.append([(o.key, o.size) async for o in listing])
    await store.aclose()
    return seen


@pytest.mark.parametrize(("page", "fresh_s", "after"), [
    (1000, 10.0, []),  # the check saw every key: only the second listing asks
    (3, 10.0, ["p/k2"]),  # its page was full: the first listing goes on after its last key
    (1000, 0.0, [""]),  # stale by the time of the listing: the first listing asks afresh
])
def test_a_check_s_page_starts_the_next_listing_once(
        seaweed: S3Endpoint, seaweed_proxy: FaultProxy, monkeypatch: pytest.MonkeyPatch,
        page: int, fresh_s: float, after: list[str]) -> None:
    bucket = new_bucket(seaweed)
    put_objects(seaweed, bucket, KEYS, prefix="p/")
    monkeypatch.setattr(s3, "CHECK_PAGE", page)
    monkeypatch.setattr(s3, "CHECKED_FRESH_S", fresh_s)

    seen = asyncio.run(_check_and_list(_store(seaweed, seaweed_proxy, bucket), listings=2))

    want = sorted((k, len(v)) for k, v in KEYS.items())
    assert seen == [want, want]
    # (the check's, the first listing's if any, the second listing's): where each started
    asked = [_start_after(e.target) for e in seaweed_proxy.exchanges("ListObjectsV2")]
    assert asked == ["", *after, ""]


def _start_after(target: str) -> str:
    query = urllib.parse.parse_qs(urllib.parse.urlsplit(target).query)
    return query.get("start-after", [""])[0]


def test_a_write_through_the_store_after_its_check_is_in_the_next_listing(
        seaweed: S3Endpoint, seaweed_proxy: FaultProxy) -> None:
    bucket = new_bucket(seaweed)
    store = _store(seaweed, seaweed_proxy, bucket)

    async def check_write_list() -> list[str]:
        await store.check(mode="write")  # an empty prefix: a whole, empty listing
        await store.put("new", b"x")
        async with contextlib.aclosing(store.list()) as listing:
            keys = [o.key async for o in listing]
        await store.aclose()
        return keys

    assert asyncio.run(check_write_list()) == ["new"]
    assert len(seaweed_proxy.exchanges("ListObjectsV2")) == 2


def _fast_failing(ep: S3Endpoint, proxy: FaultProxy, bucket: str) -> S3Store:
    return S3Store(scheme="s3", bucket=bucket, prefix="p/", endpoint_url=proxy.url,
                   region=ep.region, credentials=S3Credentials(ep.access_key, ep.secret_key),
                   retry=RetryPolicy(sdk_attempts=1, preflight_attempts=1,
                                     init_backoff_s=0.01, max_backoff_s=0.02))


@pytest.mark.parametrize(("page", "lists"), [
    (1000, 1),  # the check saw every key: its page, with the write entered, is the listing
    (2, 2),  # a full page ending before ".mcsync/": the write is in the rest, listed after it
])
def test_writes_of_mcsync_s_own_state_after_the_check_keep_its_page_exact(
        seaweed: S3Endpoint, seaweed_proxy: FaultProxy, monkeypatch: pytest.MonkeyPatch,
        page: int, lists: int) -> None:
    # A run writes its lock between its check and its listing: the lock is no data, so the
    # page stands, and lists what the server now holds.
    bucket = new_bucket(seaweed)
    put_objects(seaweed, bucket, {"-a": b"1", "-b": b"22", ".mcsync/old": b"3", "k": b"4444"},
                prefix="p/")
    monkeypatch.setattr(s3, "CHECK_PAGE", page)
    store = _store(seaweed, seaweed_proxy, bucket)

    async def check_write_list() -> list[tuple[str, int]]:
        await store.check(mode="write")
        await store.put(".mcsync/lock", b"held")
        await store.delete(".mcsync/old")
        async with contextlib.aclosing(store.list()) as listing:
            keys = [(o.key, o.size) async for o in listing]
        await store.aclose()
        return keys

    assert asyncio.run(check_write_list()) == [("-a", 1), ("-b", 2), (".mcsync/lock", 4),
                                               ("k", 4)]
    assert len(seaweed_proxy.exchanges("ListObjectsV2")) == lists


def test_a_failed_write_of_mcsync_s_own_state_drops_the_check_s_page(
        seaweed: S3Endpoint, seaweed_proxy: FaultProxy) -> None:
    bucket = new_bucket(seaweed)
    put_objects(seaweed, bucket, {"k": b"1"}, prefix="p/")
    seaweed_proxy.add(Rule(INTERNAL_ERROR, op="PutObject"))
    store = _fast_failing(seaweed, seaweed_proxy, bucket)

    async def check_fail_list() -> tuple[BaseException | None, list[str]]:
        await store.check(mode="read")
        failed = None
        try:
            await store.put(".mcsync/lock", b"held")
        except Exception as exc:
            failed = exc
        async with contextlib.aclosing(store.list()) as listing:
            keys = [o.key async for o in listing]
        await store.aclose()
        return failed, keys

    failed, keys = asyncio.run(check_fail_list())
    assert isinstance(failed, Transient)
    assert keys == ["k"]
    assert len(seaweed_proxy.exchanges("ListObjectsV2")) == 2  # asked again: it may have landed


def test_a_run_to_an_s3_target_lists_it_once_though_it_writes_its_lock_first(
        seaweed: S3Endpoint, seaweed_proxy: FaultProxy, tmp_path: Path) -> None:
    files = {"a.bin": b"a" * 100, "d/b.bin": b"b" * 3000, "d/e/c.json": b"{}"}
    write_tree(tmp_path / "src", files)
    bucket = new_bucket(seaweed)

    report = mcsync.sync(str(tmp_path / "src"), _store(seaweed, seaweed_proxy, bucket))

    assert report.exit_code == 0
    assert read_bucket(seaweed, bucket, "p/") == files
    lock_puts = seaweed_proxy.exchanges("PutObject", key="p/.mcsync/lock-*")
    assert len(lock_puts) == 1
    listings = seaweed_proxy.exchanges("ListObjectsV2")
    assert len(listings) == 1, [e.target for e in listings]


def test_a_write_that_ends_while_a_listing_reads_the_page_leaves_that_listing_alone(
        seaweed: S3Endpoint, seaweed_proxy: FaultProxy) -> None:
    # The lock's PUT went out before the listing took the page and came back while the
    # listing was going through it: the listing goes on as the page was, in order.
    bucket = new_bucket(seaweed)
    put_objects(seaweed, bucket, {"a": b"1", "b": b"22"}, prefix="p/")
    store = _store(seaweed, seaweed_proxy, bucket)

    async def write_during_listing() -> list[str]:
        await store.check(mode="write")
        writing = asyncio.create_task(store.put(".mcsync/lock", b"held"))
        await asyncio.sleep(0)  # the PUT is on its way
        async with contextlib.aclosing(store.list()) as listing:
            keys = [(await anext(listing)).key]
            await writing
            keys += [o.key async for o in listing]
        await store.aclose()
        return keys

    assert asyncio.run(write_during_listing()) == ["a", "b"]
