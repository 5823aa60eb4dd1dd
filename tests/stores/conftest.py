"""The stores under the conformance suite, one ``Backend`` each.

``backend`` is parametrized over every store mcsync has; a test that takes it runs once per
store. A backend makes fresh, empty roots of its store for the running test (``new_root``), puts
objects there without going through the store (``seed``: how a read-only store gets content),
and says what only it can know (which keys it must refuse, which cases its server is known to
get wrong). Adding a store to the suite is writing one more ``Backend`` and one more branch of
the ``backend`` fixture.

Tests are ``async def``: the hook of ``tests/conftest.py`` runs each in a fresh event loop (the
one mcsync runs in) and then, in that loop, the backend's ``aclose_after_test`` closes every
store it opened.

Roots: each test gets an area of its own — a unique prefix in a bucket kept for the session
(S3, GCS), a temporary directory, or a fresh MemoryEndpoint — and every root it asks for is a
directory in that area, so roots of one test are prefixes of one bucket (on S3 they can copy
server-side, as two prefixes of one endpoint do).
"""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from mcsync.errors import NotFound, Permanent, Transient
from mcsync.observe.metrics import Metrics
from mcsync.retry import RetryPolicy
from mcsync.stores.azure import AzureStore
from mcsync.stores.base import (
    Composer,
    FileTarget,
    LevelLister,
    LocalTree,
    RangeStreamer,
    ReadsInto,
    ReadStore,
    ScratchSpace,
    ServerSideCopier,
    Store,
    TempFileSweeper,
)
from mcsync.stores.gcs import GCSStore
from mcsync.stores.local import LocalStore
from mcsync.stores.memory import MemoryEndpoint, MemoryStore
from mcsync.stores.resilience import Pacing, resilient
from mcsync.stores.s3 import S3Credentials, S3Store
from mcsync.stores.wrap import inner_of
from mcsync.testing.faults import Faults, faulty
from testbed.gcs import GCSServer
from testbed.servers import S3Endpoint

# On loopback nothing is worth retrying for long: a server's error answer should show at once.
_RETRY = RetryPolicy(max_attempts=2, init_backoff_s=0.0, max_backoff_s=0.0, deadline_s=30.0)


# Every optional side and ability of ``stores.base``: a backend declares which of these its
# store offers, and the suite fails (never skips) where a declared one is missing.
ABILITIES: tuple[type, ...] = (Store, RangeStreamer, ReadsInto, ServerSideCopier, Composer,
                               ScratchSpace, FileTarget, LocalTree, TempFileSweeper,
                               LevelLister)
OBJECT_STORE = frozenset({Store, RangeStreamer, ReadsInto, ServerSideCopier, Composer,
                          ScratchSpace, LevelLister})

# The backend each store of a running test was made by (see ``need``).
_MADE_BY: dict[int, Backend] = {}


def declared(store: Any) -> frozenset[type]:
    """The abilities the backend that made ``store`` declares for it."""
    return _MADE_BY[id(store)].abilities


class Backend:
    """One store under test. Subclasses fill in the four ``_``-methods and the facts."""

    name = ""
    # What the store offers: the suite fails when it offers less or more.
    abilities: frozenset[type] = frozenset()
    # Test name → how this backend's server gets that case wrong: the test runs as a strict
    # xfail for it (it must fail so, and the day it passes the mark must go).
    known_failures: Mapping[str, KnownFailure] = {}

    def __init__(self) -> None:
        self._opened: list[ReadStore] = []
        self._roots = 0

    def new_root(self, name: str | None = None) -> Any:
        """A fresh, empty root; ``name`` (one path component) is its directory in the area,
        so roots named "r" and "r-x" are siblings whose names share a beginning."""
        self._roots += 1
        return self._keep(self._root(name or f"root{self._roots}"))

    def top_root(self) -> Any:
        """A fresh root at the very top of its bucket (an empty prefix)."""
        return self._keep(self._top())

    def reopen(self, store: Any) -> Any:
        """Another store object on the same root (what a later run opens)."""
        return self._keep(self._reopen(store))

    def missing_root(self) -> Any:
        """A root that does not exist (a missing bucket or directory)."""
        return self._keep(self._missing())

    async def seed(self, store: Any, key: str, data: bytes) -> None:
        """Create or replace ``key`` under ``store``'s root behind the store's back."""
        raise NotImplementedError

    def refused_keys(self, store: Any) -> list[str]:
        """Keys ``validate_key`` must refuse here."""
        return [""]

    def accepted_keys(self, store: Any) -> list[str]:
        """Unusual keys this store must take, write and read back: odd characters, and a key
        as long as S3 allows (1024 bytes with the prefix, in components of 200 bytes)."""
        return ["sp ace", "plus+sign", "pct%20%2F", "hash#q?&=", "ünï/cödé", "\U0001f600",
                long_key(1024 - len(getattr(store, "prefix", "").encode()))]

    def path_like_keys(self, store: Any) -> list[str]:
        """Keys a path cannot hold but an object store can ("a//b", ".." components): this
        store must write and read them back, and list them as they are."""
        return []

    async def aclose_after_test(self) -> None:
        """Close the stores this test opened, in the test's own loop (see tests/conftest.py)."""
        opened, self._opened = self._opened, []
        for store in opened:
            _MADE_BY.pop(id(store), None)
            await store.aclose()

    def _keep(self, store: ReadStore) -> Any:
        self._opened.append(store)
        _MADE_BY[id(store)] = self
        return store

    def _root(self, name: str) -> ReadStore:
        raise NotImplementedError

    def _top(self) -> ReadStore:
        raise NotImplementedError

    def _reopen(self, store: Any) -> ReadStore:
        raise NotImplementedError

    def _missing(self) -> ReadStore:
        raise NotImplementedError


class LocalBackend(Backend):
    name = "local"
    abilities = frozenset({Store, ReadsInto, Composer, FileTarget, LocalTree, TempFileSweeper,
                           LevelLister})

    def __init__(self, tmp: Path) -> None:
        super().__init__()
        self.tmp = tmp

    def _root(self, name: str) -> LocalStore:
        path = self.tmp / "area" / name
        path.mkdir(parents=True)
        return LocalStore(path)

    def _top(self) -> LocalStore:
        path = self.tmp / f"top{self._roots}"
        path.mkdir()
        return LocalStore(path)

    def _reopen(self, store: LocalStore) -> LocalStore:
        return LocalStore(store.root)

    def _missing(self) -> LocalStore:
        return LocalStore(self.tmp / "missing" / "dir")

    async def seed(self, store: LocalStore, key: str, data: bytes) -> None:
        path = store.root.joinpath(*key.split("/"))
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)

    def refused_keys(self, store: LocalStore) -> list[str]:
        return [*super().refused_keys(store), "a\x00b", "..", "../x", "a/../../x",
                "/etc/passwd", "a//b", "a/", "./a", "a/./b", "a/..", ".a.mcsync-tmp-x"]


class S3Backend(Backend):
    abilities = OBJECT_STORE

    def __init__(self, name: str, endpoint: S3Endpoint, bucket: str,
                 new_bucket: Callable[[], str],
                 known_failures: Mapping[str, KnownFailure], *, crt: bool = True,
                 client_cert: tuple[str, str] | None = None) -> None:
        super().__init__()
        self.name = name
        self.crt = crt  # False: every request the CRT may send goes by botocore
        self.endpoint = endpoint
        self.bucket = bucket
        self.area = f"t-{uuid.uuid4().hex[:10]}/"
        self._new_bucket = new_bucket
        self.known_failures = known_failures
        self._client: Any = None
        self.client_cert = client_cert  # mutual TLS: presented by every request

    def _store(self, bucket: str, prefix: str) -> S3Store:
        ep = self.endpoint
        cert, key = self.client_cert or (None, None)
        return S3Store(scheme="s3", bucket=bucket, prefix=prefix, endpoint_url=ep.url,
                       region=ep.region, credentials=S3Credentials(ep.access_key, ep.secret_key),
                       retry=_RETRY, max_connections=16, crt=self.crt, ca_bundle=ep.ca_bundle,
                       client_cert=cert, client_key=key)

    def _root(self, name: str) -> S3Store:
        return self._store(self.bucket, f"{self.area}{name}/")

    def _top(self) -> S3Store:
        return self._store(self._new_bucket(), "")

    def _reopen(self, store: S3Store) -> S3Store:
        return self._store(store.bucket, store.prefix)

    def _missing(self) -> S3Store:
        return self._store(f"missing-{uuid.uuid4().hex[:12]}", "x/")

    async def seed(self, store: S3Store, key: str, data: bytes) -> None:
        if self._client is None:
            self._client = self.endpoint.client()
        client = self._client
        await asyncio.to_thread(client.put_object, Bucket=store.bucket, Key=store.prefix + key,
                                Body=data)

    def refused_keys(self, store: S3Store) -> list[str]:
        room = 1024 - len(store.prefix.encode())
        return [*super().refused_keys(store), "k" * (room + 1), "é" * (room // 2 + 1)]

    def path_like_keys(self, store: S3Store) -> list[str]:
        return list(PATH_LIKE_KEYS)  # obstore cannot spell these: they go by the S3 API


class GCSBackend(Backend):
    """A GCS server: the emulator (``gcs``, http), or fake-gcs-server (``gcs-fake-server``,
    https with its CA given as the store's bundle). A source only, read whole or by range.
    Listings go in pages of ``GCS_PAGE_SIZE`` objects, so a server that pages (fake-gcs-server)
    is read across several pages in every listing case. Parts are read into the run's
    buffers (``ReadsInto``)."""

    abilities = frozenset({ReadsInto})

    def __init__(self, name: str, server: GCSServer, bucket: str) -> None:
        super().__init__()
        self.name = name
        self.server = server
        self.url = server.url
        self.bucket = bucket
        self.area = f"t-{uuid.uuid4().hex[:10]}/"

    def _store(self, bucket: str, prefix: str) -> GCSStore:
        ca = str(self.server.ca) if self.server.ca else None
        return GCSStore(bucket=bucket, prefix=prefix, api_root=self.url, anonymous=True,
                        retry=_RETRY, max_connections=16, page_size=GCS_PAGE_SIZE,
                        ca_bundle=ca)

    def _root(self, name: str) -> GCSStore:
        return self._store(self.bucket, f"{self.area}{name}/")

    def _top(self) -> GCSStore:
        from testbed.gcs import create_bucket

        bucket = f"top-{uuid.uuid4().hex[:12]}"
        create_bucket(self.server, bucket)
        return self._store(bucket, "")

    def _reopen(self, store: GCSStore) -> GCSStore:
        return self._store(store.bucket, store.prefix)

    def _missing(self) -> GCSStore:
        return self._store(f"missing-{uuid.uuid4().hex[:12]}", "x/")

    async def seed(self, store: GCSStore, key: str, data: bytes) -> None:
        from testbed.gcs import upload

        await asyncio.to_thread(upload, self.server, store.bucket, store.prefix + key, data)


class AzureBackend(Backend):
    name = "azure"  # a source only
    abilities = frozenset({RangeStreamer, ReadsInto})

    def __init__(self, endpoint: Any, container: str) -> None:
        super().__init__()
        self.endpoint = endpoint
        self.container = container
        self.area = f"t-{uuid.uuid4().hex[:10]}/"

    def _store(self, container: str, prefix: str) -> AzureStore:
        from testbed.azurite import ACCOUNT, KEY

        return AzureStore(container=container, prefix=prefix, endpoint=self.endpoint.url,
                          retry=_RETRY, max_connections=16,
                          config={"account_name": ACCOUNT, "account_key": KEY})

    def _root(self, name: str) -> AzureStore:
        return self._store(self.container, f"{self.area}{name}/")

    def _top(self) -> AzureStore:
        container = f"top-{uuid.uuid4().hex[:12]}"
        self.endpoint.create_container(container)
        return self._store(container, "")

    def _reopen(self, store: AzureStore) -> AzureStore:
        return self._store(store.container, store.prefix)

    def _missing(self) -> AzureStore:
        return self._store(f"missing-{uuid.uuid4().hex[:12]}", "x/")

    async def seed(self, store: AzureStore, key: str, data: bytes) -> None:
        await asyncio.to_thread(self.endpoint.upload, store.container, store.prefix + key, data)


class MemoryBackend(Backend):
    name = "memory"
    abilities = OBJECT_STORE - {ReadsInto}

    def __init__(self) -> None:
        super().__init__()
        self.endpoint = MemoryEndpoint("conformance")

    def _root(self, name: str) -> MemoryStore:
        return MemoryStore(f"area/{name}", endpoint=self.endpoint)

    def _top(self) -> MemoryStore:
        return MemoryStore(endpoint=MemoryEndpoint("top"))

    def _reopen(self, store: MemoryStore) -> MemoryStore:
        return MemoryStore(store.prefix, endpoint=store.endpoint, caps=store.caps,
                           exists=store.exists)

    def _missing(self) -> MemoryStore:
        return MemoryStore("x", endpoint=MemoryEndpoint("missing"), exists=False)

    async def seed(self, store: MemoryStore, key: str, data: bytes) -> None:
        await store.put(key, data)

    def refused_keys(self, store: MemoryStore) -> list[str]:
        room = 1024 - len(store.prefix.encode())
        return [*super().refused_keys(store), "a\x00b", "k" * (room + 1), "\udc80"]

    def path_like_keys(self, store: MemoryStore) -> list[str]:
        return list(PATH_LIKE_KEYS)


class WrappedBackend(Backend):
    """Another backend's stores, each wrapped as a run wraps them (the retry layer, metrics)
    or as a user's test does (faults): a wrapper offers exactly what it wraps and passes
    every case the same."""

    def __init__(self, inner: Backend, how: str) -> None:
        super().__init__()
        self.inner = inner
        self.name = f"{inner.name}-{how}"
        self.abilities = inner.abilities
        self.known_failures = inner.known_failures
        self._wrap = WRAPPERS[how]

    def _root(self, name: str) -> ReadStore:
        return self._wrap(self.inner._root(name))

    def _top(self) -> ReadStore:
        return self._wrap(self.inner._top())

    def _reopen(self, store: Any) -> ReadStore:
        return self._wrap(self.inner._reopen(inner_of(store)))

    def _missing(self) -> ReadStore:
        return self._wrap(self.inner._missing())

    async def seed(self, store: Any, key: str, data: bytes) -> None:
        await self.inner.seed(inner_of(store), key, data)

    def refused_keys(self, store: Any) -> list[str]:
        return self.inner.refused_keys(inner_of(store))

    def accepted_keys(self, store: Any) -> list[str]:
        return self.inner.accepted_keys(inner_of(store))

    def path_like_keys(self, store: Any) -> list[str]:
        return self.inner.path_like_keys(inner_of(store))


WRAPPERS: dict[str, Callable[[ReadStore], ReadStore]] = {
    "resilient": lambda store: resilient(store, Pacing(policy=_RETRY)),
    "metered": lambda store: Metrics().wrap(store, "target"),
    "faulty": lambda store: faulty(store, Faults()),
}


PATH_LIKE_KEYS = ("a//b", "x/../y", "a/./b", "./a", "..")
GCS_PAGE_SIZE = 7  # a listing of the suite's 25 keys takes four pages where the server pages


def long_key(size: int) -> str:
    """A key of ``size`` bytes in components of at most 200 (SeaweedFS and most filesystems
    take no longer name)."""
    parts, left = [], size
    while left > 0:
        n = min(200, left) if left != 201 else 199  # never a "/" at the end
        parts.append("k" * n)
        left -= n + 1
    return "/".join(parts)


# -- what the servers are known to get wrong --------------------------------------------------


@dataclass(frozen=True)
class KnownFailure:
    """A case a server gets wrong: the test runs as a strict xfail that must fail with
    ``raises`` (any other error is a real failure, and so is a pass)."""

    reason: str
    raises: type[BaseException]


_DID_NOT_RAISE = pytest.fail.Exception  # what pytest.raises raises when nothing was raised
_MOTO_IGNORES_COPY_IF_MATCH = KnownFailure(
    "moto 5.2 ignores x-amz-copy-source-if-match on UploadPartCopy and CopyObject (it checks "
    "only if-none-match), so a copy from a changed source succeeds; SeaweedFS and AWS answer "
    "412", _DID_NOT_RAISE)
_REPEAT_COMPLETE_SUCCEEDS = KnownFailure(
    "CompleteMultipartUpload is idempotent on this server: a repeat from another handle of the "
    "same upload answers 200 with the object the first one made, so it cannot raise NotFound "
    "(the object stays the first one; a repeat on the same handle does raise)", AssertionError)
MOTO_FAILURES = {
    "test_copy_part_from_a_changed_source_is_refused": _MOTO_IGNORES_COPY_IF_MATCH,
    "test_copy_object_from_a_changed_source_is_refused": _MOTO_IGNORES_COPY_IF_MATCH,
    "test_completing_from_a_second_handle_raises_not_found": _REPEAT_COMPLETE_SUCCEEDS,
    "test_copy_part_from_a_source_gone_since_is_refused": KnownFailure(
        "moto 5.2 answers UploadPartCopy from a deleted source with a bare 404, no NoSuchKey "
        "code (AWS and SeaweedFS send one), which cannot be told from a missing upload: "
        "raised as NotFound", NotFound),
    "test_completing_an_upload_aborted_by_id_raises_not_found": KnownFailure(
        "moto 5.2 answers CompleteMultipartUpload of an aborted upload with 500 (an internal "
        "error, raised as Transient), where AWS and SeaweedFS answer 404 NoSuchUpload",
        Transient),
}
SEAWEED_FAILURES = {
    "test_completing_from_a_second_handle_raises_not_found": _REPEAT_COMPLETE_SUCCEEDS,
    "test_path_like_keys_are_kept_as_they_are": KnownFailure(
        "SeaweedFS keeps keys as paths of its filer: it stores 'a//b' as 'a/b' and refuses a "
        "'.' or '..' component (400 InvalidRequest, raised as Permanent)", Permanent),
}


# -- fixtures -----------------------------------------------------------------------------------

# seaweed-botocore: the S3 store with its CopyObject and multipart requests sent by botocore,
# as they are to AWS (no endpoint given) and over plain HTTP across a network.
# seaweed-mtls: SeaweedFS behind a proxy that requires a client certificate (every request
# by botocore or the CRT: obstore cannot present one).
# memory-*, local-resilient: those stores wrapped as a run, metrics or a user's test wrap them.
# gcs-fake-server: fake-gcs-server over https (it pages listings, as GCS does).
BACKENDS = ["local", "moto", "seaweed", "seaweed-botocore", "seaweed-mtls", "gcs",
            "gcs-fake-server", "azure", "memory", "memory-resilient", "memory-metered",
            "memory-faulty", "local-resilient"]


def _session_bucket(endpoint: S3Endpoint) -> Iterator[str]:
    name = f"conformance-{uuid.uuid4().hex[:10]}"
    endpoint.create_bucket(name)
    yield name
    endpoint.delete_bucket(name)


@pytest.fixture(scope="session")
def moto_bucket(moto: S3Endpoint) -> Iterator[str]:
    yield from _session_bucket(moto)


@pytest.fixture(scope="session")
def seaweed_bucket(seaweed: S3Endpoint) -> Iterator[str]:
    yield from _session_bucket(seaweed)


def _gcs_session_bucket(server: GCSServer | str) -> str:
    from testbed.gcs import create_bucket

    name = f"conformance-{uuid.uuid4().hex[:10]}"
    create_bucket(server, name)
    return name


@pytest.fixture(scope="session")
def gcs_session_bucket(gcs: str) -> str:
    return _gcs_session_bucket(gcs)


@pytest.fixture(scope="session")
def gcs_fake_server_session_bucket(gcs_fake_server: GCSServer) -> str:
    return _gcs_session_bucket(gcs_fake_server)


@pytest.fixture(scope="session")
def azure_session_container(azurite: Any) -> str:
    name = f"conformance-{uuid.uuid4().hex[:10]}"
    azurite.create_container(name)
    return name


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    """Each store in turn. Servers start on first use, so ``-k memory`` starts none."""
    kind = request.param
    if "-" in kind and kind.split("-", 1)[1] in WRAPPERS:
        inner, how = kind.split("-", 1)
        return WrappedBackend(LocalBackend(tmp_path) if inner == "local" else MemoryBackend(),
                              how)
    if kind == "local":
        return LocalBackend(tmp_path)
    if kind in ("moto", "seaweed", "seaweed-botocore"):
        server = kind.removesuffix("-botocore")
        endpoint: S3Endpoint = request.getfixturevalue(server)
        bucket: str = request.getfixturevalue(f"{server}_bucket")
        factory = request.getfixturevalue("bucket_factory")
        failures = MOTO_FAILURES if server == "moto" else SEAWEED_FAILURES
        return S3Backend(kind, endpoint, bucket, lambda: factory(endpoint), failures,
                         crt=not kind.endswith("-botocore"))
    if kind == "seaweed-mtls":
        seaweed: S3Endpoint = request.getfixturevalue("seaweed")
        pki = request.getfixturevalue("mtls_pki")
        pair = (str(pki.client.cert), str(pki.client.key))
        proxied = dataclasses.replace(request.getfixturevalue("seaweed_mtls").endpoint,
                                      client_cert=pair)
        factory = request.getfixturevalue("bucket_factory")
        return S3Backend(kind, proxied, request.getfixturevalue("seaweed_bucket"),
                         lambda: factory(seaweed), SEAWEED_FAILURES, client_cert=pair)
    if kind == "gcs":  # the emulator, anonymous: no credential of the developer's is read
        return GCSBackend(kind, GCSServer(request.getfixturevalue("gcs"), "gcp-storage-emulator"),
                          request.getfixturevalue("gcs_session_bucket"))
    if kind == "gcs-fake-server":  # anonymous too; its CA is the store's bundle
        return GCSBackend(kind, request.getfixturevalue("gcs_fake_server"),
                          request.getfixturevalue("gcs_fake_server_session_bucket"))
    if kind == "azure":  # Azurite's published development account
        return AzureBackend(request.getfixturevalue("azurite"),
                            request.getfixturevalue("azure_session_container"))
    return MemoryBackend()


@pytest.fixture(autouse=True)
def _known_failures(request: pytest.FixtureRequest) -> None:
    if "backend" not in request.fixturenames:
        return
    backend: Backend = request.getfixturevalue("backend")
    known = backend.known_failures.get(request.node.originalname)
    if known:
        request.applymarker(pytest.mark.xfail(strict=True, raises=known.raises,
                                              reason=f"{backend.name}: {known.reason}"))


@pytest.fixture
def store(backend: Backend) -> Any:
    """A fresh, empty root of the backend's store."""
    return backend.new_root()
