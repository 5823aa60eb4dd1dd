"""The verdict of what limited a run, from its measurements (bottleneck.judge): pure."""

from __future__ import annotations

import pytest

from mcsync.bottleneck import RunTimings, Spent, WorkersSpent, judge, with_workers


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


def spent(host: str, cores: int, **kw: float) -> Spent:
    base = {"source_s": 0.0, "target_s": 0.0, "paced_s": 0.0, "cpu_s": 0.0, "loop_s": 0.0}
    return Spent(**(base | kw), host=host, cores=cores)  # type: ignore[arg-type]


def test_the_workers_figures_add_to_the_drivers() -> None:
    w = (WorkersSpent().plus(spent("here", 2, target_s=8, paced_s=1, cpu_s=3, loop_s=2), "a")
         .plus(spent("here", 2, target_s=7, source_s=1, cpu_s=4, loop_s=3), "b"))
    t = with_workers(timings(source_s=1, target_s=1, process_cpu_s=1), w, 2, "here")
    assert (t.source_s, t.target_s, t.paced_s) == (2, 16, 1)
    assert (t.process_cpu_s, t.workers_loop_s, t.workers, t.processes) == (8, 5, 2, 3)
    assert t.cores == 2  # local workers: the driver's machine, counted once
    found = judge(t)
    assert found.verdict == "target" and found.target_s == 16 and found.processes == 3
    assert found.describe().endswith("client CPU 0.8 cores of 2 in 3 processes")


def test_workers_on_other_hosts_add_their_cores_each_host_once() -> None:
    w = (WorkersSpent().plus(spent("node-a", 16, cpu_s=10), "pid 1 on node-a")
         .plus(spent("node-a", 16, cpu_s=10), "pid 2 on node-a")
         .plus(spent("node-b", 8, cpu_s=10), "pid 1 on node-b")
         .plus(spent("here", 2, cpu_s=10), "pid 3 on here"))
    assert with_workers(timings(), w, 4, "here").cores == 2 + 16 + 8


def test_over_a_window_only_the_workers_request_times_count() -> None:
    before = WorkersSpent().plus(spent("node-a", 16, target_s=5, cpu_s=50), "a")
    now = before.plus(spent("node-a", 16, target_s=3, cpu_s=40, loop_s=9), "a")
    t = with_workers(timings(), now.since(before), 1, "here", cpu=False)
    assert t.target_s == 3 and t.process_cpu_s == 1.0 and t.cores == 2
    assert t.workers_loop_s == 0 and t.workers == 0  # a task's CPU arrives at its end


@pytest.mark.parametrize(("loops", "verdict"), [
    ((9.0, 9.0), "client"),  # both workers' loops busy 90% of the run
    ((10.0, 0.5), "target"),  # one busy, the other idle: a straggler, not the ceiling
])
def test_the_workers_loops_are_the_ceiling_when_busy_on_average(loops: tuple[float, ...],
                                                                verdict: str) -> None:
    w = WorkersSpent()
    for i, loop in enumerate(loops):
        w = w.plus(spent("here", 2, target_s=9, loop_s=loop), f"pid {i} on here")
    found = judge(with_workers(timings(target_s=1), w, len(loops), "here"))
    assert found.verdict == verdict, found
    if verdict == "client":
        assert "the workers' event loops busy" in found.describe()
