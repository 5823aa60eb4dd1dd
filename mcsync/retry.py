"""The one retry policy: how often and how patiently a failed request is tried again.

Single requests are retried inside the SDK clients: botocore's adaptive mode (exponential backoff
with jitter, and a client-side rate limiter that backs off on 503 SlowDown / throttling and
recovers as requests succeed) and obstore's RetryConfig (backoff with jitter, a deadline). The
GCS store has no SDK beneath it: its request loop asks ``backoff`` how long to wait, and retries
only errors of type ``Transient``. This module is the only place those numbers are set.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import timedelta
from typing import Any


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    max_attempts: int = 10
    mode: str = "adaptive"

    init_backoff_s: float = 0.1
    max_backoff_s: float = 20.0
    deadline_s: float = 300.0
    # A preflight (``Store.check``) reports an unreachable endpoint after this many tries, so a
    # mistyped address fails in seconds rather than after the whole deadline.
    preflight_attempts: int = 3

    def botocore(self) -> dict[str, Any]:
        return {"mode": self.mode, "max_attempts": self.max_attempts}

    def obstore(self, *, preflight: bool = False) -> dict[str, Any]:
        """The same policy for obstore's client (exponential backoff with full jitter)."""
        attempts = self.preflight_attempts if preflight else self.max_attempts
        return {
            "max_retries": attempts - 1,
            "retry_timeout": timedelta(seconds=self.deadline_s),
            "backoff": {"init_backoff": timedelta(seconds=self.init_backoff_s),
                        "max_backoff": timedelta(seconds=self.max_backoff_s), "base": 2},
        }

    def backoff(self, attempt: int) -> float:
        """Seconds to wait before try number ``attempt + 1`` (``attempt`` >= 1 tries failed):
        exponential with full jitter, capped (the GCS store's request loop)."""
        cap = min(self.max_backoff_s, self.init_backoff_s * 2 ** min(attempt - 1, 30))
        return random.uniform(0, cap)

    def gcloud_aio_auth(self) -> dict[str, Any]:
        """For ``tenacity``'s ``retry_with`` on gcloud-aio-auth's token fetch, whose own policy is
        five tries, up to 60 s apart, on *any* exception (a malformed key included). A token is
        fetched inside a GCS request, and that request's loop retries it by type, so the token
        fetch itself is tried once."""
        import tenacity

        return {"stop": tenacity.stop_after_attempt(1), "reraise": True}
