"""``wrap(store, hooks)``: a store that passes every operation of another through hooks.

What wraps a store — fault injection for tests (``mcsync.testing.faults``), request
metrics (``mcsync.observe.metrics``) — must offer exactly the abilities of what it wraps: the
engine asks for them with ``isinstance``, and since Python 3.12 a protocol's methods are looked
up statically, so a ``__getattr__`` that forwards everything claims none. ``wrap`` therefore
builds (once per combination) a class from one mixin per ability the inner store has, and wraps
the uploads it opens the same way.

Each operation is an ``Op`` named after the protocol's method (``get``, ``put_part``,
``open_file``, ...) with the key of its object (an upload's operations: its object's key;
``clear``: the prefix; ``check``: ""). Coroutines run through ``hooks.call``, reads
(``get``, ``read_into``) through ``hooks.read`` and a streamed range (``open_range``) through
``hooks.stream``, methods that run on worker threads (``write_at``, ``part_written``) through
``hooks.call_blocking``, a listing through ``hooks.listing``. A hook may act before and after,
time, count or raise; only a read or a stream may be handed back as something else (a shorter
read, a body iterator of its own), each typed as what it stands in for. Plain lookups
(``validate_key``, ``can_copy_from``, ``copy_source``, ``compose_source``) and ``aclose`` go
straight through.

``keys=Rename(shown, real)`` shows the inner store's key ``real`` as ``shown`` (every other
key as it is), ``url=`` names the wrapped store otherwise and ``facts=`` states its facts: a
single file synced under another name (``stores/single.py``).

A wrapped store is ``Wrapped``: what it wraps (``inner``) and its hooks (``hooks``) are typed,
so what asks for them (``innermost``, ``resilience.pacing_of``) never looks at attributes by
name.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol, TypeVar, runtime_checkable

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
from .base import (
    CaseFolding,
    Composer,
    FileTarget,
    FileUpload,
    LevelLister,
    LocalTree,
    PartCopyUpload,
    RangeStreamer,
    ReadsInto,
    ReadStore,
    ScratchSpace,
    ServerSideCopier,
    Store,
    TempFileSweeper,
    has,
)

__all__ = ["Hooks", "Op", "PassThrough", "Rename", "Wrapped", "inner_of", "innermost",
           "unstarted", "wrap"]

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Op:
    """One operation as hooks see it."""

    name: str  # the protocol method
    key: str
    nbytes: int = 0  # bytes handed to the store: put, put_part, write_at; part_written: its size
    rng: ByteRange | None = None  # the range asked for: get, read_into, open_range, copy_part


@dataclass(frozen=True, slots=True)
class Rename:
    """The inner store's key ``real`` shown as ``shown``; any other key is itself."""

    shown: str
    real: str

    def inner(self, key: str) -> str:
        return self.real if key == self.shown else key

    def outer(self, info: ObjectInfo) -> ObjectInfo:
        return replace(info, key=self.shown) if info.key == self.real else info


class Hooks(Protocol):
    async def call(self, op: Op, fn: Callable[[], Awaitable[T]]) -> T:
        """Run ``fn()`` (the inner store's coroutine) for ``op``; return its result."""
        ...

    async def read(self, op: Op, fn: Callable[[], Awaitable[Buffer]]) -> Buffer:
        """The same for a read (``get``, ``read_into``): the bytes read, or fewer."""
        ...

    async def stream(self, op: Op,
                     fn: Callable[[], Awaitable[Iterator[Buffer]]]) -> Iterator[Buffer]:
        """The same for a streamed range (``open_range``): its body, or one that hands its
        pieces on."""
        ...

    def call_blocking(self, op: Op, fn: Callable[[], T]) -> T:
        """The same for a blocking method, called from a worker thread."""
        ...

    def listing(self, entries: AsyncIterator[ObjectInfo]) -> AsyncIterator[ObjectInfo]:
        """The inner store's listing, handed on entry by entry."""
        ...


@runtime_checkable
class Wrapped(Protocol):
    """A store made by ``wrap``: the store it wraps and the hooks its operations pass
    through."""

    @property
    def inner(self) -> ReadStore: ...

    @property
    def hooks(self) -> Hooks: ...


class PassThrough:
    """Hooks that pass every operation through as it is: a view that changes one thing (its
    listing: ``stores.single``, ``latest``) overrides that alone."""

    async def call(self, op: Op, fn: Callable[[], Awaitable[T]]) -> T:
        return await fn()

    async def read(self, op: Op, fn: Callable[[], Awaitable[Buffer]]) -> Buffer:
        return await fn()

    async def stream(self, op: Op,
                     fn: Callable[[], Awaitable[Iterator[Buffer]]]) -> Iterator[Buffer]:
        return await fn()

    def call_blocking(self, op: Op, fn: Callable[[], T]) -> T:
        return fn()

    def listing(self, entries: AsyncIterator[ObjectInfo]) -> AsyncIterator[ObjectInfo]:
        return entries


async def unstarted(entries: AsyncIterator[ObjectInfo]) -> None:
    """Close the inner store's listing, never started, that a view lists in place of."""
    aclose = getattr(entries, "aclose", None)
    if aclose is not None:
        await aclose()


def wrap(store: ReadStore, hooks: Hooks, *, name: str = "Wrapped", keys: Rename | None = None,
         url: str | None = None, facts: StoreFacts | None = None,
         without: Collection[type] = ()) -> ReadStore:
    """``store`` with every operation passed through ``hooks``, offering the same abilities
    (but those named in ``without``) and the same facts (unless ``facts``). ``name`` prefixes
    the class's name (``FaultyWriteStreamer...``), for messages; ``keys`` and ``url``: see the
    module's text."""
    bases = tuple(mixin for ability, mixin in _STORE_MIXINS
                  if has(store, ability) and ability not in without)
    wrapped: ReadStore = _class_for(name, (*bases, _Read), "ReadStore")(store, hooks, name,
                                                                        keys, url, facts)
    return wrapped


def inner_of(store: ReadStore) -> ReadStore:
    """What a wrapped store wraps (the store itself for any other)."""
    return store.inner if isinstance(store, Wrapped) else store


def innermost(store: ReadStore) -> ReadStore:
    """The store under every layer of wrapping."""
    while isinstance(store, Wrapped):
        store = store.inner
    return store


_CLASSES: dict[tuple[str, tuple[type, ...]], type] = {}


def _class_for(name: str, bases: tuple[type, ...], plain: str) -> type:
    if (name, bases) not in _CLASSES:
        suffix = "".join(b.__name__.lstrip("_") for b in bases[:-1]) or plain
        _CLASSES[name, bases] = type(name + suffix, bases, {})
    return _CLASSES[name, bases]


class _Read:
    def __init__(self, inner: Any, hooks: Hooks, name: str, keys: Rename | None = None,
                 url: str | None = None, facts: StoreFacts | None = None) -> None:
        self._inner = inner
        self._hooks = hooks
        self._name = name
        self.url: str = url or inner.url
        self.facts: StoreFacts = facts or inner.facts
        self._keys = keys

    @property
    def inner(self) -> ReadStore:
        inner: ReadStore = self._inner
        return inner

    @property
    def hooks(self) -> Hooks:
        return self._hooks

    def __repr__(self) -> str:
        return f"<{type(self).__name__} of {self._inner!r}>"

    def _in(self, key: str) -> str:
        return key if self._keys is None else self._keys.inner(key)

    def _out(self, info: ObjectInfo) -> ObjectInfo:
        return info if self._keys is None else self._keys.outer(info)

    def _out_expect(self, info: ObjectInfo | None) -> ObjectInfo | None:
        if info is None or self._keys is None or info.key != self._keys.shown:
            return info
        return replace(info, key=self._keys.real)

    def list(self) -> AsyncIterator[ObjectInfo]:
        listing = self._hooks.listing(self._inner.list())
        return listing if self._keys is None else _renamed(listing, self._keys)

    async def head(self, key: str) -> ObjectInfo:
        return self._out(await self._hooks.call(Op("head", key),
                                                lambda: self._inner.head(self._in(key))))

    async def get(self, key: str, rng: ByteRange | None = None, *,
                  expect: ObjectInfo | None = None) -> Buffer:
        return await self._hooks.read(
            Op("get", key, rng=rng),
            lambda: self._inner.get(self._in(key), rng, expect=self._out_expect(expect)))

    async def check(self, *, mode: Any) -> None:
        await self._hooks.call(Op("check", ""), lambda: self._inner.check(mode=mode))

    async def aclose(self) -> None:
        await self._inner.aclose()


async def _renamed(listing: AsyncIterator[ObjectInfo], keys: Rename) -> AsyncIterator[ObjectInfo]:
    async for info in listing:
        yield keys.outer(info)


class _Write:
    _inner: Any
    _hooks: Hooks
    _name: str
    _keys: Rename | None
    _in: Callable[[str], str]
    _out: Callable[[ObjectInfo], ObjectInfo]

    @property
    def caps(self) -> Capabilities:
        caps: Capabilities = self._inner.caps
        return caps

    async def put(self, key: str, data: Buffer, *, mtime: float | None = None,
                  crc32c: int | None = None) -> ObjectInfo:
        return self._out(await self._hooks.call(
            Op("put", key, len(data)),
            lambda: self._inner.put(self._in(key), data, mtime=mtime, crc32c=crc32c)))

    async def open_upload(self, key: str, size: int, *, mtime: float | None = None) -> Any:
        upload = await self._hooks.call(
            Op("open_upload", key),
            lambda: self._inner.open_upload(self._in(key), size, mtime=mtime))
        return _wrap_upload(upload, key, self._hooks, self._name, self._keys)

    async def resume_upload(self, key: str, upload_id: str, size: int, *,
                            mtime: float | None = None) -> Any:
        upload = await self._hooks.call(
            Op("resume_upload", key),
            lambda: self._inner.resume_upload(self._in(key), upload_id, size, mtime=mtime))
        return (None if upload is None
                else _wrap_upload(upload, key, self._hooks, self._name, self._keys))

    async def abort_upload(self, key: str, upload_id: str) -> None:
        await self._hooks.call(Op("abort_upload", key),
                               lambda: self._inner.abort_upload(self._in(key), upload_id))

    async def delete(self, key: str) -> None:
        await self._hooks.call(Op("delete", key), lambda: self._inner.delete(self._in(key)))

    def validate_key(self, key: str) -> None:
        self._inner.validate_key(self._in(key))


class _Streamer:
    _inner: Any
    _hooks: Hooks
    _in: Callable[[str], str]
    _out_expect: Callable[[ObjectInfo | None], ObjectInfo | None]

    async def open_range(self, key: str, rng: ByteRange, *,
                         expect: ObjectInfo | None = None) -> Iterator[Buffer]:
        return await self._hooks.stream(
            Op("open_range", key, rng=rng),
            lambda: self._inner.open_range(self._in(key), rng, expect=self._out_expect(expect)))


class _ReadsInto:
    _inner: Any
    _hooks: Hooks
    _in: Callable[[str], str]
    _out_expect: Callable[[ObjectInfo | None], ObjectInfo | None]

    async def read_into(self, key: str, rng: ByteRange, buf: bytearray, *,
                        expect: ObjectInfo | None = None) -> memoryview:
        view = await self._hooks.read(
            Op("read_into", key, rng=rng),
            lambda: self._inner.read_into(self._in(key), rng, buf,
                                          expect=self._out_expect(expect)))
        return view if isinstance(view, memoryview) else memoryview(view)


class _Copier:
    _inner: Any
    _hooks: Hooks
    _in: Callable[[str], str]
    _out: Callable[[ObjectInfo], ObjectInfo]

    def can_copy_from(self, other: ReadStore) -> bool:
        return bool(self._inner.can_copy_from(innermost(other)))

    def copy_source(self, key: str, etag: str | None) -> Any:
        return self._inner.copy_source(self._in(key), etag)

    async def copy_object(self, source: Any, key: str) -> ObjectInfo:
        return self._out(await self._hooks.call(
            Op("copy_object", key), lambda: self._inner.copy_object(source, self._in(key))))


class _Composer:
    _inner: Any
    _out_expect: Callable[[ObjectInfo | None], ObjectInfo | None]

    def compose_source(self, current: ObjectInfo) -> Any:
        return self._inner.compose_source(self._out_expect(current))


class _Scratch:
    _inner: Any
    _hooks: Hooks

    async def clear(self, prefix: str) -> None:
        await self._hooks.call(Op("clear", prefix), lambda: self._inner.clear(prefix))


class _File:
    _inner: Any
    _hooks: Hooks
    _name: str
    _keys: Rename | None
    _in: Callable[[str], str]

    async def open_file(self, key: str, size: int, *, mtime: float | None = None) -> Any:
        upload = await self._hooks.call(
            Op("open_file", key),
            lambda: self._inner.open_file(self._in(key), size, mtime=mtime))
        return _wrap_upload(upload, key, self._hooks, self._name, self._keys)


class _CaseFolding:
    _inner: Any

    def folds_case(self) -> bool:
        return bool(self._inner.folds_case())


class _Tree:
    _inner: Any

    @property
    def root(self) -> Any:
        return self._inner.root


class _Levels:
    _inner: Any
    _hooks: Hooks
    _keys: Rename | None

    async def list_level(self, prefix: str) -> Level:
        level: Level = await self._hooks.call(Op("list_level", prefix),
                                              lambda: self._inner.list_level(prefix))
        if self._keys is None:
            return level
        return replace(level, files=tuple(self._keys.outer(f) for f in level.files))


class _Sweeper:
    _inner: Any
    _hooks: Hooks

    async def sweep_temp_files(self, keep: Collection[str] = (), *,
                               older_than: float | None = None) -> list[str]:
        swept: list[str] = await self._hooks.call(
            Op("sweep_temp_files", ""),
            lambda: self._inner.sweep_temp_files(keep, older_than=older_than))
        return swept


_STORE_MIXINS: tuple[tuple[type, type], ...] = (
    (Store, _Write),
    (RangeStreamer, _Streamer),
    (ReadsInto, _ReadsInto),
    (ServerSideCopier, _Copier),
    (Composer, _Composer),
    (ScratchSpace, _Scratch),
    (FileTarget, _File),
    (LocalTree, _Tree),
    (LevelLister, _Levels),
    (TempFileSweeper, _Sweeper),
    (CaseFolding, _CaseFolding),
)


# -- uploads -------------------------------------------------------------------------------------


class _Upload:
    def __init__(self, inner: Any, key: str, hooks: Hooks, keys: Rename | None = None) -> None:
        self._inner = inner
        self._hooks = hooks
        self._keys = keys
        self.key = key
        self.upload_id: str = inner.upload_id

    async def put_part(self, number: int, offset: int, data: Buffer, *,
                       crc32c: int | None = None) -> PartRef:
        return await self._hooks.call(Op("put_part", self.key, len(data)),
                                      lambda: self._inner.put_part(number, offset, data,
                                                                   crc32c=crc32c))

    async def confirm_parts(self, claims: Sequence[PartClaim]) -> set[int]:
        confirmed = await self._hooks.call(Op("confirm_parts", self.key),
                                           lambda: self._inner.confirm_parts(claims))
        return set(confirmed)

    async def complete(self, parts: Sequence[PartRef]) -> ObjectInfo:
        info: ObjectInfo = await self._hooks.call(Op("complete", self.key),
                                                  lambda: self._inner.complete(parts))
        return info if self._keys is None else self._keys.outer(info)

    async def abort(self) -> None:
        await self._hooks.call(Op("abort", self.key), lambda: self._inner.abort())


class _PartCopy:
    _inner: Any
    _hooks: Hooks
    key: str

    async def copy_part(self, number: int, offset: int, source: Any,
                        rng: ByteRange) -> PartRef:
        return await self._hooks.call(
            Op("copy_part", self.key, rng=rng),
            lambda: self._inner.copy_part(number, offset, source, rng))


class _FileUpload:
    _inner: Any
    _hooks: Hooks
    key: str

    def write_at(self, offset: int, data: Buffer) -> None:
        self._hooks.call_blocking(Op("write_at", self.key, len(data)),
                                  lambda: self._inner.write_at(offset, data))

    def part_written(self, number: int, size: int) -> PartRef:
        ref: PartRef = self._hooks.call_blocking(Op("part_written", self.key, size),
                                                 lambda: self._inner.part_written(number, size))
        return ref


_UPLOAD_MIXINS: tuple[tuple[type, type], ...] = (
    (PartCopyUpload, _PartCopy),
    (FileUpload, _FileUpload),
)


def _wrap_upload(upload: Any, key: str, hooks: Hooks, name: str,
                 keys: Rename | None = None) -> Any:
    bases = tuple(mixin for ability, mixin in _UPLOAD_MIXINS if has(upload, ability))
    return _class_for(name, (*bases, _Upload), "Upload")(upload, key, hooks, keys)
