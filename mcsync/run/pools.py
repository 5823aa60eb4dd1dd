"""Which workers a run has (``--workers N``): chosen here, where the run is composed, so the
pools (``scale/``) stay a floor below it and none imports another.

``reopenable``: before anything is locked, whether the pair can be shared out at all (a view of
one object cannot: its address alone does not reopen it) and the addresses a worker reopens
its stores from; ``--executor ray`` connects to its cluster here. ``has_workers``: whether the
run has workers at all. ``open_pool``: the pool the engine hands its ``workers.Workers``, Ray
actors or processes on this machine. ``folds_case``:
a target whose names fold by case is written by the driver's process alone.
"""

from __future__ import annotations

import dataclasses
import logging

from ..config import SyncOptions
from ..scale.local_pool import LocalPool
from ..scale.worker_runner import Addresses, worker_options
from ..scale.workers import WorkerPool
from ..stores.base import CaseFolding, ReadStore
from ..stores.single import is_one_object

log = logging.getLogger(__name__)


def has_workers(options: SyncOptions) -> bool:
    """Does a run of ``options`` start workers? A dry run too (``mcsync plan``): the hashing
    reads of its delta previews go to them, as a sync's do (nothing else does: a dry run moves
    nothing, and its processes start only when a hash task does); but not on Ray, whose
    actors are placed at once: a dry run needs no cluster."""
    return bool(options.workers) and not (options.dry_run and options.executor == "ray")


def open_pool(addresses: Addresses, options: SyncOptions) -> WorkerPool:
    """The run's pool of ``options.workers`` workers, each with its share of the limits: Ray
    actors for ``--executor ray`` (``ray_pool``, whose import loads Ray), else processes here."""
    if options.executor == "ray":
        from ..scale.ray_pool import RayPool

        return RayPool(addresses, options, max(options.workers, 0), options.ray_address)
    n = options.workers
    return LocalPool(addresses, worker_options(options, n), n)


def reopenable(source: ReadStore, target: ReadStore,
               options: SyncOptions) -> tuple[SyncOptions, Addresses | None]:
    """A run's options and the addresses its workers reopen ``source`` and ``target`` from,
    for stores opened from addresses (their ``url``s open the same stores): the options
    without workers when the pair is one object (``stores.single``: nothing to share out).
    ``--executor ray`` connects here, before anything is locked: no cluster, exit 2 (a dry
    run moves nothing, and needs no cluster)."""
    if not options.workers:
        return options, None
    if is_one_object(source) or is_one_object(target):
        log.info("one object: moved without worker processes")
        return dataclasses.replace(options, workers=0), None
    if options.executor == "ray" and not options.dry_run:
        from ..scale.ray_pool import connect

        connect(options.ray_address)
    return options, Addresses(source.url, target.url, options.store_options("source"),
                              options.store_options("target"))


def folds_case(target: ReadStore) -> bool:
    """Does ``target`` (a directory whose filesystem folds case: ``CaseFolding``) tell two
    keys apart only by what one process remembers writing? Its whole objects then stay in the
    driver's process: two workers could each write one of two names that differ only by
    case, one file."""
    if not isinstance(target, CaseFolding):
        return False
    try:
        return target.folds_case()
    except OSError:  # cannot tell: as if it did
        return True
