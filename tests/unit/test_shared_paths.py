"""``scale.shared_paths``: what a node must see at a local SRC or DST under ``--executor ray``,
judged on real directories (a "node" here is ``view_of`` run against another directory, as a
node whose own disk is at the same path would look), and ``ray_placement.room``: how many
workers fit on the nodes' free CPUs and memory."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from mcsync.config import GiB, MiB, SyncOptions
from mcsync.scale.shared_paths import (
    SAMPLE,
    absolute,
    local_roots,
    probe_roots,
    remove_markers,
    unseen,
    view_of,
)
from mcsync.scale.worker_runner import Addresses
from mcsync.stores.registry import StoreOptions


def addresses(src: str, dst: str) -> Addresses:
    return Addresses(src, dst, StoreOptions(), StoreOptions())


def tree(root: Path, files: int) -> None:
    for i in range(files):
        path = root / f"d{i % 3}" / f"f{i:03d}.bin"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"x" * i)


def test_only_local_paths_are_probed_and_relative_ones_made_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    given = addresses("src", "meta://bucket/run/")
    assert local_roots(given) == [("source", str(tmp_path / "src"))]
    assert absolute(given).source == str(tmp_path / "src")
    assert absolute(given).target == "meta://bucket/run/"
    assert absolute(addresses("file:///data/x", "s3://bucket/")).source == "/data/x"
    assert local_roots(addresses("s3://bucket/", "gs://other/")) == []


def test_a_node_that_sees_the_same_directories_passes(tmp_path):
    src, dst = tmp_path / "src", tmp_path / "dst"
    tree(src, 50)
    probes = probe_roots(addresses(str(src), str(dst)))
    source, target = probes
    assert len(source.sample) == SAMPLE and target.marker().read_text() == target.token
    assert target.marker().parent == dst / ".mcsync"
    for probe in probes:
        assert unseen(probe, view_of(probe)) is None
    remove_markers(probes)
    assert not target.marker().exists()


def test_a_node_with_its_own_disk_at_the_path_is_refused(tmp_path):
    """The node's view: the same path holding other files (another disk), or nothing."""
    src, dst = tmp_path / "src", tmp_path / "dst"
    tree(src, 10)
    source, target = probe_roots(addresses(str(src), str(dst)))
    mine = {p: p.read_bytes() for p in src.rglob("*") if p.is_file()}
    marker = target.marker().read_text()

    shutil.rmtree(src)
    shutil.rmtree(dst)
    # Hidden from the judge, which looks again: as the driver, it still sees its files.
    missing_root = view_of(source)
    assert unseen(target, view_of(target)) == "no such directory there"
    (dst / ".mcsync").mkdir(parents=True)
    assert "is not there" in (unseen(target, view_of(target)) or "")
    tree(src, 4)  # a node whose disk holds a few other files at that path
    theirs = view_of(source)
    (dst / ".mcsync" / target.marker().name).write_text("another run's")
    wrong_marker = view_of(target)

    shutil.rmtree(src)
    for path, data in mine.items():  # the driver's files, as the driver sees them
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    for path, (_, size, mtime) in zip(sorted(mine), sorted(source.sample), strict=True):
        os.utime(path, (mtime, mtime))
        assert path.stat().st_size == size
    target.marker().write_text(marker)
    assert unseen(source, missing_root) == "no such directory there"
    assert "files sampled under it are missing or differ there" in (unseen(source, theirs)
                                                                     or "")
    assert "is not there" in (unseen(target, wrong_marker) or "")


def test_a_file_that_changed_for_the_driver_too_is_not_held_against_a_node(tmp_path):
    src = tmp_path / "src"
    tree(src, 5)
    (source,) = probe_roots(addresses(str(src), "meta://bucket/"))
    (src / "d0" / "f000.bin").write_bytes(b"being written")  # after the sample, on every node
    view = view_of(source)
    assert view.differing == ("d0/f000.bin",)
    assert unseen(source, view) is None


def test_room_counts_what_fits_on_each_node_now():
    from mcsync.scale.ray_placement import OVERHEAD, room

    options = SyncOptions(memory_limit=1 * GiB)
    assert room([(1.0, 2 * GiB), (1.0, 2 * GiB)], 8, options) == 2  # CPUs bound it
    assert room([(4.0, 2 * GiB)], 4, options) == 2  # memory: 2 x (512 MiB + 512 MiB)
    assert room([(4.0, 2 * GiB), (0.0, 8 * GiB)], 4, options) == 2  # no CPU on the second
    assert room([(0.5, 8 * GiB)], 2, options) == 0
    assert room([(2.0, OVERHEAD + 5 * MiB - 1)], 1, SyncOptions(memory_limit=5 * MiB)) == 0
    assert room([(0.9999999, 2 * GiB)], 1, options) == 1  # Ray's fractions of a CPU


def test_files_written_a_moment_ago_are_sampled_only_where_there_are_no_others(tmp_path):
    src = tmp_path / "src"
    tree(src, 6)
    old = sorted(p for p in src.rglob("*.bin"))[:2]
    for path in old:
        os.utime(path, (1_600_000_000, 1_600_000_000))
    (source,) = probe_roots(addresses(str(src), "meta://bucket/"))
    assert sorted(rel for rel, _, _ in source.sample) == sorted(
        str(p.relative_to(src)) for p in old)
