"""The one retry policy: how often and how patiently a failed request is tried again.

Single requests are retried inside the SDK client (botocore's adaptive mode: exponential backoff
with jitter, and a client-side rate limiter that backs off on 503 SlowDown / throttling and
recovers as requests succeed). This module is the only place those numbers are set.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    max_attempts: int = 10
    mode: str = "adaptive"

    def botocore(self) -> dict[str, Any]:
        return {"mode": self.mode, "max_attempts": self.max_attempts}
