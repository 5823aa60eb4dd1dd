"""``--executor ray``: the ``WorkerPool`` of Ray actors, each running a
``worker_runner.TaskRunner`` in its own process, on whichever node of the cluster Ray placed it.

Imported only when a run asks for Ray (``run.pools.open_pool``), and Ray only from here. The
driver connects once per process (``RAY_ADDRESS``, else a cluster running on this machine; a
process that called ``ray.init`` itself keeps its connection) and stays connected for its
later runs.

Each actor declares one CPU and its share of ``--memory-limit`` plus what its process needs
beyond the buffers (``OVERHEAD``), so Ray places it where both are free, spread over the nodes
(each node's NIC). An actor that dies (SIGKILL, OOM, its node gone) fails its task with
``WorkerLost`` and is replaced by a fresh one; ``workers.Workers`` gives the task to another.
Actors are the driver's: Ray ends them when the driver ends, killed or not.

Credentials: an actor is told where and how, never who. It is given ``Addresses`` (both
addresses and each side's ``StoreOptions``: endpoints, a profile's name, certificate paths),
the run's options, and the settings the driver resolved from its environment that say where
(``settings_of``: endpoints, regions, CA bundles, meta://'s endpoint and paths; they override
the node's, so the workers write where the driver planned). Each worker resolves its keys
itself, as the driver did, from its own environment and files: the nodes' (on Kubernetes, a
Secret in the Ray pods' env), or the job's runtime env set by whoever submitted it. mcsync
never puts a key in an actor's or task's arguments, nor in a runtime env of its own: Ray shows
those in its dashboard and state API. Paths (certificates, CA bundles) must exist on the nodes.
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
from ..types import MiB
from .worker_runner import (
    Addresses,
    TaskItem,
    TaskResult,
    TaskRunner,
    WorkerLost,
    WorkerUnavailable,
    worker_options,
)

log = logging.getLogger(__name__)

# What a worker's process holds beyond its share of --memory-limit (Python, the clients, their
# connection pools), declared to Ray with that share.
OVERHEAD = 512 * MiB
# A worker Ray could not start in this long (no node with a CPU and the memory free) is given up
# (its task WorkerUnavailable: tried again, then failed, the rest of the run goes on).
START_S = 120.0
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
    """One worker: a ``TaskRunner`` in a Ray actor's process (one task at a time; the process
    is the actor's alone, so its environment is ours to set)."""

    def __init__(self, addresses: Addresses, options: SyncOptions,
                 settings: dict[str, str]) -> None:
        os.environ.update(settings)
        self.runner = TaskRunner(addresses, options)

    def ready(self) -> str:
        """Who this worker is, as its tasks' results name it."""
        return f"pid {os.getpid()} on {socket.gethostname()}"

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
            raise UsageError(f"--executor ray: no Ray cluster reachable at {where}: "
                             f"{exc.strerror or exc}") from None
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
        raise UsageError(f"--executor ray: no Ray cluster reachable at {where}: "
                         f"{_first_line(exc)}") from None
    finally:
        for sig, handler in handlers.items():
            if handler is not None:
                with contextlib.suppress(ValueError):  # not the main thread: left to Ray
                    signal.signal(sig, handler)
    return ray


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


def cluster_cpus(ray: Any) -> int:
    """``--workers auto`` on Ray: the cluster's CPUs."""
    return max(1, int(ray.cluster_resources().get("CPU", 1)))


@dataclass(eq=False)
class _Slot:
    actor: Any
    ready: bool = False
    worker: str = ""  # "pid P on HOST", once ready


class RayPool:
    """The ``WorkerPool`` of ``n`` Ray actors (0: one per CPU of the cluster)."""

    def __init__(self, addresses: Addresses, options: SyncOptions, n: int,
                 address: str | None) -> None:
        self._ray = ray = connect(address)
        self.size = n if n > 0 else cluster_cpus(ray)
        self.options = worker_options(options, self.size)
        self.addresses = addresses
        self.settings = settings_of(addresses)
        self._worker = ray.remote(RayWorker).options(
            num_cpus=1, memory=self.options.memory_limit + OVERHEAD, max_restarts=0,
            scheduling_strategy="SPREAD")
        self._slots = [self._start() for _ in range(self.size)]
        self._idle: asyncio.Queue[_Slot] = asyncio.Queue()
        for slot in self._slots:
            self._idle.put_nowait(slot)

    def describe(self) -> str:
        return f"{self.size} Ray workers"

    def _start(self) -> _Slot:
        return _Slot(self._worker.remote(self.addresses, self.options, self.settings))

    def _replace(self, slot: _Slot) -> None:
        with contextlib.suppress(Exception):
            self._ray.kill(slot.actor, no_restart=True)
        fresh = self._start()
        self._slots = [fresh if s is slot else s for s in self._slots]
        self._idle.put_nowait(fresh)

    async def run(self, items: list[TaskItem]) -> TaskResult:
        from ray import exceptions as rx

        slot = await self._idle.get()
        try:
            if not slot.ready:
                slot.worker = str(await asyncio.wait_for(_awaited(slot.actor.ready.remote()),
                                                         START_S))
                slot.ready = True
            result = await _awaited(slot.actor.run.remote(items))
        except TimeoutError:
            self._replace(slot)
            raise WorkerUnavailable(f"Ray placed no worker within {START_S:.0f} s (each needs "
                                    f"1 CPU and {self._memory()} free on a node)") from None
        except rx.RayActorError as exc:
            self._replace(slot)
            if exc.actor_init_failed:  # mcsync missing on the node, say: another will fail too
                raise WorkerUnavailable(f"a Ray worker could not start: {_first_line(exc)}"
                                        ) from None
            raise WorkerLost(f"a Ray worker died ({_first_line(exc)})", slot.worker) from None
        except (rx.WorkerCrashedError, rx.NodeDiedError, rx.ObjectLostError,
                rx.OutOfMemoryError) as exc:
            self._replace(slot)
            raise WorkerLost(f"a Ray worker died ({_first_line(exc)})", slot.worker) from None
        except rx.RayTaskError as exc:  # the task's own code raised: as a local worker's would
            self._idle.put_nowait(slot)
            cause: BaseException = exc.as_instanceof_cause()  # type: ignore[no-untyped-call]
            raise cause from None
        except BaseException:
            self._idle.put_nowait(slot)  # cancelled: the actor finishes the task, then the next
            raise
        self._idle.put_nowait(slot)
        if not isinstance(result, TaskResult):
            raise TypeError(f"a worker returned {type(result).__name__}")
        return result

    def _memory(self) -> str:
        from ..config import format_size

        return format_size(self.options.memory_limit + OVERHEAD)

    async def aclose(self, *, wait: bool) -> None:
        """``wait``: each worker's task in flight ends and its stores close first."""
        slots, self._slots = self._slots, []
        if wait:
            closing = [_awaited(s.actor.close.remote()) for s in slots if s.ready]
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.gather(*closing, return_exceptions=True),
                                       CLOSE_S)
        for slot in slots:
            with contextlib.suppress(Exception):
                self._ray.kill(slot.actor, no_restart=True)


async def _awaited(ref: Any) -> Any:
    """An ObjectRef's value, on this loop (Ray's own ``await ref`` assumes asyncio's loop)."""
    return await asyncio.wrap_future(ref.future())


def _first_line(exc: BaseException) -> str:
    """Ray's errors run to tracebacks and hints: their first line, for one-line errors."""
    text = str(exc).strip()
    return (text.splitlines()[0] if text else type(exc).__name__)[:300]
