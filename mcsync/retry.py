"""The one retry policy, and the retry loop of ours.

Two levels, never more: the SDK clients retry a request a few times quickly
(``sdk_attempts``: botocore's standard mode, obstore's RetryConfig, the CRT's S3RetryConfig,
the GCS store's own loop for it has no SDK), and ``mcsync.stores.resilience`` retries what outlasts
that — throttling until the deadline, other transient errors up to ``max_attempts`` — around
every request of a run. So a request is tried at most ``sdk_attempts`` x ``max_attempts``
times, and throttling is met by fewer requests in flight (``limits.AdaptiveLimit``) rather
than by two retry loops each backing off on its own. Every loop mcsync runs is ``retrying``
but one: a listing that breaks off is listed again from its last key by the retry layer's
listing hook (``resilience._Hooks.listing``), since a stream resumed where it stopped is not
one awaitable that ``retrying`` can try again whole. Both decide alike: by error type only,
never by message, with the policy's backoff, attempts and deadline, and never after a
cancellation (CancelledError is no MCSyncError).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, TypeVar

from .errors import Transient

if TYPE_CHECKING:
    from obstore.store import RetryConfig

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    max_attempts: int = 10  # tries of a request by mcsync.stores.resilience (throttling: unlimited)
    sdk_attempts: int = 3  # tries of a request inside the SDK, per try of ours
    mode: str = "standard"  # botocore's; its adaptive rate limiter would be a second one

    init_backoff_s: float = 0.1
    max_backoff_s: float = 20.0
    deadline_s: float = 300.0
    # A preflight (``Store.check``) reports an unreachable endpoint after this many tries, so a
    # mistyped address fails in seconds rather than after the whole deadline.
    preflight_attempts: int = 3

    @property
    def checks_retry_as_requests(self) -> bool:
        """Would a check's client retry as a request's does (the default)? Then a store checks
        with the client its run uses: a second obstore client loads the system's CA roots again
        and opens connections of its own (a TLS handshake each, on a WAN); what the roots cost:
        benchmarks/results/2026-12-02-stop-23.md."""
        return self.obstore(preflight=True) == self.obstore()

    def botocore(self) -> dict[str, Any]:
        return {"mode": self.mode, "total_max_attempts": self.sdk_attempts}

    def obstore(self, *, preflight: bool = False) -> RetryConfig:
        """The same policy for obstore's client (exponential backoff with full jitter)."""
        attempts = self.preflight_attempts if preflight else self.sdk_attempts
        return {
            "max_retries": attempts - 1,
            "retry_timeout": timedelta(seconds=self.deadline_s),
            "backoff": {"init_backoff": timedelta(seconds=self.init_backoff_s),
                        "max_backoff": timedelta(seconds=self.max_backoff_s), "base": 2},
        }

    def crt(self) -> dict[str, Any]:
        """The same policy for the CRT's S3 client (``S3RetryConfig``'s fields; its zeros mean
        "the CRT's default", so no retry is mode "none" and no backoff is 1 ms)."""
        if self.sdk_attempts <= 1:
            return {"retry_mode": "none"}
        return {"retry_mode": "standard", "max_retries": self.sdk_attempts - 1,
                "backoff_scale_factor_ms": max(1, round(self.init_backoff_s * 1000)),
                "max_backoff_secs": max(1, round(self.max_backoff_s))}

    @classmethod
    def immediate(cls, attempts: int) -> RetryPolicy:
        """Up to ``attempts`` tries with no wait between them: a loop whose cause is fixed by
        the time the next try starts (a listing switched to ordered mode, a source re-read)."""
        return cls(max_attempts=attempts, init_backoff_s=0.0, max_backoff_s=0.0)

    def backoff(self, attempt: int) -> float:
        """Seconds to wait before try number ``attempt + 1`` (``attempt`` >= 1 tries failed):
        exponential with full jitter, capped."""
        cap = min(self.max_backoff_s, self.init_backoff_s * 2 ** min(attempt - 1, 30))
        return random.uniform(0, cap)

    def gcloud_aio_auth(self) -> dict[str, Any]:
        """For ``tenacity``'s ``retry_with`` on gcloud-aio-auth's token fetch, whose own policy is
        five tries, up to 60 s apart, on *any* exception (a malformed key included). A token is
        fetched inside a GCS request, and that request's loop retries it by type, so the token
        fetch itself is tried once."""
        import tenacity

        return {"stop": tenacity.stop_after_attempt(1), "reraise": True}


async def retrying(
    call: Callable[[], Awaitable[T]],
    policy: RetryPolicy,
    *,
    retry_on: type[BaseException] | tuple[type[BaseException], ...] = Transient,
    attempts: int | None = None,
    before_retry: Callable[[Any], Awaitable[None] | None] | None = None,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> T:
    """``await call()``, tried again on ``retry_on`` errors up to ``attempts`` (default the
    policy's) tries and within the policy's deadline, with its backoff between tries. The last
    error is raised as it was. ``before_retry(error)`` runs (and is awaited, if it returns an
    awaitable) before each new try: to switch a mode, refresh what the call depends on; an
    error it raises ends the loop."""
    tries = attempts if attempts is not None else policy.max_attempts
    deadline = clock() + policy.deadline_s
    attempt = 0
    while True:
        attempt += 1
        try:
            return await call()
        except retry_on as exc:
            delay = policy.backoff(attempt)
            if attempt >= tries or clock() + delay > deadline:
                raise
            log.debug("%s; try %d of %d in %.2f s", exc, attempt + 1, tries, delay)
            if before_retry is not None:
                pending = before_retry(exc)
                if pending is not None:
                    await pending
            if delay > 0:
                await sleep(delay)
