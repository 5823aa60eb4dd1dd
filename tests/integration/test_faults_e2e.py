"""mcsync end to end through the fault-injecting proxy: a local directory of 60 objects synced to
``meta://`` (SeaweedFS behind ``testbed.faultproxy``) while the proxy throttles, resets
and stalls requests, and while keys expire.

Every test asserts the behaviour we want, and mcsync has it today: exit 0, every object
byte-identical, no upload left open, and the throttling it survived shown in the report or the
log. A run that falls short is described from the proxy's record (``describe``: each failed
key with the requests the proxy saw for it).

The set: 55 small objects (1-512 KiB: one PUT each), four of 12-20 MiB and one of 100 MiB
(multipart uploads in 8 MiB parts).
"""

from __future__ import annotations

import json
import logging
import random
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import mcsync
from mcsync.report import SyncReport
from testbed.faultproxy import (
    EXPIRED_TOKEN,
    SLOW_DOWN,
    TOO_MANY_REQUESTS,
    UPLOADS,
    FaultProxy,
    Reset,
    Rule,
    ShortBody,
    Stall,
)
from testbed.servers import S3Endpoint

from .helpers import read_bucket, write_tree

MiB = 1 << 20
CLIENT_TIMEOUT_S = 4  # see short_client_timeouts


def dataset() -> dict[str, bytes]:
    rng = random.Random(60)
    objects = {f"data/small/{i:02d}.bin": rng.randbytes(rng.randint(1, 512) * 1024)
               for i in range(55)}
    objects |= {f"data/mp/{n}MiB.bin": rng.randbytes(n * MiB + 99) for n in (12, 14, 17, 20)}
    objects["data/big.bin"] = rng.randbytes(100 * MiB)
    return objects


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, bytes]]:
    root = tmp_path_factory.mktemp("e2e") / "src"
    objects = dataset()
    write_tree(root, objects)
    return root, objects


@pytest.fixture
def short_client_timeouts(monkeypatch: pytest.MonkeyPatch) -> Iterator[float]:
    """mcsync has no request-timeout setting: obstore's is 300 s a request and botocore's read
    timeout 120 s, fixed in ``stores/s3_clients.py``. For a stall to outlast a client's
    timeout in a test, the clients mcsync builds are given CLIENT_TIMEOUT_S instead (the
    classes ``s3_clients`` imports when it builds a client are replaced)."""
    import aiobotocore.config
    import obstore.store

    make_obstore = obstore.store.S3Store
    base_config = aiobotocore.config.AioConfig

    def obstore_store(*args: Any, client_options: dict[str, str] | None = None,
                      **kwargs: Any) -> Any:
        options = {**(client_options or {}), "timeout": f"{CLIENT_TIMEOUT_S}s"}
        return make_obstore(*args, client_options=options, **kwargs)

    class Config(base_config):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs["read_timeout"] = CLIENT_TIMEOUT_S
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(obstore.store, "S3Store", obstore_store)
    monkeypatch.setattr(aiobotocore.config, "AioConfig", Config)
    yield CLIENT_TIMEOUT_S


def sync_through(proxy: FaultProxy, src: Path, bucket: str,
                 monkeypatch: pytest.MonkeyPatch) -> tuple[SyncReport, float]:
    for k, v in proxy.endpoint.meta_env().items():
        monkeypatch.setenv(k, v)
    start = time.monotonic()
    report = mcsync.sync(str(src), f"meta://{bucket}/")
    return report, time.monotonic() - start


def describe(report: SyncReport, proxy: FaultProxy, elapsed: float) -> str:
    """What failed, each with the requests the proxy saw for its key."""
    lines = [f"exit {report.exit_code} after {elapsed:.1f} s, {report.objects_copied} copied, "
             f"{report.objects_failed} failed"]
    for key, error in report.failures[:10]:
        tries = proxy.exchanges(key=key)
        span = tries[-1].t - tries[0].t if tries else 0.0
        seen = Counter(f"{e.op} {e.fault or e.status}" for e in tries)
        lines.append(f"  {error}\n    {len(tries)} requests over {span:.2f} s: {dict(seen)}")
    lines.append(f"  proxy: {dict(proxy.summary())}")
    return "\n".join(lines)


def throttling_shown(report: SyncReport, records: list[logging.LogRecord]) -> bool:
    shown = {k: v for k, v in report.to_dict().items() if k not in ("src", "dst")}  # bucket names
    said = json.dumps(shown).lower() + " ".join(
        r.getMessage().lower() for r in records if r.name.startswith("mcsync"))
    return any(word in said for word in ("throttl", "slowdown", "slow down", "toomanyrequests"))


def assert_complete(report: SyncReport, proxy: FaultProxy, elapsed: float, seaweed: S3Endpoint,
                    bucket: str, objects: dict[str, bytes]) -> None:
    assert report.exit_code == 0, describe(report, proxy, elapsed)
    got = read_bucket(seaweed, bucket)
    assert sorted(set(got) - set(objects)) == []
    assert sorted(k for k, v in objects.items() if got.get(k) != v) == []  # byte-identical
    uploads = seaweed.client().list_multipart_uploads(Bucket=bucket).get("Uploads", [])
    assert [u["Key"] for u in uploads] == []


def test_random_slowdowns_resets_and_stalls_are_survived(seaweed, seaweed_proxy, source,
                                                         bucket_factory, monkeypatch,
                                                         short_client_timeouts):
    """(a) 20% of requests answered SlowDown, 5% of uploads reset in the middle of their body,
    two uploads stalled 10 s, past the clients' 4 s timeout: all three are retried. That the
    throttling shows in the report or the log is asserted by
    test_throttling_that_was_survived_shows_in_the_report_or_log below."""
    src, objects = source
    bucket = bucket_factory(seaweed)
    proxy = seaweed_proxy
    proxy.seed = 1
    proxy.add(Rule(SLOW_DOWN, probability=0.20, name="slow"))
    proxy.add(Rule(Reset("request"), op=UPLOADS, probability=0.05, name="reset"))
    proxy.add(Rule(Stall(10), op=UPLOADS, count=2, name="stall"))
    report, elapsed = sync_through(proxy, src, bucket, monkeypatch)
    assert_complete(report, proxy, elapsed, seaweed, bucket, objects)
    assert report.objects_copied == 60
    applied = Counter(e.fault for e in proxy.exchanges() if e.fault)
    assert applied["SlowDown"] >= 10 and applied["reset-request"] >= 2, applied
    stalled = proxy.exchanges(fault="stall")
    assert stalled and {e.outcome for e in stalled} == {"client-gone"}  # the clients gave up
    assert {e.op for e in proxy.exchanges(fault="reset-request")} >= {"PutObject", "UploadPart"}


def test_a_throttled_start_is_waited_out(seaweed, seaweed_proxy, source, bucket_factory,
                                         monkeypatch, caplog):
    """(b) every request answered SlowDown for the first 10 s of the run, then recovery."""
    caplog.set_level(logging.INFO, logger="mcsync")
    src, objects = source
    bucket = bucket_factory(seaweed)
    seaweed_proxy.add(Rule(SLOW_DOWN, for_s=10), from_now=True)
    report, elapsed = sync_through(seaweed_proxy, src, bucket, monkeypatch)
    assert_complete(report, seaweed_proxy, elapsed, seaweed, bucket, objects)
    assert elapsed >= 10 and throttling_shown(report, caplog.records)


def test_ten_seconds_of_slowdown_on_every_object_is_waited_out(seaweed, seaweed_proxy, source,
                                                               bucket_factory, monkeypatch,
                                                               caplog):
    """(b) every request for the objects answered SlowDown for 10 s, then recovery (the
    preflight listing, the lock and the manifest go through: see the test above)."""
    caplog.set_level(logging.INFO, logger="mcsync")
    src, objects = source
    bucket = bucket_factory(seaweed)
    seaweed_proxy.add(Rule(SLOW_DOWN, key="data/*", for_s=10), from_now=True)
    report, elapsed = sync_through(seaweed_proxy, src, bucket, monkeypatch)
    assert_complete(report, seaweed_proxy, elapsed, seaweed, bucket, objects)
    assert elapsed >= 10 and throttling_shown(report, caplog.records)
    # requests in flight fell while the store throttled, and grew back once it stopped
    low, end = report.requests_in_flight_low, report.requests_in_flight_end
    assert low is not None and end is not None and low < 128 // 4 and end > low, (low, end)


def test_429_is_retried_like_slowdown(seaweed, seaweed_proxy, source, bucket_factory,
                                      monkeypatch, caplog):
    """(c) 20% of requests answered 429 TooManyRequests."""
    caplog.set_level(logging.INFO, logger="mcsync")
    src, objects = source
    bucket = bucket_factory(seaweed)
    seaweed_proxy.seed = 1
    seaweed_proxy.add(Rule(TOO_MANY_REQUESTS, probability=0.20))
    report, elapsed = sync_through(seaweed_proxy, src, bucket, monkeypatch)
    assert_complete(report, seaweed_proxy, elapsed, seaweed, bucket, objects)
    assert throttling_shown(report, caplog.records)


@pytest.mark.parametrize(("op", "key", "fault"), [
    ("GetObject", ".mcsync/lock-*", Reset("response")),
    ("GetObject", ".mcsync/lock-*", ShortBody()),
    ("ListObjectsV2", "", Reset("response")),
], ids=["lock-get-reset", "lock-get-short", "listing-reset"])
def test_a_response_body_broken_off_once_is_retried(op, key, fault, seaweed, seaweed_proxy,
                                                    source, bucket_factory, monkeypatch):
    src, objects = source
    bucket = bucket_factory(seaweed)
    seaweed_proxy.add(Rule(fault, op=op, key=key, count=1))
    report, elapsed = sync_through(seaweed_proxy, src, bucket, monkeypatch)
    assert_complete(report, seaweed_proxy, elapsed, seaweed, bucket, objects)


def test_throttling_that_was_survived_shows_in_the_report_or_log(seaweed, seaweed_proxy, source,
                                                                 bucket_factory, monkeypatch,
                                                                 caplog):
    caplog.set_level(logging.INFO, logger="mcsync")
    src, objects = source
    bucket = bucket_factory(seaweed)
    seaweed_proxy.add(Rule(SLOW_DOWN, op="PutObject", key="data/*", count=3))
    seaweed_proxy.add(Rule(SLOW_DOWN, op="UploadPart", count=2))
    report, elapsed = sync_through(seaweed_proxy, src, bucket, monkeypatch)
    assert_complete(report, seaweed_proxy, elapsed, seaweed, bucket, objects)
    assert len(seaweed_proxy.exchanges(fault="SlowDown")) == 5
    assert throttling_shown(report, caplog.records)


# --------------------------------------------------------------------------------------------
# The mixed run: the faults above at once, while the keys expire every few seconds.

ROTATING = [(f"ROT{n:06d}", f"rot-secret-{n}") for n in range(1, 200)]
_ROTATE = r'''
import fcntl, json, sys, time
from datetime import datetime, timezone
state, ttl = sys.argv[1], float(sys.argv[2])
with open(state, "a+") as f:
    fcntl.flock(f, fcntl.LOCK_EX)
    f.seek(0)
    n = len(f.read().splitlines()) + 1
    expires = time.time() + ttl
    f.write(f"ROT{n:06d} {expires}\n")
print(json.dumps({"Version": 1, "AccessKeyId": f"ROT{n:06d}", "SecretAccessKey":
                  f"rot-secret-{n}", "Expiration":
                  datetime.fromtimestamp(expires, timezone.utc).isoformat()}))
'''


@pytest.fixture(scope="module")
def rotating_seaweed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Endpoint]:
    """A SeaweedFS server that admits the keys a rotating credential_process hands out."""
    from testbed.servers import seaweedfs

    with seaweedfs(tmp_path_factory.mktemp("rotating"), extra_keys=ROTATING) as ep:
        yield ep


def test_faults_and_keys_expiring_every_few_seconds_together(rotating_seaweed, source, tmp_path,
                                                             monkeypatch, caplog):
    """20% SlowDown, 5% of uploads reset mid-body, 2% of requests stalled, and the keys from a
    credential_process expiring every second (the proxy refuses a key past its Expiration): exit
    0, byte-identical, nothing left open, and the report shows the throttling."""
    from botocore.credentials import RefreshableCredentials

    from ..stores.s3.test_credentials import Issued, PastExpiration

    # botocore renews 15/10 minutes before expiry; keys living 1 s need windows of half a second.
    # (Keys of 3 s rotated only once in a CI run of 3.4 s: the run, not the renewal, was short.)
    monkeypatch.setattr(RefreshableCredentials, "_advisory_refresh_timeout", 0.5)
    monkeypatch.setattr(RefreshableCredentials, "_mandatory_refresh_timeout", 0.25)
    caplog.set_level(logging.INFO, logger="mcsync")
    src, objects = source
    ep = rotating_seaweed
    bucket = f"rotating-{uuid.uuid4().hex[:8]}"
    ep.client().create_bucket(Bucket=bucket)
    script = tmp_path / "rotate.py"
    script.write_text(_ROTATE)
    issued = Issued(tmp_path / "issued")
    with FaultProxy(ep, seed=3).running() as proxy:
        proxy.add(PastExpiration(EXPIRED_TOKEN, issued=issued, name="past expiration"))
        proxy.add(Rule(SLOW_DOWN, probability=0.20, name="slow"))
        proxy.add(Rule(Reset("request"), op=UPLOADS, probability=0.05, name="reset"))
        proxy.add(Rule(Stall(2), probability=0.02, name="stall"))
        monkeypatch.setenv("MCSYNC_META_ENDPOINT_URL", proxy.endpoint.url)
        monkeypatch.setenv("MCSYNC_META_REGION", ep.region)
        monkeypatch.setenv("MCSYNC_META_CREDENTIAL_PROCESS",
                           f"{sys.executable} {script} {issued.state} 1")
        start = time.monotonic()
        report = mcsync.sync(str(src), f"meta://{bucket}/")
        elapsed = time.monotonic() - start
        assert_complete(report, proxy, elapsed, ep, bucket, objects)
        used = {e.access_key for e in proxy.exchanges() if e.access_key}
        applied = Counter(e.fault for e in proxy.exchanges() if e.fault)
    assert report.objects_copied == 60
    assert len(used) >= 3 and issued.count() >= 3, (used, elapsed)  # the keys did rotate
    assert applied["SlowDown"] >= 10 and applied["reset-request"] >= 1, applied
    assert report.requests_throttled >= 1 and throttling_shown(report, caplog.records)
