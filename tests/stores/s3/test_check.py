"""An S3 store's check (``Store.check``) against SeaweedFS through the fault proxy: it tries its
listing as often as the retry policy lets a check (``preflight_attempts``), and the run's own
requests are still tried as often as a request may (``sdk_attempts``), whether the check had
a client of its own (the two differ) or asked with the run's (they are equal, the default).
A check only checks: the listing after it asks the server again, whatever was written between
(its page once stood in for that listing; one request of a run was not worth the state)."""

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
from mcsync.stores.s3_keys import S3Credentials
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


@pytest.mark.parametrize("page", [1000, 3])
def test_a_check_only_checks_and_every_listing_asks_the_server(
        seaweed: S3Endpoint, seaweed_proxy: FaultProxy, monkeypatch: pytest.MonkeyPatch,
        page: int) -> None:
    bucket = new_bucket(seaweed)
    put_objects(seaweed, bucket, KEYS, prefix="p/")
    monkeypatch.setattr(s3, "CHECK_PAGE", page)

    seen = asyncio.run(_check_and_list(_store(seaweed, seaweed_proxy, bucket), listings=2))

    want = sorted((k, len(v)) for k, v in KEYS.items())
    assert seen == [want, want]
    # the check's, then each listing's, each from the start
    asked = [_start_after(e.target) for e in seaweed_proxy.exchanges("ListObjectsV2")]
    assert asked == ["", "", ""]


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


def test_a_run_to_an_s3_target_checks_it_then_lists_it(
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
    assert len(listings) == 2, [e.target for e in listings]  # the check's page, the listing
