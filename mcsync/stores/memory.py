"""``MemoryStore``: an object store in this process's memory, for unit tests of pure logic and
for the store conformance suite (``tests/stores``); never a real target.

It behaves as S3 does: UTF-8 byte-order listing, MD5 ETags (``md5(part MD5s)-N`` for an
upload), reads and copies pinned by ETag, uploads invisible until completed, parts but the
last of at least ``caps.min_part_size``, server-side copies between the stores of one
``MemoryEndpoint`` (prefixes of one bucket). Where S3 would quietly do what an engine should
never ask (a range outside the object, a key ``validate_key`` refuses) it raises. Modification
times come from the endpoint's clock; ``put``'s ``mtime`` is not kept (S3 keeps none).
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass, field

from ..errors import ConfigError, NotFound, Permanent, PreconditionFailed, UnsafeKey
from ..types import (
    REMOTE,
    Buffer,
    ByteRange,
    Capabilities,
    Level,
    ObjectInfo,
    PartClaim,
    PartRef,
    StoreFacts,
)
from .base import CheckMode, ReadStore

__all__ = ["MemoryCopySource", "MemoryEndpoint", "MemoryObject", "MemoryStore", "MemoryUpload"]

_PIECE = 64 * 1024  # open_range hands a range out in pieces of this size
_MAX_KEY_BYTES = 1024  # S3's limit, prefix included


def _md5(data: Buffer) -> bytes:
    return hashlib.md5(data, usedforsecurity=False).digest()


@dataclass(frozen=True, slots=True)
class MemoryObject:
    data: bytes
    etag: str
    mtime: float


@dataclass(slots=True)
class _OpenUpload:
    key: str  # the full key (prefix included)
    parts: dict[int, tuple[bytes, str]] = field(default_factory=dict)  # number → (data, etag)


class MemoryEndpoint:
    """What MemoryStores share, as the prefixes of one S3 endpoint do: the objects by full key,
    the open uploads by id, and the clock that stamps modification times."""

    def __init__(self, name: str = "mem", *, clock: Callable[[], float] = time.time) -> None:
        self.name = name
        self.clock = clock
        self.objects: dict[str, MemoryObject] = {}
        self.uploads: dict[str, _OpenUpload] = {}
        self._ids = itertools.count(1)

    def new_upload_id(self) -> str:
        return f"{self.name}-upload-{next(self._ids)}"


@dataclass(frozen=True, slots=True)
class MemoryCopySource:
    key: str  # the full key on ``endpoint``
    etag: str | None
    endpoint: MemoryEndpoint


class MemoryStore:
    """A prefix of a MemoryEndpoint (a fresh one unless given). Implements ``Store`` and the
    abilities ``RangeStreamer``, ``ServerSideCopier``, ``Composer`` and ``ScratchSpace``."""

    def __init__(self, prefix: str = "", *, endpoint: MemoryEndpoint | None = None,
                 clock: Callable[[], float] | None = None, caps: Capabilities | None = None,
                 exists: bool = True, facts: StoreFacts = REMOTE) -> None:
        """``caps``: S3's limits unless given (tests may want small parts). ``exists=False``: a
        root that is not there yet (``check(mode="read")`` fails until a ``write`` check).
        ``facts``: an object store's unless given (a test may stand it in for a directory)."""
        if endpoint is not None and clock is not None:
            raise ValueError("give the clock to the endpoint, not to one of its stores")
        self.endpoint = endpoint or MemoryEndpoint(clock=clock or time.time)
        prefix = prefix.strip("/")
        self.prefix = f"{prefix}/" if prefix else ""
        self.url = f"memory://{self.endpoint.name}/{self.prefix}"
        self.caps = caps or Capabilities()
        self.facts = facts
        self.exists = exists

    # -- keys -------------------------------------------------------------------------------

    def validate_key(self, key: str) -> None:
        if not key or "\x00" in key:
            raise UnsafeKey(f"{key!r}: empty key or NUL byte")
        try:
            length = len((self.prefix + key).encode())
        except UnicodeEncodeError:
            raise UnsafeKey(f"{key!r}: not valid Unicode (a lone surrogate)") from None
        if length > _MAX_KEY_BYTES:
            raise UnsafeKey(f"{key!r}: longer than S3's 1024-byte key limit with the prefix")

    def _writable(self, key: str) -> str:
        self.validate_key(key)
        return self.prefix + key

    def _object(self, key: str) -> MemoryObject:
        obj = self.endpoint.objects.get(self.prefix + key)
        if obj is None:
            raise NotFound(f"{self.url}{key}: no such object")
        return obj

    def _info(self, key: str, obj: MemoryObject) -> ObjectInfo:
        return ObjectInfo(key, len(obj.data), obj.etag, obj.mtime)

    def _store(self, full: str, data: bytes, etag: str) -> MemoryObject:
        obj = MemoryObject(data, etag, self.endpoint.clock())
        self.endpoint.objects[full] = obj
        return obj

    # -- the read side ----------------------------------------------------------------------

    async def list(self) -> AsyncIterator[ObjectInfo]:
        await asyncio.sleep(0)
        cut = len(self.prefix)
        names = sorted((k for k in self.endpoint.objects
                        if k.startswith(self.prefix) and len(k) > cut), key=str.encode)
        for full in names:
            obj = self.endpoint.objects.get(full)
            if obj is not None:  # not deleted while listed
                yield self._info(full[cut:], obj)

    async def list_level(self, prefix: str) -> Level:
        await asyncio.sleep(0)
        files: list[ObjectInfo] = []
        dirs: set[str] = set()
        full = self.prefix + prefix
        for name in sorted(self.endpoint.objects, key=str.encode):
            if not name.startswith(full) or len(name) == len(full):
                continue
            rest = name[len(full):]
            if "/" in rest:
                dirs.add(prefix + rest.split("/", 1)[0] + "/")
            else:
                files.append(self._info(name[len(self.prefix):], self.endpoint.objects[name]))
        return Level(tuple(files), tuple(sorted(dirs, key=str.encode)))

    async def head(self, key: str) -> ObjectInfo:
        await asyncio.sleep(0)
        return self._info(key, self._object(key))

    async def get(
        self, key: str, rng: ByteRange | None = None, *, expect: ObjectInfo | None = None
    ) -> bytes:
        await asyncio.sleep(0)
        data = self._pinned(key, expect).data
        if rng is None:
            return data
        _check_range(f"{self.url}{key}", rng, len(data))
        return data[rng.start:rng.end]

    async def open_range(
        self, key: str, rng: ByteRange, *, expect: ObjectInfo | None = None
    ) -> Iterator[Buffer]:
        await asyncio.sleep(0)
        data = self._pinned(key, expect).data
        _check_range(f"{self.url}{key}", rng, len(data))
        view = memoryview(data)
        return (view[i:min(i + _PIECE, rng.end)] for i in range(rng.start, rng.end, _PIECE))

    def _pinned(self, key: str, expect: ObjectInfo | None) -> MemoryObject:
        obj = self._object(key)
        if expect is not None and expect.etag is not None and expect.etag != obj.etag:
            raise PreconditionFailed(f"{self.url}{key}: changed since it was listed")
        return obj

    async def check(self, *, mode: CheckMode) -> None:
        if mode == "read" and not self.exists:
            raise ConfigError(f"{self.url}: no such store")
        if mode == "write":
            self.exists = True

    async def aclose(self) -> None:
        pass

    # -- the write side ---------------------------------------------------------------------

    async def put(self, key: str, data: Buffer, *, mtime: float | None = None,
                  crc32c: int | None = None) -> ObjectInfo:
        await asyncio.sleep(0)
        blob = bytes(data)
        return self._info(key, self._store(self._writable(key), blob, _md5(blob).hex()))

    async def open_upload(self, key: str, size: int, *,
                          mtime: float | None = None) -> MemoryUpload:
        await asyncio.sleep(0)
        upload_id = self.endpoint.new_upload_id()
        self.endpoint.uploads[upload_id] = _OpenUpload(self._writable(key))
        return MemoryUpload(self, key, upload_id, size)

    async def resume_upload(self, key: str, upload_id: str, size: int, *,
                            mtime: float | None = None) -> MemoryUpload | None:
        await asyncio.sleep(0)
        held = self.endpoint.uploads.get(upload_id)
        if held is None or held.key != self.prefix + key:
            return None
        return MemoryUpload(self, key, upload_id, size)

    async def abort_upload(self, key: str, upload_id: str) -> None:
        held = self.endpoint.uploads.get(upload_id)
        if held is not None and held.key == self.prefix + key:
            del self.endpoint.uploads[upload_id]

    async def delete(self, key: str) -> None:
        await asyncio.sleep(0)
        self.endpoint.objects.pop(self.prefix + key, None)

    async def clear(self, prefix: str) -> None:
        full = self.prefix + prefix
        for upload_id, held in list(self.endpoint.uploads.items()):
            if held.key.startswith(full):
                del self.endpoint.uploads[upload_id]
        for key in [k for k in self.endpoint.objects if k.startswith(full)]:
            del self.endpoint.objects[key]

    # -- copies -----------------------------------------------------------------------------

    def can_copy_from(self, other: ReadStore) -> bool:
        return isinstance(other, MemoryStore) and other.endpoint is self.endpoint

    def copy_source(self, key: str, etag: str | None) -> MemoryCopySource:
        return MemoryCopySource(self.prefix + key, etag, self.endpoint)

    def compose_source(self, current: ObjectInfo) -> MemoryCopySource:
        return self.copy_source(current.key, current.etag)

    def _source(self, source: MemoryCopySource) -> MemoryObject:
        if source.endpoint is not self.endpoint:
            raise Permanent(f"{self.url}: cannot copy from another endpoint ({source.key})")
        obj = self.endpoint.objects.get(source.key)
        if obj is None:
            raise NotFound(f"memory://{self.endpoint.name}/{source.key}: no such object")
        if source.etag is not None and source.etag != obj.etag:
            raise PreconditionFailed(f"memory://{self.endpoint.name}/{source.key}: changed "
                                     "since it was listed")
        return obj

    async def copy_object(self, source: MemoryCopySource, key: str) -> ObjectInfo:
        await asyncio.sleep(0)
        data = self._source(source).data
        if len(data) > self.caps.max_copy_size:
            raise Permanent(f"{self.url}{key}: a copy of {len(data)} bytes is too large")
        return self._info(key, self._store(self._writable(key), data, _md5(data).hex()))


class MemoryUpload:
    """One upload of a MemoryStore: its parts live in the endpoint under its id."""

    def __init__(self, store: MemoryStore, key: str, upload_id: str, size: int) -> None:
        self.store = store
        self.key = key
        self.upload_id = upload_id
        self.size = size

    def _held(self) -> _OpenUpload:
        held = self.store.endpoint.uploads.get(self.upload_id)
        if held is None:
            raise NotFound(f"{self.store.url}{self.key}: no such upload (completed or aborted)")
        return held

    def _add(self, number: int, data: bytes) -> PartRef:
        caps = self.store.caps
        if not 1 <= number <= caps.max_parts:
            raise Permanent(f"{self.store.url}{self.key}: part number {number} out of range")
        if len(data) > caps.max_part_size:
            raise Permanent(f"{self.store.url}{self.key}: part {number} is too large")
        etag = _md5(data).hex()
        self._held().parts[number] = (data, etag)
        return PartRef(number, etag, len(data))

    async def put_part(self, number: int, offset: int, data: Buffer, *,
                       crc32c: int | None = None) -> PartRef:
        await asyncio.sleep(0)
        return self._add(number, bytes(data))

    async def copy_part(self, number: int, offset: int, source: MemoryCopySource,
                        rng: ByteRange) -> PartRef:
        await asyncio.sleep(0)
        self._held()
        endpoint = self.store.endpoint
        if source.endpoint is endpoint and source.key not in endpoint.objects:  # S3: NoSuchKey
            raise PreconditionFailed(f"memory://{self.store.endpoint.name}/{source.key}: "
                                     "gone since it was listed")
        data = self.store._source(source).data
        _check_range(f"memory://{self.store.endpoint.name}/{source.key}", rng, len(data))
        return self._add(number, data[rng.start:rng.end])

    async def confirm_parts(self, claims: Sequence[PartClaim]) -> set[int]:
        await asyncio.sleep(0)
        held = {(n, etag, len(data)) for n, (data, etag) in self._held().parts.items()}
        return {c.ref.number for c in claims if (c.ref.number, c.ref.etag, c.ref.size) in held}

    async def complete(self, parts: Sequence[PartRef]) -> ObjectInfo:
        await asyncio.sleep(0)
        held = self._held()
        ordered = sorted(parts, key=lambda p: p.number)
        what = f"{self.store.url}{self.key}"
        if not ordered or len({p.number for p in ordered}) != len(ordered):
            raise Permanent(f"{what}: no parts, or a part listed twice")
        blobs = []
        for p in ordered:
            data, etag = held.parts.get(p.number, (b"", None))
            if etag != p.etag:
                raise Permanent(f"{what}: part {p.number} is not held with ETag {p.etag}")
            blobs.append(data)
        if any(len(b) < self.store.caps.min_part_size for b in blobs[:-1]):
            raise Permanent(f"{what}: a part but the last is below the minimum part size")
        digests = b"".join(_md5(b) for b in blobs)
        del self.store.endpoint.uploads[self.upload_id]
        etag = f"{_md5(digests).hex()}-{len(blobs)}"
        obj = self.store._store(held.key, b"".join(blobs), etag)
        return self.store._info(self.key, obj)

    async def abort(self) -> None:
        self.store.endpoint.uploads.pop(self.upload_id, None)


def _check_range(what: str, rng: ByteRange, size: int) -> None:
    if not 0 <= rng.start <= rng.end <= size:
        raise Permanent(f"{what}: range [{rng.start}, {rng.end}) outside the object's "
                        f"{size} bytes")
