"""Mutual TLS: an https endpoint that requires a client certificate (``testbed.tlsproxy`` in
front of SeaweedFS). With the certificate every request of a run presents it — listings,
reads, writes, multipart uploads, server-side copies (CopyObject and UploadPartCopy), the lock
and the manifest's copy at the target — whichever client sends it (obstore, which cannot
present one, then sends nothing); without it, with one of another CA, or without the CA of
the server's certificate, the run stops in one line within seconds, nothing written. A bad
certificate or key file is named in one line; the key's contents are never shown."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import ssl
import time
from pathlib import Path

import pytest

from mcsync.errors import ConfigError
from mcsync.stores.s3_clients import ClientCert
from testbed.servers import S3Endpoint
from testbed.tlsproxy import TlsProxy

from ...conftest import MtlsFiles
from ...integration.helpers import new_bucket, payload, read_bucket, read_tree, run_cli, write_tree

MiB = 1 << 20
# 30 objects: three in parts (5 MiB parts), the rest one request each.
OBJECTS = {f"model-0000{i}-of-00003.safetensors": payload(12 * MiB + i, i) for i in range(1, 4)}
OBJECTS |= {f"tokenizer/part-{i:03d}.json": payload(1000 + 37 * i, 100 + i) for i in range(27)}


def _sync(*args: str, env: dict[str, str | None]) -> dict:
    result = run_cli("sync", *args, "--part-size", "5MiB", "--json", "--quiet", env=env)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def _secret_lines(key: Path) -> list[str]:
    """The key's contents, as they could show up in output (its base64 lines)."""
    return [line for line in key.read_text().splitlines() if line and "-----" not in line]


def _assert_no_key(output: str, pki: MtlsFiles) -> None:
    # any(): a failure must not print the line it found (the key's contents) either
    secrets = _secret_lines(pki.client.key) + _secret_lines(pki.stranger.key)
    assert not any(line in output for line in secrets), "a private key's contents in output"


def test_the_proxy_passes_bytes_unchanged_and_sigv4_verifies(
        mtls_pki: MtlsFiles, tmp_path: Path, seaweed: S3Endpoint,
        mtls_endpoint: S3Endpoint) -> None:
    """Host header included: a request signed for the proxy's address verifies at SeaweedFS
    (which checks signatures), and a recording server sees the very bytes sent."""
    bucket = new_bucket(seaweed)
    client = mtls_endpoint.client()
    client.put_object(Bucket=bucket, Key="k", Body=b"through the proxy")
    assert client.get_object(Bucket=bucket, Key="k")["Body"].read() == b"through the proxy"

    received = bytearray()

    async def record(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        received.extend(await reader.readexactly(len(request)))
        writer.write(b"HTTP/1.1 204 No Content\r\nContent-Length: 0\r\n\r\n")
        await writer.drain()
        writer.close()

    request = (b"GET /bucket/key?x-id=GetObject HTTP/1.1\r\nHost: 127.0.0.1:9\r\n"
               b"Authorization: AWS4-HMAC-SHA256 Credential=AK/20250101/us-east-1/s3/aws4_"
               b"request, SignedHeaders=host, Signature=00\r\n\r\n")

    async def main() -> bytes:
        server = await asyncio.start_server(record, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        proxy = TlsProxy(f"http://127.0.0.1:{port}", server=mtls_pki.ca.server("echo-"),
                         ca=mtls_pki.ca.ca)
        with proxy.running():
            context = ssl.create_default_context(cafile=mtls_pki.ca.ca)
            context.load_cert_chain(mtls_pki.client.cert, mtls_pki.client.key)
            host, _, proxy_port = proxy.url.removeprefix("https://").partition(":")
            reader, writer = await asyncio.open_connection(host, int(proxy_port), ssl=context)
            writer.write(request)
            await writer.drain()
            answer = await reader.read()
            writer.close()
        server.close()
        return answer

    answer = asyncio.run(main())
    assert answer.startswith(b"HTTP/1.1 204")
    assert bytes(received) == request


def test_a_sync_presents_the_certificate_on_every_request(
        seaweed: S3Endpoint, mtls_proxy: TlsProxy, mtls_endpoint: S3Endpoint,
        mtls_pki: MtlsFiles, tmp_path: Path) -> None:
    write_tree(tmp_path / "src", OBJECTS)
    bucket, mirror = new_bucket(seaweed), new_bucket(seaweed, "mirror")
    env: dict[str, str | None] = {**mtls_endpoint.meta_env()}
    # up: listings, PUTs, multipart uploads, the lock, the manifest's copy
    report = _sync(str(tmp_path / "src"), f"meta://{bucket}/run/", env=env)
    assert report["objects_copied"] == len(OBJECTS)
    assert read_bucket(seaweed, bucket, "run/") == OBJECTS
    state = read_bucket(seaweed, bucket, "run/", with_state=True).keys() - OBJECTS.keys()
    assert any(k.startswith(".mcsync/manifest-") for k in state), state
    # a changed large object: a block delta, its unchanged parts copied server-side
    # (UploadPartCopy), the changed one uploaded (UploadPart)
    big = "model-00001-of-00003.safetensors"
    changed = bytearray(OBJECTS[big])
    changed[6 * MiB: 6 * MiB + 100] = b"x" * 100
    (tmp_path / "src" / big).write_bytes(changed)
    report = _sync(str(tmp_path / "src"), f"meta://{bucket}/run/", env=env)
    assert report["objects_copied"] == 1 and report["bytes_sent"] < len(changed), report
    expected = {**OBJECTS, big: bytes(changed)}
    assert read_bucket(seaweed, bucket, "run/") == expected
    # across buckets of one endpoint: CopyObject
    report = _sync(f"meta://{bucket}/run/", f"meta://{mirror}/run/", env=env)
    assert {o["action"] for o in report["objects"]} == {"server_copy"}
    assert report["bytes_sent"] == 0
    # and down: ranged GETs
    _sync(f"meta://{mirror}/run/", str(tmp_path / "back"), env=env)
    assert read_tree(tmp_path / "back") == expected
    # no connection was made without the certificate, and many were made with it
    assert mtls_proxy.refused() == []
    assert {h.subject for h in mtls_proxy.accepted()} == {"mcsync-client"}


def test_s3_takes_the_certificate_as_options(
        seaweed: S3Endpoint, mtls_endpoint: S3Endpoint, mtls_pki: MtlsFiles,
        tmp_path: Path) -> None:
    write_tree(tmp_path / "src", OBJECTS)
    bucket = new_bucket(seaweed)
    cert, key = str(mtls_pki.client.cert), str(mtls_pki.client.key)
    env: dict[str, str | None] = {**mtls_endpoint.aws_env()}
    report = _sync(str(tmp_path / "src"), f"s3://{bucket}/", "--client-cert", cert,
                   "--client-key", key, env=env)
    assert report["objects_copied"] == len(OBJECTS)
    assert read_bucket(seaweed, bucket) == OBJECTS
    listed = run_cli("ls", f"s3://{bucket}/", "--client-cert", cert, "--client-key", key,
                     env=env)
    assert listed.exit_code == 0 and f"{len(OBJECTS)} objects" in listed.output


@pytest.mark.parametrize("case", ["no certificate", "another CA's", "no CA bundle"])
def test_a_refused_handshake_stops_the_run_in_one_line(
        case: str, seaweed: S3Endpoint, mtls_endpoint: S3Endpoint, mtls_pki: MtlsFiles,
        mtls_proxy: TlsProxy, tmp_path: Path) -> None:
    write_tree(tmp_path / "src", OBJECTS)
    bucket = new_bucket(seaweed)
    env: dict[str, str | None] = {**mtls_endpoint.meta_env()}
    if case == "no certificate":
        env |= {"MCSYNC_META_CLIENT_CERT": None, "MCSYNC_META_CLIENT_KEY": None}
        expected = "refused the TLS handshake (certificate required)"
    elif case == "another CA's":
        env |= {"MCSYNC_META_CLIENT_CERT": str(mtls_pki.stranger.cert),
                "MCSYNC_META_CLIENT_KEY": str(mtls_pki.stranger.key)}
        expected = "refused the TLS handshake (unknown ca)"
    else:
        env |= {"MCSYNC_META_CA_BUNDLE": None}
        expected = "TLS certificate is not trusted"
    started = time.monotonic()
    result = run_cli("sync", str(tmp_path / "src"), f"meta://{bucket}/", "--verbose", env=env)
    took = time.monotonic() - started
    assert result.exit_code == 2, result.output
    errors = [line for line in result.output.splitlines() if "error" in line.lower()]
    assert len(errors) == 1 and expected in errors[0], result.output
    assert errors[0].startswith(f"mcsync: error: meta://{bucket}/")
    assert took < 15, took
    assert read_bucket(seaweed, bucket, with_state=True) == {}
    assert str(mtls_pki.client.key) not in errors[0]
    _assert_no_key(result.output, mtls_pki)


@pytest.mark.parametrize("case", ["missing cert", "missing key", "unreadable key",
                                  "mismatched", "key not PEM", "key without cert"])
def test_an_unusable_certificate_or_key_is_named(
        case: str, seaweed: S3Endpoint, mtls_endpoint: S3Endpoint, mtls_pki: MtlsFiles,
        tmp_path: Path) -> None:
    write_tree(tmp_path / "src", OBJECTS)
    bucket = new_bucket(seaweed)
    cert, key = str(mtls_pki.client.cert), str(mtls_pki.client.key)
    named = cert
    if case == "missing cert":
        cert = named = str(tmp_path / "missing.pem")
    elif case == "missing key":
        key = named = str(tmp_path / "missing.key")
    elif case == "unreadable key":
        unreadable = tmp_path / "unreadable.key"
        unreadable.write_bytes(mtls_pki.client.key.read_bytes())
        unreadable.chmod(0)
        key = named = str(unreadable)
        try:
            unreadable.read_bytes()
            pytest.skip("running as root: every file is readable")
        except PermissionError:
            pass
    elif case == "mismatched":
        key = named = str(mtls_pki.stranger.key)
    elif case == "key not PEM":
        (tmp_path / "not.key").write_text("not a key\n")
        key = named = str(tmp_path / "not.key")
    env: dict[str, str | None] = {**mtls_endpoint.meta_env(), "MCSYNC_META_CLIENT_CERT": cert,
                                  "MCSYNC_META_CLIENT_KEY": key}
    if case == "key without cert":
        env["MCSYNC_META_CLIENT_CERT"] = None
        named = key
    result = run_cli("sync", str(tmp_path / "src"), f"meta://{bucket}/", env=env)
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and named in lines[0], result.output
    assert read_bucket(seaweed, bucket, with_state=True) == {}
    _assert_no_key(result.output, mtls_pki)


def test_one_file_may_hold_the_certificate_and_its_key(
        seaweed: S3Endpoint, mtls_endpoint: S3Endpoint, mtls_pki: MtlsFiles,
        tmp_path: Path) -> None:
    both = tmp_path / "both.pem"
    both.write_bytes(mtls_pki.client.cert.read_bytes() + mtls_pki.client.key.read_bytes())
    write_tree(tmp_path / "src", OBJECTS)
    bucket = new_bucket(seaweed)
    env: dict[str, str | None] = {**mtls_endpoint.meta_env(),
                                  "MCSYNC_META_CLIENT_CERT": str(both),
                                  "MCSYNC_META_CLIENT_KEY": None}
    _sync(str(tmp_path / "src"), f"meta://{bucket}/", env=env)
    assert read_bucket(seaweed, bucket) == OBJECTS


def test_the_key_is_never_in_a_repr_or_an_error(mtls_pki: MtlsFiles, tmp_path: Path) -> None:
    pair = ClientCert.read(str(mtls_pki.client.cert), str(mtls_pki.client.key))
    assert repr(pair) == (f"ClientCert(cert={str(mtls_pki.client.cert)!r}, "
                          f"key={str(mtls_pki.client.key)!r})")
    swapped = tmp_path / "swapped.pem"  # a key where the certificate should be
    swapped.write_bytes(mtls_pki.client.key.read_bytes())
    with pytest.raises(ConfigError) as caught:
        ClientCert.read(str(swapped), str(mtls_pki.client.key))
    assert "no PEM certificate" in str(caught.value)
    _assert_no_key(str(caught.value), mtls_pki)
    encrypted = tmp_path / "encrypted.key"
    encrypted.write_text("-----BEGIN ENCRYPTED PRIVATE KEY-----\nAAAA\n"
                         "-----END ENCRYPTED PRIVATE KEY-----\n")
    with pytest.raises(ConfigError, match="encrypted with a passphrase"):
        ClientCert.read(str(mtls_pki.client.cert), str(encrypted))


def test_plain_http_presents_nothing_but_still_checks_the_files(
        seaweed: S3Endpoint, mtls_pki: MtlsFiles, tmp_path: Path) -> None:
    """A certificate for an http:// endpoint: nothing to present it in, the run goes on (by
    obstore); a missing file is still named."""
    write_tree(tmp_path / "src", {"a": b"1"})
    bucket = new_bucket(seaweed)
    env: dict[str, str | None] = {**dataclasses.replace(seaweed, client_cert=(
        str(mtls_pki.client.cert), str(mtls_pki.client.key))).meta_env()}
    _sync(str(tmp_path / "src"), f"meta://{bucket}/", env=env)
    env["MCSYNC_META_CLIENT_KEY"] = str(tmp_path / "gone.key")
    result = run_cli("sync", str(tmp_path / "src"), f"meta://{bucket}/", env=env)
    assert result.exit_code == 2 and str(tmp_path / "gone.key") in result.output


async def test_with_a_certificate_obstore_sends_nothing(
        seaweed: S3Endpoint, mtls_endpoint: S3Endpoint, monkeypatch: pytest.MonkeyPatch) -> None:
    """The rule of ``S3Clients``: every request of the store's API by botocore or the CRT."""
    from mcsync.stores.registry import open_store
    from mcsync.stores.s3 import S3Store

    bucket = new_bucket(seaweed)
    for name, value in mtls_endpoint.meta_env().items():
        monkeypatch.setenv(name, value)
    store = open_store(f"meta://{bucket}/p/")
    assert isinstance(store, S3Store)
    try:
        await store.check(mode="write")
        await store.put("small", b"abc")
        assert bytes(await store.get("small")) == b"abc"
        assert (await store.head("small")).size == 3
        upload = await store.open_upload("big", 6 * MiB)
        part = await upload.put_part(1, 0, payload(6 * MiB, 7))
        await upload.complete([part])
        await store.copy_object(store.copy_source("big", None), "big-copy")
        assert [i.key async for i in store.list()] == ["big", "big-copy", "small"]
        await store.delete("small")
        clients = store._clients
        assert clients.mutual_tls and clients._obstore is None and clients._crt is not None
    finally:
        await store.aclose()
    assert read_bucket(seaweed, bucket, "p/") == {"big": payload(6 * MiB, 7),
                                                  "big-copy": payload(6 * MiB, 7)}


def test_the_library_takes_the_certificate_as_options(
        seaweed: S3Endpoint, mtls_endpoint: S3Endpoint, mtls_pki: MtlsFiles,
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import mcsync

    write_tree(tmp_path / "src", OBJECTS)
    bucket = new_bucket(seaweed)
    for name, value in mtls_endpoint.aws_env().items():
        monkeypatch.setenv(name, value)
    report = mcsync.sync(str(tmp_path / "src"), f"s3://{bucket}/", part_size=5 * MiB,
                         client_cert=str(mtls_pki.client.cert),
                         client_key=str(mtls_pki.client.key))
    assert report.exit_code == 0 and report.objects_copied == len(OBJECTS)
    assert read_bucket(seaweed, bucket) == OBJECTS


async def test_a_check_with_fewer_tries_has_a_client_of_its_own(
        seaweed: S3Endpoint, mtls_endpoint: S3Endpoint, mtls_pki: MtlsFiles) -> None:
    """Checks retry less than requests (``preflight_attempts``): with a certificate, botocore's
    check client is then a second one, presenting it as well."""
    from mcsync.retry import RetryPolicy
    from mcsync.stores.s3 import S3Credentials, S3Store

    bucket = new_bucket(seaweed)
    ep = mtls_endpoint
    store = S3Store(scheme="meta", bucket=bucket, prefix="", endpoint_url=ep.url,
                    credentials=S3Credentials(ep.access_key, ep.secret_key),
                    retry=RetryPolicy(sdk_attempts=5, preflight_attempts=2),
                    ca_bundle=ep.ca_bundle, client_cert=str(mtls_pki.client.cert),
                    client_key=str(mtls_pki.client.key))
    try:
        await store.check(mode="write")
        clients = store._clients
        assert clients._check_botocore is not None
        assert clients._check_botocore is not clients._botocore
    finally:
        await store.aclose()


def test_a_meta_profile_names_the_certificate(
        seaweed: S3Endpoint, mtls_endpoint: S3Endpoint, mtls_pki: MtlsFiles,
        tmp_path: Path) -> None:
    """``client_cert`` / ``client_key`` in ``[meta.NAME]``; the variables win over the file."""
    ep = mtls_endpoint
    config = tmp_path / "config.toml"
    config.write_text(
        f'[meta.onprem]\nendpoint_url = "{ep.url}"\naccess_key_id = "{ep.access_key}"\n'
        f'secret_access_key = "{ep.secret_key}"\nca_bundle = "{ep.ca_bundle}"\n'
        f'client_cert = "{mtls_pki.stranger.cert}"\nclient_key = "{mtls_pki.stranger.key}"\n')
    write_tree(tmp_path / "src", {"a.bin": b"profile"})
    bucket = new_bucket(seaweed)
    env: dict[str, str | None] = {"MCSYNC_CONFIG": str(config), "MCSYNC_META_PROFILE": "onprem"}
    refused = run_cli("sync", str(tmp_path / "src"), f"meta://{bucket}/", env=env)
    assert refused.exit_code == 2 and "(unknown ca)" in refused.output, refused.output
    config.write_text(config.read_text().replace(str(mtls_pki.stranger.cert),
                                                 str(mtls_pki.client.cert)).replace(
        str(mtls_pki.stranger.key), str(mtls_pki.client.key)))
    _sync(str(tmp_path / "src"), f"meta://{bucket}/", env=env)
    assert read_bucket(seaweed, bucket) == {"a.bin": b"profile"}
    env["MCSYNC_META_CLIENT_KEY"] = str(tmp_path / "nowhere.key")  # the variable wins
    result = run_cli("sync", str(tmp_path / "src"), f"meta://{bucket}/", env=env)
    assert result.exit_code == 2 and "nowhere.key" in result.output
