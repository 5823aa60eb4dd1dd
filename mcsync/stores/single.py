"""One file or one object as a source, as ``aws s3 cp`` and ``rclone copyto`` take one.

``mcsync sync ./model.safetensors meta://b/m/`` copies that file to ``m/model.safetensors``;
a target not ending in ``/`` names the object itself (a local target that is an existing
directory: into it, as ``cp``). The engine is not told: the pair is resolved here, at the
edge, into a source store rooted at the file's directory (or the object's prefix) and a target
store rooted at the target's parent, each seen through ``wrap`` as holding exactly one object
under the target's name (``_OneObject``: a listing is one HEAD). So the run has its manifest,
checksums, block delta, lock and report as any sync; the pair is named by the two objects'
own addresses.

When is a source one object? A local path: when it is a file (and does not end in ``/``). An
``s3://`` / ``meta://`` / ``gs://`` / ``az://`` address not ending in ``/``: when that exact
key exists and nothing is listed under ``key/``; otherwise it is a prefix, as it always was
(``s3://b/data`` means the keys under ``data/``).
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable
from dataclasses import replace

from ..config import StoreOptions
from ..errors import MCSyncError, NotFound, UsageError, as_config_error
from ..types import ObjectInfo
from .base import LevelLister, LocalTree, ReadStore
from .registry import parse_url
from .wrap import PassThrough, Rename, unstarted, wrap

__all__ = ["open_pair"]

Opener = Callable[[str, StoreOptions], ReadStore]


class _OneObject(PassThrough):
    """Hooks that make a store's listing the one object ``real`` (a HEAD; nothing when it is
    not there) and pass every other operation through."""

    def __init__(self, inner: ReadStore, real: str) -> None:
        self._inner = inner
        self._real = real

    async def listing(self, entries: AsyncIterator[ObjectInfo]) -> AsyncIterator[ObjectInfo]:
        await unstarted(entries)  # the directory is not listed
        try:
            info = await self._inner.head(self._real)
        except NotFound:
            return
        yield info


def one_object(store: ReadStore, *, shown: str, real: str, url: str,
               without: tuple[type, ...] = ()) -> ReadStore:
    """``store`` seen as holding one object, ``real``, under the key ``shown`` (its levels are
    not listed: they would show the directory's other files)."""
    return wrap(store, _OneObject(store, real), name="One", keys=Rename(shown, real), url=url,
                facts=replace(store.facts, one_object=True), without=(*without, LevelLister))


def is_one_object(store: ReadStore) -> bool:
    """Is ``store`` a view of one object made by ``open_pair`` (which its address alone does
    not reopen)? A fact it states (``StoreFacts.one_object``), kept by any wrapper over it."""
    return store.facts.one_object


async def open_pair(src: str, dst: str, open_source: Opener, open_target: Opener,
                    source_options: StoreOptions, target_options: StoreOptions, *,
                    delete: bool = False) -> tuple[ReadStore, ReadStore]:
    """The source and target stores two addresses name, yours to close: a directory or
    prefix and its target as ``open_source(src)`` / ``open_target(dst)`` open them, or, when
    ``src`` is one file or object, the pair seen as that one object (the module's text).
    Raises UsageError for a pair that makes no sense."""
    loc = parse_url(src)
    if loc.scheme == "file":
        path = loc.prefix
        if src.endswith("/") or not os.path.isfile(path):
            return open_source(src, source_options), open_target(dst, target_options)
        parent, name = os.path.split(os.path.abspath(path))
        source_parent = open_source(parent, source_options)
        src_url = os.path.abspath(path)
    else:
        if src.endswith("/") or not loc.prefix:
            return open_source(src, source_options), open_target(dst, target_options)
        parent, _, name = src.rpartition("/")
        source_parent = open_source(parent + "/", source_options)
        prefix = await _as_prefix(source_parent, name, src, open_source, source_options)
        if prefix is not None:
            await source_parent.aclose()
            return prefix, open_target(dst, target_options)
        src_url = src
    try:
        if delete:
            raise UsageError(f"{src}: --delete: the source is one object, so nothing at the "
                             "target is missing from it; leave --delete out")
        root, key, dst_url = _target_of(dst, name)
        if loc.scheme == "file" and parse_url(root).scheme == "file" and (
                os.path.realpath(os.path.join(root, key)) == os.path.realpath(src_url)):
            raise UsageError(f"{dst}: the target is the source file itself")
        target_root = open_target(root, target_options)
    except BaseException:
        await source_parent.aclose()
        raise
    source = one_object(source_parent, shown=key, real=name, url=src_url)
    # Not a LocalTree: the target's directory may hold the source's (a copy beside it), and
    # one key is all the run can write or delete there.
    target = one_object(target_root, shown=key, real=key, url=dst_url, without=(LocalTree,))
    return source, target


async def _as_prefix(parent: ReadStore, name: str, src: str, open_source: Opener,
                     options: StoreOptions) -> ReadStore | None:
    """The store of the prefix ``src/`` when ``src`` is one (today's meaning), None when it
    is the one object ``name`` of ``parent``: the key exists and nothing is under ``key/``."""
    try:
        await parent.head(name)
    except NotFound:
        return open_source(src, options)
    except MCSyncError as exc:
        await parent.aclose()
        raise as_config_error(exc, src, src) from exc
    under = open_source(src, options)
    try:
        first = await anext(aiter(under.list()), None)
    except BaseException:
        await under.aclose()
        await parent.aclose()
        raise
    if first is not None:
        return under  # "data" is an object and a directory: the directory, as before
    await under.aclose()
    return None


def _target_of(dst: str, name: str) -> tuple[str, str, str]:
    """Where one object named ``name`` goes: the target's root address, its key there, and
    its own address. A ``dst`` ending in ``/`` (or a local directory that exists) holds it
    under ``name``; any other names the object itself."""
    loc = parse_url(dst)
    if loc.scheme == "file":
        path = loc.prefix
        if dst.endswith("/") or os.path.isdir(path):
            root, key = path, name
        else:
            root, key = os.path.split(path)
            if not key:
                raise UsageError(f"{dst}: names no file")
        root = os.path.abspath(root or ".")
        return root, key, os.path.join(root, key)
    if dst.endswith("/") or not loc.prefix:
        root = dst if dst.endswith("/") else dst + "/"
        return root, name, root + name
    root, _, key = dst.rpartition("/")
    return root + "/", key, dst
