"""``AZURE_STORAGE_CONNECTION_STRING`` on Azurite: an account key and a SAS, each over two
listing pages (Azure pages at 5,000 blobs), byte for byte; a bad key is exit 2 in one line
without the key."""

from __future__ import annotations

import datetime
import json
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest

from testbed.azurite import ACCOUNT, KEY

from ...integration.helpers import read_tree, run_cli

PAGED = 5_001  # one more than a page of 5,000


def blobs() -> dict[str, bytes]:
    return {f"shards/{i:05d}.bin": f"shard {i}".encode() * (1 + i % 7) for i in range(PAGED)}


@pytest.fixture(scope="module")
def paged_container(azurite) -> str:
    name = f"az-{uuid.uuid4().hex[:12]}"
    service = azurite.service()
    service.create_container(name)
    container = service.get_container_client(name)

    def put(item: tuple[str, bytes]) -> None:
        container.upload_blob(item[0], item[1], overwrite=True)

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(put, blobs().items()))
    return name


def key_string(url: str, key: str = KEY) -> str:
    return (f"DefaultEndpointsProtocol=http;AccountName={ACCOUNT};AccountKey={key};"
            f"BlobEndpoint={url};")


def sas_string(url: str, container: str) -> str:
    from azure.storage.blob import ContainerSasPermissions, generate_container_sas

    sas = generate_container_sas(
        ACCOUNT, container, account_key=KEY,
        permission=ContainerSasPermissions(read=True, list=True),
        expiry=datetime.datetime.now(datetime.UTC) + datetime.timedelta(hours=1))
    return f"BlobEndpoint={url};SharedAccessSignature={sas}"


@pytest.mark.slow
@pytest.mark.parametrize("credential", ["key", "sas"])
def test_a_connection_string_syncs_two_listing_pages_byte_for_byte(
        credential, azurite, paged_container, tmp_path, monkeypatch):
    for name in ("AZURE_STORAGE_ACCOUNT_NAME", "AZURE_STORAGE_ACCOUNT_KEY",
                 "AZURE_STORAGE_SAS_TOKEN", "AZURE_STORAGE_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    text = (key_string(azurite.url) if credential == "key"
            else sas_string(azurite.url, paged_container))
    env = {"AZURE_STORAGE_CONNECTION_STRING": text}
    if credential == "sas":  # the string wins over a key in the variables, as in the Azure CLI
        env["AZURE_STORAGE_ACCOUNT_KEY"] = "d3Jvbmcta2V5"
    args = ["sync", f"az://{paged_container}/", str(tmp_path / "dst"), "--json", "-v"]
    first = run_cli(*args, env=env)
    assert first.exit_code == 0, first.output[-2000:]
    assert read_tree(tmp_path / "dst") == blobs()
    assert KEY not in first.output and "sig=" not in first.output
    assert json.loads(first.stdout)["objects_copied"] == PAGED
    again = run_cli(*args, env=env)
    assert again.exit_code == 0 and json.loads(again.stdout)["bytes_sent"] == 0, again.output


def test_a_bad_key_in_the_string_is_one_line_without_the_key(azurite, paged_container, tmp_path):
    wrong = "d3Jvbmcta2V5LW9mLXNvbWVvbmUtZWxzZQ=="
    result = run_cli("sync", f"az://{paged_container}/", str(tmp_path / "d"),
                     env={"AZURE_STORAGE_CONNECTION_STRING": key_string(azurite.url, wrong)})
    assert result.exit_code == 2, result.output
    (line,) = [line for line in result.output.splitlines() if line.strip()]
    assert line.startswith(f"mcsync: error: az://{paged_container}/: ")
    assert "check credentials" in line
    assert wrong not in result.output and KEY not in result.output


def test_a_malformed_string_is_one_line_naming_the_variable(tmp_path):
    result = run_cli("sync", "az://data/", str(tmp_path / "d"),
                     env={"AZURE_STORAGE_CONNECTION_STRING": f"AccountKey={KEY};x"})
    assert result.exit_code == 2, result.output
    assert result.output.splitlines() == [
        "mcsync: error: AZURE_STORAGE_CONNECTION_STRING is malformed: part 2 is not Name=value "
        "(its value is not shown)"]
