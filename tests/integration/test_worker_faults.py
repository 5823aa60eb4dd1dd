"""A failure costs one worker (``--workers N`` on this machine): a worker killed or stuck loses
only its own task, which another runs (the rest keep their processes); a task that raises is
that task's failure with its cause; workers that cannot start stop the run at once (exit 2, the
cause in one line). Real worker processes, against SeaweedFS through the fault proxy (which
slows PUTs where a test needs the run busy) or local directories."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from testbed.faultproxy import Rule, Stall

from .helpers import new_bucket, payload, read_bucket, run_cli, write_tree
from .test_workers import ROOT, command, wait_for, workers_of

OBJECTS = {f"data/{i // 100}/item-{i:04d}.bin": payload(2000 + 13 * i, 300 + i)
           for i in range(400)}


@pytest.fixture(scope="module")
def source_tree(tmp_path_factory):
    root = tmp_path_factory.mktemp("src")
    write_tree(root, OBJECTS)
    return root


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_a_killed_worker_costs_its_own_task_and_the_others_keep_their_processes(
        source_tree, seaweed, seaweed_proxy):
    bucket = new_bucket(seaweed)
    seaweed_proxy.add(Rule(Stall(0.1), op="PutObject"))  # keeps the run busy
    env = dict(os.environ) | seaweed_proxy.endpoint.meta_env()
    proc = subprocess.Popen(command(source_tree, f"meta://{bucket}/run/", "--workers", "3",
                                    "-c", "6"),
                            env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        wait_for(lambda: len(workers_of(proc.pid)) == 3
                 and len(seaweed_proxy.exchanges("PutObject")) >= 30)
        victim, *others = workers_of(proc.pid)
        os.kill(victim, signal.SIGKILL)
        # One new process takes the dead one's place while the run goes on; the others are
        # the same processes.
        wait_for(lambda: len(now := workers_of(proc.pid)) == 3 and victim not in now)
        after = workers_of(proc.pid)
        assert set(others) <= set(after), (others, after)
        assert all(alive(p) for p in others)
        out, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    report = json.loads(out)
    assert read_bucket(seaweed, bucket, "run/") == OBJECTS
    assert report["objects_copied"] == len(OBJECTS) and report["objects_failed"] == 0
    # Only the dead worker's task ran again, named with the worker that died under it.
    assert report["tasks_retried"] == 1, report["retried_tasks"]
    (retried,) = report["retried_tasks"]
    assert f"pid {victim} " in retried and "died (killed by SIGKILL)" in retried, retried
    # mcsync status puts the retried task under the worker that died running it.
    (row,) = json.loads(run_cli("status", f"meta://{bucket}/run/", "--json",
                                env=seaweed_proxy.endpoint.meta_env()).stdout)
    by_worker = {t["worker"].split(" on ")[0]: t for t in row["tasks"]}
    assert by_worker[f"pid {victim}"]["retried"] == 1, row["tasks"]
    assert "" not in by_worker and sum(t["tasks"] for t in row["tasks"]) == report["tasks"]


def test_a_stuck_worker_is_killed_at_the_task_timeout_and_its_task_runs_elsewhere(
        source_tree, seaweed, seaweed_proxy):
    bucket = new_bucket(seaweed)
    seaweed_proxy.add(Rule(Stall(0.1), op="PutObject"))
    env = dict(os.environ) | seaweed_proxy.endpoint.meta_env()
    proc = subprocess.Popen(command(source_tree, f"meta://{bucket}/run/", "--workers", "3",
                                    "-c", "6", "--task-timeout", "15"),
                            env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        wait_for(lambda: len(workers_of(proc.pid)) == 3
                 and len(seaweed_proxy.exchanges("PutObject")) >= 30)
        stuck = workers_of(proc.pid)[0]
        os.kill(stuck, signal.SIGSTOP)  # a hung mount, a dead connection: no progress at all
        stopped = time.monotonic()
        out, err = proc.communicate(timeout=180)
        took = time.monotonic() - stopped
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    # The deadline (15 s) and the rest of the run; a run waiting on the stopped worker would
    # never end.
    print(f"the run ended {took:.1f} s after its worker was stopped")
    assert took < 90, took
    assert not alive(stuck)
    report = json.loads(out)
    assert read_bucket(seaweed, bucket, "run/") == OBJECTS
    assert report["objects_copied"] == len(OBJECTS) and report["objects_failed"] == 0
    assert report["tasks_retried"] >= 1
    assert any(f"timed out after 15 s on pid {stuck} " in t for t in report["retried_tasks"]), \
        report["retried_tasks"]


# A library caller whose workers raise in one task: the main module runs again in each worker
# process (spawn) as __mp_main__, and there it makes the task holding one key raise.
POISONED_CALLER = """
import json, os, sys

if __name__ == "__mp_main__":
    import mcsync.scale.worker_runner as runner

    real = runner.run_items

    async def poisoned(*args):
        items = args[-1]  # run_items(..., items): the task's items come last
        if any(getattr(item, "key", "").endswith("poison.bin") for item in items):
            with open(os.environ["POISONED_BY"], "w") as f:
                f.write(str(os.getpid()))
            raise RuntimeError("poisoned batch")
        return await real(*args)

    runner.run_items = poisoned

if __name__ == "__main__":
    import mcsync

    report = mcsync.sync(sys.argv[1], sys.argv[2], workers=1)
    print(json.dumps(report.to_dict()))
"""


def test_an_exception_in_a_task_fails_that_task_with_its_cause(tmp_path):
    objects = {"a/poison.bin": b"p" * 100} | {f"b/{i:04d}.bin": payload(500 + i, 900 + i)
                                                for i in range(600)}
    write_tree(tmp_path / "src", objects)
    script = tmp_path / "caller.py"
    script.write_text(POISONED_CALLER)
    env = dict(os.environ) | {"POISONED_BY": str(tmp_path / "poisoned-by")}
    done = subprocess.run([sys.executable, str(script), str(tmp_path / "src"),
                           str(tmp_path / "dst")], env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=180, check=False)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    failed = {f["key"]: f for f in report["failures"]}
    assert "a/poison.bin" in failed and report["objects_failed"] == len(failed)
    # The failure is the task's, with its cause; not a lost worker, not run again.
    assert all(f["kind"] == "TaskFailed" and "RuntimeError: poisoned batch" in f["error"]
               for f in failed.values()), failed
    assert len({o["error"].split(":")[0] for o in failed.values()}) == 1  # one task
    assert report["tasks_retried"] == 0
    # Every other task completed.
    for key, data in objects.items():
        if key not in failed:
            assert (tmp_path / "dst" / key).read_bytes() == data, key
    assert report["objects_copied"] == len(objects) - len(failed)
    # The worker that raised went on running every other task (the run's one worker: with
    # more, the others could finish the rest before it even started), and the failed task is
    # counted under it.
    raised_in = f"pid {(tmp_path / 'poisoned-by').read_text()} on "
    (row,) = json.loads(run_cli("status", str(tmp_path / "dst"), "--json").stdout)
    ran = {t["worker"]: t for t in row["tasks"]}
    ((worker, tasks),) = ran.items()
    assert worker.startswith(raised_in) and tasks["failed"] == 1 and tasks["tasks"] >= 1, ran


BAD_EXECUTABLE = """
import multiprocessing, sys
multiprocessing.set_executable("/nonexistent/python3")
from mcsync.cli.main import main
sys.argv[0] = "mcsync"
main()
"""

BROKEN_IMPORT_CALLER = """
import sys

if __name__ == "__mp_main__":  # as a module only some machines have would
    raise ImportError("No module named 'cluster_only_helpers'")

if __name__ == "__main__":
    import mcsync

    try:
        mcsync.sync(sys.argv[1], sys.argv[2], workers=2)
    except mcsync.UsageError as exc:
        print(f"UsageError: {exc}")
"""


def test_workers_that_cannot_start_stop_the_run_with_exit_2_in_one_line(source_tree, tmp_path):
    script = tmp_path / "bad_executable.py"
    script.write_text(BAD_EXECUTABLE)
    began = time.monotonic()
    done = subprocess.run([sys.executable, str(script), "sync", str(source_tree),
                           str(tmp_path / "dst"), "--workers", "2", "--quiet"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120, check=False)
    took = time.monotonic() - began
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("mcsync: error: workers: could not start a worker process on "), line
    assert "cannot run /nonexistent/python3: No such file or directory" in line, line
    assert took < 30, took  # not a try per task

    # A library caller whose main module cannot be imported in a worker: the error names why.
    script = tmp_path / "caller.py"
    script.write_text(BROKEN_IMPORT_CALLER)
    began = time.monotonic()
    done = subprocess.run([sys.executable, str(script), str(source_tree), str(tmp_path / "lib")],
                          cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    took = time.monotonic() - began
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("UsageError: workers: could not start a worker process on"), \
        done.stdout
    assert done.stdout.rstrip().endswith(
        "ImportError: No module named 'cluster_only_helpers' (3 times in a row; stopping the "
        "run)"), done.stdout
    assert took < 30, took


STOPPED_CALLER = """
import json, os, sys, threading
import mcsync

if __name__ == "__main__":
    stop = threading.Event()

    def on_event(event):
        if type(event).__name__ == "ObjectDone" and not stop.is_set():
            stop.set()

    report = mcsync.sync(sys.argv[1], sys.argv[2], workers=3, bw_limit="2MiB", stop=stop,
                         on_event=on_event)
    me = str(os.getpid())
    left = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = open(f"/proc/{entry}/stat").read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if stat[1] == me and stat[0] != "Z":
                left.append(open(f"/proc/{entry}/cmdline").read().replace("\\0", " "))
    print(json.dumps({"interrupted": report.interrupted, "left": left}))
"""


def test_a_library_stop_ends_the_worker_processes_before_sync_returns(source_tree, tmp_path):
    script = tmp_path / "stopped.py"
    script.write_text(STOPPED_CALLER)
    done = subprocess.run([sys.executable, str(script), str(source_tree), str(tmp_path / "dst")],
                          cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["interrupted"]
    assert not [c for c in result["left"] if "spawn_main" in c], result["left"]
