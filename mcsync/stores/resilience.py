"""``resilient(store, pacing)``: every request of a run retried, paced and throttled in one place.

The SDKs beneath retry a request a few times quickly (``RetryPolicy.sdk_attempts``: a dropped
connection, a lone 500). What outlasts that — a store answering SlowDown or 429 for minutes, a
credential that expired and was refreshed, a response body broken off — is retried here, by
error type (``Transient``), with exponential backoff and jitter, until the policy's attempts
or deadline are spent; throttling is retried until the deadline whatever the count. On each
throttled answer the endpoint's ``AdaptiveLimit`` halves the requests in flight to it (and
grows them back as requests succeed), and the run's listeners hear of it: the engine halves
its parts on the wire and emits ``RequestThrottled`` for the report and the progress line.
``--tpslimit`` (requests per second) and ``--bwlimit`` (bytes per second to and from network
stores, both directions together, timetable) are token buckets taken before each request.

What is retried: every operation is idempotent at the store (a part, an object, a copy, a
delete written twice is written once), except creating a multipart upload, which is retried
only when the store refused it (throttled): an upload created twice is an upload left open.
A listing broken off is started again and the keys already handed on are skipped (listings
are in byte order). A preflight ``check`` gives up after three tries unless throttled, so a
wrong address still fails in seconds. Blocking file writes (``write_at``) are local and
not retried.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from ..config import SyncOptions
from ..errors import CredentialsExpired, Throttled, Transient
from ..limits import AdaptiveLimit
from ..retry import RetryPolicy, retrying
from ..types import Buffer, ObjectInfo
from .base import ReadStore
from .wrap import Op, Wrapped, wrap

if TYPE_CHECKING:
    from ..ratelimit import Bandwidth, TokenBucket

__all__ = ["Pacing", "pacing_of", "resilient"]

log = logging.getLogger(__name__)
T = TypeVar("T")

ThrottleListener = Callable[[str, str, int], None]  # (store url, operation, its limit now)
_CHECK_ATTEMPTS = 3
_ONCE_UNLESS_REFUSED = frozenset({"open_upload", "open_file"})
_BYTES_IN = frozenset({"get", "read_into"})
_NO_REQUEST = frozenset({"part_written", "write_at"})  # local bookkeeping / file writes
_WARN_EVERY_S = 30.0


@dataclass
class Pacing:
    """What the requests of a run (or of a watch, across its cycles) share: the retry policy,
    the rate limits, counters and who hears of throttling."""

    policy: RetryPolicy = field(default_factory=RetryPolicy)
    concurrency: int = 128
    tps: TokenBucket | None = None
    bandwidth: Bandwidth | None = None
    throttled: int = 0  # answers that said slow down (each try counts)
    retried: int = 0  # tries after a first one
    expired: int = 0  # refused for expired credentials (renewed by the store, then retried)
    listeners: list[ThrottleListener] = field(default_factory=list)
    run_began: tuple[int, int, int] = (0, 0, 0)  # (throttled, retried, expired) at its start
    # What a run says limited it (bottleneck.judge): per store url, the seconds requests spent
    # waiting on its answers and bodies, summed over requests; and the seconds the rate limits
    # held requests back. Added from worker threads too (a body drained): under a lock.
    waited_s: dict[str, float] = field(default_factory=dict)
    paced_s: float = 0.0
    _timing: threading.Lock = field(default_factory=threading.Lock)
    _limits: dict[str, AdaptiveLimit] = field(default_factory=dict)
    _warned_at: float = -_WARN_EVERY_S

    @classmethod
    def for_options(cls, options: SyncOptions) -> Pacing:
        """The pacing a run's options ask for; UsageError for a malformed --bwlimit."""
        from ..ratelimit import Bandwidth, Timetable, TokenBucket  # only runs that limit rates

        tps = TokenBucket(options.tps_limit) if options.tps_limit else None
        bandwidth = Bandwidth(Timetable.parse(options.bw_limit)) if options.bw_limit else None
        return cls(concurrency=options.in_flight, tps=tps, bandwidth=bandwidth)

    def limit_for(self, url: str) -> AdaptiveLimit:
        """The requests-in-flight limit of the endpoint (one per store)."""
        if url not in self._limits:
            self._limits[url] = AdaptiveLimit(self.concurrency)
        return self._limits[url]

    def begin_run(self) -> None:
        """A run starts: what it reports is counted from here (a watch's cycles share one)."""
        self.run_began = (self.throttled, self.retried, self.expired)

    def waited(self, url: str, seconds: float) -> None:
        with self._timing:
            self.waited_s[url] = self.waited_s.get(url, 0.0) + seconds

    def held(self, seconds: float) -> None:
        with self._timing:
            self.paced_s += seconds

    def timings(self) -> tuple[dict[str, float], float]:
        """The request time per store and the paced time so far (a run diffs two)."""
        with self._timing:
            return dict(self.waited_s), self.paced_s

    def current_limit(self) -> int:
        """The requests in flight now allowed to the most limited store."""
        return min((lim.limit for lim in self._limits.values()), default=self.concurrency)

    def lowest_limit(self) -> int:
        return min((lim.low for lim in self._limits.values()), default=self.concurrency)

    def heard(self, url: str, op: str, exc: Throttled, limit: AdaptiveLimit) -> None:
        """A throttled answer: count it, cut the endpoint's limit, tell the listeners."""
        self.throttled += 1
        cut = limit.throttled()
        now = time.monotonic()
        if cut and now - self._warned_at >= _WARN_EVERY_S:
            self._warned_at = now
            log.warning("%s is throttling (%s); %d requests in flight to it now, retrying", url,
                        exc, limit.limit)
        for listener in list(self.listeners):
            listener(url, op, limit.limit)


def resilient(store: ReadStore, pacing: Pacing) -> ReadStore:
    """``store`` with every request retried, limited and paced by ``pacing``; the same
    abilities. A store already wrapped so is returned as it is."""
    if pacing_of(store) is not None:
        return store
    return wrap(store, _Hooks(store, pacing), name="Resilient")


def pacing_of(store: ReadStore) -> Pacing | None:
    """The pacing a store was wrapped with by ``resilient`` (None for any other)."""
    hooks = store.hooks if isinstance(store, Wrapped) else None
    return hooks.pacing if isinstance(hooks, _Hooks) else None


class _Hooks:
    def __init__(self, store: ReadStore, pacing: Pacing) -> None:
        self.store = store
        self.url = store.url
        self.pacing = pacing
        self.limit = pacing.limit_for(store.url)
        # --bwlimit counts what crosses a network: a local disk's reads and writes are not,
        # so an upload counts its bytes once (sent) and a copy between two endpoints twice.
        self.bandwidth = pacing.bandwidth if store.facts.bytes_cross_network else None

    async def call(self, op: Op, fn: Callable[[], Awaitable[T]]) -> T:
        if op.name in _NO_REQUEST:
            return await fn()
        p = self.pacing
        tries = failed = 0

        async def once() -> T:
            nonlocal tries
            tries += 1
            bandwidth = self.bandwidth
            if p.tps is not None or (bandwidth is not None and op.nbytes):
                began = time.monotonic()
                if p.tps is not None:
                    await p.tps.take()
                if bandwidth is not None and op.nbytes:
                    await bandwidth.take(op.nbytes)
                p.held(time.monotonic() - began)
            await self.limit.acquire()
            began = time.monotonic()
            try:
                result: Any = await fn()
            finally:
                self.limit.release()
                p.waited(self.url, time.monotonic() - began)
            self.limit.succeeded()
            if bandwidth is not None and op.name in _BYTES_IN:
                began = time.monotonic()
                await bandwidth.take(len(result))
                p.held(time.monotonic() - began)
            elif bandwidth is not None and op.name == "open_range" and op.rng is not None:
                began = time.monotonic()
                await bandwidth.take(op.rng.length)
                p.held(time.monotonic() - began)
            if op.name == "open_range":  # its body is read after the call: time it as read
                return _timed(result, self.url, p)  # type: ignore[return-value]
            return result  # type: ignore[no-any-return]

        def before_retry(exc: Any) -> None:
            nonlocal failed
            if isinstance(exc, Throttled):
                p.heard(self.url, op.name, exc, self.limit)
            else:
                failed += 1
                p.expired += isinstance(exc, CredentialsExpired)
                if (op.name in _ONCE_UNLESS_REFUSED or failed >= p.policy.max_attempts
                        or (op.name == "check" and tries >= _CHECK_ATTEMPTS)):
                    raise exc
            p.retried += 1
            log.info("%s %s: %s; trying again", op.name, op.key or self.url, exc)

        # The try count is left to before_retry (throttling is waited out until the
        # deadline, however many tries that takes); the deadline is the policy's.
        return await retrying(once, p.policy, retry_on=Transient, attempts=1 << 30,
                              before_retry=before_retry)

    async def read(self, op: Op, fn: Callable[[], Awaitable[Buffer]]) -> Buffer:
        return await self.call(op, fn)

    async def stream(self, op: Op,
                     fn: Callable[[], Awaitable[Iterator[Buffer]]]) -> Iterator[Buffer]:
        return await self.call(op, fn)

    def call_blocking(self, op: Op, fn: Callable[[], T]) -> T:
        began = time.monotonic()  # a file target's write: time waiting on the target
        try:
            return fn()
        finally:
            self.pacing.waited(self.url, time.monotonic() - began)

    async def listing(self, entries: AsyncIterator[ObjectInfo]) -> AsyncIterator[ObjectInfo]:
        """The listing, listed again from the start when it breaks off, skipping the keys
        already handed on (a listing is in byte order)."""
        last: str | None = None
        current = entries
        deadline = time.monotonic() + self.pacing.policy.deadline_s
        failed = 0
        while True:
            try:
                async for info in current:
                    if last is not None and info.key <= last:
                        continue
                    last = info.key
                    yield info
                return
            except Transient as exc:
                failed += 0 if isinstance(exc, Throttled) else 1
                if isinstance(exc, Throttled):
                    self.pacing.heard(self.url, "list", exc, self.limit)
                delay = self.pacing.policy.backoff(failed + 1)
                if failed >= self.pacing.policy.max_attempts or (
                        time.monotonic() + delay > deadline):
                    raise
                self.pacing.retried += 1
                log.info("listing %s broke off after %r: %s; listing it again", self.url,
                         last, exc)
                await asyncio.sleep(delay)
                current = self.store.list()


def _timed(pieces: Iterator[Buffer], url: str, pacing: Pacing) -> Iterator[Buffer]:
    """A streamed body whose reads count as time waiting on its store (closed, it closes the
    body it reads)."""
    try:
        while True:
            began = time.monotonic()
            try:
                piece = next(pieces)
            except StopIteration:
                return
            finally:
                pacing.waited(url, time.monotonic() - began)
            yield piece
    finally:
        close = getattr(pieces, "close", None)
        if close is not None:
            close()
