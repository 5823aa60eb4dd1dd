"""Scale: list and plan a million keys, and compare with rclone.

For each size (default 100k, 300k and 1M keys) it times, as child processes measured like the
other benchmarks (``bench_measure.run_measured``: wall, the tool's CPU, the peak RSS of its
process tree):

* ``plan-s3``:    ``mcsync plan meta://synthetic/ EMPTY`` against a synthetic bucket
  (``testbed.synthetic``, a child process of its own, not counted);
  ``rclone copy --dry-run SYN:synthetic EMPTY`` against the same server;
* ``plan-local``: ``mcsync plan TREE EMPTY`` and ``rclone copy --dry-run TREE EMPTY`` of a local
  tree of the same keys (empty files, made once under ``--workdir`` and kept);
* ``sync-s3`` (``--sync``): ``mcsync sync meta://synthetic/ DIR`` of objects of 0-64 bytes into
  an empty directory, and rclone's ``copy`` of the same.

Every run is repeated (``--repeat``, default 3) and the medians are printed as a table::

    .venv/bin/python benchmarks/scale.py                       # 100k, 300k, 1M; ~15 min
    .venv/bin/python benchmarks/scale.py --keys 100000 --repeat 1 --only plan-local
    .venv/bin/python benchmarks/scale.py --keys 100000,300000 --sync --json scale.json

Everything listens on 127.0.0.1. rclone is skipped with a note when it is not installed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.append(str(Path(__file__).resolve().parents[1]))  # testbed/: not installed

from bench_measure import ProcResult, run_measured

from testbed.synthetic import SyntheticBucket, synthetic_server

CASES = ("plan-s3", "plan-local", "sync-s3")
SYNC_MAX_SIZE = 64  # bytes: a sync of a million keys is about files, not bytes


@dataclass
class Row:
    keys: int
    case: str
    tool: str
    wall_s: float
    cpu_s: float
    peak_rss_mib: float
    runs: int
    failed: int


def mcsync_exe() -> str:
    beside = Path(sys.executable).parent / "mcsync"
    return str(beside) if beside.exists() else shutil.which("mcsync") or "mcsync"


def make_tree(root: Path, bucket: SyntheticBucket) -> Path:
    """A directory of ``bucket.keys`` empty files named as the synthetic bucket's keys; made
    once (a stamp file says it is complete)."""
    stamp = root.with_name(root.name + ".done")
    if stamp.exists():
        return root
    shutil.rmtree(root, ignore_errors=True)
    last_dir = None
    for i in range(bucket.keys):
        directory, _, name = bucket.key(i).rpartition("/")
        if directory != last_dir:
            os.makedirs(root / directory, exist_ok=True)
            last_dir = directory
        os.close(os.open(root / directory / name, os.O_CREAT | os.O_WRONLY, 0o644))
    stamp.touch()
    return root


def env_for(extra: dict[str, str], state: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("AWS_", "MCSYNC_", "RCLONE_"))}
    env.update(extra)
    env["XDG_STATE_HOME"] = str(state)  # never the user's manifests
    env["RCLONE_CONFIG"] = "/dev/null"
    return env


def fresh(path: Path) -> Path:
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    return path


def rclone_argv(src: str, dst: str, dry_run: bool) -> list[str]:
    argv = ["rclone", "copy", src, dst, "-q", "--transfers", "32", "--checkers", "32"]
    return [*argv, "--dry-run"] if dry_run else argv


def measure(argv: list[str], env: dict[str, str], logs: Path, name: str,
            repeat: int, before: Callable[[], object] | None = None) -> list[ProcResult]:
    results = []
    for n in range(repeat):
        if before is not None:
            before()
        r = run_measured(argv, env, stdout=logs / f"{name}-{n}.out",
                         stderr=logs / f"{name}-{n}.err", timeout=1800)
        results.append(r)
        print(f"  {name} #{n + 1}: {r.wall_s:.2f} s wall, {r.cpu_s:.2f} s CPU, "
              f"{r.peak_rss_kib / 1024:.1f} MiB, exit {r.returncode}", file=sys.stderr)
    return results


def row(keys: int, case: str, tool: str, results: list[ProcResult]) -> Row:
    ok = [r for r in results if r.returncode == 0] or results
    return Row(keys, case, tool, statistics.median(r.wall_s for r in ok),
               statistics.median(r.cpu_s for r in ok),
               statistics.median(r.peak_rss_kib for r in ok) / 1024, len(results),
               sum(r.returncode != 0 for r in results))


def runs_for(keys: int, cases: list[str], work: Path, repeat: int,
             tools: list[str]) -> Iterator[Row]:
    logs = work / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    state = work / "state"
    empty = work / "empty"
    with ExitStack() as stack:
        if "plan-s3" in cases:
            ep = stack.enter_context(synthetic_server(keys, log_path=logs / f"syn-{keys}.log"))
            env = env_for({**ep.meta_env(), **ep.rclone_env()}, state)
            if "mcsync" in tools:
                yield row(keys, "plan-s3", "mcsync", measure(
                    [mcsync_exe(), "plan", "meta://synthetic/", str(empty)], env, logs,
                    f"plan-s3-mcsync-{keys}", repeat, lambda: fresh(empty)))
            if "rclone" in tools:
                yield row(keys, "plan-s3", "rclone", measure(
                    rclone_argv("SYN:synthetic", str(empty), True), env, logs,
                    f"plan-s3-rclone-{keys}", repeat, lambda: fresh(empty)))
        if "plan-local" in cases:
            print(f"  making a tree of {keys} files (kept in {work})", file=sys.stderr)
            tree = make_tree(work / f"tree-{keys}", SyntheticBucket(keys))
            env = env_for({}, state)
            if "mcsync" in tools:
                yield row(keys, "plan-local", "mcsync", measure(
                    [mcsync_exe(), "plan", str(tree), str(empty)], env, logs,
                    f"plan-local-mcsync-{keys}", repeat, lambda: fresh(empty)))
            if "rclone" in tools:
                yield row(keys, "plan-local", "rclone", measure(
                    rclone_argv(str(tree), str(empty), True), env, logs,
                    f"plan-local-rclone-{keys}", repeat, lambda: fresh(empty)))
        if "sync-s3" in cases:
            ep = stack.enter_context(synthetic_server(keys, max_size=SYNC_MAX_SIZE,
                                                      log_path=logs / f"syn-small-{keys}.log"))
            env = env_for({**ep.meta_env(), **ep.rclone_env()}, state)
            target = work / "target"

            def again() -> None:
                fresh(target)
                shutil.rmtree(state, ignore_errors=True)  # no manifest: a first sync each time

            if "mcsync" in tools:
                yield row(keys, "sync-s3", "mcsync", measure(
                    [mcsync_exe(), "sync", "meta://synthetic/", str(target), "--quiet"], env,
                    logs, f"sync-s3-mcsync-{keys}", repeat, again))
            if "rclone" in tools:
                yield row(keys, "sync-s3", "rclone", measure(
                    rclone_argv("SYN:synthetic", str(target), False), env, logs,
                    f"sync-s3-rclone-{keys}", repeat, again))
            shutil.rmtree(target, ignore_errors=True)


def table(rows: list[Row]) -> str:
    lines = [f"{'keys':>9}  {'case':<10} {'tool':<7} {'wall s':>8} {'CPU s':>8} "
             f"{'peak RSS':>10}  runs"]
    for r in rows:
        note = f"  ({r.failed} failed)" if r.failed else ""
        lines.append(f"{r.keys:>9,}  {r.case:<10} {r.tool:<7} {r.wall_s:>8.2f} {r.cpu_s:>8.2f} "
                     f"{r.peak_rss_mib:>6.1f} MiB  {r.runs}{note}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keys", default="100000,300000,1000000",
                        help="comma-separated sizes (default 100000,300000,1000000)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--only", default="plan-s3,plan-local", help=f"of {','.join(CASES)}")
    parser.add_argument("--sync", action="store_true", help="add sync-s3")
    parser.add_argument("--tools", default="mcsync,rclone")
    parser.add_argument("--workdir", type=Path, default=None,
                        help="keep the local trees here (default: a temporary directory)")
    parser.add_argument("--json", type=Path, default=None, help="write the rows as JSON")
    args = parser.parse_args(argv)
    sizes = [int(k) for k in args.keys.split(",")]
    cases = [c for c in args.only.split(",") if c] + (["sync-s3"] if args.sync else [])
    unknown = set(cases) - set(CASES)
    if unknown:
        parser.error(f"unknown case(s): {', '.join(sorted(unknown))}")
    tools = args.tools.split(",")
    if "rclone" in tools and shutil.which("rclone") is None:
        print("note: rclone not found on PATH; its rows are skipped", file=sys.stderr)
        tools.remove("rclone")
    rows: list[Row] = []
    with ExitStack() as stack:
        work = args.workdir or Path(stack.enter_context(
            tempfile.TemporaryDirectory(prefix="mcsync-scale-")))
        for keys in sizes:
            print(f"{keys} keys:", file=sys.stderr)
            rows.extend(runs_for(keys, cases, work, args.repeat, tools))
    print(table(rows))
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in rows], indent=2))
    return 1 if any(r.failed for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
