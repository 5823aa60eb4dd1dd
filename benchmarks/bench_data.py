"""The three data sets, made once per work dir by scripts/make_sample_data.py and reused."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from bench_measure import list_local

REPO = Path(__file__).resolve().parent.parent
MAKE_DATA = REPO / "scripts" / "make_sample_data.py"

DATASETS = ("checkpoint", "shards", "small")


@dataclass(frozen=True)
class Sizes:
    checkpoint_mib: int
    shards: int
    shard_mib: int
    small: int
    small_kib: int

    def args(self) -> list[str]:
        return [
            "--checkpoint-mib", str(self.checkpoint_mib),
            "--shards", str(self.shards), "--shard-mib", str(self.shard_mib),
            "--small", str(self.small), "--small-kib", str(self.small_kib),
        ]  # fmt: skip


FULL = Sizes(checkpoint_mib=2048, shards=64, shard_mib=32, small=10_000, small_kib=16)
QUICK = Sizes(checkpoint_mib=256, shards=8, shard_mib=32, small=1_000, small_kib=16)


@dataclass
class Dataset:
    name: str
    root: Path  # a directory holding exactly this data set's files
    files: dict[str, int]  # relative path -> size

    @property
    def nbytes(self) -> int:
        return sum(self.files.values())

    @property
    def count(self) -> int:
        return len(self.files)


def prepare(workdir: Path, sizes: Sizes, names: list[str], log) -> dict[str, Dataset]:
    """Generate (or reuse) the sample data under ``workdir/data`` and return the data sets."""
    raw = workdir / "data" / "raw"
    stamp = workdir / "data" / "sizes.json"
    wanted = json.dumps(asdict(sizes), sort_keys=True)
    if stamp.exists() and stamp.read_text() == wanted and (raw / "model.safetensors").exists():
        log(f"reusing sample data in {raw}")
    else:
        if raw.exists():
            shutil.rmtree(raw)
        stamp.unlink(missing_ok=True)
        raw.parent.mkdir(parents=True, exist_ok=True)
        if not MAKE_DATA.exists():
            raise SystemExit(f"error: {MAKE_DATA} not found (it generates the sample data)")
        argv = [sys.executable, str(MAKE_DATA), str(raw), *sizes.args()]
        log("generating sample data: " + " ".join(argv[1:]))
        subprocess.run(argv, check=True, stdin=subprocess.DEVNULL)
        stamp.write_text(wanted)

    # The checkpoint set is the safetensors file alone: give it a directory of its own
    # (a hard link, so no second copy of the bytes).
    ckpt_dir = workdir / "data" / "checkpoint"
    ckpt = ckpt_dir / "model.safetensors"
    if ckpt_dir.exists():
        shutil.rmtree(ckpt_dir)
    ckpt_dir.mkdir(parents=True)
    try:
        os.link(raw / "model.safetensors", ckpt)
    except OSError:
        shutil.copyfile(raw / "model.safetensors", ckpt)

    roots = {"checkpoint": ckpt_dir, "shards": raw / "data", "small": raw / "small"}
    sets = {}
    for name in names:
        files = list_local(roots[name])
        if not files:
            raise SystemExit(f"error: data set {name!r} is empty under {roots[name]}")
        sets[name] = Dataset(name, roots[name], files)
    return sets
