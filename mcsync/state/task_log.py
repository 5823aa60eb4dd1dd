"""What a run with workers records of its tasks, per worker, in the manifest (``run_workers``):
tasks done, retried (their worker died) and failed, objects and bytes, the slowest task, when
the last came back. ``workers.Workers`` tells a ``TaskLog`` of each task as it ends; the row
goes into the manifest at once, so the manifest's copy at the target (sent as the run goes and
at its end) carries it to ``mcsync status``.

A task whose worker died (or was killed at its deadline) counts as retried (or, at its last
try, failed) under the worker that died running it, as the pool names it
(``WorkerLost.worker``); one whose own code raised, failed under the worker it raised in
(``TaskFailed.worker``); a task failed for want of any worker under ``NO_WORKER``. A pool
that cannot say who ran a task leaves ``""`` (shown as "(unknown)").
"""

from __future__ import annotations

import time
from dataclasses import astuple, dataclass
from typing import Literal

from .manifest import Manifest

TaskState = Literal["done", "retried", "failed"]
NO_WORKER = "(no worker started)"  # the worker of a task no worker could be started for


@dataclass(frozen=True, slots=True)
class TaskDone:
    """One task's end, as the driver saw it."""

    name: str  # "task 7 (32 objects, a .. b)"
    state: TaskState
    worker: str = ""  # who ran it ("pid P on HOST"), "" when not known
    objects: int = 0
    bytes: int = 0
    seconds: float = 0.0  # in the worker, from its first action to its last outcome


@dataclass
class WorkerTasks:
    """One worker's tally in one run (a row of ``run_workers``, ``run_id`` aside)."""

    worker: str
    tasks: int = 0
    retried: int = 0
    failed: int = 0
    objects: int = 0
    bytes: int = 0
    slowest: str | None = None
    slowest_s: float | None = None
    last_done: float | None = None  # wall-clock time its last task came back


COLUMNS = "worker, tasks, retried, failed, objects, bytes, slowest, slowest_s, last_done"


class TaskLog:
    """The tallies of one run's tasks, written to ``manifest`` (None: kept in memory only)
    under ``run_id`` once the run has one."""

    def __init__(self, manifest: Manifest | None) -> None:
        self.manifest = manifest
        self.run_id = 0
        self.workers: dict[str, WorkerTasks] = {}

    def __call__(self, done: TaskDone) -> None:
        w = self.workers.setdefault(done.worker, WorkerTasks(done.worker))
        if done.state == "retried":
            w.retried += 1
        elif done.state == "failed":
            w.failed += 1
        else:
            w.tasks += 1
            w.objects += done.objects
            w.bytes += done.bytes
            w.last_done = time.time()
            if w.slowest_s is None or done.seconds > w.slowest_s:
                w.slowest, w.slowest_s = done.name, done.seconds
        if self.manifest is not None and self.run_id:
            self.manifest.record_worker_tasks(self.run_id, astuple(w))
