"""Scale with workers: the driver of a ``--workers 2`` sync of a million keys holds memory flat
in their number.

The run moves every object (the driver lists, plans, hands each key to a worker in a task and
records its outcome in the manifest): a million empty objects of the synthetic bucket
(``testbed.synthetic``) to a local directory (tmpfs when it has inodes to spare; empty, so it
costs inodes, not pages). The driver's own peak RSS (``VmHWM`` of its process, without its
workers: ``testbed/rusage.py``'s ``tool_hwm_kib``) at a million keys is compared with the
same run at 100k: per-key state held by the driver (the tasks, the outcomes waiting to be
recorded, the report) would show as tens of MiB more. Measured here 2026-12-04 on a loaded
2-core machine: the driver's peak 86.2 MiB at 100k keys (59 s), 81.0 MiB at 1M (598 s); the
tree's (driver, 2 workers) 170 and 192 MiB (``benchmarks/results/2026-12-04-scaling.md``).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from testbed.rusage import launcher_argv
from testbed.synthetic import synthetic_server

from .test_scale import MCSYNC, MiB, child_env, tree_dir  # noqa: F401 (fixture)


def measured(argv: list[str], env: dict[str, str], tmp: Path, name: str) -> dict[str, Any]:
    """``argv`` under the launcher (``testbed/rusage.py``): its figures and its stdout. In a
    session of its own, killed whole if the test gives up."""
    out = tmp / f"{name}.rusage.json"
    proc = subprocess.Popen(launcher_argv(out, argv), env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=3000)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
            proc.wait()
    assert proc.returncode == 0, stderr[-3000:]
    usage = json.loads(out.read_text())
    usage["stdout"] = stdout
    return usage


def sync_with_workers(keys: int, tmp: Path, trees: Path) -> dict:
    dst = trees / f"dst-{keys}"
    with synthetic_server(keys, max_size=0, log_path=tmp / f"syn-{keys}.log") as ep:
        usage = measured([*MCSYNC, "sync", "meta://synthetic/", str(dst), "--workers", "2",
                          "--json", "--quiet"], child_env(tmp, ep.meta_env()), tmp,
                         f"sync-{keys}")
    report = json.loads(usage["stdout"])
    assert report["exit_code"] == 0 and report["objects_copied"] == keys, report
    assert report["tasks"] >= keys // 64 and report["tasks_retried"] == 0
    # Every key arrived, once, empty as its source.
    found = 0
    for _, _, files in os.walk(dst):
        found += sum(1 for f in files if f.startswith("part-"))
    assert found == keys
    assert os.path.getsize(dst / "shard-000000/part-0000.bin") == 0
    return usage


@pytest.mark.slow
@pytest.mark.timeout(3600)  # a million objects moved: ~20 min on a loaded 2-core machine
def test_the_driver_of_two_workers_syncs_a_million_keys_in_memory_flat_in_their_number(
        tmp_path, tree_dir):  # noqa: F811
    small = sync_with_workers(100_000, tmp_path, tree_dir)
    large = sync_with_workers(1_000_000, tmp_path, tree_dir)
    figures = {n: {k: u[k] for k in ("wall_s", "user_s", "sys_s", "tool_hwm_kib",
                                     "tree_rss_peak_kib", "tree_procs_max")}
               for n, u in (("100k", small), ("1M", large))}
    print(json.dumps(figures))
    grown = (large["tool_hwm_kib"] - small["tool_hwm_kib"]) * 1024
    assert grown < 30 * MiB, figures
    assert large["tool_hwm_kib"] * 1024 < 300 * MiB, figures
