"""GCSStore against a fake of the JSON API (fake.py), for what the emulator cannot show: pages,
injected errors and their retries, a server that ignores Range, and credentials."""

from __future__ import annotations

import asyncio
import json
import re

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from mcsync import checksums
from mcsync.errors import (
    ConfigError,
    IntegrityError,
    ListingOrderError,
    NotFound,
    Permanent,
    PreconditionFailed,
    Transient,
)
from mcsync.retry import RetryPolicy
from mcsync.stores.gcs import GCSStore
from mcsync.types import ByteRange

from .fake import FakeGCS

FAST = RetryPolicy(max_attempts=4, init_backoff_s=0.001, max_backoff_s=0.01)


def store(fake: FakeGCS, prefix: str = "", **kw) -> GCSStore:
    kw.setdefault("anonymous", True)
    kw.setdefault("retry", FAST)
    return GCSStore(bucket=fake.bucket, prefix=prefix, api_root=fake.url, **kw)


def run(coro_fn, s: GCSStore):
    async def go():
        try:
            return await coro_fn(s)
        finally:
            await s.aclose()

    return asyncio.run(go())


async def keys(s: GCSStore) -> list[str]:
    return [i.key async for i in s.list()]


# -- listing ----------------------------------------------------------------------------------


def test_listing_follows_page_tokens_one_page_at_a_time(fake_gcs):
    names = [f"p/{i:03d}" for i in range(10)] + ["p/é", "p/日本", "q/outside"]
    for n in names:
        fake_gcs.put(n, n.encode())
    s = store(fake_gcs, "p/", page_size=3)

    async def go(s: GCSStore):
        it = s.list()
        first = await anext(it)
        pages_after_first_item = len(fake_gcs.gcs_requests())
        rest = [i.key async for i in it]
        return first.key, pages_after_first_item, rest

    first, pages_then, rest = run(go, s)
    assert [first, *rest] == [n[2:] for n in names if n.startswith("p/")]
    assert pages_then == 1  # lazy: the second page is asked for when the first is used up
    reqs = fake_gcs.gcs_requests()
    assert len(reqs) == 4  # 12 keys in pages of 3
    assert all(r.query["maxResults"] == "3" and r.query["prefix"] == "p/" for r in reqs)
    assert "pageToken" not in reqs[0].query
    assert all(r.query["pageToken"] for r in reqs[1:])


def test_listing_out_of_order_is_refused(fake_gcs):
    for n in ("a", "b", "c"):
        fake_gcs.put(n, b"x")
    fake_gcs.misorder = True
    with pytest.raises(ListingOrderError, match="out of byte order"):
        run(keys, store(fake_gcs))


def test_composite_object_has_no_etag_but_keeps_generation_and_crc(fake_gcs):
    obj = fake_gcs.put("composite", b"abc", md5=False)

    async def go(s):
        return [i async for i in s.list()]

    (info,) = run(go, store(fake_gcs))
    assert info.etag is None
    assert info.version == str(obj.generation)
    assert info.crc32c == checksums.to_base64(checksums.crc32c(b"abc"))


# -- errors and retries -------------------------------------------------------------------------


@pytest.mark.parametrize("status", [429, 500, 503, 408])
def test_transient_statuses_are_retried(fake_gcs, status):
    fake_gcs.put("k", b"data")
    fake_gcs.failures = [status, status]
    assert run(lambda s: s.get("k"), store(fake_gcs)) == b"data"
    assert len(fake_gcs.gcs_requests()) == 3


def test_retries_stop_at_the_policy_limit(fake_gcs):
    fake_gcs.put("k", b"data")
    fake_gcs.failures = [503] * 10
    with pytest.raises(Transient, match="HTTP 503"):
        run(lambda s: s.get("k"), store(fake_gcs))
    assert len(fake_gcs.gcs_requests()) == FAST.sdk_attempts  # the SDK level (resilience: above)


@pytest.mark.parametrize(("status", "error"), [(400, Permanent), (403, Permanent),
                                               (404, NotFound), (412, PreconditionFailed)])
def test_other_statuses_are_not_retried(fake_gcs, status, error):
    fake_gcs.put("k", b"data")
    fake_gcs.failures = [status]
    with pytest.raises(error):
        run(lambda s: s.get("k"), store(fake_gcs))
    assert len(fake_gcs.gcs_requests()) == 1


def test_preflight_turns_denied_and_unreachable_into_config_errors(fake_gcs):
    fake_gcs.failures = [403]
    with pytest.raises(ConfigError, match="access denied"):
        run(lambda s: s.check(mode="read"), store(fake_gcs))
    fake_gcs.failures = [503] * 10
    with pytest.raises(ConfigError, match="HTTP 503"):
        run(lambda s: s.check(mode="read"), store(fake_gcs))
    assert len(fake_gcs.gcs_requests()) == 1 + FAST.preflight_attempts
    dead = GCSStore(bucket="b", prefix="", api_root="http://127.0.0.1:9", anonymous=True,
                    retry=FAST)
    with pytest.raises(ConfigError, match=re.escape("connection to http://127.0.0.1:9 failed")):
        run(lambda s: s.check(mode="read"), dead)


def test_generation_served_is_checked_and_412_is_precondition_failed(fake_gcs):
    obj = fake_gcs.put("k", b"0123456789")

    async def go(s: GCSStore):
        info = await s.head("k")
        assert await s.get("k", ByteRange(2, 5), expect=info) == b"234"
        assert fake_gcs.gcs_requests()[-1].query["ifGenerationMatch"] == str(obj.generation)
        fake_gcs.put("k", b"abcdefghij")  # a new generation
        with pytest.raises(PreconditionFailed):
            await s.get("k", ByteRange(2, 5), expect=info)
        with pytest.raises(PreconditionFailed):  # a part read into a buffer, as well
            await s.read_into("k", ByteRange(2, 5), bytearray(8), expect=info)

    run(go, store(fake_gcs))


def test_range_ignored_by_the_server_is_cut_out(fake_gcs):
    fake_gcs.put("k", b"0123456789")
    fake_gcs.ignore_range = True

    async def go(s: GCSStore):
        info = await s.head("k")
        buf = bytearray(b"x" * 6)
        into = bytes(await s.read_into("k", ByteRange(3, 7), buf, expect=info))
        return bytes(await s.get("k", ByteRange(3, 7), expect=info)), into, bytes(buf)

    assert run(go, store(fake_gcs)) == (b"3456", b"3456", b"3456xx")


def test_crc_mismatch_on_a_whole_read(fake_gcs):
    fake_gcs.put("k", b"0123456789", crc32c=checksums.to_base64(12345))

    async def go(s: GCSStore):
        info = await s.head("k")
        await s.get("k", expect=info)

    with pytest.raises(IntegrityError, match="CRC32C mismatch"):
        run(go, store(fake_gcs))


# -- credentials ------------------------------------------------------------------------------


def _service_account(tmp_path, fake: FakeGCS):
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    fake.public_key = key.public_key()
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption()).decode()
    path = tmp_path / "sa.json"
    path.write_text(json.dumps({
        "type": "service_account", "project_id": "p", "private_key_id": "k1",
        "private_key": pem, "client_email": "reader@p.iam.gserviceaccount.com",
        "token_uri": f"{fake.url}/token"}))
    return path


def test_service_account_file_from_the_environment(fake_gcs, tmp_path, monkeypatch):
    fake_gcs.access_token = "sa-token"
    fake_gcs.put("k", b"data")
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(_service_account(tmp_path, fake_gcs)))
    s = store(fake_gcs, anonymous=False)

    async def go(s: GCSStore):
        await s.check(mode="read")
        return await s.get("k")

    assert run(go, s) == b"data"
    assert [r.path for r in fake_gcs.requests].count("/token") == 1  # the token is cached
    assert all(r.headers["Authorization"] == "Bearer sa-token" for r in fake_gcs.gcs_requests())


def test_gcloud_user_credentials(fake_gcs, tmp_path, monkeypatch):
    fake_gcs.access_token = "user-token"
    (tmp_path / "application_default_credentials.json").write_text(json.dumps({
        "type": "authorized_user", "client_id": "c", "client_secret": "s",
        "refresh_token": "r", "token_uri": f"{fake_gcs.url}/token"}))
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path))
    run(lambda s: s.check(mode="read"), store(fake_gcs, anonymous=False))
    assert fake_gcs.gcs_requests()[0].headers["Authorization"] == "Bearer user-token"


def test_metadata_server(fake_gcs, monkeypatch):
    import gcloud.aio.auth.token as token_module

    fake_gcs.access_token = "vm-token"
    monkeypatch.setattr(token_module, "GCE_ENDPOINT_TOKEN",
                        f"{fake_gcs.url}/computeMetadata/v1/instance/service-accounts/default/"
                        "token?recursive=true")
    run(lambda s: s.check(mode="read"), store(fake_gcs, anonymous=False))
    assert fake_gcs.gcs_requests()[0].headers["Authorization"] == "Bearer vm-token"


def test_no_credentials_anywhere(fake_gcs, monkeypatch):
    import gcloud.aio.auth.token as token_module

    # No key file, no gcloud login, and no metadata server answers (a dead loopback port).
    monkeypatch.setattr(token_module, "GCE_ENDPOINT_TOKEN", "http://127.0.0.1:9/token")
    with pytest.raises(ConfigError, match="no Google credentials: GOOGLE_APPLICATION_CREDENTIALS"):
        run(lambda s: s.check(mode="read"), store(fake_gcs, anonymous=False))
    assert fake_gcs.requests == []


def test_refused_credentials_are_a_config_error_tried_once(fake_gcs, tmp_path, monkeypatch):
    fake_gcs.token_status = 400
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(_service_account(tmp_path, fake_gcs)))
    with pytest.raises(ConfigError, match=r"credentials refused .*HTTP 400") as exc:
        run(lambda s: s.check(mode="read"), store(fake_gcs, anonymous=False))
    assert "BEGIN PRIVATE KEY" not in str(exc.value)
    assert [r.path for r in fake_gcs.requests] == ["/token"]  # no retry of a refusal, no GCS


@pytest.mark.parametrize(("content", "message"), [
    (None, "no such file"),
    ("{not json", "not a JSON credentials file"),
    ('{"type": "service_account"}', "without client_email, private_key"),
    ('{"type": "something"}', "not a Google credentials file"),
    ("[]", "not a Google credentials file"),
])
def test_bad_credentials_file(fake_gcs, tmp_path, monkeypatch, content, message):
    path = tmp_path / "creds.json"
    if content is not None:
        path.write_text(content)
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(path))
    with pytest.raises(ConfigError, match=message) as exc:
        run(lambda s: s.check(mode="read"), store(fake_gcs, anonymous=False))
    assert str(path) in str(exc.value)
    assert fake_gcs.requests == []  # refused before anything is sent
