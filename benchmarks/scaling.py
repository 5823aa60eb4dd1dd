"""Scaling with the workers: 1, 2 and 4 workers, each capped so that the server is not the limit.

For each path and each worker count N it runs ``mcsync sync SRC DST --workers N --bwlimit
NxCAP`` (``--bwlimit`` is the run's total, each worker paces itself at 1/N of it: CAP each) on
about 1 GiB of mixed objects, into a new bucket each time, and measures (as the other benchmarks,
``bench_measure.run_measured``): the wall time, the client's CPU (user + sys of mcsync and of the
worker processes it waited for), the driver's own peak RSS (``VmHWM`` of the mcsync process,
without its workers) and the peak RSS of the whole process tree. Paths:

* ``upload``: a local directory → ``meta://`` on SeaweedFS A;
* ``cross``:  ``s3://`` on SeaweedFS A → ``meta://`` on SeaweedFS B (the bytes flow through the
  client, which reads and writes each one: ``--bwlimit`` counts both directions, so it is
  given 2xNxCAP there, to move data at CAP per worker as the upload does).

Rows: each worker count capped, and the same uncapped (``--workers N`` alone: what this machine
gives). Each row is the median (and the range) of ``--repeat`` runs; ``x linear`` is the
aggregate throughput over N times the median of the 1-worker capped row of the same variant.

The data (``mixed``): objects of 16 KiB to 4 MiB that one request each moves (to the workers)
and a few of 24 MiB sent as multipart uploads (the driver opens and completes them; their parts
go to the workers since part tasks landed, after the 2026-12-04 figures, when the driver moved
them itself at its own 1/N share of the limit). Made once per ``--workdir``, seeded.

A checkpoint's delta re-sync (its hashing read run on the workers, 0/1/2/4 of them) is
``benchmarks/scaling_resync.py``.

Variants: ``--variant NAME=ARGS`` adds mcsync arguments to every run of a variant (default
``local=``, the local process pool); an executor that takes ``--workers N`` is measured the same
way, e.g. ``--variant 'ray=--executor ray --ray-address 127.0.0.1:6379'``.

    .venv/bin/python benchmarks/scaling.py                       # ~20 min
    .venv/bin/python benchmarks/scaling.py --workers 1,2 --repeat 1 --paths upload
    .venv/bin/python benchmarks/scaling.py --cap 24MiB --json scaling.json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shlex
import statistics
import subprocess
import sys
import tempfile
import uuid
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.append(str(Path(__file__).resolve().parents[1]))  # testbed/: not installed

from bench_measure import ProcResult, compare, empty_bucket, list_s3, run_measured

from mcsync.config import parse_size
from testbed.servers import seaweedfs

REPO = Path(__file__).resolve().parents[1]
MIB = 1 << 20
GIB = 1 << 30
PATHS = ("upload", "cross")
# (count, size): ~1 GiB, most of it in objects a worker moves whole (up to the 8 MiB part
# size), 96 MiB in four multipart uploads (the driver's).
MIXED = ((4, 24 * MIB), (200, 4 * MIB), (400, 256 * 1024), (100, 16 * 1024))
SOURCE_BUCKET = "scaling-src"


@dataclass
class Run:
    path: str
    variant: str
    workers: int
    capped: bool
    wall_s: float
    cpu_s: float
    driver_rss_mib: float
    tree_rss_mib: float
    procs: int
    ok: bool
    tasks: int
    note: str = ""


@dataclass
class Row:
    path: str
    variant: str
    workers: int
    capped: bool
    limit: str
    gib: float
    runs: int
    failed: int
    mib_s: float
    mib_s_range: tuple[float, float]
    x_linear: float | None
    of_cap: float | None
    cpu_s_per_gib: float
    cpu_range: tuple[float, float]
    driver_rss_mib: float
    driver_rss_range: tuple[float, float]
    tree_rss_mib: float


def make_data(root: Path) -> dict[str, int]:
    """The ``mixed`` set under ``root`` (made once: a stamp says it is complete)."""
    files = {}
    rng = random.Random(20261204)
    for count, size in MIXED:
        for i in range(count):
            files[f"mixed/{size // 1024:06d}k/obj-{i:04d}.bin"] = size
    stamp = root.with_name(root.name + ".done")
    if stamp.exists():
        return files
    for rel, size in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(rng.randbytes(size))  # incompressible, seeded
    stamp.touch()
    return files


def mcsync_env(extra: dict[str, str], state: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "MCSYNC_"))}
    env.update(extra)
    env["PYTHONPATH"] = str(REPO)  # this checkout's mcsync, whatever the venv installed
    env["XDG_STATE_HOME"] = str(state)  # a fresh manifest each run, never the user's
    env["XDG_CACHE_HOME"] = str(state / "cache")
    return env


def bwlimit(path: str, workers: int, cap: int) -> str:
    """The run's total for ``workers`` workers at ``cap`` data bytes per second each."""
    both_ways = 2 if path == "cross" else 1
    return str(workers * cap * both_ways)


class Bench:
    def __init__(self, args: argparse.Namespace, work: Path, stack: ExitStack) -> None:
        self.args, self.work = args, work
        self.logs = work / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.files = make_data(work / "data")
        self.gib = sum(self.files.values()) / GIB
        self.a = stack.enter_context(seaweedfs(work / "seaweed-a"))
        self.b = (stack.enter_context(seaweedfs(work / "seaweed-b"))
                  if "cross" in args.paths else None)
        self.clients = {"A": self.a.client(), "B": self.b.client() if self.b else None}
        if self.b is not None:
            self._seed()
        subprocess.run([sys.executable, "-m", "compileall", "-q", str(REPO / "mcsync")],
                       check=True)  # as an install does (see METHOD.md, Bytecode)

    def _seed(self) -> None:
        client = self.clients["A"]
        names = {b["Name"] for b in client.list_buckets().get("Buckets", [])}
        if SOURCE_BUCKET in names and compare(self.files, list_s3(client, SOURCE_BUCKET)) is None:
            return  # seeded by an earlier invocation in this --workdir
        if SOURCE_BUCKET not in names:
            client.create_bucket(Bucket=SOURCE_BUCKET)
        for rel in self.files:
            client.put_object(Bucket=SOURCE_BUCKET, Key=rel,
                              Body=(self.work / "data" / rel).read_bytes())
        log(f"seeded s3://{SOURCE_BUCKET}/ on A: {len(self.files)} objects")

    def one(self, path: str, variant: str, extra: list[str], workers: int, capped: bool,
            n: int) -> Run:
        server = "A" if path == "upload" else "B"
        client = self.clients[server]
        assert client is not None
        bucket = f"scaling-{uuid.uuid4().hex[:10]}"
        client.create_bucket(Bucket=bucket)
        state = self.work / "state" / bucket
        target_ep = self.a if path == "upload" else self.b
        assert target_ep is not None
        env = target_ep.meta_env()
        if path == "upload":
            src = str(self.work / "data") + "/"
        else:
            src = f"s3://{SOURCE_BUCKET}/"
            env |= self.a.aws_env()
        argv = [sys.executable, "-m", "mcsync.cli.main", "sync", src, f"meta://{bucket}/",
                "--quiet", "--json", "--workers", str(workers), *extra]
        if capped:
            argv += ["--bwlimit", bwlimit(path, workers, self.args.cap)]
        name = f"{path}-{variant}-{workers}-{'cap' if capped else 'free'}-{n}"
        r = run_measured(argv, mcsync_env(env, state), stdout=self.logs / f"{name}.out",
                         stderr=self.logs / f"{name}.err", timeout=self.args.timeout)
        report = _report(self.logs / f"{name}.out")
        why = _failed(r, report) or compare(self.files, list_s3(client, bucket))
        empty_bucket(client, bucket)  # and deletes it
        run = Run(path, variant, workers, capped, r.wall_s, r.cpu_s,
                  (r.tool_hwm_kib or 0) / 1024, r.peak_rss_kib / 1024, r.tree_procs_max or 0,
                  why is None, int(report.get("tasks", 0)) if report else 0, why or "")
        log(f"  {name}: {r.wall_s:.2f} s, {self.gib * 1024 / r.wall_s:.0f} MiB/s, "
            f"{r.cpu_s:.2f} CPU s, driver {run.driver_rss_mib:.0f} MiB, tree "
            f"{run.tree_rss_mib:.0f} MiB, {run.tasks} tasks{' FAIL ' + why if why else ''}")
        return run


def _report(out: Path) -> dict | None:
    try:
        data = json.loads(out.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _failed(r: ProcResult, report: dict | None) -> str | None:
    if r.timed_out:
        return "timed out"
    if r.returncode != 0:
        return f"exit {r.returncode}"
    if report is None or report.get("objects_failed"):
        return "no report" if report is None else f"{report['objects_failed']} objects failed"
    return None


def rows_of(runs: list[Run], gib: float, cap: int) -> list[Row]:
    rows: list[Row] = []
    keys = sorted({(r.path, r.variant, r.capped, r.workers) for r in runs},
                  key=lambda k: (PATHS.index(k[0]), k[1], not k[2], k[3]))
    for path, variant, capped, workers in keys:
        mine = [r for r in runs if (r.path, r.variant, r.capped, r.workers)
                == (path, variant, capped, workers)]
        ok = [r for r in mine if r.ok] or mine
        rates = [gib * 1024 / r.wall_s for r in ok]
        cpu = [r.cpu_s / gib for r in ok]
        drv = [r.driver_rss_mib for r in ok]
        rows.append(Row(path, variant, workers, capped,
                        _mib(int(bwlimit(path, workers, cap))) + "/s" if capped else "none",
                        gib, len(mine),
                        len(mine) - len([r for r in mine if r.ok]),
                        statistics.median(rates), (min(rates), max(rates)), None,
                        statistics.median(rates) / (workers * cap / MIB) if capped else None,
                        statistics.median(cpu), (min(cpu), max(cpu)), statistics.median(drv),
                        (min(drv), max(drv)), statistics.median(r.tree_rss_mib for r in ok)))
    for row in rows:  # × linear: over N times the 1-worker row of the same kind
        one = next((o for o in rows if (o.path, o.variant, o.capped, o.workers)
                    == (row.path, row.variant, row.capped, 1)), None)
        if one is not None:
            row.x_linear = row.mib_s / (row.workers * one.mib_s)
    return rows


def _mib(n: float) -> str:
    return f"{n / MIB:g} MiB"


def table(rows: list[Row]) -> str:
    head = ("| path | variant | workers | --bwlimit (total) | MiB/s (range) | × linear | × cap | "
            "CPU s/GiB (range) | driver peak RSS MiB (range) | tree peak RSS MiB | runs |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        lines.append(
            f"| {r.path} | {r.variant} | {r.workers} | {r.limit} | {r.mib_s:.0f} "
            f"({r.mib_s_range[0]:.0f}–{r.mib_s_range[1]:.0f}) | "
            f"{'-' if r.x_linear is None else f'{r.x_linear:.2f}'} | "
            f"{'-' if r.of_cap is None else f'{r.of_cap:.2f}'} | {r.cpu_s_per_gib:.2f} "
            f"({r.cpu_range[0]:.2f}–{r.cpu_range[1]:.2f}) | {r.driver_rss_mib:.0f} "
            f"({r.driver_rss_range[0]:.0f}–{r.driver_rss_range[1]:.0f}) | "
            f"{r.tree_rss_mib:.0f} | {r.runs}{f' ({r.failed} FAILED)' if r.failed else ''} |")
    return "\n".join(lines)


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", default="1,2,4", help="worker counts (default 1,2,4)")
    parser.add_argument("--cap", type=parse_size, default=16 * MIB,
                        help="data bytes per second per worker (default 16MiB)")
    parser.add_argument("--paths", default=",".join(PATHS), help=f"of {','.join(PATHS)}")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--no-uncapped", dest="uncapped", action="store_false",
                        help="skip the uncapped rows")
    parser.add_argument("--variant", action="append", default=[], metavar="NAME=ARGS",
                        help="mcsync arguments for a variant's runs (default: local=)")
    parser.add_argument("--workdir", type=Path, default=None,
                        help="keep the data and logs here (default: a temporary directory)")
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument("--json", type=Path, default=None, help="write runs and rows as JSON")
    parser.add_argument("--render", type=Path, default=None, metavar="JSON",
                        help="print the table of an earlier --json, run nothing")
    args = parser.parse_args(argv)
    if args.render is not None:
        saved = json.loads(args.render.read_text())
        gib = saved["rows"][0]["gib"]
        print(table(rows_of([Run(**r) for r in saved["runs"]], gib, saved["cap"])))
        return 0
    args.paths = [p for p in args.paths.split(",") if p]
    if set(args.paths) - set(PATHS):
        parser.error(f"--paths: of {', '.join(PATHS)}")
    counts = [int(n) for n in args.workers.split(",")]
    variants = [(v.partition("=")[0], shlex.split(v.partition("=")[2]))
                for v in args.variant or ["local="]]
    runs: list[Run] = []
    with ExitStack() as stack:
        work = args.workdir or Path(stack.enter_context(
            tempfile.TemporaryDirectory(prefix="mcsync-scaling-")))
        bench = Bench(args, work, stack)
        log(f"data: {len(bench.files)} objects, {bench.gib:.2f} GiB; cap {_mib(args.cap)}/s "
            "per worker")
        kinds = [True, False] if args.uncapped else [True]
        # Rounds: every configuration once, then again, so drift on the shared cores does not
        # land on one of them.
        for n in range(args.repeat):
            for path in args.paths:
                for name, extra in variants:
                    for capped in kinds:
                        for workers in counts:
                            runs.append(bench.one(path, name, extra, workers, capped, n))
        rows = rows_of(runs, bench.gib, args.cap)
    print(table(rows))
    if args.json:
        args.json.write_text(json.dumps({"runs": [asdict(r) for r in runs],
                                         "rows": [asdict(r) for r in rows],
                                         "cap": args.cap, "argv": sys.argv}, indent=2))
    return 1 if any(not r.ok for r in runs) else 0


if __name__ == "__main__":
    sys.exit(main())
