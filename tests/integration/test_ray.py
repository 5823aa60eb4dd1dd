"""``--executor ray``: the workers as Ray actors on a local Ray cluster of two nodes (a head and a
worker node, ``testbed.ray_cluster``), against SeaweedFS through the fault proxy, which records
every request. The nodes hold the store's keys in their environment (as a cluster's pods would
from a Secret); the driver passes where to write, never a key. Where this machine allows it
(root, ``unshare``), the worker node sees a directory of its own at ``private_dir``'s path, as
another machine's local disk: a local SRC or DST there is what the nodes do not all see."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from testbed.faultproxy import FaultProxy, Rule, Stall
from testbed.ray_cluster import WORKER_IP
from testbed.servers import S3Endpoint

from ..require import unavailable
from .helpers import new_bucket, payload, read_bucket, run_cli, write_tree
from .test_workers import LARGE, OBJECTS, ROOT, SMALL, TOTALS, command, run, wait_for


@pytest.fixture(scope="module")
def private_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """What the worker node sees as an empty directory of its own (when it can)."""
    return tmp_path_factory.mktemp("node-private")


@pytest.fixture(scope="module")
def ray_cluster(seaweed: S3Endpoint, tmp_path_factory: pytest.TempPathFactory,
                private_dir: Path) -> Iterator:
    """Started once for this module's tests, and stopped after them: a head, a worker node
    and a driver held ~760 MiB, not to be kept through the rest of the session."""
    from testbed.ray_cluster import RayMissing, private_mounts, ray_cluster

    nowhere = tmp_path_factory.mktemp("ray-node-home")
    keys = {"MCSYNC_META_ACCESS_KEY_ID": seaweed.access_key,
            "MCSYNC_META_SECRET_ACCESS_KEY": seaweed.secret_key,
            "MCSYNC_CONFIG": str(nowhere / "config.toml"), "AWS_EC2_METADATA_DISABLED": "true",
            # First on the workers' path: where a test puts a dependency of mcsync that cannot
            # be imported, seen by the worker node alone (under its private mount).
            "PYTHONPATH": str(private_dir / "shadow")}
    with contextlib.ExitStack() as stack:
        try:
            cluster = stack.enter_context(ray_cluster(
                head_cpus=1, worker_cpus=1, env=keys,
                worker_private=private_dir if private_mounts() is None else None))
        except RayMissing as exc:  # only a missing Ray: a cluster that fails to start fails
            unavailable("ray", str(exc))
        yield cluster


@pytest.fixture(scope="module")
def source_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("src")
    write_tree(root, OBJECTS)
    return root


def driver_env(cluster, proxy: FaultProxy) -> dict[str, str]:
    """The driver's: the endpoint (through the proxy) and its keys, and the cluster's address
    (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``: it stays 127.0.0.1, see testbed.ray_cluster)."""
    return proxy.endpoint.meta_env() | {
        "RAY_ADDRESS": cluster.address, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
        "RAY_USAGE_STATS_ENABLED": "0"}


def ray_workers(cluster) -> list[int]:
    """PIDs of the cluster's processes that are mcsync's actors (Ray titles them)."""
    return [pid for pid, cmd in cluster.processes() if cmd.startswith("ray::RayWorker")]


def results(r: dict) -> set[tuple]:
    return {(o["key"], o["action"], o["size"], o["xxh3_128"], o["hash_block_size"])
            for o in r["objects"]}


def test_ray_workers_write_each_key_once_and_report_as_a_local_run(
        source_tree, ray_cluster, seaweed, seaweed_proxy):
    bucket, alone = new_bucket(seaweed), new_bucket(seaweed)
    env = driver_env(ray_cluster, seaweed_proxy)
    code, report, err = run(command(source_tree, f"meta://{bucket}/run/", "--executor", "ray",
                                    "--workers", "2"), env)
    assert code == 0, err
    assert err.strip() == "", err  # --quiet: nothing of Ray's on the command's stderr either
    assert read_bucket(seaweed, bucket, "run/") == OBJECTS

    puts = Counter(e.key for e in seaweed_proxy.exchanges("PutObject") if e.bucket == bucket
                   and not e.key.startswith("run/.mcsync/"))
    assert puts == Counter({f"run/{k}": 1 for k in SMALL})
    creates = Counter(e.key for e in seaweed_proxy.exchanges("CreateMultipartUpload")
                      if e.bucket == bucket and not e.key.startswith("run/.mcsync/"))
    assert creates == Counter({f"run/{k}": 1 for k in LARGE})  # from the driver
    assert report["tasks"] >= 2 * 2 and report["tasks_retried"] == 0

    code, single, err = run(command(source_tree, f"meta://{alone}/run/"), env)
    assert code == 0, err
    assert {k: report[k] for k in TOTALS} == {k: single[k] for k in TOTALS}
    assert set(report) == set(single)
    assert results(report) == results(single) and len(report["objects"]) == len(OBJECTS)

    # Both nodes ran a worker (SPREAD), and every one of the run's actors has ended.
    state = cluster_state(ray_cluster)
    ours = [a for a in state["actors"].values() if a["ActorClassName"] == "RayWorker"]
    assert {a["Address"]["IPAddress"] for a in ours} == {"127.0.0.1", "127.0.0.2"}, ours
    assert all(a["State"] == "DEAD" for a in ours), ours

    code, again, err = run(command(source_tree, f"meta://{bucket}/run/", "--executor", "ray",
                                   "--workers", "2"), env)
    assert code == 0, err
    assert again["objects_copied"] == 0 and again["tasks"] == 0


@dataclass
class BusyRun:
    """A Ray run kept busy (each PUT stalled 0.1 s), started in the background."""

    bucket: str
    stall: Rule
    env: dict[str, str]
    args: list[str]
    proc: subprocess.Popen

    def finished(self, timeout: float) -> tuple[str, str]:
        try:
            return self.proc.communicate(timeout=timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.communicate()


def busy_run(source_tree, cluster, seaweed, proxy, puts: int) -> BusyRun:
    """Once the run has sent ``puts`` PUTs."""
    bucket = new_bucket(seaweed)
    stall = proxy.add(Rule(Stall(0.1), op="PutObject"))
    env = driver_env(cluster, proxy)
    args = command(source_tree, f"meta://{bucket}/run/", "--executor", "ray", "--workers", "2",
                   "-c", "6")
    proc = subprocess.Popen(args, env=dict(os.environ) | env, cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    busy = BusyRun(bucket, stall, env, args, proc)
    try:
        wait_for(lambda: len(proxy.exchanges("PutObject")) >= puts, timeout=120)
    except BaseException:
        proc.kill()
        busy.finished(30)
        raise
    return busy


@pytest.mark.slow
def test_a_ray_worker_killed_mid_run_has_its_task_given_to_another(
        source_tree, ray_cluster, seaweed, seaweed_proxy):
    busy = busy_run(source_tree, ray_cluster, seaweed, seaweed_proxy, puts=30)
    victims = ray_workers(ray_cluster)
    if victims:
        os.kill(victims[0], signal.SIGKILL)
    out, err = busy.finished(180)
    assert victims, ray_cluster.processes()
    assert busy.proc.returncode == 0, err
    report = json.loads(out)
    assert read_bucket(seaweed, busy.bucket, "run/") == OBJECTS
    assert report["objects_copied"] == len(OBJECTS) and report["objects_failed"] == 0
    assert report["tasks_retried"] >= 1
    assert len(report["retried_tasks"]) == report["tasks_retried"]
    assert all(t.startswith("task ") and "Ray worker died" in t
               for t in report["retried_tasks"]), report["retried_tasks"]
    # mcsync status counts each retried task under the worker that died running it.
    (row,) = json.loads(run_cli("status", f"meta://{busy.bucket}/run/", "--json",
                                env=seaweed_proxy.endpoint.meta_env()).stdout)
    retried = {t["worker"]: t["retried"] for t in row["tasks"] if t["retried"]}
    assert retried == {f"pid {victims[0]} on {socket.gethostname()}": report["tasks_retried"]}


@pytest.mark.slow
def test_a_killed_driver_takes_its_ray_workers_and_the_same_command_resumes(
        source_tree, ray_cluster, seaweed, seaweed_proxy):
    busy = busy_run(source_tree, ray_cluster, seaweed, seaweed_proxy, puts=40)
    running = ray_workers(ray_cluster)
    os.kill(busy.proc.pid, signal.SIGKILL)
    busy.finished(30)
    assert running
    # Ray ends the actors of a driver that died: no worker writes behind the next run's back.
    wait_for(lambda: not ray_workers(ray_cluster), timeout=60)
    for key, data in read_bucket(seaweed, busy.bucket, "run/").items():
        assert data == OBJECTS[key], f"{key} is visible but not what the source holds"

    seaweed_proxy.remove(busy.stall)
    code, report, err = run(busy.args, busy.env)
    assert code == 0, err
    assert read_bucket(seaweed, busy.bucket, "run/") == OBJECTS
    assert report["objects_failed"] == 0 and report["objects_copied"] < len(OBJECTS)


@pytest.mark.slow
def test_sigterm_lets_the_ray_workers_tasks_finish_and_the_rerun_completes(
        source_tree, ray_cluster, seaweed, seaweed_proxy):
    busy = busy_run(source_tree, ray_cluster, seaweed, seaweed_proxy, puts=30)
    busy.proc.send_signal(signal.SIGTERM)
    out, err = busy.finished(120)
    assert busy.proc.returncode == 130, err
    report = json.loads(out)
    assert report["interrupted"] and report["objects_copied"] < len(OBJECTS)
    wait_for(lambda: not ray_workers(ray_cluster), timeout=60)

    seaweed_proxy.remove(busy.stall)
    code, again, err = run(busy.args, busy.env)
    assert code == 0, err
    assert read_bucket(seaweed, busy.bucket, "run/") == OBJECTS
    assert again["objects_copied"] <= len(OBJECTS) - report["objects_copied"]


def test_no_key_reaches_rays_logs_or_its_tables(source_tree, ray_cluster, seaweed,
                                                seaweed_proxy):
    """The driver holds the secret key in its environment and the nodes in theirs: none of
    it is in what Ray writes (every log of the cluster's sessions, the driver's included) or
    keeps (the GCS's actor and job tables, which its dashboard and state API show)."""
    bucket = new_bucket(seaweed)
    code, report, err = run(command(source_tree, f"meta://{bucket}/run/", "--executor", "ray",
                                    "--workers", "2", "--include", "data/0/item-000*"),
                            driver_env(ray_cluster, seaweed_proxy))
    assert code == 0 and report["tasks"] >= 1, err
    secret = seaweed.secret_key.encode()
    logs = [p for p in ray_cluster.temp_dir.rglob("*") if p.is_file() and not p.is_symlink()]
    assert any("python-core-driver" in p.name for p in logs)  # the scan sees the drivers' logs
    assert any(p.name.startswith("worker-") for p in logs)
    leaked = [str(p) for p in logs if secret in p.read_bytes()]
    assert leaked == []
    state = json.dumps(cluster_state(ray_cluster), default=str)
    assert "RayWorker" in state and seaweed.secret_key not in state


def test_the_library_runs_on_ray_with_a_worker_per_cpu(source_tree, ray_cluster, tmp_path,
                                                       seaweed_proxy):
    """``mcsync.sync(..., executor="ray")``: no number of workers, one per CPU of the cluster
    (two); a local target, which both nodes (this machine) reach."""
    code = ("import json, sys, mcsync\n"
            "r = mcsync.sync(sys.argv[1], sys.argv[2], executor='ray', part_size=5 * 2**20)\n"
            "print(json.dumps([r.ok, r.objects_copied, r.tasks]))\n")
    dst = tmp_path / "dst"
    done = subprocess.run([sys.executable, "-c", code, str(source_tree), str(dst)],
                          env=dict(os.environ) | driver_env(ray_cluster, seaweed_proxy),
                          cwd=ROOT, capture_output=True, text=True, timeout=180, check=False)
    assert done.returncode == 0, done.stderr
    ok, copied, tasks = json.loads(done.stdout)
    assert ok and copied == len(OBJECTS) and tasks >= 2
    for key, data in OBJECTS.items():
        assert (dst / key).read_bytes() == data


def test_ray_refusals_are_one_line_naming_the_address(source_tree, tmp_path):
    """No cluster at the address, Ray not installed, --ray-address without Ray: exit 2, one
    line, nothing written. (No cluster needed.)"""
    from testbed.processes import free_port

    dst = tmp_path / "dst"
    where = f"127.0.0.1:{free_port()}"
    code, _, err = run(command(source_tree, str(dst), "--executor", "ray", "--ray-address",
                               where), {})
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert f"no Ray cluster reachable at {where}" in err, err
    code, _, err = run(command(source_tree, str(dst), "--executor", "ray", "--ray-address",
                               "127.0.0.1:1"), {})
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert err.startswith("mcsync: error: --executor ray: no Ray cluster reachable at "
                          "127.0.0.1:1 (from --ray-address): "), err
    assert "give --ray-address or RAY_ADDRESS the address of a running cluster's GCS" in err
    code, _, err = run(command(source_tree, str(dst), "--executor", "ray"),
                       {"RAY_ADDRESS": "127.0.0.1:1"})
    assert code == 2 and "127.0.0.1:1 (from RAY_ADDRESS)" in err, err
    assert "--address" not in err.replace("--ray-address", ""), err  # Ray's flag, not ours

    missing = ("import sys; sys.modules['ray'] = None\n"  # as if not installed
               "from mcsync.cli.main import main; main()")
    done = subprocess.run([sys.executable, "-c", missing, *command(source_tree, str(dst),
                                                                   "--executor", "ray")[3:]],
                          cwd=ROOT, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip() == ("mcsync: error: --executor ray: Ray is not installed here "
                                   "(pip install 'mcsync[ray]')")

    # A plan moves nothing: it needs no cluster.
    done = subprocess.run([sys.executable, "-m", "mcsync.cli.main", "plan", str(source_tree),
                           str(dst), "--executor", "ray", "--ray-address", where, "--quiet"],
                          cwd=ROOT, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr

    code, _, err = run(command(source_tree, str(dst), "--ray-address", where), {})
    assert code == 2 and "--ray-address" in err and len(err.strip().splitlines()) == 1, err
    assert not dst.exists() or not any(dst.rglob("*.bin"))


def settled(cluster) -> None:
    """No actor of an earlier run left (Ray ends them a moment after their driver): each node
    has its CPU free again for the next run's placement."""
    wait_for(lambda: not ray_workers(cluster), timeout=60)


def running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def files_under(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def nodes_of_last_run(cluster) -> set[str]:
    """The nodes of the RayWorker actors of the cluster's latest job (driver)."""
    actors = [a for a in cluster_state(cluster)["actors"].values()
              if a["ActorClassName"] == "RayWorker"]
    last = max(a["JobID"] for a in actors)
    return {a["Address"]["IPAddress"] for a in actors if a["JobID"] == last}


def test_local_paths_a_node_does_not_see_are_refused_before_anything_moves(
        source_tree, ray_cluster, private_dir, tmp_path, seaweed_proxy):
    """The worker node sees its own empty directory at ``private_dir`` (a mount namespace of
    its own): a local SRC or DST there is refused, exit 2 in one line naming the path and
    what to do, nothing written; SRC and DST that both nodes see sync, on both nodes."""
    from testbed.ray_cluster import private_mounts

    if (why := private_mounts()) is not None:
        pytest.skip(why)
    env = driver_env(ray_cluster, seaweed_proxy)
    hidden_src, shared_dst = private_dir / "src", tmp_path / "dst"
    write_tree(hidden_src, SMALL)
    settled(ray_cluster)  # one worker per node: the worker node takes one
    code, _, err = run(command(hidden_src, str(shared_dst), "--executor", "ray",
                               "--workers", "2"), env)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert (f"mcsync: error: --executor ray: node {WORKER_IP} does not see the files this "
            f"machine sees at {hidden_src} (") in err, err
    assert "a local SRC under --executor ray must be on a filesystem every node mounts" in err
    assert files_under(shared_dst) == {} if shared_dst.exists() else True

    hidden_dst = private_dir / "dst"
    settled(ray_cluster)
    code, _, err = run(command(source_tree, str(hidden_dst), "--executor", "ray",
                               "--workers", "2"), env)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert f"node {WORKER_IP} does not see the files this machine sees at {hidden_dst} (" in err
    assert "a local DST under --executor ray" in err
    assert files_under(hidden_dst) == {}  # not an object, nor the marker the nodes looked for

    settled(ray_cluster)
    code, report, err = run(command(source_tree, str(shared_dst), "--executor", "ray",
                                    "--workers", "2"), env)
    assert code == 0, err
    copied = files_under(shared_dst)
    assert {k: v for k, v in copied.items() if not k.startswith(".mcsync/")} == OBJECTS
    assert not [k for k in copied if "node-check-" in k]  # the marker taken back
    assert report["objects_copied"] == len(OBJECTS) and report["tasks"] >= 2
    assert nodes_of_last_run(ray_cluster) == {"127.0.0.1", WORKER_IP}


def test_more_workers_than_the_cluster_has_room_for_run_with_those_that_fit(
        source_tree, ray_cluster, seaweed, seaweed_proxy):
    """``--workers 8`` on a cluster of 2 CPUs: the workers that fit, said on stderr, and no
    task waits for a worker Ray cannot place."""
    bucket = new_bucket(seaweed)
    settled(ray_cluster)
    began = time.monotonic()
    code, report, err = run(command(source_tree, f"meta://{bucket}/run/", "--executor", "ray",
                                    "--workers", "8"), driver_env(ray_cluster, seaweed_proxy))
    took = time.monotonic() - began
    assert code == 0, err
    said = re.findall(r"Ray has room for (\d) of the 8 workers asked \(each needs 1 CPU and "
                      r"[\d.]+ [MG]iB of memory\): running with \1", err)
    assert said in (["2"], ["1"]), err  # 1: an earlier run's placement not yet given back
    assert len(err.strip().splitlines()) == 1, err
    assert read_bucket(seaweed, bucket, "run/") == OBJECTS
    assert report["objects_failed"] == 0 and report["tasks_retried"] == 0
    assert took < 90, took  # a hang guard: Ray's wait for a CPU it never gets is unbounded


def test_a_node_where_mcsync_cannot_be_imported_is_named_and_left_out(
        source_tree, ray_cluster, private_dir, seaweed, seaweed_proxy):
    """The worker node's Python finds a broken ``xxhash`` first (on its own disk, as on a node
    where a dependency of mcsync is missing or another version is installed; mcsync itself
    comes from the driver's directory, which Ray puts first): its worker fails to start, named
    with its node and the error at once, and the run goes on with the head's."""
    from testbed.ray_cluster import private_mounts

    if (why := private_mounts()) is not None:
        pytest.skip(why)
    shadow = private_dir / "shadow" / "xxhash"
    on_worker_node = ["nsenter", "--target", str(ray_cluster.pids()[1]), "--mount", "sh", "-c"]
    subprocess.run([*on_worker_node, 'mkdir -p "$0" && echo "raise ImportError(\'xxhash is '
                    'broken on this node\')" > "$0/__init__.py"', str(shadow)], check=True,
                   timeout=30)
    assert not shadow.exists()  # this machine (the head, the driver) does not see it
    bucket = new_bucket(seaweed)
    try:
        settled(ray_cluster)
        began = time.monotonic()
        code, report, err = run(command(source_tree, f"meta://{bucket}/run/", "--executor",
                                        "ray", "--workers", "2"),
                                driver_env(ray_cluster, seaweed_proxy))
        took = time.monotonic() - began
    finally:
        subprocess.run([*on_worker_node, 'rm -rf "$0"', str(shadow.parent)], check=True,
                       timeout=30)
    assert code == 0, err
    assert len(err.strip().splitlines()) == 1, err
    assert "1 of the 2 Ray workers started (node 127.0.0.2: " in err, err
    assert "xxhash is broken on this node" in err and err.rstrip().endswith(
        "running with those"), err
    assert read_bucket(seaweed, bucket, "run/") == OBJECTS
    assert report["objects_failed"] == 0 and report["tasks_retried"] == 0
    assert took < 90, took  # a hang guard: no wait for the worker that cannot start


@pytest.mark.slow
def test_a_stuck_ray_worker_is_killed_at_its_tasks_deadline_and_the_task_runs_again(
        source_tree, ray_cluster, seaweed, seaweed_proxy):
    """An actor stopped (SIGSTOP) mid-run, as on a dead mount or a hung connection: its task
    outlives ``task_timeout`` (15 s), the actor is killed and replaced, the task goes to a
    worker again, and the run ends rc 0 with every object as the source's."""
    bucket = new_bucket(seaweed)
    stall = seaweed_proxy.add(Rule(Stall(0.1), op="PutObject"))
    code = ("import json, sys, mcsync\n"
            "r = mcsync.sync(sys.argv[1], sys.argv[2], executor='ray', workers=2, "
            "task_timeout=15, concurrency=6, part_size=5 * 2**20)\n"
            "print(json.dumps([r.ok, r.objects_failed, r.tasks_retried, r.retried_tasks]))\n")
    settled(ray_cluster)
    proc = subprocess.Popen([sys.executable, "-c", code, str(source_tree), f"meta://{bucket}/run/"],
                            env=dict(os.environ) | driver_env(ray_cluster, seaweed_proxy),
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    victims: list[int] = []
    try:
        wait_for(lambda: len([e for e in seaweed_proxy.exchanges("PutObject")
                              if e.bucket == bucket]) >= 30, timeout=120)
        victims = ray_workers(ray_cluster)
        os.kill(victims[0], signal.SIGSTOP)
        stopped = time.monotonic()
        out, err = proc.communicate(timeout=180)
        took = time.monotonic() - stopped
        # Killed, not left stopped: a process that went on later would write behind the
        # manifest's back.
        wait_for(lambda: not running(victims[0]), timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        seaweed_proxy.remove(stall)
        for pid in victims[:1]:  # Ray's kill of a stopped process may wait for it to run
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    assert proc.returncode == 0, err
    ok, failed, retried, named = json.loads(out)
    assert ok and failed == 0
    assert retried >= 1 and any("timed out after 15 s on pid " in t for t in named), named
    assert read_bucket(seaweed, bucket, "run/") == OBJECTS
    assert took < 120, took  # a hang guard


_STATE = """
import json, sys, ray
from ray._private import state
ray.init(address=sys.argv[1], logging_level="ERROR", log_to_driver=False)
print(json.dumps({"actors": state.actors(), "jobs": state.jobs()}, default=str))
"""


def cluster_state(cluster) -> dict:
    """The GCS's actor and job tables (what Ray's state API and dashboard show), read by a
    driver of its own."""
    done = subprocess.run([sys.executable, "-c", _STATE, cluster.address], env=cluster.env,
                          capture_output=True, text=True, timeout=120, check=True)
    return json.loads(done.stdout)


def test_a_delta_resync_on_ray_hashes_the_file_on_the_actors(ray_cluster, seaweed,
                                                             seaweed_proxy, tmp_path):
    """The delta's hashing read goes to Ray actors as hash tasks, as it goes to local
    workers (test_worker_delta.py): a 2 % change re-synced with the bytes of the rest reused,
    the target identical to the file."""
    from .test_worker_delta import change, same_at_target, write_safetensors

    bucket = new_bucket(seaweed)
    src = tmp_path / "src"
    src.mkdir()
    model = src / "model.safetensors"
    write_safetensors(model, 136 * 2**20)
    size = model.stat().st_size
    env = driver_env(ray_cluster, seaweed_proxy)
    args = command(src, f"meta://{bucket}/ckpt/", "--executor", "ray", "--workers", "2",
                   "--manifest", str(tmp_path / "m.sqlite"))
    code, first, err = run(args, env)
    assert code == 0 and first["objects_copied"] == 1, err

    change(model, 0.02, (0.3, 0.7))
    code, report, err = run(args, env)
    assert code == 0, err
    assert report["bytes_sent"] < size // 10 and report["bytes_reused"] > size // 2, report
    assert report["tasks"] >= 2 and report["tasks_retried"] == 0, report  # hash tasks
    assert same_at_target(seaweed, bucket, "ckpt/model.safetensors", model)


def test_the_limited_by_verdict_of_a_ray_run_adds_what_the_actors_spent(
        ray_cluster, seaweed, seaweed_proxy, tmp_path):
    """The actors send what they spent with each task's result, as local workers do
    (test_limited_by.py): the target held 0.2 s per PUT, which only the actors send, is the
    verdict, its request time at least those holds, and the figures cover three processes."""
    files = {f"obj-{i:03d}": payload(64 << 10, i) for i in range(64)}  # a task per actor
    write_tree(tmp_path / "src", files)
    bucket = new_bucket(seaweed)
    seaweed_proxy.add(Rule(Stall(0.2), op="PutObject"))
    code, report, err = run(command(tmp_path / "src", f"meta://{bucket}/", "--executor", "ray",
                                    "--workers", "2", "-c", "4"),
                            driver_env(ray_cluster, seaweed_proxy))
    assert code == 0, err
    found = report["limited_by"]
    held = len(seaweed_proxy.exchanges("PutObject", fault="stall", key="obj-*"))
    assert held >= len(files), seaweed_proxy.summary()
    assert found["verdict"] == "target" and found["processes"] == 3, found
    assert found["target_s"] >= 0.9 * 0.2 * held, (found, held)
    assert read_bucket(seaweed, bucket) == files
