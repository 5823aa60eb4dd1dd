"""What the command prints about counts: a noun agrees with its number (``copied 1 object``),
in the summary, the progress line and the plan."""

from __future__ import annotations

import io

import pytest

from mcsync.cli.plan_view import PlanSummary, delta_line
from mcsync.cli.progress import LogProgress, counted, summary
from mcsync.events import DeltaPlanned, ObjectDeferred, ObjectPlanned
from mcsync.report import SyncReport


@pytest.mark.parametrize(("n", "text"), [(0, "0 objects"), (1, "1 object"), (2, "2 objects")])
def test_a_count_agrees_with_its_noun(n, text):
    assert counted(n, "object") == text


def test_an_irregular_plural_is_given():
    assert counted(3, "directory", "directories") == "3 directories"


def test_the_summary_of_one_object_says_object():
    line = summary(SyncReport("s", "d", objects_copied=1, bytes_copied=5))
    assert line.startswith("copied 1 object (") and "objects" not in line
    assert summary(SyncReport("s", "d", objects_copied=2)).startswith("copied 2 objects (")


def test_the_progress_line_of_one_object_says_object():
    out = io.StringIO()
    clock = iter([0.0, 10.0])
    progress = LogProgress(out, interval=5.0, clock=lambda: next(clock))
    progress.emit(ObjectPlanned(key="a", action="copy", size=3, reason="new"))
    assert "progress: 0/1 object, " in out.getvalue()


def test_the_plan_says_one_changed_object_and_one_part(capsys):
    plan = PlanSummary()
    delta = DeltaPlanned("m.bin", 10, 1, 1, 9, 1)
    plan.emit(delta)
    plan.emit(ObjectDeferred("ckpt/a", 4, "checkpoint not complete"))
    plan.close()
    out = capsys.readouterr().out
    assert "block delta for 1 changed object:" in out
    assert "(1 part)" in delta_line(delta)
    assert "1 object " in out and "1 objects" not in out


def test_a_warms_progress_counts_cached_objects_done_and_fetched_bytes():
    from mcsync.events import CacheFetched, CacheServed, WarmListed

    out = io.StringIO()
    clock = iter([0.0, 1.0, 2.0, 3.0, 4.0, 10.0])
    progress = LogProgress(out, interval=5.0, clock=lambda: next(clock))
    progress.emit(WarmListed(objects=3, nbytes=3 * 1024))
    progress.emit(CacheServed("s3://b/a", 1024, hit=True))  # already cached: done at once
    progress.emit(CacheFetched("s3://b/b", 512))
    progress.emit(CacheFetched("s3://b/b", 512))
    assert out.getvalue() == ""
    progress.emit(CacheServed("s3://b/b", 1024, hit=False))  # its bytes counted as fetched
    assert out.getvalue().startswith("progress: 2/3 objects, 2.0 KiB/3.0 KiB, "), out.getvalue()


def test_the_progress_line_says_what_limited_the_run_lately():
    from mcsync.events import Bottleneck

    out = io.StringIO()
    clock = iter([0.0, 1.0, 2.0, 10.0])
    progress = LogProgress(out, interval=5.0, clock=lambda: next(clock))
    progress.emit(ObjectPlanned(key="a", action="copy", size=3, reason="new"))
    progress.emit(Bottleneck("target", "limited by the target: 90% ..."))
    assert out.getvalue() == ""
    progress.emit(ObjectPlanned(key="b", action="copy", size=3, reason="new"))
    assert out.getvalue().rstrip().endswith(", limited by target"), out.getvalue()
