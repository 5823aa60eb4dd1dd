"""Work beside the caller's: ``cancel_and_wait``, the one way mcsync stops a task it started
(a lock's renewer, a listing's pump, a run's watchdog and manifest uploader, a watch's file
watcher); ``fail_waiting``, what the futures waiting on a task that failed are told; and
``Threads`` / ``off_loop``, blocking calls handed to threads and awaited on the event loop.

Why not ``asyncio.to_thread`` for the last: the relay hands every part to threads four times
(the GET, the xxh3, the CRC32C, the PUT). Each ``to_thread`` builds a
``concurrent.futures.Future`` (a lock and a condition), a work item, an asyncio future chained
to it by callbacks on both threads, and copies the context: a third of the event loop's time
on the cross path. ``Threads`` costs half as much a hand-off (figures:
benchmarks/results/2026-12-07-thread-handoff.md): a thread takes ``(loop, future, call,
args)`` from a queue, runs the call and sets the future through ``call_soon_threadsafe``; one
future, one queue put, one wake-up. Left out: the caller's ``contextvars`` (nothing handed
here reads them). As with ``to_thread``, a cancelled caller does not stop a call already
running: its answer is dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import queue
import threading
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

T = TypeVar("T")


async def cancel_and_wait(*tasks: asyncio.Task[Any] | None, quiet: bool = False) -> None:
    """Cancel ``tasks`` (None ones are skipped) and wait until each has ended. An error a task
    ended with is raised (the first one), unless ``quiet``; being cancelled is not an error.

    Unlike ``with suppress(CancelledError): await task``, a cancellation of the caller that
    comes while the tasks unwind is not swallowed: it propagates at once (the tasks, cancelled
    already, end on their own). The suppressing form cannot tell the task's CancelledError from
    the caller's, and a second Ctrl-C arriving there was lost."""
    live = [t for t in tasks if t is not None]
    for task in live:
        task.cancel()
    if not live:
        return
    try:
        await asyncio.wait(live)  # raises nothing of theirs; a CancelledError here is ours
    except asyncio.CancelledError:
        for task in live:  # read their outcome when they end: none "never retrieved"
            task.add_done_callback(_outcome)
        raise
    errors = [e for e in map(_outcome, live) if e is not None]
    if errors and not quiet:
        raise errors[0]


def fail_waiting(futures: Iterable[asyncio.Future[Any]], exc: BaseException) -> None:
    """The futures still waiting on work that ended with ``exc``: cancelled when it was
    cancelled, else given its error (a batch sent as one task answers each of its items)."""
    for fut in futures:
        if fut.done():
            continue
        if isinstance(exc, asyncio.CancelledError):
            fut.cancel()
        else:
            fut.set_exception(exc)


def _outcome(task: asyncio.Task[Any]) -> BaseException | None:
    return None if task.cancelled() else task.exception()


# -- blocking calls on threads -------------------------------------------------------------------

_Work = tuple[asyncio.AbstractEventLoop, "asyncio.Future[Any]", Callable[..., Any], tuple[Any, ...]]


def _settle(future: asyncio.Future[Any], ok: bool, value: Any) -> None:
    if future.done():  # the caller was cancelled: the answer goes nowhere
        return
    if ok:
        future.set_result(value)
    else:
        future.set_exception(value)


class Threads:
    """Up to ``limit`` threads named ``name``, started as work waits for one; each lives as
    long as the process (they are daemons: an idle one blocks nothing at exit)."""

    def __init__(self, limit: int, name: str) -> None:
        if limit < 1:
            raise ValueError(f"limit must be at least 1, not {limit}")
        self.limit = limit
        self.name = name
        self._start()

    def _start(self) -> None:
        self._pid = os.getpid()
        self._queue: queue.SimpleQueue[_Work | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads = 0
        self._idle = 0
        self._closed = False

    def run(self, call: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        """``call(*args)`` on one of the threads; the future is the running loop's."""
        if os.getpid() != self._pid:
            self._start()  # a forked child has none of its parent's threads
        if self._closed:
            raise RuntimeError(f"{self.name}: closed")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        with self._lock:
            if self._idle:
                self._idle -= 1
            elif self._threads < self.limit:
                self._threads += 1
                threading.Thread(target=self._work, name=f"{self.name}_{self._threads}",
                                 daemon=True).start()
        self._queue.put((loop, future, call, args))
        return future

    def _work(self) -> None:
        take = self._queue.get
        while (work := take()) is not None:
            loop, future, call, args = work
            try:
                ok, value = True, call(*args)
            except BaseException as exc:  # handed to the caller, as to_thread would
                ok, value = False, exc
            del work, call, args  # drop the caller's buffers before waiting again
            with contextlib.suppress(RuntimeError):  # a closed loop: nobody awaits this
                loop.call_soon_threadsafe(_settle, future, ok, value)
            del future, value
            with self._lock:
                self._idle += 1

    def close(self) -> None:
        """Let the threads end once the work queued before this is done."""
        with self._lock:
            self._closed = True
            for _ in range(self._threads):
                self._queue.put(None)


_shared: Threads | None = None
_shared_lock = threading.Lock()


def shared() -> Threads:
    """The process's threads for CPU work that releases the GIL (hashes, checksums), as many
    as asyncio's default executor would start."""
    global _shared
    if _shared is None:
        with _shared_lock:
            if _shared is None:
                _shared = Threads(min(32, (os.cpu_count() or 1) + 4), "mcsync-offload")
    return _shared


async def off_loop(call: Callable[..., T], *args: Any) -> T:
    """``await asyncio.to_thread(call, *args)``, on the shared threads, without the context."""
    return await shared().run(call, *args)
