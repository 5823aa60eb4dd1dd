"""A local Ray cluster for tests and benchmarks: a head and a worker node, each a ``ray start
--block`` child process on 127.0.0.1 with every port pinned (picked free), a temp dir of its
own, usage stats off and small CPU counts.

Stopped by the PIDs of its own ``ray start`` processes (each leads a process group that holds
its raylet, GCS and workers): never ``ray stop``, which stops every Ray cluster on the machine.
``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` for the head and drivers: without it Ray replaced
127.0.0.1 with the host's address (a worker node refuses to join with it, and joins at
``WORKER_IP``). Nodes die with this process (``processes.Child``).

``env`` is what the nodes (so every worker Ray starts on them) have in their environment, over a
scrubbed copy of this process's: credentials a worker resolves itself, as on a real cluster.

``worker_private``: a directory the worker node sees as another machine would see its own local
disk at that path: its ``ray start`` runs in a mount namespace of its own (``unshare -m``, as
root) with an empty tmpfs mounted over the directory, so its raylet and every worker it starts
see that tmpfs while this machine sees the directory. ``private_mounts()`` says whether this
machine can (the reason when not, for a test to skip with).

    python -m testbed.ray_cluster --cpus 2    # prints the address, runs until Ctrl-C
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from .processes import LOOPBACK, Child, ServerStartError, free_ports, python_child_env

__all__ = ["RayCluster", "RayMissing", "private_mounts", "ray_cluster"]

log = logging.getLogger(__name__)

ATTEMPTS = 3  # starts, when another process took one of the ports first
WORKER_PORTS = 16  # worker processes a node may run at once (each listens on one port)
# The worker node: another loopback address (as another machine), and the head's GCS by its
# IPv4-mapped address, which Ray does not replace with the host's as it does 127.0.0.1 (the
# head's GCS listens on 127.0.0.1 alone).
WORKER_IP = "127.0.0.2"


class RayMissing(RuntimeError):
    """Ray is not installed (``pip install 'mcsync[ray]'``)."""


@dataclass
class RayCluster:
    address: str  # 127.0.0.1:PORT, the GCS: what ray.init(address=...) and RAY_ADDRESS take
    temp_dir: Path  # every log and socket of the cluster's sessions is under it
    nodes: list[Child] = field(repr=False)
    env: dict[str, str] = field(repr=False)

    def pids(self) -> list[int]:
        """The PIDs of the ``ray start --block`` processes (one per node)."""
        return [n.pid for n in self.nodes]

    def processes(self) -> list[tuple[int, str]]:
        """(pid, command line) of every process of this cluster: the nodes' descendants (Ray
        starts its workers in process groups of their own)."""
        return _descendants(set(self.pids()))


def _descendants(roots: set[int]) -> list[tuple[int, str]]:
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, ValueError, IndexError):
                stat = (entry / "stat").read_text()
                parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    found = []
    for pid in parents:
        up, seen = parents.get(pid), 0
        while up is not None and up not in roots and seen < 64:
            up, seen = parents.get(up), seen + 1
        if up in roots:
            with contextlib.suppress(OSError):
                cmd = (Path(f"/proc/{pid}") / "cmdline").read_bytes()
                found.append((pid, cmd.replace(b"\0", b" ").decode().strip()))
    return found


def _ray_cli() -> str:
    found = shutil.which("ray", path=str(Path(sys.executable).parent)) or shutil.which("ray")
    try:
        import ray  # noqa: F401  # the CLI alone is not enough: drivers import it
    except ImportError:
        found = None
    if found is None:
        raise RayMissing("Ray is not installed (pip install 'mcsync[ray]')")
    return found


def private_mounts() -> str | None:
    """None when a child can be started in a mount namespace of its own with a tmpfs mounted
    in it (root, ``unshare`` and ``mount`` present, the kernel allowing it); else why not."""
    if os.geteuid() != 0:
        return "a private mount namespace needs root (unshare -m, mount -t tmpfs)"
    if shutil.which("unshare") is None or shutil.which("mount") is None:
        return "unshare or mount is not installed"
    with tempfile.TemporaryDirectory(prefix="ray-private-") as probe:
        done = subprocess.run(["unshare", "-m", "--propagation", "private", "mount", "-t",
                               "tmpfs", "mcsync-private", probe],
                              capture_output=True, text=True, timeout=30, check=False)
    if done.returncode != 0:
        return f"unshare -m with a tmpfs mount failed here: {done.stderr.strip()[:200]}"
    return None


def _in_private_mount(directory: Path, argv: list[str]) -> list[str]:
    """``argv`` run in a mount namespace of its own over which an empty tmpfs hides
    ``directory`` (``unshare`` and ``sh`` exec in turn: the child keeps its PID)."""
    return ["unshare", "-m", "--propagation", "private", "sh", "-c",
            'mount -t tmpfs -o size=64m mcsync-private "$0" && exec "$@"', str(directory),
            *argv]


def _node_args(ip: str, cpus: int, memory: int) -> list[str]:
    (node_manager, object_manager, agent_listen, agent_grpc, metrics, runtime_env,
     *workers) = free_ports(6 + WORKER_PORTS)
    return ["--block", "--node-ip-address", ip, "--num-cpus", str(cpus), "--num-gpus", "0",
            "--memory", str(memory), "--object-store-memory", str(100 * 2**20),
            "--node-manager-port", str(node_manager),
            "--object-manager-port", str(object_manager),
            "--dashboard-agent-listen-port", str(agent_listen),
            "--dashboard-agent-grpc-port", str(agent_grpc),
            "--metrics-export-port", str(metrics), "--runtime-env-agent-port", str(runtime_env),
            "--worker-port-list", ",".join(map(str, workers)), "--disable-usage-stats"]


@contextlib.contextmanager
def ray_cluster(*, head_cpus: int = 1, worker_cpus: int = 1, memory: int = 2 * 2**30,
                env: dict[str, str] | None = None, startup_timeout: float = 240.0,
                temp_dir: Path | None = None,
                worker_private: Path | None = None) -> Iterator[RayCluster]:
    """A head node and (``worker_cpus`` > 0) a worker node, up and registered when this
    yields. ``temp_dir``: Ray's (short: its sockets' paths must fit in 107 bytes);
    ``worker_private``: a directory the worker node sees empty (see the module's doc)."""
    if worker_private is not None and (why := private_mounts()) is not None:
        raise ServerStartError(why)
    ray = _ray_cli()
    own_dir = temp_dir is None
    tmp = Path(tempfile.mkdtemp(prefix="ray-", dir="/tmp")) if temp_dir is None else temp_dir
    # A raylet waits 30 s for its node to register by default: too short on a busy machine.
    node_env = python_child_env((env or {}) | {"RAY_USAGE_STATS_ENABLED": "0",
                                               "RAY_raylet_start_wait_time_s": "120"})
    node_env.pop("RAY_ADDRESS", None)
    head_env = node_env | {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
    node_env.pop("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", None)
    nodes: list[Child] = []
    try:
        for attempt in range(1, ATTEMPTS + 1):
            try:
                cluster = _start(ray, tmp, head_env, node_env, nodes, head_cpus, worker_cpus,
                                 memory, time.monotonic() + startup_timeout, worker_private)
                break
            except _PortTaken as exc:
                log.warning("Ray cluster, attempt %d: %s; starting again", attempt, exc)
                _stop(nodes)
                if attempt == ATTEMPTS:
                    raise ServerStartError(f"the Ray cluster did not start: {exc}") from None
        yield cluster
    finally:
        _stop(nodes)
        if own_dir:
            shutil.rmtree(tmp, ignore_errors=True)


class _PortTaken(Exception):
    """Another process took a port picked for the cluster before Ray bound it."""


def _start(ray: str, tmp: Path, head_env: dict[str, str], node_env: dict[str, str],
           nodes: list[Child], head_cpus: int, worker_cpus: int, memory: int,
           deadline: float, worker_private: Path | None) -> RayCluster:
    (tmp / "ray_current_cluster").unlink(missing_ok=True)
    gcs, dashboard = free_ports(2)
    nodes.append(Child("ray-head", [
        ray, "start", "--head", "--port", str(gcs), "--temp-dir", str(tmp),
        "--include-dashboard", "false", "--dashboard-port", str(dashboard),
        *_node_args(LOOPBACK, head_cpus, memory)],
        tmp / "head.log", cwd=tmp, env=head_env))
    cluster = RayCluster(f"{LOOPBACK}:{gcs}", tmp, nodes, head_env)
    # A node that joins before the head has registered itself gives up.
    _wait_for_head(cluster, deadline)
    if worker_cpus:
        argv = [ray, "start", "--address", f"[::ffff:{LOOPBACK}]:{gcs}",
                *_node_args(WORKER_IP, worker_cpus, memory)]
        if worker_private is not None:
            argv = _in_private_mount(worker_private, argv)
        nodes.append(Child("ray-worker", argv, tmp / "worker.log", cwd=tmp, env=node_env))
    _wait_for_nodes(cluster, len(nodes), deadline)
    return cluster


def _stop(nodes: list[Child]) -> None:
    """Each node's process group, then what is left of its descendants (workers, which Ray
    puts in groups of their own), by PID."""
    left = _descendants({n.pid for n in nodes})
    born = {}
    for pid, _ in left:
        with contextlib.suppress(OSError, ValueError, IndexError):
            born[pid] = _started(pid)
    left = [(pid, cmd) for pid, cmd in left if pid in born]
    while nodes:  # a node's `ray start` lingers on SIGTERM: not waited for long
        nodes.pop().stop(grace=3.0, expected_kill=True)
    for pid, _ in left:
        with contextlib.suppress(OSError, ValueError, IndexError):
            if _started(pid) == born[pid]:  # still that process, not a PID used again
                os.kill(pid, signal.SIGKILL)


def _started(pid: int) -> int:
    """When ``pid`` started (clock ticks since boot): with its PID, names one process."""
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])


_TAKEN = ("Failed to start the grpc server", "ddress already in use")


def _port_taken(cluster: RayCluster) -> str | None:
    """What a process of the cluster logged when it could not bind its port, if one did (Ray
    gives up on that only after a minute)."""
    logs = cluster.temp_dir / "session_latest" / "logs"
    for name in ("raylet.out", "gcs_server.out", "raylet.err", "gcs_server.err"):
        with contextlib.suppress(OSError):
            tail = (logs / name).read_bytes()[-32 * 1024:].decode("utf-8", "replace")
            for line in tail.splitlines():
                if any(m in line for m in _TAKEN):
                    return line.strip()[-300:]
    return None


_PROBE = """
import sys, time, ray
ray.init(address=sys.argv[1], logging_level="ERROR", log_to_driver=False)
deadline = time.monotonic() + float(sys.argv[3])
while sum(n["Alive"] for n in ray.nodes()) < int(sys.argv[2]):
    if time.monotonic() > deadline:
        sys.exit(f"{sum(n['Alive'] for n in ray.nodes())} of {sys.argv[2]} nodes up")
    time.sleep(0.2)
"""


def _wait_for_head(cluster: RayCluster, deadline: float) -> None:
    """Until the head has started (``ray start`` writes the cluster's address into its temp
    dir last)."""
    while not (cluster.temp_dir / "ray_current_cluster").exists():
        if (taken := _port_taken(cluster)) is not None:
            raise _PortTaken(taken)
        _check_running(cluster)
        if time.monotonic() > deadline:
            raise ServerStartError(f"the Ray head did not start in time:\n"
                                   f"{cluster.nodes[0].log_tail()}")
        time.sleep(0.1)


def _wait_for_nodes(cluster: RayCluster, count: int, deadline: float) -> None:
    """Until every node has registered (asked by a driver of its own: this process does not
    connect to the cluster)."""
    env = cluster.env | {"RAY_ADDRESS": cluster.address}
    left = max(1.0, deadline - time.monotonic())
    done = subprocess.run([sys.executable, "-c", _PROBE, cluster.address, str(count),
                           str(left)], env=env,
                          capture_output=True, text=True, timeout=left + 30, check=False)
    if (taken := _port_taken(cluster)) is not None:
        raise _PortTaken(taken)
    _check_running(cluster)
    if done.returncode != 0:
        raise ServerStartError(f"the Ray cluster at {cluster.address} did not come up: "
                               f"{done.stderr.strip()[-2000:]}")


def _check_running(cluster: RayCluster) -> None:
    for node in cluster.nodes:
        if not node.running():
            raise ServerStartError(f"{node.name} exited with code {node.proc.returncode} "
                                   f"(log {node.log_path}):\n{node.log_tail()}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpus", type=int, default=1, help="CPUs of each node")
    parser.add_argument("--head-only", action="store_true")
    args = parser.parse_args()
    with ray_cluster(head_cpus=args.cpus, worker_cpus=0 if args.head_only else args.cpus,
                     env={k: v for k, v in os.environ.items() if k.startswith("AWS_")}) as c:
        print(f"export RAY_ADDRESS={c.address}  # logs under {c.temp_dir}", flush=True)
        stops = {signal.SIGINT, signal.SIGTERM}
        signal.pthread_sigmask(signal.SIG_BLOCK, stops)
        signal.sigwait(stops)


if __name__ == "__main__":
    main()
