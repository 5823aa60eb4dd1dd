"""``--workers``: a large object split across worker processes by the parts of one multipart
upload that the driver opens, journals and completes. Against SeaweedFS through the fault
proxy, which names every request (each part sent once, one upload per key) and stalls parts
where a test needs them in flight when it kills a process. Which worker sent which parts comes
from the driver's debug log (``-v``): "KEY: parts N sent by worker PID@HOST"."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import sqlite3
import subprocess
from collections import Counter
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from testbed.faultproxy import Rule, Stall

from .helpers import new_bucket, read_bucket
from .test_workers import LARGE, OBJECTS, ROOT, command, run, source_tree, wait_for, workers_of

__all__ = ["source_tree"]  # the module's fixture, shared

SENT_BY = re.compile(
    r"^DEBUG mcsync\.move\.part_tasks: (.+): parts ([\d, ]+) sent by worker (\d+)@", re.M)
PARTS = {key: -(-len(data) // (5 << 20)) for key, data in LARGE.items()}  # 5 MiB parts


def sent_by(log: str) -> dict[str, dict[int, str]]:
    """key → part number → the pid of the worker that sent it, from the driver's log."""
    found: dict[str, dict[int, str]] = {}
    for key, numbers, pid in SENT_BY.findall(log):
        for n in numbers.split(", "):
            found.setdefault(key, {})[int(n)] = pid
    return found


def upload_id(exchange) -> str:
    return parse_qs(urlsplit(exchange.target).query).get("uploadId", [""])[0]


def records(manifest: Path) -> dict[str, tuple]:
    with contextlib.closing(sqlite3.connect(manifest)) as db:
        return {row[0]: row[1:] for row in db.execute(
            "SELECT key, block_size, block_hashes, chunk_sizes, chunker, xxh3, dst_size "
            "FROM objects")}


def journal(manifest: Path) -> dict[str, tuple[str, set[int]]]:
    """key → (upload id, part numbers journalled) of the uploads a run left open."""
    if not manifest.exists():
        return {}
    with contextlib.closing(sqlite3.connect(manifest)) as db:
        try:
            ids = dict(db.execute("SELECT key, upload_id FROM uploads"))
            parts = list(db.execute("SELECT key, number FROM parts"))
        except sqlite3.OperationalError:  # not created yet
            return {}
    return {k: (i, {n for key, n in parts if key == k}) for k, i in ids.items()}


def test_large_objects_go_to_workers_by_parts_each_sent_once(source_tree, seaweed,
                                                              seaweed_proxy, tmp_path):
    bucket, alone = new_bucket(seaweed), new_bucket(seaweed)
    env = seaweed_proxy.endpoint.meta_env()
    args = command(source_tree, f"meta://{bucket}/run/", "--workers", "3", "-v",
                   "--manifest", str(tmp_path / "workers.sqlite"))
    proc = subprocess.Popen(args, env=dict(os.environ) | env, cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, err[-3000:]
    report = json.loads(out)
    assert read_bucket(seaweed, bucket, "run/") == OBJECTS

    # One upload per large key, opened and completed once (by the driver), each part sent
    # once, into that upload.
    mine = [e for e in seaweed_proxy.exchanges() if e.bucket == bucket
            and not e.key.startswith("run/.mcsync/")]
    for op in ("CreateMultipartUpload", "CompleteMultipartUpload"):
        assert Counter(e.key for e in mine if e.op == op) == Counter(
            {f"run/{k}": 1 for k in LARGE}), op
    parts = [e for e in mine if e.op == "UploadPart"]
    assert Counter((e.key, int(e.part)) for e in parts) == Counter(
        {(f"run/{k}", n): 1 for k, count in PARTS.items() for n in range(1, count + 1)})
    assert len({upload_id(e) for e in parts}) == len(LARGE)
    assert not seaweed.client().list_multipart_uploads(Bucket=bucket).get("Uploads")

    # Sent by worker processes, more than one of them, never by the driver.
    by = sent_by(err)
    assert {k: set(v) for k, v in by.items()} == {
        k: set(range(1, n + 1)) for k, n in PARTS.items()}, err[-3000:]
    senders = {pid for parts_of in by.values() for pid in parts_of.values()}
    assert len(senders) >= 2 and str(proc.pid) not in senders, by
    assert report["tasks"] >= sum(PARTS.values()) and report["tasks_retried"] == 0

    # The records a single-process run makes of the same data, block hash for block hash.
    code, single, err = run(command(source_tree, f"meta://{alone}/run/", "--manifest",
                                    str(tmp_path / "alone.sqlite")), env)
    assert code == 0, err
    assert single["tasks"] == 0
    ours, theirs = records(tmp_path / "workers.sqlite"), records(tmp_path / "alone.sqlite")
    assert set(ours) >= set(LARGE) and ours == theirs
    for key in ("bytes_sent", "bytes_transferred", "objects_copied"):
        assert report[key] == single[key], key


def test_a_worker_killed_during_part_tasks_has_them_sent_by_another(source_tree, seaweed,
                                                                     seaweed_proxy):
    bucket = new_bucket(seaweed)
    # Parts held 2 s at the proxy: some are in flight in a worker when one is killed (a
    # process pool breaks whole, so every task in it goes to the fresh pool).
    seaweed_proxy.add(Rule(Stall(2.0), op="UploadPart"))
    env = dict(os.environ) | seaweed_proxy.endpoint.meta_env()
    proc = subprocess.Popen(command(source_tree, f"meta://{bucket}/run/", "--workers", "3"),
                            env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        wait_for(lambda: any(e.bucket == bucket for e in seaweed_proxy.exchanges("UploadPart")))
        victims = workers_of(proc.pid)
        assert victims
        os.kill(victims[0], signal.SIGKILL)
        out, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    report = json.loads(out)
    assert read_bucket(seaweed, bucket, "run/") == OBJECTS
    assert report["objects_copied"] == len(OBJECTS) and report["objects_failed"] == 0
    retried = [t for t in report["retried_tasks"] if "(parts " in t]
    assert retried and all("died" in t and "ckpt/" in t for t in retried), report["retried_tasks"]
    creates = Counter(e.key for e in seaweed_proxy.exchanges("CreateMultipartUpload")
                      if e.bucket == bucket and not e.key.startswith("run/.mcsync/"))
    assert creates == Counter({f"run/{k}": 1 for k in LARGE})


def test_a_killed_driver_resumes_its_upload_sending_only_what_was_not_journalled(
        source_tree, seaweed, seaweed_proxy, tmp_path):
    """The first two parts go through; the others are held at the proxy (the server has them,
    their answers are held) when the driver is killed. The same command takes the journalled
    upload up: the journalled parts are not sent again; those in flight at the kill, which no
    journal names, are."""
    bucket = new_bucket(seaweed)
    manifest = tmp_path / "manifest.sqlite"
    seaweed_proxy.add(Rule(Stall(0.0), op="UploadPart", count=2))
    hold = seaweed_proxy.add(Rule(Stall(120.0), op="UploadPart"))
    env = seaweed_proxy.endpoint.meta_env()
    args = command(source_tree, f"meta://{bucket}/run/", "--workers", "3", "--manifest",
                   str(manifest))
    proc = subprocess.Popen(args, env=dict(os.environ) | env, cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: sum(len(p) for _, p in journal(manifest).values()) >= 2)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    left = journal(manifest)
    assert sum(len(p) for _, p in left.values()) == 2, left
    seaweed_proxy.remove(hold)
    before = len(seaweed_proxy.exchanges())

    code, report, err = run(args, env)
    assert code == 0, err
    assert read_bucket(seaweed, bucket, "run/") == OBJECTS
    assert report["objects_failed"] == 0
    again = [e for e in seaweed_proxy.exchanges()[before:] if e.bucket == bucket]
    for key, (uid, journalled) in left.items():
        if key.startswith(".mcsync/"):
            continue
        # The upload taken up, not opened again; none of its journalled parts resent.
        assert not [e for e in again if e.op == "CreateMultipartUpload"
                    and e.key == f"run/{key}"]
        resent = {int(e.part) for e in again if e.op == "UploadPart"
                  and e.key == f"run/{key}" and upload_id(e) == uid}
        assert not resent & journalled, (key, resent, journalled)
        assert resent | journalled == set(range(1, PARTS[key] + 1))
