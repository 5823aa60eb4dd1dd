"""--latest-checkpoint on in-process stores: of the checkpoints under the source, the newest
complete one (the one a marker names, where a framework keeps one) and that marker reach the
target, nothing else; the source is listed level by level, never whole; no checkpoint is a
NoCheckpoint naming the source."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import mcsync
from mcsync.checkpoints.latest import step_of
from mcsync.errors import NoCheckpoint, UsageError
from mcsync.events import CheckpointChosen, Event
from mcsync.stores.memory import MemoryEndpoint, MemoryStore
from mcsync.testing.faults import Call, Faults, Rule, faulty

from .test_engine import PART, contents, payload, seed


def stores(objects: dict[str, bytes], clock: Any = None) -> tuple[MemoryStore, MemoryStore]:
    ep = MemoryEndpoint(clock=clock) if clock else MemoryEndpoint()
    src = MemoryStore("run", endpoint=ep)
    seed(src, objects)
    return src, MemoryStore("restore", endpoint=MemoryEndpoint("target"))  # bytes move


def run(src: Any, dst: Any, tmp_path: Path, **options: Any) -> mcsync.SyncReport:
    options.setdefault("manifest", str(tmp_path / "manifest.sqlite"))
    options.setdefault("part_size", PART)
    report: mcsync.SyncReport = asyncio.run(
        mcsync.async_sync(src, dst, latest_checkpoint=True, **options))
    return report


def deepspeed(step: int, *, complete: bool = True) -> dict[str, bytes]:
    d = f"global_step{step}/"
    files = {d + "mp_rank_00_model_states.pt": payload(PART + step, step),
             d + "zero_pp_rank_0_mp_rank_00_optim_states.pt": payload(2 * PART + 7, step + 1)}
    return files if complete else dict(list(files.items())[:1])


def test_deepspeed_the_checkpoint_latest_names_and_latest_itself(tmp_path: Path) -> None:
    older, named = deepspeed(100), deepspeed(200)
    writing = deepspeed(300, complete=False)  # newer, and `latest` does not name it yet
    src, dst = stores({**older, **named, **writing, "latest": b"global_step200",
                       "zero_to_fp32.py": b"#!/usr/bin/env python"})
    seen: list[Event] = []

    report = run(src, dst, tmp_path, on_event=seen.append)

    assert report.exit_code == 0
    assert contents(dst) == {**named, "latest": b"global_step200"}
    assert report.latest_checkpoint == "global_step200/"
    chosen = [e for e in seen if isinstance(e, CheckpointChosen)]
    assert chosen == [CheckpointChosen("global_step200/", "DeepSpeed", 200, "latest",
                                       (("global_step300/", "latest names global_step200"),))]
    # Written last, as every marker: a reader that finds it finds the checkpoint whole.
    assert report.objects[-1].key == "latest"


def test_a_second_run_copies_nothing(tmp_path: Path) -> None:
    src, dst = stores({**deepspeed(100), "latest": b"global_step100"})
    run(src, dst, tmp_path)
    again = run(src, dst, tmp_path)
    assert (again.objects_copied, again.objects_skipped) == (0, 3)


def test_a_marker_naming_a_missing_directory_is_no_checkpoint(tmp_path: Path) -> None:
    src, dst = stores({**deepspeed(100), "latest": b"global_step900"})
    with pytest.raises(NoCheckpoint, match=r"memory://mem/run/: latest names 'global_step900', "
                                           r"which is not there"):
        run(src, dst, tmp_path)
    assert contents(dst) == {}


def test_deepspeed_without_latest_has_no_complete_checkpoint(tmp_path: Path) -> None:
    src, dst = stores(deepspeed(100))
    with pytest.raises(NoCheckpoint, match="passed over global_step100/: DeepSpeed checkpoint "
                                           "not complete: no latest naming it yet"):
        run(src, dst, tmp_path)


def hugging_face(step: int, *, complete: bool = True) -> dict[str, bytes]:
    d = f"checkpoint-{step}/"
    files = {d + "config.json": b'{"model_type": "llama"}',
             d + "model.safetensors": payload(PART + 3, step),
             d + "optimizer.pt": payload(1000, step + 1)}
    if complete:
        files[d + "trainer_state.json"] = b'{"global_step": %d}' % step
    return files


def test_hugging_face_the_highest_complete_step(tmp_path: Path) -> None:
    # 1000 > 900 as numbers, not as names ("checkpoint-1000" < "checkpoint-900").
    done = hugging_face(1000)
    src, dst = stores({**hugging_face(900), **done, **hugging_face(1100, complete=False),
                       "runs/events.out.tfevents": b"tb", "config.json": b"{}",
                       "tmp-checkpoint-1200/model.safetensors": b"staged"})
    seen: list[Event] = []

    report = run(src, dst, tmp_path, on_event=seen.append)

    assert contents(dst) == done
    chosen = next(e for e in seen if isinstance(e, CheckpointChosen))
    assert (chosen.directory, chosen.framework, chosen.step, chosen.marker) == (
        "checkpoint-1000/", "Hugging Face Trainer", 1000, None)
    assert chosen.passed_over == (
        ("checkpoint-1100/", "Hugging Face Trainer checkpoint not complete: "
                             "no trainer_state.json yet"),)
    assert report.objects_deferred == 0


def dcp(name: str, *, complete: bool = True) -> dict[str, bytes]:
    files = {f"{name}/__0_0.distcp": payload(PART + 11, len(name)),
             f"{name}/__1_0.distcp": payload(999, len(name) + 1)}
    if complete:
        files[f"{name}/.metadata"] = b"dcp metadata " + name.encode()
    return files


def test_pytorch_dcp_the_highest_complete_step(tmp_path: Path) -> None:
    done = dcp("step_200")
    src, dst = stores({**dcp("step_100"), **done, **dcp("step_300", complete=False)})
    report = run(src, dst, tmp_path)
    assert contents(dst) == done
    assert report.latest_checkpoint == "step_200/"


def test_megatron_the_iteration_its_marker_names(tmp_path: Path) -> None:
    def iteration(n: int) -> dict[str, bytes]:
        return {f"iter_{n:07d}/mp_rank_0{r}/model_optim_rng.pt": payload(700 + r, n + r)
                for r in range(2)}

    src, dst = stores({**iteration(100), **iteration(200), **iteration(300),
                       "latest_checkpointed_iteration.txt": b"200\n"})
    run(src, dst, tmp_path)
    assert contents(dst) == {**iteration(200), "latest_checkpointed_iteration.txt": b"200\n"}


def test_names_without_numbers_go_by_their_newest_file(tmp_path: Path) -> None:
    now = [1000.0]
    src, dst = stores({}, clock=lambda: now[0])
    seed(src, dcp("final"))
    now[0] = 2000.0
    seed(src, dcp("best"))  # sorts first, written last
    seed(src, dcp("zz-partial", complete=False))
    report = run(src, dst, tmp_path)
    assert contents(dst) == dcp("best")
    assert report.latest_checkpoint == "best/"


def test_no_checkpoint_names_the_source_and_what_was_looked_for(tmp_path: Path) -> None:
    src, dst = stores({"data/a.bin": b"a", "notes.txt": b"n"})
    with pytest.raises(NoCheckpoint) as caught:
        run(src, dst, tmp_path)
    message = str(caught.value)
    assert message.startswith("memory://mem/run/: no complete checkpoint: looked for checkpoint "
                              "directories of PyTorch DCP, DeepSpeed")
    assert "\n" not in message


def test_refused_with_delete() -> None:
    with pytest.raises(UsageError, match="--latest-checkpoint cannot be combined with --delete"):
        mcsync.SyncOptions(latest_checkpoint=True, delete=True)


def test_the_source_is_listed_by_level_and_read_once(tmp_path: Path) -> None:
    """A hundred checkpoints: one level listing of the top, one of the checkpoint chosen (the
    newest, complete), no full listing, no HEAD, and one GET per file copied."""
    objects: dict[str, bytes] = {}
    for step in range(100, 10_100, 100):
        objects |= {f"checkpoint-{step}/trainer_state.json": b"{}",
                    f"checkpoint-{step}/model.safetensors": b"m%d" % step}
    src, dst = stores(objects)
    calls: Counter[str] = Counter()

    def count(call: Call) -> None:
        calls[call.op] += 1

    source = faulty(src, Faults([Rule("*", phase="before", times=None, action=count)]))
    run(source, dst, tmp_path)

    assert contents(dst) == {k: v for k, v in objects.items()
                             if k.startswith("checkpoint-10000/")}
    # list_level: the top, then the chosen one, whose listing the run takes as it is; a
    # check of the source before the run; one read of each file.
    assert calls == Counter({"list_level": 2, "check": 1, "get": 2})


def test_step_numbers() -> None:
    assert [step_of(n) for n in ("global_step1200", "iter_0001200", "checkpoint-1200",
                                 "step=1200", "epoch=3-step=1200-consumed=9", "100", "final")
            ] == [1200, 1200, 1200, 1200, 1200, 100, None]


def test_nemo_passes_over_a_checkpoint_marked_unfinished(tmp_path: Path) -> None:
    def nemo(step: int) -> dict[str, bytes]:
        d = f"megatron_gpt--val_loss=1.2-step={step}-consumed_samples={step * 8}.0/"
        return {d + "model_weights/common.pt": payload(900, step),
                d + "model_config.yaml": b"cfg %d" % step}

    writing = nemo(300)
    marker = next(iter(writing)).split("/")[0] + "-unfinished"
    src, dst = stores({**nemo(100), **nemo(200), **writing, marker: b""})
    report = run(src, dst, tmp_path)
    assert contents(dst) == nemo(200)
    assert report.latest_checkpoint.startswith("megatron_gpt--val_loss=1.2-step=200-")


def test_orbax_in_the_making_is_never_chosen(tmp_path: Path) -> None:
    def orbax(name: str, committed: bool = True) -> dict[str, bytes]:
        files = {f"{name}/_CHECKPOINT_METADATA": b"{}",
                 f"{name}/default/array.zarr": payload(1200, len(name))}
        return files | ({f"{name}/commit_success.txt": b"ok"} if committed else {})

    src, dst = stores({**orbax("100"), **orbax("200"), **orbax("300", committed=False),
                       **orbax("400.orbax-checkpoint-tmp-1733", committed=False)})
    report = run(src, dst, tmp_path)
    assert (contents(dst), report.latest_checkpoint) == (orbax("200"), "200/")
    assert [d for d, _ in passed_over_of(src)] == ["300/"]


def passed_over_of(src: MemoryStore) -> tuple[tuple[str, str], ...]:
    from mcsync.checkpoints.latest import choose

    return asyncio.run(choose(src)).passed_over
