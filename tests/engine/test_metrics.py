"""Metrics of whole runs on in-process stores: the sink and the wrapped stores agree with the
run's report, and the wrapper changes nothing of what the engine does."""

from __future__ import annotations

from typing import Any

import prometheus_client
from prometheus_client.parser import text_string_to_metric_families

from mcsync.observe.metrics import Metrics
from mcsync.stores.memory import MemoryEndpoint, MemoryStore

from .test_engine import OBJECTS, PART, contents, payload, seed, sync


def figures(metrics: Metrics) -> dict[str, Any]:
    """name → value for unlabelled samples; name → {labels: value} for the others."""
    text = prometheus_client.generate_latest(metrics.registry).decode()
    out: dict[str, Any] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.labels:
                out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
            else:
                out[s.name] = s.value
    return out


def by(table: dict[tuple[tuple[str, str], ...], float], **match: str) -> float:
    return sum(v for labels, v in table.items() if match.items() <= dict(labels).items())


def test_metrics_of_a_first_run_and_a_delta_run_match_their_reports(tmp_path):
    src = MemoryStore("src", endpoint=MemoryEndpoint("a"))
    dst = MemoryStore("dst", endpoint=MemoryEndpoint("b"))
    seed(src, OBJECTS)
    metrics = Metrics()
    source, target = metrics.wrap(src, "source"), metrics.wrap(dst, "target")
    first = sync(source, target, tmp_path, part_size=PART, on_event=metrics.emit)
    assert first.ok and contents(dst) == OBJECTS
    got = figures(metrics)
    assert got["mcsync_sent_bytes_total"] == first.bytes_sent == sum(map(len, OBJECTS.values()))
    assert by(got["mcsync_objects_total"], result="copied") == len(OBJECTS)
    assert got["mcsync_received_bytes_total"] >= first.bytes_sent
    requests = got["mcsync_requests_total"]
    assert by(requests, store="target", operation="put_part", status="ok") >= 4
    assert by(requests, store="target", operation="complete", status="ok") == 2
    assert by(requests, store="source", operation="list", status="ok") == 1
    assert by(got["mcsync_requests_in_flight"]) == 0
    assert by(got["mcsync_runs_total"], result="ok") == 1

    big = "ckpt/model-00001-of-00002.safetensors"
    changed = bytearray(OBJECTS[big])
    changed[PART + 3] ^= 0xFF  # one block of four changes: the rest is composed at the target
    seed(src, {big: bytes(changed)})
    second = sync(source, target, tmp_path, part_size=PART, on_event=metrics.emit)
    assert second.ok and contents(dst)[big] == bytes(changed)
    got = figures(metrics)
    assert second.bytes_reused > 0
    assert got["mcsync_reused_bytes_total"] == second.bytes_reused
    assert got["mcsync_sent_bytes_total"] == first.bytes_sent + second.bytes_sent
    assert by(got["mcsync_objects_total"], result="skipped") == len(OBJECTS) - 1
    assert by(got["mcsync_requests_total"], store="target", operation="copy_part") > 0
    assert by(got["mcsync_runs_total"], result="ok") == 2
    assert got["mcsync_run_duration_seconds_count"] == 2


def test_server_side_copies_through_wrapped_stores_stay_server_side(tmp_path):
    endpoint = MemoryEndpoint("one")
    src, dst = MemoryStore("src", endpoint=endpoint), MemoryStore("dst", endpoint=endpoint)
    seed(src, {"a": payload(1000, 1), "b": payload(PART * 2 + 1, 2)})
    metrics = Metrics()
    report = sync(metrics.wrap(src, "source"), metrics.wrap(dst, "target"), tmp_path,
                  part_size=PART, on_event=metrics.emit)
    assert report.ok and report.objects_server_copied == 2 and report.bytes_sent == 0
    got = figures(metrics)
    assert by(got["mcsync_objects_total"], result="server_copied") == 2
    assert got["mcsync_sent_bytes_total"] == 0
    assert got["mcsync_received_bytes_total"] == 0  # no byte through the client
