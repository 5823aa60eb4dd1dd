"""`--metrics-file` and `--metrics-addr` on real runs: the command as shipped, in a process of
its own, against SeaweedFS; the figures read back with prometheus_client's parser. And the
HTTP exposition itself (``Metrics.serving``) on a port of 127.0.0.1."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from mcsync.events import ObjectDone
from mcsync.observe.metrics import Metrics
from mcsync.report import ObjectResult
from testbed.processes import free_port

from .helpers import CRASHING_MCSYNC, new_bucket, payload, read_bucket, write_tree

MiB = 1 << 20
OBJECTS = {
    "ckpt/model-00001-of-00002.safetensors": payload(11 * MiB, 1),
    "ckpt/model-00002-of-00002.safetensors": payload(11 * MiB, 2),
    "ckpt/config.json": b'{"hidden": 64}',
    **{f"data/part-{i:02d}.jsonl": payload(5_000 + i, 10 + i) for i in range(8)},
}
TOTAL = sum(map(len, OBJECTS.values()))
REPO = Path(__file__).parents[2]


@pytest.fixture(scope="module")
def source_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("metrics-src")
    write_tree(root, OBJECTS)
    return root


def mcsync(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mcsync.cli.main", *args],
                          env=dict(os.environ) | env, capture_output=True, text=True,
                          timeout=120, check=False, cwd=REPO)


def parse(text: str) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """name → {sorted labels → value}."""
    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


def one(got: dict[str, Any], name: str, **labels: str) -> float:
    value: float = got[name][tuple(sorted(labels.items()))]
    return value


def total(got: dict[str, Any], name: str, **match: str) -> float:
    return sum(v for labels, v in got.get(name, {}).items()
               if match.items() <= dict(labels).items())


def test_the_textfile_holds_the_run_s_figures(source_tree, seaweed, tmp_path):
    bucket = new_bucket(seaweed)
    dst = f"meta://{bucket}/run/"
    prom = tmp_path / "textfile" / "mcsync.prom"
    before = time.time()
    run = mcsync("sync", str(source_tree), dst, "--part-size", "5MiB", "--quiet",
                 "--metrics-file", str(prom), env=seaweed.meta_env())
    assert run.returncode == 0, run.stderr
    assert read_bucket(seaweed, bucket, "run/") == OBJECTS
    assert sorted(p.name for p in prom.parent.iterdir()) == ["mcsync.prom"]
    got = parse(prom.read_text())
    assert one(got, "mcsync_sent_bytes_total") == TOTAL
    assert one(got, "mcsync_received_bytes_total") >= TOTAL
    assert one(got, "mcsync_objects_total", result="copied") == len(OBJECTS)
    assert one(got, "mcsync_objects_total", result="failed") == 0
    assert one(got, "mcsync_runs_total", result="ok") == 1
    assert before <= one(got, "mcsync_last_success_timestamp_seconds") <= time.time()
    for store, operation in [("target", "put_part"), ("target", "open_upload"),
                             ("target", "complete"), ("target", "put"), ("source", "list"),
                             ("source", "read_into")]:
        assert total(got, "mcsync_requests_total", store=store, operation=operation,
                     status="ok") > 0, (store, operation)
    assert total(got, "mcsync_request_duration_seconds_count", store="target",
                 operation="put_part") == 6  # two objects of three 5 MiB parts
    assert total(got, "mcsync_requests_in_flight") == 0
    assert not any(name.endswith("_created") for name in got)
    text = prom.read_text()
    for secret in seaweed.meta_env().values():  # no key, no endpoint, no bucket
        assert secret not in text
    assert bucket not in text

    # A run with nothing to do: everything skipped, and still counted as a success.
    again = mcsync("sync", str(source_tree), dst, "--quiet", "--metrics-file", str(prom),
                   env=seaweed.meta_env())
    assert again.returncode == 0, again.stderr
    got = parse(prom.read_text())
    assert one(got, "mcsync_objects_total", result="skipped") == len(OBJECTS)
    assert one(got, "mcsync_sent_bytes_total") == 0
    assert one(got, "mcsync_runs_total", result="ok") == 1


def test_a_run_that_cannot_start_is_counted_and_keeps_the_last_success(tmp_path):
    prom = tmp_path / "mcsync.prom"
    ok = mcsync("sync", str(tmp_path / "empty-src"), str(tmp_path / "dst"), "--quiet",
                "--metrics-file", str(prom), env={})
    assert ok.returncode == 2  # the source does not exist
    got = parse(prom.read_text())
    assert one(got, "mcsync_runs_total", result="error") == 1
    assert one(got, "mcsync_last_success_timestamp_seconds") == 0

    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a").write_bytes(b"a")
    assert mcsync("sync", str(tmp_path / "src"), str(tmp_path / "dst"), "--quiet",
                  "--metrics-file", str(prom), env={}).returncode == 0
    succeeded = one(parse(prom.read_text()), "mcsync_last_success_timestamp_seconds")
    assert succeeded > 0
    assert mcsync("sync", str(tmp_path / "gone"), str(tmp_path / "dst"), "--quiet",
                  "--metrics-file", str(prom), env={}).returncode == 2
    got = parse(prom.read_text())
    assert one(got, "mcsync_runs_total", result="error") == 1
    assert one(got, "mcsync_last_success_timestamp_seconds") == succeeded


def test_metrics_are_served_while_the_run_lives(source_tree, seaweed):
    bucket = new_bucket(seaweed)
    port = free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    # Every part takes half a second longer: the run lasts a few seconds, busy throughout.
    env = dict(os.environ) | seaweed.meta_env() | {"DELAY_AT": "put_part:0.5"}
    proc = subprocess.Popen(
        [sys.executable, str(CRASHING_MCSYNC), "sync", str(source_tree), f"meta://{bucket}/r/",
         "--part-size", "5MiB", "-c", "2", "--quiet", "--metrics-addr", f"127.0.0.1:{port}"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
    scrapes: list[dict[str, Any]] = []
    try:
        deadline = time.monotonic() + 60
        while proc.poll() is None and time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(url, timeout=2) as answer:
                    assert answer.status == 200
                    assert answer.headers["Content-Type"].startswith("text/plain")
                    scrapes.append(parse(answer.read().decode()))
            except (urllib.error.URLError, ConnectionError):
                pass  # not listening yet, or already gone
            time.sleep(0.2)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    # Scrapes of the run at work: requests in flight and the run not yet counted. (The lock's
    # DELETE comes after the run is counted: a scrape during it is busy but not mid-run.)
    busy = [s for s in scrapes if total(s, "mcsync_requests_in_flight", store="target") > 0
            and one(s, "mcsync_runs_total", result="ok") == 0]
    assert busy, f"no scrape found the run with a request in flight ({len(scrapes)} scrapes)"
    # The first such scrape is mid-transfer; a later one may come after the last part landed,
    # while the uploads' completions and the manifest's copy are still in flight.
    assert one(busy[0], "mcsync_sent_bytes_total") < TOTAL
    parts = [total(s, "mcsync_requests_total", operation="put_part", status="ok")
             for s in scrapes]
    assert parts == sorted(parts) and parts[-1] > 0  # a counter that grows as parts land
    with pytest.raises(urllib.error.URLError):  # the server stopped with the run
        urllib.request.urlopen(url, timeout=2)


def test_serving_answers_scrapes_while_it_lives_and_frees_the_port() -> None:
    metrics = Metrics()
    metrics.emit(ObjectDone(ObjectResult("a", "copy", 3, 3)))
    with metrics.serving("127.0.0.1", 0) as (host, port):
        assert host == "127.0.0.1" and port > 0
        with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=5) as answer:
            text = answer.read().decode()
        threads = {t.name for t in threading.enumerate()}
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert families["mcsync_sent_bytes"].samples[0].value == 3
    assert "process_cpu_seconds_total" not in text  # the global registry's, not ours
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2)
    assert {t.name for t in threading.enumerate()} < threads


# The S3 requests each metered operation sends (one each), as the proxy names them.
SENDS = {"PutObject": "put", "GetObject": "get", "HeadObject": "head", "DeleteObject": "delete",
         "DeleteObjects": "delete", "ListObjectsV2": "list", "CopyObject": "server_copy",
         "CreateMultipartUpload": "open_upload", "UploadPart": "put_part",
         "UploadPartCopy": "copy_part", "ListParts": "resume_upload",
         "CompleteMultipartUpload": "complete", "AbortMultipartUpload": "abort"}


def test_a_run_with_workers_counts_every_process_s_requests(seaweed, seaweed_proxy, tmp_path):
    """The metrics of a ``--workers 2`` run are the requests a proxy in front of the target
    saw, operation by operation: the workers' (whole objects, the parts of a copy in parts)
    as well as the driver's."""
    small = {f"data/item-{i:03d}.bin": payload(1_000 + 7 * i, 100 + i) for i in range(60)}
    objects = small | {"ckpt/model.bin": payload(12 * MiB, 99)}
    write_tree(tmp_path / "src", objects)
    bucket = new_bucket(seaweed)
    prom = tmp_path / "mcsync.prom"
    run = mcsync("sync", str(tmp_path / "src"), f"meta://{bucket}/run/", "--workers", "2",
                 "--part-size", "5MiB", "--quiet", "--metrics-file", str(prom),
                 env=seaweed_proxy.endpoint.meta_env())
    assert run.returncode == 0, run.stderr
    assert read_bucket(seaweed, bucket, "run/") == objects
    got = parse(prom.read_text())

    seen = [e for e in seaweed_proxy.exchanges() if e.bucket == bucket]
    assert all(e.outcome == "ok" for e in seen), seaweed_proxy.summary()
    # The target's check is one operation of two requests: a listing (the run's first) and,
    # the listing being empty, a GET of a key that cannot exist (is this S3 at all?).
    listings = [e for e in seen if e.op == "ListObjectsV2"]
    check = [listings[0], *(e for e in seen if e.op == "GetObject" and "/.mcsync/probe-" in e.key)]
    assert len(check) == 2
    at_proxy: Counter[tuple[str, str]] = Counter()
    for e in seen:
        if e not in check:
            assert e.op in SENDS, e
            at_proxy[SENDS[e.op], "ok" if e.status is not None and e.status < 300
                     else "NotFound" if e.status == 404 else str(e.status)] += 1
    at_proxy["check", "ok"] += 1
    counted = Counter({(dict(labels)["operation"], dict(labels)["status"]): int(v)
                       for labels, v in got["mcsync_requests_total"].items()
                       if dict(labels)["store"] == "target" and v})
    assert counted == at_proxy
    # The workers' requests were in it: each small object one PUT from a worker, and the big
    # one's parts sent by workers, which found its upload (ListParts) first.
    assert at_proxy["put", "ok"] > len(small) and at_proxy["resume_upload", "ok"] >= 1
    timed = {dict(labels)["operation"]: int(v)
             for labels, v in got["mcsync_request_duration_seconds_count"].items()
             if dict(labels)["store"] == "target"}
    assert timed["put"] == at_proxy["put", "ok"] and timed["put_part"] == 3
    # Every byte read from the source, by whichever process read it.
    assert one(got, "mcsync_received_bytes_total") >= sum(map(len, objects.values()))
    assert total(got, "mcsync_requests_in_flight") == 0
    assert one(got, "mcsync_requests_in_flight_peak", store="target") >= 2  # two processes
