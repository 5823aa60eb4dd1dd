"""Azure Blob's ranged GET over mcsync's own connections (``http_wire``): a part relayed from
``az://`` is read straight into the run's buffer, as an S3 part is (``s3_wire``), instead of
through obstore's pieces, each a handoff from its runtime's thread and a copy into the buffer
(figures: benchmarks/results/2026-12-07-azure-wire.md).

Signed as Azure's SDKs sign with an account key (Shared Key: the request's standard headers,
its ``x-ms-`` headers and the resource, HMAC-SHA256 with the key), or carrying a SAS token in
its query. Those two credentials are read where obstore reads them and in its order
(``credential``); any other (a bearer token, a service principal, workload or managed
identity, the Azure CLI) is obstore's alone, and the store reads through obstore then.
Pure but for the exchange: the credential never appears in a repr, an error or a log.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from email.utils import formatdate
from typing import Any
from urllib.parse import quote, urlsplit

from ..types import ByteRange
from .http_wire import USER_AGENT, HttpWire, Reply, check_range, tls_context
from .s3_errors import Answer, S3Answered, crt_answer

# The service version obstore's Azure client asks for: Azurite serves it, and every
# account does.
API_VERSION = "2021-08-06"
# The standard headers Shared Key signs, in its order (a Content-Length of 0 signs as empty).
_SIGNED = ("content-encoding", "content-language", "content-length", "content-md5",
           "content-type", "date", "if-modified-since", "if-match", "if-none-match",
           "if-unmodified-since", "range")
# Settings of obstore's that the wire reads as obstore does; a store given any other (a
# credential of another kind, the emulator's defaults) reads through obstore alone.
_WIRE_CONFIG = frozenset({"account_name", "account_key", "access_key"})
_KEY_VARIABLES = ("AZURE_STORAGE_ACCOUNT_KEY", "AZURE_STORAGE_ACCESS_KEY",
                  "AZURE_STORAGE_MASTER_KEY")
_SAS_VARIABLES = ("AZURE_STORAGE_SAS_KEY", "AZURE_STORAGE_SAS_TOKEN")
# Variables that make obstore sign otherwise, or not at all, where a key or SAS is also set.
_OTHER_CREDENTIALS = ("AZURE_STORAGE_TOKEN", "AZURE_SKIP_SIGNATURE", "AZURE_CREDENTIAL_TYPE",
                      "AZURE_STORAGE_USE_EMULATOR", "AZURE_USE_AZURE_CLI")
_CLIENT_IDS = ("AZURE_STORAGE_CLIENT_ID", "AZURE_CLIENT_ID")


@dataclass(frozen=True, slots=True)
class WireCredential:
    """An account key (decoded) or a SAS token (its query string): what the wire signs with.
    Neither appears in a repr."""

    account: str
    key: bytes | None = field(default=None, repr=False)
    sas: str | None = field(default=None, repr=False)


def credential(config: Mapping[str, Any], connection_key: str | None,
               connection_sas: str | None, account: str | None,
               environ: Mapping[str, str] | None = None) -> WireCredential | None:
    """The key or SAS obstore would sign with for a store of ``config`` (and a connection
    string's credential, which outranks everything), or None when obstore would use another
    kind, or when it is unclear which it would use."""
    env = os.environ if environ is None else environ
    account = account or str(config.get("account_name") or "") or env.get(
        "AZURE_STORAGE_ACCOUNT_NAME", "")
    if connection_key is not None or connection_sas is not None:
        return _made(account, connection_key, connection_sas)
    if set(config) - _WIRE_CONFIG or any(env.get(name) for name in _OTHER_CREDENTIALS):
        return None
    key = (config.get("account_key") or config.get("access_key")
           or next((env[name] for name in _KEY_VARIABLES if env.get(name)), None))
    if key:
        return _made(account, str(key), None)
    if any(env.get(name) for name in _CLIENT_IDS):
        return None  # a service principal or workload identity outranks a SAS in obstore
    sas = next((env[name] for name in _SAS_VARIABLES if env.get(name)), None)
    return _made(account, None, sas) if sas else None


def _made(account: str, key: str | None, sas: str | None) -> WireCredential | None:
    if key is not None:
        if not account:
            return None
        try:
            return WireCredential(account, base64.b64decode(key, validate=True))
        except (binascii.Error, ValueError):
            return None  # obstore's to refuse, in its words
    return WireCredential(account, sas=(sas or "").lstrip("?")) if sas else None


def shared_key(method: str, path: str, headers: Sequence[tuple[str, str]], account: str,
               key: bytes) -> str:
    """The Authorization header's value for a request without a query: Shared Key over
    ``headers`` (every header the request carries) and ``path`` (as sent, percent-encoded)."""
    named = {name.lower(): value for name, value in headers}
    if named.get("content-length") == "0":
        named["content-length"] = ""
    lines = [method, *(named.get(name, "") for name in _SIGNED)]
    lines += [f"{name}:{named[name]}" for name in sorted(n for n in named if n.startswith("x-ms-"))]
    lines.append(f"/{account}{path}")
    signature = hmac.digest(key, "\n".join(lines).encode("utf-8"), hashlib.sha256)
    return f"SharedKey {account}:{base64.b64encode(signature).decode('ascii')}"


class AzureWire:
    """Ranged GETs of one account's blobs into the caller's buffers."""

    def __init__(self, endpoint: str, credential: WireCredential, max_connections: int) -> None:
        where = urlsplit(endpoint.rstrip("/"))
        self._host = where.netloc
        self._base = where.path  # Azurite's account, in the path
        self._credential = credential
        tls = tls_context(None) if where.scheme == "https" else None
        self._wire = HttpWire((where.hostname or "", where.port), tls, max_connections,
                              ca_hint="the system's trust store (SSL_CERT_FILE)")

    async def read_into(self, container: str, name: str, what: str, rng: ByteRange,
                        buf: bytearray, if_match: str | None) -> memoryview:
        """Bytes ``rng`` of blob ``name`` into the start of ``buf`` (only while its ETag is
        ``if_match``, if given); the view of them. Transient if the body is not exactly the
        range; an error answer as ``S3Answered``, for the one table."""
        path = f"{self._base}/{container}/{quote(name, safe='/~')}"
        headers = [("Host", self._host), USER_AGENT, ("x-ms-date", formatdate(usegmt=True)),
                   ("x-ms-version", API_VERSION),
                   ("x-ms-range", f"bytes={rng.start}-{rng.end - 1}")]
        if if_match:
            headers.append(("If-Match", f'"{if_match}"'))
        target = path
        cred = self._credential
        if cred.key is not None:
            headers.append(("Authorization", shared_key("GET", path, headers, cred.account,
                                                        cred.key)))
        else:
            target = f"{path}?{cred.sas}"
        view = memoryview(buf)[:rng.length]
        got = await self._wire.exchange(what, "GET", target, headers, None, view)
        if got.status >= 300:
            raise S3Answered(_answer(got))
        check_range(got, rng, what)
        return view

    def close(self) -> None:
        self._wire.close()


def _answer(got: Reply) -> Answer:
    """Azure's error: its code from ``x-ms-error-code`` (every answer has it, a HEAD's too),
    else from the XML body, as S3's."""
    parsed = crt_answer(got.status, got.body)
    code = got.headers.get("x-ms-error-code") or parsed.code
    return Answer(code, got.status, parsed.message)
