"""Bytes damaged between mcsync and the target are refused by the target, never stored: every
PUT and UploadPart carries a checksum that SeaweedFS verifies on receipt."""

from __future__ import annotations

import pytest

import mcsync
from testbed.servers import S3Endpoint

from .helpers import payload, read_bucket, write_tree
from .proxy import CorruptingProxy

MiB = 1 << 20


def open_uploads(ep: S3Endpoint, bucket: str) -> list[str]:
    return [u["Key"] for u in ep.client().list_multipart_uploads(Bucket=bucket).get("Uploads", [])]


def test_bytes_damaged_on_the_way_are_refused(seaweed, tmp_path, monkeypatch, bucket_factory):
    objects = {
        "data/small.bin": payload(1 * MiB + 3, 1),  # one PUT (obstore)
        "data/big.bin": payload(12 * MiB, 2),  # three UploadParts (botocore)
        "other.bin": payload(4000, 3),  # not damaged
    }
    write_tree(tmp_path / "src", objects)
    bucket = bucket_factory(seaweed)
    with CorruptingProxy(seaweed.url, marker="/data/").running() as proxy:
        via = S3Endpoint(proxy.url, seaweed.access_key, seaweed.secret_key)
        for k, v in via.meta_env().items():
            monkeypatch.setenv(k, v)
        report = mcsync.sync(str(tmp_path / "src"), f"meta://{bucket}/", part_size=5 * MiB)
    assert any("uploadId=" in line for line in proxy.damaged), proxy.damaged  # a part
    assert any("uploadId=" not in line for line in proxy.damaged), proxy.damaged  # a PUT
    failed = dict(report.failures)
    assert set(failed) == {"data/small.bin", "data/big.bin"}, report.failures
    for key, error in failed.items():
        assert key in error and "\n" not in error
        assert "BadDigest" in error, error
    # nothing damaged became visible, and no upload was left open
    assert read_bucket(seaweed, bucket) == {"other.bin": objects["other.bin"]}
    assert open_uploads(seaweed, bucket) == []

    # the same sync without the damage copies them, byte for byte
    for k, v in seaweed.meta_env().items():
        monkeypatch.setenv(k, v)
    again = mcsync.sync(str(tmp_path / "src"), f"meta://{bucket}/", part_size=5 * MiB)
    assert again.ok and again.objects_copied == 2
    assert read_bucket(seaweed, bucket) == objects


@pytest.mark.parametrize("server", ["moto", "seaweed"])
def test_undamaged_bytes_round_trip_with_checksums(request, server, tmp_path, monkeypatch,
                                                   bucket_factory):
    """The checksum headers are accepted (and, by SeaweedFS, verified) on the normal path."""
    ep: S3Endpoint = request.getfixturevalue(server)
    objects = {"a/one-part.bin": payload(3 * MiB, 4), "a/parts.bin": payload(11 * MiB + 5, 5),
               "empty": b""}
    write_tree(tmp_path / "src", objects)
    bucket = bucket_factory(ep)
    for k, v in ep.meta_env().items():
        monkeypatch.setenv(k, v)
    report = mcsync.sync(str(tmp_path / "src"), f"meta://{bucket}/", part_size=5 * MiB)
    assert report.ok and report.objects_copied == 3
    assert read_bucket(ep, bucket) == objects


@pytest.mark.parametrize("damage", [False, True])
def test_endpoint_refusing_crc32c_gets_content_md5(damage, seaweed, tmp_path, monkeypatch,
                                                   caplog, bucket_factory):
    """An S3 implementation that refuses x-amz-checksum-crc32c (AWS does for a part of an upload
    created without the algorithm) is sent Content-MD5 instead, after one refusal per part in
    flight; the target still verifies it (SeaweedFS checks Content-MD5: with damage, BadDigest)."""
    objects = {"data/big.bin": payload(21 * MiB, 6)}
    write_tree(tmp_path / "src", objects)
    bucket = bucket_factory(seaweed)
    proxy = CorruptingProxy(seaweed.url, marker="/data/" if damage else None,
                            refuse_header="x-amz-checksum-crc32c")
    with proxy.running():
        via = S3Endpoint(proxy.url, seaweed.access_key, seaweed.secret_key)
        for k, v in via.meta_env().items():
            monkeypatch.setenv(k, v)
        report = mcsync.sync(str(tmp_path / "src"), f"meta://{bucket}/", part_size=5 * MiB,
                             part_concurrency=2)
    # the first wave of parts in flight was refused, later parts went with Content-MD5 at once
    assert 1 <= len(proxy.refused) <= 2, proxy.refused
    fallbacks = [r for r in caplog.records if "refuses x-amz-checksum-crc32c" in r.message]
    assert len(fallbacks) == 1 and proxy.url in fallbacks[0].message
    assert seaweed.secret_key not in caplog.text
    if damage:
        assert proxy.damaged
        assert [k for k, _ in report.failures] == ["data/big.bin"]
        assert "BadDigest" in report.failures[0][1]
        assert read_bucket(seaweed, bucket) == {}
    else:
        assert report.ok and read_bucket(seaweed, bucket) == objects
    assert open_uploads(seaweed, bucket) == []
