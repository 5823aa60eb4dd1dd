"""The records the run's layers share: what the plan decides for a key (``Action``, from a
``Pair``), what the manifest keeps of an object mcsync wrote (``ManifestEntry``), and what an
upload's parts leave behind (``WrittenPart``, ``OpenUpload``). Records only: no IO, and nothing
here imports a package of mcsync's, so every layer can hold them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from .chunking import chunks_from_sizes, fixed_chunks
from .events import ActionKind
from .hashing import DIGEST_SIZE
from .types import ByteRange, ObjectInfo, PartRef

# "compare" (only with --checksum): metadata is no evidence either way; the engine reads and
# hashes the content (mcsync.move.compare) and turns it into a skip or a copy.
PlanKind = ActionKind | Literal["compare"]


def split_digests(joined: bytes) -> list[bytes]:
    """Concatenated xxh3-128 digests (a journal part's, a record's block_hashes) one by one."""
    return [joined[i:i + DIGEST_SIZE] for i in range(0, len(joined), DIGEST_SIZE)]


def same_source(src: ObjectInfo, size: int, etag: str | None, mtime: float | None) -> bool:
    """Is ``src`` the object a record was made from? ETags identify content where the store
    has them; files (no ETag) are identified by size and mtime."""
    if src.size != size:
        return False
    if src.etag is not None or etag is not None:
        return src.etag == etag
    return src.mtime == mtime


@dataclass(frozen=True, slots=True)
class ManifestEntry:
    key: str
    src_size: int
    src_etag: str | None
    src_mtime: float | None
    src_version: str | None
    dst_size: int
    dst_etag: str | None
    dst_mtime: float | None
    block_size: int  # 0 when no byte passed through us (server-side copy)
    block_hashes: bytes  # DIGEST_SIZE bytes per chunk
    xxh3: str | None
    crc32c: str | None
    written_at: float
    # Chunk lengths (little-endian u64 each) when the object was cut by content (by tensor, or
    # content-defined); empty when it was cut in fixed blocks of ``block_size``.
    chunk_sizes: bytes = b""
    chunker: str = "fixed"  # how the chunks were cut: fixed, safetensors or cdc (chunking)

    def matches_source(self, src: ObjectInfo) -> bool:
        return same_source(src, self.src_size, self.src_etag, self.src_mtime)

    def matches_target(self, dst: ObjectInfo) -> bool:
        """Is the target object still the one mcsync wrote?"""
        if dst.size != self.dst_size:
            return False
        if self.dst_etag is not None:
            return dst.etag == self.dst_etag
        return self.dst_mtime is not None and dst.mtime == self.dst_mtime

    def as_target(self) -> ObjectInfo:
        return ObjectInfo(self.key, self.dst_size, self.dst_etag, self.dst_mtime)

    def chunks(self) -> list[tuple[ByteRange, bytes]]:
        """The recorded chunks of the target object with their digests; empty when none were
        recorded (a server-side copy, an adopted object)."""
        if self.block_size <= 0 or not self.block_hashes:
            return []
        ranges = (chunks_from_sizes(self.chunk_sizes) if self.chunk_sizes
                  else fixed_chunks(self.dst_size, self.block_size))
        digests = split_digests(self.block_hashes)
        if len(digests) != len(ranges) or (ranges and ranges[-1].end != self.dst_size):
            return []  # inconsistent record: treat as none
        return list(zip(ranges, digests, strict=True))


@dataclass(frozen=True, slots=True)
class Pair:
    """One key as the source, the target and the manifest know it. In a run that trusts the
    manifest the target is not listed, so ``dst`` is None and ``known`` speaks for it."""

    key: str
    src: ObjectInfo | None
    dst: ObjectInfo | None
    known: ManifestEntry | None = None
    # A killed run's upload of this key is in the journal: whether it completed is the
    # journal's to say (``Uploads.recognise``), not the target's size and time.
    journalled: bool = False


@dataclass(frozen=True, slots=True)
class Action:
    kind: PlanKind
    key: str
    src: ObjectInfo | None
    dst: ObjectInfo | None
    reason: str
    # A changed object mcsync wrote before: the record of the target's version, from which a
    # block delta composes the new one (the transfer checks the target is still that version).
    known: ManifestEntry | None = None

    @property
    def size(self) -> int:
        info = self.src or self.dst
        return info.size if info else 0


@dataclass(frozen=True, slots=True)
class WrittenPart:
    """A part the target acknowledged: what a part's move returns, and what the journal keeps
    of it so a killed run's upload is resumed (the plan of a part is ``delta.Part``)."""

    number: int
    etag: str
    size: int
    digest: bytes = b""  # the xxh3-128 of each chunk of the part, concatenated (b"": none known)

    @classmethod
    def of(cls, ref: PartRef, digests: Sequence[bytes] = ()) -> WrittenPart:
        """``digests``: of the part's chunks, when its bytes passed through the client."""
        return cls(ref.number, ref.etag, ref.size, b"".join(digests))

    @property
    def ref(self) -> PartRef:
        return PartRef(self.number, self.etag, self.size)

    def digests(self) -> list[bytes]:
        return split_digests(self.digest)


@dataclass(frozen=True, slots=True)
class OpenUpload:
    key: str
    upload_id: str
    src_size: int
    src_etag: str | None
    src_mtime: float | None
    part_size: int
    created_at: float
    layout: str | None = None  # how the parts were cut; None: fixed parts of part_size
    parts: dict[int, WrittenPart] = field(default_factory=dict)

    def matches_source(self, src: ObjectInfo) -> bool:
        return same_source(src, self.src_size, self.src_etag, self.src_mtime)
