"""The one retry policy: how often and how patiently a failed request is tried again.

Single requests are retried inside the SDK clients: botocore's adaptive mode (exponential backoff
with jitter, and a client-side rate limiter that backs off on 503 SlowDown / throttling and
recovers as requests succeed) and obstore's RetryConfig (backoff with jitter, a deadline). This
module is the only place those numbers are set.
"""

from __future__ import annotations

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

    def botocore(self) -> dict[str, Any]:
        return {"mode": self.mode, "max_attempts": self.max_attempts}

    def obstore(self) -> dict[str, Any]:
        """The same policy for obstore's client (exponential backoff with full jitter)."""
        return {
            "max_retries": self.max_attempts - 1,
            "retry_timeout": timedelta(seconds=self.deadline_s),
            "backoff": {"init_backoff": timedelta(seconds=self.init_backoff_s),
                        "max_backoff": timedelta(seconds=self.max_backoff_s), "base": 2},
        }
