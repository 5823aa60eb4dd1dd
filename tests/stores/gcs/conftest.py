"""Fixtures of the gs:// tests.

* ``gcs_server`` (session), parametrized: each GCS server in turn, as a ``testbed.gcs.GCSServer``
  -- ``emulator`` (gcp-storage-emulator over http, from ``tests/conftest.py``'s ``gcs``) and
  ``fake-gcs-server`` (over https with a CA of its own, ``gcs_fake_server``). A test that takes
  it, or ``gcs_env`` / ``gcs_bucket``, runs once against each.
* ``gcs_env``: ``STORAGE_EMULATOR_HOST`` (and, over https, the CA bundle variable) set to that
  server, by monkeypatch; the server itself.
* ``gcs_bucket``: a fresh bucket in that server.
* ``fake_gcs``: a FakeGCS (``fake.py``) served on 127.0.0.1 for this test, for what neither
  server can show (injected errors, authentication).

Every test runs without the developer's Google credentials: ``GOOGLE_APPLICATION_CREDENTIALS``,
``STORAGE_EMULATOR_HOST`` and the CA bundle variables are removed and gcloud's configuration
directory (``CLOUDSDK_CONFIG``) is an empty one, so nothing reaches a real credential or endpoint.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from mcsync.stores.gcs import CA_BUNDLE_VARIABLES
from testbed.gcs import GCSServer, create_bucket

from .fake import FakeGCS, FakeServer

GCS_SERVERS = ["emulator", "fake-gcs-server"]


@pytest.fixture(autouse=True)
def _no_google_env(monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory):
    for name in ("GOOGLE_APPLICATION_CREDENTIALS", "STORAGE_EMULATOR_HOST", "GCE_METADATA_HOST",
                 "GOOGLE_CLOUD_PROJECT", *CA_BUNDLE_VARIABLES):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path_factory.mktemp("gcloud-empty")))


@pytest.fixture(scope="session", params=GCS_SERVERS)
def gcs_server(request: pytest.FixtureRequest) -> GCSServer:
    if request.param == "emulator":
        return GCSServer(request.getfixturevalue("gcs"), "gcp-storage-emulator")
    server: GCSServer = request.getfixturevalue("gcs_fake_server")
    return server


@pytest.fixture
def gcs_env(gcs_server: GCSServer, monkeypatch: pytest.MonkeyPatch) -> GCSServer:
    for name, value in gcs_server.env().items():
        monkeypatch.setenv(name, value)
    return gcs_server


@pytest.fixture
def gcs_bucket(gcs_server: GCSServer) -> str:
    name = f"gcs-{uuid.uuid4().hex[:12]}"
    create_bucket(gcs_server, name)
    return name


@pytest.fixture
def fake_gcs() -> Iterator[FakeGCS]:
    fake = FakeGCS()
    with FakeServer(fake):
        yield fake
