"""Fixtures of the gs:// tests.

* ``gcs`` (session): the GCS emulator (``mcsync.testing.gcs``) on 127.0.0.1; its URL.
* ``gcs_bucket``: a fresh, uniquely named bucket in it.
* ``gcs_env``: ``STORAGE_EMULATOR_HOST`` set to the emulator (by monkeypatch).
* ``fake_gcs``: a FakeGCS (``fake.py``) served on 127.0.0.1 for this test, for what the emulator
  cannot show.

Every test runs without the developer's Google credentials: ``GOOGLE_APPLICATION_CREDENTIALS``
and ``STORAGE_EMULATOR_HOST`` are removed and gcloud's configuration directory
(``CLOUDSDK_CONFIG``) is an empty one, so nothing reaches a real credential or endpoint.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from mcsync.testing.gcs import create_bucket, gcs_emulator

from .fake import FakeGCS, FakeServer


@pytest.fixture(autouse=True)
def _no_google_env(monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory):
    for name in ("GOOGLE_APPLICATION_CREDENTIALS", "STORAGE_EMULATOR_HOST", "GCE_METADATA_HOST",
                 "GOOGLE_CLOUD_PROJECT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path_factory.mktemp("gcloud-empty")))


@pytest.fixture(scope="session")
def gcs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with gcs_emulator(tmp_path_factory.mktemp("gcs")) as url:
        yield url


@pytest.fixture
def gcs_bucket(gcs: str) -> str:
    name = f"gcs-{uuid.uuid4().hex[:12]}"
    create_bucket(gcs, name)
    return name


@pytest.fixture
def gcs_env(gcs: str, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs)
    return gcs


@pytest.fixture
def fake_gcs() -> Iterator[FakeGCS]:
    fake = FakeGCS()
    with FakeServer(fake):
        yield fake
