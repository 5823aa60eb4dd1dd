"""Which keys are one shard's (``--shard I/N``): pure, no IO, the same in every process.

Shards are numbered from 0, as Kubernetes numbers an Indexed Job's pods
(``JOB_COMPLETION_INDEX``), so ``--shard auto`` passes the index on unchanged. A key belongs to
shard ``xxh3-64(key, UTF-8) mod N`` (XXH3's output is fixed by its specification): a hash of
the bytes alone, so Python's hash seed, the run order and the machine change nothing. Every key
is hashed on its own, so the shard files of one checkpoint directory (the common 500 GB
directory) spread over the pods; a large object is one key: one shard sends it. A checkpoint's
completion markers are the exception, written by whichever shard finishes last once every file
of the checkpoint is at the target (``run/markers.py``).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

import xxhash

from ..errors import UsageError

INDEX_VAR = "JOB_COMPLETION_INDEX"  # set by Kubernetes in an Indexed Job's pods
COUNT_VAR = "JOB_COMPLETIONS"  # set in the pod template to the Job's completions

Shard = tuple[int, int]  # (index, count), 0 <= index < count


def parse(text: str, environ: Mapping[str, str] | None = None) -> Shard:
    """``"I/N"``, or ``"auto"``: the index from JOB_COMPLETION_INDEX and the count from
    JOB_COMPLETIONS. Raises UsageError naming what is missing or malformed."""
    if text.strip() == "auto":
        env = os.environ if environ is None else environ
        index = _number(env, INDEX_VAR, "Kubernetes sets it in an Indexed Job's pods")
        count = _number(env, COUNT_VAR, "set it in the pod template to the Job's completions")
        if not 0 <= index < count:
            raise UsageError(f"--shard auto: {INDEX_VAR}={index} is not below "
                             f"{COUNT_VAR}={count}")
        return index, count
    match = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text)
    if match is None:
        raise UsageError(f"--shard takes I/N (e.g. 0/8, numbered from 0) or auto, got {text!r}")
    index, count = int(match.group(1)), int(match.group(2))
    if not 0 <= index < count:
        raise UsageError(f"--shard {text}: I goes from 0 to N - 1 (as {INDEX_VAR})")
    return index, count


def _number(env: Mapping[str, str], name: str, hint: str) -> int:
    value = env.get(name)
    if value is None or not value.strip():
        raise UsageError(f"--shard auto: {name} is not set ({hint})")
    if not value.strip().isdigit():
        raise UsageError(f"--shard auto: {name} is not a whole number: {value!r}")
    return int(value)


def shard_of(key: str, count: int) -> int:
    """The shard ``key`` belongs to, of ``count``."""
    if count == 1:
        return 0
    return xxhash.xxh3_64_intdigest(key.encode("utf-8", "surrogatepass")) % count


def sharded(shard: Shard | None) -> bool:
    """Does ``shard`` split the keys (not None, not 1 of 1)?"""
    return shard is not None and shard[1] > 1


def holds(shard: Shard | None, key: str) -> bool:
    """Is ``key`` this shard's to touch (copy, skip, record, delete)?"""
    return shard is None or shard_of(key, shard[1]) == shard[0]


def suffix(shard: Shard | None) -> str:
    """What a shard adds to the names of its state (manifest, lock, the manifest's copy): ""
    for no shard and for 1 of 1, so a single shard is the run without --shard."""
    if shard is None or shard[1] == 1:
        return ""
    return f".shard-{shard[0]}-of-{shard[1]}"


def of_name(name: str) -> Shard | None:
    """The shard whose state a file or object is named for (``suffix``'s inverse), or None."""
    match = re.search(r"\.shard-(\d+)-of-(\d+)\.", name)
    return (int(match.group(1)), int(match.group(2))) if match else None
