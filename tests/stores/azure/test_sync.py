"""Azure Blob Storage as a source, over HTTP against Azurite: to a directory and to Meta Storage
(SeaweedFS), byte for byte, in parts where objects are large, again with nothing to do, and
with a blob replaced mid-copy never stitched from two versions."""

from __future__ import annotations

import json
import random
import uuid

import pytest

from mcsync.testing.faults import Call, Faults, Rule, faulty
from testbed.azurite import KEY

from ...integration.helpers import read_bucket, read_tree, run_cli, sync_stores

MiB = 1 << 20


def dataset() -> dict[str, bytes]:
    rnd = random.Random(7)
    return {"run/step-1/model-00001-of-00002.safetensors": rnd.randbytes(12 * MiB + 5),
            "run/step-1/model-00002-of-00002.safetensors": rnd.randbytes(3 * MiB),
            "run/step-1/config.json": b'{"layers": 2}',
            "run/step-1/empty.bin": b"",
            "data/ünï cödé ~x.txt": b"unicode key"}


@pytest.fixture
def container(azurite) -> str:
    name = f"az-{uuid.uuid4().hex[:12]}"
    azurite.create_container(name)
    for key, data in dataset().items():
        azurite.upload(name, key, data)
    return name


@pytest.mark.parametrize("target", ["local", "meta"])
def test_a_container_syncs_byte_for_byte_and_again_with_nothing_to_do(
        target, azurite, container, seaweed, bucket_factory, tmp_path):
    env = {**azurite.env(), **seaweed.meta_env()}
    if target == "local":
        dst = str(tmp_path / "dst")
    else:
        bucket = bucket_factory(seaweed)
        dst = f"meta://{bucket}/"
    args = ["sync", f"az://{container}/", dst, "--part-size", "5MiB", "--json", "-v"]
    first = run_cli(*args, env=env)
    assert first.exit_code == 0, first.output
    there = read_tree(tmp_path / "dst") if target == "local" else read_bucket(seaweed, bucket)
    assert there == dataset()
    assert KEY not in first.output  # the account key is never shown
    report = json.loads(first.stdout)
    assert report["objects_copied"] == len(dataset())
    again = run_cli(*args, env=env)
    assert again.exit_code == 0 and json.loads(again.stdout)["bytes_sent"] == 0, again.output


def test_a_blob_replaced_mid_copy_is_copied_again_from_its_new_version(
        azurite, container, tmp_path, monkeypatch):
    for name, value in azurite.env().items():
        monkeypatch.setenv(name, value)
    from mcsync.stores.registry import open_store

    key = "run/step-1/model-00001-of-00002.safetensors"
    new = random.Random(8).randbytes(12 * MiB + 5)
    replaced: list[bool] = []

    def replace(_: Call) -> None:  # after the first ranged read of the old version
        if not replaced:
            replaced.append(True)
            azurite.upload(container, key, new)

    source = faulty(open_store(f"az://{container}/"),
                    Faults([Rule("get", key=key, phase="after", action=replace)]))
    report = sync_stores(source, str(tmp_path / "dst"), part_size=5 * MiB, part_concurrency=1)
    assert replaced and report.ok, report.failures
    assert read_tree(tmp_path / "dst") == {**dataset(), key: new}


def test_an_unknown_container_is_a_one_line_configuration_error(azurite, tmp_path):
    result = run_cli("sync", "az://no-such-container/", str(tmp_path / "d"), env=azurite.env())
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and "az://no-such-container/" in lines[0], result.output
    assert "container 'no-such-container' does not exist" in lines[0]
    assert KEY not in result.output


def test_a_sas_token_never_reaches_an_error(tmp_path):
    """obstore names each failed request's URL, where a SAS token travels; mcsync's errors cut
    query strings. Nothing listens on the endpoint: the error is of the connection."""
    from testbed.processes import free_port

    env = {"AZURE_STORAGE_ACCOUNT_NAME": "devstoreaccount1",
           "AZURE_STORAGE_SAS_TOKEN": "sv=2024-01-01&sp=rl&sig=SECRETSIGNATURE",
           "AZURE_STORAGE_ENDPOINT": f"http://127.0.0.1:{free_port()}/devstoreaccount1"}
    result = run_cli("sync", "az://data/", str(tmp_path / "d"), env=env)
    assert result.exit_code == 2, result.output
    assert "az://data/" in result.output and "SECRETSIGNATURE" not in result.output
    assert "sig=" not in result.output


def test_no_account_is_a_one_line_configuration_error(tmp_path, monkeypatch):
    monkeypatch.delenv("AZURE_STORAGE_ACCOUNT_NAME", raising=False)
    result = run_cli("sync", "az://data/", str(tmp_path / "d"))
    assert result.exit_code == 2, result.output
    assert result.output.strip().splitlines() == [
        "mcsync: error: az://data/: no storage account given: set "
        "AZURE_STORAGE_CONNECTION_STRING, or AZURE_STORAGE_ACCOUNT_NAME (and its credential)"]
