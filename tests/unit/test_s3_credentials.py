"""Expiring keys, the pure pieces: the error table, ``Keys`` over botocore's refreshable
credentials, the store's renewal bookkeeping (no server: errors raised by hand), and the
meta:// ``credential_process`` setting."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import obstore.exceptions as obstore_exc
import pytest
from aiobotocore.credentials import AioRefreshableCredentials
from botocore.exceptions import ClientError

from mcsync.errors import (
    AccessDenied,
    CredentialsExpired,
    Permanent,
    Transient,
    Unreachable,
    UsageError,
)
from mcsync.stores.registry import meta_settings
from mcsync.stores.s3 import S3Store
from mcsync.stores.s3_errors import Answer, answer_of, translate, unclear_refusal
from mcsync.stores.s3_keys import Keys, KeySource, S3Credentials

SECRET = "s3cr3t-MARK"


def client_error(code: str | None, status: int) -> ClientError:
    error = {"Code": code or str(status), "Message": "m"}
    return ClientError({"Error": error, "ResponseMetadata": {"HTTPStatusCode": status}}, "Op")


def obstore_error(code: str | None, status: int = 403) -> Exception:
    body = f"<Error><Code>{code}</Code></Error>" if code else ""
    return obstore_exc.PermissionDeniedError(
        f"Server returned non-2xx status code: {status} Forbidden: {body}")


@pytest.mark.parametrize("code", ["ExpiredToken", "TokenRefreshRequired", "InvalidToken"])
@pytest.mark.parametrize("sdk", [client_error, obstore_error])
def test_expired_token_answers_are_credentials_expired(code, sdk):
    error = translate(sdk(code, 403), "meta://b/k", "b")
    assert type(error) is CredentialsExpired
    assert isinstance(error, Transient)
    assert code in str(error)


@pytest.mark.parametrize("sdk", [client_error, obstore_error])
def test_request_expired_is_transient_and_unknown_keys_are_denied(sdk):
    assert type(translate(sdk("RequestExpired", 400), "w", "b")) is Transient
    assert type(translate(sdk("InvalidAccessKeyId", 403), "w", "b")) is AccessDenied


@pytest.mark.parametrize(("answer", "unclear"), [
    (Answer("InvalidAccessKeyId", 403), True),
    (Answer(None, 403), True),  # obstore's HEAD: no body
    (Answer("403", 403), True),  # botocore's HEAD
    (Answer("AccessDenied", 403), False),
    (Answer("SignatureDoesNotMatch", 403), False),
    (Answer(None, 404), False),
    (None, False),
])
def test_unclear_refusals(answer, unclear):
    assert unclear_refusal(answer) is unclear


def test_answer_of_both_sdks():
    assert answer_of(client_error("ExpiredToken", 403)) == Answer("ExpiredToken", 403, "m")
    assert answer_of(obstore_error(None)) == Answer(None, 403)
    assert answer_of(ValueError("x")) is None


# -- Keys ---------------------------------------------------------------------------------------


class Source:
    """A refresh function for botocore's refreshable credentials: a new key each call."""

    def __init__(self, ttl_s: float = 3600, same: bool = False) -> None:
        self.calls = 0
        self.ttl_s = ttl_s
        self.same = same

    def metadata(self) -> dict[str, Any]:
        self.calls += 1
        n = 1 if self.same else self.calls
        expiry = datetime.now(UTC) + timedelta(seconds=self.ttl_s)
        return {"access_key": f"AKID{n}", "secret_key": f"{SECRET}{n}", "token": f"tok{n}",
                "expiry_time": expiry.isoformat()}

    async def refresh(self) -> dict[str, Any]:
        return self.metadata()

    def credentials(self) -> Any:
        return AioRefreshableCredentials.create_from_metadata(self.metadata(), self.refresh,
                                                              "test")


def test_fixed_keys_give_obstore_keys_that_never_expire():
    keys = Keys(S3Credentials("AKIDX", SECRET, "tok"))
    assert keys.obstore_provider()() == {"access_key_id": "AKIDX", "secret_access_key": SECRET,
                                         "token": "tok", "expires_at": None}
    assert not keys.anonymous
    assert Keys().anonymous
    assert SECRET not in repr(keys) and "AKIDX" not in repr(keys)


def test_refreshable_keys_give_obstore_their_expiry_and_are_renewed_when_forced():
    async def go() -> None:
        source = Source()
        keys = Keys(refreshable=source.credentials())
        got = await keys.obstore_provider()()
        assert got["access_key_id"] == "AKID1" and got["token"] == "tok1"
        expires = got["expires_at"]
        assert expires.tzinfo is not None
        assert timedelta(minutes=59) < expires - datetime.now(UTC) <= timedelta(hours=1)
        assert await keys.force_refresh() is True
        assert (await keys.current())[0].access_key_id == "AKID2"
        assert source.calls == 2
        assert SECRET not in repr(keys)

    asyncio.run(go())


def test_a_renewal_that_keeps_the_key_says_so():
    async def go() -> None:
        keys = Keys(refreshable=Source(same=True).credentials())
        assert await keys.force_refresh() is False

    asyncio.run(go())


# -- who signs, for server-side copy ------------------------------------------------------------


def test_who_signs_is_known_from_what_a_store_is_given() -> None:
    given = S3Credentials("AKIDX", SECRET)
    env = {"AWS_ACCESS_KEY_ID": "AKENV", "AWS_SECRET_ACCESS_KEY": SECRET}
    assert KeySource.of(given, None, None, env).identity == "AKIDX"
    assert KeySource.of(None, "get-keys --secret s", None, env).identity == (
        "process:get-keys --secret s")
    # the environment's keys when no profile is named (the chain's first step)...
    assert KeySource.of(None, None, None, env).fixed == S3Credentials("AKENV", SECRET)
    assert KeySource.of(S3Credentials(), None, None, env).identity == "AKENV"
    # ...else the chain, named by its profile: the key it resolves to is known only later
    assert KeySource.of(None, None, "ml", env).identity == "chain:ml"
    assert KeySource.of(None, None, None, {**env, "AWS_PROFILE": "p"}).identity == "chain:p"
    assert KeySource.of(None, None, None, {}).identity == "chain:"
    assert "get-keys" not in repr(KeySource.of(None, "get-keys --secret s", None, {}))


def test_stores_copy_server_side_on_one_endpoint_as_one_signer_before_any_request() -> None:
    def store(url: str, key: str, bucket: str = "b") -> S3Store:
        return S3Store(scheme="s3", bucket=bucket, prefix="", endpoint_url=url,
                       region="us-east-1", credentials=S3Credentials(key, SECRET))

    a = store("http://127.0.0.1:1", "AK")
    assert a.can_copy_from(store("http://127.0.0.1:1/", "AK", "other"))
    assert not a.can_copy_from(store("http://127.0.0.1:2", "AK"))
    assert not a.can_copy_from(store("http://127.0.0.1:1", "AK2"))


# -- the store's bookkeeping --------------------------------------------------------------------


def store_with(keys: Keys) -> S3Store:
    store = S3Store(scheme="meta", bucket="b", prefix="", endpoint_url="http://127.0.0.1:1",
                    region="us-east-1")
    store._clients._keys = keys
    return store


def refuse(store: S3Store, exc: Exception) -> Exception:
    with pytest.raises(Exception) as info, store.translating("k"):
        raise exc
    assert info.value.__cause__ is exc
    return info.value


def test_many_refusals_of_one_expiry_ask_for_one_renewal():
    async def go() -> None:
        source = Source()
        store = store_with(Keys(refreshable=source.credentials()))
        for _ in range(5):
            assert isinstance(refuse(store, client_error("ExpiredToken", 403)),
                              CredentialsExpired)
        # one more request, out while the renewal runs and refused after it: no new renewal
        with pytest.raises(CredentialsExpired), store.translating("k"):
            await store._clients._renew()
            raise client_error("ExpiredToken", 403)
        assert store._clients._renewals.wanted is False
        await store._clients._renew()
        assert source.calls == 2 and store._clients._renewals.generation == 1

    asyncio.run(go())


def test_unclear_refusals_allow_one_renewal_then_deny():
    async def go() -> None:
        source = Source()
        store = store_with(Keys(refreshable=source.credentials()))
        assert isinstance(refuse(store, obstore_error(None)), CredentialsExpired)
        await store._clients._renew()
        error = refuse(store, obstore_error("InvalidAccessKeyId"))
        assert type(error) is AccessDenied
        assert source.calls == 2

    asyncio.run(go())


def test_fixed_keys_refused_as_expired_are_denied():
    store = store_with(Keys(S3Credentials("AKIDX", SECRET)))
    error = refuse(store, client_error("ExpiredToken", 403))
    assert type(error) is AccessDenied and "cannot be renewed" in str(error)
    assert type(refuse(store, client_error("InvalidAccessKeyId", 403))) is AccessDenied
    assert store._clients._renewals.wanted is False


# -- meta:// settings ---------------------------------------------------------------------------


def test_credential_process_from_the_config_file_and_the_environment(tmp_path: Path):
    config = tmp_path / "config.toml"
    config.write_text('[meta.default]\nendpoint_url = "http://e"\n'
                      'credential_process = "/bin/creds --role x"\n')
    assert meta_settings({}, config)["credential_process"] == "/bin/creds --role x"
    env = {"MCSYNC_META_CREDENTIAL_PROCESS": "/bin/other"}
    assert meta_settings(env, config)["credential_process"] == "/bin/other"


def test_keys_and_a_credential_process_together_are_refused(tmp_path: Path):
    config = tmp_path / "config.toml"
    config.write_text('[meta.default]\nendpoint_url = "http://e"\ncredential_process = "c"\n')
    with pytest.raises(UsageError, match="both access_key_id and credential_process"):
        meta_settings({"MCSYNC_META_ACCESS_KEY_ID": "AKIDX"}, config)


def test_unknown_settings_are_still_refused(tmp_path: Path):
    config = tmp_path / "config.toml"
    config.write_text('[meta.default]\nendpoint_url = "http://e"\ncredentials_process = "c"\n')
    with pytest.raises(UsageError, match="unknown setting 'credentials_process'"):
        meta_settings({}, config)


def test_an_untrusted_certificate_is_named_as_the_cause():
    """Either SDK's handshake failure (rustls in obstore, OpenSSL in botocore) says the
    certificate is not trusted and where a private CA goes, not just "cannot connect"."""
    from botocore.exceptions import EndpointConnectionError, SSLError

    obstore_text = ("Generic S3 error: Error performing HEAD https://127.0.0.1:1/b/k - HTTP "
                    "error: error sending request\n\nDebug source:\n ... error: "
                    "InvalidCertificate(\n UnknownIssuer,\n ),")
    boto = SSLError(endpoint_url="https://127.0.0.1:1/b/k", error="[SSL: "
                    "CERTIFICATE_VERIFY_FAILED] certificate verify failed: unable to get "
                    "local issuer certificate (_ssl.c:1006)")
    for exc, reason in ((obstore_exc.GenericError(obstore_text), "UnknownIssuer"),
                        (boto, "unable to get local issuer certificate")):
        error = translate(exc, "s3://b/k", "b")
        assert type(error) is Permanent  # no retry makes it trusted
        assert str(error) == (f"s3://b/k: the endpoint's TLS certificate is not trusted "
                              f"({reason}): a private CA goes in AWS_CA_BUNDLE (meta://: "
                              "MCSYNC_META_CA_BUNDLE)")
    refused = translate(EndpointConnectionError(endpoint_url="https://127.0.0.1:1/"), "s3://b/",
                        "b")
    assert type(refused) is Unreachable  # a refused connection is still worth a retry
    assert str(refused) == "s3://b/: connection failed: EndpointConnectionError"
