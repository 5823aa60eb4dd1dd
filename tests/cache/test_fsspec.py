"""The node cache as an fsspec filesystem: fsspec's own open and cat read through it, and
pyproject registers it under the ``mcsync`` protocol."""

from __future__ import annotations

import random
import tomllib
from pathlib import Path

import fsspec
import pytest

from mcsync.cache.fs import MCSyncFileSystem

from .conftest import Source


@pytest.fixture(autouse=True)
def _registered():
    # The entry point registers it where mcsync is installed with this pyproject; a test
    # run from a checkout registers it by hand.
    fsspec.register_implementation("mcsync", MCSyncFileSystem, clobber=True)
    yield
    fsspec.config.conf.pop("mcsync", None)


def test_pyproject_registers_the_protocol():
    project = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
    specs = project["project"]["entry-points"]["fsspec.specs"]
    assert specs == {"mcsync": "mcsync.cache.fs:MCSyncFileSystem"}
    assert any(d.startswith("fsspec") for d in project["project"]["optional-dependencies"]["cache"])


def test_fsspec_open_cat_and_ls_read_through_the_cache(source: Source, tmp_path):
    data = random.Random(7).randbytes(3 << 20)
    source.put("ds/a.bin", data)
    source.put("ds/b.bin", b"small")
    url = f"mcsync://{source.url('ds/a.bin')}"
    with fsspec.open(url, "rb", cache_dir=str(tmp_path / "c")) as f:
        assert f.read() == data
    fs = fsspec.filesystem("mcsync", cache_dir=str(tmp_path / "c"), validate="never")
    try:
        gets = source.gets()
        assert fs.cat_file(url, start=10, end=20) == data[10:20]
        assert fs.cat(f"mcsync://{source.url('ds/b.bin')}") == b"small"
        assert source.gets() == gets + 1  # a.bin from the cache, b.bin fetched once
        assert sorted(fs.ls(f"mcsync://{source.url('ds')}", detail=False)) == [
            source.url("ds/a.bin"), source.url("ds/b.bin")]
        assert fs.info(url)["size"] == len(data)
        with pytest.raises(NotImplementedError, match="read-only"):
            fs.open(url, "wb")
    finally:
        fs.close()
