"""The clients of one S3 store, and the rule of which client sends which request, in one place.

- obstore (Rust) sends listing pages, HEAD, DELETE, and the GETs and whole-object PUTs the
  wire does not: the least client CPU per request for small bodies. It refuses keys it cannot
  spell ("a//b", "x/../y"): those requests, and a listing from the page that holds one, go by
  botocore.
- mcsync's own connections (``s3_wire``, ``wire``) send the relay's bodies (a part's ranged
  GET into the run's buffer, UploadPart, whole objects of ``WIRE_FROM`` and more), the rest of
  the multipart API and the copies, to an explicit endpoint with keys.
- the AWS CRT sends a listing's levels delimited by "/" (``level_pages``) there. A body that
  must be SHA-256-signed (plain HTTP across a network) stays with botocore: the wire, like the
  CRT's S3 client, sends UNSIGNED-PAYLOAD; the CRT then sends the multipart requests that
  carry no body.
- botocore sends the rest: what needs AWS's endpoint rules (no endpoint given), anonymous
  access, listings of open uploads, and what obstore cannot spell.

With a client certificate (mutual TLS over https) obstore, which cannot present one, sends
nothing: its requests (listings, GET, HEAD, whole PUT, DELETE, and the check's) go by botocore,
and the wire keeps the bodies, CopyObject and the multipart requests, presenting the
certificate. The lock and the manifest's copy at the target are such requests too.
``either``, ``list_flat``, ``probe`` (the check's client), ``crt_client`` and ``wire`` are the
only places that choose; the store and ``S3Upload`` never do.

Every client signs with one ``Keys``; a refusal of expired keys asks ``Renewals`` for a forced
renewal, made before the next request (with a fresh obstore client: obstore keeps a credential
until near its stated expiry). SDK errors become mcsync errors in ``translating``, by the one
table (``s3_errors``). The store never tries a request again itself: retries live in one
layer above it.

Figures for the per-request CPU of each client: benchmarks/README.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterator, Sequence
from typing import Any, TypeVar

import obstore
import obstore.exceptions as obstore_exc

from ..retry import RetryPolicy
from ..types import Buffer, ByteRange, PartRef
from .s3_body import BodyChecksums, S3CopySource
from .s3_clients import (
    ClientCert,
    ClientSettings,
    make_obstore,
    obstore_forked,
    open_botocore,
    read_ca_bundle,
    uses_tls,
)
from .s3_crt import CrtClient
from .s3_errors import checksum_header_refusal, translate
from .s3_keys import Keys, KeySource, Renewals, S3Credentials, process_keys
from .s3_requests import S3Requests
from .s3_transport import BotocoreTransport, MultipartTransport, RequestsTransport, UploadIds
from .s3_wire import WireClient

log = logging.getLogger(__name__)
# A smaller body goes by obstore, whose request costs less Python than the wire's (a thread's
# hop, http.client): whole objects by the wire cost 1.2x obstore's CPU at 256 KiB and 1.6x at
# 64 KiB, parts 0.66-0.88x (results/2026-12-07-relay-wire.md); 1 MiB itself not measured.
WIRE_FROM = 1 << 20
T = TypeVar("T")

# What obstore raises for a key it cannot spell (a path it would normalise): botocore then.
_UNSPELLABLE = (ValueError, obstore_exc.InvalidPathError)


class S3Clients:
    """obstore's, botocore's and the CRT's clients of one store, each opened on first use, with
    the keys they sign with. ``identity`` is known from construction: the endpoint and who
    signs (``KeySource``), for server-side copy between stores."""

    def __init__(
        self,
        *,
        url: str,
        bucket: str,
        endpoint_url: str | None,
        region: str | None,
        credentials: S3Credentials | None,
        credential_process: str | None,
        profile: str | None,
        path_style: bool,
        max_connections: int,
        retry: RetryPolicy,
        ca_bundle: str | None,
        crt: bool,
        client_cert: ClientCert | None = None,
    ) -> None:
        self.url = url
        self.bucket = bucket
        self.endpoint_url = endpoint_url
        self.retry = retry
        self._region = region
        self._profile = profile
        self._source = KeySource.of(credentials, credential_process, profile, os.environ)
        self.identity = (endpoint_url.rstrip("/") if endpoint_url else None,
                         self._source.identity)
        self._path_style = path_style
        self._max_connections = max_connections
        self._ca_bundle = ca_bundle
        # Plain HTTP checks no certificate: a bundle is not read for it (AWS_CA_BUNDLE may
        # be the system's whole bundle).
        self._ca_pem = (read_ca_bundle(ca_bundle) if ca_bundle and uses_tls(endpoint_url)
                        else None)
        self._use_crt = crt
        # Mutual TLS: presented over https only (plain HTTP has no handshake to present it in).
        self._client_cert = client_cert if uses_tls(endpoint_url) else None
        self._check_botocore: Any = None  # the check's, with a client certificate (``probe``)
        self._check_botocore_cm: Any = None
        self._lock = asyncio.Lock()
        self._botocore_cm: Any = None
        self._botocore: Any = None
        self._obstore: Any = None
        self._preflight: Any = None  # the check's obstore client (see ``probe``)
        self._crt: CrtClient | None = None
        self._wire: WireClient | None = None
        self._crt_sends_bodies = False  # no payload to sign (see crt_client)
        self._keys: Keys | None = None  # once resolved: what every client signs with
        self._renewals = Renewals(url, bucket)  # of the keys, after refusals
        self.body_checksums = BodyChecksums(endpoint_url or "S3", checksum_header_refusal)

    # -- opening --------------------------------------------------------------------------------

    async def botocore(self) -> Any:
        """botocore's client, opened on first use (importing and starting it is a cost a run
        that never needs it does not pay)."""
        if self._renewals.wanted:
            await self._renew()
        if self._botocore is None:
            async with self._lock:
                if self._botocore is None:
                    cm, client, keys, region = await open_botocore(
                        self._settings(self._region or ""), await self._given_keys(),
                        self._profile)
                    self._keys = keys
                    if self._obstore is None and not self.botocore_only:
                        self._region = region
                        self._obstore = self._make_obstore()
                    elif self._obstore is None:
                        self._region = self._region or region
                    self._botocore_cm, self._botocore = cm, client
        return self._botocore

    async def obstore(self) -> Any:
        """obstore's client. Built without botocore when the keys and the region are given
        (meta://, or AWS keys in the environment): starting botocore would be most of what a
        no-op scheduled run takes."""
        if self._renewals.wanted:
            await self._renew()
        if self._obstore is None:
            async with self._lock:
                if self._obstore is None and self._region and await self._given_keys():
                    self._obstore = self._make_obstore()
            if self._obstore is None:
                await self.botocore()
        return self._obstore

    @property
    def mutual_tls(self) -> bool:
        """Does every request present a client certificate? Then obstore sends none."""
        return self._client_cert is not None

    @property
    def botocore_only(self) -> bool:
        """Does botocore send every request? With a client certificate (obstore cannot present
        one), and in a process forked after obstore was used (its runtime did not survive)."""
        return self.mutual_tls or obstore_forked()

    async def probe(self) -> Any:
        """The obstore client a check asks with: tried only ``preflight_attempts`` times, so a
        wrong address fails in seconds, unless checks retry as requests do (then the run's).
        With a client certificate, botocore's client, on the same terms: a refused handshake
        is then a one-line error in seconds, never the CRT's retries of it."""
        if self.botocore_only:
            return await self._check_client()
        fast = await self.obstore()
        if self.retry.checks_retry_as_requests:
            return fast
        if self._preflight is None:
            self._preflight = self._make_obstore(preflight=True)
        return self._preflight

    async def _check_client(self) -> Any:
        """botocore's client for a check, with a client certificate (see ``probe``)."""
        client = await self.botocore()
        if self.retry.checks_retry_as_requests:
            return client
        if self._check_botocore is None:
            async with self._lock:
                if self._check_botocore is None:
                    retry = dataclasses.replace(self.retry,
                                                sdk_attempts=self.retry.preflight_attempts)
                    settings = dataclasses.replace(self._settings(self._region or ""),
                                                   retry=retry)
                    cm, client, _, _ = await open_botocore(settings, self._keys, self._profile)
                    self._check_botocore_cm, self._check_botocore = cm, client
        return self._check_botocore

    async def _given_keys(self) -> Keys | None:
        """Keys known without botocore's chain (None: the chain's). Called under the lock, so
        a credential process runs once."""
        if self._keys is None:
            if self._source.process:
                self._keys = await process_keys(self._source.process)
            elif self._source.fixed is not None:
                self._keys = Keys(self._source.fixed)
        return self._keys

    async def _renew(self) -> None:
        """The renewal a refusal asked for, and new obstore clients (new credential caches)
        for the requests after it."""
        if await self._renewals.renew(self._keys):
            self._obstore = None if self.botocore_only else self._make_obstore()
            self._preflight = None
            log.debug("%s: keys renewed after a refusal", self.url)

    def _settings(self, region: str) -> ClientSettings:
        return ClientSettings(self.bucket, self.endpoint_url, region, self._path_style,
                              self._max_connections, self.retry, self._ca_bundle, self._ca_pem,
                              self._client_cert)

    def _make_obstore(self, *, preflight: bool = False) -> Any:
        return make_obstore(self._settings(self._region or "us-east-1"), self._keys or Keys(),
                            preflight=preflight)

    async def aclose(self) -> None:
        if self._crt is not None:
            self._crt.close()
        if self._wire is not None:
            self._wire.close()
        if self._botocore_cm is not None:
            cm, self._botocore_cm, self._botocore = self._botocore_cm, None, None
            await cm.__aexit__(None, None, None)
        if self._check_botocore_cm is not None:
            cm, self._check_botocore_cm, self._check_botocore = (self._check_botocore_cm, None,
                                                                 None)
            await cm.__aexit__(None, None, None)

    # -- errors ---------------------------------------------------------------------------------

    @contextlib.contextmanager
    def translating(self, what: str) -> Iterator[None]:
        """SDK errors raised inside become mcsync errors about ``what`` (an object's URL, or
        the store's); a refusal of keys may ask for a renewal."""
        generation = self._renewals.generation  # the keys the requests inside are sent with
        try:
            yield
        except Exception as exc:
            translated = translate(exc, what, self.bucket)
            if translated is None or translated is exc:
                raise
            raise self._renewals.refused(self._keys, translated, exc, generation) from exc

    # -- the rule: which client sends which request ---------------------------------------------

    async def either(self, what: str, fast: Callable[[Any], Awaitable[T]],
                     slow: Callable[[Any], Awaitable[T]], *, check: bool = False) -> T:
        """``fast(obstore client)`` (the check's with ``check``), or ``slow(botocore client)``
        for a key obstore cannot spell, and for every key with a client certificate; errors
        translated."""
        if self.botocore_only:
            client = await (self.probe() if check else self.botocore())
            with self.translating(what):
                return await slow(client)
        client = await (self.probe() if check else self.obstore())
        with self.translating(what):
            try:
                return await fast(client)
            except _UNSPELLABLE:
                return await slow(await self.botocore())

    async def list_flat(self, prefix: str, *, after: str = "",
                        check: bool = False) -> AsyncGenerator[dict[str, Any]]:
        """Every object under ``prefix`` from the first key after ``after``, one at a time
        (``list_pages``)."""
        async with contextlib.aclosing(self.list_pages(prefix, after=after, check=check)) as it:
            async for page in it:
                for c in page:
                    yield c

    async def list_pages(self, prefix: str, *, after: str = "", check: bool = False,
                         page: int = 1000) -> AsyncGenerator[list[dict[str, Any]]]:
        """Every object under ``prefix`` (a full key prefix) from the first key after
        ``after`` (a full key; "": from the start), as ``list_objects_v2``'s ``Contents``, a
        page at a time. Pages come through obstore (the check's client with ``check``), which
        parses them in Rust; obstore refuses a whole page that holds a key it cannot
        represent: the listing then goes on through botocore after the last key already
        yielded, so no key is lost or repeated. A prefix obstore cannot spell ("a//", "./")
        goes by botocore; with a client certificate, botocore lists from the start (the
        check's client with ``check``). ``page``: keys a page (fewer: tests).

        object_store drops a key's trailing "/" (a console's "folder", ``b/``, lists as
        ``b``), and an empty object is all such a key can be told by: from the first page
        that holds an empty object on, the listing goes on through the S3 API (the CRT where
        the store has one), whose keys are the keys."""
        last = after
        # obstore's prefix is a path prefix: "run" lists run/..., as our "run/" does; "a//"
        # would become "a" and list a/... too
        by_path = prefix == "" or (prefix.endswith("/") and "//" not in prefix)
        if self.botocore_only or not by_path:
            botocore = await (self.probe() if check else self.botocore())
        else:
            client = await (self.probe() if check else self.obstore())
        with self.translating(self.url):
            if not self.botocore_only and by_path:
                try:
                    stream = obstore.list(client, prefix.rstrip("/") or None,
                                          offset=after or None, chunk_size=page)
                    async for chunk in stream:
                        if any(meta["size"] == 0 for meta in chunk):
                            log.debug("%s: an empty object, maybe a key ending in '/': "
                                      "listing on with the S3 API", self.url)
                            break
                        got: list[dict[str, Any]] = [
                            {"Key": meta["path"], "Size": meta["size"], "ETag": meta["e_tag"],
                             "LastModified": meta["last_modified"]} for meta in chunk]
                        if got:
                            last = got[-1]["Key"]
                            yield got
                    else:
                        return
                except _UNSPELLABLE:
                    log.debug("%s: a key obstore cannot represent; listing on with the S3 API",
                              self.url)
                crt = await self.crt_client()
                if crt is not None:
                    async for found in self._crt_pages(crt, prefix, last or prefix, page):
                        yield found
                    return
                botocore = await self.botocore()
            paginator = botocore.get_paginator("list_objects_v2")
            async for found in paginator.paginate(Bucket=self.bucket, Prefix=prefix,
                                                  StartAfter=last or prefix,
                                                  PaginationConfig={"PageSize": page}):
                if found.get("Contents"):
                    yield found["Contents"]

    async def _crt_pages(self, crt: CrtClient, prefix: str, after: str,
                         page: int) -> AsyncGenerator[list[dict[str, Any]]]:
        token = ""
        while True:
            with self.translating(self.url):
                found = await crt.list_level(self.bucket, prefix, after=after, token=token,
                                             page=page, what=self.url, delimiter="")
            if found.get("Contents"):
                yield found["Contents"]
            token = found["NextContinuationToken"]
            if not (found["IsTruncated"] and token):
                return

    async def level_pages(self, prefix: str, *, after: str = "",
                          page: int = 1000) -> AsyncGenerator[dict[str, Any]]:
        """The pages of one level under ``prefix``, listed with the delimiter "/" from the
        first name after ``after``: the CRT's where it has one (importing botocore and making
        its client costs a listing more CPU than the level's pages), else botocore's (obstore's
        listing with a delimiter hands out no pages)."""
        crt = await self.crt_client()
        if crt is not None:
            token = ""
            while True:
                with self.translating(self.url):
                    found = await crt.list_level(self.bucket, prefix, after=after, token=token,
                                                 page=page, what=self.url)
                yield found
                token = found["NextContinuationToken"]
                if not (found["IsTruncated"] and token):
                    return
        paginator = (await self.botocore()).get_paginator("list_objects_v2")
        start = {"StartAfter": after} if after else {}
        with self.translating(self.url):
            async for found in paginator.paginate(Bucket=self.bucket, Prefix=prefix,
                                                  Delimiter="/", **start,
                                                  PaginationConfig={"PageSize": page}):
                yield found

    async def crt_client(self, *, body: bool = False) -> CrtClient | None:
        """The CRT's client for this store's requests (with a ``body``: requests that send
        one), or None where they go through botocore: no endpoint given (AWS's endpoint rules
        are botocore's), anonymous access, or, for a body, a payload that must be SHA-256-
        signed (plain HTTP across a network: the CRT's S3 signer sends UNSIGNED-PAYLOAD)."""
        # the keys known (and a renewal a refusal asked for, made)
        await (self.botocore() if self.botocore_only else self.obstore())
        if not (self._use_crt and self.endpoint_url and self._keys
                and not self._keys.anonymous):
            return None
        if self._crt is None:
            settings = self._settings(self._region or "us-east-1")
            self._crt = CrtClient(settings, self._keys)
            self._crt_sends_bodies = not settings.sign_payload
        return self._crt if self._crt_sends_bodies or not body else None

    async def wire(self, size: int | None = None) -> WireClient | None:
        """mcsync's own connections, for the relay's bodies (a GET into a buffer, a PUT or an
        UploadPart from one) of ``size`` bytes or more than ``WIRE_FROM`` (None: any), where
        the CRT would send bodies: None elsewhere."""
        if (size is not None and size < WIRE_FROM) or await self.crt_client(body=True) is None:
            return None
        if self._wire is None:
            assert self._keys is not None  # crt_client resolved them
            self._wire = WireClient(self._settings(self._region or "us-east-1"), self._keys)
        return self._wire

    async def sender(self, *, body: bool = False) -> MultipartTransport:
        """The transport that sends a multipart request or a copy: mcsync's own connections
        where the CRT would send bodies; else, for a request with no ``body``, the CRT."""
        client: S3Requests | None = await self.wire()
        if client is None and not body:
            client = await self.crt_client()
        if client is not None:
            return RequestsTransport(client, self.body_checksums)
        return BotocoreTransport(await self.botocore(), self.body_checksums)

    def multipart(self) -> MultipartTransport:
        """The multipart requests, each sent by the client the rule gives it, errors
        translated: what an ``S3Upload`` holds."""
        return _Routed(self)


class _Routed:
    """``MultipartTransport`` whose every request goes by ``S3Clients.sender``, translated."""

    def __init__(self, clients: S3Clients) -> None:
        self._clients = clients

    async def create(self, bucket: str, key: str, what: str) -> str:
        sender = await self._clients.sender()
        with self._clients.translating(what):
            return await sender.create(bucket, key, what)

    async def upload_part(self, ids: UploadIds, number: int, data: Buffer, *,
                          crc32c: int | None = None) -> str | None:
        sender = await self._clients.sender(body=True)
        with self._clients.translating(ids.what):
            return await sender.upload_part(ids, number, data, crc32c=crc32c)

    async def copy_part(self, ids: UploadIds, number: int, source: S3CopySource,
                        rng: ByteRange) -> str | None:
        sender = await self._clients.sender()
        with self._clients.translating(ids.what):
            return await sender.copy_part(ids, number, source, rng)

    async def list_parts(self, ids: UploadIds) -> list[PartRef]:
        sender = await self._clients.sender()
        with self._clients.translating(ids.what):
            return await sender.list_parts(ids)

    async def complete(self, ids: UploadIds, parts: Sequence[PartRef]) -> str | None:
        sender = await self._clients.sender()
        with self._clients.translating(ids.what):
            return await sender.complete(ids, parts)

    async def abort(self, ids: UploadIds) -> None:
        sender = await self._clients.sender()
        with self._clients.translating(ids.what):
            await sender.abort(ids)

    async def copy_object(self, source: S3CopySource, bucket: str, key: str,
                          what: str) -> str | None:
        sender = await self._clients.sender()
        with self._clients.translating(what):
            return await sender.copy_object(source, bucket, key, what)
