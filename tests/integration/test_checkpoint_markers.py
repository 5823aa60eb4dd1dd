"""A checkpoint directory's completion is read from the source with as few requests as the
run's listing allows: a marker the listing has already passed (Orbax's probe, DCP's
.metadata) is answered by it; one still ahead (the Hugging Face Trainer's trainer_state.json)
costs a HEAD. SeaweedFS through the fault proxy, which records every request."""

from __future__ import annotations

from pathlib import Path

import mcsync
from mcsync.stores.s3 import S3Store
from mcsync.stores.s3_keys import S3Credentials
from testbed.faultproxy import FaultProxy
from testbed.servers import S3Endpoint

from .helpers import new_bucket, put_objects, read_tree

HF = {
    "config.json": b'{"model_type": "llama"}',
    "model-00001-of-00002.safetensors": b"w" * 3000,
    "model-00002-of-00002.safetensors": b"v" * 2000,
    "model.safetensors.index.json": b'{"weight_map": {}}',
    "optimizer.pt": b"o" * 500,
}


def _source(ep: S3Endpoint, proxy: FaultProxy, bucket: str) -> S3Store:
    return S3Store(scheme="s3", bucket=bucket, prefix="run/", endpoint_url=proxy.url,
                   region=ep.region, credentials=S3Credentials(ep.access_key, ep.secret_key))


def test_a_hugging_face_checkpoint_costs_one_head_and_an_unfinished_one_waits(
        seaweed: S3Endpoint, seaweed_proxy: FaultProxy, tmp_path: Path) -> None:
    bucket = new_bucket(seaweed)
    done = {f"checkpoint-100/{k}": v for k, v in HF.items()}
    done["checkpoint-100/trainer_state.json"] = b'{"global_step": 100}'
    writing = {f"checkpoint-200/{k}": v for k, v in HF.items()}  # no trainer_state.json yet
    put_objects(seaweed, bucket, done | writing, prefix="run/")

    report = mcsync.sync(_source(seaweed, seaweed_proxy, bucket), str(tmp_path / "dst"))

    assert report.exit_code == 0
    assert read_tree(tmp_path / "dst") == done
    assert report.objects_deferred == len(writing)
    # Orbax's _CHECKPOINT_METADATA (either directory's name could be Orbax's) sorts before
    # config.json, so the listing has answered for it by then.
    heads = sorted(e.key for e in seaweed_proxy.exchanges("HeadObject"))
    assert heads == ["run/checkpoint-100/trainer_state.json",
                     "run/checkpoint-200/trainer_state.json"]
