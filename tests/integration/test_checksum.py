"""`sync --checksum`: objects are compared by content (ETags, recorded xxh3-128 hashes, or both
sides read and hashed), never by size and modification time."""

from __future__ import annotations

import json
import os

import pytest

from .helpers import payload, put_objects, read_bucket, run_cli, write_tree

MiB = 1 << 20


@pytest.fixture(params=["moto", "seaweed"])
def s3ep(request):
    return request.getfixturevalue(request.param)


def sync(src: str, dst: str, *args: str, env: dict[str, str]) -> dict:
    result = run_cli("sync", src, dst, "--part-size", "5MiB", "--json", "-q", *args, env=env)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_same_size_and_mtime_but_other_content(s3ep, tmp_path, bucket_factory):
    ours = {"differs.bin": payload(6 * MiB + 1, 1), "same.bin": payload(3000, 2)}
    theirs = {"differs.bin": payload(6 * MiB + 1, 3), "same.bin": ours["same.bin"]}
    write_tree(tmp_path / "src", ours)
    bucket = bucket_factory(s3ep)
    put_objects(s3ep, bucket, theirs)  # objects mcsync has no record of
    client = s3ep.client()
    for key in ours:  # same size, and the source no newer than the target
        when = client.head_object(Bucket=bucket, Key=key)["LastModified"].timestamp()
        os.utime(tmp_path / "src" / key, (when, when))
    src, dst, env = str(tmp_path / "src"), f"meta://{bucket}/", s3ep.meta_env()

    plain = sync(src, dst, env=env)
    assert plain["objects_copied"] == 0 and plain["objects_compared"] == 0
    assert read_bucket(s3ep, bucket) == theirs  # size + mtime cannot see the difference

    first = sync(src, dst, "--checksum", env=env)
    assert first["objects_compared"] == 2  # both read at both sides
    assert first["bytes_compared"] == 2 * sum(map(len, ours.values()))
    assert [o["key"] for o in first["objects"]] == ["differs.bin"]
    assert first["objects_skipped"] == 1
    assert read_bucket(s3ep, bucket) == ours

    # Now the manifest holds the hashes of both: only the source is read, nothing is sent.
    again = sync(src, dst, "--checksum", env=env)
    assert again["objects_copied"] == 0 and again["bytes_sent"] == 0
    assert again["objects_skipped"] == 2 and again["objects_compared"] == 2
    assert again["bytes_compared"] == sum(map(len, ours.values()))
    assert read_bucket(s3ep, bucket) == ours


@pytest.mark.parametrize("source", ["local", "s3"])
def test_target_tampered_with_identical_size(source, seaweed, tmp_path, bucket_factory):
    objects = {"model.bin": payload(11 * MiB, 4), "config.json": b'{"layers": 32}',
               "untouched.bin": payload(5000, 5)}
    bucket = bucket_factory(seaweed)
    env = seaweed.meta_env()
    if source == "local":
        write_tree(tmp_path / "src", objects)
        src, extra = str(tmp_path / "src"), ()
    else:
        src_bucket = bucket_factory(seaweed)
        put_objects(seaweed, src_bucket, objects)
        src, extra = f"s3://{src_bucket}/", ("--no-server-side-copy",)
        env = env | seaweed.aws_env()
    dst = f"meta://{bucket}/"
    assert sync(src, dst, *extra, env=env)["objects_copied"] == 3

    tampered = bytearray(objects["model.bin"])
    tampered[7 * MiB] ^= 0xFF
    put_objects(seaweed, bucket, {"model.bin": bytes(tampered), "config.json": b'{"layers": 64}'})

    trusting = sync(src, dst, *extra, env=env)  # trusts the manifest: asks the target nothing
    assert trusting["objects_copied"] == 0
    noticed = sync(src, dst, *extra, "--checksum", env=env)
    assert sorted(o["key"] for o in noticed["objects"]) == ["config.json", "model.bin"]
    assert noticed["objects_skipped"] == 1
    assert read_bucket(seaweed, bucket) == objects
    # A file's size and mtime do not name its content, so files are hashed against the record;
    # an S3 source's ETag does, so an unchanged one is decided without a read.
    assert noticed["objects_compared"] == (3 if source == "local" else 0)
