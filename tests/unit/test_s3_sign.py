"""The wire's SigV4 signer against the AWS CRT's, the signer it replaced: the same request at
the same instant must carry the same Authorization header. Servers check the signatures too
(tests/stores/s3/test_wire.py and every S3 test that sends a part); this pins the canonical
form where they are lenient, or where no test's request reaches (tokens, odd keys, queries)."""

from __future__ import annotations

import calendar
from datetime import UTC, datetime

import pytest
from awscrt import auth
from awscrt import http as crt_http

from mcsync.stores.s3_keys import S3Credentials
from mcsync.stores.s3_sign import sign

WHEN = datetime(2026, 12, 7, 23, 59, 58, tzinfo=UTC)


def crt_signed(method: str, target: str, headers: list[tuple[str, str]],
               creds: S3Credentials, region: str) -> dict[str, str]:
    provider = auth.AwsCredentialsProvider.new_static(
        creds.access_key_id or "", creds.secret_access_key or "", creds.session_token)
    config = auth.AwsSigningConfig(
        algorithm=auth.AwsSigningAlgorithm.V4,
        signature_type=auth.AwsSignatureType.HTTP_REQUEST_HEADERS,
        credentials_provider=provider, region=region, service="s3", date=WHEN,
        use_double_uri_encode=False, should_normalize_uri_path=False,
        signed_body_value=auth.AwsSignedBodyValue.UNSIGNED_PAYLOAD,
        signed_body_header_type=auth.AwsSignedBodyHeaderType.X_AMZ_CONTENT_SHA_256)
    request = crt_http.HttpRequest(method, target, crt_http.HttpHeaders(headers))
    signed = auth.aws_sign_request(request, config).result(timeout=10)
    return {name.lower(): value for name, value in signed.headers}


KEYS = S3Credentials("AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY")
TOKENED = S3Credentials("ASIAEXAMPLE", "c2VjcmV0/with+slash", "FwoGZXIvYXdzEBYaD+/token==")


@pytest.mark.parametrize(("method", "path", "query", "extra", "creds", "region"), [
    ("GET", "/bucket/d/obj-000001.bin", "", [("Range", "bytes=0-8388607"),
                                             ("If-Match", '"9b2cf535f27731c974343645a3985328"')],
     KEYS, "us-east-1"),
    ("PUT", "/bucket/ckpt/model-00001-of-00002.safetensors",
     "partNumber=12&uploadId=2~Zm9v%2Bbar%2F%3D%3D",
     [("Content-Length", "8388608"), ("x-amz-checksum-crc32c", "yZRlqg==")], TOKENED,
     "eu-central-1"),
    ("POST", "/bucket/a%20b/%E2%82%AC/x~y_z.bin", "uploads", [("Content-Length", "0")], KEYS,
     "us-west-2"),
    ("GET", "/", "list-type=2&prefix=runs%2F7%2F&delimiter=%2F&max-keys=1000&"
                 "continuation-token=1%2BAbC%3D&start-after=runs%2F7%2Fz",
     [("Content-Length", "0")], TOKENED, "us-east-1"),
    ("POST", "/bucket/k", "uploadId=abc", [("Content-Length", "312"),
                                            ("Content-Type", "application/xml"),
                                            ("X-Amz-Meta-Note", "  two   spaces  ")],
     KEYS, "ap-south-1"),
])
def test_the_same_signature_as_the_crts(method: str, path: str, query: str,
                                        extra: list[tuple[str, str]], creds: S3Credentials,
                                        region: str) -> None:
    headers = [("Host", "bucket.127.0.0.1:9000"), ("User-Agent", "mcsync/0.1.0 wire"), *extra]
    target = f"{path}?{query}" if query else path
    want = crt_signed(method, target, headers, creds, region)
    got = {name.lower(): value for name, value in sign(
        method, path, query, headers, creds, region, now=calendar.timegm(WHEN.timetuple()))}
    assert got["authorization"] == want["authorization"]
    assert got["x-amz-date"] == want["x-amz-date"] == "20261207T235958Z"
    assert got.get("x-amz-security-token") == creds.session_token


def test_a_changed_header_or_key_changes_the_signature() -> None:
    headers = [("Host", "h"), ("Range", "bytes=0-9")]
    at = calendar.timegm(WHEN.timetuple())
    first = dict(sign("GET", "/b/k", "", headers, KEYS, "us-east-1", now=at))["Authorization"]
    assert dict(sign("GET", "/b/k", "", [("Host", "h"), ("Range", "bytes=0-8")], KEYS,
                     "us-east-1", now=at))["Authorization"] != first
    other = S3Credentials(KEYS.access_key_id, "another-secret")
    assert dict(sign("GET", "/b/k", "", headers, other, "us-east-1",
                     now=at))["Authorization"] != first
    # The secret is never in a header.
    assert all(KEYS.secret_access_key not in v
               for _, v in sign("GET", "/b/k", "", headers, KEYS, "us-east-1", now=at))
