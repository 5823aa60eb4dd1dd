"""``--workers N`` on this machine: N worker processes, each started by ``spawn`` (nothing of
the driver's state, its event loop and manifest among it, is forked into them) and each with a
channel of its own (a socket pair: a task's items down, its ``TaskResult`` up, read on the
driver's event loop), each running a ``worker_runner.TaskRunner``.

A failure costs one worker, as in Ray or DistCp: a worker that dies (OOM, SIGKILL) loses only
its own task (``WorkerLost`` naming it, for ``workers.Workers`` to give to another) and is
replaced by one new process; the others keep running, keep their PIDs and their channels. A
task that runs past its deadline has its worker killed (SIGKILL) and replaced, the same way.
An exception raised by a task's own code is that task's failure (``TaskFailed`` with its
cause); its worker goes on. A worker that cannot start (its interpreter or ``import mcsync``
fails) gives ``WorkerUnavailable`` with the cause in a line, within seconds. Workers die with
the driver (PR_SET_PDEATHSIG), leave SIGINT/SIGTERM to it, and are gone when ``aclose``
returns.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import multiprocessing
import os
import pickle
import signal
import socket
import struct
import subprocess
import time
import warnings
from multiprocessing import spawn
from multiprocessing.process import BaseProcess
from typing import Any

from ..config import SyncOptions
from ..errors import first_error
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

START_S = 60.0  # a worker that has not said it is ready by then could not start
END_S = 10.0  # a worker told to end that has not by then is killed
_HEADER = struct.Struct("!Q")  # each message: its length, then its pickle


# -- the worker's side (blocking: its event loop is the TaskRunner's own) -------------------------


def _serve(channel: socket.socket, addresses: Addresses, options: SyncOptions,
           parent: int) -> None:
    """A worker process: it dies with the driver, leaves stop signals to the driver (which
    lets tasks in flight finish), says it is ready, then runs each task it is sent until the
    driver closes the channel. Its stores open at its first task."""
    _die_with(parent)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    runner = TaskRunner(addresses, options)
    try:
        _send(channel, pickle.dumps(("ready", f"pid {os.getpid()} on {socket.gethostname()}")))
        while (message := _receive(channel)) is not None:
            try:
                reply = pickle.dumps(("done", runner.run(pickle.loads(message))))
            except Exception as exc:  # the task's own failure: this worker is fine
                cause = first_error(exc)
                log.debug("a task failed in this worker", exc_info=True)
                reply = pickle.dumps(("failed", f"{type(cause).__name__}: {cause}"))
            _send(channel, reply)
    except ConnectionError:  # the driver gave up on this worker (a stopped run): just end
        pass
    finally:
        runner.close()


def _die_with(parent: int) -> None:
    """SIGKILL when the driver dies (Linux): a worker outliving a killed driver would still
    write objects that no manifest will hear of while the next run starts."""
    with contextlib.suppress(OSError, AttributeError, TypeError):  # no prctl: not Linux
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:  # died before prctl took effect
        os._exit(1)


def _send(channel: socket.socket, data: bytes) -> None:
    channel.sendall(_HEADER.pack(len(data)) + data)


def _receive(channel: socket.socket) -> bytes | None:
    """The next message, or None when the driver closed the channel."""
    header = _exactly(channel, _HEADER.size)
    return None if header is None else _exactly(channel, _HEADER.unpack(header)[0])


def _exactly(channel: socket.socket, n: int) -> bytes | None:
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        k = channel.recv_into(view[got:])
        if not k:
            return None
        got += k
    return bytes(buf)


# -- the driver's side -------------------------------------------------------------------------


class _Worker:
    """One worker process and the driver's end of its channel."""

    def __init__(self, process: BaseProcess, reader: asyncio.StreamReader,
                 writer: asyncio.StreamWriter) -> None:
        self.process = process
        self.reader = reader
        self.writer = writer
        self.name = f"pid {process.pid} on {socket.gethostname()}"

    async def receive(self) -> Any:
        """The worker's next message (``IncompleteReadError`` when it died)."""
        header = await self.reader.readexactly(_HEADER.size)
        return pickle.loads(await self.reader.readexactly(_HEADER.unpack(header)[0]))

    async def run(self, items: list[TaskItem], deadline_s: float | None) -> TaskResult:
        data = pickle.dumps(items)
        try:
            self.writer.write(_HEADER.pack(len(data)) + data)
            async with asyncio.timeout(deadline_s):
                await self.writer.drain()
                state, answer = await self.receive()
        except TimeoutError:
            await self.kill()
            raise WorkerLost(f"task timed out after {deadline_s:.0f} s on {self.name} (killed)",
                             self.name) from None
        except (asyncio.IncompleteReadError, ConnectionError) as exc:
            await _reaped(self.process, 2.0)  # what ended it, before a kill of our own
            how = self.how_it_ended()
            await self.kill()
            raise WorkerLost(f"worker {self.name} died ({how})", self.name) from exc
        if state == "failed":
            raise TaskFailed(f"in worker {self.name}: {answer}", self.name)
        if not isinstance(answer, TaskResult):
            raise TypeError(f"worker {self.name} returned {type(answer).__name__}")
        return answer

    def how_it_ended(self) -> str:
        code = self.process.exitcode
        if code is None:
            return "its channel closed"
        if code < 0:
            try:
                return f"killed by {signal.Signals(-code).name}"
            except ValueError:
                return f"killed by signal {-code}"
        return f"exit code {code}"

    async def kill(self) -> None:
        """SIGKILL (if still running) and reap."""
        self.writer.close()
        with contextlib.suppress(OSError, ValueError):
            self.process.kill()
        await _reaped(self.process, END_S)

    async def end(self) -> None:
        """Told to end (its channel closed after its last task), killed if it has not soon."""
        self.writer.close()
        if not await _reaped(self.process, END_S):
            log.warning("worker %s did not end within %.0f s: killed", self.name, END_S)
            await self.kill()


async def _reaped(process: BaseProcess, within_s: float) -> bool:
    """Has ``process`` ended within ``within_s`` (reaped: no zombie left)?"""
    deadline = time.monotonic() + within_s
    while process.exitcode is None:  # exitcode polls waitpid(WNOHANG)
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.02)
    return True


class LocalPool:
    """The ``WorkerPool`` of worker processes on this machine: ``size`` slots, each holding a
    running worker or none yet (started when a task takes the slot)."""

    def __init__(self, addresses: Addresses, options: SyncOptions, n: int) -> None:
        self.size = n
        self.addresses = addresses
        self.options = options
        self._slots: asyncio.Queue[_Worker | None] | None = None
        self._running: set[_Worker] = set()
        self._closed = False
        self._why: asyncio.Task[str] | None = None  # why workers fail to start, found once

    def describe(self) -> str:
        return f"{self.size} local worker processes"

    async def run(self, items: list[TaskItem], *, deadline_s: float | None = None) -> TaskResult:
        if self._slots is None:
            self._slots = asyncio.Queue()
            for _ in range(self.size):
                self._slots.put_nowait(None)
        slots = self._slots
        worker = await slots.get()
        try:
            if worker is not None and worker.process.exitcode is not None:
                # It died idle (between tasks): it lost no task, so this one is not charged.
                log.warning("worker %s died between tasks (%s): starting another",
                            worker.name, worker.how_it_ended())
                self._running.discard(worker)
                await worker.kill()
                worker = None
            if worker is None:
                worker = await self._start()
            result = await worker.run(items, deadline_s)
        except TaskFailed:
            slots.put_nowait(worker)
            raise
        except BaseException:  # lost, not started, or cancelled mid-task: the slot is empty
            if worker is not None:
                self._running.discard(worker)
                await asyncio.shield(worker.kill())
            slots.put_nowait(None)
            raise
        slots.put_nowait(worker)
        return result

    async def _start(self) -> _Worker:
        if self._closed:
            raise WorkerUnavailable("the pool is closed")
        ctx = multiprocessing.get_context("spawn")
        ours, theirs = socket.socketpair()
        try:
            process = ctx.Process(target=_serve, daemon=True, name="mcsync-worker",
                                  args=(theirs, self.addresses, self.options, os.getpid()))
            with warnings.catch_warnings():
                # spawn's resource tracker starts from the same interpreter: when that one
                # cannot start, the reason given below is the one line to say so.
                warnings.filterwarnings("ignore", "resource_tracker: process died")
                process.start()
        except OSError as exc:  # fork or exec refused here (no memory, too many processes)
            ours.close()
            raise WorkerUnavailable(f"could not start a worker process on "
                                    f"{socket.gethostname()}: {exc.strerror or exc}") from exc
        finally:
            theirs.close()  # the worker's now: its death closes the channel
        try:
            reader, writer = await asyncio.open_unix_connection(sock=ours)
        except BaseException:
            ours.close()
            process.kill()
            raise
        worker = _Worker(process, reader, writer)
        self._running.add(worker)
        try:
            async with asyncio.timeout(START_S):
                state, _ = await worker.receive()
            assert state == "ready", state
        except (TimeoutError, asyncio.IncompleteReadError, ConnectionError) as exc:
            self._running.discard(worker)
            await worker.kill()
            how = (f"not ready within {START_S:.0f} s" if isinstance(exc, TimeoutError)
                   else worker.how_it_ended())
            if self._why is None:  # workers that fail to start all fail alike: asked once
                self._why = asyncio.create_task(asyncio.to_thread(why_workers_fail))
            cause = await asyncio.shield(self._why)
            raise WorkerUnavailable(f"could not start a worker process on "
                                    f"{socket.gethostname()} ({how}): {cause}") from None
        self._why = None
        return worker

    async def aclose(self, *, wait: bool) -> None:
        """Every worker gone before this returns: those waiting for a task told to end, so
        are those running one when ``wait`` (they end after it), else those are killed (a
        stopped run's senders gave their tasks up already)."""
        self._closed = True
        idle = set()
        while self._slots is not None and not self._slots.empty():
            idle.add(self._slots.get_nowait())
        workers, self._running = list(self._running), set()
        await asyncio.gather(*((w.end() if wait or w in idle else w.kill()) for w in workers))


# What a worker imports before its first line runs (``spawn``: the driver's main module, then
# this one), and what to tell when it cannot.
_PROBE = ("import pickle, sys; from multiprocessing import spawn; "
          "spawn.prepare(pickle.load(sys.stdin.buffer)); import mcsync.scale.local_pool")


def why_workers_fail() -> str:
    """Why a worker process could not start, in one line: what the spawned interpreter says
    when it prepares as a worker does (the driver's ``sys.path``, directory and main module)
    and imports mcsync. The worker's own error went to stderr, which it shares with the
    driver; this finds it again to name it."""
    executable = spawn.get_executable()
    data = spawn.get_preparation_data("mcsync-probe")
    data.pop("authkey", None)
    try:
        done = subprocess.run([os.fsdecode(executable), "-c", _PROBE],
                              input=pickle.dumps(data), capture_output=True, timeout=START_S,
                              check=False)
    except OSError as exc:
        return f"cannot run {os.fsdecode(executable)}: {exc.strerror or exc}"
    except subprocess.TimeoutExpired:
        return f"importing mcsync in a new interpreter took over {START_S:.0f} s"
    if done.returncode == 0:
        return "it ended as it started (its error, if any, is above)"
    lines = [line.strip() for line in done.stderr.decode(errors="replace").splitlines()
             if line.strip()]
    errors = [line for line in lines if _looks_like_error(line)]
    return (errors or lines or [f"exit code {done.returncode}"])[-1]


def _looks_like_error(line: str) -> bool:
    name = line.split(":", 1)[0]
    return ":" in line and name.replace(".", "").replace("_", "").isalnum() and (
        name.endswith(("Error", "Exception", "Exit")) or name == "Fatal Python error")
