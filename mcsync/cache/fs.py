"""The node cache as an fsspec filesystem, protocol ``mcsync``, so pandas, pyarrow,
``datasets`` and WebDataset read through it::

    fsspec.open("mcsync://s3://bucket/shard-0.tar", cache_dir="/mnt/nvme/cache")
    fsspec.open("mcsync::s3://bucket/shard-0.tar", mcsync={"cache_dir": ...})  # chained
    fs = fsspec.filesystem("mcsync", cache_dir=..., max_size="500GiB", validate="never")
    pyarrow.dataset.dataset("s3://bucket/ds", filesystem=fs, partitioning="hive")

Read-only: every file is ``Cache.open`` (streamed while it fills, held against eviction
while open). Directories are the store's prefixes, as s3fs has them: ``ls`` lists one level
(the store's delimiter listing), ``find`` the whole prefix in one listing, and both are kept
for the cache's validation window (``ttl:60s``: a minute; ``never``: until
``invalidate_cache``; ``always``: not kept), so ``info``/``isdir`` of a listed path asks no one.
mcsync's own state at a target (``.mcsync/``) is not listed: it is not data. The chained form
needs the inner protocol's own fsspec package (s3fs, gcsfs) only because fsspec looks it up to
parse the address; no byte goes through it. Registered by the ``fsspec.specs`` entry point in
``pyproject.toml`` (``pip install mcsync[cache]``).
"""

from __future__ import annotations

import time
from typing import Any

from fsspec import AbstractFileSystem

from ..errors import NotFound
from ..stores.base import LevelLister
from ..types import RESERVED_PREFIX, Level, ObjectInfo
from .cache import Cache, Validation, object_url

PREFIXES = ("mcsync://", "mcsync::")
HIDDEN = RESERVED_PREFIX.rstrip("/")  # a path component never listed


class MCSyncFileSystem(AbstractFileSystem):  # type: ignore[misc]  # fsspec is untyped
    protocol = "mcsync"
    root_marker = ""

    def __init__(self, cache_dir: str | None = None, *, max_size: int | str | None = None,
                 validate: str = "ttl:60s", target_protocol: str | None = None,
                 target_options: dict[str, Any] | None = None, fo: str | None = None,
                 **kwargs: Any) -> None:
        # Listings are kept as long as the cache trusts an entry without asking its store.
        how = Validation.parse(validate)
        kwargs.setdefault("use_listings_cache", how.mode != "always")
        kwargs.setdefault("listings_expiry_time", how.ttl_s if how.mode == "ttl" else None)
        super().__init__(**kwargs)
        self.cache = Cache(cache_dir, max_size=max_size, validate=validate)
        self.target_protocol = target_protocol
        self._kept_for = None if how.mode == "never" else how.ttl_s
        self._trees: dict[str, tuple[float, list[dict[str, Any]]]] = {}  # find's listings
        self._heads: dict[str, tuple[float, dict[str, Any]]] = {}  # info's HEADs

    @classmethod
    def _strip_protocol(cls, path: Any) -> str:
        text = str(path)
        for prefix in PREFIXES:
            if text.startswith(prefix):
                text = text[len(prefix):]
                break
        # "s3://bucket/dir/" names the directory "s3://bucket/dir", as s3fs's "bucket/dir"
        stripped = text.rstrip("/")
        return stripped if not stripped.endswith(":") else text

    def url(self, path: str) -> str:
        """The object's own address (``s3://...``) of a path this filesystem was given."""
        path = self._strip_protocol(path)
        if "://" in path:
            return path
        if self.target_protocol:
            return f"{self.target_protocol}://{path}"
        raise ValueError(f"{path}: name the store, as mcsync://s3://bucket/key")

    def _name(self, url: str) -> str:
        """A name in this filesystem's listings: the address, or, for a filesystem chained to
        one protocol, the address without it (as the paths it is given)."""
        url = url.rstrip("/")
        if self.target_protocol and url.startswith(f"{self.target_protocol}://"):
            return url[len(self.target_protocol) + 3:]
        return url

    def _open(self, path: str, mode: str = "rb", **kwargs: Any) -> Any:
        if mode != "rb":
            raise NotImplementedError(f"{path}: the mcsync cache is read-only (mode {mode!r})")
        try:
            return self.cache.open(self.url(path))
        except NotFound as exc:  # as fsspec's clients expect of a missing file
            raise FileNotFoundError(str(exc)) from None

    # -- listings ----------------------------------------------------------------------------

    def _file(self, root: str, info: ObjectInfo) -> dict[str, Any]:
        return {"name": self._name(root + info.key), "size": info.size, "type": "file",
                "ukey": info.etag, "ETag": info.etag, "mtime": info.mtime}

    def _dir(self, url: str) -> dict[str, Any]:
        return {"name": self._name(url), "size": 0, "type": "directory"}

    def _fresh(self, when: float) -> bool:
        return self._kept_for is None or time.monotonic() - when < self._kept_for

    def _level(self, url: str) -> list[dict[str, Any]]:
        """One level under the directory ``url`` (kept in the listings cache)."""
        name = self._name(url)
        try:
            return list(self.dircache[name])
        except KeyError:
            pass
        _, root, key = object_url(url.rstrip("/") + "/")
        level = self.cache.run(self._list_level(root, key))
        found = [self._dir(root + d) for d in level.dirs if not _hidden(d)]
        found += [self._file(root, f) for f in level.files if not _hidden(f.key)]
        found.sort(key=lambda e: e["name"])
        self.dircache[name] = found
        return found

    async def _list_level(self, root: str, prefix: str) -> Level:
        store = self.cache.store_for(root)
        if isinstance(store, LevelLister):
            return await store.list_level(prefix)
        # a store without a delimiter listing: the level out of the listing of the prefix
        files, dirs = [], set()
        async for info in store.list():
            if not info.key.startswith(prefix):
                continue
            rest = info.key[len(prefix):]
            if "/" in rest:
                dirs.add(prefix + rest.split("/", 1)[0] + "/")
            else:
                files.append(info)
        return Level(tuple(files), tuple(sorted(dirs)))

    def ls(self, path: str, detail: bool = True, **kwargs: Any) -> list[Any]:
        """One level: the files and the directories (prefixes) directly under ``path``; a file
        lists itself."""
        found = self._level(self.url(path))
        if not found:
            info = self.info(path)  # FileNotFoundError when nothing is there
            found = [info] if info["type"] == "file" else []
        return found if detail else [f["name"] for f in found]

    def info(self, path: str, **kwargs: Any) -> dict[str, Any]:
        url = self.url(path).rstrip("/")
        name = self._name(url)
        _, root, key = object_url(url + "/")
        if not key:
            return self._dir(url)  # a bucket
        if _hidden(key):
            raise FileNotFoundError(name)
        parent = name.rsplit("/", 1)[0]
        try:  # a listing of its directory, when one is kept, answers without a request
            for e in self.dircache[parent]:
                if e["name"] == name:
                    return dict(e)
            raise FileNotFoundError(name)
        except KeyError:
            pass
        if self.dircache.get(name):  # a kept listing of it: a directory
            return self._dir(url)
        kept = self._heads.get(name)
        if kept is not None and self._fresh(kept[0]):
            return dict(kept[1])
        try:
            ((_, obj),) = self.cache.objects(url)
            found = self._file(root, obj)
        except (NotFound, FileNotFoundError):
            if not self._level(url):
                raise FileNotFoundError(name) from None
            found = self._dir(url)
        if self.dircache.use_listings_cache:
            self._heads[name] = (time.monotonic(), found)
        return dict(found)

    def find(self, path: str, maxdepth: int | None = None, withdirs: bool = False,
             detail: bool = False, **kwargs: Any) -> Any:
        """Every file under ``path`` (and, ``withdirs``, every directory) from one listing of
        the prefix, as s3fs does; with ``maxdepth``, level by level."""
        if maxdepth is not None:
            return super().find(path, maxdepth=maxdepth, withdirs=withdirs, detail=detail,
                                **kwargs)
        url = self.url(path).rstrip("/")
        tree = self._tree(url)
        found = {e["name"]: e for e in tree if withdirs or e["type"] == "file"}
        if tree and withdirs:
            found[self._name(url)] = self._dir(url)  # the directory itself, as fsspec's find
        elif not tree:
            try:
                info = self.info(path)
            except FileNotFoundError:
                info = None
            if info is not None and info["type"] == "file":
                found = {info["name"]: info}  # a file finds itself
        names = sorted(found)
        return {n: found[n] for n in names} if detail else names

    def _tree(self, url: str) -> list[dict[str, Any]]:
        """Everything under the directory ``url``: its files and the directories their keys
        imply (one listing, kept as a level is; each level it holds is kept too)."""
        name = self._name(url)
        kept = self._trees.get(name)
        if kept is not None and self._fresh(kept[0]) and self.dircache.use_listings_cache:
            return kept[1]
        base = url + "/"
        infos = [(u, i) for u, i in self.cache.objects(base) if not _hidden(u[len(base):])]
        levels: dict[str, dict[str, dict[str, Any]]] = {name: {}}
        for u, info in infos:
            entry = self._file(base, info)
            parts = u[len(base):].split("/")
            parent = url
            for part in parts[:-1]:
                child = f"{parent}/{part}"
                levels.setdefault(self._name(parent), {})[self._name(child)] = self._dir(child)
                parent = child
            levels.setdefault(self._name(parent), {})[entry["name"]] = entry
        for level, entries in levels.items():
            if entries:
                self.dircache[level] = sorted(entries.values(), key=lambda e: e["name"])
        tree = sorted((e for entries in levels.values() for e in entries.values()),
                      key=lambda e: e["name"])
        if self.dircache.use_listings_cache:
            self._trees[name] = (time.monotonic(), tree)
        return tree

    def invalidate_cache(self, path: str | None = None) -> None:
        if path is None:
            self.dircache.clear()
            self._trees.clear()
            self._heads.clear()
            return
        name = self._name(self.url(path))
        for kept in (self.dircache, self._trees, self._heads):
            for key in [k for k in kept if k == name or name.startswith(k + "/")
                        or k.startswith(name + "/")]:
                kept.pop(key, None)

    # -- files -------------------------------------------------------------------------------

    def ukey(self, path: str) -> str:
        return str(self.info(path)["ukey"])

    def cat_file(self, path: str, start: int | None = None, end: int | None = None,
                 **kwargs: Any) -> bytes:
        with self._open(path) as f:
            size = f.seek(0, 2)
            begin = 0 if start is None else start if start >= 0 else max(0, size + start)
            stop = size if end is None else end if end >= 0 else max(0, size + end)
            f.seek(begin)
            data: bytes = f.read(max(0, stop - begin))
            return data

    def close(self) -> None:
        """Close the cache; fsspec's next instance of these arguments opens it anew."""
        type(self)._cache.pop(getattr(self, "_fs_token", None), None)
        self.cache.close()


def _hidden(key: str) -> bool:
    """mcsync's own state at a target, at any depth (a target may be any prefix)."""
    return HIDDEN in key.rstrip("/").split("/")
