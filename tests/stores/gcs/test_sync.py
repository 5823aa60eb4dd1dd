"""``mcsync sync / ls / plan`` with a gs:// source (each GCS server: the emulator over http,
fake-gcs-server over https) and a Meta Storage (SeaweedFS) or local target, every copy checked
byte for byte."""

from __future__ import annotations

import asyncio
import hashlib
import json

import pytest

from mcsync import checksums
from mcsync.errors import PreconditionFailed
from mcsync.stores.gcs import GCSStore
from testbed.gcs import GCSServer, upload

from .helpers import (
    error_lines,
    open_uploads,
    payload,
    read_bucket,
    read_tree,
    run_cli,
    seed,
    set_wrong_crc32c,
)

MiB = 1 << 20
BIG = 12 * MiB + 12345  # three parts of 5 MiB
KEYS = ["a-b", "a/b", "with space/a b.bin", "unicode/日本語/ファイル.bin", "é/ü.txt",
        "emoji/\U0001f600.bin", "plus+sign.bin", "percent%20literal.bin", "hash#q?.bin",
        "empty.bin"]


def sample() -> dict[str, bytes]:
    objs = {key: payload(0 if key == "empty.bin" else 1000 + 37 * i, i)
            for i, key in enumerate(KEYS)}
    objs["big/model.safetensors"] = payload(BIG, 99)
    return objs


def sync(src: str, dst: str, *extra: str, env: dict[str, str] | None = None,
         code: int = 0) -> dict:
    result = run_cli("sync", src, dst, "--part-size", "5MiB", "--json", "--quiet", *extra,
                     env=env)
    assert result.exit_code == code, result.output
    return json.loads(result.stdout)


class Target:
    """A sync target: a fresh Meta Storage bucket (SeaweedFS) or a local directory."""

    def __init__(self, kind: str, request: pytest.FixtureRequest, tmp_path) -> None:
        self.kind = kind
        if kind == "meta":
            self.ep = request.getfixturevalue("seaweed")
            self.bucket = request.getfixturevalue("bucket_factory")(self.ep)
            self.url = f"meta://{self.bucket}/copy/"
            self.env = self.ep.meta_env()
        else:
            self.root = tmp_path / "target"
            self.url = str(self.root)
            self.env = {}

    def read(self) -> dict[str, bytes]:
        if self.kind == "meta":
            return read_bucket(self.ep, self.bucket, "copy/")
        return read_tree(self.root) if self.root.exists() else {}

    def leftovers(self) -> list[str]:
        """Anything half-written: open multipart uploads, or temporary files."""
        if self.kind == "meta":
            return open_uploads(self.ep, self.bucket)
        if not self.root.exists():
            return []
        return [str(p) for p in self.root.rglob("*") if ".mcsync-tmp-" in p.name]


@pytest.fixture(params=["meta", "local"])
def target(request, tmp_path) -> Target:
    return Target(request.param, request, tmp_path)


@pytest.fixture(scope="module")
def seeded(gcs_server: GCSServer) -> tuple[str, dict[str, bytes]]:
    """One bucket with sample() under ``data/`` in each server, shared by the tests that only
    read it."""
    from testbed.gcs import create_bucket

    bucket = "seeded-sample"
    create_bucket(gcs_server, bucket)
    objs = sample()
    seed(gcs_server, bucket, objs, "data/")
    return bucket, objs


def test_gs_to_target_byte_for_byte_then_nothing_to_do(gcs_env, seeded, target, monkeypatch):
    bucket, objs = seeded
    # Pages of four: a server that pages (fake-gcs-server) lists the 11 objects in three.
    monkeypatch.setattr("mcsync.stores.gcs.LIST_PAGE_SIZE", 4)
    report = sync(f"gs://{bucket}/data/", target.url, env=target.env)
    assert target.read() == objs
    assert report["objects_copied"] == len(objs)
    assert report["bytes_copied"] == sum(map(len, objs.values()))
    big = next(o for o in report["objects"] if o["key"] == "big/model.safetensors")
    assert big["hash_block_size"] == 5 * MiB  # it moved as parts
    if target.kind == "meta":
        assert big["etag"].endswith("-3")  # ... and landed as a three-part multipart upload
    again = sync(f"gs://{bucket}/data/", target.url, env=target.env)
    assert again["objects_copied"] == 0
    assert again["objects_skipped"] == len(objs)
    checked = run_cli("verify", target.url, env=target.env)  # re-read against the manifest
    assert checked.exit_code == 0, checked.output
    assert f"verified {len(objs)} objects: 0 problems" in checked.stderr


@pytest.mark.slow  # seeding 2,000 objects one request each: ~20 s on either server
def test_2000_small_objects(gcs_env, gcs_bucket, seaweed, bucket_factory):
    objs = {f"shard-{i // 100:02d}/item-{i:05d}.json": b'{"i": %d}' % i for i in range(2000)}
    seed(gcs_env, gcs_bucket, objs, "many/")
    dst = bucket_factory(seaweed)
    report = sync(f"gs://{gcs_bucket}/many/", f"meta://{dst}/", env=seaweed.meta_env())
    assert report["objects_copied"] == 2000
    assert read_bucket(seaweed, dst) == objs


def test_ls_and_plan(gcs_env, seeded, seaweed, bucket_factory):
    bucket, objs = seeded
    result = run_cli("ls", f"gs://{bucket}/data/")
    assert result.exit_code == 0, result.output
    lines = [line for line in result.stdout.splitlines() if line.strip()]
    assert [line.split(None, 3)[3] for line in lines] == sorted(objs, key=str.encode)
    assert f"{len(objs)} objects" in result.stderr

    result = run_cli("ls", "--json", f"gs://{bucket}/data/")
    listed = {d["key"]: d for d in map(json.loads, result.stdout.splitlines())}
    assert {k: (d["size"], d["etag"]) for k, d in listed.items()} == {
        k: (len(v), hashlib.md5(v).hexdigest()) for k, v in objs.items()}

    dst = bucket_factory(seaweed)
    result = run_cli("plan", f"gs://{bucket}/data/", f"meta://{dst}/", env=seaweed.meta_env())
    assert result.exit_code == 0, result.output
    (copy_line,) = [line for line in result.stdout.splitlines() if line.startswith("copy ")]
    assert copy_line.split()[1] == str(len(objs))
    assert read_bucket(seaweed, dst) == {}  # a plan moves nothing


def _overwrite_while_copying(monkeypatch, url: str, bucket: str, name: str, *, every_try: bool):
    """Make a writer replace ``name`` in the middle of each copy of it: just before the first
    part past its start is read (the part of the first try, or of every try). Returns the
    contents written and the PreconditionFailed errors the pinned reads raised."""
    real_get, real_read_into = GCSStore.get, GCSStore.read_into
    written: list[bytes] = []
    refused: list[PreconditionFailed] = []
    tries: set[str | None] = set()

    async def replace_before(key, rng, expect, read):
        version = expect.version if expect is not None else None
        if (key == name.rsplit("/", 1)[-1] and rng is not None and rng.start > 0
                and version not in tries and (every_try or not tries)):
            tries.add(version)
            written.append(payload(BIG, 100 + len(written)))
            # In a thread: the emulator answers one request at a time, and may be busy
            # sending this very loop a part that only the loop can read.
            await asyncio.to_thread(upload, url, bucket, name, written[-1])
        try:
            return await read()
        except PreconditionFailed as exc:
            refused.append(exc)
            raise

    async def get(self, key, rng=None, *, expect=None):
        return await replace_before(key, rng, expect,
                                    lambda: real_get(self, key, rng, expect=expect))

    async def read_into(self, key, rng, buf, *, expect=None):  # parts are read into buffers
        return await replace_before(key, rng, expect,
                                    lambda: real_read_into(self, key, rng, buf, expect=expect))

    monkeypatch.setattr(GCSStore, "get", get)
    monkeypatch.setattr(GCSStore, "read_into", read_into)
    return written, refused


def test_object_overwritten_mid_copy_is_copied_again_whole(gcs_env, gcs_bucket, target,
                                                           monkeypatch):
    old = payload(BIG, 1)
    seed(gcs_env, gcs_bucket, {"ckpt/model.bin": old, "ckpt/other.bin": b"other"})
    written, refused = _overwrite_while_copying(monkeypatch, gcs_env, gcs_bucket,
                                                "ckpt/model.bin", every_try=False)
    sync(f"gs://{gcs_bucket}/ckpt/", target.url, env=target.env)
    assert len(written) == 1 and refused  # the read pinned to the planned generation failed
    assert target.read() == {"other.bin": b"other", "model.bin": written[0]}  # the new one
    assert target.leftovers() == []


def test_object_that_keeps_changing_is_deferred_never_committed(gcs_env, gcs_bucket, target,
                                                       monkeypatch):
    seed(gcs_env, gcs_bucket, {"ckpt/model.bin": payload(BIG, 1), "ckpt/other.bin": b"other"})
    written, refused = _overwrite_while_copying(monkeypatch, gcs_env, gcs_bucket,
                                                "ckpt/model.bin", every_try=True)
    report = sync(f"gs://{gcs_bucket}/ckpt/", target.url, env=target.env)
    assert len(written) >= 2 and len(refused) >= 2
    # still being written: left for a later run with a note, not a failure (exit 0)
    assert report["failures"] == [] and report["objects_deferred"] == 1
    assert [d["key"] for d in report["deferred"]] == ["model.bin"]
    assert "still being written" in report["deferred"][0]["reason"]
    assert target.read() == {"other.bin": b"other"}  # neither version, nor a mixture
    assert target.leftovers() == []  # the multipart uploads were aborted


def test_corrupted_crc32c_fails_and_commits_nothing(gcs_env, gcs_bucket, target):
    good, bad = payload(4000, 5), payload(4000, 6)
    seed(gcs_env, gcs_bucket, {"good.bin": good, "bad.bin": bad})
    set_wrong_crc32c(gcs_env, gcs_bucket, "bad.bin",
                     checksums.to_base64(checksums.crc32c(bad) ^ 0x80))
    report = sync(f"gs://{gcs_bucket}/", target.url, env=target.env, code=1)
    assert [f["key"] for f in report["failures"]] == ["bad.bin"]
    assert "CRC32C mismatch" in report["failures"][0]["error"]
    assert target.read() == {"good.bin": good}
    assert target.leftovers() == []


def test_corrupted_crc32c_of_a_multipart_object_commits_nothing(gcs_env, gcs_bucket, tmp_path):
    data = payload(BIG, 7)
    seed(gcs_env, gcs_bucket, {"big.bin": data})
    set_wrong_crc32c(gcs_env, gcs_bucket, "big.bin",
                     checksums.to_base64(checksums.crc32c(data) ^ 1))
    report = sync(f"gs://{gcs_bucket}/", str(tmp_path / "t"), code=1)
    assert "CRC32C" in report["failures"][0]["error"]
    assert not (tmp_path / "t" / "big.bin").exists()


@pytest.mark.parametrize("command", ["sync", "plan", "ls"])
def test_missing_bucket_is_one_line_and_exit_2(gcs_env, command, tmp_path):
    args = ["gs://no-such-bucket-here/x/"] + ([] if command == "ls" else [str(tmp_path / "t")])
    result = run_cli(command, *args)
    assert result.exit_code == 2, result.output
    (line,) = error_lines(result.output)
    assert "bucket 'no-such-bucket-here' does not exist" in line
    assert not (tmp_path / "t").exists()


@pytest.mark.parametrize(("content", "message"), [
    (None, "no such file"),
    ("not json at all", "not a JSON credentials file"),
])
def test_bad_credentials_are_one_line_and_exit_2(tmp_path, monkeypatch, content, message):
    creds = tmp_path / "key.json"
    if content is not None:
        creds.write_text(content)
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(creds))  # and no emulator
    for args in (["sync", "gs://some-bucket/data/", str(tmp_path / "t")],
                 ["ls", "gs://some-bucket/data/"]):
        result = run_cli(*args)
        assert result.exit_code == 2, result.output
        (line,) = error_lines(result.output)
        assert f"GOOGLE_APPLICATION_CREDENTIALS={creds}: {message}" in line
    assert not (tmp_path / "t").exists()


def test_gs_as_a_target_is_refused(gcs_env, gcs_bucket, tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a").write_bytes(b"a")
    for command in ("sync", "plan"):
        result = run_cli(command, str(tmp_path / "src"), f"gs://{gcs_bucket}/x/")
        assert result.exit_code == 2, result.output
        (line,) = error_lines(result.output)
        assert "source only" in line


def test_a_changed_gcs_object_goes_as_a_block_delta(gcs_env, gcs_bucket, target):
    old = payload(16 * MiB, 5)
    seed(gcs_env, gcs_bucket, {"opt/optimizer.bin": old})
    src = f"gs://{gcs_bucket}/opt/"
    first = sync(src, target.url, env=target.env)
    assert first["bytes_sent"] == len(old)

    new = old[:7 * MiB] + payload(1000, 6) + old[7 * MiB + 1000:]
    seed(gcs_env, gcs_bucket, {"opt/optimizer.bin": new})  # a new generation
    report = sync(src, target.url, env=target.env)
    assert target.read() == {"optimizer.bin": new}
    assert report["bytes_changed"] == 5 * MiB  # the one fixed block the change fell in
    # The other 11 MiB came from the target's copy; at most one 5 MiB part was sent around it.
    assert report["bytes_sent"] <= 10 * MiB
    assert report["bytes_reused"] >= len(new) - 10 * MiB
    assert not target.leftovers()


def test_a_delta_from_a_corrupted_gcs_object_keeps_the_old_version(gcs_env, gcs_bucket, target):
    """A delta reads the whole source once (to find what changed) and checks its CRC32C there:
    the bytes it sends and the digests it records are the object GCS vouches for."""
    old = payload(16 * MiB, 8)
    seed(gcs_env, gcs_bucket, {"opt/optimizer.bin": old})
    src = f"gs://{gcs_bucket}/opt/"
    sync(src, target.url, env=target.env)
    new = old[:3 * MiB] + payload(500, 9) + old[3 * MiB + 500:]
    seed(gcs_env, gcs_bucket, {"opt/optimizer.bin": new})
    set_wrong_crc32c(gcs_env, gcs_bucket, "opt/optimizer.bin",
                     checksums.to_base64(checksums.crc32c(new) ^ 4))
    report = sync(src, target.url, env=target.env, code=1)
    assert "CRC32C mismatch" in report["failures"][0]["error"]
    assert target.read() == {"optimizer.bin": old}
    assert not target.leftovers()


@pytest.mark.parametrize("wrong", [False, True], ids=["crc32c-right", "crc32c-wrong"])
def test_a_multipart_object_sent_by_workers_is_checked_against_its_crc32c(
        gcs_env, gcs_bucket, seaweed, bucket_factory, wrong):
    """``--workers``: the parts go to worker processes, which sum each part's CRC32C for the
    driver to check against GCS's before Complete: one that differs commits nothing."""
    data = payload(BIG, 8)
    seed(gcs_env, gcs_bucket, {"big.bin": data, "small.bin": b"small"})
    if wrong:
        set_wrong_crc32c(gcs_env, gcs_bucket, "big.bin",
                         checksums.to_base64(checksums.crc32c(data) ^ 2))
    bucket = bucket_factory(seaweed)
    report = sync(f"gs://{gcs_bucket}/", f"meta://{bucket}/copy/", "--workers", "2",
                  env=seaweed.meta_env(), code=1 if wrong else 0)
    assert report["tasks"] >= 3  # the small object's and at least two of the parts'
    if wrong:
        assert [f["key"] for f in report["failures"]] == ["big.bin"]
        assert "CRC32C" in report["failures"][0]["error"]
        assert read_bucket(seaweed, bucket, "copy/") == {"small.bin": b"small"}
        assert open_uploads(seaweed, bucket) == []
    else:
        assert read_bucket(seaweed, bucket, "copy/") == {"big.bin": data, "small.bin": b"small"}
