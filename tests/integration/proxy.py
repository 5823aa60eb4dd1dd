"""A proxy in front of a real S3 server that damages request bodies in flight, or refuses a
header: two rules of ``testbed.faultproxy.FaultProxy`` under the names the integrity
and delta tests use.

It stands for a bad NIC, a buggy middlebox or a memory error between mcsync and the store: the
client computed its checksums over the right bytes, the server receives other bytes. Requests
are forwarded unchanged (signatures stay valid); only the body of a PutObject or UploadPart
whose path contains ``marker`` gets one bit flipped on the way.

With ``refuse_header`` it also stands for an S3 implementation that does not take that header:
such a request is answered 400 InvalidRequest (AWS's answer to a part checksum on an upload
created without the algorithm) and not forwarded.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from testbed.faultproxy import Corrupt, Exchange, FaultProxy, Reply, Rule

REFUSAL = Reply(400, "InvalidRequest", "Checksum Type mismatch occurred, expected checksum "
                "Type: null, actual checksum Type: crc32c")


class CorruptingProxy:
    def __init__(self, upstream: str, marker: str | None = None,
                 refuse_header: str | None = None) -> None:
        rules = []
        if refuse_header:  # first: a refused request is not forwarded, so not damaged either
            rules.append(Rule(REFUSAL, header=refuse_header, name="refuse"))
        if marker:  # the path /bucket/key contains marker: in the key, or at its start
            for pattern in (f"*{marker}*", f"{marker.lstrip('/')}*"):
                rules.append(Rule(Corrupt(), op={"PutObject", "UploadPart"}, key=pattern,
                                  name="damage"))
        self.proxy = FaultProxy(upstream, rules)

    @property
    def url(self) -> str:
        return self.proxy.url

    def _lines(self, rule: str) -> list[str]:
        return [_line(e) for e in self.proxy.exchanges() if e.rule == rule]

    @property
    def damaged(self) -> list[str]:
        """Request lines of the requests whose body was damaged."""
        return self._lines("damage")

    @property
    def refused(self) -> list[str]:
        return self._lines("refuse")

    @contextlib.contextmanager
    def running(self) -> Iterator[CorruptingProxy]:
        with self.proxy.running():
            yield self


def _line(e: Exchange) -> str:
    return f"{e.method} {e.target} HTTP/1.1"
