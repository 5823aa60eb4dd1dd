"""``mcsync cache warm``: the objects under an address fetched into the cache, in a given order
of reads when there is one, until the next one would only fit by evicting one this same warm
brought in (or found): then it stops and says what it left out.

The listing gives each object's current version at no cost; a cached entry of another
version is kept as it is when ``--validate`` trusts it (``never``, or ``ttl`` checked
recently), and fetched anew otherwise.

With an order, eviction is Belady's (what is needed furthest in the future goes first,
entries the order never names before them), so a dataset larger than the cache keeps its
first part, the part a training job reads first; without one, least recently used.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from ..errors import CacheFull, MCSyncError
from ..events import WarmListed
from ..stores.registry import open_store
from ..types import ObjectInfo
from .cache import Cache, object_url
from .index import version_of

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


async def warm(cache: Cache, url: str, order: list[str] | None = None, *,
               on_object: Progress = lambda u, s, n: None) -> WarmReport:
    """Fetch the objects under ``url`` (in ``order``'s, keys relative to ``url``, when
    given) into ``cache``; see the module's docstring. Runs on the cache's loop."""
    prefix, _, _ = object_url(url if url.endswith("/") else url + "/")
    lister = open_store(prefix, cache.store_options)
    try:
        listed = {i.key: i async for i in lister.list()}
    finally:
        await lister.aclose()
    report = WarmReport()
    keys = list(listed) if order is None else order
    report.missing = [prefix + k for k in keys if k not in listed]
    todo = [(prefix + k, listed[k]) for k in keys if k in listed]
    cache.emit(WarmListed(len(todo), sum(info.size for _, info in todo)))
    token = uuid.uuid4().hex
    before = cache.stats.bytes_fetched
    if order is not None:
        cache.next_use = {u: i for i, (u, _) in reversed(list(enumerate(todo)))}
    stop = asyncio.Event()
    slots = asyncio.Semaphore(OBJECTS_IN_FLIGHT)

    async def one(index: int, obj_url: str, info: ObjectInfo) -> None:
        async with slots:
            if stop.is_set():
                report.left_out.append(obj_url)
                return
            found = cache.index.find(obj_url, version_of(info))
            latest = cache.index.newest_complete(obj_url)
            cached = (found is not None and found.state == "complete") or (
                latest is not None and cache.validation.fresh(latest, time.time()))
            try:
                await cache.obtain(obj_url, info, warmed_by=token, protect=token)
            except CacheFull as exc:
                if not stop.is_set():
                    report.why_stopped = str(exc)
                stop.set()
                report.left_out.append(obj_url)
                on_object(obj_url, "left out", info.size)
                return
            except MCSyncError as exc:
                report.failed.append((obj_url, str(exc)))
                on_object(obj_url, "failed", info.size)
                return
            state = "present" if cached else "fetched"
            (report.present if state == "present" else report.fetched).append(obj_url)
            on_object(obj_url, state, info.size)

    try:
        async with asyncio.TaskGroup() as group:
            for i, (obj_url, info) in enumerate(todo):
                group.create_task(one(i, obj_url, info))
    finally:
        cache.next_use = None
    position = {u: i for i, (u, _) in enumerate(todo)}
    report.left_out.sort(key=position.__getitem__)
    report.bytes_fetched = cache.stats.bytes_fetched - before
    return report
