"""The node cache's small records: how an entry is validated, how an address is keyed, what a
process's cache did."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Literal

from ..config import parse_duration
from ..errors import UsageError
from ..stores.registry import parse_url
from .index import Entry

__all__ = ["CacheStats", "Validation", "object_url"]


@dataclass(frozen=True, slots=True)
class Validation:
    """When a cached entry is checked against its store: ``never`` (no request at all),
    ``ttl`` (a HEAD at most every ``ttl_s`` per entry), ``always`` (a HEAD on every use)."""

    mode: Literal["never", "ttl", "always"]
    ttl_s: float = 0.0

    @classmethod
    def parse(cls, text: str) -> Validation:
        if text in ("never", "always"):
            return cls(text)  # type: ignore[arg-type]
        if text.startswith("ttl:"):
            return cls("ttl", parse_duration(text[4:]))
        raise UsageError(f"not a validation: {text!r} (never, always or ttl:DURATION, e.g. "
                         "ttl:60s)")

    def fresh(self, entry: Entry, now: float, checked_at: float | None = None) -> bool:
        """Is ``entry`` served without a request? ``checked_at``: its last validation, when
        this process knows a later one than the index."""
        checked = entry.checked_at if checked_at is None else checked_at
        return self.mode == "never" or (self.mode == "ttl" and now - checked < self.ttl_s)


@functools.lru_cache(maxsize=4096)  # a data loader asks for the same shards again and again
def object_url(url: str) -> tuple[str, str, str]:
    """(the URL as the index keys it, its store's root, the key in that store) of an object's
    address; UsageError for an address that names no remote object."""
    loc = parse_url(url)
    if loc.scheme == "file":
        raise UsageError(f"{url}: the cache holds remote objects (s3://, meta://, gs://, "
                         "az://), not local files")
    key = url.split("://", 1)[1].partition("/")[2].lstrip("/")
    root = f"{loc.scheme}://{loc.bucket}/"
    return root + key, root, key


@dataclass(slots=True)
class CacheStats:
    """What this process's cache did (its metrics are the same figures, as events)."""

    hits: int = 0
    misses: int = 0
    bytes_fetched: int = 0
    evictions: int = 0
