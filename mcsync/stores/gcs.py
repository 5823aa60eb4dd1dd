"""Google Cloud Storage as a source (``gs://bucket/prefix``), through the GCS JSON API (v1).

Client: aiohttp against the JSON API, with gcloud-aio-auth for credentials. gcloud-aio-storage
(the same family) was the first candidate and was measured against what this store needs:

* pinned reads: ``Storage.download()`` takes headers but no query parameters, and GCS takes
  ``ifGenerationMatch`` only as a query parameter on the JSON API; reaching it means calling
  the private ``Storage._download``;
* response headers: ``download()`` returns the body alone, and this store reads
  ``x-goog-generation`` (the generation actually served) and ``x-goog-hash`` (the whole
  object's CRC32C) from the response;
* retries: gcloud-aio-storage retries nothing (its README says to wrap calls in tenacity), so a
  request loop of ours is needed either way;
* it adds ``aiofiles`` and nothing this store would use.

What is left is a dozen URLs and query strings, written here, on the aiohttp that aiobotocore
already brings, with one connection pool sized to ``--concurrency``. gcloud-aio-auth supplies
Application Default Credentials the way Google's libraries find them (its lookup follows
google-auth's ``default()``): ``GOOGLE_APPLICATION_CREDENTIALS`` (service-account key,
authorized-user, external-account / workload-identity-federation and impersonated service
account files), then gcloud's ``application_default_credentials.json`` (``gcloud auth
application-default login``; ``CLOUDSDK_CONFIG`` moves it), then the GCE / GKE metadata
server. ``STORAGE_EMULATOR_HOST`` points the store at an emulator and turns authentication off,
as Google's own clients do.

A private CA (an https emulator, a TLS-inspecting proxy in front of GCS) is trusted the way
Google's tools are told one: ``CLOUDSDK_CORE_CUSTOM_CA_CERTS_FILE`` (gcloud's
``core/custom_ca_certs_file``), else ``REQUESTS_CA_BUNDLE`` (what google-cloud-storage's requests
reads): a PEM bundle trusted alone, in place of the system's roots, as both of them do. Without
either, OpenSSL's defaults apply (``SSL_CERT_FILE`` / ``SSL_CERT_DIR``). A certificate that does
not verify is refused at once (not retried), with the variable to set.

gcloud-aio-auth would skip a credentials file that is not JSON and retry its token fetch for a
minute: the file is checked first (``gcs_credentials``) and the fetch tried once
(``RetryPolicy.gcloud_aio_auth``) inside a request whose loop retries by type.

Object identity, as ``ObjectInfo``:

* ``etag`` is the object's MD5 (``md5Hash``) in hex, not GCS's ``etag``. The planner skips a key
  when source and target ETags are equal, and a single-part S3 / Meta Storage ETag is the hex
  MD5 of the object, so equal content is recognised across clouds. GCS's own ``etag`` is opaque
  and changes with metadata-only updates; it could never match a target. Composite objects
  (``gsutil`` parallel uploads, compose) have no MD5: their ``etag`` is None and the planner
  falls back to size and time, as for local files.
* ``version`` is the generation; every read planned from a listing is pinned to it with
  ``ifGenerationMatch`` (GCS answers 412, raised as PreconditionFailed), and the generation
  that was served (``x-goog-generation``) is compared as well where the server sends it.
* ``crc32c`` is GCS's base64 CRC32C. A whole-object read is checked against it here
  (IntegrityError on a mismatch); checking a multipart copy is transfer.py's, with
  ``mcsync.checksums.combine`` (see that module).
* ``mtime`` is ``updated``.

Reads ask for ``Accept-Encoding: gzip`` and never decompress: an object stored with
``Content-Encoding: gzip`` is copied as the bytes GCS stores (the size, MD5 and CRC32C it lists),
not decompressively transcoded. GCS does no compressive transcoding, so other objects arrive as
stored too.

A source only: the store is a ``ReadStore`` and has no write side, so the engine refuses it as
a target before anything is asked of it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import ssl
import types
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any, Literal, TypeVar
from urllib.parse import quote, urlencode, urlsplit

import aiohttp
from yarl import URL

from .._version import __version__
from ..checksums import crc32c_async, verify
from ..errors import (
    AccessDenied,
    ConfigError,
    ListingOrderError,
    MCSyncError,
    NoSuchBucket,
    NotFound,
    Permanent,
    PreconditionFailed,
    Throttled,
    Transient,
    Unreachable,
    as_config_error,
)
from ..retry import RetryPolicy, retrying
from ..types import REMOTE, ByteRange, ObjectInfo
from .base import Buffer
from .gcs_answers import as_json, error_message, hash_of, object_info
from .gcs_credentials import (
    CA_BUNDLE_VARIABLES,
    ca_bundle_from_env,
    find_credentials,
    tls_context,
)
from .gcs_wire import GcsWire
from .http_wire import Reply, behind_proxy, check_range, the_range

log = logging.getLogger(__name__)
T = TypeVar("T")

GCS_API_ROOT = "https://storage.googleapis.com"
READ_ONLY_SCOPE = "https://www.googleapis.com/auth/devstorage.read_only"
LIST_PAGE_SIZE = 1000  # GCS's maximum page
_LIST_FIELDS = "items(name,size,md5Hash,crc32c,generation,updated),nextPageToken"
_OBJECT_FIELDS = "name,size,md5Hash,crc32c,generation,updated"


class GCSStore:
    facts = REMOTE

    def __init__(
        self,
        *,
        bucket: str,
        prefix: str,
        api_root: str | None = None,
        anonymous: bool | None = None,
        credentials_file: str | None = None,
        max_connections: int = 128,
        retry: RetryPolicy | None = None,
        page_size: int | None = None,
        ca_bundle: str | None = None,
    ) -> None:
        """``api_root`` and ``anonymous`` default from ``STORAGE_EMULATOR_HOST`` (an emulator,
        no authentication) or else GCS with Application Default Credentials;
        ``credentials_file`` overrides ``GOOGLE_APPLICATION_CREDENTIALS``; ``ca_bundle`` (a PEM
        file of the CAs an https endpoint's certificate may chain to, trusted alone) overrides
        ``CA_BUNDLE_VARIABLES``."""
        self.bucket = bucket
        self.prefix = prefix  # "" or ends with "/"
        self.url = f"gs://{bucket}/{prefix}"
        emulator = os.environ.get("STORAGE_EMULATOR_HOST") or None
        if api_root is None and emulator:
            api_root = emulator if "://" in emulator else f"http://{emulator}"
            if anonymous is None:
                anonymous = True
        self._api_root = (api_root or GCS_API_ROOT).rstrip("/")
        self._anonymous = bool(anonymous)
        self._local = urlsplit(self._api_root).hostname in ("127.0.0.1", "localhost", "::1")
        self._credentials_file = credentials_file
        self._max_connections = max_connections
        self._retry = retry or RetryPolicy()
        self._page_size = page_size or LIST_PAGE_SIZE  # read here: tests make pages small
        self._ca_bundle = ca_bundle if ca_bundle is not None else ca_bundle_from_env()
        self._objects = f"{self._api_root}/storage/v1/b/{quote(bucket, safe='')}/o"
        self._lock = asyncio.Lock()
        self._session: aiohttp.ClientSession | None = None
        self._token: Any = None
        self._credential_source = "no credentials (emulator)" if self._anonymous else ""
        self._tls: ssl.SSLContext | None = None
        self._wire: GcsWire | None = None
        self._wire_asked = False  # whether the proxy was looked at for the wire
        self._wire_ranges = True  # until a server answers a Range with the whole object

    # -- lifecycle ----------------------------------------------------------------------------

    async def _http(self) -> aiohttp.ClientSession:
        if self._session is None:
            async with self._lock:
                if self._session is None:
                    tls = self._tls = tls_context(self._ca_bundle, self._api_root, self.url)
                    if not self._anonymous:
                        self._token = self._make_token()
                    self._session = aiohttp.ClientSession(
                        connector=aiohttp.TCPConnector(limit=self._max_connections,
                                                       ttl_dns_cache=300,
                                                       ssl=tls if tls is not None else True),
                        timeout=aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=120),
                        auto_decompress=False,  # the stored bytes, see the module docstring
                        trust_env=not self._local,  # HTTPS_PROXY for GCS, never for loopback
                        headers={"User-Agent": f"mcsync/{__version__}"},
                    )
        return self._session

    def _make_token(self) -> Any:
        from gcloud.aio.auth.token import BaseToken, Token

        path, self._credential_source = find_credentials(self._credentials_file)
        try:
            token = Token(service_file=path, scopes=[READ_ONLY_SCOPE])
        except Exception as exc:  # a file that passed our checks and still did not load
            raise ConfigError(f"{self.url}: cannot use {self._credential_source}: "
                              f"{type(exc).__name__}") from None
        retry_with = getattr(BaseToken.acquire_access_token, "retry_with", None)  # tenacity
        if retry_with is not None:
            # the decorated method, re-decorated with this run's policy (a plain method now)
            token.acquire_access_token = types.MethodType(  # type: ignore[assignment]
                retry_with(**self._retry.gcloud_aio_auth()), token)
        return token

    async def aclose(self) -> None:
        session, self._session = self._session, None
        wire, self._wire, self._wire_asked = self._wire, None, False
        if wire is not None:
            wire.close()
        token, self._token = self._token, None
        if token is not None:
            with contextlib.suppress(Exception):
                await token.close()
        if session is not None:
            await session.close()

    # -- requests -----------------------------------------------------------------------------

    async def _send(
        self, url: str, params: Mapping[str, str], *, what: str,
        headers: Mapping[str, str] | None = None, attempts: int | None = None,
        bucket_level: bool = False,
    ) -> tuple[int, Mapping[str, str], bytes]:
        """One GET, its body read whole, retried by type (Transient) under the run's
        RetryPolicy. ``bucket_level``: the URL is the bucket's (a listing), so a 404 means the
        bucket is missing."""
        return await self._request(url, params, _whole_body, what=what, headers=headers,
                                   attempts=attempts, bucket_level=bucket_level)

    async def _request(
        self, url: str, params: Mapping[str, str],
        read: Callable[[aiohttp.ClientResponse], Awaitable[T]], *, what: str,
        headers: Mapping[str, str] | None = None, attempts: int | None = None,
        bucket_level: bool = False,
    ) -> tuple[int, Mapping[str, str], T]:
        """``_send`` with the body of an answer under 400 read by ``read`` (again from its
        start if the request is retried)."""
        return await retrying(
            lambda: self._once(url, params, headers, what, read, bucket_level=bucket_level),
            self._retry, attempts=attempts if attempts is not None else self._retry.sdk_attempts)

    async def _once(
        self, url: str, params: Mapping[str, str], headers: Mapping[str, str] | None,
        what: str, read: Callable[[aiohttp.ClientResponse], Awaitable[T]], *,
        bucket_level: bool,
    ) -> tuple[int, Mapping[str, str], T]:
        http = await self._http()
        sent = dict(headers or {})
        sent.update(await self._auth(what))
        # Sent exactly as quoted here: a key's '%2F', '%23', '%3F' must reach GCS as written.
        target = URL(f"{url}?{urlencode(params, quote_via=quote, safe='')}", encoded=True)
        try:
            async with http.get(target, headers=sent, allow_redirects=False) as resp:
                if resp.status >= 400:
                    raise self._status_error(resp.status, await resp.read(), what,
                                             bucket_level=bucket_level)
                return resp.status, resp.headers, await read(resp)
        except MCSyncError:
            raise
        except aiohttp.ClientConnectorCertificateError as exc:  # no retry can change it
            reason = getattr(exc.certificate_error, "verify_message", None) or "not verified"
            raise Permanent(f"{what}: the TLS certificate of {self._api_root} is not trusted "
                            f"({reason}); a private CA's certificate goes in "
                            f"{CA_BUNDLE_VARIABLES[0]}") from exc
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, TimeoutError) as exc:
            raise Unreachable(f"{what}: connection to {self._api_root} failed "
                              f"({type(exc).__name__})") from exc
        except aiohttp.ClientError as exc:
            raise Permanent(f"{what}: {type(exc).__name__}: {exc}") from exc

    async def _auth(self, what: str) -> dict[str, str]:
        if self._anonymous:
            return {}
        try:
            token = await self._token.get()
        except Exception as exc:
            raise self._token_error(exc, what) from exc
        return {"Authorization": f"Bearer {token}"}

    def _token_error(self, exc: Exception, what: str) -> MCSyncError:
        source = self._credential_source
        if isinstance(exc, aiohttp.ClientResponseError):
            if exc.status in (408, 429) or exc.status >= 500:
                return Transient(f"{what}: token endpoint of {source} answered {exc.status}")
            return AccessDenied(f"{what}: Google credentials refused ({source}, "
                                f"HTTP {exc.status})")
        if isinstance(exc, aiohttp.ClientConnectionError | TimeoutError):
            if source.startswith("the metadata server"):
                return Transient(
                    f"{what}: no Google credentials: GOOGLE_APPLICATION_CREDENTIALS is not set, "
                    "there are no gcloud application-default credentials, and the metadata "
                    f"server did not answer ({type(exc).__name__})")
            return Transient(f"{what}: cannot reach the token endpoint of {source} "
                             f"({type(exc).__name__})")
        return AccessDenied(f"{what}: cannot use {source}: {type(exc).__name__}")

    def _status_error(self, status: int, body: bytes, what: str, *,
                      bucket_level: bool) -> MCSyncError:
        message = error_message(body)
        detail = f": {message}" if message else ""
        if status == 404:
            if bucket_level:
                return NoSuchBucket(f"{self.url}: bucket {self.bucket!r} does not exist{detail}")
            return NotFound(f"{what}: no such object")
        if status == 412:
            return PreconditionFailed(f"{what}: changed since it was listed (a newer "
                                      "generation replaced it)")
        if status in (401, 403):
            return AccessDenied(f"{what}: access denied (HTTP {status}){detail}")
        if status == 429 or status == 503:
            return Throttled(f"{what}: HTTP {status}{detail}")
        if status == 408 or status >= 500:
            return Transient(f"{what}: HTTP {status}{detail}")
        return Permanent(f"{what}: HTTP {status}{detail}")

    # -- operations -----------------------------------------------------------------------------

    async def check(self, *, mode: Literal["read"] = "read") -> None:
        try:
            await self._send(self._objects, {"prefix": self.prefix, "maxResults": "1",
                                             "fields": "items(name),nextPageToken"},
                             what=self.url, attempts=self._retry.preflight_attempts,
                             bucket_level=True)
        except MCSyncError as exc:
            raise as_config_error(exc, self.url, self._api_root) from exc

    async def list(self) -> AsyncIterator[ObjectInfo]:
        """Every object under the prefix in UTF-8 byte order (GCS's order), a page at a time."""
        cut = len(self.prefix)
        last = ""
        token: str | None = None
        while True:
            params = {"prefix": self.prefix, "maxResults": str(self._page_size),
                      "fields": _LIST_FIELDS}
            if token:
                params["pageToken"] = token
            _, _, body = await self._send(self._objects, params, what=self.url,
                                         bucket_level=True)
            page = as_json(body, self.url)
            for item in page.get("items") or ():
                name = item["name"]
                if name <= last:
                    raise ListingOrderError(f"{self.url}: server lists keys out of byte order "
                                            f"({last!r} before {name!r})")
                last = name
                if not name.startswith(self.prefix):
                    raise Permanent(f"{self.url}: server listed {name!r} outside the prefix")
                key = name[cut:]
                if key:  # the prefix's own "directory marker" is not an object under it
                    yield object_info(key, item)
            token = page.get("nextPageToken")
            if not token:
                return

    async def head(self, key: str) -> ObjectInfo:
        what = f"{self.url}{key}"
        _, _, body = await self._send(self._object_url(key), {"fields": _OBJECT_FIELDS},
                                      what=what)
        return object_info(key, as_json(body, what))

    async def get(
        self, key: str, rng: ByteRange | None = None, *, expect: ObjectInfo | None = None
    ) -> Buffer:
        what = f"{self.url}{key}"
        if rng is not None and rng.length == 0:
            return b""
        params, headers, generation = _media(rng, expect)
        status, got, data = await self._send(self._object_url(key), params, what=what,
                                             headers=headers)
        _check_generation(got, generation, what)
        if rng is not None:
            if status == 200 and len(data) >= rng.end:  # the server sent the whole object
                data = data[rng.start:rng.end]
            if len(data) != rng.length:
                raise Transient(f"{what}: short read ({len(data)} of {rng.length} bytes)")
        whole = rng is None or (expect is not None and rng.start == 0 and rng.end == expect.size)
        if whole:
            expected = (expect.crc32c if expect is not None else None) or hash_of(got, "crc32c")
            if expected:
                verify(expected, await crc32c_async(data), what)
        return data

    async def read_into(self, key: str, rng: ByteRange, buf: bytearray, *,
                        expect: ObjectInfo | None = None) -> memoryview:
        """Bytes ``rng`` of ``key`` (pinned as ``get``) into ``buf``: by the wire, the socket
        reading into it (``gcs_wire``), or from aiohttp's pieces, each copied in (a server that
        ignored a Range, an endpoint behind a proxy). ``get``'s ``resp.read()`` would join the
        pieces into a new ``bytes`` of the part's size, fresh pages for every part, where the
        run's buffers are reused. The part's CRC32C is checked by the caller."""
        what = f"{self.url}{key}"
        view = memoryview(buf)
        if rng.length == 0:
            return view[:0]
        params, headers, generation = _media(rng, expect)
        wire = await self._wire_client()
        if wire is not None:
            async def once() -> Reply:
                sent = headers | await self._auth(what)
                got = await wire.read_into(self._object_url(key), params, sent,
                                           view[:rng.length], what)
                if got.status >= 300:
                    raise self._status_error(got.status, got.body, what, bucket_level=False)
                return got

            got = await retrying(once, self._retry, attempts=self._retry.sdk_attempts)
            _check_generation(got.headers, generation, what)
            if got.status != 200 or the_range(got, rng):
                check_range(got, rng, what)
                return view[:rng.length]
            self._wire_ranges = False  # Range ignored: aiohttp's path skips to it

        async def into(resp: aiohttp.ClientResponse) -> int:
            skip = rng.start if resp.status == 200 else 0  # Range ignored: the whole object
            at = 0
            async for piece in resp.content.iter_any():
                got = memoryview(piece)
                if skip:
                    cut = min(skip, len(got))
                    got, skip = got[cut:], skip - cut
                if len(got) > rng.length - at:
                    if resp.status != 200:
                        raise Transient(f"{what}: long read (more than {rng.length} bytes)")
                    got = got[:rng.length - at]
                view[at:at + len(got)] = got
                at += len(got)
                if at == rng.length and resp.status == 200:
                    break
            return at

        _, answered, n = await self._request(self._object_url(key), params, into, what=what,
                                             headers=headers)
        _check_generation(answered, generation, what)
        if n != rng.length:
            raise Transient(f"{what}: short read ({n} of {rng.length} bytes)")
        return view[:n]

    async def _wire_client(self) -> GcsWire | None:
        """The wire, made on first use (after the session: the token), unless the endpoint
        is reached through a proxy or was found to ignore a Range."""
        await self._http()
        if not self._wire_asked:
            self._wire_asked = True
            if not behind_proxy(self._api_root):
                self._wire = GcsWire(self._api_root, self._tls, self._max_connections,
                                     CA_BUNDLE_VARIABLES[0])
        return self._wire if self._wire_ranges else None

    def _object_url(self, key: str) -> str:
        return f"{self._objects}/{quote(self.prefix + key, safe='')}"


# -- helpers ------------------------------------------------------------------------------------


async def _whole_body(resp: aiohttp.ClientResponse) -> bytes:
    return await resp.read()


def _media(rng: ByteRange | None, expect: ObjectInfo | None) -> tuple[dict[str, str],
                                                                     dict[str, str], str | None]:
    """The query and headers of a read of ``rng`` pinned to ``expect``'s generation, and that
    generation."""
    params = {"alt": "media"}
    generation = expect.version if expect is not None else None
    if generation:
        params["ifGenerationMatch"] = generation
    headers = {"Accept-Encoding": "gzip"}
    if rng is not None:
        headers["Range"] = f"bytes={rng.start}-{rng.end - 1}"
    return params, headers, generation


def _check_generation(got: Mapping[str, str], generation: str | None, what: str) -> None:
    served = got.get("x-goog-generation")
    if generation and served and served != generation:
        raise PreconditionFailed(f"{what}: changed since it was listed (generation "
                                 f"{generation} planned, {served} served)")
