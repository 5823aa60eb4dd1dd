"""gs:// (fake-gcs-server over https) and az:// (Azurite) sources relayed to Meta Storage
(SeaweedFS) through the client, with the s3 → meta path's guarantees: byte-identical objects,
the manifest's xxh3 chunk hashes equal to a local hash of the same bytes, every part checked by
the target on receipt, and a run killed with SIGKILL resumed without re-sending what the
target had acknowledged."""

from __future__ import annotations

import contextlib
import json
import signal
import sqlite3
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import xxhash

from mcsync.hashing import object_digest
from testbed.servers import S3Endpoint

from .helpers import crashed_run, new_bucket, payload, read_bucket, run_cli
from .proxy import CorruptingProxy

MiB = 1 << 20
PART = 5 * MiB
CONCURRENCY = 4
OBJECTS = {
    "data/model-00001-of-00002.safetensors": payload(16 * MiB + 3, 1),  # 4 parts
    "data/model-00002-of-00002.safetensors": payload(11 * MiB, 2),  # 3 parts
    "data/notes.txt": b"step 1000",  # one PUT
    "data/tokenizer.bin": payload(300_000, 3),
}
TOTAL = sum(map(len, OBJECTS.values()))


@dataclass
class Source:
    url: str  # the source's address, ending in "/"
    env: dict[str, str]


def _gs(request: pytest.FixtureRequest) -> Source:
    from testbed.gcs import create_bucket, upload

    server = request.getfixturevalue("gcs_fake_server")
    bucket = f"relay-{uuid.uuid4().hex[:10]}"
    create_bucket(server, bucket)
    for key, data in OBJECTS.items():
        upload(server, bucket, key, data)
    return Source(f"gs://{bucket}/", server.env())


def _az(request: pytest.FixtureRequest) -> Source:
    azurite = request.getfixturevalue("azurite")
    container = f"relay-{uuid.uuid4().hex[:10]}"
    azurite.create_container(container)
    for key, data in OBJECTS.items():
        azurite.upload(container, key, data)
    return Source(f"az://{container}/", azurite.env())


@pytest.fixture(params=["gs", "az"])
def source(request: pytest.FixtureRequest) -> Source:
    return _gs(request) if request.param == "gs" else _az(request)


def args(src: Source, dst: str, manifest: Path) -> tuple[str, ...]:
    return ("sync", src.url, dst, "--part-size", "5MiB", "-c", str(CONCURRENCY), "--quiet",
            "--json", "--manifest", str(manifest))


def records(manifest: Path) -> dict[str, tuple[Any, ...]]:
    with contextlib.closing(sqlite3.connect(manifest)) as db:
        return {row[0]: row[1:] for row in db.execute(
            "SELECT key, block_size, block_hashes, xxh3 FROM objects")}


def assert_hashes_are_the_bytes(manifest: Path, *, whole_adopted: bool = False) -> None:
    """Every object's recorded chunk digests are the xxh3-128 of its bytes, chunk by chunk,
    computed here from the source's bytes. ``whole_adopted``: an object sent in one request
    may be recorded without digests (its PUT answered, the run killed before the record: no
    journal holds a whole object, so the next run finds it current by size and takes it as
    it is, unread)."""
    got = records(manifest)
    assert set(got) == set(OBJECTS)
    for key, data in OBJECTS.items():
        block_size, block_hashes, xxh3 = got[key]
        if (whole_adopted and len(data) <= PART
                and (block_size, block_hashes, xxh3) == (0, b"", None)):
            continue
        step = block_size or len(data)
        digests = [xxhash.xxh3_128_digest(data[i:i + step])
                   for i in range(0, max(len(data), 1), step)]
        assert block_hashes == b"".join(digests), key
        assert xxh3 == object_digest(digests), key
        if len(data) > PART:
            assert block_size == PART and len(digests) > 1, key  # it went as parts


def test_relayed_byte_for_byte_with_the_hashes_of_its_bytes(source, seaweed, tmp_path):
    bucket = new_bucket(seaweed)
    manifest = tmp_path / "manifest.sqlite"
    result = run_cli(*args(source, f"meta://{bucket}/", manifest),
                     env=source.env | seaweed.meta_env())
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["objects_copied"] == len(OBJECTS) and report["bytes_sent"] == TOTAL
    assert read_bucket(seaweed, bucket) == OBJECTS
    assert_hashes_are_the_bytes(manifest)


def test_each_byte_of_a_gcs_object_is_summed_once(seaweed, tmp_path, request, monkeypatch):
    """GCS keeps every object's CRC32C: a part's sum, checked against it before Complete, and
    a whole object's, checked as the store serves it, are also the checksum header the target
    verifies, not summed a second time."""
    from mcsync import checksums
    from mcsync.stores import gcs
    from testbed.gcs import upload

    summed: list[int] = []
    real = checksums.crc32c_async

    async def counted(data: checksums.Buffer) -> int:
        summed.append(len(data))
        return await real(data)

    monkeypatch.setattr(checksums, "crc32c_async", counted)
    monkeypatch.setattr(gcs, "crc32c_async", counted)  # the store's check of a whole object
    source = _gs(request)
    whole = payload(3 * MiB, 4)  # one PUT, with a checksum header (1 MiB and more)
    upload(request.getfixturevalue("gcs_fake_server"), source.url[5:-1], "data/whole.bin",
           whole)
    bucket = new_bucket(seaweed)
    result = run_cli(*args(source, f"meta://{bucket}/", tmp_path / "m.sqlite"),
                     env=source.env | seaweed.meta_env())
    assert result.exit_code == 0, result.output
    assert read_bucket(seaweed, bucket) == OBJECTS | {"data/whole.bin": whole}
    multipart = [len(data) for data in OBJECTS.values() if len(data) > PART]
    # 7 parts and the whole object, each once (the small objects are checked, not sent with
    # a checksum: under 1 MiB they go by obstore)
    assert sum(n for n in summed if n >= MiB) == sum(multipart) + len(whole)


def test_bytes_damaged_on_the_way_to_the_target_are_refused(source, seaweed, tmp_path):
    """The checksum each PUT and part carries is the one the target verifies: bytes damaged
    after mcsync read them (a proxy flips one) are refused, and nothing of them is stored."""
    bucket = new_bucket(seaweed)
    manifest = tmp_path / "manifest.sqlite"
    with CorruptingProxy(seaweed.url, marker="/data/model-").running() as proxy:
        via = S3Endpoint(proxy.url, seaweed.access_key, seaweed.secret_key)
        result = run_cli(*args(source, f"meta://{bucket}/", manifest),
                         env=source.env | via.meta_env())
    assert proxy.damaged and any("uploadId=" in line for line in proxy.damaged)
    report = json.loads(result.stdout)
    failed = dict((f["key"], f["error"]) for f in report["failures"])
    assert set(failed) == {"data/model-00001-of-00002.safetensors",
                           "data/model-00002-of-00002.safetensors"}, report["failures"]
    assert all("BadDigest" in error for error in failed.values()), failed
    assert seaweed.secret_key not in result.output
    assert set(read_bucket(seaweed, bucket)) == {"data/notes.txt", "data/tokenizer.bin"}
    assert seaweed.client().list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []


@pytest.mark.parametrize("point", ["part:3", "part-done:2", "part-done:5"])
def test_killed_relay_resumes_to_identical_target(point, source, seaweed, tmp_path):
    bucket = new_bucket(seaweed)
    manifest = tmp_path / "manifest.sqlite"
    command = args(source, f"meta://{bucket}/", manifest)
    env = source.env | seaweed.meta_env()
    acked = tmp_path / "acked"
    code = crashed_run(point, *command, env=env, acked=acked).returncode
    assert code == -signal.SIGKILL, f"the run was meant to be killed at {point} (exit {code})"
    for key, data in read_bucket(seaweed, bucket).items():  # visible: complete and correct
        assert data == OBJECTS[key], f"{key} is visible but not what the source holds"

    result = run_cli(*command, env=env)
    assert result.exit_code == 0, result.output
    assert read_bucket(seaweed, bucket) == OBJECTS
    sent_before = int(acked.read_text()) if acked.exists() else 0
    assert sent_before > 0  # the kill came after the target had acknowledged something
    resent = sent_before + json.loads(result.stdout)["bytes_sent"] - TOTAL
    assert resent <= CONCURRENCY * PART, (
        f"killed at {point}: {sent_before} acknowledged before the kill, {resent} re-sent")
    # Parts hashed by two runs, recorded as one object. Killed between an upload's Complete
    # and the manifest's commit, the object is at the target but not recorded: the journal,
    # not its size and time, says it is that upload's result, and gives its digests.
    assert_hashes_are_the_bytes(manifest, whole_adopted=True)
