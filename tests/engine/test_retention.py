"""Retention (``--keep-last``, ``--keep-every``) on in-process stores: after a run, the target
holds the checkpoints the rules keep and the root marker; what the rules drop is never copied
back; the source is never touched; a prune cut short is finished by the next run; bad input is
refused in one line."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

import mcsync
from mcsync.checkpoints.latest import step_of
from mcsync.checkpoints.retention import Checkpoint, Policy, decide
from mcsync.errors import UsageError
from mcsync.events import CheckpointKept, CheckpointPruned, Event
from mcsync.stores.memory import MemoryEndpoint, MemoryStore
from mcsync.testing.faults import Faults, Rule, faulty

from .test_engine import contents, payload, seed

STEPS = range(100, 900, 100)


def deepspeed(step: int) -> dict[str, bytes]:
    d = f"global_step{step}/"
    return {d + "mp_rank_00_model_states.pt": payload(3000 + step, step),
            d + "zero_pp_rank_0_mp_rank_00_optim_states.pt": payload(5000, step + 1)}


def hf(step: int) -> dict[str, bytes]:
    d = f"checkpoint-{step}/"
    return {d + "model.safetensors": payload(4000, step), d + "optimizer.pt": payload(2000, step),
            d + "trainer_state.json": json.dumps({"global_step": step}).encode()}


def dcp(step: int) -> dict[str, bytes]:
    d = f"step-{step}/"
    return {d + "__0_0.distcp": payload(3000, step), d + "__1_0.distcp": payload(3000, step + 1),
            d + ".metadata": b"meta-%d" % step}


def megatron(step: int) -> dict[str, bytes]:
    d = f"iter_{step:07d}/"
    return {d + "mp_rank_00/model_optim_rng.pt": payload(3000, step),
            d + "mp_rank_01/model_optim_rng.pt": payload(3000, step + 1)}


def orbax(step: int) -> dict[str, bytes]:
    d = f"{step}/"
    return {d + "_CHECKPOINT_METADATA": b"{}", d + "default/array.zarr": payload(3000, step),
            d + "commit_success.txt": b"ok"}


def nemo(step: int) -> dict[str, bytes]:
    d = f"megatron_gpt--val_loss=1.50-step={step}-consumed_samples={step * 8}.0/"
    return {d + "model_weights/common.pt": payload(3000, step),
            d + "model_weights/metadata.json": b"{}"}


def trained(framework: str, steps: range = STEPS) -> dict[str, bytes]:
    out: dict[str, bytes] = {}
    for step in steps:
        out |= {"deepspeed": deepspeed, "hf": hf, "dcp": dcp, "megatron": megatron,
                "orbax": orbax, "nemo": nemo}[framework](step)
    if framework == "deepspeed":
        out["latest"] = b"global_step%d" % steps[-1]
    if framework == "megatron":
        out["latest_checkpointed_iteration.txt"] = b"%d" % steps[-1]
    return out


def stores(objects: dict[str, bytes]) -> tuple[MemoryStore, MemoryStore]:
    src = MemoryStore("run", endpoint=MemoryEndpoint())
    seed(src, objects)
    return src, MemoryStore("kept", endpoint=MemoryEndpoint("target"))


def steps_at_key(key: str) -> int | None:
    return step_of(key.split("/", 1)[0])


def run(src: Any, dst: Any, tmp_path: Path, **options: Any) -> mcsync.SyncReport:
    options.setdefault("manifest", str(tmp_path / "manifest.sqlite"))
    report: mcsync.SyncReport = asyncio.run(mcsync.async_sync(src, dst, **options))
    return report


def steps_at(store: MemoryStore) -> set[int]:
    return {n for k in contents(store) if "/" in k
            and (n := step_of(k.split("/", 1)[0])) is not None}


@pytest.mark.parametrize("framework", ["deepspeed", "hf", "dcp", "megatron", "orbax", "nemo"])
def test_one_shot_keeps_the_last_n_and_every_kth_and_never_copies_back(tmp_path, framework):
    objects = trained(framework)
    src, dst = stores(objects)
    seen: list[Event] = []

    report = run(src, dst, tmp_path, keep_last=2, keep_every=400, on_event=seen.append)

    assert report.exit_code == 0
    assert steps_at(dst) == {400, 700, 800}
    assert contents(dst) == {k: v for k, v in objects.items()
                             if "/" not in k or steps_at_key(k) in (400, 700, 800)}
    assert contents(src) == objects  # the source untouched
    kept = {e.directory: e.reason for e in seen if isinstance(e, CheckpointKept)}
    assert set(kept.values()) == {"kept: last 2", "kept: every 400"}
    # What the rules drop was never copied: nothing was pruned after the fact.
    assert report.checkpoints_pruned == 0 and report.objects_copied == len(contents(dst))

    again = run(src, dst, tmp_path, keep_last=2, keep_every=400)
    assert again.objects_copied == 0 and steps_at(dst) == {400, 700, 800}


def test_checkpoints_already_at_the_target_are_pruned_marker_first(tmp_path):
    objects = trained("hf")
    src, dst = stores(objects)
    run(src, dst, tmp_path)  # everything there first, as a sync without retention left it
    deleted: list[str] = []
    target = faulty(dst, Faults([Rule("delete", times=None,
                                      action=lambda call: deleted.append(call.key))]))

    report = run(src, target, tmp_path, keep_last=3)

    assert steps_at(dst) == {600, 700, 800}
    assert report.checkpoints_pruned == 5 and report.objects_pruned == 15
    assert report.bytes_pruned == sum(len(v) for k, v in objects.items()
                                      if any(f"-{s}/" in k for s in range(100, 600, 100)))
    for step in range(100, 600, 100):
        mine = [k for k in deleted if k.startswith(f"checkpoint-{step}/")]
        assert mine[0].endswith("trainer_state.json") and len(mine) == 3
    assert report.to_dict()["checkpoints_pruned"] == 5
    assert report.newest_checkpoint == "checkpoint-800/"
    from mcsync.state.manifest import Manifest

    manifest = Manifest(tmp_path / "manifest.sqlite", src.url, dst.url)
    try:  # the records of what was pruned are forgotten with it
        assert {e.key for e in manifest.entries()} == set(contents(dst))
    finally:
        manifest.close()


def test_a_prune_cut_short_is_finished_by_the_next_run(tmp_path):
    objects = trained("dcp")
    src, dst = stores(objects)
    run(src, dst, tmp_path)

    class Killed(BaseException):
        pass

    def kill(call: Any) -> None:
        raise Killed

    # Killed after the second delete: step-100's marker and a file of it are gone.
    cut = faulty(dst, Faults([Rule("delete", phase="after", nth=2, action=kill)]))
    with pytest.raises(BaseException):  # noqa: B017 - the "process" dies
        run(src, cut, tmp_path, keep_last=2)
    assert "step-100/.metadata" not in contents(dst)  # its marker went first
    report = run(src, dst, tmp_path, keep_last=2)
    assert steps_at(dst) == {700, 800} and report.objects_copied == 0
    assert contents(src) == objects


def test_the_root_marker_names_a_kept_checkpoint_and_incomplete_newer_ones_stay(tmp_path):
    objects = trained("deepspeed", range(100, 500, 100))
    objects |= {"global_step900/mp_rank_00_model_states.pt": b"half"}  # latest names 400
    src, dst = stores(objects)

    run(src, dst, tmp_path, keep_last=1)

    assert contents(dst)["latest"] == b"global_step400"
    assert steps_at(dst) == {400}  # 900 is not complete at the source: not copied yet
    c = [Checkpoint(f"s{n}/", "DeepSpeed", n, n != 900) for n in (100, 200, 900)]
    fates = {d.checkpoint.step: d.reason for d in decide(c, Policy(1), named=("s100/",))}
    assert fates == {900: "kept: not complete yet", 200: "kept: last 1",
                     100: "kept: named by the root marker"}


def test_optimizer_files_of_older_checkpoints_are_pruned_weights_kept(tmp_path):
    objects = trained("deepspeed", range(100, 500, 100))
    src, dst = stores(objects)

    report = run(src, dst, tmp_path, keep_last=4, prune_optimizer_older_than=2)

    left = contents(dst)
    assert steps_at(dst) == {100, 200, 300, 400}
    for step in (100, 200):
        assert f"global_step{step}/zero_pp_rank_0_mp_rank_00_optim_states.pt" not in left
        assert f"global_step{step}/mp_rank_00_model_states.pt" in left
    for step in (300, 400):
        assert f"global_step{step}/zero_pp_rank_0_mp_rank_00_optim_states.pt" in left
    again = run(src, dst, tmp_path, keep_last=4, prune_optimizer_older_than=2)
    assert again.objects_copied == 0 and report.exit_code == 0


def test_plan_says_what_would_be_pruned_and_why(tmp_path):
    objects = trained("hf")
    src, dst = stores(objects)
    seen: list[Event] = []

    run(src, dst, tmp_path, keep_last=3, keep_every=400, dry_run=True, on_event=seen.append)

    fates = {e.directory: (e.reason if isinstance(e, CheckpointKept) else "pruned")
             for e in seen if isinstance(e, CheckpointKept | CheckpointPruned)}
    assert fates == {"checkpoint-800/": "kept: last 3", "checkpoint-700/": "kept: last 3",
                     "checkpoint-600/": "kept: last 3", "checkpoint-400/": "kept: every 400",
                     **{f"checkpoint-{s}/": "pruned" for s in (100, 200, 300, 500)}}
    assert contents(dst) == {}


def test_keys_outside_checkpoint_directories_are_left_alone(tmp_path):
    objects = trained("hf") | {"README.md": b"run notes", "logs/events.out": b"tb"}
    src, dst = stores(objects)
    dst_extra = {"notes/keep.txt": b"mine", "checkpoint-x/file": b"no step, no marker"}
    seed(dst, dst_extra)

    run(src, dst, tmp_path, keep_last=1)

    left = contents(dst)
    assert steps_at(dst) >= {800} and "checkpoint-700/model.safetensors" not in left
    for key in ("README.md", "logs/events.out", *dst_extra):
        assert key in left


@pytest.mark.parametrize(("options", "says"), [
    ({"keep_last": 0}, "--keep-last must be at least 1"),
    ({"keep_every": 400}, "give --keep-last N too"),
    ({"keep_last": 2, "delete": True}, "--keep-last cannot be combined with --delete"),
])
def test_bad_retention_options_are_usage_errors(tmp_path, options, says):
    src, dst = stores(trained("hf"))
    with pytest.raises(UsageError, match=says):
        run(src, dst, tmp_path, **options)


def test_a_source_without_checkpoints_is_refused(tmp_path):
    src, dst = stores({"data/shard-0001.parquet": b"x", "data/shard-0002.parquet": b"y"})
    with pytest.raises(UsageError, match=r"no checkpoint directory of .* directly under it"):
        run(src, dst, tmp_path, keep_last=2)
    assert contents(dst) == {}


def test_metrics_count_pruned_checkpoints_and_the_newest_durable_step(tmp_path):
    from mcsync.observe.metrics import Metrics

    objects = trained("hf")
    src, dst = stores(objects)
    run(src, dst, tmp_path)
    metrics = Metrics()

    run(src, dst, tmp_path, keep_last=2, keep_every=400, on_event=metrics.emit)

    sample = metrics.registry.get_sample_value
    assert sample("mcsync_checkpoints_pruned_total") == 5
    assert sample("mcsync_checkpoint_durable_step") == 800


def test_a_trainer_resumed_from_an_older_step_keeps_the_one_its_marker_names(tmp_path):
    objects = trained("deepspeed")
    src, dst = stores(objects)
    run(src, dst, tmp_path, keep_last=1)
    assert steps_at(dst) == {800}
    seed(src, {"latest": b"global_step700"})  # rolled back to 700 (800 was bad)

    report = run(src, dst, tmp_path, keep_last=1)

    assert report.exit_code == 0 and not report.objects_deferred
    assert contents(dst)["latest"] == b"global_step700"
    assert steps_at(dst) == {700, 800}  # 800: newer than the one named (latest no longer
    # names it, so by the table it is not complete): kept, never deleted on a rollback
