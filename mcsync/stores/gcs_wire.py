"""GCS's ranged media GET over mcsync's own connections (``http_wire``): a part relayed from
``gs://`` is read straight into the run's buffer, TLS decrypted into it, as an S3 part is
(``s3_wire``), instead of aiohttp's pieces copied in one by one on the event loop's thread
(figures: benchmarks/results/2026-12-07-azure-wire.md).

What the request means (the query that pins the generation, the Range, the token) and what
its answer says (errors, generation, whether the range came) are ``gcs``'s; this sends it.
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from urllib.parse import quote, urlencode, urlsplit

from .http_wire import USER_AGENT, HttpWire, Reply


class GcsWire:
    """Media GETs of one JSON API endpoint into the caller's buffers."""

    def __init__(self, api_root: str, tls: ssl.SSLContext | None, max_connections: int,
                 ca_hint: str) -> None:
        where = urlsplit(api_root)
        self._host = where.netloc
        if where.scheme == "https" and tls is None:
            tls = ssl.create_default_context()  # OpenSSL's defaults, as aiohttp's
        self._wire = HttpWire((where.hostname or "", where.port), tls, max_connections,
                              ca_hint=ca_hint)

    async def read_into(self, url: str, params: Mapping[str, str], headers: Mapping[str, str],
                        into: memoryview, what: str) -> Reply:
        """GET ``url`` with ``params`` (quoted as aiohttp's requests are) and ``headers``; a
        successful answer's body read into ``into``, up to its length."""
        target = f"{urlsplit(url).path}?{urlencode(params, quote_via=quote, safe='')}"
        sent = [("Host", self._host), USER_AGENT, *headers.items()]
        return await self._wire.exchange(what, "GET", target, sent, None, into)

    def close(self) -> None:
        self._wire.close()
