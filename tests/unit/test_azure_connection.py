"""AZURE_STORAGE_CONNECTION_STRING read as Azure's SDKs and CLI read it; its key or SAS never
shown (repr, errors)."""

from __future__ import annotations

import pytest

from mcsync.errors import UsageError
from mcsync.stores.azure import CONNECTION_STRING, Connection, connection_from_env

KEY = "c2VjcmV0LWtleS1vZi10aGUtYWNjb3VudA=="  # base64, no one's


def conn(text: str, **env: str) -> Connection | None:
    return connection_from_env({CONNECTION_STRING: text, **env})


def test_unset_is_none():
    assert connection_from_env({}) is None


def test_an_account_key_on_azures_own_endpoint():
    c = conn(f"DefaultEndpointsProtocol=https;AccountName=acct;AccountKey={KEY};"
             "EndpointSuffix=core.windows.net")
    assert c == Connection("acct", "https://acct.blob.core.windows.net", KEY)
    assert c is not None and KEY not in repr(c)


def test_protocol_and_suffix_default_as_azure_defines_them():
    assert conn(f"AccountName=acct;AccountKey={KEY}").endpoint == (  # type: ignore[union-attr]
        "https://acct.blob.core.windows.net")
    c = conn(f"DefaultEndpointsProtocol=http;AccountName=a;AccountKey={KEY};"
             "EndpointSuffix=core.chinacloudapi.cn")
    assert c is not None and c.endpoint == "http://a.blob.core.chinacloudapi.cn"


def test_azurites_form_keeps_its_blob_endpoint():
    c = conn(f"DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey={KEY};"
             "BlobEndpoint=http://127.0.0.1:10999/devstoreaccount1;")
    assert c == Connection("devstoreaccount1", "http://127.0.0.1:10999/devstoreaccount1", KEY)


def test_a_sas_string_names_its_account_by_its_endpoint():
    c = conn("BlobEndpoint=https://acct.blob.core.windows.net/;"
             "SharedAccessSignature=sv=2024-01-01&sp=rl&sig=SECRET%3D")
    assert c is not None and (c.account, c.account_key) == ("acct", None)
    assert c.credential() == {"sas_token": "sv=2024-01-01&sp=rl&sig=SECRET%3D",
                              "expires_at": None}
    assert "SECRET" not in repr(c)


def test_the_string_wins_over_the_variables_which_fill_what_it_lacks():
    c = conn("BlobEndpoint=http://127.0.0.1:1/x;SharedAccessSignature=sig=S",
             AZURE_STORAGE_ACCOUNT_NAME="named", AZURE_STORAGE_ACCOUNT_KEY=KEY)
    assert c is not None and (c.account, c.account_key, c.sas) == ("named", None, "sig=S")
    c = conn("AccountName=a", AZURE_STORAGE_ACCOUNT_KEY=KEY)
    assert c is not None and c.account_key == KEY


def test_development_storage_is_azurite_on_its_port():
    c = conn("UseDevelopmentStorage=true")
    assert c is not None and c.endpoint == "http://127.0.0.1:10000/devstoreaccount1"


@pytest.mark.parametrize(("text", "why"), [
    ("garbage", "part 1 is not Name=value"),
    (f"AccountName=a;AccountKey={KEY};;x", "part 3 is not Name=value"),
    ("AccountName=a", "neither AccountKey nor SharedAccessSignature"),
    (f"AccountKey={KEY}", "neither AccountName nor BlobEndpoint"),
    ("AccountName=a;AccountKey=not base64!", "AccountKey is not base64"),
    (f"AccountName=a;AccountKey={KEY};DefaultEndpointsProtocol=ftp", "neither http nor https"),
    (f"AccountName=a;AccountKey={KEY};BlobEndpoint=127.0.0.1:1", "not an http(s) URL"),
])
def test_a_malformed_string_names_the_variable_and_the_cause_not_the_value(text, why):
    with pytest.raises(UsageError) as raised:
        conn(text)
    message = str(raised.value)
    assert message.startswith(f"{CONNECTION_STRING} is malformed: ") and why in message
    assert KEY not in message and "\n" not in message
