"""Bad input: one line naming the cause, a documented exit code, nothing written."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from .helpers import new_bucket, put_objects, read_bucket, read_tree, run_cli, write_tree


def error_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith("mcsync: error:")]


@pytest.mark.parametrize("url", ["s3://", "s3://Bad_Bucket!/x", "ftp://host/x", "meta://"])
def test_malformed_url_is_usage_error(tmp_path, url):
    result = run_cli(
        "sync", str(tmp_path), url, env={"MCSYNC_META_ENDPOINT_URL": "http://127.0.0.1:9"}
    )
    assert result.exit_code == 2
    (line,) = error_lines(result.output)
    assert url.split("://")[0] in line


def test_missing_bucket_on_either_side(seaweed, tmp_path):
    write_tree(tmp_path / "src", {"a": b"a"})
    env = seaweed.aws_env() | seaweed.meta_env()
    for args in (
        [str(tmp_path / "src"), "meta://no-such-bucket-x/"],
        ["s3://no-such-bucket-y/", str(tmp_path / "dst")],
    ):
        result = run_cli("sync", *args, env=env)
        assert result.exit_code == 2, result.output
        (line,) = error_lines(result.output)
        assert "no-such-bucket" in line
    assert not (tmp_path / "dst").exists()


def test_wrong_credentials_exit_2_and_never_echo_the_secret(seaweed, tmp_path):
    write_tree(tmp_path / "src", {"a": b"a"})
    bucket = new_bucket(seaweed)
    env = seaweed.meta_env() | {"MCSYNC_META_SECRET_ACCESS_KEY": "wrong-secret-value-123"}
    result = run_cli("sync", str(tmp_path / "src"), f"meta://{bucket}/", "-v", env=env)
    assert result.exit_code == 2, result.output
    (line,) = error_lines(result.output)
    assert "access denied" in line or "credentials" in line
    assert "wrong-secret-value-123" not in result.output
    assert read_bucket(seaweed, bucket) == {}


def test_secret_never_in_output_of_a_good_verbose_run(seaweed, tmp_path):
    write_tree(tmp_path / "src", {"a": b"a"})
    bucket = new_bucket(seaweed)
    result = run_cli(
        "sync", str(tmp_path / "src"), f"meta://{bucket}/", "-v", "--json", env=seaweed.meta_env()
    )
    assert result.exit_code == 0, result.output
    assert seaweed.secret_key not in result.output


def test_unwritable_local_target(tmp_path):
    write_tree(tmp_path / "src", {"a": b"a"})
    (tmp_path / "file").write_bytes(b"not a directory")
    result = run_cli("sync", str(tmp_path / "src"), str(tmp_path / "file" / "sub"), env={})
    assert result.exit_code == 2, result.output
    (line,) = error_lines(result.output)
    assert "file/sub" in line
    assert (tmp_path / "file").read_bytes() == b"not a directory"


def test_missing_local_source(tmp_path):
    result = run_cli("sync", str(tmp_path / "nope"), str(tmp_path / "dst"), env={})
    assert result.exit_code == 2
    (line,) = error_lines(result.output)
    assert "nope" in line
    assert not (tmp_path / "dst").exists()


def test_keys_that_would_escape_a_filesystem_target(moto, tmp_path):
    bucket = new_bucket(moto)
    evil = {"../../escape-1.txt": b"x", "ok/../../escape-2.txt": b"y"}
    put_objects(moto, bucket, evil | {"good.txt": b"g"}, prefix="p/")
    listed = read_bucket(moto, bucket, "p/")
    assert set(listed) >= set(evil), "the server must keep the keys for this test to mean much"
    root = tmp_path / "deep" / "root"
    result = run_cli("sync", f"s3://{bucket}/p/", str(root), "--json", env=moto.aws_env())
    assert result.exit_code == 1, result.output
    report = json.loads(result.stdout)
    assert {f["key"] for f in report["failures"]} == set(evil)
    assert all("unsafe key" in f["error"] for f in report["failures"])
    assert read_tree(root) == {"good.txt": b"g"}
    everything = {
        str(Path(d, f).relative_to(tmp_path)) for d, _, fs in os.walk(tmp_path) for f in fs
    }
    # the data file, and mcsync's own state kept at the target root
    assert {p for p in everything if "/.mcsync/" not in p} == {"deep/root/good.txt"}
    assert all(p.startswith("deep/root/") for p in everything)
