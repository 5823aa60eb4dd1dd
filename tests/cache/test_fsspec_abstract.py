"""fsspec's own tests of a filesystem (``fsspec.tests.abstract``) over the cache's: those
that fit a read-only one. ``AbstractGetTests`` copies trees, globs and lists of files from the
filesystem to local disk, through ``find``, ``glob``, ``isdir``, ``info`` and ``expand_path``;
the copy, put, pipe and open tests write to the filesystem under test, which the cache's
never does, and are not run.

The scenarios those tests set up are written to the bucket beside the cache, as another
writer of the dataset would: a subclass used here only turns fsspec's ``touch``, ``pipe`` and
``rm`` into the bucket's PUTs and DELETEs; every read, listing and copy is the cache's.
"""

from __future__ import annotations

from typing import Any

import pytest
from fsspec.tests.abstract import AbstractFixtures, AbstractGetTests

from mcsync.cache.fs import MCSyncFileSystem

from .conftest import Source


class _Seeded(MCSyncFileSystem):
    """The cache's filesystem, and the bucket's writes a test's scenario needs."""

    def __init__(self, *args: Any, source: Source, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.source = source

    def _key(self, path: str) -> str:
        return self.url(path).split("/", 3)[3]

    def makedirs(self, path: str, exist_ok: bool = False) -> None:
        pass  # a prefix is made by its first object

    def mkdir(self, path: str, create_parents: bool = True, **kwargs: Any) -> None:
        pass

    def touch(self, path: str, truncate: bool = True, **kwargs: Any) -> None:
        self.pipe_file(path, b"")

    def pipe_file(self, path: str, value: bytes, mode: str = "overwrite",
                  **kwargs: Any) -> None:
        self.source.put(self._key(path), value)
        self.invalidate_cache()

    def rm(self, path: Any, recursive: bool = False, maxdepth: int | None = None) -> None:
        client = self.source.endpoint.client()
        for one in [path] if isinstance(path, str) else path:
            key = self._key(one)
            listed = client.list_objects_v2(Bucket=self.source.bucket, Prefix=key)
            for obj in listed.get("Contents", []):
                if obj["Key"] == key or obj["Key"].startswith(key.rstrip("/") + "/"):
                    client.delete_object(Bucket=self.source.bucket, Key=obj["Key"])
        self.invalidate_cache()


class TestMCSyncGet(AbstractFixtures, AbstractGetTests):
    @pytest.fixture
    def fs(self, source: Source, tmp_path):
        fs = _Seeded(cache_dir=str(tmp_path / "cache"), validate="ttl:600s", source=source,
                     skip_instance_cache=True)
        yield fs
        fs.close()

    @pytest.fixture
    def fs_path(self, source: Source) -> str:
        return source.url("abstract")

    @pytest.fixture
    def supports_empty_directories(self) -> bool:
        return False  # prefixes: a directory is there while an object is under it
