"""An S3 store's check (``Store.check``) against SeaweedFS through the fault proxy: it tries its
listing as often as the retry policy lets a check (``preflight_attempts``), and the run's own
requests are still tried as often as a request may (``sdk_attempts``), whether the check had
a client of its own (the two differ) or asked with the run's (they are equal, the default)."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from mcsync.errors import Transient
from mcsync.retry import RetryPolicy
from mcsync.stores.s3 import S3Store
from mcsync.stores.s3_clients import S3Credentials
from mcsync.testing.faultproxy import INTERNAL_ERROR, FaultProxy, Rule
from mcsync.testing.servers import S3Endpoint

from .helpers import new_bucket


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
