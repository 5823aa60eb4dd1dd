"""The relay paths of issue 42: every byte through the client, by object size and by source.

``cross``: s3 (SeaweedFS A) → meta (SeaweedFS B), mcsync against rclone, one set per object
size of ``--sizes`` (8 KiB to 512 MiB) at each total of ``--totals`` (GiB). The sets are nested:
``<size>/q0/`` holds the first 0.5 GiB, ``<size>/`` the 2 GiB, so a size is seeded once.
``gs``: fake-gcs-server (https, a CA of this run) → B, mcsync against rclone (gcs backend, the
endpoint overridden, ``--ca-cert``) and ``gcloud storage rsync``. ``az``: Azurite → B, mcsync
against rclone (azureblob backend, the emulator's endpoint). gs and az copy ``--relay-set``.

Every round runs each (set, tool) once, the tools' order alternated round by round. Each run:
wall, client CPU (user + sys of the tool's process tree, ``bench_measure.run_measured``), peak
RSS, and mcsync's ``limited_by`` verdict; every target is checked (keys and sizes) and deleted.
The cross sets' CPU is then split, from each round's smallest and largest total, into what a
further GiB costs and a fixed part (``marginal``).

    .venv/bin/python benchmarks/relay.py --paths cross --rounds 3 --json cross.json
    .venv/bin/python benchmarks/relay.py --paths gs,az --rounds 3

``--baseline DIR`` adds the mcsync of another checkout (``DIR/.venv``) to every round as
``mcsync-base``: a change measured against the code before it in the same rounds. ``--floor``
adds ``relay_floor.py`` to the cross rounds as ``floor``: mcsync's libraries and hashes
without its engine (sets of 4 MiB and more).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.append(str(Path(__file__).resolve().parents[1]))  # testbed/: not installed

from bench_measure import run_measured
from bench_tools import AzLoc, Context, GcsLoc, McsyncTool, RcloneTool, S3Loc, base_env
from bench_tools_cloud import GcloudStorageTool

from testbed.servers import seaweedfs

KIB, MIB, GIB = 1 << 10, 1 << 20, 1 << 30
SIZES = {"8k": 8 * KIB, "4m": 4 * MIB, "24m": 24 * MIB, "64m": 64 * MIB, "160m": 160 * MIB,
         "512m": 512 * MIB}
QUARTER = GIB // 2  # one nested quarter of a 2 GiB set
BASELINE = "mcsync-base"
FLOOR = "floor"


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


@dataclass
class Run:
    path: str
    set: str
    tool: str
    round: int
    objects: int
    bytes: int
    wall_s: float
    cpu_s: float
    user_s: float
    sys_s: float
    rss_mib: float
    load1: float
    limited_by: str
    ok: bool
    note: str = ""


def counts(size: int, total_gib: float) -> tuple[int, int]:
    """Objects per quarter (0.5 GiB) and quarters for a set of ``total_gib``."""
    return max(1, round(QUARTER / size)), max(1, round(total_gib * GIB / QUARTER))


def seed_cross(a, sizes: list[str], totals: list[float], tmp: Path) -> None:
    """Random objects under ``bench-src/<size>/q<n>/`` on A, by ``s5cmd`` or mcsync."""
    quarters = max(counts(SIZES[s], t)[1] for s in sizes for t in totals)
    client = a.client()
    with contextlib.suppress(Exception):
        client.create_bucket(Bucket="bench-src")
    for name in sizes:
        size = SIZES[name]
        per, _ = counts(size, 0.5)
        have = {o["Key"] for page in client.get_paginator("list_objects_v2").paginate(
            Bucket="bench-src", Prefix=f"{name}/") for o in page.get("Contents", [])}
        missing = [q for q in range(quarters)
                   if not all(f"{name}/q{q}/obj-{i:06d}.bin" in have for i in range(per))]
        if not missing:
            continue
        local = tmp / name
        for q in missing:  # a 0.5 GiB run's q0 stays: 2 GiB adds q1-q3
            d = local / f"q{q}"
            d.mkdir(parents=True, exist_ok=True)
            for i in range(per):
                (d / f"obj-{i:06d}.bin").write_bytes(os.urandom(size))
        log(f"seeding s3://bench-src/{name}/: {per * len(missing):,} x {size:,} B (not timed)")
        inv = McsyncTool().invocation(_local(local), S3Loc("A", "bench-src", f"{name}/"),
                                      Context({"A": a}, tmp))
        env = base_env() | inv.env | a.meta_env()
        argv = [*inv.argv[:3], f"meta://bench-src/{name}/", "--quiet"]
        rc = subprocess.run(argv, env=env).returncode
        shutil.rmtree(local)
        if rc:
            raise SystemExit(f"seeding {name} failed: exit {rc}")


def _local(path: Path):
    from bench_tools import LocalLoc

    return LocalLoc(path)


def verdict(stdout: Path) -> str:
    try:
        lb = json.loads(stdout.read_text()).get("limited_by") or {}
    except (OSError, ValueError):
        return ""
    if not lb:
        return ""
    return (f"{lb['verdict']} (source {lb['source_share']:.0%}, target {lb['target_share']:.0%}"
            f", loop {lb['loop_busy']:.0%}, {lb['cores_busy']:.2f} cores)")


class Bench:
    def __init__(self, args: argparse.Namespace, work: Path, servers: dict) -> None:
        self.args, self.work, self.servers = args, work, servers
        self.runs: list[Run] = []

    def measure(self, path: str, name: str, tool: str, rnd: int, argv: list[str],
                env: dict[str, str], expect: dict[str, int], ctx: Context) -> Run:
        out, err = ctx.confdir / "stdout.log", ctx.confdir / "stderr.log"
        res = run_measured(argv, base_env() | env, stdout=out, stderr=err,
                           timeout=self.args.timeout)
        got = self.target(ctx.confdir.name)
        ok = res.returncode == 0 and got == expect
        note = "" if ok else (f"exit {res.returncode}; target {len(got)} of {len(expect)}"
                              f" objects; {err.read_text(errors='replace')[-300:]}")
        run = Run(path, name, tool, rnd, len(expect), sum(expect.values()), res.wall_s,
                  res.cpu_s, res.user_s, res.sys_s, res.peak_rss_kib / 1024,
                  os.getloadavg()[0], verdict(out) if tool.startswith("mcsync") else "", ok, note)
        self.drop(ctx.confdir.name)
        gib = run.bytes / GIB
        log(f"{path:5} {name:9} {tool:7} r{rnd}  {run.wall_s:7.2f} s  cpu {run.cpu_s:6.2f} s"
            f" ({run.cpu_s / gib:5.2f}/GiB)  rss {run.rss_mib:5.0f} MiB  load {run.load1:4.1f}"
            f"  {'ok' if ok else 'FAIL ' + note}  {run.limited_by}")
        self.runs.append(run)
        return run

    def target(self, bucket: str) -> dict[str, int]:
        client = self.servers["B"].client()
        return {o["Key"]: o["Size"] for page in client.get_paginator("list_objects_v2")
                .paginate(Bucket=bucket) for o in page.get("Contents", [])
                if not o["Key"].startswith(".mcsync/")}

    def drop(self, bucket: str) -> None:
        client = self.servers["B"].client()
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket):
            keys = [{"Key": o["Key"]} for o in page.get("Contents", [])]
            for i in range(0, len(keys), 1000):
                client.delete_objects(Bucket=bucket, Delete={"Objects": keys[i:i + 1000]})
        client.delete_bucket(Bucket=bucket)

    def ctx(self, label: str) -> tuple[Context, S3Loc]:
        bucket = f"t-{label}-{uuid.uuid4().hex[:6]}"[:63]
        self.servers["B"].client().create_bucket(Bucket=bucket)
        confdir = self.work / "runs" / bucket
        shutil.rmtree(confdir, ignore_errors=True)
        confdir.mkdir(parents=True)
        return Context(self.servers, confdir), S3Loc("B", bucket)

    def cross(self, name: str, total: float, rnd: int, tools: list[str]) -> None:
        size = SIZES[name]
        per, quarters = counts(size, total)
        prefix = f"{name}/q0/" if quarters == 1 else f"{name}/"
        set_name = f"{name}@{total:g}G"
        expect = {f"q{q}/obj-{i:06d}.bin" if quarters > 1 else f"obj-{i:06d}.bin": size
                  for q in range(quarters) for i in range(per)}
        for tool in tools:
            ctx, dst = self.ctx(f"x-{name}-{str(total).replace('.', '')}-{tool}-{rnd}")
            src = S3Loc("A", "bench-src", prefix)
            inv = self.tool(tool).invocation(src, dst, ctx)
            argv = inv.argv
            if tool == FLOOR:  # the same endpoints and keys, from the same variables
                argv = [sys.executable, str(Path(__file__).with_name("relay_floor.py")),
                        *inv.argv[2:4]]
            self.measure("cross", set_name, tool, rnd, argv, inv.env, expect, ctx)

    def tool(self, name: str) -> McsyncTool | RcloneTool:
        """``mcsync``, ``rclone``, or ``mcsync-base``: the mcsync of ``--baseline``'s
        checkout, beside this one in the same rounds."""
        if name == "rclone":
            return RcloneTool()
        tool = McsyncTool()
        if name == BASELINE:
            tool.exe = str(self.args.baseline / ".venv" / "bin" / "mcsync")
        return tool

    def relay(self, path: str, rnd: int, tools: list[str], expect: dict[str, int]) -> None:
        for tool in tools:
            ctx, dst = self.ctx(f"{path}-{tool}-{rnd}")
            if path == "gs":
                gcs = self.servers["gcs"]
                src: GcsLoc | AzLoc = GcsLoc(gcs.url, "bench-src", "relay/", str(gcs.ca))
            else:
                src = AzLoc(self.servers["az"].url, "bench-src", "relay/")
            inv = (GcloudStorageTool() if tool == "gcloud" else self.tool(tool)).invocation(
                src, dst, ctx)
            self.measure(path, self.args.relay_set, tool, rnd, inv.argv, inv.env, expect, ctx)


def seed_relay(servers: dict, paths: list[str], spec: str) -> dict[str, int]:
    """``N x SIZE`` (e.g. 24x24m) random objects under bench-src/relay/ on GCS and Azurite."""
    n, _, size_name = spec.partition("x")
    size = SIZES.get(size_name) or int(size_name.rstrip("m")) * MIB
    objs = {f"obj-{i:04d}.bin": os.urandom(size) for i in range(int(n))}
    if "gs" in paths:
        from testbed.gcs import create_bucket, upload

        with contextlib.suppress(Exception):  # a reused --workdir's
            create_bucket(servers["gcs"], "bench-src")
        for k, v in objs.items():
            upload(servers["gcs"], "bench-src", f"relay/{k}", v)
    if "az" in paths:
        with contextlib.suppress(Exception):
            servers["az"].create_container("bench-src")
        for k, v in objs.items():
            servers["az"].upload("bench-src", f"relay/{k}", v)
    return {k: len(v) for k, v in objs.items()}


def table(runs: list[Run]) -> str:
    rows = ["| path | set | tool | wall s | CPU-s/GiB | peak RSS MiB | CPU ÷ rclone | wall ÷ "
            "rclone | limited by (mcsync, per round) |", "|---|---|---|---|---|---|---|---|---|"]
    groups: dict[tuple[str, str], dict[str, list[Run]]] = {}
    for r in runs:
        if r.ok:
            groups.setdefault((r.path, r.set), {}).setdefault(r.tool, []).append(r)

    def med(xs: list[float]) -> str:
        return f"{statistics.median(xs):.2f} ({min(xs):.2f}-{max(xs):.2f})"

    for (path, name), tools in groups.items():
        base = tools.get("rclone")
        for tool, rs in tools.items():
            cpu = [r.cpu_s / (r.bytes / GIB) for r in rs]
            ratio = wall = ""
            if base and tool != "rclone":
                ratio = f"{statistics.median(cpu) / statistics.median([b.cpu_s / (b.bytes / GIB) for b in base]):.2f}"  # noqa: E501
                wall = f"{statistics.median([r.wall_s for r in rs]) / statistics.median([b.wall_s for b in base]):.2f}"  # noqa: E501
            why = "; ".join(r.limited_by.split(" (")[0] for r in rs if r.limited_by)
            rows.append(f"| {path} | {name} | {tool} | {med([r.wall_s for r in rs])} | "
                        f"{med(cpu)} | {med([r.rss_mib for r in rs])} | {ratio} | {wall} | "
                        f"{why} |")
    return "\n".join(rows)


def marginal(runs: list[Run]) -> str:
    """The cross sets' CPU split in two, per tool and object size, from the same round's runs
    at the smallest and the largest total: what each further GiB costs (the slope: what a
    petabyte costs) and what is left at zero bytes (the fixed part: start-up, listing, the
    end of the run). Medians (ranges) over rounds."""
    by: dict[tuple[str, str], dict[int, list[Run]]] = {}
    for r in runs:
        if r.ok and r.path == "cross":
            by.setdefault((r.set.split("@")[0], r.tool), {}).setdefault(r.round, []).append(r)
    slopes: dict[tuple[str, str], list[float]] = {}
    fixed: dict[tuple[str, str], list[float]] = {}
    for key, rounds in by.items():
        for rs in rounds.values():
            low, high = min(rs, key=lambda r: r.bytes), max(rs, key=lambda r: r.bytes)
            if high.bytes <= low.bytes:
                continue
            slope = (high.cpu_s - low.cpu_s) / ((high.bytes - low.bytes) / GIB)
            slopes.setdefault(key, []).append(slope)
            fixed.setdefault(key, []).append(low.cpu_s - slope * low.bytes / GIB)
    if not slopes:
        return ""
    rows = ["| set | tool | CPU-s per further GiB | ÷ rclone | fixed CPU-s |",
            "|---|---|---|---|---|"]
    for (size, tool), xs in slopes.items():
        base = slopes.get((size, "rclone"))
        ratio = (f"{statistics.median(xs) / statistics.median(base):.2f}"
                 if base and tool != "rclone" else "")
        f = fixed[(size, tool)]
        rows.append(f"| {size} | {tool} | {statistics.median(xs):.2f} ({min(xs):.2f}-"
                    f"{max(xs):.2f}) | {ratio} | {statistics.median(f):.2f} ({min(f):.2f}-"
                    f"{max(f):.2f}) |")
    return "\n".join(rows)


def main() -> int:
    p = argparse.ArgumentParser(prog="benchmarks/relay.py", description=__doc__.split("\n")[0])
    p.add_argument("--paths", default="cross", help="cross,gs,az")
    p.add_argument("--sizes", default=",".join(SIZES), help=f"of {','.join(SIZES)}")
    p.add_argument("--totals", default="0.5,2", help="GiB per set (0.5 or 2)")
    p.add_argument("--only-half", default="8k", help="sizes run at 0.5 GiB only")
    p.add_argument("--relay-set", default="24x24m", help="gs/az: N x SIZE")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--timeout", type=float, default=1800)
    p.add_argument("--workdir", type=Path)
    p.add_argument("--json", type=Path)
    p.add_argument("--baseline", type=Path,
                   help="also run the mcsync of this checkout (its .venv) as mcsync-base")
    p.add_argument("--floor", action="store_true",
                   help="also run relay_floor.py (mcsync's libraries, no engine) as floor")
    args = p.parse_args()
    paths = args.paths.split(",")
    sizes = [s for s in args.sizes.split(",") if s]
    totals = [float(t) for t in args.totals.split(",")]
    half_only = set(args.only_half.split(",")) if args.only_half else set()
    work = args.workdir or Path(tempfile.mkdtemp(prefix="mcsync-relay-"))
    work.mkdir(parents=True, exist_ok=True)
    log(f"work dir {work}; load {os.getloadavg()}")
    McsyncTool().compile_bytecode()
    if args.baseline:
        base = McsyncTool()
        base.exe = str(args.baseline / ".venv" / "bin" / "mcsync")
        base.compile_bytecode()
    bench: Bench | None = None
    try:
        with contextlib.ExitStack() as stack:
            servers: dict = {}
            for name in ("A", "B") if "cross" in paths else ("B",):
                servers[name] = stack.enter_context(seaweedfs(work / f"seaweed-{name}"))
            if "gs" in paths:
                from testbed.gcs import fake_gcs_server

                servers["gcs"] = stack.enter_context(fake_gcs_server(work / "fake-gcs"))
            if "az" in paths:
                from testbed.azurite import azurite

                servers["az"] = stack.enter_context(azurite(work / "azurite"))
            bench = Bench(args, work, servers)
            if "cross" in paths:
                seed_cross(servers["A"], sizes, totals, work / "data")
            expect = seed_relay(servers, paths, args.relay_set) if {"gs", "az"} & set(
                paths) else {}
            for rnd in range(args.rounds):
                for path in paths:
                    if path == "cross":
                        tools = ["mcsync", "rclone"] + ([BASELINE] if args.baseline else [])
                        tools += [FLOOR] if args.floor else []
                        shift = rnd % len(tools)
                        tools = tools[shift:] + tools[:shift]
                        for name in sizes:
                            for total in totals:
                                if total > 0.5 and name in half_only:
                                    continue
                                bench.cross(name, total, rnd, tools)
                    else:
                        tools = ["mcsync", "rclone"] + (["gcloud"] if path == "gs" else []) + (
                            [BASELINE] if args.baseline else [])
                        shift = rnd % len(tools)
                        bench.relay(path, rnd, tools[shift:] + tools[:shift], expect)
            log(f"done; load {os.getloadavg()}")
    finally:
        if bench is not None:
            print(table(bench.runs))
            split = marginal(bench.runs)
            if split:
                print("\n" + split)
            if args.json:
                args.json.write_text(json.dumps([asdict(r) for r in bench.runs], indent=1))
        if args.workdir is None:
            shutil.rmtree(work, ignore_errors=True)
    return 0 if bench is not None and all(r.ok for r in bench.runs) else 1


if __name__ == "__main__":
    raise SystemExit(main())
