"""Where ``--executor ray``'s actors go: counted once, at start, from what each node has free
now, and reserved in one placement group spread over the nodes (each node's NIC).

Each actor declares one CPU and its share of ``--memory-limit`` plus what its process needs
beyond the buffers (``OVERHEAD``). ``room``: how many of the workers asked fit; ``place``: a
placement group of that many bundles (fewer than asked: said in the log; none: exit 2), counted
again when another job took the room before Ray placed it. ``node_of``: the address of the node
a bundle is on, to name it in errors.

Ray is used through the connected module ``ray_pool.connect`` hands over, never imported here:
``ray_pool`` stays the one module that imports it.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

from ..config import SyncOptions, format_size
from ..errors import UsageError
from ..types import MiB
from .worker_runner import worker_options

log = logging.getLogger(__name__)

# What a worker's process holds beyond its share of --memory-limit (Python, the clients, their
# connection pools), declared to Ray with that share.
OVERHEAD = 512 * MiB
# A placement group of what had room a moment ago not placed in this long: the room is counted
# again (another job took it), PLACE_TRIES times, then the run is refused.
PLACE_S = 10.0
PLACE_TRIES = 3


def free_cpus(ray: Any) -> int:
    """``--workers auto`` on Ray: the CPUs the cluster has free now (at least one asked)."""
    return max(1, int(ray.available_resources().get("CPU", 0) + 1e-6))


def _free_per_node(ray: Any) -> list[tuple[float, float]]:
    """(CPUs, memory) each node has free now. Ray's per-node table is not public API: where
    it is missing, the cluster's total, as if one node."""
    try:
        nodes = list(ray._private.state.available_resources_per_node().values())
    except AttributeError:
        nodes = [ray.available_resources()]
    return [(float(n.get("CPU", 0)), float(n.get("memory", 0))) for n in nodes]


def room(free: list[tuple[float, float]], asked: int, options: SyncOptions) -> int:
    """How many of ``asked`` workers fit on nodes with ``free`` (CPUs, memory) each: a worker
    takes 1 CPU and its share of ``--memory-limit`` (larger, the fewer they are) + OVERHEAD."""
    for n in range(asked, 0, -1):
        each = worker_options(options, n).memory_limit + OVERHEAD
        if sum(min(int(cpu + 1e-6), int(memory // each)) for cpu, memory in free) >= n:
            return n
    return 0


def place(ray: Any, asked: int, options: SyncOptions) -> tuple[Any, int, SyncOptions]:
    """A placement group (SPREAD) of as many of ``asked`` workers as the nodes have room for
    now, how many, and the options of each (fewer than asked: said in the log; none: exit 2)."""
    for _ in range(PLACE_TRIES):
        free = _free_per_node(ray)
        n = room(free, asked, options)
        each = worker_options(options, max(n, 1))
        need = f"1 CPU and {format_size(each.memory_limit + OVERHEAD)} of memory"
        if n == 0:
            cpus = sum(c for c, _ in free)
            raise UsageError(
                f"--executor ray: no node of the Ray cluster has room for a worker now "
                f"(each needs {need}; free: {cpus:g} CPUs, "
                f"{format_size(int(max((m for _, m in free), default=0)))} of memory on "
                f"the freest of {len(free)} nodes)")
        group = ray.util.placement_group(
            [{"CPU": 1, "memory": each.memory_limit + OVERHEAD}] * n, strategy="SPREAD")
        placed, _ = ray.wait([group.ready()], timeout=PLACE_S)
        if placed:
            if n < asked:
                log.warning("Ray has room for %d of the %d workers asked (each needs %s): "
                            "running with %d", n, asked, need, n)
            return group, n, each
        # Another job took the room meanwhile: counted again.
        ray.util.remove_placement_group(group)
    raise UsageError(f"--executor ray: Ray placed none of the workers that had room "
                     f"within {PLACE_S:.0f} s, {PLACE_TRIES} times (the cluster is busy)")


def remove(ray: Any, group: Any) -> None:
    """``group`` given back to the cluster (what cannot be: left to Ray, which ends it with
    the driver)."""
    with contextlib.suppress(Exception):
        ray.util.remove_placement_group(group)


def node_of(ray: Any, group: Any, bundle: int) -> str | None:
    """The address of the node ``bundle`` of ``group`` is on (None: not known)."""
    with contextlib.suppress(Exception):
        node_id = ray.util.placement_group_table(group)["bundles_to_node_id"][bundle]
        return next(str(n["NodeManagerAddress"]) for n in ray.nodes()
                    if n["NodeID"] == node_id)
    return None
