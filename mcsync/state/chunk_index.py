"""The chunk index of a sync pair: which objects mcsync wrote at the target hold a chunk of a
given length and xxh3-128 digest, and where. A new checkpoint directory that shares tensors
with earlier ones is composed from them at the target (``compose``) instead of sent again.

A table of the manifest's database, bounded on disk, not in memory: one row per chunk of each
recorded object of at least ``MIN_INDEXED`` bytes (a smaller one could not give a copy run of
S3's minimum part, and sending it again costs little). Rows belong to the object's current
record: replaced with it, dropped with it, and dropped when a copy from it is refused because
it changed behind mcsync's back. Lookups go by digest, a page of digests at a time.
"""

from __future__ import annotations

import sqlite3
from collections import Counter
from collections.abc import Iterable, Sequence

from ..types import ByteRange

MIN_INDEXED = 1024 * 1024
_LOOKUP_PAGE = 500  # digests per query (SQLite's bound-parameter limit is 32,766)

SCHEMA = """
CREATE TABLE IF NOT EXISTS chunks (
    digest BLOB NOT NULL,
    length INTEGER NOT NULL,
    key TEXT NOT NULL,
    offset INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS chunks_by_digest ON chunks (digest);
CREATE INDEX IF NOT EXISTS chunks_by_key ON chunks (key);
"""


class ChunkIndex:
    """The ``chunks`` table of a manifest's database (the manifest owns the transactions)."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db

    def replace(self, key: str, size: int, chunks: Sequence[tuple[ByteRange, bytes]]) -> None:
        """``key`` now holds ``chunks`` (its recorded chunks and digests)."""
        self.drop(key)
        if size < MIN_INDEXED or not chunks:
            return
        self._db.executemany("INSERT INTO chunks (digest, length, key, offset) VALUES (?,?,?,?)",
                             [(digest, rng.length, key, rng.start) for rng, digest in chunks
                              if rng.length])

    def drop(self, key: str) -> None:
        self._db.execute("DELETE FROM chunks WHERE key = ?", (key,))

    @property
    def empty(self) -> bool:
        return self._db.execute("SELECT 1 FROM chunks LIMIT 1").fetchone() is None

    def holders(self, wanted: Iterable[tuple[int, bytes]]) -> Counter[str]:
        """Objects holding any of the ``wanted`` chunks (length, digest), each with the number
        of those it holds."""
        want = set(wanted)
        hits: Counter[str] = Counter()
        digests = sorted({digest for _, digest in want})
        for i in range(0, len(digests), _LOOKUP_PAGE):
            page = digests[i:i + _LOOKUP_PAGE]
            marks = ",".join("?" * len(page))
            for digest, length, key in self._db.execute(
                    f"SELECT digest, length, key FROM chunks WHERE digest IN ({marks})", page):
                if (length, digest) in want:
                    hits[key] += 1
        return hits

    def rebuild(self, records: Iterable[tuple[str, int, Sequence[tuple[ByteRange, bytes]]]],
                ) -> None:
        """Index every recorded object (a manifest from before the index existed)."""
        for key, size, chunks in records:
            self.replace(key, size, chunks)
