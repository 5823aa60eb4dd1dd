"""Which objects at the target a block delta composes a new object from. Pure: no IO.

The object's own previous version comes first (the delta of a changed key). Then objects
that share its chunks, found in the pair's chunk index (``index``): training writes a new
directory every N steps (``step-1200/``, ``step-1300/``) and a fine-tune shares most tensors
with its base, so a new ``step-1300/model.safetensors`` is mostly ``step-1200``'s. Preferred,
in order: the same file name in a sibling directory (the most recently written first), then
any other object by how many of the new object's chunks it holds — fewer distinct sources make
fewer, larger part copies. ``--delta-scope`` bounds the search: ``key`` (its own previous
version only), ``prefix`` (objects under the same parent as the object's directory: the
run's other steps) or ``target`` (the whole pair).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ..records import ManifestEntry
from ..types import ByteRange, ObjectInfo

MAX_BASES = 8  # other objects one delta may copy from (each is a source of part copies)

Chunk = tuple[ByteRange, bytes]


@dataclass(frozen=True, slots=True)
class Base:
    """An object at the target that a delta copies ranges from, at its recorded version."""

    key: str
    info: ObjectInfo  # the version copied from: a copy from it is refused once it changed
    chunks: Sequence[Chunk]
    own: bool = False  # the new object's own previous version

    @property
    def name(self) -> str:
        """What identifies it in an upload's layout (a resumed upload continues only with
        the same bases at the same versions)."""
        return f"{self.key}@{self.info.etag or self.info.mtime}:{self.info.size}"


def scope_root(key: str) -> str:
    """The parent of the key's directory: ``run-7`` for ``run-7/step-1300/model.bin``."""
    parts = key.split("/")
    return "/".join(parts[:-2])


def in_scope(candidate: str, key: str, scope: str) -> bool:
    if candidate == key or scope == "key":
        return False
    return scope == "target" or scope_root(candidate) == scope_root(key)


def rank(key: str, hits: Mapping[str, int], records: Mapping[str, ManifestEntry],
         scope: str) -> list[str]:
    """The other objects to copy from, best first, at most ``MAX_BASES``: same file name in a
    sibling directory (most recent first), then by chunks held (most first), then by key."""
    name = key.rsplit("/", 1)[-1]
    root = scope_root(key)

    def order(candidate: str) -> tuple[int, float, int, str]:
        record = records[candidate]
        sibling = (candidate.rsplit("/", 1)[-1] == name and scope_root(candidate) == root)
        return (0 if sibling else 1, -record.written_at if sibling else 0.0, -hits[candidate],
                candidate)

    usable = [c for c in hits if c in records and in_scope(c, key, scope)]
    return sorted(usable, key=order)[:MAX_BASES]


def samples(chunks: Sequence[ByteRange], header: bool) -> list[ByteRange]:
    """Chunks of a new object to read and look up before reading all of it: its first chunk
    of data (after a safetensors ``header``) and its middle one. When neither is anywhere at
    the target the object goes whole, for the cost of these two reads; a checkpoint sharing
    most tensors with an earlier one is found (at 90% shared, both miss one time in 100)."""
    data = [c for c in chunks[1 if header else 0:] if c.length] or list(chunks)
    picked = {0, len(data) // 2}
    return [data[i] for i in sorted(picked)]
