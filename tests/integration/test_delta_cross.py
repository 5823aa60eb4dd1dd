"""The cross-checkpoint delta against real targets: a new checkpoint directory is composed at
the target from the chunks of earlier ones (UploadPartCopy from other keys; copy_file_range
from other files), byte-identical to the source. SeaweedFS (which checks CopySourceIfMatch)
and a local directory; moto ignores CopySourceIfMatch, so the guard is tested on SeaweedFS."""

from __future__ import annotations

import json
import random
import signal
from pathlib import Path

import pytest

from mcsync.stores.registry import open_store
from mcsync.testing.faults import Call, Faults, Rule, faulty

from .helpers import crashed_run, read_bucket, read_tree, run_cli, sync_stores, write_tree
from .test_delta import PART, checkpoint_tensors, rewrite, safetensors

MiB = 1 << 20


class Target:
    """A directory, or a prefix of a SeaweedFS bucket, read back whole."""

    def __init__(self, kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
        self.kind = kind
        if kind == "local":
            self.root = tmp_path / "dst"
            self.url, self.env = str(self.root), {}
        else:
            self.ep = request.getfixturevalue("seaweed")
            self.bucket = request.getfixturevalue("bucket_factory")(self.ep)
            self.url, self.env = f"meta://{self.bucket}/runs/", self.ep.meta_env()

    def read(self) -> dict[str, bytes]:
        if self.kind == "local":
            return read_tree(self.root)
        return read_bucket(self.ep, self.bucket, "runs/")

    def delete(self, key: str) -> None:
        if self.kind == "local":
            (self.root / key).unlink()
        else:
            self.ep.client().delete_object(Bucket=self.bucket, Key=f"runs/{key}")

    def overwrite(self, key: str, data: bytes) -> None:
        if self.kind == "local":
            (self.root / key).write_bytes(data)
        else:
            self.ep.client().put_object(Bucket=self.bucket, Key=f"runs/{key}", Body=data)


@pytest.fixture(params=["seaweed", "local"])
def target(request, tmp_path) -> Target:
    return Target(request.param, request, tmp_path)


def sync(src: Path, target: Target, *args: str) -> dict:
    result = run_cli("sync", str(src), target.url, "--part-size", "5MiB", "-q", "--json",
                     *args, env=target.env)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def per_region(target: Target) -> int:
    """What a changed region may cost beyond its bytes: S3's minimum part (none for files)."""
    return 0 if target.kind == "local" else PART


def test_a_new_step_with_one_tensor_changed_sends_only_that_tensor(target, tmp_path):
    src = tmp_path / "src"
    tensors = checkpoint_tensors()  # 36 tensors, ~60 MiB
    write_tree(src, {"run-7/step-1200/model.safetensors": safetensors(tensors)})
    sync(src, target)
    changed = ["layers.4.mlp.up.weight"]
    step2 = safetensors(rewrite(tensors, changed))
    write_tree(src, {"run-7/step-1300/model.safetensors": step2})
    report = sync(src, target)
    assert target.read() == read_tree(src)
    assert report["bytes_sent"] <= 0.05 * len(step2) + per_region(target)
    assert report["bytes_reused_cross_object"] >= len(step2) - 2 * MiB - per_region(target)
    assert report["bytes_reused_same_key"] == 0
    (obj,) = [o for o in report["objects"] if o["key"].endswith("step-1300/model.safetensors")]
    assert [k for k, _ in obj["reused_from"]] == ["run-7/step-1200/model.safetensors"]


def test_five_fine_tune_steps_send_about_what_changed(target, tmp_path):
    """Each step rewrites 10-30% of the tensors of the one before; each new step directory
    is composed from the earlier ones and sends within 1.1x of what changed, plus at most a
    minimum part per changed region."""
    src = tmp_path / "src"
    rnd = random.Random(5)
    tensors = checkpoint_tensors(1)
    names = list(tensors)
    write_tree(src, {"ft/step-0/model.safetensors": safetensors(tensors)})
    sync(src, target)
    for step in range(1, 5):
        changed = rnd.sample(names, rnd.randint(len(names) // 10, 3 * len(names) // 10))
        tensors = rewrite(tensors, changed, seed=step)
        write_tree(src, {f"ft/step-{step}/model.safetensors": safetensors(tensors)})
        report = sync(src, target)
        changed_bytes = sum(len(tensors[n]) for n in changed)
        assert report["bytes_sent"] <= 1.1 * changed_bytes + len(changed) * per_region(target) \
            + 64 * 1024, (step, report["bytes_sent"], changed_bytes)
    assert target.read() == read_tree(src)


def test_renamed_shards_are_copied_at_the_target(target, tmp_path):
    src = tmp_path / "src"
    shards = {f"ckpt/model-0000{i}-of-00003.safetensors": safetensors(checkpoint_tensors(i))
              for i in range(1, 4)}
    write_tree(src, shards)
    sync(src, target)
    for key, data in shards.items():  # the same bytes under new names, the old ones gone
        (src / key).unlink()
        write_tree(src, {key.replace("ckpt/", "ckpt-final/"): data})
    report = sync(src, target, "--delete")
    assert target.read() == read_tree(src)
    assert report["objects_deleted"] == 3
    assert report["bytes_sent"] <= 3 * per_region(target), report["bytes_sent"]


def test_a_new_step_composes_around_earlier_steps_deleted_at_the_target(target, tmp_path):
    """A retention rule at the target removed step-1 and step-2 behind mcsync's back (and
    the trainer removed them from the source): the chunk index still names both. step-3 is
    composed from step-0, which is still there, and the next run finds nothing to do."""
    src = tmp_path / "src"
    tensors = checkpoint_tensors()
    write_tree(src, {"t/step-0/model.safetensors": safetensors(tensors)})
    sync(src, target)
    for step, name in ((1, "layers.2.mlp.up.weight"), (2, "layers.4.norm.weight")):
        tensors = rewrite(tensors, [name], seed=step)
        write_tree(src, {f"t/step-{step}/model.safetensors": safetensors(tensors)})
        sync(src, target)
    for step in (1, 2):
        target.delete(f"t/step-{step}/model.safetensors")
        (src / f"t/step-{step}/model.safetensors").unlink()
    step3 = safetensors(rewrite(tensors, ["layers.6.attn.qkv.weight"], seed=3))
    write_tree(src, {"t/step-3/model.safetensors": step3})
    report = sync(src, target)
    assert target.read() == read_tree(src)
    (obj,) = [o for o in report["objects"] if o["key"] == "t/step-3/model.safetensors"]
    assert [k for k, _ in obj["reused_from"]] == ["t/step-0/model.safetensors"]
    assert report["bytes_sent"] <= 0.15 * len(step3) + 3 * per_region(target)
    again = sync(src, target)
    assert again["bytes_sent"] == 0 and again["objects_failed"] == 0


@pytest.mark.parametrize("change", ["overwritten", "deleted"])
def test_a_base_changed_between_plan_and_compose_is_not_used(change, seaweed, bucket_factory,
                                                             tmp_path, monkeypatch):
    src = tmp_path / "src"
    tensors = checkpoint_tensors()
    step1 = safetensors(tensors)
    write_tree(src, {"a/step-1/model.safetensors": step1})
    bucket = bucket_factory(seaweed)
    for name, value in seaweed.meta_env().items():
        monkeypatch.setenv(name, value)
    assert sync_stores(str(src), f"meta://{bucket}/", part_size=PART).ok
    step2 = safetensors(rewrite(tensors, ["layers.0.norm.weight"]))
    write_tree(src, {"a/step-2/model.safetensors": step2})
    replaced: list[bool] = []

    def overwrite_the_base(_: Call) -> None:  # after the plan, before the first part copy
        if not replaced:
            replaced.append(True)
            if change == "deleted":
                seaweed.client().delete_object(Bucket=bucket, Key="a/step-1/model.safetensors")
            else:
                seaweed.client().put_object(Bucket=bucket, Key="a/step-1/model.safetensors",
                                            Body=b"not the checkpoint any more")

    target = faulty(open_store(f"meta://{bucket}/"),
                    Faults([Rule("copy_part", times=None, action=overwrite_the_base)]))
    report = sync_stores(str(src), target, part_size=PART)
    assert replaced and report.ok, report.failures
    assert read_bucket(seaweed, bucket)["a/step-2/model.safetensors"] == step2
    assert report.bytes_reused == 0 and report.bytes_sent == len(step2)


@pytest.mark.parametrize("point, base_deleted", [
    ("copy:2", False), ("stage-part:1", False), ("complete:1", False),
    ("complete-done:1", False), ("copy:2", True)])
def test_killed_cross_object_compose_resumes_to_the_same_target(point, base_deleted, seaweed,
                                                                 bucket_factory, tmp_path):
    """``base_deleted``: after the kill, a retention rule deletes step-1 at the target (and
    the trainer at the source): the rerun must not go on copying parts from it."""
    src = tmp_path / "src"
    tensors = checkpoint_tensors()
    write_tree(src, {"r/step-1/model.safetensors": safetensors(tensors)})
    bucket = bucket_factory(seaweed)
    dst, env = f"meta://{bucket}/", seaweed.meta_env()
    assert run_cli("sync", str(src), dst, "--part-size", "5MiB", "-q", env=env).exit_code == 0
    step2 = safetensors(rewrite(tensors, ["layers.3.attn.qkv.weight", "layers.9.mlp.up.weight"]))
    write_tree(src, {"r/step-2/model.safetensors": step2})
    proc = crashed_run(point, "sync", str(src), dst, "--part-size", "5MiB", "-q", env=env)
    assert proc.returncode == -signal.SIGKILL, (point, proc.returncode, proc.stderr)
    if base_deleted:
        seaweed.client().delete_object(Bucket=bucket, Key="r/step-1/model.safetensors")
        (src / "r/step-1/model.safetensors").unlink()
    result = run_cli("sync", str(src), dst, "--part-size", "5MiB", "-q", "--json", env=env)
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert read_bucket(seaweed, bucket) == read_tree(src)
    if point == "complete-done:1":  # it had completed: recognised, nothing sent again
        assert report["bytes_sent"] == 0
    elif base_deleted:  # nothing left to compose from: sent whole, once
        assert report["bytes_sent"] <= len(step2)
    else:
        assert report["bytes_sent"] <= 5 * MiB + 2 * PART + 3 * MiB
    assert not seaweed.client().list_multipart_uploads(Bucket=bucket).get("Uploads")


@pytest.mark.slow
def test_a_renamed_500_mib_object_sends_nothing(target, tmp_path):
    src = tmp_path / "src"
    rnd = random.Random(3)  # randbytes takes at most 2**31 bits at once
    data = b"".join(rnd.randbytes(50 * MiB) for _ in range(10))
    write_tree(src, {"big/old.bin": data})
    sync(src, target)
    (src / "big" / "old.bin").rename(src / "big" / "new.bin")
    report = sync(src, target, "--delete")
    assert report["bytes_sent"] == 0 and report["bytes_reused_cross_object"] == len(data)
    assert target.read() == {"big/new.bin": data}
