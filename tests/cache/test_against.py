"""``cache verify --against``: the cache's entries compared with the chunk hashes mcsync
recorded when it synced their objects to the target (the manifest copy kept there)."""

from __future__ import annotations

import random

import pytest

from mcsync.cache import Cache
from mcsync.run.target_manifests import TargetManifests

from ..integration.helpers import run_cli
from .conftest import Source

MiB = 1 << 20


def _flip(path, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0x10]))


def test_verify_against_the_target_manifest_finds_a_flipped_byte(source: Source, tmp_path):
    np = pytest.importorskip("numpy")
    from safetensors.numpy import save_file

    local = tmp_path / "local"
    local.mkdir()
    rng = random.Random(41)
    (local / "a.bin").write_bytes(rng.randbytes(17 * MiB + 5))  # fixed blocks
    (local / "b.bin").write_bytes(rng.randbytes(100_000))
    (local / "empty").write_bytes(b"")
    # cut by tensor when synced: one chunk per tensor (and the header)
    save_file({f"w{i}": np.full((512, 1024), i, dtype=np.float32) for i in range(6)},
              str(local / "model.safetensors"))
    target = source.url("ds/")
    synced = run_cli("sync", str(local), target)
    assert synced.exit_code == 0, synced.output
    source.put("ds/extra.bin", b"put there by someone else")  # no record of it
    cache_dir = str(tmp_path / "c")
    warm = run_cli("cache", "warm", target, "--cache-dir", cache_dir)
    assert warm.exit_code == 0, warm.output

    with Cache(cache_dir, validate="never") as cache:
        by_url = {e.url: e for e in cache.entries()}
        model = by_url[source.url("ds/model.safetensors")]
        a = by_url[source.url("ds/a.bin")]
        with cache.run(TargetManifests.fetch(target)) as recorded:
            assert cache.verify(against=recorded) == []  # all as mcsync wrote them
            record = recorded.get("model.safetensors")
            assert record is not None and record.chunker == "safetensors"
            assert len(record.chunks()) == 7, record.chunks()
            second = record.chunks()[2][0]
            assert len(recorded.get("a.bin").chunks()) > 1
            assert recorded.get("b.bin").chunks() and not recorded.get("empty").chunks()
            assert recorded.get("extra.bin") is None
        _flip(cache.layout.object(model.id), second.start + 100)
        _flip(cache.layout.object(a.id), 2 * MiB)

    check = run_cli("cache", "verify", "--cache-dir", cache_dir, "--against", target)
    assert check.exit_code == 1, check.output
    assert (f"corrupt: {source.url('ds/model.safetensors')}: differs from what mcsync wrote "
            f"to the target in 1 of 7 chunks (first at byte {second.start}) (dropped)"
            in check.stderr), check.stderr
    assert f"corrupt: {source.url('ds/a.bin')}: differs from what mcsync wrote" in check.stderr
    assert check.stderr.count("corrupt: ") == 2
    with Cache(cache_dir, validate="never") as cache:
        left = {e.url for e in cache.entries()}
        assert source.url("ds/model.safetensors") not in left
        assert source.url("ds/a.bin") not in left
        for key in ("b.bin", "empty", "extra.bin"):  # unflipped: kept, bytes intact
            entry = next(e for e in cache.entries() if e.url == source.url(f"ds/{key}"))
            assert cache.layout.object(entry.id).read_bytes() == (
                source.objects.get(f"ds/{key}") or (local / key).read_bytes())
    again = run_cli("cache", "verify", "--cache-dir", cache_dir, "--against", target)
    assert again.exit_code == 0, again.output
    # b.bin against the manifest; the empty object (no bytes hashed), extra.bin (never synced)
    # and what else the warm cached against their own digests
    assert "0 corrupt entries (1 against the manifest" in again.stderr, again.stderr


def test_verify_against_a_prefix_with_no_manifest_exits_2(source: Source, tmp_path):
    source.put("plain/x", b"x")
    run = run_cli("cache", "verify", "--cache-dir", str(tmp_path / "c"), "--against",
                  source.url("plain/"))
    assert run.exit_code == 2, run.output
    assert f"{source.url('plain/')}: no manifest kept there" in run.stderr
