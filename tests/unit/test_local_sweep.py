"""LocalStore.sweep_temp_files: the hidden temporary files a killed run left in a local target
go; nothing else ever does — not a file of the user's, not one outside the root, not one an
upload of this run still writes, not one a journalled upload still needs."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

from mcsync.stores.local import LocalStore
from mcsync.stores.local_files import tmp_name as _tmp_name

HEX12 = "0123456789ab"


def names(root: Path) -> set[str]:
    return {str(Path(d, f).relative_to(root)) for d, _, fs in os.walk(root) for f in fs}


def make(root: Path, rel: str, data: bytes = b"x", *, mtime: float | None = None) -> Path:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    if mtime is not None:
        os.utime(path, (mtime, mtime))
    return path


def test_leftovers_go_and_nothing_else(tmp_path):
    root = tmp_path / "root"
    left = [f"d/.model.bin.mcsync-tmp-{HEX12}", f".top.mcsync-tmp-{HEX12}",
            ".probe.mcsync-tmp-01234567", f".mcsync/.lock-x.json.mcsync-tmp-{HEX12}",
            f"a/b/c/.{'é' * 50}.mcsync-tmp-{HEX12}"]
    users = ["d/model.bin", "d/.hidden", ".mcsync-tmp-0123456789ab",  # no leading name
             f"d/.x.mcsync-tmp-{HEX12}.keep",  # something after the token
             "d/.x.mcsync-tmp-NOTHEXNOTHEX", f"d/x.mcsync-tmp-{HEX12}",  # not hidden
             "d/.x.mcsync-tmp-0123456789", "d/.x.mcsync-tmp-0123456789abc"]  # 10, 13 digits
    for rel in left + users:
        make(root, rel)
    removed = asyncio.run(LocalStore(root).sweep_temp_files())
    assert sorted(removed) == sorted(str(root / rel) for rel in left)
    assert names(root) == set(users)


def test_what_is_kept(tmp_path):
    root = tmp_path / "root"
    journalled = make(root, f"ckpt/.shard.mcsync-tmp-{HEX12}", b"resumable")
    fresh = make(root, f"ckpt/.other.mcsync-tmp-{'f' * 12}", b"another run's, in flight")
    old = make(root, f"ckpt/.old.mcsync-tmp-{'e' * 12}", b"killed", mtime=time.time() - 3600)
    # a symlink named as a temporary file, pointing out of the root, and a directory so named
    outside = make(tmp_path, "outside/precious", b"not ours")
    (root / f".link.mcsync-tmp-{'a' * 12}").symlink_to(outside)
    (root / f".dir.mcsync-tmp-{'b' * 12}").mkdir()
    make(root, f".dir.mcsync-tmp-{'b' * 12}/inner", b"inside a directory so named")
    # a symlinked directory is not walked into
    make(tmp_path, f"elsewhere/.x.mcsync-tmp-{HEX12}", b"outside the root")
    (root / "linked-dir").symlink_to(tmp_path / "elsewhere")

    store = LocalStore(root)
    removed = asyncio.run(store.sweep_temp_files({str(journalled)},
                                                 older_than=time.time() - 60))
    assert removed == [str(old)]
    assert journalled.read_bytes() == b"resumable" and fresh.exists()
    assert outside.read_bytes() == b"not ours"
    assert (tmp_path / "elsewhere" / f".x.mcsync-tmp-{HEX12}").exists()
    assert (root / f".dir.mcsync-tmp-{'b' * 12}" / "inner").exists()


def test_never_what_this_store_is_writing(tmp_path):
    root = tmp_path / "root"
    store = LocalStore(root)

    async def go() -> None:
        await store.check(mode="write")
        upload = await store.open_file("big/file.bin", 10)  # a hidden file, being written
        make(root, f"big/.file.bin.mcsync-tmp-{HEX12}")  # one a killed run left
        removed = await store.sweep_temp_files()
        assert removed == [str(root / f"big/.file.bin.mcsync-tmp-{HEX12}")]
        assert Path(upload.upload_id).exists()
        upload.write_at(0, b"0123456789")
        await upload.complete([])
        assert (root / "big/file.bin").read_bytes() == b"0123456789"
        # once published it is no temporary file; an aborted one is gone already
        aborted = await store.open_file("big/other.bin", 3)
        await aborted.abort()
        assert await store.sweep_temp_files() == []
        # a journalled upload reopened by a resumed run is being written again
        resumed_path = make(root, "big/" + _tmp_name("again.bin"), b"abc")
        resumed = await store.resume_upload("big/again.bin", str(resumed_path), 3)
        assert resumed is not None
        assert await store.sweep_temp_files() == []
        await resumed.complete([])
        assert (root / "big/again.bin").read_bytes() == b"abc"

    asyncio.run(go())
    assert names(root) == {"big/file.bin", "big/again.bin"}


def test_temporary_names_fit_any_file_name(tmp_path):
    """A name of 255 bytes (the most there is) gets a hidden name that fits, cut at a
    character, and still one the sweep recognises."""
    root = tmp_path / "root"
    store = LocalStore(root)
    for name in ("x" * 255, "é" * 127 + "x", "日本" * 42 + "abc", "a"):
        tmp = _tmp_name(name)
        assert len(tmp.encode()) <= 255 and tmp.startswith(".")
        asyncio.run(store.put(f"d/{name}", b"data"))
        assert (root / "d" / name).read_bytes() == b"data"
        make(root, f"d/{tmp}")
    removed = asyncio.run(store.sweep_temp_files())
    assert len(removed) == 4 and names(root) == {f"d/{n}" for n in (
        "x" * 255, "é" * 127 + "x", "日本" * 42 + "abc", "a")}
