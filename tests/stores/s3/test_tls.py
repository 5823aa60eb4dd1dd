"""An https endpoint whose certificate a private CA signed (an on-premises S3-compatible
store): with the CA in AWS_CA_BUNDLE (or, for meta://, MCSYNC_META_CA_BUNDLE) both of the S3
store's clients trust it — obstore (listings, GETs, small PUTs, the lock) and botocore
(multipart uploads, copies); without it the run stops in one line, nothing written."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from testbed.servers import S3Endpoint, moto_server
from testbed.tls import make_certificates

from ...integration.helpers import new_bucket, payload, read_bucket, read_tree, run_cli, write_tree

MiB = 1024 * 1024
# One object in parts (botocore's UploadPart), the others each one obstore PUT.
OBJECTS = {"model.safetensors": payload(12 * MiB, 1), "config.json": b'{"layers": 2}',
           "tokenizer/vocab.txt": payload(70_000, 2)}


@pytest.fixture(scope="module")
def tls_moto(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Endpoint]:
    tls = make_certificates(tmp_path_factory.mktemp("pki"))
    with moto_server(log_path=tmp_path_factory.mktemp("moto-tls") / "moto.log",
                     tls=tls) as endpoint:
        yield endpoint


def _aws_env(ep: S3Endpoint, **changes: str | None) -> dict[str, str | None]:
    # Only the CA a test names: not one this machine's environment may set.
    return {**ep.aws_env(), **changes}


def _sync(*args: str, env: dict[str, str | None]) -> dict:
    result = run_cli("sync", *args, "--part-size", "5MiB", "--json", "--quiet", env=env)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_sync_over_https_trusts_the_ca_bundle(tls_moto: S3Endpoint, tmp_path: Path) -> None:
    assert tls_moto.url.startswith("https://")
    write_tree(tmp_path / "src", OBJECTS)
    bucket = new_bucket(tls_moto)
    env = _aws_env(tls_moto)
    report = _sync(str(tmp_path / "src"), f"s3://{bucket}/run/", env=env)
    assert report["objects_copied"] == len(OBJECTS)
    assert read_bucket(tls_moto, bucket, "run/") == OBJECTS
    again = _sync(str(tmp_path / "src"), f"s3://{bucket}/run/", env=env)
    assert again["objects_copied"] == 0 and again["bytes_sent"] == 0
    # and back: ranged GETs streamed into files
    _sync(f"s3://{bucket}/run/", str(tmp_path / "back"), env=env)
    assert read_tree(tmp_path / "back") == OBJECTS


def test_meta_has_its_own_ca_bundle(tls_moto: S3Endpoint, tmp_path: Path) -> None:
    write_tree(tmp_path / "src", OBJECTS)
    bucket = new_bucket(tls_moto)
    env: dict[str, str | None] = {**tls_moto.meta_env(), "AWS_CA_BUNDLE": None}
    assert env["MCSYNC_META_CA_BUNDLE"] == tls_moto.ca_bundle
    _sync(str(tmp_path / "src"), f"meta://{bucket}/", env=env)
    assert read_bucket(tls_moto, bucket) == OBJECTS


def test_without_the_ca_the_run_stops_in_one_line(tls_moto: S3Endpoint, tmp_path: Path) -> None:
    write_tree(tmp_path / "src", OBJECTS)
    bucket = new_bucket(tls_moto)
    result = run_cli("sync", str(tmp_path / "src"), f"s3://{bucket}/",
                     env=_aws_env(tls_moto, AWS_CA_BUNDLE=None))
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and f"s3://{bucket}/" in lines[0], result.output
    assert "TLS certificate is not trusted (UnknownIssuer)" in lines[0]
    assert "AWS_CA_BUNDLE" in lines[0]
    assert tls_moto.secret_key not in result.output
    assert read_bucket(tls_moto, bucket, with_state=True) == {}


@pytest.mark.parametrize("bundle", ["missing", "not-pem"])
def test_an_unusable_ca_bundle_is_named(tls_moto: S3Endpoint, tmp_path: Path,
                                        bundle: str) -> None:
    write_tree(tmp_path / "src", OBJECTS)
    bucket = new_bucket(tls_moto)
    path = tmp_path / f"{bundle}.pem"
    if bundle == "not-pem":
        path.write_text("this is no certificate\n")
    result = run_cli("sync", str(tmp_path / "src"), f"s3://{bucket}/",
                     env=_aws_env(tls_moto, AWS_CA_BUNDLE=str(path)))
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and str(path) in lines[0], result.output
    assert read_bucket(tls_moto, bucket, with_state=True) == {}


def test_server_side_copies_over_https_trust_the_ca_bundle(tls_moto: S3Endpoint,
                                                           tmp_path: Path) -> None:
    """CopyObject goes by the third client, the CRT's: it trusts the same bundle."""
    write_tree(tmp_path / "src", OBJECTS)
    source, target = new_bucket(tls_moto), new_bucket(tls_moto, "copy")
    env = _aws_env(tls_moto)
    _sync(str(tmp_path / "src"), f"s3://{source}/run/", env=env)
    report = _sync(f"s3://{source}/run/", f"s3://{target}/run/", env=env)
    assert {o["key"]: o["action"] for o in report["objects"]} == dict.fromkeys(
        OBJECTS, "server_copy")
    assert report["bytes_sent"] == 0
    assert read_bucket(tls_moto, target, "run/") == OBJECTS
