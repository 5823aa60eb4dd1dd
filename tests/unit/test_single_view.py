"""The one-object view (``stores/single.py``): a store seen as holding one object under the
target's name; a run through it copies that object, once, and a re-run does nothing."""

from __future__ import annotations

import asyncio

from mcsync import async_sync
from mcsync.config import SyncOptions
from mcsync.stores.base import RangeStreamer, ServerSideCopier, Store
from mcsync.stores.memory import MemoryStore
from mcsync.stores.single import one_object
from mcsync.types import ByteRange


async def listed(store) -> list[str]:
    return [info.key async for info in store.list()]


def test_the_view_lists_one_object_under_its_shown_name_and_reads_the_real_one():
    async def go() -> None:
        inner = MemoryStore()
        await inner.put("model.bin", b"weights")
        await inner.put("other.bin", b"other")
        view = one_object(inner, shown="renamed.bin", real="model.bin", url="mem://x")
        assert view.url == "mem://x"
        assert isinstance(view, Store) and isinstance(view, RangeStreamer)
        assert isinstance(view, ServerSideCopier)
        assert await listed(view) == ["renamed.bin"]
        assert (await view.head("renamed.bin")).key == "renamed.bin"
        assert bytes(await view.get("renamed.bin", ByteRange(1, 4))) == b"eig"
        info = await view.put("renamed.bin", b"new")  # type: ignore[attr-defined]
        assert info.key == "renamed.bin" and bytes(await inner.get("model.bin")) == b"new"

        missing = one_object(inner, shown="gone.bin", real="gone.bin", url="mem://y")
        assert await listed(missing) == []

    asyncio.run(go())


def test_a_run_through_views_copies_the_one_object_and_then_nothing():
    async def go() -> None:
        src, dst = MemoryStore(), MemoryStore()
        await src.put("dir/model.bin", b"w" * 1000)
        await src.put("dir/other.bin", b"o")
        await dst.put("m/sibling.bin", b"s")
        source = one_object(src, shown="m/weights.bin", real="dir/model.bin", url="mem://s")
        target = one_object(dst, shown="m/weights.bin", real="m/weights.bin", url="mem://t")
        options = SyncOptions(use_manifest=False)
        report = await async_sync(source, target, options)
        assert report.ok and report.objects_copied == 1
        assert bytes(await dst.get("m/weights.bin")) == b"w" * 1000
        assert sorted([i.key async for i in dst.list()]) == ["m/sibling.bin", "m/weights.bin"]
        again = await async_sync(source, target, options)
        assert again.objects_copied == 0 and again.objects_skipped == 1

    asyncio.run(go())
