"""``RunContext``: what is the same for the whole run, in one frozen record.

The engine (``run.engine``) builds it once per run from the stores it opened and wrapped, the
run's options, its limits, where its events go and its stop signal, and hands it down: the
driver, the dispatch unit, the transfer and its uploads each take it plus what is theirs alone
(the manifest, the uploads a killed run left, the workers). A worker process builds its own
from the stores it reopened (``scale.worker_runner``). A run-wide input is a field of
``config.SyncOptions`` (read here as ``ctx.options``), never a new constructor parameter
threaded through every floor.

It lives in ``move/``, the lowest package every floor of a run is in or above; the delta and
the stores below it are handed the parts they use.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

from ..config import SyncOptions
from ..events import Event
from ..limits import Limits
from ..stores.base import ReadStore, Store


@dataclass(frozen=True, slots=True)
class RunContext:
    """The run as each of its floors sees it: the source and target (wrapped by the retry
    layer), the options, the run's limits (requests in flight, memory, parts on the wire),
    where its events go (``emit``: progress, outcomes; the report is built from them) and its
    stop signal (set: wind down, what is in flight gets ``options.grace_s``)."""

    src: ReadStore
    dst: Store
    options: SyncOptions
    limits: Limits
    emit: Callable[[Event], None]
    stop: asyncio.Event
