import asyncio
import os

import pytest

from mcsync.errors import UnsafeKey
from mcsync.stores.local import LocalStore


@pytest.mark.parametrize("key", ["../../etc/passwd", "/abs/path", "a/../../b", "a\x00b",
                                 "a//b", "./a", "a/./b", "", "..", "a/.x.mcsync-tmp-1"])
def test_unsafe_keys_refused_and_nothing_written(tmp_path, key):
    root = tmp_path / "root"
    store = LocalStore(root)
    with pytest.raises(UnsafeKey):
        asyncio.run(store.put(key, b"x"))
    written = [os.path.join(d, f) for d, _, fs in os.walk(tmp_path) for f in fs]
    assert written == []


def test_symlinked_directory_inside_root_cannot_escape(tmp_path):
    root = tmp_path / "root"
    outside = tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (root / "link").symlink_to(outside)
    store = LocalStore(root)
    with pytest.raises(UnsafeKey, match="outside"):
        asyncio.run(store.put("link/evil", b"x"))
    assert list(outside.iterdir()) == []


def test_a_directory_is_checked_once_then_remade_when_it_goes(tmp_path, monkeypatch):
    import shutil

    from mcsync.stores import local

    resolved: list[str] = []
    realpath = os.path.realpath

    def counting(path, *args, **kwargs):
        resolved.append(os.fspath(path))
        return realpath(path, *args, **kwargs)

    root = tmp_path / "root"
    store = LocalStore(root)  # made first: the paths counted are those of the writes
    monkeypatch.setattr(local.os.path, "realpath", counting)

    async def put(key: str) -> int:
        """How many paths the write of ``key`` resolved."""
        before = len(resolved)
        await store.put(key, key.encode())
        return len(resolved) - before

    async def run():
        counts = [await put("d/a"), await put("d/b"), await put("d/c")]
        shutil.rmtree(root / "d")  # removed behind the store's back
        counts.append(await put("d/e"))
        await store.delete("d/e")  # empties d, so the delete removes it
        counts.append(await put("d/f"))
        return counts

    a, b, c, e, f = asyncio.run(run())
    assert a > 0 and b == c == 0 and e > 0 and f > 0
    assert set(resolved) <= {str(root), str(root / "d")}
    assert sorted(os.listdir(root / "d")) == ["f"]
    assert (root / "d" / "f").read_bytes() == b"d/f"


def test_a_checked_directory_does_not_let_a_file_replace_a_directory(tmp_path):
    root = tmp_path / "root"
    store = LocalStore(root)
    asyncio.run(store.put("d/a", b"a"))
    (root / "d" / "sub").mkdir()
    with pytest.raises(UnsafeKey, match="cannot also be a file"):
        asyncio.run(store.put("d/sub", b"x"))
    assert sorted(os.listdir(root / "d")) == ["a", "sub"]  # no hidden file left


def test_listing_is_in_s3_key_order_and_hides_temp_files(tmp_path):
    for rel in ["a/b", "a-b", "a.c", "b", "é/x", "a/c/d"]:
        p = tmp_path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(rel.encode())
    (tmp_path / ".x.mcsync-tmp-abc").write_bytes(b"partial")

    async def keys():
        return [i.key async for i in LocalStore(tmp_path).list()]

    got = asyncio.run(keys())
    assert got == sorted(["a/b", "a-b", "a.c", "b", "é/x", "a/c/d"])


def test_read_pinned_to_listed_version_fails_when_file_changed(tmp_path):
    from mcsync.errors import PreconditionFailed

    (tmp_path / "f").write_bytes(b"v1")
    store = LocalStore(tmp_path)

    async def go():
        (info,) = [i async for i in store.list()]
        assert await store.get("f", expect=info) == b"v1"
        (tmp_path / "f").write_bytes(b"v2-longer")
        with pytest.raises(PreconditionFailed):
            await store.get("f", expect=info)

    asyncio.run(go())
