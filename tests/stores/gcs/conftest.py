"""Fixtures of the gs:// tests.

* ``gcs`` (session) and ``gcs_bucket``: the GCS emulator and a fresh bucket in it, from
  ``tests/conftest.py`` (the store conformance suite, ``tests/stores/``, uses them too).
* ``gcs_env``: ``STORAGE_EMULATOR_HOST`` set to the emulator (by monkeypatch).
* ``fake_gcs``: a FakeGCS (``fake.py``) served on 127.0.0.1 for this test, for what the emulator
  cannot show.

Every test runs without the developer's Google credentials: ``GOOGLE_APPLICATION_CREDENTIALS``,
``STORAGE_EMULATOR_HOST`` and the CA bundle variables are removed and gcloud's configuration
directory (``CLOUDSDK_CONFIG``) is an empty one, so nothing reaches a real credential or endpoint.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from mcsync.stores.gcs import CA_BUNDLE_VARIABLES

from .fake import FakeGCS, FakeServer


@pytest.fixture(autouse=True)
def _no_google_env(monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory):
    for name in ("GOOGLE_APPLICATION_CREDENTIALS", "STORAGE_EMULATOR_HOST", "GCE_METADATA_HOST",
                 "GOOGLE_CLOUD_PROJECT", *CA_BUNDLE_VARIABLES):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path_factory.mktemp("gcloud-empty")))


@pytest.fixture
def gcs_env(gcs: str, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs)
    return gcs


@pytest.fixture
def fake_gcs() -> Iterator[FakeGCS]:
    fake = FakeGCS()
    with FakeServer(fake):
        yield fake
