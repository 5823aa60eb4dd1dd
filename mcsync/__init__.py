"""mcsync: move ML datasets and checkpoints to Meta Storage, fast and resumably.

    import mcsync
    report = mcsync.sync("s3://datasets/llama-ft/", "meta://ckpt-store/llama-ft/")
    report = await mcsync.async_sync(src, dst, concurrency=64, on_event=print)
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from ._version import __version__
from .config import SyncOptions
from .errors import (
    ConfigError,
    IntegrityError,
    MCSyncError,
    NotFound,
    Permanent,
    PreconditionFailed,
    Transient,
    UnsafeKey,
    UsageError,
)
from .events import CallbackSink, Event, EventSink
from .report import ObjectResult, SyncReport
from .stores.base import ReadStore, Store

__all__ = [
    "ConfigError",
    "Event",
    "EventSink",
    "IntegrityError",
    "MCSyncError",
    "NotFound",
    "ObjectResult",
    "Permanent",
    "PreconditionFailed",
    "ReadStore",
    "Store",
    "SyncOptions",
    "SyncReport",
    "Transient",
    "UnsafeKey",
    "UsageError",
    "__version__",
    "async_sync",
    "sync",
]


async def async_sync(
    src: str | ReadStore,
    dst: str | Store,
    *,
    on_event: EventSink | Callable[[Event], None] | None = None,
    **options: Any,
) -> SyncReport:
    """Sync ``src`` to ``dst`` inside a running event loop. Each is an address
    (``s3://``, ``meta://``, ``gs://``, a path) or a store object (``mcsync.stores``: one of
    your own, or wrapped; it stays open, yours to close). ``options`` are the fields of
    ``SyncOptions`` (concurrency, part_size, memory_limit, include, exclude, delete, dry_run,
    endpoint_url, profile). ``on_event`` receives every engine event (see ``mcsync.events``)."""
    from .engine import run_sync

    sink = on_event if on_event is None or isinstance(on_event, EventSink) else CallbackSink(
        on_event)
    for name in ("include", "exclude"):
        if isinstance(options.get(name), str):
            options[name] = (options[name],)
        elif name in options:
            options[name] = tuple(options[name])
    return await run_sync(src, dst, SyncOptions(**options), sink)


def sync(src: str | ReadStore, dst: str | Store, **options: Any) -> SyncReport:
    """Blocking form of :func:`async_sync` (runs its own event loop, on uvloop if installed)."""
    return run_blocking(async_sync(src, dst, **options))


def run_blocking(coro: Any) -> Any:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency off Windows
        return asyncio.run(coro)
    return uvloop.run(coro)
