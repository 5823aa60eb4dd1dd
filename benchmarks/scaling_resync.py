"""Scaling with the workers, a checkpoint re-sync: does the block delta's hashing read scale?

A 1 GiB safetensors file (random 4 MiB tensors) at a local source is synced once to
``meta://`` on SeaweedFS (untimed); then, round after round, 2 % of it is rewritten (two runs
of 1 % at random offsets, new random bytes) and it is re-synced with ``--workers N`` for each
N of ``--workers`` (default 0,1,2,4; 0: the driver alone), the order rotated each round. One
target and one manifest throughout, so every run is a delta against the previous one.

Each run (``bench_measure.run_measured``): the wall time; client CPU (user + sys of the driver
and of the workers it reaped); the driver's own peak RSS (``VmHWM``); the driver's own read
bytes (``rchar`` of ``/proc/PID/io``, sampled every 20 ms while no worker of it is reaped, as
``tests/integration/test_worker_delta.py`` does: a reaped child's counts join its parent's);
when the hashing read was through (``DriverReads``); ``bytes_sent``, ``bytes_reused`` and
``limited_by`` of the ``--json`` report; the server's CPU. After each run the object's SHA-256
is checked against the file's. With no workers the change is also planned first (``--dry-run``:
the hashing read alone, in the driver).

``--cold``: each configuration also runs with the file's pages evicted first
(``posix_fadvise(DONTNEED)`` on that file alone), so the hashing read comes from the disk.

    .venv/bin/python benchmarks/scaling_resync.py                 # ~4 min
    .venv/bin/python benchmarks/scaling_resync.py --repeat 4 --cold --json resync.json  # ~9 min
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.append(str(Path(__file__).resolve().parents[1]))  # testbed/, tests/: not installed

from bench_measure import run_measured
from scaling import _failed, _report, log, mcsync_env

from testbed.servers import seaweedfs
from tests.integration.test_worker_delta import change, rchar, sha256_of, write_safetensors
from tests.integration.test_workers import children

MIB = 1 << 20
KEY = "ckpt/model.safetensors"


@dataclass
class Run:
    dry: bool  # --dry-run: the delta planned (the hashing read), nothing sent
    workers: int
    cold: bool
    round: int
    wall_s: float
    cpu_s: float
    driver_read: int
    driver_rss_mib: float
    sent: int
    reused: int
    tasks: int
    load1: float
    server_cpu_s: float
    hashed_s: float
    verdict: str  # the report's limited_by: its verdict and the target's share
    ok: bool
    note: str = ""


def server_cpu() -> float:
    """CPU seconds of this process's ``weed`` children (the SeaweedFS server)."""
    total = 0
    for pid, cmd in children(os.getpid()):
        if "weed" in cmd.split(" ")[0]:
            try:
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            total += sum(int(f) for f in fields[11:15])  # utime stime cutime cstime
    return total / os.sysconf("SC_CLK_TCK")


class DriverReads(threading.Thread):
    """The driver's own ``rchar``: the mcsync process whose command line holds ``marker``,
    sampled until it ends or one of its workers (children) is gone. ``hashed_s``: when the
    hashing read was through, about: the workers' reads (the driver's without workers) first
    reached ``size``; their start-up reads make it early by a few MiB a process."""

    def __init__(self, marker: str, size: int) -> None:
        super().__init__(daemon=True)
        self.marker, self.size, self.done, self.own = marker, size, threading.Event(), 0
        self.start_t, self.hashed_s = time.perf_counter(), 0.0

    def run(self) -> None:
        pid = None
        workers: dict[int, int] = {}
        while pid is None and not self.done.is_set():
            pid = next((p for launcher, _ in children(os.getpid())
                        for p, cmd in children(launcher)
                        if "mcsync.cli.main" in cmd and self.marker in cmd), None)
            time.sleep(0.01)
        seen: set[int] = set()
        while pid is not None:
            try:
                count = rchar(pid)
            except (OSError, AssertionError):
                return  # exited: the last sample stands
            if seen and not all(Path(f"/proc/{w}").exists() for w in seen):
                return  # a worker reaped: the count holds its reads from here
            self.own = count
            seen.update(p for p, _ in children(pid))
            for w in seen:
                with contextlib.suppress(OSError, AssertionError):
                    workers[w] = rchar(w)
            if not self.hashed_s and (sum(workers.values()) if seen else count) >= self.size:
                self.hashed_s = time.perf_counter() - self.start_t
            time.sleep(0.02)


def vacuum(work: Path) -> None:
    """Reclaim the replaced versions (SeaweedFS keeps each until a vacuum: 1 GiB a run), and
    stop before the disk, shared with others, runs short."""
    master = next(a.split("=", 1)[1] for _, cmd in children(os.getpid())
                  if "weed" in cmd.split(" ")[0]
                  for a in cmd.split() if a.startswith("-master.port="))
    with urllib.request.urlopen(f"http://127.0.0.1:{master}/vol/vacuum?garbageThreshold=0.001",
                                timeout=600) as r:
        r.read()
    if shutil.disk_usage(work).free < 8 << 30:
        raise SystemExit(f"less than 8 GiB free at {work}: stopped")


def evict(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


class Resync:
    def __init__(self, args: argparse.Namespace, work: Path, stack: ExitStack) -> None:
        self.args, self.work = args, work
        self.logs = work / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.src = work / "src"
        self.src.mkdir(exist_ok=True)
        self.model = self.src / "model.safetensors"
        write_safetensors(self.model, args.mib * MIB)
        self.size = self.model.stat().st_size
        self.ep = stack.enter_context(seaweedfs(work / "seaweed"))
        self.client = self.ep.client()
        self.bucket = "resync"
        self.client.create_bucket(Bucket=self.bucket)
        self.manifest = work / "manifest.sqlite"
        self.rng = random.Random(20261207)
        first = self.sync(1, "first", False)
        if not first.ok:
            raise SystemExit(f"the first sync failed: {first.note}")
        log(f"first sync: {first.wall_s:.1f} s, sent {first.sent / MIB:.0f} MiB")

    def sync(self, workers: int, name: str, dry: bool, cold: bool = False, n: int = 0) -> Run:
        with self.model.open("rb") as f:
            want = sha256_of(f)
        if cold:
            evict(self.model)
        argv = [sys.executable, "-m", "mcsync.cli.main", "sync", str(self.src) + "/",
                f"meta://{self.bucket}/ckpt/", "--quiet", "--json",
                "--manifest", str(self.manifest), *(["--dry-run"] if dry else [])]
        argv += ["--workers", str(workers)] if workers else []  # 0: no flag, the driver alone
        env = mcsync_env(self.ep.meta_env(), self.work / "state")
        load1, server = os.getloadavg()[0], server_cpu()
        reads = DriverReads(str(self.manifest), self.size)
        reads.start()
        r = run_measured(argv, env, stdout=self.logs / f"{name}.out",
                         stderr=self.logs / f"{name}.err", timeout=self.args.timeout)
        server = server_cpu() - server
        reads.done.set()
        reads.join()
        report = _report(self.logs / f"{name}.out") or {}
        why = _failed(r, report or None)
        if why is None and not dry:
            body = self.client.get_object(Bucket=self.bucket, Key=KEY)["Body"]
            why = None if sha256_of(body) == want else "the target differs from the file"
        limited = report.get("limited_by") or {}
        verdict = f"{limited.get('verdict', '?')} {limited.get('target_share', 0):.2f}"
        return Run(dry, workers, cold, n, r.wall_s, r.cpu_s, reads.own,
                   (r.tool_hwm_kib or 0) / 1024, int(report.get("bytes_sent", 0)),
                   int(report.get("bytes_reused", 0)), int(report.get("tasks", 0)),
                   load1, server, reads.hashed_s, verdict, why is None, why or "")

    def one(self, workers: int, cold: bool, n: int) -> list[Run]:
        """A change re-synced with ``workers``; with none, planned first (``--dry-run``: the
        hashing read alone; a dry run hashes in the driver whatever ``--workers`` says)."""
        change(self.model, 0.02, (self.rng.uniform(0.02, 0.47), self.rng.uniform(0.52, 0.97)))
        vacuum(self.work)
        runs = []
        for dry in (True, False) if workers == 0 else (False,):
            name = f"{'plan' if dry else 'resync'}-{workers}-{'cold' if cold else 'warm'}-{n}"
            runs.append(run := self.sync(workers, name, dry, cold, n))
            self.show(name, run)
        return runs

    def show(self, name: str, run: Run) -> None:
        log(f"  {name}: {run.wall_s:.2f} s, {self.size / MIB / run.wall_s:.0f} MiB/s, "
            f"hashed by {run.hashed_s:.2f} s, {run.cpu_s:.2f} CPU s, "
            f"driver read {run.driver_read / MIB:.0f} MiB, "
            f"RSS {run.driver_rss_mib:.0f} MiB, sent {run.sent / MIB:.0f} MiB, reused "
            f"{run.reused / MIB:.0f} MiB, {run.tasks} tasks, server {run.server_cpu_s:.2f} CPU s, "
            f"limited by {run.verdict}, load {run.load1:.1f}"
            f"{' FAIL ' + run.note if run.note else ''}")


def _mr(values: list[float], fmt: str) -> str:
    """Median (range)."""
    return (f"{statistics.median(values):{fmt}} "
            f"({min(values):{fmt}}–{max(values):{fmt}})")


def table(runs: list[Run], size: int) -> str:
    head = ("| run | workers | page cache | wall s | hashed by s | MiB/s | × 0 workers | "
            "client CPU s | driver read MiB | driver peak RSS MiB | sent MiB | reused MiB | tasks "
            "| server CPU s | limited by (target's share) | load (1 min) | runs |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    keys = sorted({(not r.dry, r.cold, r.workers) for r in runs})
    base: dict[tuple[bool, bool], float] = {}
    for resync, cold, workers in keys:
        mine = [r for r in runs if (not r.dry, r.cold, r.workers) == (resync, cold, workers)]
        ok = [r for r in mine if r.ok] or mine
        rate = statistics.median(size / MIB / r.wall_s for r in ok)
        if workers == 0:
            base[resync, cold] = rate
        x = f"{rate / base[resync, cold]:.2f}" if (resync, cold) in base else "-"
        failed = len(mine) - len([r for r in mine if r.ok])
        lines.append(
            f"| {'re-sync' if resync else 'plan'} | {workers} | {'dropped' if cold else 'warm'} "
            f"| {_mr([r.wall_s for r in ok], '.2f')} | {_mr([r.hashed_s for r in ok], '.2f')} "
            f"| {_mr([size / MIB / r.wall_s for r in ok], '.0f')} | {x} "
            f"| {_mr([r.cpu_s for r in ok], '.2f')} "
            f"| {_mr([r.driver_read / MIB for r in ok], '.0f')} "
            f"| {_mr([r.driver_rss_mib for r in ok], '.0f')} "
            f"| {statistics.median(r.sent / MIB for r in ok):.0f} "
            f"| {statistics.median(r.reused / MIB for r in ok):.0f} "
            f"| {statistics.median(r.tasks for r in ok):.0f} "
            f"| {_mr([r.server_cpu_s for r in ok], '.2f')} "
            f"| {'-' if not resync else ', '.join(sorted({r.verdict.split()[0] for r in ok}))} "
            f"{'' if not resync else _mr([float(r.verdict.split()[1]) for r in ok], '.2f')} "
            f"| {_mr([r.load1 for r in ok], '.1f')} "
            f"| {len(mine)}{f' ({failed} FAILED)' if failed else ''} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", default="0,1,2,4", help="worker counts (default 0,1,2,4)")
    parser.add_argument("--mib", type=int, default=1024, help="the file's size (default 1024)")
    parser.add_argument("--repeat", type=int, default=3, help="rounds (default 3)")
    parser.add_argument("--cold", action="store_true",
                        help="also run each count with the file's pages evicted first")
    parser.add_argument("--workdir", type=Path, default=None,
                        help="keep the file and logs here (default: a temporary directory)")
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument("--json", type=Path, default=None, help="write the runs as JSON")
    parser.add_argument("--render", type=Path, default=None, metavar="JSON",
                        help="print the table of an earlier --json, run nothing")
    args = parser.parse_args(argv)
    if args.render is not None:
        saved = json.loads(args.render.read_text())
        print(table([Run(**r) for r in saved["runs"]], saved["size"]))
        return 0
    counts = [int(n) for n in args.workers.split(",")]
    kinds = [False, True] if args.cold else [False]
    runs: list[Run] = []
    with ExitStack() as stack:
        work = args.workdir or Path(stack.enter_context(
            tempfile.TemporaryDirectory(prefix="mcsync-resync-")))
        bench = Resync(args, work, stack)
        log(f"file: {bench.size / MIB:.0f} MiB; load {os.getloadavg()}")
        for n in range(args.repeat):
            order = counts[n % len(counts):] + counts[:n % len(counts)]  # rotated each round
            for cold in kinds:
                for workers in order:
                    runs += bench.one(workers, cold, n)
        log(f"load at the end {os.getloadavg()}")
    print(table(runs, bench.size))
    if args.json:
        args.json.write_text(json.dumps({"runs": [asdict(r) for r in runs], "size": bench.size,
                                         "argv": sys.argv}, indent=2))
    return 1 if any(not r.ok for r in runs) else 0


if __name__ == "__main__":
    sys.exit(main())
