"""Small immutable records that flow between the stages of a sync."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    """One object as a store lists it. ``key`` is relative to the store's root prefix."""

    key: str
    size: int
    etag: str | None = None
    mtime: float | None = None  # seconds since the epoch, UTC
    version: str | None = None  # a store's own version id (GCS generation), if it has one
    crc32c: str | None = None  # base64 big-endian CRC32C, where the store keeps one (GCS)


@dataclass(frozen=True, slots=True)
class ByteRange:
    """The half-open byte range [start, end)."""

    start: int
    end: int

    @property
    def length(self) -> int:
        return self.end - self.start


@dataclass(frozen=True, slots=True)
class PartRef:
    """A part written into a multipart upload (or a local temporary file)."""

    number: int  # 1-based, as S3 numbers parts
    etag: str
    size: int


@dataclass(frozen=True, slots=True)
class PartClaim:
    """A part the journal says was written: a resumed upload confirms it before trusting it."""

    ref: PartRef
    offset: int
    digest: bytes  # xxh3-128 of each chunk of the part, concatenated (b"": not known)
    chunks: tuple[int, ...] = ()  # the chunks' lengths when the part has more than one


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What a store can do beyond the required operations; the engine checks these."""

    multipart: bool = True
    server_side_copy: bool = False
    min_part_size: int = 5 * 1024 * 1024
    max_part_size: int = 5 * 1024 * 1024 * 1024
    max_parts: int = 10_000
    # Copies of a part the store's client holds while sending it (botocore + aiohttp copy a
    # part body once more on its way to the socket); parts are charged this many times their
    # size against the memory budget, so the budget bounds real memory.
    send_copies: int = 1
    # Can build a new version of an object from ranges of its current version (S3
    # UploadPartCopy with a range; copy_file_range for files): the block delta's target side.
    compose: bool = False
    # Uploads are files written at offsets (base.FileUpload): parts can stream into them.
    writes_in_place: bool = False
