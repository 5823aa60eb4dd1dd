"""Small immutable records that flow between the stages of a sync."""

from __future__ import annotations

from dataclasses import dataclass

# A block of object bytes as stores hand them out and take them (obstore.Bytes is a buffer too).
Buffer = bytes | bytearray | memoryview

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB

RESERVED_PREFIX = ".mcsync/"  # mcsync's own state at a target: never synced or deleted as data


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
class Level:
    """One level of a store under a prefix, as S3 lists it with the delimiter "/": the objects
    directly there and the subdirectories (each a key prefix ending in "/"), in byte order."""

    files: tuple[ObjectInfo, ...]
    dirs: tuple[str, ...]


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
    """The numbers that bound how a store may be written. What a store can *do* beyond the
    required operations is told by the protocols it implements (``stores.base``), never here.
    The defaults are S3's limits."""

    min_part_size: int = 5 * MiB  # every part of an upload but the last
    max_part_size: int = 5 * GiB
    max_parts: int = 10_000
    # The largest object one server-side copy request copies whole (S3 CopyObject: 5 GiB);
    # larger ones are copied as parts.
    max_copy_size: int = 5 * GiB
    # Copies of a part the store's client holds while sending it (botocore + aiohttp copy a
    # part body once more on its way to the socket); parts are charged this many times their
    # size against the memory budget, so the budget bounds real memory.
    send_copies: int = 1


@dataclass(frozen=True, slots=True)
class StoreFacts:
    """What the engine must know of where a store's data lives, named as facts: it branches
    on these, never on a store's type. Every store states them when it is made."""

    # Each request is a round trip over a network: independent requests are worth sending
    # together (the checks, the lock, the manifest's copy) rather than one after another.
    round_trips: bool
    # The bytes read and written cross a network, so ``--bwlimit`` counts them.
    bytes_cross_network: bool
    # A directory renamed into place appears whole at once, so a framework may publish a
    # checkpoint by rename (a filesystem); object stores rename nothing.
    atomic_renames: bool
    # A view of one object of the store under it (``stores.single``): its ``url`` names that
    # object, which is all there is to move, and does not reopen the view (no workers).
    one_object: bool = False


REMOTE = StoreFacts(round_trips=True, bytes_cross_network=True, atomic_renames=False)
LOCAL_DISK = StoreFacts(round_trips=False, bytes_cross_network=False, atomic_renames=True)
