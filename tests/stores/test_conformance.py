"""One conformance suite for every store: what ``mcsync.stores.base`` promises, checked against
each backend of ``conftest.py`` (local files, S3 on moto and on SeaweedFS, the GCS emulator, the
in-memory store).

Each backend declares the abilities its store offers (``Backend.abilities``). A case of an
ability runs where it is declared and *fails* where a declared ability is missing — checked by
``isinstance`` against the protocols, as the engine decides — and is skipped only where the
backend declares the store does not have it (a store offering one it does not declare fails
too), so a store that lost an ability turns cases red, never into green skips.
Every write is read back and compared byte for byte. Parts are laid out from ``caps``: the
smallest legal part (5 MiB on S3) is what the multipart cases send.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import random
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mcsync.errors import ConfigError, ListingOrderError, NotFound, PreconditionFailed, UnsafeKey
from mcsync.hashing import chunk_digests
from mcsync.stores.base import (
    Composer,
    FileTarget,
    FileUpload,
    LevelLister,
    LocalTree,
    PartCopyUpload,
    RangeStreamer,
    ReadsInto,
    ReadStore,
    ScratchSpace,
    ServerSideCopier,
    Store,
    TempFileSweeper,
)
from mcsync.stores.local import LocalStore
from mcsync.types import (
    Buffer,
    ByteRange,
    Capabilities,
    KiB,
    Level,
    ObjectInfo,
    PartClaim,
    PartRef,
    StoreFacts,
)

from .conftest import ABILITIES, Backend, declared

# Keys whose byte order differs from other plausible orders: a directory walk ("a/b" before
# "a-b"), UTF-16 ("\U0001f600" before "\uff5e"), case-folding ("Z" before "a"), a key that is a
# prefix of others ("pre"), and characters that URLs and paths treat specially.
LISTING_KEYS = [
    "a-b", "a/b", "a.b", "a0", "a/c/d", "Z", "z", "~",
    "pre", "prefix", "prefixed", "d/x", "d/xy", "d/x-y",
    "é", "日本/データ.bin", "\uff5e", "\U0001f600", "emoji/\U0001f600.bin",
    "sp ace", "plus+sign", "pct%20", "%", "100%/x", "q?&=#",
]


def payload(size: int, seed: int = 0) -> bytes:
    """Deterministic bytes, so a failure repeats."""
    return random.Random(seed).randbytes(size)


def need(store: Any, *abilities: type) -> None:
    """Run on only where ``store``'s backend declares ``abilities``; fail where the store does
    not offer what its backend declares, or offers what it does not."""
    for ability in abilities:
        offered = isinstance(store, ability)
        if ability in declared(store):
            assert offered, f"{type(store).__name__} lost {ability.__name__}, which it declares"
        else:
            assert not offered, (f"{type(store).__name__} offers {ability.__name__} but does "
                                 "not declare it")
            pytest.skip(f"{type(store).__name__} is not a {ability.__name__}")


async def listed(store: ReadStore) -> list[ObjectInfo]:
    """A whole listing, as the engine takes one: a store that finds it lists out of order
    raises ListingOrderError with a fallback, and the pass starts again once."""
    for attempt in (1, 2):
        try:
            return [info async for info in store.list()]
        except ListingOrderError as exc:
            if attempt == 2 or exc.fallback is None:
                raise
            exc.fallback()
    raise AssertionError("unreachable")


async def keys(store: ReadStore) -> list[str]:
    return [info.key for info in await listed(store)]


async def only_object(backend: Backend, store: Any, key: str, data: bytes) -> ObjectInfo:
    """``data`` seeded as ``key``, the store's one object; its entry in the listing."""
    await backend.seed(store, key, data)
    (info,) = await listed(store)
    return info


async def drain(pieces: Iterator[Buffer]) -> bytes:
    """A streamed range's pieces joined, read in a worker thread as the engine reads them."""
    return await asyncio.to_thread(lambda: b"".join(bytes(p) for p in pieces))


def claim(ref: PartRef, offset: int, data: bytes) -> PartClaim:
    """What the journal records for a part: its ref and the xxh3-128 of its bytes."""
    rng = ByteRange(offset, offset + len(data))
    return PartClaim(ref, offset, b"".join(chunk_digests(data, offset, [rng])))


def multipart_etag(parts: list[bytes]) -> str:
    digests = b"".join(hashlib.md5(p).digest() for p in parts)
    return f"{hashlib.md5(digests).hexdigest()}-{len(parts)}"


async def upload_parts(store: Store, key: str, parts: list[bytes], order: list[int]) -> Any:
    """An open upload of ``parts`` (1-based part i at its offset), those in ``order`` written
    in that order."""
    offsets = [sum(len(p) for p in parts[:i]) for i in range(len(parts))]
    upload = await store.open_upload(key, sum(len(p) for p in parts))
    refs = {}
    for number in order:
        refs[number] = await upload.put_part(number, offsets[number - 1], parts[number - 1])
        assert refs[number].number == number and refs[number].size == len(parts[number - 1])
    return upload, [refs[n] for n in sorted(refs)]


async def small_upload(store: Store, key: str, data: bytes) -> tuple[Any, PartRef]:
    """An open upload holding one part (the last part may be of any size)."""
    upload = await store.open_upload(key, len(data))
    return upload, await upload.put_part(1, 0, data)


# -- the contract itself -------------------------------------------------------------------------


async def test_the_store_offers_exactly_what_it_declares(store: Any) -> None:
    assert isinstance(store, ReadStore)
    offered = {a.__name__ for a in ABILITIES if isinstance(store, a)}
    assert offered == {a.__name__ for a in declared(store)}
    assert isinstance(store.facts, StoreFacts)
    if isinstance(store, Store):
        assert isinstance(store.caps, Capabilities)
    # and from construction: a check (which opens clients, probes the root) changes nothing
    await store.check(mode="read")
    assert {a.__name__ for a in ABILITIES if isinstance(store, a)} == offered


# -- the read side: every store -------------------------------------------------------------------


async def test_listing_is_in_utf8_byte_order(backend: Backend) -> None:
    store = backend.new_root("r")
    siblings = [backend.new_root("r-x"), backend.new_root("rx")]
    objects = {key: payload(10 + i, i) for i, key in enumerate(LISTING_KEYS)}
    for key, data in objects.items():
        await backend.seed(store, key, data)
    for sibling in siblings:  # roots whose names begin with this one's: not under it
        await backend.seed(sibling, "outside", b"x")

    infos = await listed(store)

    assert [i.key for i in infos] == sorted(LISTING_KEYS, key=str.encode)
    for info in infos:
        assert info.size == len(objects[info.key])
        head = await store.head(info.key)
        assert (head.key, head.size, head.etag) == (info.key, info.size, info.etag)
        assert await store.get(info.key, expect=info) == objects[info.key]


async def test_a_level_is_its_files_and_subdirectories(backend: Backend) -> None:
    """One level at a time (--latest-checkpoint): the files directly there as the listing
    shows them, each subdirectory once, in byte order; nothing of a sibling root's."""
    store = backend.new_root("lv")
    need(store, LevelLister)
    sibling = backend.new_root("lv-x")
    for key in ("a-b", "a/x", "a/y/z", "a/y/zz", "b", "c.d/e"):
        await backend.seed(store, key, key.encode())
    await backend.seed(sibling, "outside", b"x")
    listed_at = {i.key: i for i in await listed(store)}

    top = await store.list_level("")
    assert ([f.key for f in top.files], top.dirs) == (["a-b", "b"], ("a/", "c.d/"))
    assert all(f == listed_at[f.key] for f in top.files)  # size, ETag and mtime as listed
    a = await store.list_level("a/")
    assert ([f.key for f in a.files], a.dirs) == (["a/x"], ("a/y/",))
    assert (await store.list_level("a/y/")).files == (listed_at["a/y/z"], listed_at["a/y/zz"])
    assert await store.list_level("missing/") == Level((), ())


async def test_empty_roots_list_nothing(backend: Backend, store: Any) -> None:
    assert await listed(store) == []
    top = backend.top_root()  # a fresh bucket's (or directory's) top: the empty prefix
    assert await listed(top) == []
    await backend.seed(top, "a/b", b"ab")
    await backend.seed(top, "a-b", b"a-b")
    assert await keys(top) == ["a-b", "a/b"]
    assert await top.get("a/b") == b"ab"


async def test_a_missing_key_is_not_found(backend: Backend, store: Any) -> None:
    await backend.seed(store, "present", b"data")
    await backend.seed(store, "dir/x", b"x")
    for missing in ("absent", "presen", "present/child", "dir", "dir/absent", "di"):
        with pytest.raises(NotFound):
            await store.head(missing)
        with pytest.raises(NotFound):
            await store.get(missing)
        with pytest.raises(NotFound):
            await store.get(missing, ByteRange(0, 2))
        if isinstance(store, RangeStreamer):
            with pytest.raises(NotFound):
                await store.open_range(missing, ByteRange(0, 2))
        if isinstance(store, ReadsInto):
            with pytest.raises(NotFound):
                await store.read_into(missing, ByteRange(0, 2), bytearray(2))


async def test_a_pinned_read_of_a_changed_object_is_refused(backend: Backend, store: Any) -> None:
    old, new = payload(1000, 1), payload(1500, 2)  # sizes differ: files are pinned by size too
    await backend.seed(store, "k", old)
    (info,) = await listed(store)
    assert await store.get("k", expect=info) == old
    assert bytes(await store.get("k", ByteRange(10, 20), expect=info)) == old[10:20]

    await backend.seed(store, "k", new)
    with pytest.raises(PreconditionFailed):
        await store.get("k", expect=info)
    with pytest.raises(PreconditionFailed):
        await store.get("k", ByteRange(10, 20), expect=info)
    if isinstance(store, RangeStreamer):
        with pytest.raises(PreconditionFailed):
            await store.open_range("k", ByteRange(0, 100), expect=info)
    if isinstance(store, ReadsInto):
        with pytest.raises(PreconditionFailed):
            await store.read_into("k", ByteRange(0, 100), bytearray(100), expect=info)

    (fresh,) = await listed(store)
    assert await store.get("k", expect=fresh) == new
    assert await store.get("k") == new


async def test_ranges_are_exact(backend: Backend, store: Any) -> None:
    n = 200 * KiB + 3
    data = payload(n, 3)
    info = await only_object(backend, store, "blob", data)
    ranges = [(0, 1), (0, n), (1, n - 1), (n - 1, n), (n - 10, n), (12345, 54321),
              (64 * KiB, 128 * KiB), (64 * KiB - 1, 64 * KiB + 1)]
    for start, end in ranges:
        assert bytes(await store.get("blob", ByteRange(start, end), expect=info)) == \
            data[start:end], (start, end)
        assert bytes(await store.get("blob", ByteRange(start, end))) == data[start:end]
    assert await store.get("blob", expect=info) == data


async def test_a_zero_length_object(backend: Backend, store: Any) -> None:
    await backend.seed(store, "empty", b"")
    await backend.seed(store, "empty-not", b"x")
    infos = await listed(store)
    assert [(i.key, i.size) for i in infos] == [("empty", 0), ("empty-not", 1)]
    assert (await store.head("empty")).size == 0
    assert await store.get("empty") == b""
    assert await store.get("empty", expect=infos[0]) == b""


async def test_open_range_pieces_make_the_range(backend: Backend, store: Any) -> None:
    need(store, RangeStreamer)
    n = 300 * KiB + 7
    data = payload(n, 4)
    info = await only_object(backend, store, "blob", data)
    for start, end in [(0, n), (1, 200 * KiB), (n - 1, n), (64 * KiB, 128 * KiB)]:
        pieces = await store.open_range("blob", ByteRange(start, end), expect=info)
        assert await drain(pieces) == data[start:end], (start, end)
        assert await drain(await store.open_range("blob", ByteRange(start, end))) == \
            data[start:end]


async def test_read_into_fills_the_start_of_the_buffer(backend: Backend, store: Any) -> None:
    need(store, ReadsInto)
    n = 300 * KiB + 7
    data = payload(n, 7)
    info = await only_object(backend, store, "blob", data)
    for start, end in [(0, n), (1, 200 * KiB), (n - 1, n), (64 * KiB, 128 * KiB + 5)]:
        buf = bytearray(b"\xff" * (end - start + 100))  # larger than the range, not zeroed
        view = await store.read_into("blob", ByteRange(start, end), buf, expect=info)
        assert bytes(view) == data[start:end], (start, end)
        assert buf[:end - start] == data[start:end] and buf[end - start:] == b"\xff" * 100


# -- the write side: Stores ---------------------------------------------------------------------


async def test_put_then_read_back(store: Any) -> None:
    need(store, Store)
    first, second = payload(5000, 5), payload(3000, 6)
    info = await store.put("d/k", first)
    assert (info.key, info.size) == ("d/k", len(first))
    assert (await store.head("d/k")).size == len(first)
    assert await store.get("d/k") == first
    await store.put("d/k", second)  # replaced, whole
    assert await store.get("d/k") == second
    assert [(i.key, i.size) for i in await listed(store)] == [("d/k", len(second))]
    if info.etag is not None:
        assert info.etag == hashlib.md5(first).hexdigest()
        assert (await store.head("d/k")).etag == hashlib.md5(second).hexdigest()


async def test_accepted_keys_are_written_and_read_back(backend: Backend, store: Any) -> None:
    need(store, Store)
    accepted = list(dict.fromkeys(backend.accepted_keys(store) + LISTING_KEYS))
    objects = {key: payload(20 + i, i) for i, key in enumerate(accepted)}
    for key, data in objects.items():
        store.validate_key(key)
        await store.put(key, data)
    assert await keys(store) == sorted(accepted, key=str.encode)
    for key, data in objects.items():
        assert await store.get(key) == data, key
        assert (await store.head(key)).size == len(data)


async def test_path_like_keys_are_kept_as_they_are(backend: Backend, store: Any) -> None:
    need(store, Store)
    odd = backend.path_like_keys(store)
    if not odd:
        pytest.skip(f"{type(store).__name__} holds no key a path cannot")
    for i, key in enumerate(odd):
        store.validate_key(key)
        await store.put(key, payload(30 + i, i))
    assert await keys(store) == sorted(odd, key=str.encode)
    for i, key in enumerate(odd):
        assert await store.get(key) == payload(30 + i, i), key


async def test_validate_key_refuses_what_the_store_cannot_hold(backend: Backend,
                                                               store: Any) -> None:
    need(store, Store)
    for key in backend.refused_keys(store):
        with pytest.raises(UnsafeKey):
            store.validate_key(key)


async def test_parts_of_the_minimum_size_out_of_order(store: Any) -> None:
    need(store, Store)
    p = store.caps.min_part_size
    parts = [payload(p, 11), payload(p, 12), payload(p // 2 + 1, 13)]
    upload, refs = await upload_parts(store, "big", parts, order=[3, 1, 2])
    info = await upload.complete([refs[1], refs[2], refs[0]])
    whole = b"".join(parts)
    assert (info.key, info.size) == ("big", len(whole))
    assert await store.get("big") == whole
    head = await store.head("big")
    assert head.size == len(whole)
    if info.etag is not None:  # S3's: the MD5 of the parts' MD5s, and how many parts
        assert info.etag == head.etag == multipart_etag(parts)


async def test_an_object_just_above_one_part(store: Any) -> None:
    need(store, Store)
    p = max(store.caps.min_part_size, 256 * KiB)
    parts = [payload(p, 14), payload(1, 15)]
    upload, refs = await upload_parts(store, "k", parts, order=[2, 1])
    await upload.complete(refs)
    assert await store.get("k") == b"".join(parts)
    assert [(i.key, i.size) for i in await listed(store)] == [("k", p + 1)]


async def test_an_upload_is_invisible_until_completed(store: Any) -> None:
    need(store, Store)
    data = payload(1000, 16)
    await store.put("other", b"o")
    upload, ref = await small_upload(store, "k", data)
    assert await keys(store) == ["other"]
    with pytest.raises(NotFound):
        await store.head("k")
    with pytest.raises(NotFound):
        await store.get("k")
    await upload.complete([ref])
    assert await keys(store) == ["k", "other"]
    assert await store.get("k") == data


async def test_resuming_an_open_upload(backend: Backend, store: Any) -> None:
    need(store, Store)
    p = store.caps.min_part_size
    parts = [payload(p, 17), payload(777, 18)]
    upload, (ref1,) = await upload_parts(store, "k", parts, order=[1])
    size = p + len(parts[1])
    assert await store.resume_upload("k", upload.upload_id, size) is not None  # same object
    later = backend.reopen(store)  # what the next run opens
    resumed = await later.resume_upload("k", upload.upload_id, size)
    assert resumed is not None and resumed.upload_id == upload.upload_id
    assert await resumed.confirm_parts([claim(ref1, 0, parts[0])]) == {1}
    ref2 = await resumed.put_part(2, p, parts[1])
    assert await keys(later) == []
    await resumed.complete([ref1, ref2])
    assert await later.get("k") == b"".join(parts)
    assert await store.get("k") == b"".join(parts)


async def test_resuming_a_finished_upload_finds_nothing(store: Any) -> None:
    need(store, Store)
    done, ref = await small_upload(store, "done", b"done")
    await done.complete([ref])
    aborted, _ = await small_upload(store, "aborted", b"aborted")
    await aborted.abort()
    by_id, _ = await small_upload(store, "by-id", b"by-id")
    await store.abort_upload("by-id", by_id.upload_id)
    for key, upload in [("done", done), ("aborted", aborted), ("by-id", by_id)]:
        assert await store.resume_upload(key, upload.upload_id, len(key)) is None, key
    assert await keys(store) == ["done"]
    assert await store.get("done") == b"done"


async def test_confirm_parts_refuses_wrong_claims(store: Any) -> None:
    need(store, Store)
    one, two = payload(1000, 19), payload(500, 20)
    upload = await store.open_upload("k", 2000)
    ref1 = await upload.put_part(1, 0, one)
    ref2 = await upload.put_part(2, 1000, two)
    good1, good2 = claim(ref1, 0, one), claim(ref2, 1000, two)
    assert await upload.confirm_parts([good1, good2]) == {1, 2}
    assert await upload.confirm_parts([]) == set()

    wrong = {
        "size short": PartClaim(PartRef(1, ref1.etag, 999), 0, good1.digest),
        "size long": PartClaim(PartRef(1, ref1.etag, 1001), 0, good1.digest),
        "never written": claim(PartRef(3, ref1.etag, 500), 1500, payload(500, 21)),
    }
    if ref1.etag:  # a store that names parts by ETag must check it
        wrong["etag"] = PartClaim(PartRef(1, "0" * 32, 1000), 0, good1.digest)
    if isinstance(upload, FileUpload):  # files: the bytes are re-read and hashed
        wrong["digest"] = PartClaim(ref1, 0, bytes(16))
        wrong["other bytes"] = claim(ref1, 0, payload(1000, 22))
    for what, bad in wrong.items():
        assert await upload.confirm_parts([bad, good2]) == {2}, what
    await upload.abort()


async def test_completing_twice_raises_not_found(store: Any) -> None:
    need(store, Store)
    first = payload(1000, 23)
    upload, ref = await small_upload(store, "k", first)
    info = await upload.complete([ref])
    with pytest.raises(NotFound):
        await upload.complete([ref])
    assert await store.get("k") == first
    assert (await store.head("k")).etag == info.etag


async def test_completing_from_a_second_handle_raises_not_found(store: Any) -> None:
    need(store, Store)
    first = payload(1000, 24)
    upload, ref = await small_upload(store, "k", first)
    second = await store.resume_upload("k", upload.upload_id, len(first))
    assert second is not None
    info = await upload.complete([ref])
    try:
        again = await second.complete([ref])
    except NotFound:
        again = None
    assert await store.get("k") == first  # whatever the answer, the object is the first one
    assert (await store.head("k")).etag == info.etag
    assert again is None, f"the second completion succeeded: {again}"


async def test_completing_an_aborted_upload_raises_not_found(store: Any) -> None:
    need(store, Store)
    upload, ref = await small_upload(store, "k", b"data")
    await upload.abort()
    await upload.abort()  # again: fine
    with pytest.raises(NotFound):
        await upload.complete([ref])
    with pytest.raises(NotFound):
        await store.head("k")


async def test_completing_an_upload_aborted_by_id_raises_not_found(store: Any) -> None:
    need(store, Store)
    upload, ref = await small_upload(store, "k", b"data")
    await store.abort_upload("k", upload.upload_id)
    await store.abort_upload("k", upload.upload_id)  # gone is fine
    with pytest.raises(NotFound):
        await upload.complete([ref])
    with pytest.raises(NotFound):
        await store.head("k")


async def test_aborting_a_finished_upload_keeps_the_object(store: Any) -> None:
    need(store, Store)
    data = payload(1000, 25)
    upload, ref = await small_upload(store, "k", data)
    await upload.complete([ref])
    await upload.abort()
    await store.abort_upload("k", upload.upload_id)
    assert await store.get("k") == data
    assert await keys(store) == ["k"]


async def test_delete(store: Any) -> None:
    need(store, Store)
    await store.delete("never-there")
    await store.delete("no/such/dir/key")
    await store.put("d/e/f", b"f")
    await store.put("g", b"g")
    await store.delete("d/e/f")
    await store.delete("d/e/f")  # again: fine
    with pytest.raises(NotFound):
        await store.head("d/e/f")
    assert await keys(store) == ["g"]
    assert await store.get("g") == b"g"


# -- check ----------------------------------------------------------------------------------------


async def test_check_an_existing_root(store: Any) -> None:
    await store.check(mode="read")
    if isinstance(store, Store):
        await store.check(mode="plan")
        await store.check(mode="write")
        assert await listed(store) == []  # a write probe leaves nothing behind


async def test_check_a_missing_root(backend: Backend) -> None:
    missing = backend.missing_root()
    with pytest.raises(ConfigError):
        await missing.check(mode="read")
    if not isinstance(missing, Store):
        return
    # a dry run's target may not exist yet (a directory) or must (a bucket)...
    with contextlib.suppress(ConfigError):
        await missing.check(mode="plan")
    with pytest.raises(ConfigError):  # ...and nothing was created
        await backend.reopen(missing).check(mode="read")
    try:  # a target is created if it can be (a directory), else refused (a bucket)
        await missing.check(mode="write")
    except ConfigError:
        with pytest.raises(ConfigError):
            await backend.reopen(missing).check(mode="read")
    else:
        await backend.reopen(missing).check(mode="read")
        assert await listed(missing) == []


# -- abilities ------------------------------------------------------------------------------------


async def test_clear_removes_only_what_is_under_the_prefix(backend: Backend) -> None:
    store = backend.new_root("r")
    need(store, ScratchSpace)
    sibling = backend.new_root("r-x")
    for key in ("s/a", "s/b/c", "s-x", "keep/s/a", "t"):
        await store.put(key, key.encode())
    await sibling.put("s/a", b"sibling")
    doomed, _ = await small_upload(store, "s/u", b"u")
    kept, _ = await small_upload(store, "keep/u", b"kept")

    await store.clear("s/")

    assert await keys(store) == ["keep/s/a", "s-x", "t"]
    assert await store.resume_upload("s/u", doomed.upload_id, 1) is None
    assert await store.resume_upload("keep/u", kept.upload_id, 4) is not None
    await store.clear("")  # the whole root, and nothing outside it
    assert await keys(store) == []
    assert await store.resume_upload("keep/u", kept.upload_id, 4) is None
    assert await sibling.get("s/a") == b"sibling"


async def test_copy_object_and_parts_server_side(backend: Backend, tmp_path: Path) -> None:
    src, dst = backend.new_root("src"), backend.new_root("dst")
    need(dst, ServerSideCopier)
    await src.check(mode="read")
    await dst.check(mode="write")
    assert dst.can_copy_from(src)
    assert not dst.can_copy_from(LocalStore(tmp_path))  # not on this endpoint
    p = dst.caps.min_part_size
    data = payload(p + 100, 26)
    await src.put("big", data)
    info = await src.head("big")

    copied = await dst.copy_object(src.copy_source("big", info.etag), "whole")
    assert copied.key == "whole"
    assert await dst.get("whole") == data
    await dst.copy_object(src.copy_source("big", None), "unpinned")
    assert await dst.get("unpinned") == data

    upload = await dst.open_upload("parts", len(data))
    assert isinstance(upload, PartCopyUpload)
    source = src.copy_source("big", info.etag)
    ref2 = await upload.copy_part(2, p, source, ByteRange(p, p + 100))
    ref1 = await upload.copy_part(1, 0, source, ByteRange(0, p))
    assert (ref1.size, ref2.size) == (p, 100)
    await upload.complete([ref1, ref2])
    assert await dst.get("parts") == data
    assert await keys(dst) == ["parts", "unpinned", "whole"]
    assert await keys(src) == ["big"]


async def test_copy_object_from_a_changed_source_is_refused(backend: Backend) -> None:
    src, dst = backend.new_root("src"), backend.new_root("dst")
    need(dst, ServerSideCopier)
    await backend.seed(src, "k", b"old")
    info = await src.head("k")
    await backend.seed(src, "k", b"newer")
    with pytest.raises(PreconditionFailed):
        await dst.copy_object(src.copy_source("k", info.etag), "k")
    with pytest.raises(NotFound):
        await dst.head("k")


async def part_copy_sources(backend: Backend, store: Any, seed: int) -> list[Any]:
    """Every kind of part-copy source the store takes, of a new object "k"."""
    need(store, Store)
    if not isinstance(store, (Composer, ServerSideCopier)):
        pytest.skip(f"{type(store).__name__} is neither a Composer nor a ServerSideCopier")
    await backend.seed(store, "k", payload(1000, seed))
    current = await store.head("k")
    sources = []
    if isinstance(store, Composer):
        sources.append(store.compose_source(current))
    if isinstance(store, ServerSideCopier):
        sources.append(store.copy_source("k", current.etag))
    return sources


async def copy_part_is_refused(store: Any, sources: list[Any]) -> None:
    for source in sources:
        upload = await store.open_upload("new", 100)
        assert isinstance(upload, PartCopyUpload)
        with pytest.raises(PreconditionFailed):
            await upload.copy_part(1, 0, source, ByteRange(0, 100))
        await upload.abort()


async def test_copy_part_from_a_changed_source_is_refused(backend: Backend, store: Any) -> None:
    sources = await part_copy_sources(backend, store, 27)
    await backend.seed(store, "k", payload(1200, 28))  # a new version, of another size
    await copy_part_is_refused(store, sources)
    assert await keys(store) == ["k"]


async def test_copy_part_from_a_source_gone_since_is_refused(backend: Backend,
                                                             store: Any) -> None:
    """A gone source is a failed precondition of the copy too (the caller plans without it),
    not a missing object being written."""
    sources = await part_copy_sources(backend, store, 30)
    await store.delete("k")
    await copy_part_is_refused(store, sources)
    assert await keys(store) == []


async def test_compose_a_new_version_from_the_current_one(store: Any) -> None:
    need(store, Composer)
    p = max(store.caps.min_part_size, 256 * KiB)
    old = payload(p + 2000, 29)
    await store.put("k", old)
    current = await store.head("k")
    fresh = payload(p, 30)
    new = old[:p] + fresh + old[7:7 + 1234]  # part 3 copies an unaligned range

    upload = await store.open_upload("k", len(new))
    assert isinstance(upload, PartCopyUpload)
    source = store.compose_source(current)
    ref3 = await upload.copy_part(3, 2 * p, source, ByteRange(7, 7 + 1234))
    ref1 = await upload.copy_part(1, 0, source, ByteRange(0, p))
    ref2 = await upload.put_part(2, p, fresh)
    assert await store.get("k") == old  # the current version, until the new one completes
    await upload.complete([ref1, ref2, ref3])
    assert await store.get("k") == new
    assert [(i.key, i.size) for i in await listed(store)] == [("k", len(new))]


async def test_a_file_upload_takes_its_parts_piece_by_piece(store: Any) -> None:
    need(store, FileTarget)
    data = payload(3 * KiB + 5, 31)
    upload = await store.open_file("f/x", len(data), mtime=1_000_000.0)
    assert isinstance(upload, FileUpload)
    # part 2 in two pieces, from two threads at once; part 1 whole
    await asyncio.gather(asyncio.to_thread(upload.write_at, 2 * KiB, data[2 * KiB:2500]),
                         asyncio.to_thread(upload.write_at, 2500, data[2500:]),
                         asyncio.to_thread(upload.write_at, 0, data[:2 * KiB]))
    refs = [upload.part_written(1, 2 * KiB), upload.part_written(2, len(data) - 2 * KiB)]
    assert [(r.number, r.size) for r in refs] == [(1, 2 * KiB), (2, len(data) - 2 * KiB)]
    assert await keys(store) == []  # nothing visible before complete
    await upload.complete(refs)
    assert await store.get("f/x") == data
    with pytest.raises(OSError):  # a late writer never reaches the published file
        await asyncio.to_thread(upload.write_at, 0, b"late")
    assert await store.get("f/x") == data


async def test_a_resumed_file_upload_is_a_file_upload(store: Any) -> None:
    need(store, FileTarget)
    data = payload(2 * KiB, 32)
    first = await store.open_file("f/y", len(data))
    await asyncio.to_thread(first.write_at, 0, data[:KiB])
    ref1 = first.part_written(1, KiB)

    again = await store.resume_upload("f/y", first.upload_id, len(data))
    assert isinstance(again, FileUpload)
    assert await again.confirm_parts([claim(ref1, 0, data[:KiB])]) == {1}
    await asyncio.to_thread(again.write_at, KiB, data[KiB:])
    await again.complete([ref1, again.part_written(2, KiB)])
    assert await store.get("f/y") == data


async def test_temp_files_a_killed_run_left_are_swept(backend: Backend, store: Any) -> None:
    """Another store object on the same root stands in for a killed run: its open uploads'
    hidden files are leftovers to this one, unless journalled (``keep``) or too recent."""
    need(store, TempFileSweeper)
    killed = backend.reopen(store)
    journalled, journalled_ref = await small_upload(killed, "d/journalled", b"journalled")
    left, _ = await small_upload(killed, "d/left", b"left")
    live, live_ref = await small_upload(store, "d/live", b"live")  # this store's own

    assert await store.sweep_temp_files(older_than=0.0) == []  # all modified since
    swept = await store.sweep_temp_files([journalled.upload_id], older_than=time.time() + 60)
    assert len(swept) == 1

    assert await store.resume_upload("d/left", left.upload_id, 4) is None
    again = await store.resume_upload("d/journalled", journalled.upload_id, 10)
    assert await again.confirm_parts([claim(journalled_ref, 0, b"journalled")]) == {1}
    await again.complete([journalled_ref])
    await live.complete([live_ref])
    assert {k: await store.get(k) for k in await keys(store)} == {
        "d/journalled": b"journalled", "d/live": b"live"}


async def test_a_local_tree_is_its_root_directory(store: Any) -> None:
    need(store, LocalTree)
    await store.put("a/b", b"through the store")
    assert (store.root / "a" / "b").read_bytes() == b"through the store"
    (store.root / "a" / "c").write_bytes(b"beside it")  # what a watcher of the root sees
    assert await keys(store) == ["a/b", "a/c"]
    assert await store.get("a/c") == b"beside it"
