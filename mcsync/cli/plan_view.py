"""What ``plan`` (and ``sync --dry-run``) prints: a summary per action and per top-level
directory, the block delta of each changed object, and the checkpoints waiting for completion;
or, with ``--long``, one line per planned change. Event sinks, like the progress display."""

from __future__ import annotations

import re

import click

from ..config import format_size
from ..events import (
    CheckpointKept,
    CheckpointPruned,
    DeltaPlanned,
    Event,
    ObjectDeferred,
    ObjectPlanned,
)
from .progress import counted

SHOWN = 50  # rows of any one table: a plan of a million keys stays a screenful


class PlanLines:
    """Each planned change on its own line (``plan --long``)."""

    def emit(self, event: Event) -> None:
        if isinstance(event, ObjectPlanned) and event.action != "skip":
            click.echo(f"{event.action:<12} {format_size(event.size):>10}  {event.key}"
                       f"  ({event.reason})")
        elif isinstance(event, DeltaPlanned):
            click.echo(delta_line(event))
        elif isinstance(event, ObjectDeferred):
            click.echo(f"{'wait':<12} {format_size(event.size):>10}  {event.key}"
                       f"  ({event.reason})")
        elif isinstance(event, CheckpointKept | CheckpointPruned):
            click.echo(retention_line(event))

    def close(self) -> None:
        pass


def fate_of(e: CheckpointKept | CheckpointPruned) -> str:
    """"kept: last 3", "kept: every 1000", "pruned (3 objects, 1.2 GiB)"."""
    if isinstance(e, CheckpointKept):
        return e.reason + (", optimizer files to prune" if e.thinned else "")
    what = "optimizer files pruned" if e.thinned else "pruned"
    return f"{what} ({counted(e.objects, 'object')}, {format_size(e.bytes)})"


def retention_line(e: CheckpointKept | CheckpointPruned) -> str:
    """``plan --long``'s line for a checkpoint's fate under --keep-last."""
    if isinstance(e, CheckpointKept):
        return f"{'keep':<12} {'':>10}  {e.directory}  ({fate_of(e)})"
    what = "optimizer files, " if e.thinned else ""
    return (f"{'prune':<12} {format_size(e.bytes):>10}  {e.directory}  "
            f"({what}{counted(e.objects, 'object')})")


def delta_line(e: DeltaPlanned) -> str:
    line = (f"{'  delta':<12} {format_size(e.size):>10}  {e.key}: "
            f"{format_size(e.bytes_changed)} changed, {format_size(e.bytes_to_send)} to send, "
            f"{format_size(e.bytes_reused)} composed at the target ({counted(e.parts, 'part')})")
    if e.changed_tensors:
        names = ", ".join(e.changed_tensors[:8])
        more = len(e.changed_tensors) - 8
        line += f"\n{'':<25}changed tensors: {names}" + (f" and {more} more" if more > 0 else "")
    if e.reused_from and [k for k, _ in e.reused_from] != [e.key]:
        shown = ", ".join(f"{k} ({format_size(n)})" for k, n in e.reused_from[:4])
        more = len(e.reused_from) - 4
        line += f"\n{'':<25}composed from: {shown}" + (f" and {more} more" if more > 0 else "")
    return line


def _waiting_group(e: ObjectDeferred) -> str:
    """The line a deferred object is counted under: its directory and why it waits (the age of
    each file left out, so a directory being written is one line)."""
    directory = e.key.rpartition("/")[0] + "/" if "/" in e.key else "(top level)"
    return f"{directory}: {_AGE.sub('modified', e.reason)}"


_AGE = re.compile(r"modified \d+s ago")


class PlanSummary:
    """A plan at a glance: objects and bytes per action and per top-level directory, the
    deltas, and what waits for its checkpoint to complete (grouped by why)."""

    def __init__(self) -> None:
        self.by_action: dict[str, list[int]] = {}
        self.by_dir: dict[str, dict[str, list[int]]] = {}
        self.deltas: list[DeltaPlanned] = []  # the SHOWN first by key (more between trims)
        self.delta_count = 0
        self.waiting: dict[str, list[int]] = {}  # reason -> [objects, bytes]
        self.retention: list[CheckpointKept | CheckpointPruned] = []

    def emit(self, event: Event) -> None:
        if isinstance(event, DeltaPlanned):
            self.delta_count += 1
            self.deltas.append(event)
            if len(self.deltas) >= 4 * SHOWN:  # bounded, whatever the number of deltas
                self.deltas = sorted(self.deltas, key=lambda d: d.key)[:SHOWN]
        elif isinstance(event, ObjectDeferred):
            why = _waiting_group(event)
            if len(self.waiting) < SHOWN or why in self.waiting:
                tally = self.waiting.setdefault(why, [0, 0])
                tally[0] += 1
                tally[1] += event.size
            return
        if isinstance(event, CheckpointKept | CheckpointPruned):
            if len(self.retention) < 4 * SHOWN:
                self.retention.append(event)
            return
        if not isinstance(event, ObjectPlanned):
            return
        tally = self.by_action.setdefault(event.action, [0, 0])
        tally[0] += 1
        tally[1] += event.size
        top = event.key.split("/", 1)[0] + "/" if "/" in event.key else "(top level)"
        if len(self.by_dir) < SHOWN or top in self.by_dir:  # bounded, whatever the key count
            d = self.by_dir.setdefault(top, {}).setdefault(event.action, [0, 0])
            d[0] += 1
            d[1] += event.size

    def close(self) -> None:
        click.echo(f"{'action':<12} {'objects':>10} {'bytes':>12}")
        for action in ("copy", "server_copy", "delete", "skip"):
            n, size = self.by_action.get(action, (0, 0))
            click.echo(f"{action:<12} {n:>10} {format_size(size):>12}")
        if self.waiting:
            n = sum(v[0] for v in self.waiting.values())
            size = sum(v[1] for v in self.waiting.values())
            click.echo(f"{'wait':<12} {n:>10} {format_size(size):>12}")
        if len(self.by_dir) > 1:
            click.echo("")
            click.echo(f"{'directory':<28} {'changes':>10} {'bytes to move':>14} {'skipped':>9}")
            for top, actions in sorted(self.by_dir.items()):
                moving = [v for a, v in actions.items() if a != "skip"]
                n = sum(v[0] for v in moving)
                size = sum(v[1] for v in moving)
                skipped = actions.get("skip", [0, 0])[0]
                click.echo(f"{top[:28]:<28} {n:>10} {format_size(size):>14} {skipped:>9}")
        if self.deltas:
            click.echo("")
            click.echo(f"block delta for {counted(self.delta_count, 'changed object')}:")
            for d in sorted(self.deltas, key=lambda d: d.key)[:SHOWN]:
                click.echo(delta_line(d))
        if self.waiting:
            click.echo("")
            click.echo("waiting (not copied until complete; a later run takes them):")
            for why, (n, size) in sorted(self.waiting.items()):
                click.echo(f"  {counted(n, 'object'):>14} {format_size(size):>10}  {why}")
        if self.retention:
            click.echo("")
            click.echo("retention at the target (--keep-last):")
            for e in self.retention[:SHOWN]:
                click.echo(f"  {e.directory:<40} {fate_of(e)}")
