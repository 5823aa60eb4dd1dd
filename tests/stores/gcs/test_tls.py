"""gs:// over https (fake-gcs-server, with a certificate of a CA made for the session): the CA
is trusted through the variables Google's tools read, and a certificate that does not verify
is one line and exit 2, at once; listings read page by page from a server that pages."""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path

import pytest

from mcsync.stores.gcs import GCSStore
from testbed.gcs import GCSServer
from testbed.tls import make_certificates

from .helpers import error_lines, payload, run_cli, seed


@pytest.fixture
def https(gcs_fake_server: GCSServer, monkeypatch: pytest.MonkeyPatch) -> GCSServer:
    """fake-gcs-server as the emulator, its CA not (yet) trusted."""
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs_fake_server.url)
    return gcs_fake_server


@pytest.fixture(scope="module")
def bucket(gcs_fake_server: GCSServer) -> str:
    from testbed.gcs import create_bucket

    create_bucket(gcs_fake_server, "tls-bucket")
    seed(gcs_fake_server, "tls-bucket", {"a.bin": payload(100, 1), "b/c.bin": payload(200, 2)},
         "d/")
    return "tls-bucket"


@pytest.mark.parametrize("variable", ["CLOUDSDK_CORE_CUSTOM_CA_CERTS_FILE", "REQUESTS_CA_BUNDLE"])
def test_the_ca_is_trusted_through_googles_variables(https, bucket, monkeypatch, tmp_path,
                                                     variable):
    assert https.ca is not None
    monkeypatch.setenv(variable, str(https.ca))
    result = run_cli("sync", f"gs://{bucket}/d/", str(tmp_path / "t"), "--quiet")
    assert result.exit_code == 0, result.output
    assert (tmp_path / "t" / "a.bin").read_bytes() == payload(100, 1)
    assert (tmp_path / "t" / "b" / "c.bin").read_bytes() == payload(200, 2)


def test_gclouds_variable_wins_over_requests(https, bucket, monkeypatch, tmp_path):
    monkeypatch.setenv("CLOUDSDK_CORE_CUSTOM_CA_CERTS_FILE", str(https.ca))
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(tmp_path / "no-such.pem"))
    result = run_cli("ls", f"gs://{bucket}/d/")
    assert result.exit_code == 0, result.output


def _refused(bucket: str, tmp_path: Path) -> str:
    start = time.monotonic()
    result = run_cli("sync", f"gs://{bucket}/d/", str(tmp_path / "t"))
    assert time.monotonic() - start < 10  # refused, not retried
    assert result.exit_code == 2, result.output
    (line,) = error_lines(result.output)
    assert not (tmp_path / "t").exists()
    return line


def test_an_untrusted_certificate_is_one_line_and_exit_2(https, bucket, tmp_path):
    line = _refused(bucket, tmp_path)
    assert f"the TLS certificate of {https.url} is not trusted" in line
    assert "CLOUDSDK_CORE_CUSTOM_CA_CERTS_FILE" in line


def test_the_ca_of_another_authority_is_refused(https, bucket, tmp_path, monkeypatch):
    other = make_certificates(tmp_path / "other")
    monkeypatch.setenv("CLOUDSDK_CORE_CUSTOM_CA_CERTS_FILE", str(other.ca))
    assert "is not trusted" in _refused(bucket, tmp_path)


@pytest.mark.parametrize(("content", "message"), [
    (None, "No such file or directory"),
    ("not a certificate\n", "no PEM certificate in it"),
])
def test_a_bad_ca_bundle_is_named(https, bucket, tmp_path, monkeypatch, content, message):
    path = tmp_path / "ca.pem"
    if content is not None:
        path.write_text(content)
    monkeypatch.setenv("CLOUDSDK_CORE_CUSTOM_CA_CERTS_FILE", str(path))
    assert f"CA bundle {path}: {message}" in _refused(bucket, tmp_path)


def test_a_ca_bundle_is_not_read_for_plain_http(gcs, monkeypatch, tmp_path):
    from testbed.gcs import create_bucket

    create_bucket(gcs, "plain-http")
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs)  # the emulator: http
    monkeypatch.setenv("CLOUDSDK_CORE_CUSTOM_CA_CERTS_FILE", str(tmp_path / "no-such.pem"))
    result = run_cli("ls", "gs://plain-http/")
    assert result.exit_code == 0, result.output


def test_a_listing_is_read_page_by_page(https, monkeypatch):
    """Pages of three: 3 + 3 + 3 + 1 objects, each page asked for with the last one's token."""
    from testbed.gcs import create_bucket

    name = f"paged-{uuid.uuid4().hex[:8]}"
    create_bucket(https, name)
    keys = [f"k{i:02d}" for i in range(10)]
    seed(https, name, {k: k.encode() for k in keys}, "p/")
    pages: list[str | None] = []
    real_send = GCSStore._send

    async def send(self, url, params, **kw):
        pages.append(params.get("pageToken"))
        return await real_send(self, url, params, **kw)

    monkeypatch.setattr(GCSStore, "_send", send)

    async def go() -> list[str]:
        store = GCSStore(bucket=name, prefix="p/", ca_bundle=str(https.ca), page_size=3)
        try:
            return [info.key async for info in store.list()]
        finally:
            await store.aclose()

    assert asyncio.run(go()) == keys
    assert len(pages) == 4 and pages[0] is None and all(pages[1:])
