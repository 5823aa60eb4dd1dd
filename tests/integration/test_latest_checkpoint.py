"""``sync SRC DST --latest-checkpoint`` on SeaweedFS, byte for byte: for DeepSpeed, the Hugging
Face Trainer and PyTorch DCP, with an older complete checkpoint and a newer one not complete
yet, only the newest complete one (and the marker that names it) reaches the target, nothing
else; from a local directory too; no checkpoint is exit 4 in one line; through the fault proxy,
the source is listed one level at a time, never whole, and read once, with no HEAD."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

import mcsync
from mcsync.stores.s3 import S3Store
from mcsync.stores.s3_keys import S3Credentials
from testbed.faultproxy import FaultProxy
from testbed.servers import S3Endpoint

from .helpers import new_bucket, put_objects, read_bucket, read_tree, run_cli, write_tree

MiB = 1 << 20


def data(size: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(size)


def deepspeed(step: int, complete: bool) -> dict[str, bytes]:
    d = f"global_step{step}/"
    files = {d + "mp_rank_00_model_states.pt": data(6 * MiB + step, step),  # in parts
             d + "zero_pp_rank_0_mp_rank_00_optim_states.pt": data(300_000, step + 1)}
    return files if complete else dict(list(files.items())[:1])


def hugging_face(step: int, complete: bool) -> dict[str, bytes]:
    d = f"checkpoint-{step}/"
    files = {d + "config.json": b'{"model_type": "llama"}',
             d + "model.safetensors": data(6 * MiB + step, step),
             d + "optimizer.pt": data(200_000, step + 1),
             d + "rng_state.pth": data(14_000, step + 2)}
    if complete:
        files[d + "trainer_state.json"] = b'{"global_step": %d}' % step
    return files


def dcp(step: int, complete: bool) -> dict[str, bytes]:
    d = f"step_{step}/"
    files = {d + "__0_0.distcp": data(6 * MiB + step, step),
             d + "__1_0.distcp": data(500_000, step + 1)}
    if complete:
        files[d + ".metadata"] = b"metadata of step %d" % step
    return files


# name → (layout, marker files beside the checkpoints, the directory chosen)
LAYOUTS = {
    "deepspeed": (deepspeed, {"latest": b"global_step200"}, "global_step200/"),
    "hugging-face": (hugging_face, {}, "checkpoint-200/"),
    "pytorch-dcp": (dcp, {}, "step_200/"),
}


def source_objects(name: str) -> tuple[dict[str, bytes], dict[str, bytes]]:
    """What the source holds (an older complete checkpoint, the newest complete one, a newer
    one not complete, files beside them), and what the target must hold after."""
    layout, markers, _ = LAYOUTS[name]
    chosen = layout(200, True)
    held = {**layout(100, True), **chosen, **layout(300, False), **markers,
            "README.md": b"notes beside the checkpoints"}
    return held, {**chosen, **markers}


@pytest.mark.parametrize("name", LAYOUTS)
def test_only_the_newest_complete_checkpoint_and_its_marker(
        name: str, seaweed: S3Endpoint, tmp_path: Path) -> None:
    bucket = new_bucket(seaweed)
    held, expected = source_objects(name)
    put_objects(seaweed, bucket, held, prefix="run/")

    result = run_cli("sync", f"meta://{bucket}/run/", str(tmp_path / "ckpt"),
                     "--latest-checkpoint", "--part-size", "5MiB", "--json",
                     env=seaweed.meta_env())

    assert result.exit_code == 0, result.output
    assert read_tree(tmp_path / "ckpt") == expected
    report = json.loads(result.stdout)
    assert report["latest_checkpoint"] == LAYOUTS[name][2]
    assert report["objects_copied"] == len(expected)
    assert f"latest checkpoint: {LAYOUTS[name][2]}" in result.stderr
    assert "passed over" in result.stderr  # the newer one, not complete


def test_from_a_local_directory(seaweed: S3Endpoint, tmp_path: Path) -> None:
    held, expected = source_objects("hugging-face")
    write_tree(tmp_path / "run", held)
    bucket = new_bucket(seaweed)

    result = run_cli("sync", str(tmp_path / "run"), f"meta://{bucket}/restore/",
                     "--latest-checkpoint", "--part-size", "5MiB", env=seaweed.meta_env())

    assert result.exit_code == 0, result.output
    assert read_bucket(seaweed, bucket, "restore/") == expected
    plan = run_cli("plan", str(tmp_path / "run"), str(tmp_path / "elsewhere"),
                   "--latest-checkpoint", env={})
    assert plan.exit_code == 0, plan.output
    assert "latest checkpoint: checkpoint-200/ (Hugging Face Trainer, step 200)" in plan.stderr
    assert not (tmp_path / "elsewhere").exists()


def test_no_checkpoint_is_exit_4_in_one_line(seaweed: S3Endpoint, tmp_path: Path) -> None:
    bucket = new_bucket(seaweed)
    put_objects(seaweed, bucket, {"run/data/a.bin": b"a", **{
        f"run/{k}": v for k, v in hugging_face(100, False).items()}})

    result = run_cli("sync", f"meta://{bucket}/run/", str(tmp_path / "ckpt"),
                     "--latest-checkpoint", env=seaweed.meta_env())

    assert result.exit_code == 4
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith(f"mcsync: no checkpoint: meta://{bucket}/run/: no complete "
                               "checkpoint: looked for checkpoint directories of")
    assert "checkpoint-100/: Hugging Face Trainer checkpoint not complete" in lines[0]
    assert read_tree(tmp_path / "ckpt", with_state=True) == {}  # made by the check alone
    refused = run_cli("sync", f"meta://{bucket}/run/", str(tmp_path / "ckpt"),
                      "--latest-checkpoint", "--delete", env=seaweed.meta_env())
    assert refused.exit_code == 2
    assert "cannot be combined with --delete" in refused.stderr


def test_the_source_is_listed_by_level_and_each_file_read_once(
        seaweed: S3Endpoint, seaweed_proxy: FaultProxy, tmp_path: Path) -> None:
    bucket = new_bucket(seaweed)
    held: dict[str, bytes] = {}
    for step in range(100, 2100, 100):  # twenty checkpoints
        held |= deepspeed(step, True)
    held["latest"] = b"global_step2000"
    put_objects(seaweed, bucket, held, prefix="run/")
    source = S3Store(scheme="s3", bucket=bucket, prefix="run/", endpoint_url=seaweed_proxy.url,
                     region=seaweed.region,
                     credentials=S3Credentials(seaweed.access_key, seaweed.secret_key))

    report = mcsync.sync(source, str(tmp_path / "ckpt"), latest_checkpoint=True,
                         part_size=5 * MiB)

    expected = {**deepspeed(2000, True), "latest": b"global_step2000"}
    assert report.exit_code == 0
    assert read_tree(tmp_path / "ckpt") == expected
    # The check's one page (a flat listing of up to 1,000 keys), then one level each: the top,
    # the chosen directory.
    lists = [e.target.split("?", 1)[1] for e in seaweed_proxy.exchanges("ListObjects*")]
    assert lists == ["list-type=2&prefix=run%2F", "delimiter=%2F&list-type=2&prefix=run%2F",
                     "delimiter=%2F&list-type=2&prefix=run%2Fglobal_step2000%2F"]
    assert seaweed_proxy.exchanges("HeadObject") == []
    gets = sorted({e.key for e in seaweed_proxy.exchanges("GetObject")})
    assert gets == sorted(f"run/{k}" for k in expected)
