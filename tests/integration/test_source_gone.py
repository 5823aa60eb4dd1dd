"""A trainer rotating its checkpoints deletes one at the source while a run copies it: the run
still ends with exit 0, the object is reported (deferred, with why), nothing of it is left at
the target — no object, no open upload, no hidden file — and everything else is copied byte
for byte. Over real stores: a directory to SeaweedFS, and SeaweedFS to a directory."""

from __future__ import annotations

import random

import pytest

from mcsync.stores.registry import open_store
from mcsync.testing.faults import Call, Faults, Rule, faulty

from .helpers import put_objects, read_bucket, read_tree, sync_stores, write_tree

MiB = 1 << 20
ROTATED = "run/step-1/model.safetensors"


def objects() -> dict[str, bytes]:
    rnd = random.Random(41)
    return {ROTATED: rnd.randbytes(12 * MiB + 7),  # in parts of 5 MiB
            "run/step-1/config.json": b'{"step": 1}',
            "run/step-2/model.safetensors": rnd.randbytes(12 * MiB + 9)}


@pytest.mark.parametrize("direction", ["local-to-s3", "s3-to-local"])
def test_a_checkpoint_deleted_at_the_source_mid_run_is_reported_not_failed(
        direction, seaweed, bucket_factory, tmp_path, monkeypatch):
    data = objects()
    bucket = bucket_factory(seaweed)
    for name, value in seaweed.meta_env().items():
        monkeypatch.setenv(name, value)
    local = tmp_path / "tree"
    if direction == "local-to-s3":
        write_tree(local, data)
        src_url, dst_url = str(local), f"meta://{bucket}/"

        def delete_at_source() -> None:
            (local / ROTATED).unlink(missing_ok=True)
    else:
        put_objects(seaweed, bucket, data)
        src_url, dst_url = f"meta://{bucket}/", str(local)

        def delete_at_source() -> None:
            seaweed.client().delete_object(Bucket=bucket, Key=ROTATED)

    def rotate(call: Call) -> None:
        delete_at_source()

    # After the first read of the rotated checkpoint's bytes, whatever operation that is.
    reads = ("get", "open_range", "read_into")
    source = faulty(open_store(src_url), Faults([Rule(op, key=ROTATED, phase="after",
                                                      action=rotate) for op in reads]))
    report = sync_stores(source, dst_url, part_size=5 * MiB)
    assert report.ok and report.exit_code == 0, report.failures
    assert [k for k, why in report.deferred if "deleted at the source" in why] == [ROTATED]
    del data[ROTATED]
    if direction == "local-to-s3":
        assert read_bucket(seaweed, bucket) == data
        assert not seaweed.client().list_multipart_uploads(Bucket=bucket).get("Uploads")
    else:
        assert read_tree(local) == data  # no hidden temporary file left either
