"""The report as ``--json`` prints it and the manifest records it."""

from __future__ import annotations

import dataclasses
import json

from mcsync.events import ObjectDone, StatsCollector
from mcsync.report import ObjectFailure, ObjectResult, SyncReport, report_json


def _report(*results: ObjectResult, **given: int) -> SyncReport:
    """A report of a run that changed ``results``, built as a run builds it, then ``given``
    fields set."""
    stats = StatsCollector("s3://a/", "meta://b/")
    for result in results:
        stats.emit(ObjectDone(result))
    report = stats.finish()
    for name, value in given.items():
        setattr(report, name, value)
    return report


def test_to_dict_holds_every_field_as_dataclasses_asdict_would() -> None:
    report = _report(ObjectResult("a", "copy", 100, 100, "ab" * 16, 4096, "e1", 60, 40, 20,
                                  (("old/a", 20), ("old/b", 40))),
                     ObjectResult("b", "server_copy", 50, 0), objects_copied=3, bytes_sent=250)
    report.failures.append(ObjectFailure("c", "c: access denied", "AccessDenied", False))
    report.deferred.append(("d", "a checkpoint not complete yet"))

    expected = dataclasses.asdict(report)  # the deep conversion, as the oracle
    expected["failures"] = [{"key": "c", "error": "c: access denied", "kind": "AccessDenied",
                             "retryable": False}]
    expected["deferred"] = [{"key": "d", "reason": "a checkpoint not complete yet"}]
    got = report.to_dict()
    extra = {"bytes_transferred", "throughput_bps", "sent_per_changed", "exit_code"}
    assert {k: v for k, v in got.items() if k not in extra} == expected
    assert got["objects"][0]["reused_from"] == (("old/a", 20), ("old/b", 40))
    assert json.loads(json.dumps(got))["objects"][1] == {
        "key": "b", "action": "server_copy", "size": 50, "bytes_sent": 0, "xxh3_128": None,
        "hash_block_size": None, "etag": None, "bytes_reused": 0, "bytes_changed": None,
        "bytes_reused_own": 0, "reused_from": []}


def test_to_dict_is_a_copy_the_caller_may_change() -> None:
    report = _report(ObjectResult("a", "copy", 1, 1))
    got = report.to_dict()
    got["objects"].clear()
    got["objects_copied"] = 99
    assert len(report.objects) == 1 and report.objects_copied == 1


def test_report_json_parses_back_with_a_line_per_field_and_per_entry() -> None:
    report = _report(ObjectResult("a\n\"b", "copy", 100, 100, "ab" * 16, 4096, "e1", 60, 40,
                                  20, (("old/a", 20),)),
                     ObjectResult("c", "copy", 1, 1), objects_copied=4)
    report.failures.append(ObjectFailure("d", "d: access denied", "AccessDenied"))
    doc = report.to_dict()

    text = report_json(doc)

    assert json.loads(text) == json.loads(json.dumps(doc))
    lines = text.splitlines()
    # a line per field, the braces, then per non-empty list its entries and its closing bracket
    assert len(lines) == len(doc) + 2 + (2 + 1) + (1 + 1)
    assert sum(line.startswith('    {"key": ') for line in lines) == 3
    assert report_json({}) == "{}"


def test_a_failure_unpacks_as_the_key_and_error_pair_it_was() -> None:
    failure = ObjectFailure("k", "k: slow down", "Throttled", True)
    key, error = failure
    assert (key, error) == ("k", "k: slow down") and failure[1] == "k: slow down"
    assert dict([failure]) == {"k": "k: slow down"}


def test_the_tasks_of_worker_processes_are_in_the_report_and_its_summary():
    from mcsync.cli.progress import summary
    from mcsync.report import RunTotals

    stats = StatsCollector("src/", "dst/")
    named = ("task 3 (32 objects, a .. b): a worker process died (...); run again on a fresh "
             "pool",)
    report = stats.finish(RunTotals(tasks=12, tasks_retried=1, retried_tasks=named))
    doc = json.loads(report_json(report.to_dict()))
    assert (doc["tasks"], doc["tasks_retried"], doc["retried_tasks"]) == (12, 1, list(named))
    assert "1 task of 12 run again: a worker process died" in summary(report)
    assert "run again" not in summary(StatsCollector("src/", "dst/").finish())
