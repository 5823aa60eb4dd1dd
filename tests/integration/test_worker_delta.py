"""``--workers``: the block delta's hashing read of a large changed file, and a content-defined
cut's, run on worker processes in byte ranges; the driver only plans and journals. Measured on
the driver's own process: the bytes it read (``rchar`` in ``/proc/PID/io``, every read()
and pread() of the process, the source file's among them; see ``synced``). A local source, a
SeaweedFS target, byte-for-byte."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import sqlite3
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
import xxhash

from mcsync.chunking import cdc_cut
from testbed.faultproxy import Rule, Stall

from .test_workers import ROOT, wait_for, workers_of

MiB = 1 << 20
TENSOR = 4 * MiB


def write_safetensors(path: Path, size: int) -> None:
    """A safetensors file of about ``size`` bytes, tensors of 4 MiB of random bytes."""
    n = size // TENSOR
    header = {f"layers.{i}.weight": {"dtype": "F16", "shape": [TENSOR // 2],
                                     "data_offsets": [i * TENSOR, (i + 1) * TENSOR]}
              for i in range(n)}
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    with path.open("wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        for _ in range(n):
            f.write(os.urandom(TENSOR))


def change(path: Path, fraction: float, at: tuple[float, ...]) -> None:
    """Rewrite ``fraction`` of the file in place, in one run at each of ``at`` (fractions of
    its size)."""
    size = path.stat().st_size
    run = int(size * fraction / len(at))
    fd = os.open(path, os.O_WRONLY)
    try:
        for where in at:
            os.pwrite(fd, os.urandom(run), int(size * where))
    finally:
        os.close(fd)


def rchar(pid: int) -> int:
    for line in Path(f"/proc/{pid}/io").read_text().splitlines():
        if line.startswith("rchar: "):
            return int(line.split()[1])
    raise AssertionError(f"no rchar for {pid}")


def synced(src: Path, dst: str, env: dict[str, str], manifest: Path,
           *extra: str) -> tuple[dict, int, str]:
    """One run of the command: its report, the bytes its own process read, its log.

    A process's counters take in those of each child it reaps, and the driver reaps its
    workers at the end: what it read itself is its count while every worker it had is still
    unreaped (sampled until one is gone; a worker reaped before it was seen only adds to it).
    Without workers, its count once exited, read before it is reaped."""
    out, err = manifest.with_suffix(".out"), manifest.with_suffix(".err")
    with out.open("w") as o, err.open("w") as e:
        proc = subprocess.Popen(
            [sys.executable, "-m", "mcsync.cli.main", "sync", str(src), dst, "--quiet",
             "--json", "--manifest", str(manifest), *extra],
            env=dict(os.environ) | env, cwd=ROOT, stdout=o, stderr=e)
        seen: set[int] = set()
        own = 0
        try:
            while os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
                count = rchar(proc.pid)
                if seen and not all(Path(f"/proc/{w}").exists() for w in seen):
                    break  # a worker reaped: the driver's count holds its reads from here
                own = count
                seen.update(workers_of(proc.pid))
                time.sleep(0.02)
            os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)
            if not seen:
                own = rchar(proc.pid)  # exited, not reaped, and no worker was ever reaped
        finally:
            code = proc.wait(timeout=600)
    assert code == 0, err.read_text()[-3000:]
    return json.loads(out.read_text()), own, err.read_text()


def sha256_of(stream) -> str:
    """The SHA-256 of a file or an object's body, read in blocks (1 GiB is not held)."""
    h = hashlib.sha256()
    while block := stream.read(8 * MiB):
        h.update(block)
    return h.hexdigest()


def same_at_target(ep, bucket: str, key: str, path: Path) -> bool:
    with path.open("rb") as f:
        here = sha256_of(f)
    return sha256_of(ep.client().get_object(Bucket=bucket, Key=key)["Body"]) == here


def delta_resync_reads_a_fraction(size: int, seaweed, bucket_factory, tmp_path: Path) -> None:
    bucket = bucket_factory(seaweed)
    src = tmp_path / "src"
    src.mkdir()
    model = src / "model.safetensors"
    write_safetensors(model, size)
    size = model.stat().st_size
    env, dst, manifest = seaweed.meta_env(), f"meta://{bucket}/ckpt/", tmp_path / "m.sqlite"
    first, _, _ = synced(src, dst, env, manifest, "--workers", "2")
    assert first["objects_copied"] == 1

    # The measure sees the hashing read: alone, the driver reads the whole file.
    change(model, 0.02, (0.3, 0.7))
    alone, alone_read, _ = synced(src, dst, env, manifest)
    assert alone["bytes_sent"] < size // 10 and alone_read >= size, (alone, alone_read)
    assert same_at_target(seaweed, bucket, "ckpt/model.safetensors", model)

    # With two workers they read and hash it in ranges; the driver reads the changed blocks.
    change(model, 0.02, (0.2, 0.6))
    report, driver_read, _ = synced(src, dst, env, manifest, "--workers", "2")
    assert report["bytes_sent"] < size // 10 and report["bytes_reused"] > size // 2, report
    assert report["tasks"] >= size // (64 * MiB) and report["tasks_retried"] == 0, report
    print(f"driver read {driver_read} bytes of a {size}-byte file "
          f"({driver_read / size:.1%}); alone it read {alone_read}")
    assert driver_read < size // 4, (driver_read, size)
    assert same_at_target(seaweed, bucket, "ckpt/model.safetensors", model)


def test_a_delta_resync_with_workers_leaves_the_hashing_read_to_them(seaweed, bucket_factory,
                                                                   tmp_path):
    delta_resync_reads_a_fraction(256 * MiB, seaweed, bucket_factory, tmp_path)


@pytest.mark.slow
def test_a_1gib_checkpoint_resynced_with_workers_is_read_by_them(seaweed, bucket_factory,
                                                                 tmp_path):
    delta_resync_reads_a_fraction(1024 * MiB, seaweed, bucket_factory, tmp_path)


def test_a_dry_run_with_workers_leaves_the_delta_previews_hashing_read_to_them(
        seaweed, bucket_factory, tmp_path):
    """``--dry-run`` (``mcsync plan`` too) with ``--workers``: what a delta would send is
    found by reading and hashing the changed file in ranges on the workers, as a sync's delta
    is; the driver reads little of it, and nothing is written."""
    bucket = bucket_factory(seaweed)
    src = tmp_path / "src"
    src.mkdir()
    model = src / "model.safetensors"
    write_safetensors(model, 256 * MiB)
    size = model.stat().st_size
    env, dst, manifest = seaweed.meta_env(), f"meta://{bucket}/ckpt/", tmp_path / "m.sqlite"
    first, _, _ = synced(src, dst, env, manifest, "--workers", "2")
    assert first["objects_copied"] == 1

    change(model, 0.02, (0.3, 0.7))
    report, driver_read, _ = synced(src, dst, env, manifest, "--workers", "2", "--dry-run")
    assert report["dry_run"] and report["bytes_sent"] < size // 10, report
    assert report["bytes_reused"] > size // 2, report  # the preview found the delta
    assert report["tasks"] >= size // (64 * MiB), report
    print(f"dry run: driver read {driver_read} bytes of a {size}-byte file; "
          f"tasks {report['tasks']}")
    assert driver_read < size // 4, (driver_read, size)
    assert not same_at_target(seaweed, bucket, "ckpt/model.safetensors", model)


def record(manifest: Path, key: str) -> tuple[bytes, bytes, str]:
    with contextlib.closing(sqlite3.connect(manifest)) as db:
        (row,) = db.execute("SELECT block_hashes, chunk_sizes, chunker FROM objects "
                            "WHERE key = ?", (key,))
    return row


def test_a_content_defined_cut_with_workers_is_the_sequential_one(seaweed, bucket_factory,
                                                                  tmp_path):
    """``--chunker cdc``: the first copy's cut and the delta's after an insert are both cut
    in ranges by the workers; the records hold exactly the chunks and digests of one pass over
    the file, and the driver read little of it."""
    bucket = bucket_factory(seaweed)
    src = tmp_path / "src"
    src.mkdir()
    data = os.urandom(150 * MiB + 12345)
    (src / "data.bin").write_bytes(data)
    env, dst, manifest = seaweed.meta_env(), f"meta://{bucket}/d/", tmp_path / "m.sqlite"
    first, first_read, _ = synced(src, dst, env, manifest, "--workers", "2", "--chunker", "cdc")
    assert first["objects_copied"] == 1

    new = data[:70 * MiB] + os.urandom(1000) + data[70 * MiB:]  # an insert shifts the rest
    (src / "data.bin").write_bytes(new)
    report, driver_read, _ = synced(src, dst, env, manifest, "--workers", "2",
                                    "--chunker", "cdc")
    assert report["bytes_reused"] > len(new) // 2 and report["bytes_sent"] < len(new) // 10
    assert same_at_target(seaweed, bucket, "d/data.bin", src / "data.bin")

    hashes, sizes, chunker = record(manifest, "data.bin")
    lengths = cdc_cut(new, eof=True)
    assert chunker == "cdc" and sizes == struct.pack(f"<{len(lengths)}Q", *lengths)
    pos, expect = 0, []
    for n in lengths:
        expect.append(xxhash.xxh3_128_digest(new[pos:pos + n]))
        pos += n
    assert hashes == b"".join(expect)
    assert first_read < len(data) // 4 and driver_read < len(new) // 4, (first_read,
                                                                        driver_read)


def test_a_worker_killed_while_hashing_has_its_ranges_read_by_another(
        seaweed, seaweed_proxy, bucket_factory, tmp_path):
    """An S3 source through the fault proxy, its reads held 3 s, so hash tasks are in flight
    on both workers when one is SIGKILLed: its ranges go to another worker, and the delta is
    planned and sent as if nothing happened."""
    src_bucket, dst_bucket = bucket_factory(seaweed), bucket_factory(seaweed)
    path = tmp_path / "model.safetensors"
    write_safetensors(path, 136 * MiB)
    data = bytearray(path.read_bytes())
    client = seaweed.client()
    client.put_object(Bucket=src_bucket, Key="m/model.safetensors", Body=bytes(data))
    env = seaweed_proxy.endpoint.meta_env()
    src, dst = f"meta://{src_bucket}/m/", f"meta://{dst_bucket}/m/"
    # One server: without --no-server-side-copy the change would be one CopyObject.
    args = [sys.executable, "-m", "mcsync.cli.main", "sync", src, dst, "--quiet", "--json",
            "--workers", "2", "--no-server-side-copy", "--manifest", str(tmp_path / "m.sqlite")]
    first = subprocess.run(args, env=dict(os.environ) | env, cwd=ROOT, capture_output=True,
                           text=True, timeout=600, check=False)
    assert first.returncode == 0, first.stderr[-3000:]

    for at in (len(data) // 3, 2 * len(data) // 3):
        data[at:at + MiB] = os.urandom(MiB)
    client.put_object(Bucket=src_bucket, Key="m/model.safetensors", Body=bytes(data))

    def reads() -> int:
        return len([e for e in seaweed_proxy.exchanges("GetObject", key="m/model.safetensors")
                    if e.bucket == src_bucket])

    before = reads()
    seaweed_proxy.add(Rule(Stall(3.0), op="GetObject", key="m/model.safetensors", count=8))
    proc = subprocess.Popen(args, env=dict(os.environ) | env, cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        wait_for(lambda: reads() >= before + 3)  # the header's, then the workers'
        victims = workers_of(proc.pid)
        assert len(victims) == 2
        os.kill(victims[0], signal.SIGKILL)
        out, err = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err[-3000:]
    report = json.loads(out)
    retried = [t for t in report["retried_tasks"] if "(hashing model.safetensors" in t]
    assert retried and all("died" in t for t in retried), report["retried_tasks"]
    assert report["bytes_sent"] < len(data) // 10 and report["bytes_reused"] > len(data) // 2
    body = client.get_object(Bucket=dst_bucket, Key="m/model.safetensors")["Body"].read()
    assert body == bytes(data)
