"""A marker that names another directory never runs ahead of it at the target.

DeepSpeed's ``latest`` and Megatron's ``latest_checkpointed_iteration.txt`` sit beside the
checkpoints and name the one to load. The run's listing reaches them after the checkpoint
directories (``latest`` sorts after ``global_step700/``), so a trainer that finishes a step
while the listing walks can leave the run holding a ``latest`` that names a directory it listed
half, or not at all. Before such a marker is written, the version the run listed is read (a
read pinned to it: a marker rewritten since is not this run's to write), the directory its text
names is listed at the source and at the target, and the marker goes only when every file of
that directory is at the target, the same size; else it waits for a later run, with the reason.
The write that follows reads the same pinned version, so the text checked is the text written.
"""

from __future__ import annotations

from collections.abc import Callable

from ..checkpoints.frameworks import FRAMEWORKS, Framework
from ..checkpoints.latest import Levels
from ..errors import MCSyncError, NotFound, PreconditionFailed
from ..records import Action
from ..stores.base import ReadStore

__all__ = ["naming_framework", "not_yet"]


def naming_framework(key: str) -> Framework | None:
    """The framework whose root marker ``key`` is (one that names another directory)."""
    name = key.rsplit("/", 1)[-1]
    return next((f for f in FRAMEWORKS if f.names is not None and f.marker == name), None)


async def not_yet(src: ReadStore, dst: ReadStore, action: Action,
                  selects: Callable[[str], bool] = lambda key: True) -> str | None:
    """Why the marker of ``action`` must wait (None: the directory it names is complete at
    the target, so it may be written). ``selects``: the run's filters; a file they leave out
    is not the run's to wait for."""
    framework = naming_framework(action.key)
    if framework is None or framework.names is None or action.src is None:
        return None
    try:
        data = await src.get(action.key, expect=action.src)
    except (PreconditionFailed, NotFound):
        return "rewritten at the source since it was listed: a later run writes it"
    except MCSyncError as exc:
        return f"cannot read it to check the directory it names: {exc}"
    text = bytes(data[:4096]).decode("utf-8", "replace").strip()
    if not text:
        return "empty: it names no checkpoint yet"
    parent = action.key.rpartition("/")[0]
    named = f"{parent}/{framework.names(text)}/" if parent else f"{framework.names(text)}/"
    try:
        want = {i.key: i.size async for i in Levels(src).under(named) if selects(i.key)}
        have = {i.key: i.size async for i in Levels(dst).under(named)}
    except MCSyncError as exc:
        return f"cannot list {named} to check it: {exc}"
    if not want:
        return f"names {named}, which is not at the source"
    missing = sum(1 for k, size in want.items() if have.get(k) != size)
    if missing:
        return (f"names {named}, not complete at the target yet ({missing} of {len(want)} "
                "files missing)")
    return None
