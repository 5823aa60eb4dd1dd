"""The CRT's S3 client (CopyObject, the multipart upload requests), its pure pieces: where a
request goes, how its answers and errors are read, the retry policy it is given. The requests
themselves are tested against moto and SeaweedFS (tests/stores,
tests/stores/s3/test_server_copy.py) and over https (tests/stores/s3/test_tls.py)."""

from __future__ import annotations

import asyncio

import pytest
from awscrt import s3

from mcsync.errors import (
    AccessDenied,
    CredentialsExpired,
    NoSuchBucket,
    NotFound,
    Permanent,
    PreconditionFailed,
    Throttled,
    Transient,
    Unreachable,
)
from mcsync.retry import RetryPolicy
from mcsync.stores.s3_clients import ClientSettings
from mcsync.stores.s3_crt import crt_retry_config
from mcsync.stores.s3_errors import S3Answered, answer_of, crt_answer, crt_error, translate
from mcsync.stores.s3_requests import Endpoint, Response, _checked, first, xml_fields


def settings(url: str | None, *, path_style: bool = True) -> ClientSettings:
    return ClientSettings("b", url, "us-east-1", path_style, 16, RetryPolicy())


def test_path_style_keeps_the_port_and_encodes_the_key_as_botocore_does() -> None:
    ep = Endpoint.of(settings("http://127.0.0.1:9000"))
    assert not ep.tls
    assert ep.target("b", "dir/ü b+c.bin") == ("127.0.0.1:9000", "/b/dir/%C3%BC%20b%2Bc.bin")
    assert ep.target("b", "a~b/x") == ("127.0.0.1:9000", "/b/a~b/x")


def test_virtual_hosted_style_puts_the_bucket_in_the_host() -> None:
    ep = Endpoint.of(settings("https://meta.example:8443", path_style=False))
    assert ep.tls
    assert ep.target("ckpt", "run/1") == ("ckpt.meta.example:8443", "/run/1")


def test_an_endpoint_s_own_path_comes_first() -> None:
    ep = Endpoint.of(settings("https://gw.example/s3/"))
    assert ep.target("b", "k") == ("gw.example", "/s3/b/k")


def test_no_endpoint_is_refused() -> None:
    with pytest.raises(ValueError, match="explicit endpoint"):
        Endpoint.of(settings(None))


def test_the_etag_of_a_copy_result() -> None:
    body = (b'<?xml version="1.0" encoding="UTF-8"?><CopyObjectResult '
            b'xmlns="http://s3.amazonaws.com/doc/2006-03-01/"><LastModified>2026-12-02T01:00:00Z'
            b'</LastModified><ETag>"9b2cf535f27731c974343645a3985328"</ETag></CopyObjectResult>')
    assert first(xml_fields(body, "ETag"), "ETag") == '"9b2cf535f27731c974343645a3985328"'
    assert first(xml_fields(b"<CopyObjectResult/>", "ETag"), "ETag") is None
    assert first(xml_fields(b"", "ETag"), "ETag") is None  # no XML: no ETag, not an error


def test_the_parts_of_a_list_parts_page_in_order() -> None:
    body = (b'<ListPartsResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/"><UploadId>u</UploadId>'
            b'<NextPartNumberMarker>7</NextPartNumberMarker><IsTruncated>true</IsTruncated>'
            b'<Part><PartNumber>3</PartNumber><ETag>"a"</ETag><Size>5242880</Size></Part>'
            b'<Part><PartNumber>7</PartNumber><ETag>"b"</ETag><Size>12</Size></Part>'
            b'</ListPartsResult>')
    fields = xml_fields(body, "PartNumber", "ETag", "Size", "IsTruncated", "NextPartNumberMarker")
    assert fields["PartNumber"] == ["3", "7"] and fields["ETag"] == ['"a"', '"b"']
    assert fields["Size"] == ["5242880", "12"]
    assert (first(fields, "IsTruncated"), first(fields, "NextPartNumberMarker")) == ("true", "7")


def test_a_200_that_carries_an_error_is_the_error() -> None:
    # S3 answers CompleteMultipartUpload (and copies) with 200 before it knows how they end.
    body = (b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>InternalError</Code>'
            b'<Message>We encountered an internal error.</Message></Error>')
    with pytest.raises(S3Answered) as raised:
        _checked(Response(200, {}, body), "ETag")
    assert isinstance(translate(raised.value, "s3://b/k", "b"), Transient)


@pytest.mark.parametrize(("status", "code", "kind"), [
    (404, "NoSuchKey", NotFound), (404, "NoSuchBucket", NoSuchBucket),
    (412, "PreconditionFailed", PreconditionFailed), (403, "SignatureDoesNotMatch", AccessDenied),
    (400, "ExpiredToken", CredentialsExpired), (503, "SlowDown", Throttled),
    (500, "InternalError", Transient), (404, None, NotFound), (400, "InvalidRequest", Permanent),
])
def test_error_answers_go_through_the_one_table(status: int, code: str | None,
                                                kind: type) -> None:
    body = (f"<Error><Code>{code}</Code><Message>told</Message></Error>".encode()
            if code else None)
    exc = S3Answered(crt_answer(status, body))
    assert answer_of(exc) == exc.answer
    error = translate(exc, "s3://b/k", "b")
    assert type(error) is kind
    assert str(error).startswith("s3://b/k: ")


def test_an_error_body_that_is_no_xml_still_has_its_status() -> None:
    answer = crt_answer(502, b"<html>Bad Gateway")
    assert (answer.code, answer.status) == (None, 502)
    assert isinstance(translate(S3Answered(answer), "s3://b/k", "b"), Transient)


@pytest.mark.parametrize(("name", "kind"), [
    ("AWS_IO_SOCKET_CONNECTION_REFUSED", Unreachable), ("AWS_IO_DNS_INVALID_NAME", Unreachable),
    ("AWS_ERROR_HTTP_CONNECTION_CLOSED", Unreachable),
    ("AWS_IO_TLS_ERROR_NEGOTIATION_FAILURE", Permanent),
    ("AWS_IO_TLS_ERROR_WRITE_FAILURE", Unreachable),  # the connection broke, not the trust
    ("AWS_ERROR_S3_INTERNAL_ERROR", Transient),
    ("AWS_ERROR_S3_SLOW_DOWN", Throttled),  # a 503 SlowDown the CRT's own retries gave up on
])
def test_the_crt_s_own_errors(name: str, kind: type) -> None:
    error = crt_error(name, "s3://b/k")
    assert type(error) is kind
    assert str(error).startswith("s3://b/k: ") and name in str(error)


def test_the_retry_policy_of_the_sdks_is_the_crt_s_too() -> None:
    config = crt_retry_config(RetryPolicy(sdk_attempts=3, init_backoff_s=0.1, max_backoff_s=20))
    assert (config.max_retries, config.backoff_scale_factor_ms, config.max_backoff_secs) == (
        2, 100, 20)
    assert config.retry_mode == s3.S3RetryMode.STANDARD
    # one try: no retries (the CRT's 0 would mean its default of 5)
    assert crt_retry_config(RetryPolicy(sdk_attempts=1)).retry_mode == s3.S3RetryMode.NONE
    # no backoff asked: 1 ms (0 would mean the CRT's 500 ms)
    assert crt_retry_config(RetryPolicy.immediate(3)).backoff_scale_factor_ms == 1



@pytest.mark.parametrize(("url", "crt_sends_bodies"), [
    ("http://127.0.0.1:9000", True),  # loopback: no one on the way
    ("https://meta.example:8443", True),  # TLS
    ("http://meta.example:9000", False),  # plain HTTP across a network: the payload is signed
])
def test_bodies_that_must_be_signed_stay_with_botocore(url: str, crt_sends_bodies: bool) -> None:
    """The store's clients hand out transports (no request is sent): the CRT sends the
    requests without a body to any explicit endpoint, and bodies only where the payload needs
    no SHA-256 (the CRT's S3 signer sends UNSIGNED-PAYLOAD); botocore sends the others."""
    from mcsync.stores.s3 import S3Store
    from mcsync.stores.s3_keys import S3Credentials
    from mcsync.stores.s3_transport import BotocoreTransport, RequestsTransport

    async def senders() -> tuple[object, object]:
        store = S3Store(scheme="meta", bucket="b", prefix="", endpoint_url=url,
                        region="us-east-1", credentials=S3Credentials("AK", "SK"))
        try:
            clients = store._clients
            return await clients.sender(), await clients.sender(body=True)
        finally:
            await store.aclose()

    plain, with_body = asyncio.run(senders())
    assert type(plain) is RequestsTransport
    assert type(with_body) is (RequestsTransport if crt_sends_bodies else BotocoreTransport)
