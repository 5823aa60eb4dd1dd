"""``--concurrency auto`` against fixed settings, on the migration path (issue 42, item 4).

Three sets, each copied s3 → meta between two SeaweedFS servers on 127.0.0.1 (the bytes pass
through the client): ``small`` (many small objects), ``large`` (multipart objects) and
``mixed`` (a checkpoint directory as a trainer writes it: safetensors shards, an optimizer
state, a tokenizer, small JSON and states). Each round runs every setting of ``--settings``
on every set, the order rotated round by round; each run writes into a fresh bucket, which is
checked (every key, every size, a sample of bodies byte for byte) and then dropped.

Each run (``bench_measure.run_measured``): wall, client CPU, peak RSS, and from the ``--json``
report what it settled on (``concurrency``) and what limited it (``limited_by``). Medians and
ranges per (set, setting), each setting's median wall over the best fixed setting's, and
auto's wall over each fixed setting's in the same round (the median over rounds).

    .venv/bin/python benchmarks/concurrency.py                     # ~8 min
    .venv/bin/python benchmarks/concurrency.py --repeat 5 --rtt-ms 20 --json conc.json

``--rtt-ms N``: the target is seen through the fault proxy holding every answer back N ms (a
distant region), where what is in flight matters most. Everything listens on 127.0.0.1.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.append(str(Path(__file__).resolve().parents[1]))  # testbed/: not installed

from bench_measure import run_measured
from scaling import _failed, _report, log, mcsync_env

from testbed.faultproxy import FaultProxy, Rule, Stall
from testbed.servers import S3Endpoint, seaweedfs

REPO = Path(__file__).resolve().parents[1]
MIB = 1 << 20
# Each set's arguments to scripts/make_sample_data.py, and the directory it makes.
SETS = {
    "small": (["--sets", "small", "--small", "10000", "--small-kib", "16"], "small"),
    "large": (["--sets", "shards", "--shards", "2", "--shard-mib", "512"], "data"),
    "mixed": (["--sets", "mixed", "--mixed-mib", "512", "--mixed-shards", "4"],
              "checkpoint-1000"),
}


@dataclass
class Run:
    set: str
    setting: str
    round: int
    wall_s: float
    cpu_s: float
    rss_mib: float
    settled: str  # the report's concurrency: what the run ended with
    verdict: str
    load1: float
    ok: bool
    note: str = ""


def make_data(work: Path, name: str) -> Path:
    args, sub = SETS[name]
    out = work / "data" / name
    subprocess.run([sys.executable, str(REPO / "scripts/make_sample_data.py"), str(out), *args],
                   check=True, stdout=subprocess.DEVNULL)
    return out / sub


def objects(client: object, bucket: str, prefix: str = "") -> dict[str, int]:
    found: dict[str, int] = {}
    pages = client.get_paginator("list_objects_v2").paginate(  # type: ignore[attr-defined]
        Bucket=bucket, Prefix=prefix)
    for page in pages:
        found.update({c["Key"][len(prefix):]: c["Size"] for c in page.get("Contents", ())
                      if not c["Key"][len(prefix):].startswith(".mcsync/")})  # runs' state
    return found


class Bench:
    def __init__(self, args: argparse.Namespace, work: Path, stack: ExitStack) -> None:
        self.args, self.work = args, work
        self.logs = work / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.a = stack.enter_context(seaweedfs(work / "a"))
        self.b = stack.enter_context(seaweedfs(work / "b"))
        self.target: S3Endpoint = self.b
        if args.rtt_ms:
            rtt = Rule(Stall(args.rtt_ms / 1000), name="rtt")
            self.target = stack.enter_context(FaultProxy(self.b, [rtt]).running()).endpoint
        self.src, self.dst = self.a.client(), self.b.client()
        self.src.create_bucket(Bucket="src")
        self.want: dict[str, dict[str, int]] = {}
        for name in args.sets:
            local = make_data(work, name)
            run = self.mcsync([str(local) + "/", f"s3://src/{name}/"], self.a.aws_env(),
                              f"load-{name}")
            if run[0] is not None:
                raise SystemExit(f"loading {name} into the source failed: {run[0]}")
            self.want[name] = objects(self.src, "src", f"{name}/")
            log(f"{name}: {len(self.want[name])} objects, "
                f"{sum(self.want[name].values()) / MIB:.0f} MiB")

    def mcsync(self, argv: list[str], env: dict[str, str], name: str,
               ) -> tuple[str | None, dict, object]:
        full = [sys.executable, "-m", "mcsync.cli.main", "sync", *argv, "--quiet", "--json",
                "--endpoint-url", self.a.url]
        r = run_measured(full, mcsync_env(env, self.work / "state" / name),
                         stdout=self.logs / f"{name}.out", stderr=self.logs / f"{name}.err",
                         timeout=self.args.timeout)
        report = _report(self.logs / f"{name}.out") or {}
        return _failed(r, report or None), report, r

    def run(self, name: str, setting: str, n: int) -> Run:
        bucket = f"dst-{name}-{setting}-{n}".lower()
        self.dst.create_bucket(Bucket=bucket)
        load1 = os.getloadavg()[0]
        env = self.a.aws_env() | self.target.meta_env()
        why, report, r = self.mcsync(
            [f"s3://src/{name}/", f"meta://{bucket}/", "--concurrency", setting], env,
            f"{name}-{setting}-{n}")
        if why is None:
            why = self.check(name, bucket)
        self.drop(bucket)
        limited = report.get("limited_by") or {}
        settled = report.get("concurrency") or {}
        return Run(name, setting, n, r.wall_s, r.cpu_s,  # type: ignore[attr-defined]
                   r.peak_rss_kib / 1024, json.dumps(settled, sort_keys=True),  # type: ignore[attr-defined]
                   str(limited.get("verdict", "?")), load1, why is None, why or "")

    def check(self, name: str, bucket: str) -> str | None:
        got, want = objects(self.dst, bucket), self.want[name]
        if got != want:
            missing = sorted(set(want) - set(got))[:3]
            return f"target differs: {len(got)} of {len(want)} objects; missing {missing}"
        for key in random.Random(bucket).sample(sorted(want), min(3, len(want))):
            a = self.src.get_object(Bucket="src", Key=f"{name}/{key}")["Body"].read()
            if a != self.dst.get_object(Bucket=bucket, Key=key)["Body"].read():
                return f"{key}: bytes differ"
        return None

    def drop(self, bucket: str) -> None:
        with contextlib.suppress(Exception):  # SeaweedFS drops a bucket's collection whole
            self.dst.delete_bucket(Bucket=bucket)


def rotated(items: list[str], n: int) -> Iterator[str]:
    k = n % len(items)
    yield from items[k:] + items[:k]


def paired(runs: list[Run], setting: str) -> float:
    """auto's wall over ``setting``'s in the same round, the median over rounds: the load of
    a shared machine drifts between rounds more than within one."""
    ratios = [a.wall_s / b.wall_s for a in runs if a.setting == "auto"
              for b in runs if b.setting == setting and b.round == a.round]
    return statistics.median(ratios) if ratios else float("nan")


def table(runs: list[Run]) -> str:
    lines = ["| set | --concurrency | wall s, median (range) | ÷ best fixed | auto ÷ this, "
             "paired | CPU s | RSS MiB | settled on | limited by | ok |",
             "|---|---|---:|---:|---:|---:|---:|---|---|---|"]
    for name in dict.fromkeys(r.set for r in runs):
        mine = [r for r in runs if r.set == name]
        walls = {s: statistics.median(r.wall_s for r in mine if r.setting == s)
                 for s in dict.fromkeys(r.setting for r in mine)}
        fixed = [w for s, w in walls.items() if s != "auto"]
        best = min(fixed) if fixed else float("nan")
        for s, wall in walls.items():
            rs = [r for r in mine if r.setting == s]
            lo, hi = min(r.wall_s for r in rs), max(r.wall_s for r in rs)
            settled = rs[-1].settled if s == "auto" else ""
            verdicts = "/".join(sorted({r.verdict for r in rs}))
            pair = "" if s == "auto" else f"{paired(mine, s):.2f}"
            lines.append(f"| {name} | {s} | {wall:.2f} ({lo:.2f}-{hi:.2f}) | {wall / best:.2f} "
                         f"| {pair} | {statistics.median(r.cpu_s for r in rs):.2f} "
                         f"| {statistics.median(r.rss_mib for r in rs):.0f} | {settled} "
                         f"| {verdicts} | {sum(r.ok for r in rs)}/{len(rs)} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sets", default="small,large,mixed",
                        type=lambda s: [x for x in s.split(",") if x])
    parser.add_argument("--settings", default="4,16,64,128,auto",
                        type=lambda s: [x for x in s.split(",") if x])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--rtt-ms", type=float, default=0.0)
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument("--workdir", type=Path)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    for name in args.sets:
        if name not in SETS:
            parser.error(f"unknown set {name!r}: of {', '.join(SETS)}")
    runs: list[Run] = []
    with ExitStack() as stack:
        work = args.workdir or Path(stack.enter_context(tempfile.TemporaryDirectory(
            prefix="mcsync-concurrency-")))
        bench = Bench(args, work, stack)
        for n in range(args.repeat):
            for name in args.sets:
                for setting in rotated(args.settings, n):
                    t = time.monotonic()
                    run = bench.run(name, setting, n)
                    runs.append(run)
                    log(f"round {n} {name} --concurrency {setting}: {run.wall_s:.2f} s "
                        f"cpu {run.cpu_s:.2f} {run.settled} {run.verdict} load {run.load1:.1f}"
                        f"{'' if run.ok else ' FAILED: ' + run.note} "
                        f"({time.monotonic() - t:.0f} s with the check)")
    print(table(runs))
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in runs], indent=1))
    return 0 if all(r.ok for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
