"""The data sets, made once per work dir by scripts/make_sample_data.py and reused.

Three groups, each generated (and reused) on its own, only when one of its sets is selected:
``checkpoint``, ``shards`` and ``small`` together in ``data/raw/`` (as before), ``midsize`` in
``data/raw-midsize/`` and ``mixed`` in ``data/raw-mixed/``. Each group's sizes are stamped in
``data/<stamp>.json``; a group whose stamp differs is written anew.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from bench_measure import list_local

REPO = Path(__file__).resolve().parent.parent
MAKE_DATA = REPO / "scripts" / "make_sample_data.py"

DATASETS = ("checkpoint", "shards", "small", "midsize", "mixed")
MIXED_DIR = "checkpoint-1000"  # make_sample_data.py's directory for the mixed set


@dataclass(frozen=True)
class Sizes:
    checkpoint_mib: int
    shards: int
    shard_mib: int
    small: int
    small_kib: int
    midsize: int
    midsize_mib: int
    mixed_mib: int
    mixed_shards: int

    def base(self) -> dict[str, int]:
        """The sizes of the first three sets (the stamp of data/raw, as it always was)."""
        return {
            "checkpoint_mib": self.checkpoint_mib, "shards": self.shards,
            "shard_mib": self.shard_mib, "small": self.small, "small_kib": self.small_kib,
        }  # fmt: skip

    def args(self) -> list[str]:
        return [
            "--checkpoint-mib", str(self.checkpoint_mib),
            "--shards", str(self.shards), "--shard-mib", str(self.shard_mib),
            "--small", str(self.small), "--small-kib", str(self.small_kib),
        ]  # fmt: skip

    def describe(self) -> str:
        return (
            f"checkpoint {self.checkpoint_mib} MiB, shards {self.shards} x {self.shard_mib} MiB, "
            f"small {self.small:,} x {self.small_kib} KiB, midsize {self.midsize} x "
            f"{self.midsize_mib} MiB, mixed ~{self.mixed_mib} MiB"
        )


FULL = Sizes(
    checkpoint_mib=2048, shards=64, shard_mib=32, small=10_000, small_kib=16,
    midsize=32, midsize_mib=64, mixed_mib=2048, mixed_shards=4,
)  # fmt: skip
QUICK = Sizes(
    checkpoint_mib=256, shards=8, shard_mib=32, small=1_000, small_kib=16,
    midsize=16, midsize_mib=16, mixed_mib=256, mixed_shards=3,
)  # fmt: skip


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


@dataclass(frozen=True)
class _Group:
    sets: tuple[str, ...]  # the data sets it holds
    raw: str  # its directory under data/
    stamp: str  # its stamp file under data/
    marker: str  # a file that must exist for the group to be reused
    sizes: dict  # what the stamp holds
    argv: list[str]  # make_sample_data.py arguments after OUT_DIR


def _groups(sizes: Sizes) -> list[_Group]:
    return [
        _Group(
            ("checkpoint", "shards", "small"), "raw", "sizes.json", "model.safetensors",
            sizes.base(), [*sizes.args(), "--sets", "checkpoint,shards,small"],
        ),
        _Group(
            ("midsize",), "raw-midsize", "midsize.json", "midsize",
            {"midsize": sizes.midsize, "midsize_mib": sizes.midsize_mib},
            ["--sets", "midsize", "--midsize", str(sizes.midsize),
             "--midsize-mib", str(sizes.midsize_mib)],
        ),
        _Group(
            ("mixed",), "raw-mixed", "mixed.json", f"{MIXED_DIR}/model.safetensors.index.json",
            {"mixed_mib": sizes.mixed_mib, "mixed_shards": sizes.mixed_shards},
            ["--sets", "mixed", "--mixed-mib", str(sizes.mixed_mib),
             "--mixed-shards", str(sizes.mixed_shards)],
        ),
    ]  # fmt: skip


def prepare(workdir: Path, sizes: Sizes, names: list[str], log) -> dict[str, Dataset]:
    """Generate (or reuse) the sample data under ``workdir/data`` and return the data sets."""
    data = workdir / "data"
    for group in _groups(sizes):
        if not set(group.sets) & set(names):
            continue
        raw, stamp = data / group.raw, data / group.stamp
        wanted = json.dumps(group.sizes, sort_keys=True)
        if stamp.exists() and stamp.read_text() == wanted and (raw / group.marker).exists():
            log(f"reusing sample data in {raw}")
            continue
        if raw.exists():
            shutil.rmtree(raw)
        stamp.unlink(missing_ok=True)
        raw.parent.mkdir(parents=True, exist_ok=True)
        if not MAKE_DATA.exists():
            raise SystemExit(f"error: {MAKE_DATA} not found (it generates the sample data)")
        argv = [sys.executable, str(MAKE_DATA), str(raw), *group.argv]
        log("generating sample data: " + " ".join(argv[1:]))
        # Its summary line is progress: stderr, like the rest (stdout has the tables only).
        subprocess.run(argv, check=True, stdin=subprocess.DEVNULL, stdout=sys.stderr)
        stamp.write_text(wanted)

    # The checkpoint set is the safetensors file alone: give it a directory of its own
    # (a hard link, so no second copy of the bytes).
    if "checkpoint" in names:
        ckpt_dir = data / "checkpoint"
        ckpt = ckpt_dir / "model.safetensors"
        if ckpt_dir.exists():
            shutil.rmtree(ckpt_dir)
        ckpt_dir.mkdir(parents=True)
        try:
            os.link(data / "raw" / "model.safetensors", ckpt)
        except OSError:
            shutil.copyfile(data / "raw" / "model.safetensors", ckpt)

    roots = {
        "checkpoint": data / "checkpoint",
        "shards": data / "raw" / "data",
        "small": data / "raw" / "small",
        "midsize": data / "raw-midsize" / "midsize",
        "mixed": data / "raw-mixed" / MIXED_DIR,
    }
    sets = {}
    for name in names:
        files = list_local(roots[name])
        if not files:
            raise SystemExit(f"error: data set {name!r} is empty under {roots[name]}")
        sets[name] = Dataset(name, roots[name], files)
    return sets
