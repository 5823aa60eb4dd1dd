"""``--executor ray``: the ``WorkerPool`` of Ray actors, each running a
``worker_runner.TaskRunner`` in its own process, on whichever node of the cluster Ray placed it.

Imported only when a run asks for Ray (``run.pools.open_pool``), and Ray only from here. The
driver connects once per process (``RAY_ADDRESS``, else a cluster running on this machine; a
process that called ``ray.init`` itself keeps its connection) and stays connected for its
later runs. No cluster there: exit 2 in mcsync's words (``--ray-address``, ``RAY_ADDRESS``).

Placed once, at start: each actor declares one CPU and its share of ``--memory-limit`` plus
what its process needs beyond the buffers (``OVERHEAD``); as many as the nodes have room for
now (``--workers auto``: one per free CPU) go into a placement group spread over the nodes
(each node's NIC: ``ray_placement``), fewer than asked said in the log, none refused (exit 2).
Each started actor then says what it sees at the run's local paths (``shared_paths``): one that
does not see the driver's files refuses the run (exit 2) before any task; one that could not
start (mcsync missing on its node) is left out, named in the log. An actor that dies (SIGKILL,
OOM, its node gone) or outlives its task's deadline (killed) fails its task with ``WorkerLost``
and is replaced by a fresh one in its bundle, which looks at the local paths again before its
first task (not started, or not seeing them: ``WorkerUnavailable``); ``workers.Workers`` gives
the task to another. An exception of the task's own is ``TaskFailed``. Actors and their
placement group are the driver's: Ray ends them when the driver ends, killed or not.

What an actor spent (its requests' time, CPU, its loop) comes back with each task's result, as
a local worker's does, for the run's verdict; its CPU counts against its node's cores, not the
one CPU it declared (``bottleneck.with_workers``).

Credentials: an actor is told where and how, never who. It is given ``Addresses`` (both
addresses and each side's ``StoreOptions``: endpoints, a profile's name, certificate paths),
the run's options, and, as its runtime env's variables, the settings the driver resolved from
its environment that say where (``settings_of``: endpoints, regions, CA bundles, meta://'s
endpoint and paths; they override the node's, so the workers write where the driver planned;
Ray merges them into the job's own runtime env). Each worker resolves its keys itself, as the
driver did, from its own environment and files: the nodes' (on Kubernetes, a Secret in the Ray
pods' env), or the job's runtime env set by whoever submitted it. mcsync never puts a key in an
actor's or task's arguments, nor in its runtime env: Ray shows those in its dashboard and state
API. Paths (certificates, CA bundles) must exist on the nodes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
from dataclasses import dataclass
from typing import Any

from ..config import SyncOptions
from ..errors import UsageError
from ..stores.registry import meta_settings
from .ray_placement import OVERHEAD, free_cpus, node_of, place, remove
from .shared_paths import (
    NodeView,
    RootProbe,
    absolute,
    probe_roots,
    remove_markers,
    unseen,
    view_of,
)
from .worker_runner import (
    Addresses,
    TaskFailed,
    TaskItem,
    TaskResult,
    TaskRunner,
    WorkerLost,
    WorkerUnavailable,
)

log = logging.getLogger(__name__)

# A placed worker whose process has not answered in this long is given up (its start is a
# process and mcsync's imports: seconds; a node that cannot start it fails it at once).
START_S = 60.0
LOOK_S = 30.0  # a worker's look at the local roots (a mount that hangs)
CLOSE_S = 30.0  # a stopping worker's last task and its stores' closing
PROBE_S = 5.0  # connecting to the cluster's address


# Environment variables that say where a store is and how to reach it, never who signs: the
# driver's values are the workers' (keys, tokens, profiles and connection strings are not here).
PASSED = ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_REGION", "AWS_DEFAULT_REGION",
          "AWS_CA_BUNDLE", "AZURE_STORAGE_ENDPOINT", "AZURE_ENDPOINT",
          "AZURE_STORAGE_ACCOUNT_NAME", "STORAGE_EMULATOR_HOST")
META_PASSED = ("endpoint_url", "region", "path_style", "ca_bundle", "client_cert", "client_key")


def settings_of(addresses: Addresses) -> dict[str, str]:
    """What the driver resolved of ``PASSED`` and of meta://'s settings (its environment over
    its config file's profile), as environment variables for a worker."""
    env = {name: os.environ[name] for name in PASSED if os.environ.get(name)}
    if any(a.startswith("meta://") for a in (addresses.source, addresses.target)):
        meta = meta_settings()
        env |= {f"MCSYNC_META_{name.upper()}": meta[name] for name in META_PASSED
                if meta.get(name)}
    return env


class RayWorker:
    """One worker: a ``TaskRunner`` in a Ray actor's process (one task at a time), which looks
    at the run's local roots before its first task (``shared_paths``)."""

    def __init__(self, addresses: Addresses, options: SyncOptions) -> None:
        self.runner = TaskRunner(addresses, options)

    def ready(self) -> tuple[str, str]:
        """Who this worker is, as its tasks' results name it ("pid P on HOST"), and its
        node's address."""
        import ray

        node = str(ray.util.get_node_ip_address())  # type: ignore[no-untyped-call]
        return f"pid {os.getpid()} on {socket.gethostname()}", node

    def look(self, probes: list[RootProbe]) -> list[NodeView]:
        return [view_of(probe) for probe in probes]

    def run(self, items: list[TaskItem]) -> TaskResult:
        return self.runner.run(items)

    def close(self) -> None:
        self.runner.close()


def connect(address: str | None) -> Any:
    """The ``ray`` module, connected to the cluster at ``address`` (None: ``RAY_ADDRESS``, else
    one started on this machine): UsageError (exit 2) naming the address when Ray is not
    installed or no cluster answers there."""
    try:
        import ray
    except ImportError:
        raise UsageError("--executor ray: Ray is not installed here (pip install "
                         "'mcsync[ray]')") from None
    if ray.is_initialized():
        return ray
    where = address or os.environ.get("RAY_ADDRESS") or "auto"
    # Ray retries an address where nothing listens for minutes, logging each try to stderr:
    # one connection first tells a wrong address in seconds.
    host_port = _host_port(where)
    if host_port is not None:
        try:
            socket.create_connection(host_port, timeout=PROBE_S).close()
        except OSError as exc:
            raise _unreachable(address, where, exc.strerror or str(exc)) from None
    _errors_to_log()
    # Ray's core installs its own SIGTERM/SIGINT handlers (log a stack, die): the run's are put
    # back, so a stop still lets work in flight finish and saves the state (exit 130).
    stops = (signal.SIGTERM, signal.SIGINT)
    handlers = {sig: signal.getsignal(sig) for sig in stops}
    try:
        # log_to_driver off: the workers' output stays in the cluster's logs, never on this
        # command's stdout (--json) or stderr.
        ray.init(address=where, log_to_driver=False, logging_level=logging.WARNING,
                 configure_logging=False)
    except Exception as exc:  # ConnectionError, ValueError, Ray's RpcError...
        raise _unreachable(address, where, _first_line(exc)) from None
    finally:
        for sig, handler in handlers.items():
            if handler is not None:
                with contextlib.suppress(ValueError):  # not the main thread: left to Ray
                    signal.signal(sig, handler)
    return ray


def _unreachable(given: str | None, where: str, cause: str) -> UsageError:
    """No cluster at ``where``, in mcsync's words: Ray's own tell the user to set ``--address``,
    a flag of ``ray``'s commands, not mcsync's."""
    if where == "auto":
        return UsageError("--executor ray: no Ray cluster is running on this machine; give a "
                          "cluster's address with --ray-address or RAY_ADDRESS (its GCS, "
                          "host:port, or ray://host:10001)")
    if "--address" in cause or "RAY_ADDRESS" in cause:
        cause = "no Ray cluster answered there"
    source = "--ray-address" if given else "RAY_ADDRESS"
    return UsageError(f"--executor ray: no Ray cluster reachable at {where} (from {source}): "
                      f"{cause}; give --ray-address or RAY_ADDRESS the address of a running "
                      f"cluster's GCS (host:port, or ray://host:10001)")


def _errors_to_log() -> None:
    """Ray prints the errors its nodes report (a worker killed, say) on the driver's stdout,
    where ``--json`` writes the report: they go to this module's log (stderr) instead. Its
    error thread calls ``ray._private.worker.print_to_stdstream`` by name; without that
    function (another Ray), nothing changes."""
    with contextlib.suppress(ImportError):
        from ray._private import worker

        if callable(getattr(worker, "print_to_stdstream", None)):
            worker.print_to_stdstream = _log_lines


def _log_lines(data: dict[str, Any], ignore_prefix: bool = False) -> None:
    for line in data.get("lines", ()):
        if str(line).strip():
            log.warning("Ray (%s): %s", data.get("pid", "?"), str(line).strip().splitlines()[0])


def _host_port(address: str) -> tuple[str, int] | None:
    """(host, port) of a GCS or Ray Client address (``host:port``, ``ray://host:port``,
    ``[v6]:port``); None for ``auto`` / ``local`` and what Ray alone reads."""
    rest = address.removeprefix("ray://")
    host, sep, port = rest.rpartition(":")
    if not sep or not host or not port.isdigit():
        return None
    return host.strip("[]"), int(port)


@dataclass(eq=False)
class _Slot:
    actor: Any
    bundle: int  # its place in the run's placement group: a replacement takes the same
    worker: str = ""  # "pid P on HOST", as its tasks' results name it, once it answered
    node: str = ""  # its node's address, once it answered
    ready: bool = False  # started and seeing the local roots as the driver does

    @property
    def name(self) -> str:
        return f"{self.worker} (node {self.node})" if self.worker else "a Ray worker"


class RayPool:
    """The ``WorkerPool`` of ``n`` Ray actors (0: one per CPU free in the cluster), placed
    once, at start, in a placement group (SPREAD: over the nodes), and checked there."""

    def __init__(self, addresses: Addresses, options: SyncOptions, n: int,
                 address: str | None) -> None:
        self._ray = ray = connect(address)
        self._class = ray.remote(RayWorker)
        self.addresses = absolute(addresses)
        self._env = ({"env_vars": settings} if (settings := settings_of(addresses)) else None)
        self.task_timeout = options.task_timeout
        self._group: Any = None
        self._slots: list[_Slot] = []
        self._probes: list[RootProbe] = []
        try:
            self._group, self.size, self.options = place(ray, n if n > 0 else free_cpus(ray),
                                                         options)
            self._probes = probe_roots(self.addresses)
            self._slots = self._start_all()
        except BaseException:
            self._drop()
            raise
        self.size = len(self._slots)
        self._idle: asyncio.Queue[_Slot] = asyncio.Queue()
        for slot in self._slots:
            self._idle.put_nowait(slot)

    def describe(self) -> str:
        return f"{self.size} Ray workers"

    # -- start ------------------------------------------------------------------------------

    def _new(self, bundle: int) -> _Slot:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        actor = self._class.options(
            num_cpus=1, memory=self.options.memory_limit + OVERHEAD, max_restarts=0,
            runtime_env=self._env, scheduling_strategy=PlacementGroupSchedulingStrategy(
                self._group, placement_group_bundle_index=bundle),
        ).remote(self.addresses, self.options)
        return _Slot(actor, bundle)

    def _start_all(self) -> list[_Slot]:
        """Every worker started and asked what it sees at the local roots, before any task
        (this blocks the caller, once, for seconds): one that does not see them refuses the
        run (exit 2); those that could not start are left out, and said so in the log (none
        started: exit 2, naming the node and the cause)."""
        from ray import exceptions as rx

        slots = self._slots = [self._new(i) for i in range(self.size)]
        asked = {s.actor.ready.remote(): s for s in slots}
        answered, late = self._ray.wait(list(asked), num_returns=len(asked), timeout=START_S)
        up: list[_Slot] = []
        failed = [f"not started within {START_S:.0f} s" for _ in late]
        for ref in answered:
            try:
                asked[ref].worker, asked[ref].node = self._ray.get(ref)
            except rx.RayError as exc:
                failed.append(_cause(exc, self._node_of(asked[ref])))
                continue
            up.append(asked[ref])
        for slot in slots:
            if slot not in up:
                self._kill(slot)
        self._slots = up
        if not up:
            raise UsageError(f"--executor ray: no Ray worker could start ({failed[0]})")
        if failed:
            log.warning("%d of the %d Ray workers started (%s): running with those",
                        len(up), len(slots), failed[0])
        try:
            views = self._ray.get([s.actor.look.remote(self._probes) for s in up],
                                  timeout=LOOK_S) if self._probes else [[] for _ in up]
        except rx.RayError as exc:  # GetTimeoutError among them: a mount that hangs
            raise UsageError(f"--executor ray: a Ray worker could not look at "
                             f"{', '.join(p.root for p in self._probes)} ({_cause(exc)})"
                             ) from None
        for slot, seen in zip(up, views, strict=True):
            if (why := self._unseen(seen)) is not None:
                raise UsageError(f"--executor ray: node {slot.node} {why}")
            slot.ready = True
        return up

    def _unseen(self, views: list[NodeView]) -> str | None:
        """Why a worker that saw ``views`` cannot run this run's tasks (None: it can)."""
        for probe, view in zip(self._probes, views, strict=True):
            if (why := unseen(probe, view)) is not None:
                side = "SRC" if probe.role == "source" else "DST"
                return (f"does not see the files this machine sees at {probe.root} ({why}): "
                        f"a local {side} under --executor ray must be on a filesystem every "
                        f"node mounts (NFS, Lustre, a volume on each node), or give an object "
                        f"store address")
        return None

    async def _bring_up(self, slot: _Slot) -> None:
        """A replacement's start and look at the local roots, before its first task."""
        slot.worker, slot.node = await asyncio.wait_for(_awaited(slot.actor.ready.remote()),
                                                        START_S)
        if self._probes:
            views = await asyncio.wait_for(_awaited(slot.actor.look.remote(self._probes)),
                                           LOOK_S)
            if (why := self._unseen(views)) is not None:
                raise WorkerUnavailable(f"the Ray worker on node {slot.node} {why}")
        slot.ready = True

    def _node_of(self, slot: _Slot) -> str | None:
        return node_of(self._ray, self._group, slot.bundle)

    def _kill(self, slot: _Slot) -> None:
        with contextlib.suppress(Exception):
            self._ray.kill(slot.actor, no_restart=True)

    def _replace(self, slot: _Slot) -> None:
        """A fresh worker in ``slot``'s place (its bundle: its node, while that lives); none
        once the pool is closed."""
        self._kill(slot)
        if self._group is None:
            return
        fresh = self._new(slot.bundle)
        self._slots = [fresh if s is slot else s for s in self._slots]
        self._idle.put_nowait(fresh)

    # -- tasks ------------------------------------------------------------------------------

    async def run(self, items: list[TaskItem], *,
                  deadline_s: float | None = None) -> TaskResult:
        """``deadline_s`` (None: the run's ``task_timeout``, if any): a task still running
        then has its actor killed and replaced, and fails ``WorkerLost``."""
        from ray import exceptions as rx

        deadline = deadline_s if deadline_s is not None else self.task_timeout
        slot = await self._idle.get()
        try:
            if not slot.ready:
                await self._bring_up(slot)
        except (TimeoutError, rx.RayError, WorkerUnavailable) as exc:
            self._replace(slot)
            if isinstance(exc, WorkerUnavailable):
                raise
            why = (f"not started within {START_S:.0f} s" if isinstance(exc, TimeoutError)
                   else _cause(exc, self._node_of(slot)))
            raise WorkerUnavailable(f"a Ray worker could not start ({why})") from None
        except BaseException:
            self._idle.put_nowait(slot)
            raise
        # Waited for, not wait_for: a TimeoutError the task itself raised is its own failure.
        running = asyncio.ensure_future(_awaited(slot.actor.run.remote(items)))
        try:
            done, _ = await asyncio.wait({running}, timeout=deadline)
        except BaseException:
            running.cancel()
            self._idle.put_nowait(slot)  # cancelled: the actor finishes the task, then the next
            raise
        if not done:
            running.cancel()
            self._replace(slot)
            raise WorkerLost(f"task timed out after {deadline:.0f} s on {slot.name}; that "
                             f"Ray worker was killed", slot.worker)
        try:
            result = running.result()
        except rx.RayActorError as exc:
            self._replace(slot)
            if exc.actor_init_failed:  # mcsync missing on the node, say: another will fail too
                raise WorkerUnavailable(f"a Ray worker could not start "
                                        f"({_cause(exc, self._node_of(slot))})"
                                        ) from None
            raise WorkerLost(f"a Ray worker died ({slot.name}: {_first_line(exc)})",
                             slot.worker) from None
        except (rx.WorkerCrashedError, rx.NodeDiedError, rx.ObjectLostError,
                rx.OutOfMemoryError) as exc:
            self._replace(slot)
            raise WorkerLost(f"a Ray worker died ({slot.name}: {_first_line(exc)})",
                             slot.worker) from None
        except rx.RayTaskError as exc:  # the task's own code raised: its failure, not the worker's
            self._idle.put_nowait(slot)
            cause = exc.cause if isinstance(exc.cause, BaseException) else exc
            raise TaskFailed(f"{type(cause).__name__}: {_first_line(cause)}",
                             slot.worker) from cause
        except BaseException:
            self._idle.put_nowait(slot)
            raise
        self._idle.put_nowait(slot)
        if not isinstance(result, TaskResult):
            raise TypeError(f"a worker returned {type(result).__name__}")
        return result

    async def aclose(self, *, wait: bool) -> None:
        """``wait``: each worker's task in flight ends and its stores close first."""
        slots = self._slots
        if wait:
            closing = [_awaited(s.actor.close.remote()) for s in slots if s.ready]
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.gather(*closing, return_exceptions=True),
                                       CLOSE_S)
        self._drop()

    def _drop(self) -> None:
        """Every worker killed, the placement group removed, the markers taken back."""
        slots, self._slots = self._slots, []
        for slot in slots:
            self._kill(slot)
        if self._group is not None:
            remove(self._ray, self._group)
            self._group = None
        remove_markers(self._probes)


async def _awaited(ref: Any) -> Any:
    """An ObjectRef's value, on this loop (Ray's own ``await ref`` assumes asyncio's loop)."""
    return await asyncio.wrap_future(ref.future())


def _cause(exc: BaseException, node: str | None = None) -> str:
    """Why an actor could not start, naming its node: Ray's text's (``ip: ...``), else
    ``node``."""
    text = str(exc)
    node = next((line.split(":", 1)[1].strip() for line in text.splitlines()
                 if line.strip().startswith("ip:")), node)
    found = next((line.strip() for line in reversed(text.splitlines())
                  if line.strip() and ("Error" in line or "error" in line)), None)
    where = f"node {node}: " if node else ""
    return f"{where}{(found or _first_line(exc))[:300]}"


def _first_line(exc: BaseException) -> str:
    """Ray's errors run to tracebacks and hints: their first line, for one-line errors."""
    text = str(exc).strip()
    return (text.splitlines()[0] if text else type(exc).__name__)[:300]
