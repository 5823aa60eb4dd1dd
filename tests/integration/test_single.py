"""One file or one object as SRC (as ``aws s3 cp``): to a prefix (DST ending in ``/``) or to an
object DST names, on SeaweedFS (meta://, s3://) and a local target, byte for byte; a re-run is
a no-op, a changed file goes as a block delta; prefixes keep their meaning; nonsense is exit 2
in one line."""

from __future__ import annotations

import json
import random
from pathlib import Path

import mcsync

from .helpers import put_objects, read_bucket, read_tree, run_cli

MiB = 1 << 20


def model(seed: int = 1) -> bytes:
    return random.Random(seed).randbytes(20 * MiB + 3)


def sync(*args: str, env: dict[str, str]) -> dict:
    result = run_cli("sync", *args, "--json", env=env)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_a_file_to_a_prefix_then_a_no_op_then_a_delta(seaweed, bucket_factory, tmp_path):
    bucket = bucket_factory(seaweed)
    put_objects(seaweed, bucket, {"m/keep.bin": b"a sibling, untouched"})
    src = tmp_path / "model.safetensors"
    src.write_bytes(model())
    (tmp_path / "other.bin").write_bytes(b"not asked for")
    env = seaweed.meta_env()
    args = (str(src), f"meta://{bucket}/m/")

    first = sync(*args, env=env)
    assert first["objects_copied"] == 1
    assert read_bucket(seaweed, bucket, "m/") == {"model.safetensors": model(),
                                                  "keep.bin": b"a sibling, untouched"}
    again = sync(*args, env=env)
    assert (again["objects_copied"], again["objects_skipped"], again["bytes_sent"]) == (0, 1, 0)

    changed = bytearray(model())
    changed[5 * MiB:5 * MiB + 4] = b"edit"
    src.write_bytes(bytes(changed))
    delta = sync(*args, env=env)
    assert delta["objects_copied"] == 1 and delta["bytes_reused"] > 0
    assert delta["bytes_sent"] < len(changed) // 2
    assert read_bucket(seaweed, bucket, "m/") == {"model.safetensors": bytes(changed),
                                                  "keep.bin": b"a sibling, untouched"}


def test_a_target_without_a_slash_names_the_object(seaweed, bucket_factory, tmp_path):
    bucket = bucket_factory(seaweed)
    src = tmp_path / "model.safetensors"
    src.write_bytes(b"weights")
    result = run_cli("sync", str(src), f"meta://{bucket}/m/renamed.bin", env=seaweed.meta_env())
    assert result.exit_code == 0, result.output
    assert "copied 1 object (" in result.output
    assert read_bucket(seaweed, bucket, "m/") == {"renamed.bin": b"weights"}


def test_an_object_to_a_local_directory_and_to_a_file(seaweed, bucket_factory, tmp_path):
    bucket = bucket_factory(seaweed)
    put_objects(seaweed, bucket, {"run/model.bin": model(2), "run/model.bin.json": b"{}"})
    env = seaweed.aws_env()
    into = tmp_path / "into"
    first = sync(f"s3://{bucket}/run/model.bin", f"{into}/", env=env)
    assert first["objects_copied"] == 1 and read_tree(into) == {"model.bin": model(2)}
    assert sync(f"s3://{bucket}/run/model.bin", f"{into}/", env=env)["bytes_sent"] == 0

    named = tmp_path / "elsewhere" / "weights.bin"
    sync(f"s3://{bucket}/run/model.bin", str(named), env=env)
    assert named.read_bytes() == model(2)
    assert sorted(p.name for p in named.parent.iterdir()) == [".mcsync", "weights.bin"]


def test_a_prefix_keeps_its_meaning(seaweed, bucket_factory, tmp_path):
    """``s3://b/data`` is a prefix whenever keys lie under ``data/``, even with a ``data``
    object beside them."""
    bucket = bucket_factory(seaweed)
    put_objects(seaweed, bucket, {"data": b"an object", "data/a": b"a", "data/b/c": b"c"})
    sync(f"s3://{bucket}/data", str(tmp_path / "out"), env=seaweed.aws_env())
    assert read_tree(tmp_path / "out") == {"a": b"a", "b/c": b"c"}


def test_a_file_onto_an_existing_directory_goes_into_it_as_cp(tmp_path):
    (tmp_path / "model.bin").write_bytes(b"m")
    (tmp_path / "dst").mkdir()
    result = run_cli("sync", str(tmp_path / "model.bin"), str(tmp_path / "dst"))
    assert result.exit_code == 0, result.output
    assert read_tree(tmp_path / "dst") == {"model.bin": b"m"}


def test_nonsense_is_one_line(tmp_path):
    src = tmp_path / "model.bin"
    src.write_bytes(b"m")
    for args, cause in ((["--delete", str(src), str(tmp_path / "d/")], "--delete"),
                        ([str(src), str(src)], "the target is the source file itself")):
        result = run_cli("sync", *args)
        assert result.exit_code == 2, result.output
        (line,) = result.output.splitlines()
        assert line.startswith("mcsync: error: ") and cause in line


def test_the_library_takes_one_file(tmp_path):
    src = tmp_path / "a" / "model.bin"
    src.parent.mkdir()
    src.write_bytes(b"weights")
    report = mcsync.sync(str(src), str(tmp_path / "b") + "/")
    assert report.ok and report.objects_copied == 1
    assert Path(tmp_path / "b" / "model.bin").read_bytes() == b"weights"


def test_an_object_to_another_name_on_the_same_endpoint(seaweed, bucket_factory):
    """s3:// and meta:// on one endpoint: the object may be copied server-side, from its real
    key to the target's name."""
    src_bucket, dst_bucket = bucket_factory(seaweed), bucket_factory(seaweed)
    put_objects(seaweed, src_bucket, {"run/model.bin": model(3), "run/other.bin": b"o"})
    env = seaweed.aws_env() | seaweed.meta_env()
    args = (f"s3://{src_bucket}/run/model.bin", f"meta://{dst_bucket}/ckpt/weights.bin")
    first = sync(*args, env=env)
    assert (first["objects_copied"], first["objects_server_copied"]) == (0, 1), first
    assert read_bucket(seaweed, dst_bucket, "ckpt/") == {"weights.bin": model(3)}
    assert sync(*args, env=env)["objects_skipped"] == 1


def test_a_file_to_s3_on_moto(moto, bucket_factory, tmp_path):
    bucket = bucket_factory(moto)
    src = tmp_path / "model.bin"
    src.write_bytes(model(4))
    first = sync(str(src), f"s3://{bucket}/m/", env=moto.aws_env())
    assert first["objects_copied"] == 1
    assert read_bucket(moto, bucket, "m/") == {"model.bin": model(4)}
    assert sync(str(src), f"s3://{bucket}/m/", env=moto.aws_env())["bytes_sent"] == 0


def test_a_blob_by_a_connection_string_to_a_local_file(azurite, tmp_path):
    import uuid

    from testbed.azurite import ACCOUNT, KEY

    container = f"az-{uuid.uuid4().hex[:12]}"
    azurite.create_container(container)
    azurite.upload(container, "run/model.bin", model(5))
    azurite.upload(container, "run/other.bin", b"o")
    env = {"AZURE_STORAGE_CONNECTION_STRING":
           f"DefaultEndpointsProtocol=http;AccountName={ACCOUNT};AccountKey={KEY};"
           f"BlobEndpoint={azurite.url};"}
    target = tmp_path / "out" / "weights.bin"
    assert sync(f"az://{container}/run/model.bin", str(target), env=env)["objects_copied"] == 1
    assert target.read_bytes() == model(5)
    assert read_tree(tmp_path / "out") == {"weights.bin": model(5)}
