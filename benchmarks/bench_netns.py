"""``--link-mbit N``: SeaweedFS B in a network namespace of its own, behind a capped veth pair.

    host  127.77.K.1/30  <mcsbPIDh> ==veth== <mcsbPIDn>  127.77.K.2/30  namespace mcsb-PID
          egress: HTB rate N mbit                egress: HTB rate N mbit    weed server (B)

Both ends have an address in 127.0.0.0/8 (nothing outside it is used) and
``route_localnet=1`` on the veth device (set per device on each side, and ``all`` inside the
namespace, which is thrown away with it: nothing on the host outlives the veth pair). Each
direction's egress goes through ``tc qdisc ... htb default 10 r2q 1000`` and one class of
``rate N mbit``: host → B (uploads) is capped on the host's end, B → host (downloads, and the
ACKs) on the namespace's end. The kernel has no netem here, so no delay is added.

Root only. :func:`open_link` raises :class:`LinkUnavailable` (with a one-line reason) when the
link cannot be made; whatever was made by then is removed first. :meth:`Link.close` removes
everything (the namespace, which takes the veth pair with it), with SIGINT and SIGTERM held off
meanwhile; it is idempotent and also registered with ``atexit``. A namespace left behind by a
run that was killed outright (``mcsb-PID`` whose PID is gone) is removed by the next run.

:func:`seaweedfs_in` starts ``ip netns exec NS weed server ...`` bound to the namespace's
address. testbed.servers.seaweedfs() cannot do that (it binds 127.0.0.1 and runs
``weed`` itself), so the command is built here, with the same flags; see that module. A hook
there (``seaweedfs(..., ip=..., argv_prefix=[...])``) would let this module use it instead.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from testbed.processes import parent_death_signal
from testbed.servers import find_weed

NS_PREFIX = "mcsb-"
NET = "127.77"  # /30 subnets 127.77.K.0/30 for K = 0 .. 63
PROBE_BYTES = 64 << 20
PROBE_BUCKET = "bench-link-probe"


class LinkUnavailable(RuntimeError):
    """The capped link cannot be set up here (the reason is the message, one line)."""


def _run(argv: list[str], what: str | None = None) -> str:
    """Run a setup command; its first error line becomes a LinkUnavailable."""
    try:
        out = subprocess.run(
            argv, capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL
        )
    except (OSError, subprocess.SubprocessError) as exc:
        raise LinkUnavailable(f"{what or ' '.join(argv)}: {exc}") from exc
    if out.returncode != 0:
        err = (out.stderr or out.stdout).strip().splitlines()
        raise LinkUnavailable(f"{what or ' '.join(argv)}: {err[0] if err else out.returncode}")
    return out.stdout


def _quiet(argv: list[str]) -> None:
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        subprocess.run(argv, capture_output=True, timeout=30, stdin=subprocess.DEVNULL)


@dataclass
class Link:
    mbit: int
    ns: str
    host_dev: str
    ns_dev: str
    host_ip: str
    ns_ip: str
    _undo: list[Callable[[], None]] = field(default_factory=list, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def exec_prefix(self) -> list[str]:
        """Prepended to a command to run it inside the namespace."""
        return ["ip", "netns", "exec", self.ns]

    def tx_bytes(self) -> int | None:
        """Bytes the host has sent into the link so far (its veth end's counter), or None."""
        try:
            return int(Path(f"/sys/class/net/{self.host_dev}/statistics/tx_bytes").read_text())
        except (OSError, ValueError):
            return None

    def describe(self) -> str:
        return (
            f"{self.mbit} Mbit/s each way (HTB on veth {self.host_dev} ⇄ {self.ns_dev}, "
            f"{self.host_ip} ⇄ {self.ns_ip} in netns {self.ns}; no added delay)"
        )

    def close(self) -> None:
        """Remove the namespace, the veth pair and the qdiscs. Idempotent."""
        with self._lock:
            if not self._undo:
                return
            blocked = {signal.SIGINT, signal.SIGTERM}
            in_main = threading.current_thread() is threading.main_thread()
            old = signal.pthread_sigmask(signal.SIG_BLOCK, blocked) if in_main else None
            try:
                while self._undo:
                    with contextlib.suppress(Exception):
                        self._undo.pop()()
            finally:
                if old is not None:
                    signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _namespaces() -> list[str]:
    try:
        out = _run(["ip", "netns", "list"], "ip netns list")
    except LinkUnavailable:
        return []
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def remove_stale(log: Callable[[str], None]) -> None:
    """Remove the namespaces of earlier runs that were killed before they could clean up."""
    for ns in _namespaces():
        if not ns.startswith(NS_PREFIX):
            continue
        pid_s = ns[len(NS_PREFIX) :]
        if not pid_s.isdigit() or _alive(int(pid_s)):
            continue
        log(f"  removing network namespace {ns} left by an earlier run (pid {pid_s} is gone)")
        # Its servers died with that run (parent-death signal); anything still inside is ours.
        with contextlib.suppress(LinkUnavailable):
            for pid in _run(["ip", "netns", "pids", ns]).split():
                with contextlib.suppress(OSError, ValueError):
                    os.kill(int(pid), signal.SIGKILL)
        _quiet(["ip", "netns", "del", ns])
        _quiet(["ip", "link", "del", f"mcsb{pid_s}h"])


def _used_subnets() -> set[int]:
    out = _run(["ip", "-o", "-4", "addr", "show"], "ip addr show")
    used = set()
    for line in out.splitlines():
        parts = line.split()
        if "inet" in parts:
            addr = parts[parts.index("inet") + 1].split("/")[0]
            if addr.startswith(NET + "."):
                used.add(int(addr.split(".")[2]))
    return used


def open_link(mbit: int, log: Callable[[str], None]) -> Link:
    """Make the namespace and the capped veth pair; LinkUnavailable if it cannot be done."""
    if not sys.platform.startswith("linux"):
        raise LinkUnavailable("Linux only")
    if os.geteuid() != 0:
        raise LinkUnavailable("needs root (ip netns, tc)")
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            raise LinkUnavailable(f"{tool} not found (iproute2)")
    remove_stale(log)
    used = _used_subnets()
    free = next((k for k in range(64) if k not in used), None)
    if free is None:
        raise LinkUnavailable(f"no free /30 in {NET}.0.0/18")
    pid = os.getpid()
    link = Link(
        mbit=mbit, ns=f"{NS_PREFIX}{pid}", host_dev=f"mcsb{pid}h", ns_dev=f"mcsb{pid}n",
        host_ip=f"{NET}.{free}.1", ns_ip=f"{NET}.{free}.2",
    )  # fmt: skip
    in_ns = link.exec_prefix()
    rate = f"{mbit}mbit"
    try:
        _run(["ip", "netns", "add", link.ns])
        # Deleting the namespace also deletes its veth end, and with it the pair.
        link._undo.append(lambda: _quiet(["ip", "netns", "del", link.ns]))
        _run(["ip", "link", "add", link.host_dev, "type", "veth", "peer", "name", link.ns_dev])
        link._undo.append(lambda: _quiet(["ip", "link", "del", link.host_dev]))
        _run(["ip", "link", "set", link.ns_dev, "netns", link.ns])
        _run(["ip", "addr", "add", f"{link.host_ip}/30", "dev", link.host_dev])
        # The host's sysctl is the device's own: it goes with the device.
        _run(["sysctl", "-q", "-w", f"net.ipv4.conf.{link.host_dev}.route_localnet=1"])
        _run(["ip", "link", "set", link.host_dev, "up"])
        _run([*in_ns, "ip", "link", "set", "lo", "up"])
        _run([*in_ns, "ip", "addr", "add", f"{link.ns_ip}/30", "dev", link.ns_dev])
        _run([
            *in_ns, "sysctl", "-q", "-w", "net.ipv4.conf.all.route_localnet=1",
            f"net.ipv4.conf.{link.ns_dev}.route_localnet=1",
        ])  # fmt: skip
        _run([*in_ns, "ip", "link", "set", link.ns_dev, "up"])
        for prefix, dev in (([], link.host_dev), (in_ns, link.ns_dev)):
            _run([
                *prefix, "tc", "qdisc", "add", "dev", dev, "root", "handle", "1:",
                "htb", "default", "10", "r2q", "1000",
            ])  # fmt: skip
            _run([
                *prefix, "tc", "class", "add", "dev", dev, "parent", "1:", "classid", "1:10",
                "htb", "rate", rate,
            ])  # fmt: skip
        # 127.0.0.0/8 is local on the host: the /30 must win over it (it does while the local
        # and main routing tables are merged, i.e. without policy rules).
        route = _run(["ip", "-o", "route", "get", link.ns_ip])
        if f"dev {link.host_dev}" not in route:
            raise LinkUnavailable(
                f"{link.ns_ip} is not routed through {link.host_dev}: {route.strip()}"
            )
    except BaseException:
        link.close()
        raise
    atexit.register(link.close)
    return link


# -- SeaweedFS inside the namespace -------------------------------------------------------------


def _host_free_ports(n: int) -> list[int]:
    """Ports free on the host right now. The namespace has its own ports, but weed also names
    unix sockets in /tmp after its ports, so they must not repeat a host server's."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _remove_sockets(ports: list[int]) -> None:
    for tmp in {Path("/tmp"), Path(tempfile.gettempdir())}:
        for port in ports:
            for path in tmp.glob(f"seaweedfs-*-{port}.sock"):
                with contextlib.suppress(OSError):
                    path.unlink()


def _log_tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_bytes()[-16384:].decode(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


@contextlib.contextmanager
def seaweedfs_in(
    link: Link,
    workdir: Path,
    endpoint_cls,
    *,
    access_key: str = "mcsync-test",
    secret_key: str = "mcsync-test-secret",
    startup_timeout: float = 60.0,
) -> Iterator[object]:
    """Run ``weed server`` in ``link``'s namespace, bound to its address; yield the endpoint
    (an ``endpoint_cls``, i.e. testbed.servers.S3Endpoint). Flags as servers.py's."""
    workdir = Path(workdir).resolve()
    (workdir / "data").mkdir(parents=True, exist_ok=True)
    ident = {
        "identities": [{
            "name": "mcsync-test-admin",
            "credentials": [{"accessKey": access_key, "secretKey": secret_key}],
            "actions": ["Admin", "Read", "List", "Tagging", "Write"],
        }]
    }  # fmt: skip
    config = workdir / "s3-identities.json"
    config.write_text(json.dumps(ident, indent=2))
    config.chmod(0o600)
    sock_dir = workdir / "sock"
    use_sock_dir = len(str(sock_dir / "filer.sock")) < 100
    if use_sock_dir:
        sock_dir.mkdir(exist_ok=True)
    ports = _host_free_ports(8)
    master, master_grpc, volume, volume_grpc, filer, filer_grpc, s3_port, s3_grpc = ports
    ip = link.ns_ip
    argv = [
        *link.exec_prefix(), find_weed(), "-logtostderr", f"-config_dir={workdir}", "server",
        f"-ip={ip}", f"-ip.bind={ip}", f"-dir={workdir / 'data'}",
        "-master.telemetry=false", "-master.telemetry.url=",
        f"-master.port={master}", f"-master.port.grpc={master_grpc}",
        "-master.volumeSizeLimitMB=1024", "-master.defaultReplication=000",
        "-master.peers=none",
        f"-volume.port={volume}", f"-volume.port.grpc={volume_grpc}", "-volume.max=1000",
        "-volume.preStopSeconds=0",
        "-filer", f"-filer.port={filer}", f"-filer.port.grpc={filer_grpc}",
        "-s3", f"-s3.port={s3_port}", f"-s3.port.grpc={s3_grpc}",
        "-s3.port.iceberg=0", "-s3.port.lance=0", f"-s3.config={config}",
        "-s3.autoCreateBucket=false", f"-metricsIp={ip}", "-metricsPort=0",
    ]  # fmt: skip
    if use_sock_dir:
        argv += [
            f"-filer.localSocket={sock_dir / 'filer.sock'}",
            f"-s3.localSocket={sock_dir / 's3.sock'}",
        ]
    scrub = ("AWS_", "MCSYNC_", "WEED_")
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(scrub) and k.lower() not in {"http_proxy", "https_proxy", "all_proxy"}
    }
    env["WEED_MASTER_VOLUME_GROWTH_COPY_1"] = "2"
    endpoint = endpoint_cls(url=f"http://{ip}:{s3_port}", access_key=access_key,
                            secret_key=secret_key)  # fmt: skip
    log_path = workdir / "weed.log"
    _remove_sockets(ports)
    with open(log_path, "ab") as log_file:
        log_file.write(f"# {' '.join(argv)}\n".encode())
        log_file.flush()
        proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT,
            cwd=workdir, env=env, start_new_session=True, preexec_fn=parent_death_signal(),
        )  # fmt: skip
    try:
        _wait_ready(proc, endpoint, f"http://{ip}:{master}/dir/status", startup_timeout, log_path)
        yield endpoint
    finally:
        # As servers.py: a graceful stop takes 15 s or more and saves nothing needed here.
        for sig, wait in ((signal.SIGTERM, 1.0), (signal.SIGKILL, 30.0)):
            if proc.poll() is not None:
                break
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, sig)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(wait)
        _remove_sockets(ports)


def _wait_ready(proc, endpoint, status_url: str, timeout: float, log_path: Path) -> None:
    from botocore.exceptions import BotoCoreError, ClientError

    probe = endpoint.client(retries={"total_max_attempts": 1}, connect_timeout=1, read_timeout=5)
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    deadline = time.monotonic() + timeout
    last = "no answer yet"
    try:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(
                    f"weed in the namespace exited with code {proc.returncode} during startup "
                    f"(log {log_path}):\n{_log_tail(log_path)}"
                )
            try:
                probe.list_buckets()
                with opener.open(status_url, timeout=2) as resp:
                    topo = json.loads(resp.read()).get("Topology") or {}
                if int(topo.get("Max") or 0) > 0:
                    return
                last = "S3 answers, but no volume server yet"
            except (BotoCoreError, ClientError, OSError, ValueError) as exc:
                last = f"{type(exc).__name__}: {exc}"
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"weed in the namespace did not answer at {endpoint.url} within "
                    f"{timeout:.0f} s (last: {last}; log {log_path})"
                )
            time.sleep(0.1)
    finally:
        probe.close()


def measure(endpoint, nbytes: int = PROBE_BYTES) -> dict:
    """Time one PUT and one GET of ``nbytes`` through the link (one TCP stream each)."""
    client = endpoint.client()
    with contextlib.suppress(Exception):
        client.create_bucket(Bucket=PROBE_BUCKET)
    try:
        client.put_object(Bucket=PROBE_BUCKET, Key="warm", Body=b"x")  # allocates the volumes
        body = os.urandom(nbytes)
        t0 = time.perf_counter()
        client.put_object(Bucket=PROBE_BUCKET, Key="probe", Body=body)
        put_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        got = client.get_object(Bucket=PROBE_BUCKET, Key="probe")["Body"].read()
        get_s = time.perf_counter() - t0
        if len(got) != nbytes:
            raise RuntimeError(f"link probe: read {len(got)} of {nbytes} bytes back")
    finally:
        with contextlib.suppress(Exception):
            for key in ("warm", "probe"):
                client.delete_object(Bucket=PROBE_BUCKET, Key=key)
            client.delete_bucket(Bucket=PROBE_BUCKET)
        client.close()
    return {
        "bytes": nbytes, "put_s": put_s, "put_mb_s": nbytes / put_s / 1e6,
        "get_s": get_s, "get_mb_s": nbytes / get_s / 1e6,
    }  # fmt: skip
