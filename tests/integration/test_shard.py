"""--shard I/N against a real S3 server (moto): the shards of a Job write exactly the source,
byte for byte, each key by one shard; the split is the same in a process with another hash
seed; --shard auto from the Job's variables; two shards as two processes at once on one
target, neither waiting for the other's lock."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import mcsync
from mcsync.state.shard import shard_of

from .helpers import new_bucket, payload, read_bucket, run_cli, write_tree

ROOT = Path(__file__).parents[2]
OBJECTS = {f"d{i % 7}/f{i:04}.bin": payload(1 + i % 50, i) for i in range(500)}


@pytest.mark.parametrize("count", [1, 3, 8])
def test_the_shards_together_are_the_source(moto, tmp_path, monkeypatch, count):
    write_tree(tmp_path / "src", OBJECTS)
    bucket = new_bucket(moto)
    for name, value in moto.meta_env().items():
        monkeypatch.setenv(name, value)
    dst = f"meta://{bucket}/ds/"
    seen: list[str] = []
    for index in range(count):
        report = mcsync.sync(str(tmp_path / "src"), dst, shard=(index, count))
        assert report.exit_code == 0, report.failures
        keys = [o.key for o in report.objects]
        assert set(keys) == {k for k in OBJECTS if shard_of(k, count) == index}
        seen += keys
    assert sorted(seen) == sorted(OBJECTS)  # each key written by one shard, once
    assert read_bucket(moto, bucket, "ds/") == OBJECTS


@settings(max_examples=4, deadline=None)
@given(st.lists(st.text(st.characters(blacklist_categories=["Cs"]), min_size=1, max_size=60),
                min_size=1, max_size=200), st.integers(min_value=1, max_value=64))
def test_the_split_is_the_same_under_another_hash_seed(names, count):
    """Computed in children with other hash seeds (and a fresh interpreter each), every key
    lands in the shard it lands in here."""
    names = [*names, "日本語/ファイル", "a b/c+d", "run/checkpoint-9/config.json"]
    code = ("import json, sys\nfrom mcsync.state.shard import shard_of\n"
            "keys, n = json.load(sys.stdin)"
            "\nprint(json.dumps([shard_of(k, n) for k in keys]))")
    here = [shard_of(k, count) for k in names]
    for hash_seed in ("0", "4242"):
        env = dict(os.environ, PYTHONHASHSEED=hash_seed, PYTHONPATH=str(ROOT))
        out = subprocess.run([sys.executable, "-c", code], input=json.dumps([names, count]),
                             env=env, capture_output=True, text=True, check=True,
                             timeout=60).stdout
        assert json.loads(out) == here


def test_shard_auto_reads_the_job_s_variables(moto, tmp_path):
    write_tree(tmp_path / "src", OBJECTS)
    bucket = new_bucket(moto)
    env = moto.meta_env() | {"JOB_COMPLETION_INDEX": "2", "JOB_COMPLETIONS": "3"}
    result = run_cli("sync", str(tmp_path / "src"), f"meta://{bucket}/", "--shard", "auto",
                     "--json", "--quiet", env=env)
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert {o["key"] for o in report["objects"]} == {k for k in OBJECTS if shard_of(k, 3) == 2}


@pytest.mark.parametrize(("env", "says"), [
    ({"JOB_COMPLETIONS": "3"}, "JOB_COMPLETION_INDEX is not set"),
    ({"JOB_COMPLETION_INDEX": "0"}, "JOB_COMPLETIONS is not set"),
    ({"JOB_COMPLETION_INDEX": "0", "JOB_COMPLETIONS": "three"},
     "JOB_COMPLETIONS is not a whole number"),
])
def test_shard_auto_without_the_variables_is_a_usage_error(tmp_path, monkeypatch, env, says):
    for name in ("JOB_COMPLETION_INDEX", "JOB_COMPLETIONS"):
        monkeypatch.delenv(name, raising=False)
    result = run_cli("sync", str(tmp_path), str(tmp_path / "dst"), "--shard", "auto", env=env)
    assert result.exit_code == 2
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("mcsync: error: --shard auto: ") and says in line
    assert not (tmp_path / "dst").exists()


def test_two_shards_in_two_processes_share_a_target(moto, tmp_path):
    """Each shard holds its own lock: run together, neither is locked out (exit 3)."""
    write_tree(tmp_path / "src", OBJECTS)
    bucket = new_bucket(moto)
    procs = []
    for index in range(2):
        # Each with a state directory of its own, as two pods; --tpslimit keeps both running
        # for a few seconds, so they overlap.
        env = dict(os.environ, PYTHONPATH=str(ROOT),
                   XDG_STATE_HOME=str(tmp_path / f"pod-{index}")) | moto.meta_env()
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "mcsync.cli.main", "sync", str(tmp_path / "src"),
             f"meta://{bucket}/", "--shard", f"{index}/2", "--tpslimit", "100", "--json",
             "--quiet"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env))
    began = time.monotonic()
    outs = [p.communicate(timeout=180) for p in procs]
    for proc, (_, err) in zip(procs, outs, strict=True):
        assert proc.returncode == 0, err.decode()[-2000:]
    reports = [json.loads(out) for out, _ in outs]
    assert time.monotonic() - began < sum(r["elapsed_s"] for r in reports)  # they overlapped
    assert sum(r["objects_copied"] for r in reports) == len(OBJECTS)
    assert read_bucket(moto, bucket) == OBJECTS


def test_resume_without_addresses_resumes_a_shard_as_that_shard(tmp_path):
    from mcsync.state.manifest import Manifest, manifest_dir, pair_of

    write_tree(tmp_path / "src", OBJECTS)
    first = run_cli("sync", str(tmp_path / "src"), str(tmp_path / "dst"), "--shard", "1/3",
                    "--quiet")
    assert first.exit_code == 0, first.output
    (path,) = manifest_dir().glob("*.shard-1-of-3.sqlite")
    pair = pair_of(path)
    assert pair is not None
    manifest = Manifest(path, *pair)
    manifest.start_run()  # as a run killed mid-way leaves it: "running"
    manifest.close()
    more = {f"new/{i:03}.bin": payload(10, 1000 + i) for i in range(60)}
    write_tree(tmp_path / "src", more)
    resumed = run_cli("resume", "--json", "--quiet")
    assert resumed.exit_code == 0, resumed.output
    assert "(shard 1/3)" in resumed.stderr
    copied = {o["key"] for o in json.loads(resumed.stdout)["objects"]}
    assert copied == {k for k in more if shard_of(k, 3) == 1}


def test_status_shows_the_shards_of_a_target(moto, tmp_path):
    write_tree(tmp_path / "src", OBJECTS)
    bucket = new_bucket(moto)
    env = moto.meta_env()
    for index in (0, 2):
        done = run_cli("sync", str(tmp_path / "src"), f"meta://{bucket}/ds/", "--shard",
                       f"{index}/3", "--quiet", env=env)
        assert done.exit_code == 0, done.output
    shown = run_cli("status", f"meta://{bucket}/ds", env=env)
    assert shown.exit_code == 0, shown.output
    lines = shown.stdout.splitlines()
    assert lines[0].split()[:4] == ["pair", "shard", "state", "objects"]
    states = {line.split()[1]: line.split()[2:4] for line in lines[1:]}
    assert states == {
        "0/3": ["done", str(sum(1 for k in OBJECTS if shard_of(k, 3) == 0))],
        "1/3": ["not", "started"],
        "2/3": ["done", str(sum(1 for k in OBJECTS if shard_of(k, 3) == 2))]}
    as_json = json.loads(run_cli("status", f"meta://{bucket}/ds/", "--json", env=env).stdout)
    assert [r["state"] for r in as_json] == ["done", "not started", "done"]
    assert sum(r["objects"] for r in as_json) == sum(1 for k in OBJECTS if shard_of(k, 3) != 1)
    assert sum(r["bytes"] for r in as_json) == sum(
        len(v) for k, v in OBJECTS.items() if shard_of(k, 3) != 1)
    nothing = run_cli("status", f"meta://{bucket}/elsewhere/", env=env)
    assert nothing.exit_code == 2 and "no mcsync state" in nothing.stderr
