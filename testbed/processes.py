"""Child processes for local test servers: free ports, a scrubbed environment, a child that
dies with its parent (even by ``kill -9``), readiness polling. Used by ``servers``."""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import logging
import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any, Protocol

log = logging.getLogger(__name__)

LOOPBACK = "127.0.0.1"

# Environment variables of ours (or the developer's) that must never reach a server child.
_SCRUBBED_ENV_PREFIXES = ("AWS_", "MCSYNC_", "WEED_")
_SCRUBBED_ENV_NAMES = {"http_proxy", "https_proxy", "all_proxy", "no_proxy"}


class Endpoint(Protocol):
    url: str

    def client(self, **config: Any) -> Any: ...


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now (another process may still take it)."""
    return free_ports(1)[0]


def free_ports(n: int) -> list[int]:
    """``n`` distinct free ports: all sockets are held open together so none repeats."""
    socks: list[socket.socket] = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((LOOPBACK, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(_SCRUBBED_ENV_PREFIXES) and k.lower() not in _SCRUBBED_ENV_NAMES
    }
    env.update(extra or {})
    return env


# The directory that holds this package. ``testbed`` is not installed (it is not part of the
# wheel), so a Python child started as ``python -m testbed.…`` is told where it is.
REPO_ROOT = Path(__file__).resolve().parent.parent


def python_child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """``child_env`` for a Python child that runs a module of this package (``-m testbed.…``):
    the repository's root is added to ``PYTHONPATH``, after anything already there."""
    env = child_env(extra)
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    if str(REPO_ROOT) not in paths:
        paths.append(str(REPO_ROOT))
    env["PYTHONPATH"] = os.pathsep.join(paths)
    return env


def parent_death_signal() -> Callable[[], None] | None:
    """A preexec_fn that makes the child get SIGKILL when this process dies (Linux only).

    PR_SET_PDEATHSIG fires when the *thread* that forked the child exits, so it is only used
    from the main thread, whose end is the end of the process.
    """
    if not sys.platform.startswith("linux"):
        return None
    if threading.current_thread() is not threading.main_thread():
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def preexec() -> None:
        prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:  # the parent died before prctl took effect
            os._exit(1)

    return preexec


class ServerStartError(RuntimeError):
    """A server did not come up; the message ends with the tail of its log."""


class Child:
    """A server child process with its output in a log file."""

    def __init__(
        self, name: str, argv: list[str], log_path: Path, *, cwd: Path | None, env: dict[str, str]
    ) -> None:
        self.name = name
        self.log_path = log_path
        self._log: IO[bytes] = open(log_path, "ab")  # noqa: SIM115 - closed in stop()
        self._log.write(f"# {shlex.join(argv)}\n".encode())
        self._log.flush()
        try:
            self.proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=self._log,
                stderr=subprocess.STDOUT,
                cwd=cwd,
                env=env,
                start_new_session=True,  # Ctrl-C of the parent reaches us, not the server
                preexec_fn=parent_death_signal(),
            )
        except BaseException:
            self._log.close()
            raise
        _LIVE_CHILDREN.add(self)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def running(self) -> bool:
        return self.proc.poll() is None

    def log_tail(self, lines: int = 60) -> str:
        try:
            data = self.log_path.read_bytes()[-64 * 1024 :]
        except OSError as exc:
            return f"(log {self.log_path} unreadable: {exc})"
        return "\n".join(data.decode("utf-8", "replace").splitlines()[-lines:])

    def stop(self, grace: float = 10.0, *, expected_kill: bool = False) -> None:
        """SIGTERM, wait up to ``grace`` seconds, then SIGKILL. Idempotent."""
        try:
            if self.proc.poll() is None:
                self._signal(signal.SIGTERM)
                try:
                    self.proc.wait(grace)
                except subprocess.TimeoutExpired:
                    log.log(
                        logging.DEBUG if expected_kill else logging.WARNING,
                        "%s (pid %d) still running %.0f s after SIGTERM; killing it",
                        self.name,
                        self.pid,
                        grace,
                    )
                    self._signal(signal.SIGKILL)
                    self.proc.wait(30)
        finally:
            self._log.close()
            _LIVE_CHILDREN.discard(self)

    def _signal(self, sig: signal.Signals) -> None:
        # The child leads its own session and process group (start_new_session), whose id is its
        # pid: signal that group so anything the server itself spawned goes too.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, sig)


_LIVE_CHILDREN: set[Child] = set()


@atexit.register
def _stop_leftover_children() -> None:
    for child in list(_LIVE_CHILDREN):
        with contextlib.suppress(Exception):
            child.stop(grace=5.0)


def wait_until_ready(
    child: Child, endpoint: Endpoint, timeout: float, extra_check: Callable[[], bool] | None
) -> float:
    """Poll a signed ListBuckets until it succeeds; return the seconds it took."""
    from botocore.exceptions import BotoCoreError, ClientError

    probe = endpoint.client(retries={"total_max_attempts": 1}, connect_timeout=1, read_timeout=5)
    start = time.monotonic()
    deadline = start + timeout
    last_error = "no answer yet"
    try:
        while True:
            if not child.running():
                raise ServerStartError(
                    f"{child.name} exited with code {child.proc.returncode} during startup "
                    f"(log {child.log_path}):\n{child.log_tail()}"
                )
            try:
                probe.list_buckets()
                if extra_check is None or extra_check():
                    return time.monotonic() - start
                last_error = "S3 answers, but the server is not ready for writes yet"
            except (BotoCoreError, ClientError) as exc:
                last_error = f"{type(exc).__name__}: {exc}"
            if time.monotonic() > deadline:
                raise ServerStartError(
                    f"{child.name} did not answer a signed ListBuckets at {endpoint.url} within "
                    f"{timeout:.0f} s (last: {last_error}; log {child.log_path}):\n"
                    f"{child.log_tail()}"
                )
            time.sleep(0.1)
    finally:
        probe.close()


def port_clash(child: Child) -> bool:
    tail = child.log_tail(200).lower()
    return "address already in use" in tail or "bind:" in tail
