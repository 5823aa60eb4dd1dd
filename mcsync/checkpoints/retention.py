"""Retention at the target: which checkpoints ``--keep-last N`` and ``--keep-every K`` keep.

Pure rules, no IO (``run/prune.py`` scans the target and deletes). As Orbax's
``CheckpointManager`` combines its policies, a checkpoint is kept when any rule keeps it: the
last N complete checkpoints by step, every checkpoint whose step is a multiple of K, the one a
root marker names (DeepSpeed's ``latest``, Megatron's tracker file: what a restarted trainer
loads), one whose directory carries no step, and one not complete yet that is newer than the
Nth newest complete one (it may be the checkpoint on its way). Everything else is dropped
only once N complete checkpoints newer than it are at the target, so a checkpoint is never
deleted before the ones replacing it are complete there, and the newest complete one never is.

``--prune-optimizer-older-than M`` thins the kept checkpoints older than the last M complete
ones to their model weights, for the frameworks whose optimizer states are files of their own
(``OPTIMIZER_FILES``); the others are left whole.
"""

from __future__ import annotations

import bisect
import fnmatch
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

__all__ = ["OPTIMIZER_FILES", "Checkpoint", "Decision", "Policy", "decide", "fate",
           "is_optimizer_file"]

# Per framework, the files that hold optimizer states alone (globs on the path under the
# checkpoint's directory). DCP, Orbax and NeMo mix weights and optimizer in the same shards
# (and Megatron's non-distributed model_optim_rng.pt holds both): not thinned.
OPTIMIZER_FILES: dict[str, tuple[str, ...]] = {
    "DeepSpeed": ("*optim_states.pt",),
    "Hugging Face Trainer": ("optimizer.pt", "optimizer.bin", "optimizer_*.bin"),
    "Megatron-LM": ("*/distrib_optim.pt", "distrib_optim.pt"),
}


def is_optimizer_file(framework: str, path: str) -> bool:
    """Is ``path`` (under a checkpoint directory of ``framework``) optimizer states only?"""
    return any(fnmatch.fnmatchcase(path, glob) or fnmatch.fnmatchcase(path.rsplit("/", 1)[-1],
                                                                      glob)
               for glob in OPTIMIZER_FILES.get(framework, ()))


@dataclass(frozen=True, slots=True)
class Policy:
    """``keep_last``: N ≥ 1; ``keep_every``: K steps (None: no such rule);
    ``optimizer_older_than``: M (None: checkpoints stay whole)."""

    keep_last: int
    keep_every: int | None = None
    optimizer_older_than: int | None = None


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """A checkpoint directory (a key prefix ending in "/") as found at a store."""

    directory: str
    framework: str
    step: int | None
    complete: bool
    objects: int = 0
    bytes: int = 0


@dataclass(frozen=True, slots=True)
class Decision:
    """What retention does with a checkpoint: ``keep`` it (``reason`` says which rule), and
    if kept, whether to ``thin`` it to its weights; else it is pruned."""

    checkpoint: Checkpoint
    keep: bool
    reason: str
    thin: bool = False


def decide(checkpoints: Iterable[Checkpoint], policy: Policy,
           named: Sequence[str] = ()) -> list[Decision]:
    """Each checkpoint's fate, newest step first. ``named``: the directories a root marker
    names (kept whatever the rules say)."""
    found = list(checkpoints)
    numbered = sorted((c for c in found if c.step is not None),
                      key=lambda c: (c.step, c.directory), reverse=True)
    steps = sorted(c.step for c in numbered if c.complete and c.step is not None)
    out = [fate(c, policy, steps, named) for c in numbered]
    out.extend(Decision(c, True, "kept: no step in its name") for c in found if c.step is None)
    return out


def fate(c: Checkpoint, policy: Policy, complete_steps: Sequence[int],
         named: Sequence[str] = ()) -> Decision:
    """One checkpoint's fate among the complete ones at the target (``complete_steps``,
    ascending; ``c``'s own among them when it is complete there)."""
    if c.step is None:
        return Decision(c, True, "kept: no step in its name")
    newer = len(complete_steps) - bisect.bisect_right(complete_steps, c.step)
    if c.complete and newer < policy.keep_last:
        reason = f"kept: last {policy.keep_last}"
    elif policy.keep_every and c.step % policy.keep_every == 0:
        reason = f"kept: every {policy.keep_every}"
    elif c.directory in named:
        reason = "kept: named by the root marker"
    elif not c.complete and newer < policy.keep_last:
        reason = "kept: not complete yet"
    else:
        return Decision(c, False, "pruned")
    m = policy.optimizer_older_than
    thin = (m is not None and c.complete and newer >= max(m, 1)
            and c.framework in OPTIMIZER_FILES and c.directory not in named)
    return Decision(c, True, reason, thin)
