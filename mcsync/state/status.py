"""``mcsync status DST``: what the state mcsync keeps at a target says of the runs into it, one
row per pair, or per shard of a pair run with ``--shard``.

Read from ``<dst>/.mcsync/`` alone (no local manifest, no source): each manifest's copy (its
objects, its bytes, its newest run and the last that ended well, and the tasks of its last run
with workers, per worker: ``task_log``) and each lock object (a run holding it now). A run
that changed nothing sends no new copy, so "last success" is that of the last run that changed
something.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import re
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import NotFound
from ..stores.base import ReadStore
from .lock import expires_at, parsed_holder
from .shard import Shard, of_name
from .task_log import COLUMNS, WorkerTasks

_NAME = re.compile(r"(manifest|lock)-([0-9a-f]{20})(\.shard-\d+-of-\d+)?\.(sqlite|json)")
# A manifest's newest run, by its status (a copy sent mid-run says running; with no live lock
# that run was killed).
_STATE = {"ok": "done", "failed": "failed", "interrupted": "interrupted",
          "running": "interrupted"}


@dataclass(frozen=True, slots=True)
class ShardStatus:
    """One pair's, or one shard of a pair's, state at the target."""

    pair: str  # the pair's id (``manifest.pair_id``)
    shard: Shard | None
    state: str  # done, failed, interrupted, running, not started
    src: str | None = None
    objects: int = 0  # recorded at the target by this pair (or shard)
    bytes: int = 0
    failed: int = 0  # objects that failed in its newest run
    elapsed_s: float | None = None  # of its newest run
    last_success: float | None = None  # when the last run that ended well finished
    holder: str | None = None  # the run holding its lock now: "pid P on HOST"
    # Its last run with workers: that run's id and status, its tasks per worker.
    tasks_run: tuple[int, str] | None = None
    tasks: tuple[WorkerTasks, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"pair": self.pair, "src": self.src,
                "shard": f"{self.shard[0]}/{self.shard[1]}" if self.shard else None,
                "state": self.state, "objects": self.objects, "bytes": self.bytes,
                "failed": self.failed, "elapsed_s": self.elapsed_s,
                "last_success": self.last_success, "holder": self.holder,
                "tasks_run": ({"id": self.tasks_run[0], "status": self.tasks_run[1]}
                              if self.tasks_run else None),
                "tasks": [dataclasses.asdict(t) for t in self.tasks]}


@dataclass
class _Found:
    manifest: Path | None = None
    lock: dict[str, object] | None = None


def summary(path: Path) -> dict[str, Any]:
    """What one manifest file says: its source, objects and bytes, its newest run."""
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        meta = dict(db.execute("SELECT k, v FROM meta").fetchall())
        objects, size = db.execute(
            "SELECT COUNT(*), COALESCE(SUM(dst_size), 0) FROM objects").fetchone()
        newest = db.execute("SELECT status, report FROM runs ORDER BY id DESC LIMIT 1").fetchone()
        (ok,) = db.execute("SELECT MAX(finished_at) FROM runs WHERE status = 'ok'").fetchone()
        tasks_run, tasks = _tasks(db)
    finally:
        db.close()
    report: dict[str, Any] = {}
    if newest is not None and newest[1]:
        try:
            report = json.loads(newest[1])
        except ValueError:
            report = {}
    return {"src": meta.get("src"), "objects": int(objects), "bytes": int(size),
            "status": newest[0] if newest else None, "failed": int(report.get("objects_failed")
                                                                   or 0),
            "elapsed_s": report.get("elapsed_s"), "last_success": ok, "tasks_run": tasks_run,
            "tasks": tasks}


def _tasks(db: sqlite3.Connection) -> tuple[tuple[int, str] | None,
                                            tuple[WorkerTasks, ...]]:
    """The last run with workers (id, status) and its tasks per worker."""
    try:
        run = db.execute("SELECT r.id, r.status FROM runs r WHERE r.id = "
                         "(SELECT MAX(run_id) FROM run_workers)").fetchone()
        if run is None:
            return None, ()
        rows = db.execute(f"SELECT {COLUMNS} FROM run_workers WHERE run_id = ? "
                          "ORDER BY worker = '', worker", (run[0],)).fetchall()
    except sqlite3.OperationalError:  # the copy of an older mcsync's manifest: no such table
        return None, ()
    return (int(run[0]), str(run[1])), tuple(WorkerTasks(*row) for row in rows)


async def status(state: ReadStore, tmp: Path, *, now: float | None = None) -> list[ShardStatus]:
    """Every pair and shard whose state ``state`` (a store rooted at a target's ``.mcsync/``)
    holds; manifests' copies are downloaded into ``tmp``. The shards of a pair never started
    are named too (their count is known from their siblings' names)."""
    now = time.time() if now is None else now
    found: dict[tuple[str, Shard | None], _Found] = {}
    try:
        async for info in state.list():
            match = _NAME.fullmatch(info.key)
            if match is None:
                continue
            entry = found.setdefault((match.group(2), of_name(info.key)), _Found())
            if match.group(1) == "manifest":
                entry.manifest = tmp / info.key
                entry.manifest.write_bytes(bytes(await state.get(info.key)))
            else:
                with contextlib.suppress(NotFound):  # released since it was listed
                    entry.lock = parsed_holder(bytes(await state.get(info.key)))
    except NotFound:
        return []
    counts: dict[str, set[int]] = {}
    for pair, shard in found:
        if shard is not None:
            counts.setdefault(pair, set()).add(shard[1])
    for pair, ns in counts.items():
        if len(ns) == 1:
            (n,) = ns
            for i in range(n):
                found.setdefault((pair, (i, n)), _Found())
    rows = []
    for (pair, shard), entry in sorted(found.items(), key=lambda kv: (kv[0][0],
                                                                     kv[0][1] or (0, 0))):
        rows.append(_row(pair, shard, entry, now))
    return rows


def _row(pair: str, shard: Shard | None, entry: _Found, now: float) -> ShardStatus:
    held = entry.lock if entry.lock and expires_at(entry.lock) > now else None
    holder = (f"pid {held.get('pid', '?')} on {held.get('host', '?')}" if held is not None
              else None)
    if entry.manifest is None:
        return ShardStatus(pair, shard, "running" if held else "not started", holder=holder)
    try:
        s = summary(entry.manifest)
    except sqlite3.Error:
        return ShardStatus(pair, shard, "running" if held else "unreadable", holder=holder)
    state = "running" if held else _STATE.get(s["status"] or "", "not started")
    tasks_run = s["tasks_run"]
    if tasks_run is not None:  # a run still "running" with no live lock was killed
        tasks_run = (tasks_run[0], "running" if held and tasks_run[1] == "running"
                     else _STATE.get(tasks_run[1], tasks_run[1]))
    return ShardStatus(pair, shard, state, src=s["src"], objects=s["objects"],
                       bytes=s["bytes"], failed=s["failed"], elapsed_s=s["elapsed_s"],
                       last_success=s["last_success"], holder=holder,
                       tasks_run=tasks_run, tasks=s["tasks"])
