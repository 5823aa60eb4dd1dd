"""The delta's view of the target (``delta.planner.Holdings``) read from the run's manifest:
the state side's implementation, so the delta never imports the manifest."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from ..records import ManifestEntry
from .manifest import Manifest


class ManifestHoldings:
    """``Holdings`` read from the run's manifest, written back at once (``writing``: not for a
    dry run). ``target_empty``: the target was listed and holds no object, so whatever the
    chunk index names is gone (set by the driver as the listing ends)."""

    def __init__(self, manifest: Manifest, *, writing: bool) -> None:
        self._manifest = manifest
        self._writing = writing
        self.target_empty = False

    def get(self, key: str) -> ManifestEntry | None:
        return self._manifest.get(key)

    def holders(self, wanted: Iterable[tuple[int, bytes]]) -> Counter[str]:
        return self._manifest.index.holders(wanted)

    def may_hold_chunks(self) -> bool:
        return not self.target_empty and not self._manifest.index.empty

    def gone(self, key: str) -> None:
        if self._writing:
            self._manifest.index.drop(key)
