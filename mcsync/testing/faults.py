"""``faulty(store, faults)``: any store, with faults injected by rule — for tests.

As restic's ``backend/mock`` and object_store's ``throttle.rs`` wrap a backend, this wraps a
mcsync store (and the uploads it opens) and, on each operation, applies the ``Rule``s that
match it: raise an error, wait, cut a read short, or run an action (kill the process, count
the bytes acknowledged, change the source behind the engine's back). Every call is counted
by operation, so a test can also assert what was asked of a store.

Operations are named after the protocol's methods (``list``, ``head``, ``get``, ``read_into``,
``open_range``,
``put``, ``delete``, ``open_upload``, ``resume_upload``, ``put_part``, ``write_at``,
``part_written``, ``copy_part``, ``complete``, ``abort``, ``copy_object``, ``clear`` ...), each
at two points: ``before`` the call reaches the store and ``after`` it returned (``list`` has
one point per entry, after it was handed on). The key of an upload's operation is its object's
key.

The wrapper offers exactly the abilities of the store it wraps (``isinstance`` against the
protocols of ``mcsync.stores.base`` answers as for the inner store), so the engine takes the
same paths through it.
"""

from __future__ import annotations

import asyncio
import fnmatch
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from ..errors import Transient
from ..stores.base import (
    Composer,
    FileTarget,
    FileUpload,
    PartCopyUpload,
    RangeStreamer,
    ReadsInto,
    ReadStore,
    ScratchSpace,
    ServerSideCopier,
    Store,
)
from ..types import Buffer, ByteRange, ObjectInfo, PartClaim, PartRef

__all__ = ["Call", "Faults", "Rule", "faulty"]

Phase = Literal["before", "after"]


@dataclass(frozen=True, slots=True)
class Call:
    """One operation as a rule sees it."""

    op: str
    key: str
    phase: Phase
    nbytes: int = 0  # bytes sent (put, put_part, write_at) or acknowledged (after)


@dataclass
class Rule:
    """What to do at the ``nth`` .. ``nth + times - 1``-th call that matches ``op`` (a glob),
    ``key`` (a glob; ``skip`` excludes keys) and ``phase``. ``times`` None: every one from
    ``nth`` on."""

    op: str
    key: str = "*"
    phase: Phase = "before"
    nth: int = 1
    times: int | None = 1
    skip: str | None = None
    error: BaseException | Callable[[Call], BaseException] | None = None
    delay_s: float = 0.0
    short: int = 0  # get / open_range: hand out this many bytes fewer than asked
    action: Callable[[Call], None] | None = None
    seen: int = field(default=0, init=False)  # matching calls so far

    def matches(self, call: Call) -> bool:
        return (call.phase == self.phase and fnmatch.fnmatchcase(call.op, self.op)
                and fnmatch.fnmatchcase(call.key, self.key)
                and not (self.skip and fnmatch.fnmatchcase(call.key, self.skip)))

    def due(self) -> bool:
        """Counts this match; True when it falls in the rule's window."""
        self.seen += 1
        return self.seen >= self.nth and (self.times is None
                                           or self.seen < self.nth + self.times)


class Faults:
    """The rules one or more wrapped stores apply, and the calls they saw."""

    def __init__(self, rules: Sequence[Rule] = ()) -> None:
        self.rules = list(rules)
        self.calls: Counter[str] = Counter()  # op → calls seen (before)

    def add(self, rule: Rule) -> Rule:
        self.rules.append(rule)
        return rule

    def _due(self, call: Call) -> list[Rule]:
        if call.phase == "before":
            self.calls[call.op] += 1
        return [r for r in self.rules if r.matches(call) and r.due()]

    def _fire(self, call: Call, due: list[Rule]) -> int:
        short = 0
        for rule in due:
            if rule.action is not None:
                rule.action(call)
            if rule.error is not None:
                error = rule.error(call) if callable(rule.error) else rule.error
                raise error
            short = max(short, rule.short)
        return short

    async def at(self, op: str, key: str, phase: Phase, nbytes: int = 0) -> int:
        """Apply the rules due for this call (from the event loop); the bytes to cut short."""
        call = Call(op, key, phase, nbytes)
        due = self._due(call)
        delay = sum(r.delay_s for r in due)
        if delay:
            await asyncio.sleep(delay)
        return self._fire(call, due)

    def at_blocking(self, op: str, key: str, phase: Phase, nbytes: int = 0) -> int:
        """The same, from a worker thread (``write_at``)."""
        call = Call(op, key, phase, nbytes)
        due = self._due(call)
        delay = sum(r.delay_s for r in due)
        if delay:
            time.sleep(delay)
        return self._fire(call, due)


def faulty(store: ReadStore, faults: Faults) -> ReadStore:
    """``store`` with ``faults`` applied to every operation, offering the same abilities."""
    bases = tuple(mixin for ability, mixin in _STORE_MIXINS if isinstance(store, ability))
    cls = _class_for((*bases, _FaultyRead))
    wrapped: ReadStore = cls(store, faults)
    return wrapped


_CLASSES: dict[tuple[type, ...], type] = {}


def _class_for(bases: tuple[type, ...]) -> type:
    if bases not in _CLASSES:
        name = "Faulty" + "".join(b.__name__.removeprefix("_Faulty") for b in bases[:-1])
        _CLASSES[bases] = type(name or "FaultyReadStore", bases, {})
    return _CLASSES[bases]


def inner_of(store: Any) -> Any:
    """What a faulty store wraps (the store itself for any other)."""
    return getattr(store, "_inner", store)


class _FaultyRead:
    def __init__(self, inner: Any, faults: Faults) -> None:
        self._inner = inner
        self.faults = faults
        self.url: str = inner.url
        self.caps = inner.caps

    async def list(self) -> AsyncIterator[ObjectInfo]:
        await self.faults.at("list", "", "before")
        async for info in self._inner.list():
            yield info
            await self.faults.at("list", info.key, "after")

    async def head(self, key: str) -> ObjectInfo:
        await self.faults.at("head", key, "before")
        info: ObjectInfo = await self._inner.head(key)
        await self.faults.at("head", key, "after")
        return info

    async def get(self, key: str, rng: ByteRange | None = None, *,
                  expect: ObjectInfo | None = None) -> Buffer:
        short = await self.faults.at("get", key, "before")
        data: Buffer = await self._inner.get(key, rng, expect=expect)
        short = max(short, await self.faults.at("get", key, "after", len(data)))
        return memoryview(data)[:len(data) - short] if short else data

    async def check(self, *, mode: Any) -> None:
        await self.faults.at("check", "", "before")
        await self._inner.check(mode=mode)

    async def aclose(self) -> None:
        await self._inner.aclose()


class _FaultyWrite:
    _inner: Any
    faults: Faults

    async def put(self, key: str, data: Buffer, *, mtime: float | None = None) -> ObjectInfo:
        await self.faults.at("put", key, "before", len(data))
        info: ObjectInfo = await self._inner.put(key, data, mtime=mtime)
        await self.faults.at("put", key, "after", len(data))
        return info

    async def open_upload(self, key: str, size: int, *, mtime: float | None = None) -> Any:
        await self.faults.at("open_upload", key, "before")
        upload = await self._inner.open_upload(key, size, mtime=mtime)
        wrapped = _wrap_upload(upload, key, self.faults)
        await self.faults.at("open_upload", key, "after")
        return wrapped

    async def resume_upload(self, key: str, upload_id: str, size: int, *,
                            mtime: float | None = None) -> Any:
        await self.faults.at("resume_upload", key, "before")
        upload = await self._inner.resume_upload(key, upload_id, size, mtime=mtime)
        await self.faults.at("resume_upload", key, "after")
        return None if upload is None else _wrap_upload(upload, key, self.faults)

    async def abort_upload(self, key: str, upload_id: str) -> None:
        await self.faults.at("abort_upload", key, "before")
        await self._inner.abort_upload(key, upload_id)

    async def delete(self, key: str) -> None:
        await self.faults.at("delete", key, "before")
        await self._inner.delete(key)
        await self.faults.at("delete", key, "after")

    def validate_key(self, key: str) -> None:
        self._inner.validate_key(key)


class _FaultyStreamer:
    _inner: Any
    faults: Faults

    async def open_range(self, key: str, rng: ByteRange, *,
                         expect: ObjectInfo | None = None) -> Iterator[Buffer]:
        short = await self.faults.at("open_range", key, "before")
        pieces = await self._inner.open_range(key, rng, expect=expect)
        await self.faults.at("open_range", key, "after")
        return _pieces(pieces, key, rng.length - short, self.faults)


def _pieces(pieces: Iterator[Buffer], key: str, keep: int, faults: Faults) -> Iterator[Buffer]:
    """A streamed range's pieces, each one a ``range_piece`` call (a rule raising there breaks
    the body off mid-way, as a reset connection does); with ``keep`` short of the range, the
    body ends early and the stream raises Transient, as a store's own length check does."""
    for piece in pieces:
        faults.at_blocking("range_piece", key, "before", len(piece))
        if len(piece) >= keep:
            if keep > 0:
                yield memoryview(piece)[:keep]
            if len(piece) > keep:
                raise Transient(f"{key}: the body ended early (fault injected)")
            keep = 0
            continue
        yield piece
        keep -= len(piece)


class _FaultyReadsInto:
    _inner: Any
    faults: Faults

    async def read_into(self, key: str, rng: ByteRange, buf: bytearray, *,
                        expect: ObjectInfo | None = None) -> memoryview:
        short = await self.faults.at("read_into", key, "before")
        view: memoryview = await self._inner.read_into(key, rng, buf, expect=expect)
        short = max(short, await self.faults.at("read_into", key, "after", len(view)))
        return view[:len(view) - short] if short else view


class _FaultyCopier:
    _inner: Any
    faults: Faults

    def can_copy_from(self, other: ReadStore) -> bool:
        return bool(self._inner.can_copy_from(inner_of(other)))

    def copy_source(self, key: str, etag: str | None) -> Any:
        return self._inner.copy_source(key, etag)

    async def copy_object(self, source: Any, key: str) -> ObjectInfo:
        await self.faults.at("copy_object", key, "before")
        info: ObjectInfo = await self._inner.copy_object(source, key)
        await self.faults.at("copy_object", key, "after")
        return info


class _FaultyComposer:
    _inner: Any

    def compose_source(self, current: ObjectInfo) -> Any:
        return self._inner.compose_source(current)


class _FaultyScratch:
    _inner: Any
    faults: Faults

    async def clear(self, prefix: str) -> None:
        await self.faults.at("clear", prefix, "before")
        await self._inner.clear(prefix)


class _FaultyFile:
    _inner: Any
    faults: Faults

    async def open_file(self, key: str, size: int, *, mtime: float | None = None) -> Any:
        await self.faults.at("open_upload", key, "before")
        upload = await self._inner.open_file(key, size, mtime=mtime)
        wrapped = _wrap_upload(upload, key, self.faults)
        await self.faults.at("open_upload", key, "after")
        return wrapped


_STORE_MIXINS: tuple[tuple[type, type], ...] = (
    (Store, _FaultyWrite),
    (RangeStreamer, _FaultyStreamer),
    (ReadsInto, _FaultyReadsInto),
    (ServerSideCopier, _FaultyCopier),
    (Composer, _FaultyComposer),
    (ScratchSpace, _FaultyScratch),
    (FileTarget, _FaultyFile),
)


# -- uploads -------------------------------------------------------------------------------------


class _FaultyUpload:
    def __init__(self, inner: Any, key: str, faults: Faults) -> None:
        self._inner = inner
        self.key = key
        self.faults = faults
        self.upload_id: str = inner.upload_id

    async def put_part(self, number: int, offset: int, data: Buffer) -> PartRef:
        await self.faults.at("put_part", self.key, "before", len(data))
        ref: PartRef = await self._inner.put_part(number, offset, data)
        await self.faults.at("put_part", self.key, "after", len(data))
        return ref

    async def confirm_parts(self, claims: Sequence[PartClaim]) -> set[int]:
        await self.faults.at("confirm_parts", self.key, "before")
        return set(await self._inner.confirm_parts(claims))

    async def complete(self, parts: Sequence[PartRef]) -> ObjectInfo:
        await self.faults.at("complete", self.key, "before")
        info: ObjectInfo = await self._inner.complete(parts)
        await self.faults.at("complete", self.key, "after")
        return info

    async def abort(self) -> None:
        await self.faults.at("abort", self.key, "before")
        await self._inner.abort()


class _FaultyPartCopy:
    _inner: Any
    key: str
    faults: Faults

    async def copy_part(self, number: int, offset: int, source: Any,
                        rng: ByteRange) -> PartRef:
        await self.faults.at("copy_part", self.key, "before")
        ref: PartRef = await self._inner.copy_part(number, offset, source, rng)
        await self.faults.at("copy_part", self.key, "after")
        return ref


class _FaultyFileUpload:
    _inner: Any
    key: str
    faults: Faults

    def write_at(self, offset: int, data: Buffer) -> None:
        self.faults.at_blocking("write_at", self.key, "before", len(data))
        self._inner.write_at(offset, data)

    def part_written(self, number: int, size: int) -> PartRef:
        ref: PartRef = self._inner.part_written(number, size)
        self.faults.at_blocking("part_written", self.key, "after", size)
        return ref


_UPLOAD_MIXINS: tuple[tuple[type, type], ...] = (
    (PartCopyUpload, _FaultyPartCopy),
    (FileUpload, _FaultyFileUpload),
)


def _wrap_upload(upload: Any, key: str, faults: Faults) -> Any:
    bases = tuple(mixin for ability, mixin in _UPLOAD_MIXINS if isinstance(upload, ability))
    return _class_for((*bases, _FaultyUpload))(upload, key, faults)
