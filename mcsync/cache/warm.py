"""``mcsync cache warm``: the objects under an address fetched into the cache, in a given order
of reads when there is one, until the next one would only fit by evicting one this same warm
brought in (or found): then it stops and says what it left out.

The listing gives each object's current version at no cost; a cached entry of another
version is kept as it is when ``--validate`` trusts it (``never``, or ``ttl`` checked
recently), and fetched anew otherwise.

With an order, eviction is Belady's (what is needed furthest in the future goes first,
entries the order never names before them), so a dataset larger than the cache keeps its
first part, the part a training job reads first; without one, least recently used.

mcsync's own state at a target (``.mcsync/``, at any depth under the address) is not data,
and is not warmed.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from ..errors import CacheFull, MCSyncError
from ..events import WarmListed
from ..stores.registry import open_store
from ..types import RESERVED_PREFIX, ObjectInfo
from .cache import Cache
from .index import version_of
from .terms import object_url

OBJECTS_IN_FLIGHT = 16  # objects fetched at once (each in parallel ranges)


@dataclass(slots=True)
class WarmReport:
    fetched: list[str] = field(default_factory=list)
    present: list[str] = field(default_factory=list)  # complete already: nothing fetched
    left_out: list[str] = field(default_factory=list)  # would not fit (the first says why)
    failed: list[tuple[str, str]] = field(default_factory=list)  # (URL, error)
    missing: list[str] = field(default_factory=list)  # named by the order, not at the source
    bytes_fetched: int = 0
    why_stopped: str = ""


Progress = Callable[[str, str, int], None]  # (URL, "fetched" | "present" | ..., size)


def read_order(text: str) -> list[str]:
    """The keys of an order file: one a line, blank lines and ``#`` comments skipped."""
    return [line.strip() for line in text.splitlines()
            if line.strip() and not line.lstrip().startswith("#")]


def mcsync_state(key: str) -> bool:
    """Is ``key`` (under the warmed prefix) mcsync's own state at a target, at any depth?"""
    return key.startswith(RESERVED_PREFIX) or f"/{RESERVED_PREFIX}" in key


async def warm(cache: Cache, url: str, order: list[str] | None = None, *,
               on_object: Progress = lambda u, s, n: None,
               window: int = OBJECTS_IN_FLIGHT) -> WarmReport:
    """Fetch the objects under ``url`` (in ``order``'s, keys relative to ``url``, when
    given) into ``cache``; see the module's docstring. Runs on the cache's loop.

    The listing is streamed through a window of ``window`` objects in flight (without an
    order: memory flat in the number of objects, but for the report's lists); with an order,
    the listing keeps only the keys the order names."""
    prefix, _, _ = object_url(url if url.endswith("/") else url + "/")
    report = WarmReport()
    token = uuid.uuid4().hex
    before = cache.stats.bytes_fetched
    listed = [0, 0]  # objects, bytes

    async def listing() -> AsyncIterator[ObjectInfo]:
        lister = open_store(prefix, cache.store_options)
        try:
            async for info in lister.list():
                if not mcsync_state(info.key):
                    listed[0] += 1
                    listed[1] += info.size
                    yield info
        finally:
            await lister.aclose()
        if order is None:
            cache.emit(WarmListed(*listed))

    async def todo() -> AsyncIterator[tuple[str, ObjectInfo]]:
        if order is None:
            async for info in listing():
                yield prefix + info.key, info
            return
        wanted = set(order)
        found = {i.key: i async for i in listing() if i.key in wanted}
        report.missing = [prefix + k for k in order if k not in found]
        first: dict[str, int] = {}
        for i, k in enumerate(order):
            if k in found:
                first.setdefault(prefix + k, i)
        cache.next_use = first
        named = [found[k] for k in order if k in found]
        cache.emit(WarmListed(len(named), sum(i.size for i in named)))
        for k in order:
            if k in found:
                yield prefix + k, found[k]

    stop = asyncio.Event()
    slots = asyncio.Semaphore(window)
    left_out: list[tuple[int, str]] = []

    async def one(position: int, obj_url: str, info: ObjectInfo) -> None:
        try:
            if stop.is_set():
                left_out.append((position, obj_url))
                return
            found = await asyncio.to_thread(cache.index.find, obj_url, version_of(info))
            latest = await asyncio.to_thread(cache.index.newest_complete, obj_url)
            cached = (found is not None and found.state == "complete") or (
                latest is not None and cache.validation.fresh(latest, time.time()))
            try:
                await cache.obtain(obj_url, info, warmed_by=token, protect=token)
            except CacheFull as exc:
                if not stop.is_set():
                    report.why_stopped = str(exc)
                stop.set()
                left_out.append((position, obj_url))
                on_object(obj_url, "left out", info.size)
                return
            except MCSyncError as exc:
                report.failed.append((obj_url, str(exc)))
                on_object(obj_url, "failed", info.size)
                return
            state = "present" if cached else "fetched"
            (report.present if state == "present" else report.fetched).append(obj_url)
            on_object(obj_url, state, info.size)
        finally:
            slots.release()

    try:
        async with asyncio.TaskGroup() as group:
            position = 0
            async for obj_url, info in todo():
                await slots.acquire()
                group.create_task(one(position, obj_url, info))
                position += 1
    finally:
        cache.next_use = None
    report.left_out = [u for _, u in sorted(left_out)]
    report.bytes_fetched = cache.stats.bytes_fetched - before
    return report
