"""GCSStore against each GCS server (the emulator over http, fake-gcs-server over https): listing,
metadata, ranged and pinned reads, checksums; paging and TLS where the server has them."""

from __future__ import annotations

import asyncio
import base64
import hashlib
from datetime import datetime

import pytest

from mcsync import checksums
from mcsync.errors import ConfigError, IntegrityError, NotFound, PreconditionFailed
from mcsync.stores.base import ReadStore, Store
from mcsync.stores.gcs import GCSStore
from mcsync.types import ByteRange, ObjectInfo
from testbed.gcs import upload

from .helpers import payload, set_wrong_crc32c

KEYS = ["a-b", "a/b", "a", "é/x.bin", "日本/データ.bin", "emoji/\U0001f600.bin",
        "odd/sp ace%20#?+=&.bin", "z"]


async def listed(store: GCSStore) -> list[ObjectInfo]:
    try:
        return [info async for info in store.list()]
    finally:
        await store.aclose()


def test_list_is_byte_ordered_and_carries_gcs_metadata(gcs_env, gcs_bucket):
    objs = {key: payload(100 + i, i) for i, key in enumerate(KEYS)}
    resources = {key: upload(gcs_env, gcs_bucket, "p/" + key, data) for key, data in objs.items()}
    upload(gcs_env, gcs_bucket, "other/outside-the-prefix", b"x")

    infos = asyncio.run(listed(GCSStore(bucket=gcs_bucket, prefix="p/")))

    assert [i.key for i in infos] == sorted(KEYS, key=lambda k: k.encode())
    for info in infos:
        data, res = objs[info.key], resources[info.key]
        assert info.size == len(data)
        assert info.etag == hashlib.md5(data).hexdigest()  # an S3 single-part ETag's form
        assert info.crc32c == checksums.to_base64(checksums.crc32c(data)) == res["crc32c"]
        assert info.version == res["generation"]
        assert info.mtime == datetime.fromisoformat(res["updated"]).timestamp()


def test_ranged_and_whole_reads_are_exact(gcs_env, gcs_bucket):
    data = payload(3 * 1024 * 1024 + 17, 7)
    upload(gcs_env, gcs_bucket, "d/blob", data)

    async def go() -> None:
        store = GCSStore(bucket=gcs_bucket, prefix="d/")
        try:
            (info,) = [i async for i in store.list()]
            assert await store.head("blob") == info
            for start, end in [(0, 1), (0, 1 << 20), (5, 1 << 21), (len(data) - 1, len(data))]:
                got = await store.get("blob", ByteRange(start, end), expect=info)
                assert bytes(got) == data[start:end]
            assert await store.get("blob", expect=info) == data
            assert await store.get("blob") == data
            assert await store.get("blob", ByteRange(3, 3), expect=info) == b""
        finally:
            await store.aclose()

    asyncio.run(go())


def test_read_pinned_to_an_old_generation_fails(gcs_env, gcs_bucket):
    upload(gcs_env, gcs_bucket, "k", b"old" * 1000)

    async def go() -> None:
        store = GCSStore(bucket=gcs_bucket, prefix="")
        try:
            (info,) = [i async for i in store.list()]
            new = upload(gcs_env, gcs_bucket, "k", b"new" * 1000)
            assert new["generation"] != info.version
            with pytest.raises(PreconditionFailed, match="changed since it was listed"):
                await store.get("k", ByteRange(0, 100), expect=info)
            with pytest.raises(PreconditionFailed):
                await store.get("k", expect=info)
            # Unpinned, and pinned to the new generation, the new bytes are read.
            assert await store.get("k") == b"new" * 1000
            fresh = await store.head("k")
            assert await store.get("k", ByteRange(0, 6), expect=fresh) == b"newnew"
        finally:
            await store.aclose()

    asyncio.run(go())


def test_whole_object_read_is_checked_against_crc32c(gcs_env, gcs_bucket):
    data = payload(5000, 3)
    upload(gcs_env, gcs_bucket, "c/ok", data)
    upload(gcs_env, gcs_bucket, "c/bad", data)
    # The emulator lets a PATCH set crc32c: it now lists and sends a CRC its bytes do not have.
    wrong = checksums.to_base64(checksums.crc32c(data) ^ 1)
    set_wrong_crc32c(gcs_env, gcs_bucket, "c/bad", wrong)

    async def go() -> None:
        store = GCSStore(bucket=gcs_bucket, prefix="c/")
        try:
            infos = {i.key: i async for i in store.list()}
            assert infos["bad"].crc32c == wrong
            assert await store.get("ok", expect=infos["ok"]) == data
            with pytest.raises(IntegrityError, match="CRC32C mismatch"):
                await store.get("bad", expect=infos["bad"])
            with pytest.raises(IntegrityError):  # unpinned: checked against x-goog-hash
                await store.get("bad")
            # The whole object as one range is checked too; a part cannot be.
            with pytest.raises(IntegrityError):
                await store.get("bad", ByteRange(0, len(data)), expect=infos["bad"])
            assert await store.get("bad", ByteRange(0, 10), expect=infos["bad"]) == data[:10]
        finally:
            await store.aclose()

    asyncio.run(go())


def test_missing_object_bucket_and_writes(gcs_env, gcs_bucket):
    async def go() -> None:
        store = GCSStore(bucket=gcs_bucket, prefix="")
        missing = GCSStore(bucket="no-such-bucket-" + gcs_bucket, prefix="x/")
        try:
            await store.check(mode="read")  # an empty bucket is a fine source
            with pytest.raises(NotFound):
                await store.head("nope")
            with pytest.raises(NotFound):
                await store.get("nope")
            with pytest.raises(ConfigError, match="does not exist"):
                await missing.check(mode="read")
            # a source only: every method of the read side, none of the write side (the
            # engine refuses it as a target before asking anything of it)
            assert isinstance(store, ReadStore) and not isinstance(store, Store)
        finally:
            await store.aclose()
            await missing.aclose()

    asyncio.run(go())


def test_md5_hex_is_what_s3_calls_the_etag(gcs_env, gcs_bucket):
    res = upload(gcs_env, gcs_bucket, "e", b"hello")
    assert base64.b64decode(res["md5Hash"]).hex() == hashlib.md5(b"hello").hexdigest()
    (info,) = asyncio.run(listed(GCSStore(bucket=gcs_bucket, prefix="")))
    assert info.etag == "5d41402abc4b2a76b9719d911017c592"
