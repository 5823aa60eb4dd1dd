"""Every request of a store, counted: the hooks ``Metrics.wrap`` puts around a store, and the
tally a worker process keeps with the same hooks (``RequestTally``), whose figures go back to
the driver with each task (``events.RequestsCounted``) for its metrics to add: the metrics of a
run with ``--workers`` are those of one process that made every request.

A ``Recorder`` is told of each request: in flight, then done (its operation, status, seconds),
and of the bytes read from a source. ``Metrics`` records into Prometheus; ``RequestTally``
into plain numbers a task result can carry. No prometheus_client here: a worker needs none.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Literal, Protocol, TypeVar

from ..errors import MCSyncError, Throttled
from ..events import RequestGroup, RequestsCounted
from ..stores.base import ReadStore
from ..stores.wrap import Op, wrap
from ..types import Buffer, ObjectInfo

__all__ = ["Recorder", "RequestTally", "Role", "meter", "status_of"]

T = TypeVar("T")
Role = Literal["source", "target"]
_BOOKKEEPING = frozenset({"part_written"})  # no request: the bytes went with write_at


class Recorder(Protocol):
    """What is told of a store's requests (``meter``)."""

    def in_flight(self, role: Role, delta: int) -> None:
        """A request began (+1) or was answered (-1)."""
        ...

    def request(self, role: Role, operation: str, status: str, throttled: bool,
                seconds: float) -> None:
        """A request ended: ``status`` "ok" or its error's class, ``throttled`` for a
        Throttled."""
        ...

    def received(self, nbytes: int) -> None:
        """Bytes read from the source."""
        ...


def meter(store: ReadStore, recorder: Recorder, role: Role) -> ReadStore:
    """``store`` with every request told to ``recorder`` under ``role``; the same abilities."""
    return wrap(store, _RequestHooks(recorder, role), name="Metered")


def status_of(exc: BaseException) -> str:
    """The status label of a request that raised ``exc``: its class's name for an mcsync error
    or a built-in one (OSError, ...), never its message."""
    if isinstance(exc, asyncio.CancelledError | GeneratorExit):
        return "Cancelled"
    if isinstance(exc, MCSyncError) or type(exc).__module__ == "builtins":
        return type(exc).__name__
    return "Error"


class RequestTally:
    """A worker's ``Recorder``: its requests counted in plain numbers, handed over (and
    started afresh) by ``take``. Thread-safe: blocking operations report from worker threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seconds: dict[tuple[str, str, str, bool], list[float]] = {}
        self._received = 0
        self._now: Counter[str] = Counter()
        self._peak: Counter[str] = Counter()

    def in_flight(self, role: Role, delta: int) -> None:
        with self._lock:
            self._now[role] += delta
            self._peak[role] = max(self._peak[role], self._now[role])

    def request(self, role: Role, operation: str, status: str, throttled: bool,
                seconds: float) -> None:
        with self._lock:
            self._seconds.setdefault((role, operation, status, throttled), []).append(seconds)

    def received(self, nbytes: int) -> None:
        with self._lock:
            self._received += nbytes

    def take(self, worker: str) -> RequestsCounted:
        """What was counted since the last ``take``; the peak starts again from the requests
        in flight now."""
        with self._lock:
            counted = RequestsCounted(
                worker, tuple(RequestGroup(*kind, seconds=tuple(times))
                              for kind, times in self._seconds.items()),
                self._received, tuple(sorted(self._peak.items())))
            self._seconds, self._received = {}, 0
            self._peak = Counter(self._now)
        return counted


class _RequestHooks:
    """Counts, times and tracks in flight every request of one store (``stores.wrap.Hooks``)."""

    def __init__(self, recorder: Recorder, role: Role) -> None:
        self.recorder = recorder
        self.role = role
        recorder.in_flight(role, 0)  # the store's series exist from the start

    def started(self) -> None:
        self.recorder.in_flight(self.role, 1)

    def answered(self) -> None:
        self.recorder.in_flight(self.role, -1)

    def done(self, name: str, seconds: float, exc: BaseException | None) -> None:
        status = "ok" if exc is None else status_of(exc)
        self.recorder.request(self.role, name, status, isinstance(exc, Throttled), seconds)

    def received(self, nbytes: int) -> None:
        if self.role == "source":
            self.recorder.received(nbytes)

    async def call(self, op: Op, fn: Callable[[], Awaitable[T]]) -> T:
        result, started = await self._answered(op, fn)
        self.answered()
        self.done(op.name, time.perf_counter() - started, None)
        return result

    async def read(self, op: Op, fn: Callable[[], Awaitable[Buffer]]) -> Buffer:
        data = await self.call(op, fn)
        self.received(len(data))
        return data

    async def stream(self, op: Op,
                     fn: Callable[[], Awaitable[Iterator[Buffer]]]) -> Iterator[Buffer]:
        pieces, started = await self._answered(op, fn)
        # Answered; the request lasts until its body is read.
        assert op.rng is not None
        return _Body(self, pieces, op.rng.length, started)

    async def _answered(self, op: Op, fn: Callable[[], Awaitable[T]]) -> tuple[T, float]:
        """``fn()``'s answer and when it was asked, the request in flight meanwhile (and
        after, for the caller to end); a request that raised is ended here."""
        self.started()
        started = time.perf_counter()
        try:
            return await fn(), started
        except BaseException as exc:
            self.answered()
            self.done(op.name, time.perf_counter() - started, exc)
            raise

    def call_blocking(self, op: Op, fn: Callable[[], T]) -> T:
        if op.name in _BOOKKEEPING:
            return fn()
        self.started()
        started = time.perf_counter()
        try:
            result = fn()
        except BaseException as exc:
            self.done(op.name, time.perf_counter() - started, exc)
            raise
        finally:
            self.answered()
        self.done(op.name, time.perf_counter() - started, None)
        return result

    async def listing(self, entries: AsyncIterator[ObjectInfo]) -> AsyncIterator[ObjectInfo]:
        """A listing is one request here (its pages are the store's own): timed while it waits
        for the store, not while the engine works through the entries."""
        waited, error = 0.0, None
        it = aiter(entries)
        try:
            while True:
                self.started()
                started = time.perf_counter()
                try:
                    info = await anext(it)
                except StopAsyncIteration:
                    break
                finally:
                    self.answered()
                    waited += time.perf_counter() - started
                yield info
        except BaseException as exc:
            error = exc
            raise
        finally:
            self.done("list", waited, error)


class _Body:
    """A streamed range's body: counted as received piece by piece, and its request finished
    (in flight no more, timed, its status counted) when the body ends, fails, or is dropped:
    once every byte was read, dropping it is a success."""

    def __init__(self, hooks: _RequestHooks, pieces: Iterator[Buffer], length: int,
                 started: float) -> None:
        self._hooks = hooks
        self._pieces = iter(pieces)
        self._left = length
        self._started = started
        self._open = True

    def __iter__(self) -> _Body:
        return self

    def __next__(self) -> Buffer:
        try:
            piece = next(self._pieces)
        except StopIteration:
            self._finish(None)
            raise
        except BaseException as exc:
            self._finish(exc)
            raise
        self._left -= len(piece)
        self._hooks.received(len(piece))
        return piece

    def _finish(self, exc: BaseException | None) -> None:
        if getattr(self, "_open", False):
            self._open = False
            self._hooks.answered()
            self._hooks.done("open_range", time.perf_counter() - self._started, exc)

    def close(self) -> None:
        self._finish(None if self._left <= 0 else GeneratorExit())
        close = getattr(self._pieces, "close", None)
        if close is not None:
            close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # late in interpreter shutdown, say
            self.close()
