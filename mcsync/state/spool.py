"""Actions held back until every copy of a run is done — deletes (``--delete``) and the files
that tell readers a checkpoint is complete — kept in a private, temporary SQLite database, so
a run over ten million keys holds a page of them in memory, not a list.

SQLite's empty file name is a private temporary database: in memory while small, spilled to a
temporary file as it grows, deleted when closed. Actions are this process's own records,
stored with pickle and read back by it alone.
"""

from __future__ import annotations

import pickle
import sqlite3
from collections.abc import Iterator

from ..records import Action

_PAGE = 1000


class Spool:
    """Actions in the order they were added, read back a page at a time."""

    def __init__(self) -> None:
        self._db = sqlite3.connect("", isolation_level=None)
        self._db.execute("CREATE TABLE held (n INTEGER PRIMARY KEY, action BLOB NOT NULL)")
        self._count = 0

    def add(self, action: Action) -> None:
        self._db.execute("INSERT INTO held (action) VALUES (?)",
                         (pickle.dumps(action, protocol=pickle.HIGHEST_PROTOCOL),))
        self._count += 1

    def __len__(self) -> int:
        return self._count

    def __iter__(self) -> Iterator[Action]:
        last = 0
        while True:
            rows = self._db.execute("SELECT n, action FROM held WHERE n > ? ORDER BY n LIMIT ?",
                                    (last, _PAGE)).fetchall()
            if not rows:
                return
            for n, blob in rows:
                last = n
                yield pickle.loads(blob)

    def close(self) -> None:
        self._db.close()
