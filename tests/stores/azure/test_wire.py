"""A relay's az:// parts read over mcsync's own connections (``stores/azure_wire.py``): signed
as Azure's SDK signs, with the credential obstore would use, and against Azurite byte for byte
(an account key and a SAS), pinned to the ETag, with Azure's errors translated and no
credential in their text."""

from __future__ import annotations

import asyncio
import base64
import datetime
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from mcsync.errors import AccessDenied, NotFound, PreconditionFailed
from mcsync.retry import RetryPolicy
from mcsync.stores.azure import AzureStore
from mcsync.stores.azure_wire import WireCredential, credential, shared_key
from mcsync.types import ByteRange
from testbed.azurite import ACCOUNT, KEY

MiB = 1 << 20
NAMES = ["plain.bin", "with space/€ and+plus~tilde.bin", "deep/a/b/c.safetensors"]


# -- signing (pure) ------------------------------------------------------------------------------


def sdk_authorization(method: str, url: str, headers: dict[str, str], account: str,
                      key: str) -> str:
    """The Authorization header Azure's own SDK computes for the same request."""
    from azure.core.pipeline import PipelineContext, PipelineRequest
    from azure.core.rest import HttpRequest
    from azure.storage.blob._shared.authentication import SharedKeyCredentialPolicy

    request = PipelineRequest(HttpRequest(method, url, headers=dict(headers)),
                              PipelineContext(None))
    SharedKeyCredentialPolicy(account, key).on_request(request)
    return str(request.http_request.headers["Authorization"])


@pytest.mark.parametrize(("path", "headers"), [
    ("/acct/c/plain.bin", {"x-ms-date": "Mon, 07 Dec 2026 18:00:00 GMT",
                           "x-ms-version": "2021-08-06", "x-ms-range": "bytes=0-1023"}),
    ("/devstoreaccount1/c/with%20space/%E2%82%AC%20and%2Bplus~tilde.bin",
     {"x-ms-date": "Mon, 07 Dec 2026 18:00:00 GMT", "x-ms-version": "2021-08-06",
      "x-ms-range": "bytes=8388608-16777215", "If-Match": '"0x8DC1234ABCD"'}),
    ("/acct/c/k", {"x-ms-date": "Mon, 07 Dec 2026 18:00:00 GMT", "x-ms-version": "2021-08-06",
                   "Content-Length": "0", "x-ms-client-request-id": "abc"}),
])
def test_shared_key_signs_as_azures_sdk(path: str, headers: dict[str, str]) -> None:
    key = base64.b64encode(b"k" * 64).decode()
    ours = shared_key("GET", path, [("Host", "h"), *headers.items()], "acct",
                      base64.b64decode(key))
    assert ours == sdk_authorization("GET", f"https://h{path}", headers, "acct", key)
    other = shared_key("GET", path + "x", list(headers.items()), "acct", base64.b64decode(key))
    assert other != ours and key not in ours


# -- which credential (pure) ---------------------------------------------------------------------

KEY_B = base64.b64encode(b"the key").decode()


@pytest.mark.parametrize(("config", "conn", "env", "expected"), [
    ({}, None, {"AZURE_STORAGE_ACCOUNT_NAME": "a", "AZURE_STORAGE_ACCOUNT_KEY": KEY_B},
     WireCredential("a", b"the key")),
    ({}, None, {"AZURE_STORAGE_ACCOUNT_NAME": "a", "AZURE_STORAGE_ACCESS_KEY": KEY_B},
     WireCredential("a", b"the key")),
    ({"account_name": "a", "account_key": KEY_B}, None, {}, WireCredential("a", b"the key")),
    ({}, None, {"AZURE_STORAGE_SAS_TOKEN": "?sv=1&sig=s"}, WireCredential("", sas="sv=1&sig=s")),
    # the connection string's credential outranks everything, as obstore's provider does
    ({}, ("sas", "sv=2&sig=t"), {"AZURE_STORAGE_ACCOUNT_KEY": KEY_B, "AZURE_STORAGE_TOKEN": "b"},
     WireCredential("a", sas="sv=2&sig=t")),
    # obstore would sign otherwise: a bearer token, a service principal before a SAS, the CLI
    ({}, None, {"AZURE_STORAGE_ACCOUNT_NAME": "a", "AZURE_STORAGE_ACCOUNT_KEY": KEY_B,
                "AZURE_STORAGE_TOKEN": "bearer"}, None),
    ({}, None, {"AZURE_CLIENT_ID": "i", "AZURE_STORAGE_SAS_TOKEN": "sv=1&sig=s"}, None),
    ({}, None, {"AZURE_USE_AZURE_CLI": "true"}, None),
    ({"account_name": "a", "client_id": "i"}, None, {"AZURE_STORAGE_SAS_TOKEN": "s"}, None),
    # nothing the wire could sign with: obstore's to find (managed identity) or to refuse
    ({}, None, {"AZURE_STORAGE_ACCOUNT_NAME": "a"}, None),
    ({}, None, {"AZURE_STORAGE_ACCOUNT_KEY": KEY_B}, None),  # a key with no account
    ({}, None, {"AZURE_STORAGE_ACCOUNT_NAME": "a", "AZURE_STORAGE_ACCOUNT_KEY": "not base64!"},
     None),
])
def test_the_wire_signs_with_the_credential_obstore_would(
        config: dict[str, str], conn: tuple[str, str] | None, env: dict[str, str],
        expected: WireCredential | None) -> None:
    key = conn[1] if conn and conn[0] == "key" else None
    sas = conn[1] if conn and conn[0] == "sas" else None
    found = credential(config, key, sas, "a" if conn else None, env)
    assert found == expected


def test_a_credential_is_never_in_its_repr() -> None:
    shown = repr(WireCredential("acct", b"secret-key", "sv=1&sig=secret-sig"))
    assert "secret" not in shown and "acct" in shown


# -- against Azurite -----------------------------------------------------------------------------


@pytest.fixture
def container(azurite) -> str:
    name = f"wire-{uuid.uuid4().hex[:12]}"
    azurite.create_container(name)
    return name


def blobs() -> dict[str, bytes]:
    rnd = __import__("random").Random(7)
    return {name: rnd.randbytes(3 * MiB + 12_345 + i) for i, name in enumerate(NAMES)}


def store_for(azurite, container: str, how: str, monkeypatch) -> AzureStore:
    """A store of ``container`` signing with the account key, or reading with a container SAS
    (``AZURE_STORAGE_SAS_TOKEN``, as a user sets it)."""
    for name in ("AZURE_STORAGE_SAS_TOKEN", "AZURE_STORAGE_ACCOUNT_KEY", "AZURE_STORAGE_TOKEN",
                 "AZURE_STORAGE_CONNECTION_STRING"):
        monkeypatch.delenv(name, raising=False)
    config: Any = {"account_name": ACCOUNT}
    if how == "key":
        config["account_key"] = KEY
    else:
        from azure.storage.blob import ContainerSasPermissions, generate_container_sas

        monkeypatch.setenv("AZURE_STORAGE_SAS_TOKEN", generate_container_sas(
            ACCOUNT, container, account_key=KEY,
            permission=ContainerSasPermissions(read=True, list=True),
            expiry=datetime.datetime.now(datetime.UTC) + datetime.timedelta(hours=1)))
    return AzureStore(container=container, prefix="", endpoint=azurite.url, config=config,
                      retry=RetryPolicy(max_attempts=1, sdk_attempts=1), max_connections=4)


@pytest.fixture
def no_obstore_gets(monkeypatch) -> Iterator[None]:
    """Any GET through obstore fails the test: the bytes must come by the wire."""
    import mcsync.stores.azure as azure

    async def refused(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a GET went through obstore")

    monkeypatch.setattr(azure.obstore, "get_async", refused)
    yield


@pytest.mark.parametrize("how", ["key", "sas"])
def test_parts_are_read_into_the_buffer_by_the_wire_byte_for_byte(
        how, azurite, container, monkeypatch, no_obstore_gets) -> None:
    data = blobs()
    for name, body in data.items():
        azurite.upload(container, name, body)
    store = store_for(azurite, container, how, monkeypatch)

    async def read_all() -> dict[str, bytes]:
        infos = {info.key: info async for info in store.list()}
        assert sorted(infos) == sorted(data)
        got = {}
        buf = bytearray(2 * MiB)  # one buffer for every part, as the run's pool lends it
        for name, info in infos.items():
            pieces = []
            for at in range(0, info.size, 2 * MiB):
                rng = ByteRange(at, min(at + 2 * MiB, info.size))
                view = await store.read_into(name, rng, buf, expect=info)
                pieces.append(bytes(view))
            got[name] = b"".join(pieces)
        await store.aclose()
        return got

    assert asyncio.run(read_all()) == data


def test_a_blob_changed_since_its_listing_is_refused(azurite, container, monkeypatch,
                                                      no_obstore_gets):
    azurite.upload(container, "ckpt.bin", b"a" * MiB)
    store = store_for(azurite, container, "key", monkeypatch)

    async def go() -> None:
        info = await store.head("ckpt.bin")
        azurite.upload(container, "ckpt.bin", b"b" * MiB)  # a new ETag
        with pytest.raises(PreconditionFailed, match=r"az://.*ckpt\.bin"):
            await store.read_into("ckpt.bin", ByteRange(0, MiB), bytearray(MiB), expect=info)
        with pytest.raises(NotFound, match=r"az://.*gone\.bin"):
            await store.read_into("gone.bin", ByteRange(0, 10), bytearray(10))
        await store.aclose()

    asyncio.run(go())


@pytest.mark.parametrize("how", ["key", "sas"])
def test_a_wrong_credential_is_access_denied_without_it_in_the_message(
        how, azurite, container, monkeypatch, no_obstore_gets) -> None:
    store_for(azurite, container, "key", monkeypatch)  # the environment cleared
    azurite.upload(container, "x.bin", b"x" * 100)
    wrong = base64.b64encode(b"not the key of this account").decode()
    if how == "key":
        config: Any = {"account_name": ACCOUNT, "account_key": wrong}
    else:
        config = {"account_name": ACCOUNT}
        monkeypatch.setenv("AZURE_STORAGE_SAS_TOKEN", f"sv=2021-08-06&sr=c&sp=r&sig={wrong}")
    store = AzureStore(container=container, prefix="", endpoint=azurite.url, config=config,
                       retry=RetryPolicy(max_attempts=1, sdk_attempts=1))

    async def go() -> str:
        with pytest.raises(AccessDenied) as caught:
            await store.read_into("x.bin", ByteRange(0, 100), bytearray(100))
        await store.aclose()
        return str(caught.value)

    message = asyncio.run(go())
    assert "x.bin" in message and "\n" not in message
    assert wrong not in message and "sig=" not in message


@pytest.mark.parametrize(("env", "url", "proxied"), [
    ({"HTTPS_PROXY": "http://proxy:3128"}, "https://acct.blob.core.windows.net", True),
    ({"https_proxy": "http://proxy:3128", "NO_PROXY": ".windows.net"},
     "https://acct.blob.core.windows.net", False),
    ({"HTTPS_PROXY": "http://proxy:3128"}, "http://127.0.0.1:10000/devstoreaccount1", False),
    ({"ALL_PROXY": "http://proxy:3128"}, "http://127.0.0.1:10000/devstoreaccount1", True),
    ({}, "https://storage.googleapis.com", False),
])
def test_the_wire_is_not_used_where_a_proxy_would_carry_the_requests(
        env: dict[str, str], url: str, proxied: bool, monkeypatch) -> None:
    from mcsync.stores.http_wire import behind_proxy

    for name in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY",
                 "all_proxy", "NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert behind_proxy(url) is proxied
    store = AzureStore(container="c", prefix="", endpoint=url,
                       config={"account_name": ACCOUNT, "account_key": KEY})
    assert (store._wire_client() is None) is proxied
