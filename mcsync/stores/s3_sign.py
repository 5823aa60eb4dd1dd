"""SigV4 for mcsync's own connections (``s3_wire``): the headers that sign one S3 request whose
body goes unsigned (``UNSIGNED-PAYLOAD``, as the CRT's S3 client sends bodies; each body
carries a checksum header the target verifies instead).

Signing is two SHA-256s and an HMAC over short strings, done where the request is made, on the
caller's thread. The CRT's signer, which the wire used before, built a signing config, a
request and a header list of its own for every request and answered through a future: about
three times the CPU per request, and a hop back to the event loop
(benchmarks/results/2026-12-07-relay-signing.md). Pure: no I/O; the day's signing key is
derived once per key, day and region.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import time
from collections.abc import Sequence
from urllib.parse import quote, unquote

from .s3_keys import S3Credentials

UNSIGNED_PAYLOAD = "UNSIGNED-PAYLOAD"
# Not signed: a proxy on the way may rewrite it (the CRT's signer leaves it out too).
_UNSIGNED_HEADERS = frozenset({"user-agent"})


def sign(method: str, path: str, query: str, headers: Sequence[tuple[str, str]],
         creds: S3Credentials, region: str, *, service: str = "s3",
         now: float | None = None) -> list[tuple[str, str]]:
    """``headers`` with the date, the payload's and the session token's headers and the
    Authorization header added, for a request of ``method`` to ``path`` (already URI-encoded,
    as it is sent) with the query string ``query`` (``name=value`` pairs joined by ``&``,
    values encoded; a name alone, like ``uploads``, has an empty value)."""
    stamp = _stamp(int(time.time() if now is None else now))
    day = stamp[:8]
    added = [("x-amz-date", stamp), ("x-amz-content-sha256", UNSIGNED_PAYLOAD)]
    if creds.session_token:
        added.append(("x-amz-security-token", creds.session_token))
    signed = sorted((name.lower(), " ".join(value.split()))
                    for name, value in (*headers, *added)
                    if name.lower() not in _UNSIGNED_HEADERS)
    names = ";".join(name for name, _ in signed)
    canonical = "\n".join((
        method, path, _canonical_query(query),
        "".join(f"{name}:{value}\n" for name, value in signed), names, UNSIGNED_PAYLOAD))
    scope = f"{day}/{region}/{service}/aws4_request"
    to_sign = (f"AWS4-HMAC-SHA256\n{stamp}\n{scope}\n"
               f"{hashlib.sha256(canonical.encode()).hexdigest()}")
    key = _signing_key(creds.secret_access_key or "", day, region, service)
    signature = hmac.digest(key, to_sign.encode(), "sha256").hex()
    authorization = (f"AWS4-HMAC-SHA256 Credential={creds.access_key_id or ''}/{scope}, "
                     f"SignedHeaders={names}, Signature={signature}")
    return [*headers, *added, ("Authorization", authorization)]


def _canonical_query(query: str) -> str:
    """The query's pairs, each name and value encoded as SigV4 has them (RFC 3986: all but
    letters, digits and ``-_.~``), sorted."""
    if not query:
        return ""
    pairs = []
    for pair in query.split("&"):
        name, _, value = pair.partition("=")
        pairs.append((quote(unquote(name), safe=""), quote(unquote(value), safe="")))
    return "&".join(f"{name}={value}" for name, value in sorted(pairs))


@functools.lru_cache(maxsize=2)
def _stamp(second: int) -> str:
    """SigV4's date, formatted once a second: ``strftime`` was a tenth of a signature's time."""
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(second))


@functools.lru_cache(maxsize=8)
def _signing_key(secret: str, day: str, region: str, service: str) -> bytes:
    key = hmac.digest(f"AWS4{secret}".encode(), day.encode(), "sha256")
    for part in (region, service, "aws4_request"):
        key = hmac.digest(key, part.encode(), "sha256")
    return key
