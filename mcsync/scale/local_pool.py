"""``--workers N`` on this machine: N worker processes of a standard-library process pool,
started by ``spawn`` (nothing of the driver's state, its event loop and manifest among it, is
forked into them) at the first task, each running a ``worker_runner.TaskRunner``.

A worker that dies (OOM, SIGKILL) breaks its pool whole: the pool is shut down and the tasks
that were in it raise ``WorkerLost``, for ``workers.Workers`` to give to a fresh one. A killed
driver takes its workers with it (PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import multiprocessing
import os
import signal
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from multiprocessing.util import Finalize

from ..config import SyncOptions
from .worker_runner import (
    Addresses,
    TaskItem,
    TaskResult,
    TaskRunner,
    WorkerLost,
    WorkerUnavailable,
)

log = logging.getLogger(__name__)

_runner: TaskRunner | None = None


def _start_worker(addresses: Addresses, options: SyncOptions, parent: int) -> None:
    """A worker process starts: it dies with the driver, leaves stop signals to the driver
    (which lets tasks in flight finish), and opens its stores at its first task."""
    global _runner
    _die_with(parent)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _runner = TaskRunner(addresses, options)
    Finalize(_runner, _runner.close, exitpriority=10)


def _die_with(parent: int) -> None:
    """SIGKILL when the driver dies (Linux): a worker outliving a killed driver would still
    write objects that no manifest will hear of while the next run starts."""
    with contextlib.suppress(OSError, AttributeError, TypeError):  # no prctl: not Linux
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:  # died before prctl took effect
        os._exit(1)


def _run_task(items: list[TaskItem]) -> TaskResult:
    assert _runner is not None, "not a worker process"
    return _runner.run(items)


class LocalPool:
    """The ``WorkerPool`` of worker processes on this machine."""

    def __init__(self, addresses: Addresses, options: SyncOptions, n: int) -> None:
        self.size = n
        self.addresses = addresses
        self.options = options
        self._pool: ProcessPoolExecutor | None = None

    def describe(self) -> str:
        return f"{self.size} local worker processes"

    async def run(self, items: list[TaskItem], *,
                  deadline_s: float | None = None) -> TaskResult:
        pool = self._pool_now()
        try:
            result = await asyncio.wrap_future(pool.submit(_run_task, items))
        except BrokenProcessPool as exc:
            if self._pool is pool:
                log.warning("a worker process died (%s); its tasks go to a fresh pool", exc)
                pool.shutdown(wait=False, cancel_futures=True)
                self._pool = None
            # A process pool breaks whole: the dead worker's task and those the other
            # workers were running go to the fresh pool alike.
            raise WorkerLost(f"a worker process died ({exc})") from exc
        except (OSError, RuntimeError) as exc:  # could not start a worker
            raise WorkerUnavailable(f"no worker process could run it: {exc}") from exc
        if not isinstance(result, TaskResult):
            raise TypeError(f"a worker returned {type(result).__name__}")
        return result

    def _pool_now(self) -> ProcessPoolExecutor:
        if self._pool is None:
            self._pool = ProcessPoolExecutor(
                self.size, mp_context=multiprocessing.get_context("spawn"),
                initializer=_start_worker,
                initargs=(self.addresses, self.options, os.getpid()))
        return self._pool

    async def aclose(self, *, wait: bool) -> None:
        if self._pool is not None:
            pool, self._pool = self._pool, None
            await asyncio.to_thread(pool.shutdown, wait=wait, cancel_futures=True)
