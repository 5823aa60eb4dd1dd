"""The records mcsync keeps at a target, for the node cache's ``verify --against``: the copies
of the manifests of the syncs that wrote there (``<target>/.mcsync/manifest-*.sqlite``, kept
by ``manifest_copy.py``), fetched into a temporary directory and looked up key by key::

    recorded = cache.run(TargetManifests.fetch("meta://bucket/ds/", cache.store_options))
    with recorded:
        bad = cache.verify(against=recorded)

A compute node has no local manifest of the sync (it ran elsewhere): the copies at the target
are what closes the chain source → target → node.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from ..cache.cache import object_url
from ..config import StoreOptions
from ..errors import UsageError
from ..records import ManifestEntry
from ..state.manifest import Manifest, pair_of
from ..stores.registry import open_store
from ..types import RESERVED_PREFIX


class TargetManifests:
    """The manifests kept at ``url`` (a target: ``scheme://bucket/prefix/``), opened."""

    def __init__(self, url: str, manifests: list[Manifest],
                 tmp: tempfile.TemporaryDirectory[str]) -> None:
        self.url = url
        self.manifests = manifests
        self._tmp = tmp

    @classmethod
    async def fetch(cls, url: str, options: StoreOptions | None = None) -> TargetManifests:
        """Fetch the copies kept at ``url``; UsageError when it holds none."""
        options = options or StoreOptions()
        target = object_url(url if url.endswith("/") else url + "/")[0]
        tmp = tempfile.TemporaryDirectory(prefix="mcsync-against-")
        manifests: list[Manifest] = []
        store = open_store(target, options)
        lister = open_store(target + RESERVED_PREFIX, options)
        try:
            async for info in lister.list():
                if not (info.key.startswith("manifest-") and info.key.endswith(".sqlite")):
                    continue
                path = Path(tmp.name) / info.key.rsplit("/", 1)[-1]
                path.write_bytes(bytes(await store.get(RESERVED_PREFIX + info.key)))
                pair = pair_of(path)
                if pair is None:
                    raise UsageError(f"{target}{RESERVED_PREFIX}{info.key}: not a readable "
                                     "mcsync manifest")
                manifests.append(Manifest(path, *pair))
            if not manifests:
                raise UsageError(f"{target}: no manifest kept there ({RESERVED_PREFIX}"
                                 "manifest-*.sqlite); give the prefix mcsync synced to")
        except BaseException:
            for m in manifests:
                m.close()
            tmp.cleanup()
            raise
        finally:
            await lister.aclose()
            await store.aclose()
        return cls(target, manifests, tmp)

    def get(self, key: str) -> ManifestEntry | None:
        """The newest record of ``key`` among the manifests (a shard's holds its keys only)."""
        found = [e for m in self.manifests if (e := m.get(key)) is not None]
        return max(found, key=lambda e: e.written_at) if found else None

    def close(self) -> None:
        for m in self.manifests:
            m.close()
        self.manifests = []
        self._tmp.cleanup()

    def __enter__(self) -> TargetManifests:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
