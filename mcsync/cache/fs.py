"""The node cache as an fsspec filesystem, protocol ``mcsync``, so pandas, pyarrow,
``datasets`` and WebDataset read through it::

    fsspec.open("mcsync://s3://bucket/shard-0.tar", cache_dir="/mnt/nvme/cache")
    fsspec.open("mcsync::s3://bucket/shard-0.tar", mcsync={"cache_dir": ...})  # chained
    fs = fsspec.filesystem("mcsync", cache_dir=..., max_size="500GiB", validate="never")

Read-only: every file is ``Cache.open`` (streamed while it fills, held against eviction
while open). The chained form needs the inner protocol's own fsspec package (s3fs, gcsfs)
only because fsspec looks it up to parse the address; no byte goes through it. Registered
by the ``fsspec.specs`` entry point in ``pyproject.toml`` (``pip install mcsync[cache]``).
"""

from __future__ import annotations

from typing import Any

from fsspec import AbstractFileSystem

from .cache import Cache

PREFIXES = ("mcsync://", "mcsync::")


class MCSyncFileSystem(AbstractFileSystem):  # type: ignore[misc]  # fsspec is untyped
    protocol = "mcsync"
    root_marker = ""

    def __init__(self, cache_dir: str | None = None, *, max_size: int | str | None = None,
                 validate: str = "ttl:60s", target_protocol: str | None = None,
                 target_options: dict[str, Any] | None = None, fo: str | None = None,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.cache = Cache(cache_dir, max_size=max_size, validate=validate)
        self.target_protocol = target_protocol

    @classmethod
    def _strip_protocol(cls, path: Any) -> str:
        text = str(path)
        for prefix in PREFIXES:
            if text.startswith(prefix):
                return text[len(prefix):]
        return text

    def url(self, path: str) -> str:
        """The object's own address (``s3://...``) of a path this filesystem was given."""
        path = self._strip_protocol(path)
        if "://" in path:
            return path
        if self.target_protocol:
            return f"{self.target_protocol}://{path}"
        raise ValueError(f"{path}: name the store, as mcsync://s3://bucket/key")

    def _open(self, path: str, mode: str = "rb", **kwargs: Any) -> Any:
        if mode != "rb":
            raise NotImplementedError(f"{path}: the mcsync cache is read-only (mode {mode!r})")
        return self.cache.open(self.url(path))

    def ls(self, path: str, detail: bool = True, **kwargs: Any) -> list[Any]:
        url = self.url(path).rstrip("/") + "/"
        found = [{"name": u, "size": i.size, "type": "file", "ukey": i.etag}
                 for u, i in self.cache.objects(url)]
        return found if detail else [f["name"] for f in found]

    def info(self, path: str, **kwargs: Any) -> dict[str, Any]:
        url = self.url(path)
        try:
            ((name, obj),) = self.cache.objects(url)
        except Exception as exc:
            raise FileNotFoundError(url) from exc
        return {"name": name, "size": obj.size, "type": "file", "ukey": obj.etag}

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
