"""Azure Blob Storage as a source (``az://container/prefix``), through obstore's Azure client,
and a relay's parts read into the run's buffers over mcsync's own connections (``azure_wire``)
where the credential is an account key or a SAS.

A source only, as ``gcs``: listing, HEAD and (ranged) GETs pinned to the listed ETag
(``If-Match``: Azure answers 412 ConditionNotMet once a blob changed). The account, its
credentials and the endpoint come from the environment variables obstore (object_store)
reads: ``AZURE_STORAGE_ACCOUNT_NAME`` and one of ``AZURE_STORAGE_ACCOUNT_KEY``,
``AZURE_STORAGE_SAS_TOKEN``, a service principal, workload identity, managed identity or
``AZURE_USE_AZURE_CLI``; ``AZURE_STORAGE_ENDPOINT`` for another endpoint (Azurite, sovereign
clouds). Or ``AZURE_STORAGE_CONNECTION_STRING``, read first as the Azure CLI reads it
(``Connection``). Errors are translated by the one table in ``s3_errors`` (obstore's errors
carry the service's XML ``<Code>`` for either cloud), with any URL's query string cut from
the text: a SAS token travels in it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import urlsplit

import obstore

from ..errors import (
    ConfigError,
    ListingOrderError,
    MCSyncError,
    NoSuchBucket,
    Permanent,
    UsageError,
    as_config_error,
)
from ..retry import RetryPolicy
from ..types import REMOTE, Buffer, ByteRange, ObjectInfo
from .azure_wire import AzureWire, credential
from .http_wire import behind_proxy
from .obstore_body import fill, pieces, whole
from .s3_errors import translate

if TYPE_CHECKING:
    from obstore import GetOptions, ObjectMeta
    from obstore.store import AzureConfig, AzureCredential

_QUERY = re.compile(r"\?[^\s\"'<>]*")  # a URL's query string: where a SAS token travels

CONNECTION_STRING = "AZURE_STORAGE_CONNECTION_STRING"
# Azurite's one account and its published development key: what UseDevelopmentStorage=true
# means to Azure's SDKs (no secret of anyone's).
_DEV_ACCOUNT = "devstoreaccount1"
_DEV_KEY = ("Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/"
            "KBHBeksoGMGw==")


@dataclass(frozen=True, slots=True)
class Connection:
    """What ``AZURE_STORAGE_CONNECTION_STRING`` says: the account, its blob endpoint and one
    credential (an account key or a SAS). The credential never appears in a repr."""

    account: str
    endpoint: str  # the blob service's URL, no trailing slash
    account_key: str | None = field(default=None, repr=False)
    sas: str | None = field(default=None, repr=False)

    def credential(self) -> AzureCredential:
        """For obstore's ``credential_provider``: it outranks every other setting, so a key in
        ``AZURE_STORAGE_ACCOUNT_KEY`` cannot win over the string's SAS."""
        if self.account_key is not None:
            return {"access_key": self.account_key, "expires_at": None}
        assert self.sas is not None
        return {"sas_token": self.sas, "expires_at": None}


def connection_from_env(environ: Mapping[str, str] | None = None) -> Connection | None:
    """``AZURE_STORAGE_CONNECTION_STRING`` read as Azure's SDKs read it, or None when unset.

    ``Name=value`` pairs separated by ``;`` (names in any case): ``AccountName`` and
    ``AccountKey``, or ``SharedAccessSignature``; the endpoint is ``BlobEndpoint`` when
    given, else ``{DefaultEndpointsProtocol}://{AccountName}.blob.{EndpointSuffix}``
    (``https`` and ``core.windows.net`` by default); ``UseDevelopmentStorage=true`` is
    Azurite on 127.0.0.1:10000. As in the Azure CLI, the string wins over
    ``AZURE_STORAGE_ACCOUNT_NAME`` / ``_KEY`` / ``AZURE_STORAGE_SAS_TOKEN``, which fill only
    what it lacks (the account's name; a credential when it holds neither key nor SAS), and
    its endpoint over ``AZURE_STORAGE_ENDPOINT``. Raises UsageError naming the variable and
    what is wrong, never its value."""
    env = os.environ if environ is None else environ
    text = env.get(CONNECTION_STRING, "").strip()
    if not text:
        return None

    def bad(why: str) -> UsageError:
        return UsageError(f"{CONNECTION_STRING} is malformed: {why} (its value is not shown)")

    settings: dict[str, str] = {}
    for n, pair in enumerate(text.rstrip(";").split(";"), 1):
        name, eq, value = pair.partition("=")
        name = name.strip()
        if not eq or not name:
            raise bad(f"part {n} is not Name=value")
        settings[name.lower()] = value.strip()
    if settings.get("usedevelopmentstorage", "").lower() == "true":
        return Connection(_DEV_ACCOUNT, f"http://127.0.0.1:10000/{_DEV_ACCOUNT}", _DEV_KEY)
    account = settings.get("accountname") or env.get("AZURE_STORAGE_ACCOUNT_NAME") or ""
    endpoint = settings.get("blobendpoint", "").rstrip("/")
    if endpoint:
        where = urlsplit(endpoint)
        if where.scheme not in ("http", "https") or not where.netloc:
            raise bad("BlobEndpoint is not an http(s) URL")
        if not account:  # a SAS string may name no account: its endpoint does
            host = where.hostname or ""
            account = (host.split(".blob.")[0] if ".blob." in host
                       else where.path.strip("/").split("/")[0])  # Azurite's path style
    elif account:
        protocol = settings.get("defaultendpointsprotocol", "https").lower()
        if protocol not in ("http", "https"):
            raise bad("DefaultEndpointsProtocol is neither http nor https")
        suffix = settings.get("endpointsuffix") or "core.windows.net"
        endpoint = f"{protocol}://{account}.blob.{suffix}"
    if not account:
        raise bad("it names neither AccountName nor BlobEndpoint")
    key = settings.get("accountkey") or None
    sas = (settings.get("sharedaccesssignature") or "").lstrip("?") or None
    if key is None and sas is None:  # as the Azure CLI: the variables fill a credential in
        key = env.get("AZURE_STORAGE_ACCOUNT_KEY") or None
        sas = (env.get("AZURE_STORAGE_SAS_TOKEN") or "").lstrip("?") or None
    if key is not None and sas is not None:
        sas = None  # Azure's SDKs sign with the key when both are given
    if key is None and sas is None:
        raise bad("it holds neither AccountKey nor SharedAccessSignature")
    if key is not None:
        import base64
        import binascii

        try:
            base64.b64decode(key, validate=True)
        except (binascii.Error, ValueError):
            raise bad("AccountKey is not base64") from None
    return Connection(account, endpoint, key, sas)


class AzureStore:
    """A container and prefix of Azure Blob Storage, read-only: a ``ReadStore`` and a
    ``RangeStreamer`` (a range into a file as it arrives)."""

    facts = REMOTE

    def __init__(self, *, container: str, prefix: str, endpoint: str | None = None,
                 max_connections: int = 128, retry: RetryPolicy | None = None,
                 config: AzureConfig | None = None) -> None:
        """``endpoint`` defaults from ``AZURE_STORAGE_ENDPOINT`` / ``AZURE_ENDPOINT``;
        ``config``: obstore's Azure settings, over those of the environment (tests)."""
        self.container = container
        self.prefix = prefix  # "" or ends with "/"
        self.url = f"az://{container}/{prefix}"
        self._connection = connection_from_env()
        self._endpoint = (endpoint
                          or (self._connection.endpoint if self._connection else None)
                          or os.environ.get("AZURE_STORAGE_ENDPOINT")
                          or os.environ.get("AZURE_ENDPOINT") or None)
        self._config: AzureConfig = config.copy() if config else {}
        if self._connection is not None:
            self._config.setdefault("account_name", self._connection.account)
        self._max_connections = max_connections
        self._retry = retry or RetryPolicy()
        self._client: Any = None
        self._wire: AzureWire | None = None
        self._wire_asked = False  # whether the credential was looked at for the wire
        self._sorted = False  # list everything, then sort (see list)

    def _make(self, *, preflight: bool = False) -> Any:
        from obstore.store import AzureStore as ObAzure

        config = self._config.copy()
        if self._endpoint:
            config.setdefault("endpoint", self._endpoint)
        return ObAzure(
            self.container, config=config,
            credential_provider=self._connection.credential if self._connection else None,
            client_options={"allow_http": (self._endpoint or "").startswith("http:"),
                            "pool_max_idle_per_host": str(self._max_connections),
                            "timeout": "300s", "connect_timeout": "10s"},
            retry_config=self._retry.obstore(preflight=preflight))

    def _fast(self) -> Any:
        if self._client is None:
            self._client = self._make()
        return self._client

    @contextlib.contextmanager
    def translating(self, key: str | None) -> Iterator[None]:
        """obstore's errors as mcsync's, about ``key`` (None: the container)."""
        try:
            yield
        except MCSyncError:
            raise
        except Exception as exc:
            what = f"{self.url}{key}" if key is not None else self.url
            translated = translate(exc, what, self.container)
            if translated is None:
                raise
            if isinstance(translated, NoSuchBucket):
                translated = NoSuchBucket(f"{what}: container {self.container!r} does not exist")
            # Not chained, and cut: the SDK's text names request URLs, with a SAS token.
            raise type(translated)(_QUERY.sub("?…", str(translated))) from None

    async def check(self, *, mode: Literal["read"] = "read") -> None:
        if not (self._config.get("account_name") or os.environ.get("AZURE_STORAGE_ACCOUNT_NAME")):
            raise ConfigError(f"{self.url}: no storage account given: set "
                              f"{CONNECTION_STRING}, or AZURE_STORAGE_ACCOUNT_NAME (and its "
                              "credential)")
        try:
            with self.translating(None):
                client = (self._fast() if self._retry.checks_retry_as_requests
                          else self._make(preflight=True))
                stream = obstore.list(client, self.prefix.rstrip("/") or None, chunk_size=1)
                await anext(aiter(stream), None)
        except MCSyncError as exc:
            raise as_config_error(exc, self.url, self._endpoint or "Azure") from exc

    async def aclose(self) -> None:
        self._client = None
        if self._wire is not None:
            self._wire.close()
        self._wire, self._wire_asked = None, False

    async def list(self) -> AsyncIterator[ObjectInfo]:
        """Every blob under the prefix in UTF-8 byte order, a page at a time. Azure lists in
        UTF-16 order, which differs only where a character beyond U+FFFF meets one of
        U+E000-U+FFFF at the same place of two names; a listing that does is refused, and
        the pass listed again whole and sorted here (``_sort_listing``: memory for every
        key, for such containers only)."""
        items = self._pages() if not self._sorted else _sorted_pages(self._pages())
        cut = len(self.prefix)
        last = ""
        async for item in items:
            name = item["path"]
            if name <= last:
                raise ListingOrderError(f"{self.url}: server lists keys out of byte order "
                                        f"({last!r} before {name!r})",
                                        fallback=self._sort_listing)
            last = name
            if not name.startswith(self.prefix):
                raise Permanent(f"{self.url}: server listed {name!r} outside the prefix")
            if name[cut:]:  # the prefix's own "directory marker" is not under it
                yield _info(name[cut:], item)

    def _sort_listing(self) -> None:
        self._sorted = True

    async def _pages(self) -> AsyncIterator[ObjectMeta]:
        with self.translating(None):
            # obstore's prefix is a path prefix: "run" lists run/..., as our "run/" does
            stream = obstore.list(self._fast(), self.prefix.rstrip("/") or None,
                                  chunk_size=1000)
            async for page in stream:
                for item in page:
                    yield item

    async def head(self, key: str) -> ObjectInfo:
        with self.translating(key):
            meta = await obstore.head_async(self._fast(), self.prefix + key)
        return _info(key, meta)

    async def get(
        self, key: str, rng: ByteRange | None = None, *, expect: ObjectInfo | None = None
    ) -> Buffer:
        if rng is not None and rng.length == 0:
            return b""
        resp = await self._request(key, rng, expect)
        return await whole(resp, rng.length if rng is not None else None, f"{self.url}{key}",
                           lambda: self.translating(key))

    async def open_range(
        self, key: str, rng: ByteRange, *, expect: ObjectInfo | None = None
    ) -> Iterator[Buffer]:
        if rng.length == 0:
            return iter(())
        resp = await self._request(key, rng, expect)
        return pieces(resp, rng.length, f"{self.url}{key}", lambda: self.translating(key))

    async def read_into(self, key: str, rng: ByteRange, buf: bytearray, *,
                        expect: ObjectInfo | None = None) -> memoryview:
        """Bytes ``rng`` of ``key`` into ``buf``: by the wire, the socket reading into it, or
        from obstore's pieces, each copied in."""
        wire = self._wire_client()
        if wire is None or rng.length == 0:
            body = await self.open_range(key, rng, expect=expect)
            return await asyncio.to_thread(fill, body, buf)
        with self.translating(key):
            return await wire.read_into(self.container, self.prefix + key, f"{self.url}{key}",
                                        rng, buf, expect.etag if expect is not None else None)

    def _wire_client(self) -> AzureWire | None:
        """The wire, made on first use, if the store's credential is one it signs with."""
        if not self._wire_asked:
            self._wire_asked = True
            conn = self._connection
            found = credential(self._config, conn.account_key if conn else None,
                               conn.sas if conn else None, conn.account if conn else None)
            endpoint = self._endpoint or (f"https://{found.account}.blob.core.windows.net"
                                          if found and found.account else None)
            self._wire = (AzureWire(endpoint, found, self._max_connections)
                          if found is not None and endpoint and not behind_proxy(endpoint)
                          else None)
        return self._wire

    async def _request(self, key: str, rng: ByteRange | None,
                       expect: ObjectInfo | None) -> Any:
        """A GET answered up to its headers (obstore's result, body unread)."""
        options: GetOptions = {}
        if rng is not None:
            options["range"] = (rng.start, rng.end)
        if expect is not None and expect.etag:
            options["if_match"] = f'"{expect.etag}"'
        with self.translating(key):
            return await obstore.get_async(self._fast(), self.prefix + key, options=options)


async def _sorted_pages(items: AsyncIterator[ObjectMeta]) -> AsyncIterator[ObjectMeta]:
    whole = [item async for item in items]
    whole.sort(key=lambda item: item["path"])  # str order is code point order: UTF-8's
    for item in whole:
        yield item


def _info(key: str, meta: ObjectMeta) -> ObjectInfo:
    etag = meta.get("e_tag")
    modified = meta.get("last_modified")
    return ObjectInfo(key, int(meta["size"]), etag.strip('"') if etag else None,
                      modified.timestamp() if modified is not None else None)
