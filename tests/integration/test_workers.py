"""``--workers N``: whole objects moved by worker processes, the driver planning and committing.
Against SeaweedFS through the fault proxy, which records every request (each key written once)
and stalls PUTs where a test needs the run busy when it kills a process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from testbed.faultproxy import Rule, Stall

from .helpers import new_bucket, payload, put_objects, read_bucket, run_cli, write_tree

MiB = 1 << 20
SMALL = {f"data/{i // 100}/item-{i:04d}.bin": payload(1000 + 37 * i, i) for i in range(300)}
LARGE = {"ckpt/model-00001-of-00002.bin": payload(12 * MiB, 1001),
         "ckpt/model-00002-of-00002.bin": payload(11 * MiB + 3, 1002)}
OBJECTS = SMALL | LARGE
ROOT = Path(__file__).parents[2]


@pytest.fixture(scope="module")
def source_tree(tmp_path_factory):
    root = tmp_path_factory.mktemp("src")
    write_tree(root, OBJECTS)
    return root


def command(src: Path, dst: str, *extra: str) -> list[str]:
    return [sys.executable, "-m", "mcsync.cli.main", "sync", str(src), dst, "--part-size",
            "5MiB", "--quiet", "--json", *extra]


def run(args: list[str], env: dict[str, str]) -> tuple[int, dict, str]:
    done = subprocess.run(args, env=dict(os.environ) | env, capture_output=True, text=True,
                          timeout=180, check=False, cwd=ROOT)
    return done.returncode, json.loads(done.stdout) if done.stdout else {}, done.stderr


def children(pid: int) -> list[tuple[int, str]]:
    """(pid, command line) of the processes whose parent is ``pid``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            found.append((int(entry.name), cmdline))
    return found


def workers_of(pid: int) -> list[int]:
    return [p for p, cmd in children(pid) if "spawn_main" in cmd]


def wait_for(what, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not what():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


TOTALS = ("objects_copied", "objects_failed", "objects_skipped", "bytes_copied", "bytes_sent",
          "bytes_changed", "bytes_transferred", "exit_code", "interrupted")


@pytest.mark.parametrize("server", ["moto", "seaweed"])
def test_three_workers_write_each_key_once_and_report_as_one_process(source_tree, server,
                                                                    request):
    ep = request.getfixturevalue(server)
    proxy = request.getfixturevalue(f"{server}_proxy")
    bucket, alone = new_bucket(ep), new_bucket(ep)
    env = proxy.endpoint.meta_env()
    code, report, err = run(command(source_tree, f"meta://{bucket}/run/", "--workers", "3"), env)
    assert code == 0, err
    assert read_bucket(ep, bucket, "run/") == OBJECTS

    # Each small object one PUT, each large one one multipart upload (from the driver).
    puts = Counter(e.key for e in proxy.exchanges("PutObject") if e.bucket == bucket
                   and not e.key.startswith("run/.mcsync/"))
    assert puts == Counter({f"run/{k}": 1 for k in SMALL})
    creates = Counter(e.key for e in proxy.exchanges("CreateMultipartUpload")
                      if e.bucket == bucket and not e.key.startswith("run/.mcsync/"))
    assert creates == Counter({f"run/{k}": 1 for k in LARGE})
    # More tasks than workers (of 43 objects each: 128 requests in flight split 3 ways).
    assert report["tasks"] >= 2 * 3 and report["tasks_retried"] == 0

    code, single, err = run(command(source_tree, f"meta://{alone}/run/"), env)
    assert code == 0, err
    assert {k: report[k] for k in TOTALS} == {k: single[k] for k in TOTALS}
    assert single["tasks"] == 0

    def results(r: dict) -> set[tuple]:
        return {(o["key"], o["action"], o["size"], o["xxh3_128"], o["hash_block_size"])
                for o in r["objects"]}

    assert results(report) == results(single) and len(report["objects"]) == len(OBJECTS)

    # The target's state says what each worker did (mcsync status, from the manifest's copy).
    shown = run_cli("status", f"meta://{bucket}/run/", env=env)
    assert shown.exit_code == 0 and "tasks of " in shown.output, shown.output
    (row,) = json.loads(run_cli("status", f"meta://{bucket}/run/", "--json", env=env).stdout)
    assert row["tasks_run"]["status"] == "done"
    tasks = row["tasks"]
    assert 1 <= len(tasks) <= 3 and all(t["worker"].startswith("pid ") for t in tasks)
    assert sum(t["tasks"] for t in tasks) == report["tasks"]
    assert sum(t["objects"] for t in tasks) == len(SMALL)
    assert sum(t["bytes"] for t in tasks) == sum(len(v) for v in SMALL.values())
    assert all(t["slowest"].startswith("task ") and t["retried"] == t["failed"] == 0
               for t in tasks)

    # Every object was recorded: the next run with workers has nothing to move.
    code, again, err = run(command(source_tree, f"meta://{bucket}/run/", "--workers", "3"), env)
    assert code == 0, err
    assert again["objects_copied"] == 0 and again["tasks"] == 0


def test_a_killed_driver_takes_its_workers_and_the_same_command_resumes(source_tree, seaweed,
                                                                       seaweed_proxy):
    bucket = new_bucket(seaweed)
    stall = seaweed_proxy.add(Rule(Stall(0.1), op="PutObject"))
    env = seaweed_proxy.endpoint.meta_env()
    args = command(source_tree, f"meta://{bucket}/run/", "--workers", "3", "-c", "6")
    proc = subprocess.Popen(args, env=dict(os.environ) | env, cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: len(seaweed_proxy.exchanges("PutObject")) >= 60)
        workers = workers_of(proc.pid)
        assert workers
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    # The workers die with their driver (no orphan writing behind the next run's back).
    wait_for(lambda: not any(Path(f"/proc/{p}").exists() and "Z" not in
                             Path(f"/proc/{p}/stat").read_text().split()[2]
                             for p in workers if Path(f"/proc/{p}").exists()), timeout=10)
    for key, data in read_bucket(seaweed, bucket, "run/").items():
        assert data == OBJECTS[key], f"{key} is visible but not what the source holds"

    seaweed_proxy.remove(stall)
    code, report, err = run(args, env)
    assert code == 0, err
    assert read_bucket(seaweed, bucket, "run/") == OBJECTS
    assert report["objects_failed"] == 0
    again = run_cli("plan", str(source_tree), f"meta://{bucket}/run/", env=env)
    assert again.exit_code == 0 and "would copy 0 objects" in again.output, again.output


def test_workers_auto_and_a_local_target(source_tree, tmp_path):
    dst = tmp_path / "dst"
    code, report, err = run(command(source_tree, str(dst), "--workers", "auto"), {})
    assert code == 0, err
    assert report["objects_copied"] == len(OBJECTS) and report["tasks"] >= 1
    for key, data in OBJECTS.items():
        assert (dst / key).read_bytes() == data


def test_a_dry_run_with_workers_writes_nothing_at_a_local_target(source_tree, tmp_path):
    """A dry run has workers for its delta previews' hashing (none here: nothing to preview),
    and does not probe its target for case as a run with workers does (a file written in it)."""
    dst = tmp_path / "dst"
    code, report, err = run(command(source_tree, str(dst), "--workers", "2", "--dry-run"), {})
    assert code == 0, err
    assert report["dry_run"] and report["objects_copied"] == len(OBJECTS), report
    assert not dst.exists(), list(dst.rglob("*"))


def test_workers_refusals_are_one_line_before_anything_moves(source_tree, tmp_path):
    code, _, err = run(command(source_tree, str(tmp_path / "dst"), "--workers", "0"), {})
    assert code == 2 and "--workers must be a number of processes" in err, err  # click's usage
    for extra, says in ((("--workers", "2", "--watch"), "--watch"),):
        code, _, err = run(command(source_tree, str(tmp_path / "dst"), *extra), {})
        assert code == 2, err
        assert says in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "dst").exists() or not any((tmp_path / "dst").rglob("*.bin"))


def test_bwlimit_is_the_total_of_the_workers_not_each_ones(tmp_path, seaweed):
    """--bwlimit with --workers 2: each worker paces itself at half the limit, so the run
    takes at least the time the whole limit allows (less each worker's first object, which
    its bucket lets through before paying for it). Were each worker given the whole limit,
    the run would take half that time."""
    objects = {f"w/{i:03d}.bin": payload(128 * 1024, 7000 + i) for i in range(128)}
    write_tree(tmp_path / "src", objects)
    bucket, limit = new_bucket(seaweed), 3 * MiB
    code, report, err = run(command(tmp_path / "src", f"meta://{bucket}/run/", "--workers", "2",
                                    "-c", "8", "--bwlimit", "3MiB"), seaweed.meta_env())
    assert code == 0, err
    assert read_bucket(seaweed, bucket, "run/") == objects
    assert report["tasks"] >= 4 and report["bytes_transferred"] >= 16 * MiB  # 32 objects each
    # Only workers moved data bytes: at most the limit times the time, plus a first object
    # each; seconds from the report (listing and starting the workers only add to them).
    floor = (16 * MiB - 2 * 128 * 1024) / limit
    assert report["elapsed_s"] >= floor, (report["elapsed_s"], floor)


def test_sigterm_lets_the_workers_tasks_finish_and_the_rerun_completes(source_tree, seaweed,
                                                                       seaweed_proxy):
    bucket = new_bucket(seaweed)
    stall = seaweed_proxy.add(Rule(Stall(0.1), op="PutObject"))
    env = seaweed_proxy.endpoint.meta_env()
    args = command(source_tree, f"meta://{bucket}/run/", "--workers", "3", "-c", "6")
    proc = subprocess.Popen(args, env=dict(os.environ) | env, cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: len(seaweed_proxy.exchanges("PutObject")) >= 30)
        workers = workers_of(proc.pid)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    report = json.loads(out)
    assert report["interrupted"] and report["objects_copied"] < len(OBJECTS)
    assert not any(Path(f"/proc/{p}").exists() for p in workers), "workers outlived the run"

    seaweed_proxy.remove(stall)
    code, again, err = run(args, env)
    assert code == 0, err
    assert read_bucket(seaweed, bucket, "run/") == OBJECTS
    # What the stopped run reported done was recorded: not copied again.
    assert again["objects_copied"] <= len(OBJECTS) - report["objects_copied"]


def test_the_library_takes_workers_with_addresses(source_tree, tmp_path):
    import mcsync

    report = mcsync.sync(str(source_tree), str(tmp_path / "dst"), workers="auto",
                         part_size=5 * MiB)
    assert report.ok and report.objects_copied == len(OBJECTS) and report.tasks >= 1
    for key, data in OBJECTS.items():
        assert (tmp_path / "dst" / key).read_bytes() == data
    # One file as SRC: nothing to share out, moved without workers.
    one = mcsync.sync(str(source_tree / "data/0/item-0001.bin"), str(tmp_path / "one") + "/",
                      workers=2)
    assert one.ok and one.objects_copied == 1 and one.tasks == 0
    assert (tmp_path / "one/item-0001.bin").read_bytes() == SMALL["data/0/item-0001.bin"]


@pytest.mark.parametrize("server", ["moto", "seaweed"])
def test_server_side_copies_and_deletes_go_to_workers(server, request):
    """One endpoint on both sides: every object is one CopyObject, sent by a worker (the large
    ones too: one request up to 5 GiB), and --delete's deletes go to workers as well."""
    ep = request.getfixturevalue(server)
    proxy = request.getfixturevalue(f"{server}_proxy")
    src, dst = new_bucket(ep), new_bucket(ep)
    put_objects(ep, src, OBJECTS, "in/")
    extra = {f"gone/{i}.bin": b"old" for i in range(40)}
    put_objects(ep, dst, extra, "out/")
    code, report, err = run([sys.executable, "-m", "mcsync.cli.main", "sync", f"meta://{src}/in/",
                             f"meta://{dst}/out/", "--workers", "3", "--delete", "--json",
                             "--quiet"], proxy.endpoint.meta_env())
    assert code == 0, err
    assert read_bucket(ep, dst, "out/") == OBJECTS
    assert report["objects_server_copied"] == len(OBJECTS)
    assert report["objects_deleted"] == len(extra) and report["tasks"] >= 1
    copies = Counter(e.key for e in proxy.exchanges("CopyObject") if e.bucket == dst)
    assert copies == Counter({f"out/{k}": 1 for k in OBJECTS})
    # One request per key deleted (obstore sends a DeleteObjects of one key), and one more:
    # the run's lock object, released at its end.
    deletes = [e for e in proxy.exchanges("DeleteObject*") if e.bucket == dst]
    assert len(deletes) == len(extra) + 1, proxy.summary()


def test_a_target_that_folds_case_is_written_by_the_driver_alone(source_tree, tmp_path,
                                                                 monkeypatch, caplog):
    """Names that differ only by case are told apart by what one process wrote: on such a
    filesystem no worker process writes."""
    import mcsync
    from mcsync.stores.local_paths import RootedPaths

    monkeypatch.setattr(RootedPaths, "_folds_case", staticmethod(lambda probe: True))
    report = mcsync.sync(str(source_tree), str(tmp_path / "dst"), workers=3, part_size=5 * MiB)
    assert report.ok and report.objects_copied == len(OBJECTS) and report.tasks == 0
    assert "folds case" in caplog.text
    for key, data in OBJECTS.items():
        assert (tmp_path / "dst" / key).read_bytes() == data
