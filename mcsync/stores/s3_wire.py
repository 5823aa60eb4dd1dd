"""The relay's S3 requests over mcsync's own connections (``http_wire``): a ranged GET read
straight into the run's buffer, and an UploadPart (or a whole object's PUT) sent straight from
it, with the multipart API's other requests and the copies (``S3Clients.sender``): a run that
relays needs no other client of the target.

Requests are signed on the caller's thread (``s3_sign``: SigV4, UNSIGNED-PAYLOAD, used only
where ``ClientSettings.sign_payload`` is False, as the CRT's own S3 client is; every body
carries the checksum header its caller gives, which the target verifies). Answers are reduced
to ``s3_errors.Answer`` and translated by the one table.
"""

from __future__ import annotations

from collections.abc import Sequence
from urllib.parse import urlsplit

from ..types import Buffer, ByteRange
from .http_wire import USER_AGENT, HttpWire, check_range, tls_context
from .s3_clients import ClientSettings
from .s3_errors import S3Answered, crt_answer
from .s3_keys import Keys
from .s3_requests import Endpoint, Response, S3Requests
from .s3_sign import sign


class WireClient(S3Requests):
    """GETs into caller's buffers and requests with bodies, to one store's endpoint."""

    def __init__(self, settings: ClientSettings, keys: Keys) -> None:
        self._settings = settings
        self._endpoint = Endpoint.of(settings)
        # Connected to the host its requests name: the bucket's own with virtual-hosted
        # requests (as the CRT and obstore connect), whose name the certificate must match.
        named = urlsplit("//" + self._endpoint.target(settings.bucket, None)[0])
        self.address = (named.hostname or "", named.port)
        self._keys = keys
        tls = None
        if self._endpoint.tls:
            cert = settings.client_cert
            tls = tls_context(settings.ca_pem, (cert.cert, cert.key) if cert else None)
        self._wire = HttpWire(self.address, tls, settings.max_connections,
                              ca_hint="AWS_CA_BUNDLE (meta://: MCSYNC_META_CA_BUNDLE)")

    async def request(self, method: str, bucket: str, key: str | None, what: str, *,
                      operation: str,
                      query: str = "", headers: Sequence[tuple[str, str]] = (),
                      body: Buffer | None = None) -> Response:
        host, path = self._endpoint.target(bucket, key)
        target = f"{path}?{query}" if query else path
        length = memoryview(body).nbytes if body is not None else 0
        sent = await self._signed(method, path, query, [("Host", host), USER_AGENT,
                                                        ("Content-Length", str(length)),
                                                        *headers])
        got = await self._wire.exchange(what, method, target, sent, body, None)
        if got.status >= 300:
            raise S3Answered(crt_answer(got.status, got.body))
        return Response(got.status, got.headers, got.body)

    async def read_into(self, bucket: str, key: str, what: str, rng: ByteRange,
                        buf: bytearray, if_match: str | None) -> memoryview:
        """Bytes ``rng`` of ``key`` into the start of ``buf`` (only while its ETag is
        ``if_match``, if given); the view of them. Transient if the body is not exactly the
        range."""
        host, path = self._endpoint.target(bucket, key)
        asked = [("Host", host), USER_AGENT, ("Range", f"bytes={rng.start}-{rng.end - 1}")]
        if if_match:
            asked.append(("If-Match", f'"{if_match}"'))
        sent = await self._signed("GET", path, "", asked)
        view = memoryview(buf)[:rng.length]
        got = await self._wire.exchange(what, "GET", path, sent, None, view)
        if got.status >= 300:
            raise S3Answered(crt_answer(got.status, got.body))
        check_range(got, rng, what)
        return view

    def close(self) -> None:
        self._wire.close()

    async def _signed(self, method: str, path: str, query: str,
                      headers: list[tuple[str, str]]) -> list[tuple[str, str]]:
        creds, _ = await self._keys.current()  # renewed keys, when they were
        return sign(method, path, query, headers, creds, self._settings.region)
