"""The verdict of what limited a run, from its measurements (bottleneck.judge): pure."""

from __future__ import annotations

import pytest

from mcsync.bottleneck import RunTimings, judge


def timings(**kw: float) -> RunTimings:
    base = {"wall_s": 10.0, "source_s": 0.0, "target_s": 0.0, "paced_s": 0.0,
            "loop_cpu_s": 1.0, "process_cpu_s": 1.0, "cores": 2}
    return RunTimings(**(base | kw))  # type: ignore[arg-type]


@pytest.mark.parametrize(("kw", "verdict"), [
    ({"source_s": 10, "target_s": 10, "paced_s": 30}, "bwlimit"),
    ({"source_s": 1, "target_s": 9, "loop_cpu_s": 9.5}, "client"),
    ({"source_s": 1, "target_s": 9, "process_cpu_s": 17}, "client"),
    ({"source_s": 2, "target_s": 18}, "target"),
    ({"source_s": 18, "target_s": 2}, "source"),
    ({"source_s": 10, "target_s": 10}, "network"),
    ({}, "none"),
])
def test_the_first_thing_that_bound_the_run_is_the_verdict(kw: dict[str, float],
                                                           verdict: str) -> None:
    assert judge(timings(**kw)).verdict == verdict


def test_the_line_and_the_record_carry_the_figures() -> None:
    found = judge(timings(source_s=2, target_s=18, process_cpu_s=4))
    assert found.describe() == ("limited by the target: 90% of request time waiting on its "
                                "answers; client CPU 0.4 cores of 2")
    doc = found.to_dict()
    assert doc["verdict"] == "target" and doc["target_share"] == 0.9 and doc["cores"] == 2
