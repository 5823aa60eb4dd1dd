"""What only MemoryStore has: an endpoint shared by stores, an injected clock, chosen caps, S3's
ETags exactly, and the strictness that makes it useful to unit tests. The store protocol itself
is checked by the conformance suite (``test_conformance.py``), MemoryStore among the others."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from mcsync.errors import ConfigError, Permanent, PreconditionFailed, UnsafeKey
from mcsync.stores.base import (
    Composer,
    FileTarget,
    FileUpload,
    PartCopyUpload,
    RangeStreamer,
    ScratchSpace,
    ServerSideCopier,
    Store,
)
from mcsync.stores.local import LocalStore
from mcsync.stores.memory import MemoryEndpoint, MemoryStore
from mcsync.testing.faults import Faults, faulty
from mcsync.types import ByteRange, Capabilities, PartRef

ABILITIES = (Store, RangeStreamer, ServerSideCopier, Composer, ScratchSpace)


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


async def test_abilities_and_address() -> None:
    store = MemoryStore("/run/7/", endpoint=MemoryEndpoint("ckpt"))
    assert store.url == "memory://ckpt/run/7/"
    assert MemoryStore().url == "memory://mem/"
    assert all(isinstance(store, ability) for ability in ABILITIES)
    assert not isinstance(store, FileTarget)
    upload = await store.open_upload("k", 1)
    assert isinstance(upload, PartCopyUpload) and not isinstance(upload, FileUpload)
    wrapped = faulty(store, Faults())  # a wrapper offers exactly the same abilities
    assert all(isinstance(wrapped, ability) for ability in ABILITIES)
    assert not isinstance(wrapped, FileTarget)
    assert store.caps == Capabilities()  # S3's numbers


async def test_etags_are_s3s_and_mtimes_come_from_the_clock() -> None:
    clock = Clock()
    store = MemoryStore(clock=clock)
    info = await store.put("small", b"hello", mtime=5.0)  # S3 keeps no mtime of ours
    assert (info.etag, info.mtime) == (hashlib.md5(b"hello").hexdigest(), 1001.0)
    assert await store.head("small") == info

    small = MemoryStore(clock=clock, caps=Capabilities(min_part_size=4))
    upload = await small.open_upload("multi", 6)
    refs = [await upload.put_part(2, 4, b"ef"), await upload.put_part(1, 0, b"abcd")]
    assert [r.etag for r in refs] == [hashlib.md5(b"ef").hexdigest(),
                                      hashlib.md5(b"abcd").hexdigest()]
    done = await upload.complete(refs)
    tree = hashlib.md5(hashlib.md5(b"abcd").digest() + hashlib.md5(b"ef").digest())
    assert (done.etag, done.mtime, done.size) == (f"{tree.hexdigest()}-2", 1002.0, 6)
    copied = await small.copy_object(small.copy_source("multi", done.etag), "copy")
    assert copied.etag == hashlib.md5(b"abcdef").hexdigest()  # a copy is one whole object
    assert copied.mtime == 1003.0


async def test_part_limits_come_from_caps() -> None:
    caps = Capabilities(min_part_size=4, max_part_size=8, max_parts=3)
    store = MemoryStore(caps=caps)
    upload = await store.open_upload("k", 12)
    for number, data in [(0, b"x"), (4, b"x"), (1, b"x" * 9)]:
        with pytest.raises(Permanent):
            await upload.put_part(number, 0, data)
    short = await upload.put_part(1, 0, b"abc")  # too short, unless it is the last part
    last = await upload.put_part(2, 3, b"def")
    with pytest.raises(Permanent, match="minimum part size"):
        await upload.complete([short, last])
    with pytest.raises(Permanent):
        await upload.complete([PartRef(1, "0" * 32, 3)])  # not the ETag it holds
    with pytest.raises(Permanent):
        await upload.complete([])
    assert await upload.complete([short]) is not None  # a short part alone is the last
    assert await store.get("k") == b"abc"


async def test_stores_of_one_endpoint_share_objects_and_uploads(tmp_path: Path) -> None:
    endpoint = MemoryEndpoint("shared")
    a, b = MemoryStore("a", endpoint=endpoint), MemoryStore("b", endpoint=endpoint)
    other = MemoryStore("a", endpoint=MemoryEndpoint("other"))
    assert a.can_copy_from(b) and b.can_copy_from(a)
    assert not a.can_copy_from(other) and not a.can_copy_from(LocalStore(tmp_path))

    upload = await a.open_upload("k", 3)
    ref = await upload.put_part(1, 0, b"abc")
    again = MemoryStore("a/", endpoint=endpoint)  # the same root, as a later run opens it
    resumed = await again.resume_upload("k", upload.upload_id, 3)
    assert resumed is not None and resumed.upload_id == upload.upload_id
    assert await b.resume_upload("k", upload.upload_id, 3) is None  # another root's key
    assert await a.resume_upload("other-key", upload.upload_id, 3) is None
    await b.abort_upload("k", upload.upload_id)  # not b's: left alone
    await resumed.complete([ref])
    assert await a.get("k") == b"abc"
    assert [i.key async for i in b.list()] == []

    with pytest.raises(Permanent):  # a source on another endpoint cannot be copied
        await other.copy_object(a.copy_source("k", None), "k")
    info = await b.copy_object(a.copy_source("k", None), "copied")
    assert info.key == "copied" and await b.get("copied") == b"abc"
    assert sorted(endpoint.objects) == ["a/k", "b/copied"]


async def test_reads_are_strict() -> None:
    store = MemoryStore()
    await store.put("k", b"0123456789")
    for start, end in [(5, 11), (11, 12), (-1, 2), (6, 5)]:
        with pytest.raises(Permanent):
            await store.get("k", ByteRange(start, end))
        with pytest.raises(Permanent):
            await store.open_range("k", ByteRange(start, end))
    assert await store.get("k", ByteRange(10, 10)) == b""
    assert list(await store.open_range("k", ByteRange(3, 3))) == []
    with pytest.raises(UnsafeKey):  # writes validate their keys
        await store.put("", b"x")
    with pytest.raises(UnsafeKey):
        await store.open_upload("bad\udc80", 1)
    with pytest.raises(PreconditionFailed):
        await (await store.open_upload("gone", 1)).copy_part(
            1, 0, store.copy_source("nothing", None), ByteRange(0, 1))


async def test_pins_follow_the_etag() -> None:
    store = MemoryStore()
    first = await store.put("k", b"one")
    same = await store.put("k", b"one")  # rewritten with the same bytes: the same version
    assert await store.get("k", expect=first) == b"one" and same.etag == first.etag
    await store.put("k", b"two")
    with pytest.raises(PreconditionFailed):
        await store.get("k", expect=first)
    with pytest.raises(PreconditionFailed):
        await store.copy_object(store.compose_source(first), "copy")


async def test_check_of_a_store_that_does_not_exist_yet() -> None:
    store = MemoryStore("p", exists=False)
    with pytest.raises(ConfigError):
        await store.check(mode="read")
    await store.check(mode="plan")
    with pytest.raises(ConfigError):
        await store.check(mode="read")
    await store.check(mode="write")
    await store.check(mode="read")
    with pytest.raises(ValueError):
        MemoryStore(endpoint=MemoryEndpoint(), clock=Clock())
