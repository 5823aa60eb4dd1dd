"""The Store protocols: what a backend offers the engine.

A store is rooted at a location (a directory, or a bucket + prefix); keys are POSIX-style paths
relative to that root. Listing yields keys in UTF-8 byte order, which for Python ``str`` is
plain code-point order, so two listings can be merge-joined in one pass.

Two required sides and a few optional abilities (as rclone's ``Fs`` and its optional features):

* ``ReadStore`` — every store: list, head, get, check, aclose. A source needs no more.
* ``Store`` — a target: ``ReadStore`` plus put, uploads in parts, delete, key validation.
* Abilities, each a protocol the engine discovers with ``isinstance`` (never a flag):
  ``RangeStreamer`` (a range's bytes in pieces as they arrive), ``ReadsInto`` (a range into
  a buffer the caller reuses), ``ServerSideCopier`` (copy
  from another store on the same endpoint, no byte through the client), ``Composer`` (build
  a new version of an object from ranges of the version it holds: the block delta),
  ``ScratchSpace`` (clear mcsync's own scratch objects under a prefix) and ``FileTarget``
  (uploads that are files written at offsets, so parts stream into them).

``Capabilities`` holds only numbers: the part-size limits every upload is laid out within; a
target has them, a source needs none. ``StoreFacts`` names what the engine must know of where
a store's data lives (round trips, bytes over a network, atomic renames): it branches on those,
never on a store's type. Both are fixed when a store is made: no ability or fact is switched
on by a call made earlier.

A store that wraps another (tests' ``FaultyStore``) must offer exactly the abilities of what
it wraps: since Python 3.12 ``isinstance`` looks a protocol's methods up statically, so a
``__getattr__`` that forwards everything claims nothing.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Collection, Iterator, Sequence
from pathlib import Path
from typing import Any, Literal, Protocol, runtime_checkable

from ..types import (
    Buffer,
    ByteRange,
    Capabilities,
    Level,
    ObjectInfo,
    PartClaim,
    PartRef,
    StoreFacts,
)

__all__ = [
    "Buffer",
    "CaseFolding",
    "CheckMode",
    "Composer",
    "CopySource",
    "FileTarget",
    "FileUpload",
    "LevelLister",
    "LocalTree",
    "PartCopyUpload",
    "RangeStreamer",
    "ReadStore",
    "ReadsInto",
    "ScratchSpace",
    "ServerSideCopier",
    "Store",
    "TempFileSweeper",
    "Upload",
]

# What a check asks of a root: readable (a source), writable (a target, created if needed) or
# usable by a dry run (a target that may not exist yet; nothing is created).
CheckMode = Literal["read", "write", "plan"]


# -- uploads ---------------------------------------------------------------------------------


@runtime_checkable
class Upload(Protocol):
    """One object being written in parts; invisible to readers until ``complete``."""

    upload_id: str

    async def put_part(self, number: int, offset: int, data: Buffer, *,
                       crc32c: int | None = None) -> PartRef:
        """Write part ``number`` (``offset`` bytes into the object). ``crc32c``: ``data``'s
        CRC32C when the caller summed it already, so a checksum the target verifies is not
        summed a second time."""
        ...

    async def confirm_parts(self, claims: Sequence[PartClaim]) -> set[int]:
        """Of the parts a journal claims were written, the numbers the target really holds
        intact (S3: ListParts; files: the bytes re-read and hashed)."""
        ...

    async def complete(self, parts: Sequence[PartRef]) -> ObjectInfo:
        """Make the object visible, whole. Completing it twice through the same handle, or
        after it was aborted, raises NotFound. (S3 answers a repeated Complete with success,
        for retries, so through two handles of one upload the second may succeed; the object
        stays the first one's.)"""
        ...

    async def abort(self) -> None:
        """Drop the upload and what it holds; aborting one already finished is fine."""
        ...


class CopySource(Protocol):
    """Where a copy at the target reads from. Each store knows its own kind of source (S3:
    bucket, key and ETag; files: a path, size and mtime)."""

    key: str


@runtime_checkable
class PartCopyUpload(Upload, Protocol):
    """An upload that takes parts from an object the target can read itself (S3
    UploadPartCopy; for files, copy_file_range)."""

    async def copy_part(self, number: int, offset: int, source: CopySource,
                        rng: ByteRange) -> PartRef:
        """Part ``number``, written at ``offset`` of the new object, is bytes ``rng`` of
        ``source``; raises PreconditionFailed when the source is not the version named, or
        is gone."""
        ...


@runtime_checkable
class FileUpload(Upload, Protocol):
    """An upload that is one file written at offsets (local and mounted filesystems), so a
    part can be written piece by piece as its bytes arrive instead of buffered whole."""

    def write_at(self, offset: int, data: Buffer) -> None:
        """Blocking, for a worker thread; safe from several threads at once. Raises OSError
        once the upload is completed or aborted (a late writer never reaches another file)."""
        ...

    def part_written(self, number: int, size: int) -> PartRef:
        """The part ``number`` of ``size`` bytes, all given to ``write_at``."""
        ...


# -- the two sides ---------------------------------------------------------------------------


@runtime_checkable
class ReadStore(Protocol):
    """What every store offers: enough to be a source."""

    url: str  # for messages: never contains credentials
    facts: StoreFacts

    def list(self) -> AsyncIterator[ObjectInfo]: ...

    async def head(self, key: str) -> ObjectInfo: ...

    async def get(
        self, key: str, rng: ByteRange | None = None, *, expect: ObjectInfo | None = None
    ) -> Buffer:
        """Read ``key`` (or a range of it). With ``expect`` — the ObjectInfo this store listed —
        the read is pinned to that version (S3 If-Match on the ETag, GCS ifGenerationMatch,
        size + mtime for files) and raises PreconditionFailed if the object changed since, so
        an object is never stitched together from two versions."""
        ...

    async def check(self, *, mode: Literal["read"]) -> None:
        """Fail fast with ConfigError when the root cannot be read (it must exist). The only
        operation that turns a failure into a configuration error: the others raise the
        per-object errors."""
        ...

    async def aclose(self) -> None: ...


@runtime_checkable
class Store(ReadStore, Protocol):
    """A store that can be written: a target."""

    caps: Capabilities

    async def check(self, *, mode: CheckMode) -> None:
        """``ReadStore.check``, and as a target: ``write`` (create the root if needed) or
        ``plan`` (a dry run's target: it may not exist yet, and nothing is created)."""
        ...

    async def put(self, key: str, data: Buffer, *, mtime: float | None = None,
                  crc32c: int | None = None) -> ObjectInfo:
        """Write a whole object. ``mtime`` is the source's; stores that can keep it do.
        ``crc32c``: ``data``'s CRC32C when it is known already (as ``Upload.put_part``)."""
        ...

    async def open_upload(self, key: str, size: int, *, mtime: float | None = None) -> Upload:
        ...

    async def resume_upload(
        self, key: str, upload_id: str, size: int, *, mtime: float | None = None
    ) -> Upload | None:
        """Reattach to an upload a previous run opened; None when it no longer exists."""
        ...

    async def abort_upload(self, key: str, upload_id: str) -> None:
        """Abort an upload a previous run opened, whatever state it is in (gone is fine)."""
        ...

    async def delete(self, key: str) -> None:
        """Delete ``key``; a key that is not there is fine."""
        ...

    def validate_key(self, key: str) -> None:
        """Raise UnsafeKey when ``key`` cannot be written here; called before any byte of it
        is read, so a refused key costs no transfer."""
        ...


# -- optional abilities ----------------------------------------------------------------------


@runtime_checkable
class RangeStreamer(Protocol):
    """A store that hands out a range's bytes in pieces as they come off the wire."""

    async def open_range(
        self, key: str, rng: ByteRange, *, expect: ObjectInfo | None = None
    ) -> Iterator[Buffer]:
        """Request ``rng`` of ``key`` (pinned to ``expect`` as ``get`` is) and return its body
        as a blocking iterator of pieces, for a worker thread to drain. The iterator raises
        Transient if the range comes back short or long."""
        ...


@runtime_checkable
class ReadsInto(Protocol):
    """A store that reads a range into a buffer the caller owns (files: ``preadv``), so parts
    read from it reuse the run's buffers instead of allocating one each."""

    async def read_into(self, key: str, rng: ByteRange, buf: bytearray, *,
                        expect: ObjectInfo | None = None) -> memoryview:
        """Bytes ``rng`` of ``key`` (pinned to ``expect`` as ``get`` is) into the start of
        ``buf``, which is at least ``rng.length`` long; returns the view of them."""
        ...


@runtime_checkable
class LocalTree(Protocol):
    """A store that is a directory on this machine: its changes can be watched (``--watch``
    wakes on file-system events), and two roots can be told nested."""

    root: Path


@runtime_checkable
class CaseFolding(Protocol):
    """A store whose names may be folded by case where they are kept (a directory: its file
    system may find a file by another case of its name). Such a target tells two keys apart
    only by what one process remembers writing, so one process writes it."""

    def folds_case(self) -> bool:
        """Whether it does (a probe, made once; blocking). Raises OSError when it cannot
        tell."""
        ...


@runtime_checkable
class LevelLister(Protocol):
    """A store that lists one level at a time (S3's delimiter, a directory's entries): a
    directory of many checkpoints is told apart without listing every key under it
    (``--latest-checkpoint``)."""

    async def list_level(self, prefix: str) -> Level:
        """The objects directly under ``prefix`` ("" or a key prefix ending in "/") and its
        subdirectories; an empty level when nothing is there."""
        ...


@runtime_checkable
class TempFileSweeper(Protocol):
    """A store whose writes go through hidden temporary files that a killed run leaves behind:
    the next run of the pair removes them."""

    async def sweep_temp_files(self, keep: Collection[str] = (), *,
                               older_than: float | None = None) -> list[str]:
        """Remove leftovers but those in ``keep`` (journalled upload ids) and those modified
        since ``older_than``; the paths removed."""
        ...


@runtime_checkable
class ServerSideCopier(Store, Protocol):
    """A target that can copy from another store on the same endpoint without the bytes
    passing through this client (S3 CopyObject / UploadPartCopy)."""

    def can_copy_from(self, other: ReadStore) -> bool:
        """True when ``other``'s objects can be copied here server-side (``other`` is then a
        ServerSideCopier too)."""
        ...

    def copy_source(self, key: str, etag: str | None) -> CopySource:
        """``key`` of this store as the source of a copy, pinned to ``etag`` if given."""
        ...

    async def copy_object(self, source: CopySource, key: str) -> ObjectInfo:
        """Copy a whole object of at most ``caps.max_copy_size`` bytes."""
        ...

    async def open_upload(
        self, key: str, size: int, *, mtime: float | None = None
    ) -> PartCopyUpload: ...


@runtime_checkable
class Composer(Store, Protocol):
    """A target that builds a new version of an object from ranges of its current one."""

    def compose_source(self, current: ObjectInfo) -> CopySource:
        """The current version of ``current.key``, pinned: a copy from it fails with
        PreconditionFailed once the object is no longer ``current`` (ETag; size + mtime)."""
        ...

    async def open_upload(
        self, key: str, size: int, *, mtime: float | None = None
    ) -> PartCopyUpload: ...


@runtime_checkable
class ScratchSpace(Store, Protocol):
    """A target where mcsync may keep scratch objects of its own (a block delta's staging
    objects) and sweep them."""

    async def clear(self, prefix: str) -> None:
        """Abort the open uploads and delete the objects under ``prefix``."""
        ...


@runtime_checkable
class FileTarget(Store, Protocol):
    """A filesystem target: its uploads are files written at offsets."""

    async def open_file(self, key: str, size: int, *, mtime: float | None = None) -> FileUpload:
        """``open_upload``, typed for what it is here: parts may be written piece by piece."""
        ...

    async def resume_upload(
        self, key: str, upload_id: str, size: int, *, mtime: float | None = None
    ) -> FileUpload | None: ...


_ABILITIES: dict[tuple[type, Any], bool] = {}


def has(thing: object, ability: Any) -> bool:
    """``isinstance(thing, ability)`` for the abilities above, asked once per class: they are
    methods of a store's (or an upload's) class, fixed when it is made, while on Python 3.11
    a protocol's ``isinstance`` walks every member of it at each call, which the per-object
    path (an upload wrapped, a part sender made) paid several times an object. (No type
    narrowing: mypy takes no protocol class for ``type[T]``; ``cast`` where it is needed.)"""
    key = (type(thing), ability)
    found = _ABILITIES.get(key)
    if found is None:
        found = _ABILITIES[key] = isinstance(thing, ability)
    return found
