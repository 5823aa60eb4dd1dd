"""Shared fixtures.

Servers (session-scoped, started on first use, stopped at the end of the run):

* ``moto``      -- moto's S3 server; accepts any keys, checks no signature.
* ``seaweed``   -- a SeaweedFS server; checks signatures (keys ``mcsync-test``).
* ``seaweed_b`` -- a second, independent SeaweedFS server with other keys, for cross-endpoint
  tests (its keys are refused by ``seaweed`` and the other way round).
* ``s3``        -- parametrized over ``moto`` and ``seaweed``: a test that takes it runs on both.
* ``seaweed_proxy``, ``moto_proxy`` -- a ``testbed.faultproxy.FaultProxy`` (per test, no
  rules yet, seed 0) in front of that server; ``proxy.endpoint`` is an ``S3Endpoint`` at the
  proxy with the server's keys, so ``meta_env()``, ``aws_env()`` and ``client()`` go through it.
  Create buckets on the server itself (``bucket_factory(seaweed)``), not through the proxy.
* ``mtls_pki``  -- a throwaway CA (``testbed.tls.Authority``), a client certificate it issued
  (``client``) and one of another CA (``stranger``). ``seaweed_mtls``: a
  ``testbed.tlsproxy.TlsProxy`` serving ``seaweed`` over https that requires a certificate of
  that CA; its ``endpoint`` (with the client certificate) goes through it. Per test, with
  fresh records of its handshakes: ``mtls_proxy`` (tests/stores/s3/conftest.py).
* ``weed_mounted`` -- a fresh bucket on ``seaweed`` mounted as a directory with ``weed mount``
  (FUSE; ``testbed.fuse``), unmounted and its ``weed mount`` stopped by PID after the test:
  a ``MountedBucket`` (``endpoint``, ``bucket``, ``root``). Skipped where FUSE cannot be
  mounted (no ``/dev/fuse``, not root), saying why.
* ``gcs``       -- the GCS emulator (``testbed.gcs``); its URL. ``gcs_bucket``: a fresh,
  uniquely named bucket in it. ``gcs_fake_server`` -- fake-gcs-server over https
  (``testbed.gcs.fake_gcs_server``): a ``GCSServer``, its URL and the CA to trust; skipped
  with the reason if its binary is not installed. (tests/stores/gcs/conftest.py keeps the
  gs:// tests' own fixtures.)

Buckets: ``bucket_factory(endpoint)`` creates a fresh, uniquely named bucket on an endpoint and
deletes it (with its contents) after the test. Always use it rather than fixed names: the
servers live for the whole session, and SeaweedFS gives each bucket its own volumes, of which
there is a fixed number.

Async tests: an ``async def`` test runs in a fresh event loop of its own, the one mcsync runs in
(``mcsync.run_blocking``: uvloop), by ``pytest_pyfunc_call`` below. A fixture value with an
``aclose_after_test()`` coroutine method is closed in that loop once the test ends (the
conformance suite's backends close the stores they opened for the test that way).

What a machine must have: ``MCSYNC_TEST_REQUIRE=fuse,ray,promtool`` (``.ci/run`` sets it)
makes a test that needs one of those and cannot get it fail instead of skip
(``tests/require.py``: ``unavailable(need, reason)``).

Environment: every test runs without the developer's ``AWS_*`` / ``MCSYNC_META_*`` variables
and AWS config files, with ``AWS_EC2_METADATA_DISABLED=true``. A test that wants an endpoint in
the environment sets it with ``monkeypatch.setenv`` from ``endpoint.aws_env()`` /
``endpoint.meta_env()``.
"""

from __future__ import annotations

import contextlib
import inspect
import os
import re
import shutil
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

import mcsync
from testbed.azurite import AzuriteEndpoint
from testbed.azurite import azurite as run_azurite
from testbed.faultproxy import FaultProxy
from testbed.fuse import fuse_unavailable, unmount_dead, weed_mount
from testbed.gcs import GCSServer
from testbed.servers import S3Endpoint, moto_server, seaweedfs
from testbed.tls import Authority, KeyPair
from testbed.tlsproxy import TlsProxy

from .require import required, unavailable


def pytest_configure(config: pytest.Config) -> None:
    required()  # MCSYNC_TEST_REQUIRE names only what tests/require.py knows


# --------------------------------------------------------------------------------------------
# Async tests


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    """Run an ``async def`` test in its own event loop, then close (in that loop) every fixture
    value that has an ``aclose_after_test`` coroutine method."""
    func = pyfuncitem.obj
    if not inspect.iscoroutinefunction(func):
        return None
    kwargs = {name: pyfuncitem.funcargs[name] for name in pyfuncitem._fixtureinfo.argnames}

    async def run() -> None:
        try:
            await func(**kwargs)
        finally:
            for value in pyfuncitem.funcargs.values():
                close = getattr(value, "aclose_after_test", None)
                if close is not None and inspect.iscoroutinefunction(close):
                    await close()

    mcsync.run_blocking(run())
    return True


# --------------------------------------------------------------------------------------------
# Environment isolation

_SCRUBBED_PREFIXES = ("AWS_", "MCSYNC_META_", "AZURE_")  # AZURE_: a connection string wins


@pytest.fixture(autouse=True)
def _isolated_env(monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory):
    for name in list(os.environ):
        if name.startswith(_SCRUBBED_PREFIXES):
            monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    # Files that do not exist: no profile, key or region of the developer's ~/.aws applies.
    missing = tmp_path_factory.getbasetemp() / "no-aws-config"
    monkeypatch.setenv("AWS_CONFIG_FILE", str(missing / "config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(missing / "credentials"))
    # Each test gets its own manifests and lock files, never the developer's.
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path_factory.mktemp("state")))


# --------------------------------------------------------------------------------------------
# Servers


@pytest.fixture(scope="session")
def moto(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Endpoint]:
    with moto_server(log_path=tmp_path_factory.mktemp("moto") / "moto.log") as endpoint:
        yield endpoint


@pytest.fixture(scope="session")
def seaweed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Endpoint]:
    with seaweedfs(tmp_path_factory.mktemp("seaweed")) as endpoint:
        yield endpoint


@pytest.fixture(scope="session")
def seaweed_b(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Endpoint]:
    with seaweedfs(
        tmp_path_factory.mktemp("seaweed-b"),
        access_key="mcsync-test-b",
        secret_key="mcsync-test-b-secret",
    ) as endpoint:
        yield endpoint


@dataclass(frozen=True)
class MtlsFiles:
    ca: Authority
    client: KeyPair
    stranger: KeyPair  # issued by another CA: the proxy refuses it


@pytest.fixture(scope="session")
def mtls_pki(tmp_path_factory: pytest.TempPathFactory) -> MtlsFiles:
    ca = Authority(tmp_path_factory.mktemp("mtls-ca"))
    other = Authority(tmp_path_factory.mktemp("mtls-other-ca"), name="another CA")
    return MtlsFiles(ca, ca.client(), other.client("stranger"))


@pytest.fixture(scope="session")
def seaweed_mtls(seaweed: S3Endpoint, mtls_pki: MtlsFiles) -> Iterator[TlsProxy]:
    server = mtls_pki.ca.server("session-")
    with TlsProxy(seaweed, server=server, ca=mtls_pki.ca.ca).running() as proxy:
        yield proxy


@pytest.fixture(scope="session")
def gcs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    from testbed.gcs import gcs_emulator

    with gcs_emulator(tmp_path_factory.mktemp("gcs")) as url:
        yield url


@pytest.fixture(scope="session")
def gcs_fake_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GCSServer]:
    from testbed.gcs import FakeGCSServerMissing, fake_gcs_server

    with contextlib.ExitStack() as stack:
        try:
            server = stack.enter_context(
                fake_gcs_server(tmp_path_factory.mktemp("fake-gcs-server")))
        except FakeGCSServerMissing as exc:  # only a missing binary: a failed start fails
            pytest.skip(str(exc))
        yield server


@pytest.fixture(scope="session")
def azurite(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AzuriteEndpoint]:
    with run_azurite(tmp_path_factory.mktemp("azurite")) as endpoint:
        yield endpoint


@pytest.fixture
def gcs_bucket(gcs: str) -> str:
    from testbed.gcs import create_bucket

    name = f"gcs-{uuid.uuid4().hex[:12]}"
    create_bucket(gcs, name)
    return name


@pytest.fixture
def shm_dir() -> Iterator[Path]:
    """A fresh directory on tmpfs (/dev/shm), removed after the test: file work there costs
    no disk, so a run between two trees in it is bound by this client."""
    shm = Path("/dev/shm")
    if not (shm.is_dir() and os.access(shm, os.W_OK)):
        pytest.skip("no writable /dev/shm (tmpfs) on this machine")
    work = shm / f"mcsync-test-{uuid.uuid4().hex[:12]}"
    work.mkdir()
    try:
        yield work
    finally:
        shutil.rmtree(work, ignore_errors=True)


@pytest.fixture
def seaweed_proxy(seaweed: S3Endpoint) -> Iterator[FaultProxy]:
    with FaultProxy(seaweed).running() as proxy:
        yield proxy


@pytest.fixture
def moto_proxy(moto: S3Endpoint) -> Iterator[FaultProxy]:
    with FaultProxy(moto).running() as proxy:
        yield proxy


@pytest.fixture(params=["moto", "seaweed"])
def s3(request: pytest.FixtureRequest) -> S3Endpoint:
    """Each S3-compatible server in turn (moto, then SeaweedFS)."""
    return request.getfixturevalue(request.param)


# --------------------------------------------------------------------------------------------
# Buckets

BucketFactory = Callable[[S3Endpoint], str]


def _bucket_name(test_name: str) -> str:
    # S3 rules: 3-63 characters of a-z, 0-9 and '-', starting and ending alphanumeric.
    stem = re.sub(r"[^a-z0-9]+", "-", test_name.lower()).strip("-")[:40].strip("-")
    return f"{stem or 'bucket'}-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def bucket_factory(request: pytest.FixtureRequest) -> Iterator[BucketFactory]:
    """``make(endpoint) -> name``: a new empty bucket on ``endpoint``, deleted after the test."""
    created: list[tuple[S3Endpoint, str]] = []

    def make(endpoint: S3Endpoint) -> str:
        name = _bucket_name(request.node.originalname)
        endpoint.create_bucket(name)
        created.append((endpoint, name))
        return name

    yield make

    errors = []
    for endpoint, name in reversed(created):
        try:
            endpoint.delete_bucket(name)
        except Exception as exc:
            errors.append(f"{name} at {endpoint.url}: {exc}")
    if errors:  # reported as an error at teardown: leaked buckets exhaust SeaweedFS's volumes
        raise RuntimeError("bucket clean-up failed:\n  " + "\n  ".join(errors))


# --------------------------------------------------------------------------------------------
# A bucket mounted as a directory (FUSE)


@dataclass(frozen=True)
class MountedBucket:
    """A bucket of ``endpoint`` mounted at ``root``: the same bytes as files and as objects."""

    endpoint: S3Endpoint
    bucket: str
    root: Path


@pytest.fixture
def weed_mounted(seaweed: S3Endpoint, bucket_factory: BucketFactory,
                 tmp_path_factory: pytest.TempPathFactory) -> Iterator[MountedBucket]:
    reason = fuse_unavailable()
    if reason is not None:
        unavailable("fuse", f"no FUSE mount here: {reason}")
    unmount_dead()  # a killed earlier session's, which no call can use any more
    bucket = bucket_factory(seaweed)  # deleted after the mount is down (fixture order)
    # mounted in a temporary directory of its own, out of pytest's tree (testbed.fuse)
    with weed_mount(seaweed, bucket, workdir=tmp_path_factory.mktemp("weed-mount")) as root:
        yield MountedBucket(seaweed, bucket, root)
