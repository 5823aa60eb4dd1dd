"""``verify --against``: the cache's entries compared with the hashes mcsync recorded when it
wrote their objects to a target, closing the chain source → target → node.

A sync records, per object written, the xxh3-128 of each chunk of the bytes it sent (the
manifest; a copy is kept at the target, ``.mcsync/manifest-*.sqlite``). An entry cached from
that target is re-read chunk by chunk and each digest compared with the recorded one: a byte
changed anywhere on the way (at the target, on the wire, on this node's disk) is found, which
the entry's own digest cannot do for a byte changed before the cache fetched it. An entry the
manifest has no hashes for (not synced by mcsync, copied server-side, or of another version
than the one recorded) is checked against its own digest, as ``verify`` does. An entry that
fails is dropped.

Where the records come from is the caller's (``run/target_manifests.py`` fetches the copies
kept at a target): this layer reads no manifest.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Protocol

import xxhash

from ..records import ManifestEntry
from ..types import ByteRange
from .files import Layout
from .fill import rehash
from .index import Entry

READ = 8 << 20  # bytes hashed per read of a large chunk


class Recorded(Protocol):
    """What mcsync recorded at a target: ``url`` the target (``scheme://bucket/prefix/``),
    ``get`` the record of a key under it, or None."""

    url: str

    def get(self, key: str) -> ManifestEntry | None: ...


@dataclass(slots=True)
class AgainstReport:
    target: str
    recorded: int = 0  # entries compared with the manifest's chunk hashes
    unrecorded: int = 0  # entries the manifest has no hashes for: their own digest checked
    bad: list[tuple[Entry, str]] = field(default_factory=list)  # dropped, and why


def target_of(recorded: Recorded) -> str:
    return recorded.url if recorded.url.endswith("/") else recorded.url + "/"


def verify_against(entries: Iterable[Entry], layout: Layout, recorded: Recorded,
                   drop: Callable[[Entry], None]) -> AgainstReport:
    """Check every complete entry of ``entries`` (those under ``recorded.url``); ``drop``
    those that fail. Blocking."""
    target = target_of(recorded)
    report = AgainstReport(target)
    for entry in entries:
        if entry.state != "complete" or not entry.url.startswith(target):
            continue
        record = recorded.get(entry.url[len(target):])
        path = str(layout.object(entry.id))
        try:
            if record is not None and record.chunks() and _same_version(entry, record):
                report.recorded += 1
                problem = against_record(path, record)
            else:
                report.unrecorded += 1
                problem = against_own_digest(path, entry)
        except FileNotFoundError:
            problem = "file missing"
        if problem is not None:
            report.bad.append((entry, problem))
            drop(entry)
    return report


def _same_version(entry: Entry, record: ManifestEntry) -> bool:
    """Whether the entry holds the version the manifest recorded (its ETag, where both have
    one): another version's bytes are not the recorded ones, and are no fault of the cache."""
    if entry.size != record.dst_size:
        return False
    return entry.etag is None or record.dst_etag is None or entry.etag == record.dst_etag


def against_record(path: str, record: ManifestEntry) -> str | None:
    """What is wrong with the file at ``path`` as the object ``record`` describes, or None."""
    chunks = record.chunks()
    with open(path, "rb", buffering=0) as f:
        size = os.fstat(f.fileno()).st_size
        if size != record.dst_size:
            return f"size {size}, the manifest says {record.dst_size}"
        bad = [rng for rng, want in chunks if _digest(f.fileno(), rng) != want]
    if bad:
        return (f"differs from what mcsync wrote to the target in {len(bad)} of "
                f"{len(chunks)} chunks (first at byte {bad[0].start})")
    return None


def against_own_digest(path: str, entry: Entry) -> str | None:
    found = rehash(path, entry)
    if found == entry.digest:
        return None
    return f"size {found[5:]} of {entry.size}" if found.startswith("size ") else \
        "digest mismatch (not what was fetched)"


def _digest(fd: int, rng: ByteRange) -> bytes:
    state = xxhash.xxh3_128()
    pos = rng.start
    while pos < rng.end:
        data = os.pread(fd, min(READ, rng.end - pos), pos)
        if not data:
            break
        state.update(data)
        pos += len(data)
    return state.digest()
