"""The cache's safetensors reader against ``safetensors``' own loader on the same file, over
SeaweedFS: every tensor equal (dtype, shape, bytes), tensors handed out while the entry still
fills, a second load from local disk, and a load killed with SIGKILL resumed by one that
fetches only the parts not yet on disk."""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mcsync.cache import Cache
from mcsync.errors import IntegrityError
from testbed.faultproxy import Rule, Stall

from .conftest import Source

np = pytest.importorskip("numpy")
st = pytest.importorskip("safetensors.numpy")

KiB = 1 << 10


def _checkpoint(path: Path, *, names: int = 0, seed: int = 0) -> bytes:
    """A safetensors file of every dtype numpy has, a scalar, zero-length tensors, tensors
    that cross part boundaries, and ``names`` more small ones with long names (a header
    larger than a part)."""
    rng = np.random.default_rng(seed)
    tensors = {
        "embed.weight": rng.standard_normal((300, 257)).astype(np.float32),
        "f64": rng.standard_normal(1000),
        "f16": rng.standard_normal((33, 7)).astype(np.float16),
        "i64": rng.integers(-2**62, 2**62, 500, dtype=np.int64),
        "i32": rng.integers(-2**30, 2**30, (5, 5, 5), dtype=np.int32),
        "i16": rng.integers(-2**14, 2**14, 77, dtype=np.int16),
        "i8": rng.integers(-100, 100, 99, dtype=np.int8),
        "u8": rng.integers(0, 255, 4096, dtype=np.uint8),
        "mask": rng.integers(0, 2, 31).astype(bool),
        "scalar": np.array(3.5, dtype=np.float32),
        "empty": np.zeros((0, 16), dtype=np.float32),
        "also.empty": np.zeros((4, 0), dtype=np.int64),
        "tail": rng.standard_normal((64, 1024)).astype(np.float32),
    }
    for i in range(names):
        tensors[f"model.layers.{i}.self_attn.rotary_emb.inv_freq." + "x" * 80] = \
            np.full(3, i, dtype=np.float32)
    st.save_file(tensors, str(path), metadata={"format": "np"})
    return path.read_bytes()


def _same(mine: dict, theirs: dict) -> None:
    assert sorted(mine) == sorted(theirs)
    for name, want in theirs.items():
        got = mine[name]
        assert (got.dtype, got.shape) == (want.dtype, want.shape), name
        assert got.tobytes() == want.tobytes(), name


def test_every_tensor_as_safetensors_loads_it_and_a_second_load_reads_local_disk(
        source: Source, tmp_path):
    local = tmp_path / "model.safetensors"
    data = _checkpoint(local, names=800)
    header = 8 + int.from_bytes(data[:8], "little")
    part = 64 * KiB
    assert header > part  # the header spans parts
    source.put("ckpt/model.safetensors", data)
    theirs = st.load_file(str(local))
    url = source.url("ckpt/model.safetensors")
    with Cache(tmp_path / "c", part_size=part) as cache:
        _same(cache.load_safetensors(url), theirs)
        parts = -(-len(data) // part)
        assert source.gets() == parts and cache.stats.bytes_fetched == len(data)
        order = [name for name, _ in cache.iter_safetensors(url)]
        assert source.gets() == parts  # the second load: local disk, no request
        assert set(order) == set(theirs) and len(order) == len(theirs)
        (entry,) = cache.entries()
        assert cache.layout.object(entry.id).read_bytes() == data


def test_tensors_come_while_the_entry_still_fills(source: Source, tmp_path):
    local = tmp_path / "model.safetensors"
    data = _checkpoint(local)
    source.put("ckpt/m.safetensors", data)
    source.proxy.add(Rule(Stall(0.3), op="GetObject"))
    url = source.url("ckpt/m.safetensors")
    # one part at a time, each answered late: the fill lasts a part's delay per part
    with Cache(tmp_path / "c", part_size=64 * KiB, concurrency=1) as cache:
        tensors = cache.iter_safetensors(url)
        name, first = next(tensors)
        (entry,) = cache.entries()
        assert entry.state == "filling" and len(cache.index.parts_done(entry.id)) < entry.parts
        rest = dict(tensors)
        rest[name] = first
        _same(rest, st.load_file(str(local)))


def _parts_done(cache_dir: Path) -> int:
    path = cache_dir / "v1" / "index.sqlite"
    if not path.exists():
        return 0
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10)
    try:
        return int(db.execute("SELECT COUNT(*) FROM parts").fetchone()[0])
    except sqlite3.OperationalError:
        return 0
    finally:
        db.close()


def test_a_load_killed_midway_is_resumed_fetching_only_what_is_missing(source: Source,
                                                                       tmp_path):
    local = tmp_path / "model.safetensors"
    data = _checkpoint(local, seed=5)
    part = 32 * KiB
    parts = -(-len(data) // part)
    source.put("ckpt/k.safetensors", data)
    url = source.url("ckpt/k.safetensors")
    cache_dir = tmp_path / "c"
    source.proxy.add(Rule(Stall(0.2), op="GetObject"))
    child = subprocess.Popen(
        [sys.executable, "-c", "import sys\nfrom mcsync.cache import Cache\n"
         "c = Cache(sys.argv[1], part_size=int(sys.argv[3]), concurrency=2)\n"
         "for name, t in c.iter_safetensors(sys.argv[2]):\n"
         "    pass\n", str(cache_dir), url, str(part)],
        env=source.env(), stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while _parts_done(cache_dir) < parts // 3:
            assert child.poll() is None, "the child ended before it was killed"
            assert time.monotonic() < deadline, "the child's load made no progress"
            time.sleep(0.01)
        child.send_signal(signal.SIGKILL)
    finally:
        if child.poll() is None:
            child.kill()
        err = child.communicate(timeout=30)[1]
    assert child.returncode == -signal.SIGKILL, err
    source.proxy.clear()  # the resumed load at full speed
    done = _parts_done(cache_dir)
    assert 0 < done < parts
    gets = source.gets()
    with Cache(cache_dir, part_size=part) as cache:
        (entry,) = cache.entries()
        recorded = cache.index.parts_done(entry.id)
        assert len(recorded) == done and entry.state == "filling"
        _same(cache.load_safetensors(url), st.load_file(str(local)))
        fetched = sum(min(part, len(data) - n * part) for n in range(parts)
                      if n not in recorded)
        assert source.gets() - gets == parts - done  # one GET per missing part, no more
        assert cache.stats.bytes_fetched == fetched
        assert cache.layout.object(entry.id).read_bytes() == data


def test_a_file_that_is_not_safetensors_is_one_clear_error(source: Source, tmp_path):
    source.put("ckpt/bad.safetensors", (10**12).to_bytes(8, "little") + b"{}")
    with Cache(tmp_path / "c") as cache, pytest.raises(IntegrityError) as exc:
        cache.load_safetensors(source.url("ckpt/bad.safetensors"))
    message = str(exc.value)
    assert message.startswith(f"{source.url('ckpt/bad.safetensors')}: not a safetensors file")
    assert "\n" not in message


def test_torch_tensors_with_framework_pt(source: Source, tmp_path):
    torch = pytest.importorskip("torch")
    local = tmp_path / "model.safetensors"
    data = _checkpoint(local)
    source.put("ckpt/t.safetensors", data)
    with Cache(tmp_path / "c") as cache:
        mine = cache.load_safetensors(source.url("ckpt/t.safetensors"), framework="pt")
    for name, want in st.load_file(str(local)).items():
        assert isinstance(mine[name], torch.Tensor)
        assert tuple(mine[name].shape) == want.shape
        assert mine[name].numpy().tobytes() == want.tobytes()
