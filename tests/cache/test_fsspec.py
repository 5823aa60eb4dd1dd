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


def _hive_set(source: Source) -> list[str]:
    """``ds/part=0..3/data.parquet`` (a column ``x``), a file beside them, and the manifest
    copy a sync leaves: the keys of the data files."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    keys = []
    for part in range(4):
        sink = pa.BufferOutputStream()
        pq.write_table(pa.table({"x": list(range(part * 10, part * 10 + 10))}), sink)
        keys.append(f"ds/part={part}/data.parquet")
        source.put(keys[-1], sink.getvalue().to_pybytes())
    source.put("ds/_SUCCESS", b"")
    source.put("ds/.mcsync/manifest-0123.sqlite", b"not data")
    source.put("other/x", b"elsewhere")
    return keys


def test_prefixes_are_directories(source: Source, tmp_path):
    keys = _hive_set(source)
    fs = MCSyncFileSystem(cache_dir=str(tmp_path / "c"), validate="ttl:600s")
    ds = source.url("ds")
    try:
        level = fs.ls(f"mcsync://{ds}/")
        assert [(e["name"], e["type"]) for e in level] == [
            (source.url("ds/_SUCCESS"), "file"),
            *[(source.url(f"ds/part={p}"), "directory") for p in range(4)]]
        assert fs.isdir(ds) and fs.isdir(ds + "/part=2")
        assert fs.info(ds) == {"name": ds, "size": 0, "type": "directory"}
        assert fs.info(source.url(keys[0]))["size"] == len(source.objects[keys[0]])
        assert not fs.isdir(source.url(keys[0])) and fs.isfile(source.url(keys[0]))
        data = sorted(source.url(k) for k in keys)
        assert fs.find(ds) == sorted([*data, source.url("ds/_SUCCESS")])
        assert fs.glob(f"{ds}/*/data.parquet") == data
        assert fs.glob(f"{ds}/**/*.parquet") == data
        assert fs.find(source.url(keys[1])) == [source.url(keys[1])]  # a file finds itself
        walked = list(fs.walk(ds))
        assert walked[0] == (ds, [f"part={p}" for p in range(4)], ["_SUCCESS"])
        assert [w[0] for w in walked[1:]] == [f"{ds}/part={p}" for p in range(4)]
        # fsspec's find: the directory itself among the directories
        assert fs.find(ds, withdirs=True, maxdepth=1) == [
            ds, source.url("ds/_SUCCESS"), *[source.url(f"ds/part={p}") for p in range(4)]]
        assert fs.find(ds, withdirs=True) == sorted([
            ds, *data, source.url("ds/_SUCCESS"), *[source.url(f"ds/part={p}") for p in range(4)]])
        assert fs.ls(source.url(keys[3]), detail=False) == [source.url(keys[3])]
        for missing in ("ds/nothing", "ds/part=9/data.parquet", "ds/.mcsync"):
            assert not fs.exists(source.url(missing))
        with pytest.raises(FileNotFoundError):
            fs.info(source.url("ds/nothing"))
        with pytest.raises(FileNotFoundError):
            fs.ls(source.url("ds/nothing"))
        with pytest.raises(FileNotFoundError, match="ds/nothing"):
            fs.open(source.url("ds/nothing"), "rb")
    finally:
        fs.close()
    # chained to one protocol (mcsync::s3://...), paths and names are without it
    chained = MCSyncFileSystem(cache_dir=str(tmp_path / "c"), target_protocol="s3",
                               skip_instance_cache=True)
    try:
        bare = f"{source.bucket}/ds"
        assert chained.glob(f"{bare}/*/data.parquet") == [f"{source.bucket}/{k}" for k in keys]
        assert chained.isdir(bare) and chained.ls(bare, detail=False)[0] == f"{bare}/_SUCCESS"
        assert chained.cat_file(f"{source.bucket}/{keys[0]}") == source.objects[keys[0]]
    finally:
        chained.close()


def test_listings_are_kept_for_the_validation_window(source: Source, tmp_path):
    keys = _hive_set(source)
    fs = MCSyncFileSystem(cache_dir=str(tmp_path / "c"), validate="ttl:600s")
    ds = source.url("ds")
    try:
        fs.find(ds)
        asked = len(source.proxy.exchanges())
        for key in keys:  # every level find saw is kept: no request for any of these
            assert fs.info(source.url(key))["type"] == "file"
            assert fs.isdir(source.url(key.rsplit("/", 1)[0]))
        fs.ls(ds)
        fs.glob(f"{ds}/*/data.parquet")
        assert len(source.proxy.exchanges()) == asked
        source.put("ds/part=4/data.parquet", b"new")
        assert len(fs.find(ds)) == 5  # still the kept listing
        fs.invalidate_cache(ds)
        assert len(fs.find(ds)) == 6
    finally:
        fs.close()
    always = MCSyncFileSystem(cache_dir=str(tmp_path / "c"), validate="always")
    try:
        always.ls(ds)
        asked = len(source.proxy.exchanges())
        always.ls(ds)
        assert len(source.proxy.exchanges()) > asked  # nothing kept: asked again
    finally:
        always.close()


def test_pyarrow_dataset_and_pandas_read_a_hive_set_through_the_cache(source: Source,
                                                                     tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pandas as pd
    import pyarrow.dataset as pads

    keys = _hive_set(source)
    fs = fsspec.filesystem("mcsync", cache_dir=str(tmp_path / "c"), validate="never")
    ds = source.url("ds")
    try:
        dataset = pads.dataset(ds, filesystem=fs, format="parquet", partitioning="hive")
        table = dataset.to_table().sort_by("x")
        assert table.column("x").to_pylist() == list(range(40))
        assert table.column("part").to_pylist() == [x // 10 for x in range(40)]
        assert sorted(dataset.files) == sorted(source.url(k) for k in keys)
        assert dataset.to_table(filter=pads.field("part") == 2).column("x").to_pylist() == \
            list(range(20, 30))
        frame = pd.read_parquet(f"{ds}/part=1", filesystem=fs)
        assert frame["x"].tolist() == list(range(10, 20))
        every = pd.read_parquet(ds, filesystem=fs, partitioning="hive")
        assert sorted(every["x"].tolist()) == list(range(40))
        assert isinstance(table, pa.Table)
        gets = source.gets()
        pads.dataset(ds, filesystem=fs, format="parquet", partitioning="hive").to_table()
        assert source.gets() == gets  # read again: from the cache
        assert {e.url for e in fs.cache.entries()} == {source.url(k) for k in keys}
    finally:
        fs.close()
