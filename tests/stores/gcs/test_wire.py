"""A relay's gs:// parts read over mcsync's own connections (``stores/gcs_wire.py``): on both
GCS servers (fake-gcs-server over https) byte for byte, with keys GCS must receive exactly as
quoted; on the fake, the token, the retries and the generation pin carried by the wire."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from mcsync.errors import PreconditionFailed
from mcsync.retry import RetryPolicy
from mcsync.stores.gcs import GCSStore
from mcsync.types import ByteRange
from testbed.gcs import GCSServer, upload

from .fake import FakeGCS
from .helpers import payload
from .test_fake import _service_account

MiB = 1 << 20
FAST = RetryPolicy(max_attempts=4, init_backoff_s=0.001, max_backoff_s=0.01)
KEYS = ["plain.bin", "a/b c€.safetensors", "odd %2F #hash ?q+plus.bin"]


@pytest.fixture
def media_only_by_the_wire(monkeypatch: pytest.MonkeyPatch) -> None:
    """A media GET through aiohttp fails the test: the bytes must come by the wire."""
    real = GCSStore._request

    async def request(self: GCSStore, url: str, params: Any, *args: Any, **kw: Any) -> Any:
        assert params.get("alt") != "media", "a media GET went through aiohttp"
        return await real(self, url, params, *args, **kw)

    monkeypatch.setattr(GCSStore, "_request", request)


def read_parts(store: GCSStore, part: int) -> dict[str, bytes]:
    """Every object of ``store``, each read ``part`` bytes at a time into one buffer."""
    async def go() -> dict[str, bytes]:
        try:
            got = {}
            buf = bytearray(part)
            async for info in store.list():
                pieces = []
                for at in range(0, info.size, part):
                    rng = ByteRange(at, min(at + part, info.size))
                    pieces.append(bytes(await store.read_into(info.key, rng, buf, expect=info)))
                got[info.key] = b"".join(pieces)
            return got
        finally:
            await store.aclose()

    return asyncio.run(go())


def test_parts_are_read_by_the_wire_byte_for_byte(gcs_env: GCSServer, gcs_bucket: str,
                                                  media_only_by_the_wire: None) -> None:
    data = {key: payload(2 * MiB + 777 * i, seed=i) for i, key in enumerate(KEYS)}
    for key, body in data.items():
        upload(gcs_env, gcs_bucket, f"w/{key}", body)
    store = GCSStore(bucket=gcs_bucket, prefix="w/", retry=FAST)
    assert read_parts(store, MiB) == data


def fake_store(fake: FakeGCS, **kw: Any) -> GCSStore:
    return GCSStore(bucket=fake.bucket, prefix="", api_root=fake.url, retry=FAST, **kw)


def test_the_wire_carries_the_token_and_is_retried_by_the_store(
        fake_gcs: FakeGCS, tmp_path, monkeypatch, media_only_by_the_wire: None) -> None:
    fake_gcs.access_token = "sa-token"
    fake_gcs.put("k", payload(3 * MiB))
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(_service_account(tmp_path, fake_gcs)))
    store = fake_store(fake_gcs, anonymous=False)

    async def go() -> bytes:
        try:
            info = await store.head("k")
            fake_gcs.failures = [503, 500]  # the next two answers
            return bytes(await store.read_into("k", ByteRange(MiB, 3 * MiB),
                                               bytearray(2 * MiB), expect=info))
        finally:
            await store.aclose()

    assert asyncio.run(go()) == payload(3 * MiB)[MiB:]
    media = [r for r in fake_gcs.gcs_requests() if r.query.get("alt") == "media"]
    assert len(media) == 3  # two refused, then the part
    assert all(r.headers["Authorization"] == "Bearer sa-token" for r in media)
    assert all("wire" in r.headers["User-Agent"] for r in media)
    assert media[-1].headers["Range"] == f"bytes={MiB}-{3 * MiB - 1}"
    assert media[-1].query["ifGenerationMatch"] == str(fake_gcs.objects["k"].generation)


def test_a_part_of_a_replaced_object_is_refused_by_the_wire(
        fake_gcs: FakeGCS, media_only_by_the_wire: None) -> None:
    fake_gcs.put("k", b"0123456789")
    store = fake_store(fake_gcs, anonymous=True)

    async def go() -> None:
        try:
            info = await store.head("k")
            fake_gcs.put("k", b"abcdefghij")  # a new generation
            with pytest.raises(PreconditionFailed, match=r"gs://.*k: changed"):
                await store.read_into("k", ByteRange(2, 5), bytearray(8), expect=info)
        finally:
            await store.aclose()

    asyncio.run(go())
