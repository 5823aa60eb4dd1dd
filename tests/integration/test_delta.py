"""The block delta against real targets: a changed object mcsync wrote before is rebuilt at the
target from the unchanged ranges of its previous version plus the new bytes, and the result is
byte-identical to the source (moto and SeaweedFS over HTTP, and a local directory)."""

from __future__ import annotations

import json
import os
import random
import signal
import struct
from pathlib import Path

import pytest

import mcsync

from .helpers import crashed_run, read_bucket, read_tree, run_cli, write_tree

MiB = 1 << 20
PART = 5 * MiB  # S3's minimum part: the packer's padding per changed region


def safetensors(tensors: dict[str, bytes], metadata: dict[str, str] | None = None) -> bytes:
    header: dict = {"__metadata__": metadata} if metadata else {}
    pos = 0
    for name, data in tensors.items():
        header[name] = {"dtype": "F16", "shape": [len(data) // 2],
                        "data_offsets": [pos, pos + len(data)]}
        pos += len(data)
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)  # the reference writer pads the header to 8 bytes
    return struct.pack("<Q", len(raw)) + raw + b"".join(tensors.values())


def checkpoint_tensors(seed: int = 0) -> dict[str, bytes]:
    rnd = random.Random(seed)
    tensors = {}
    for layer in range(12):
        for name, size in (("attn.qkv", 3 * MiB), ("mlp.up", 2 * MiB), ("norm", 8 * 1024)):
            tensors[f"layers.{layer}.{name}.weight"] = rnd.randbytes(size)
    return tensors


def rewrite(tensors: dict[str, bytes], names: list[str], seed: int = 1) -> dict[str, bytes]:
    rnd = random.Random(seed)
    return {k: rnd.randbytes(len(v)) if k in names else v for k, v in tensors.items()}


class Target:
    """A target the test can read back whole: a bucket on an S3 server, or a directory."""

    def __init__(self, kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
        self.kind = kind
        if kind == "local":
            self.root = tmp_path / "dst"
            self.url = str(self.root)
            self.env: dict[str, str] = {}
        else:
            self.ep = request.getfixturevalue(kind)
            self.bucket = request.getfixturevalue("bucket_factory")(self.ep)
            self.url = f"meta://{self.bucket}/ckpt/"
            self.env = self.ep.meta_env()

    def read(self) -> dict[str, bytes]:
        if self.kind == "local":
            return read_tree(self.root)
        return read_bucket(self.ep, self.bucket, "ckpt/")

    def tamper(self, key: str, data: bytes) -> None:
        if self.kind == "local":
            (self.root / key).write_bytes(data)
        else:
            self.ep.client().put_object(Bucket=self.bucket, Key=f"ckpt/{key}", Body=data)


@pytest.fixture(params=["moto", "seaweed", "local"])
def target(request, tmp_path, monkeypatch) -> Target:
    t = Target(request.param, request, tmp_path)
    for k, v in t.env.items():
        monkeypatch.setenv(k, v)
    return t


def sync(src: Path, target: Target) -> mcsync.SyncReport:
    report = mcsync.sync(str(src), target.url, part_size=PART)
    assert report.ok, report.failures
    return report


def synced_then_rewritten(src: Path, target: Target,
                          names: list[str]) -> tuple[dict[str, bytes], bytes]:
    """The checkpoint synced once, then ``names`` rewritten at the source: the old tensors
    and the new file."""
    tensors = checkpoint_tensors()
    write_tree(src, {"model.safetensors": safetensors(tensors)})
    sync(src, target)
    new = safetensors(rewrite(tensors, names))
    write_tree(src, {"model.safetensors": new})
    return tensors, new


def min_part(target: Target) -> int:
    return 1 if target.kind == "local" else PART


def test_rewritten_tensors_send_only_their_bytes(target, tmp_path):
    src = tmp_path / "src"
    tensors = checkpoint_tensors()
    write_tree(src, {"model.safetensors": safetensors(tensors)})
    first = sync(src, target)
    assert first.bytes_sent == len(safetensors(tensors))

    # ~2% of the bytes: two tensors far apart (two changed regions).
    changed = ["layers.2.mlp.up.weight", "layers.9.norm.weight"]
    new = safetensors(rewrite(tensors, changed))
    write_tree(src, {"model.safetensors": new})
    report = sync(src, target)

    assert target.read() == {"model.safetensors": new}
    changed_bytes = sum(len(tensors[n]) for n in changed)
    assert report.bytes_changed == changed_bytes
    assert changed_bytes <= report.bytes_sent <= changed_bytes + 2 * min_part(target)
    # Everything else came from the target's own copy (at most the padding was sent again).
    assert report.bytes_reused >= len(new) - changed_bytes - 2 * min_part(target)
    assert report.objects[0].bytes_reused == report.bytes_reused


def test_a_tensor_added_reuses_the_others_from_their_old_offsets(target, tmp_path):
    src = tmp_path / "src"
    tensors = checkpoint_tensors()
    write_tree(src, {"model.safetensors": safetensors(tensors)})
    sync(src, target)

    grown = dict(tensors)
    grown["lm_head.bias"] = random.Random(7).randbytes(512 * 1024)
    new = safetensors(dict(sorted(grown.items())), metadata={"step": "1200"})
    write_tree(src, {"model.safetensors": new})
    report = sync(src, target)

    assert target.read() == {"model.safetensors": new}
    # The header and the new tensor are new; every other tensor is composed at the target,
    # less the padding that makes S3 parts >= 5 MiB around the two changed regions.
    assert report.bytes_changed < 1 * MiB
    assert report.bytes_sent <= report.bytes_changed + 2 * min_part(target)
    assert report.bytes_reused >= len(new) - report.bytes_changed - 2 * min_part(target)


@pytest.mark.parametrize("change", ["append", "truncate", "rewrite-all", "shrink-small",
                                    "rewrite-middle"])
def test_fixed_blocks_follow_any_change(change, target, tmp_path):
    src = tmp_path / "src"
    rnd = random.Random(3)
    old = rnd.randbytes(23 * MiB + 123)
    write_tree(src, {"optimizer.bin": old})
    sync(src, target)

    if change == "append":
        new = old + rnd.randbytes(3 * MiB)
    elif change == "truncate":
        new = old[:17 * MiB + 5]
    elif change == "rewrite-all":
        new = rnd.randbytes(len(old))
    elif change == "shrink-small":
        new = old[:3 * MiB]
    else:
        new = old[:11 * MiB] + rnd.randbytes(100) + old[11 * MiB + 100:]
    write_tree(src, {"optimizer.bin": new})
    report = sync(src, target)

    assert target.read() == {"optimizer.bin": new}
    if change in ("append", "truncate", "rewrite-middle"):
        assert report.bytes_reused > 0
        assert report.bytes_sent < len(new) / 2
    else:  # nothing reusable, or too small for parts: sent whole
        assert report.bytes_reused == 0
        assert report.bytes_sent == len(new)


def test_target_changed_out_of_band_is_never_composed_from(target, tmp_path):
    src = tmp_path / "src"
    tensors = checkpoint_tensors()
    write_tree(src, {"model.safetensors": safetensors(tensors)})
    sync(src, target)

    # Someone rewrites the target (same size); then the source changes a little.
    target.tamper("model.safetensors", random.Random(9).randbytes(len(safetensors(tensors))))
    new = safetensors(rewrite(tensors, ["layers.0.norm.weight"]))
    write_tree(src, {"model.safetensors": new})
    os.utime(src / "model.safetensors", (2e9, 2e9))  # newer than the tampered target
    report = sync(src, target)

    assert target.read() == {"model.safetensors": new}
    assert report.bytes_reused == 0 and report.bytes_sent == len(new)


def test_plan_names_the_changed_tensors(target, tmp_path):
    src = tmp_path / "src"
    tensors, _ = synced_then_rewritten(src, target, ["layers.4.attn.qkv.weight"])

    result = run_cli("plan", str(src), target.url, "--part-size", "5MiB", env=target.env)
    assert result.exit_code == 0, result.output
    assert "changed tensors: layers.4.attn.qkv.weight" in result.output, result.output
    assert "3.0 MiB changed" in result.output, result.output
    assert target.read() == {"model.safetensors": safetensors(tensors)}  # a plan moves nothing


def test_no_delta_sends_whole(target, tmp_path):
    src = tmp_path / "src"
    _, new = synced_then_rewritten(src, target, ["layers.1.norm.weight"])
    report = mcsync.sync(str(src), target.url, part_size=PART, delta=False)
    assert target.read() == {"model.safetensors": new}
    assert report.bytes_sent == len(new) and report.bytes_reused == 0


@pytest.mark.parametrize("point", ["part:1", "part-done:1", "copy:3", "complete:1",
                                   "complete-done:1", "stage-part:1", "stage-part-done:2",
                                   "stage-complete-done:1"])
def test_killed_delta_resumes_like_any_upload(point, seaweed, bucket_factory, tmp_path):
    src = tmp_path / "src"
    tensors = checkpoint_tensors()
    write_tree(src, {"model.safetensors": safetensors(tensors)})
    bucket = bucket_factory(seaweed)
    dst = f"meta://{bucket}/ckpt/"
    env = seaweed.meta_env()
    assert run_cli("sync", str(src), dst, "--part-size", "5MiB", "-q", env=env).exit_code == 0

    # layers 1 and 2's qkv with the 2 MiB between them: one 8 MiB region sent as an upload
    # part; the other two regions are short and staged.
    changed = ["layers.1.attn.qkv.weight", "layers.2.attn.qkv.weight", "layers.5.mlp.up.weight",
               "layers.10.norm.weight"]
    new = safetensors(rewrite(tensors, changed))
    write_tree(src, {"model.safetensors": new})
    acked = tmp_path / "acked"
    proc = crashed_run(point, "sync", str(src), dst, "--part-size", "5MiB", "-q", env=env,
                       acked=acked)
    assert proc.returncode == -signal.SIGKILL, (point, proc.returncode, proc.stderr)
    # Killed mid-compose, the old version is what readers see; after Complete, the new one.
    visible = new if point == "complete-done:1" else safetensors(tensors)
    assert read_bucket(seaweed, bucket, "ckpt/") == {"model.safetensors": visible}

    result = run_cli("sync", str(src), dst, "--part-size", "5MiB", "-q", "--json", env=env)
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert read_bucket(seaweed, bucket, "ckpt/") == {"model.safetensors": new}
    changed_bytes = sum(len(tensors[n]) for n in changed) + 2 * MiB + 8 * 1024  # + the gap
    sent_before = int(acked.read_text()) if acked.exists() else 0
    # Each run sends at most the delta (the changed bytes, padded by at most a part per
    # region; ~25 MiB of a ~60 MiB file), never the file again.
    delta = changed_bytes + 3 * PART
    assert sent_before <= delta and report["bytes_sent"] <= delta < len(new) // 2
    if point == "complete-done:1":  # completed before the kill: recognised, nothing re-sent
        assert report["bytes_sent"] == 0
    else:
        assert report["bytes_reused"] > 0
    assert not seaweed.client().list_multipart_uploads(Bucket=bucket).get("Uploads")


def test_cdc_finds_what_an_insert_shifted(target, tmp_path):
    """Fixed blocks lose every block after an insert; content-defined chunks find them."""
    src = tmp_path / "src"
    rnd = random.Random(11)
    old = rnd.randbytes(40 * MiB)
    write_tree(src, {"shard.tar": old})
    first = mcsync.sync(str(src), target.url, part_size=PART, chunker="cdc")
    assert first.ok and target.read() == {"shard.tar": old}

    new = old[:17 * MiB] + rnd.randbytes(4096) + old[17 * MiB:]
    write_tree(src, {"shard.tar": new})
    report = sync(src, target)  # auto: cut as the recorded version was, by content

    assert target.read() == {"shard.tar": new}
    assert report.bytes_changed < 10 * MiB  # the chunks around the insert
    assert report.bytes_sent <= report.bytes_changed + 2 * min_part(target)
    assert report.bytes_reused >= len(new) - 10 * MiB - 2 * min_part(target)


def test_staging_left_by_a_killed_delta_is_swept_by_the_next_run(seaweed, bucket_factory,
                                                                  tmp_path):
    """Killed while staging, then finished without a delta (--no-delta): the staging upload
    the kill left is cleared at the end of the run that follows the interruption."""
    src = tmp_path / "src"
    tensors = checkpoint_tensors()
    write_tree(src, {"model.safetensors": safetensors(tensors)})
    bucket = bucket_factory(seaweed)
    dst = f"meta://{bucket}/ckpt/"
    env = seaweed.meta_env()
    assert run_cli("sync", str(src), dst, "--part-size", "5MiB", "-q", env=env).exit_code == 0
    new = safetensors(rewrite(tensors, ["layers.5.mlp.up.weight"]))
    write_tree(src, {"model.safetensors": new})
    proc = crashed_run("stage-part-done:1", "sync", str(src), dst, "--part-size", "5MiB", "-q",
                       env=env)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    client = seaweed.client()
    staged = [u["Key"] for u in client.list_multipart_uploads(Bucket=bucket).get("Uploads", [])]
    assert any("/.mcsync/stage/" in key for key in staged), staged  # the kill left one

    result = run_cli("sync", str(src), dst, "--part-size", "5MiB", "-q", "--no-delta", env=env)
    assert result.exit_code == 0, result.output
    assert read_bucket(seaweed, bucket, "ckpt/") == {"model.safetensors": new}
    assert not client.list_multipart_uploads(Bucket=bucket).get("Uploads")
    listed = client.list_objects_v2(Bucket=bucket, Prefix="ckpt/.mcsync/stage/")
    assert not listed.get("Contents")


def test_a_target_refusing_ranged_part_copies_gets_the_object_whole(seaweed, bucket_factory,
                                                                     tmp_path, monkeypatch,
                                                                     caplog):
    """An S3 implementation without UploadPartCopy ranges (a proxy answers them 400 before
    SeaweedFS sees them): the delta falls back to a full upload, once noted, target exact."""
    from testbed.servers import S3Endpoint

    from .proxy import CorruptingProxy

    src = tmp_path / "src"
    tensors = checkpoint_tensors()
    write_tree(src, {"a.safetensors": safetensors(tensors), "b.safetensors": safetensors(tensors)})
    bucket = bucket_factory(seaweed)
    for k, v in seaweed.meta_env().items():
        monkeypatch.setenv(k, v)
    assert mcsync.sync(str(src), f"meta://{bucket}/ckpt/", part_size=PART).ok
    new = safetensors(rewrite(tensors, ["layers.3.attn.qkv.weight", "layers.8.norm.weight"]))
    write_tree(src, {"a.safetensors": new, "b.safetensors": new})

    proxy = CorruptingProxy(seaweed.url, refuse_header="x-amz-copy-source-range")
    with proxy.running():
        via = S3Endpoint(proxy.url, seaweed.access_key, seaweed.secret_key)
        for k, v in via.meta_env().items():
            monkeypatch.setenv(k, v)
        report = mcsync.sync(str(src), f"meta://{bucket}/ckpt/", part_size=PART)
    assert report.ok, report.failures
    assert proxy.refused  # a ranged part copy was tried and refused
    assert report.bytes_reused == 0 and report.bytes_sent == 2 * len(new)
    assert read_bucket(seaweed, bucket, "ckpt/") == {"a.safetensors": new, "b.safetensors": new}
    assert any("was refused" in r.message for r in caplog.records)
    assert seaweed.secret_key not in caplog.text
    assert not seaweed.client().list_multipart_uploads(Bucket=bucket).get("Uploads")
