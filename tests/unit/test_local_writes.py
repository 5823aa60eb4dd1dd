"""How a local store writes a whole file: nameless, then linked into place (``O_TMPFILE``), or
through a hidden file where the filesystem makes no nameless files."""

import asyncio
import errno
import os

import pytest

from mcsync.errors import UnsafeKey
from mcsync.stores import local, local_files
from mcsync.stores.local import LocalStore


def names(root) -> list[str]:
    """Every entry under ``root``, hidden ones included, relative to it."""
    found = []
    for d, dirs, files in os.walk(root):
        found += [os.path.relpath(os.path.join(d, n), root) for n in dirs + files]
    return sorted(found)


def link_calls(monkeypatch) -> list[str]:
    """The names ``link_nameless`` gives, in order (the real function runs)."""
    given: list[str] = []
    real = local_files.link_nameless

    def counting(fd, path):
        given.append(os.path.basename(path))
        return real(fd, path)

    monkeypatch.setattr(local_files, "link_nameless", counting)
    return given


def put_all(store: LocalStore, objects: dict[str, bytes]) -> None:
    """Write ``objects`` one after another through ``store``, in one event loop."""

    async def run() -> None:
        for key, data in objects.items():
            await store.put(key, data)

    asyncio.run(run())


def makes_nameless_files(directory) -> bool:
    fd = local_files.nameless_file(directory)
    if fd is None:
        return False
    os.close(fd)
    return True


def test_a_new_file_is_linked_whole_and_no_hidden_name_is_made(tmp_path, monkeypatch):
    if not makes_nameless_files(tmp_path):
        pytest.skip("this filesystem makes no nameless files (O_TMPFILE)")
    given = link_calls(monkeypatch)
    store = LocalStore(tmp_path / "root")
    info = asyncio.run(store.put("d/new.bin", b"x" * 70_000, mtime=1_000_000_000.0))
    assert given == ["new.bin"]
    assert names(tmp_path / "root") == ["d", "d/new.bin"]
    assert (tmp_path / "root/d/new.bin").read_bytes() == b"x" * 70_000
    assert (info.size, info.mtime) == (70_000, 1_000_000_000.0)
    assert os.stat(tmp_path / "root/d/new.bin").st_mtime == 1_000_000_000.0


def test_an_existing_file_is_replaced_whole(tmp_path, monkeypatch):
    given = link_calls(monkeypatch)
    root = tmp_path / "root"
    (root / "d").mkdir(parents=True)
    (root / "d/f").write_bytes(b"old contents, longer than the new")
    asyncio.run(LocalStore(root).put("d/f", b"new", mtime=2_000_000_000.0))
    assert (root / "d/f").read_bytes() == b"new"
    assert os.stat(root / "d/f").st_mtime == 2_000_000_000.0
    assert names(root) == ["d", "d/f"]  # the hidden name used on the way is gone
    if makes_nameless_files(tmp_path):  # the name was taken, so linked hidden and renamed
        assert given[0] == "f" and len(given) == 2 and given[1].startswith(".f.mcsync-tmp-")


def test_a_symlink_at_the_name_is_refused_and_left_alone(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    (tmp_path / "elsewhere").write_bytes(b"theirs")
    (root / "f").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(UnsafeKey, match="symlink"):
        asyncio.run(LocalStore(root).put("f", b"ours"))
    assert os.readlink(root / "f") == str(tmp_path / "elsewhere")
    assert (tmp_path / "elsewhere").read_bytes() == b"theirs"
    assert names(root) == ["f"]


def test_a_failed_write_leaves_nothing(tmp_path, monkeypatch):
    def disk_full(fd, data, offset):
        os.write(fd, b"half")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(local_files, "pwrite_all", disk_full)
    monkeypatch.setattr(local, "pwrite_all", disk_full)
    root = tmp_path / "root"
    with pytest.raises(OSError, match="No space"):
        asyncio.run(LocalStore(root).put("d/f", b"whole"))
    assert names(root) == ["d"]


def test_a_filesystem_without_nameless_files_gets_hidden_files(tmp_path, monkeypatch):
    asked: list[str] = []

    def refuses(directory):
        asked.append(str(directory))
        return None

    monkeypatch.setattr(local, "nameless_file", refuses)
    renamed: list[str] = []
    real_replace = os.replace

    def recording(src, dst):
        renamed.append(os.path.basename(src))
        return real_replace(src, dst)

    monkeypatch.setattr(local_files.os, "replace", recording)
    root = tmp_path / "root"
    put_all(LocalStore(root), {"a": b"1", "b": b"22"})
    assert len(asked) == 1  # asked once, then remembered
    assert [n.split(".mcsync-tmp-")[0] for n in renamed] == [".a", ".b"]
    assert {p: (root / p).read_bytes() for p in names(root)} == {"a": b"1", "b": b"22"}


def test_a_link_the_sandbox_refuses_falls_back_to_hidden_files(tmp_path, monkeypatch):
    if not makes_nameless_files(tmp_path):
        pytest.skip("this filesystem makes no nameless files (O_TMPFILE)")
    tried: list[str] = []

    def refused(src, dst, **kwargs):
        tried.append(os.path.basename(dst))
        raise PermissionError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(local_files.os, "link", refused)
    root = tmp_path / "root"
    put_all(LocalStore(root), {"a": b"1", "d/b": b"22"})
    assert tried == ["a"]  # refused once, then not asked again
    assert {p: (root / p).read_bytes() for p in names(root) if p != "d"} == {
        "a": b"1", "d/b": b"22"}
    assert names(root) == ["a", "d", "d/b"]
