"""Compare mcsync with s5cmd, rclone and the aws CLI on the same data, on loopback SeaweedFS.

    python benchmarks/run.py [--quick] [--repeat N] [--only PATH,...] [--tools T,...]
                             [--data D,...] [--link-mbit N] [--workdir DIR] [--json OUT]
                             [--verbose]

Paths: upload (local → meta A), download (s3 A → local), server-copy (s3 A → meta A, same
endpoint), cross (s3 A → meta B, a second server: bytes flow through the client);
re-syncs, each after an untimed first sync of the same pair: resync-noop (local → meta A,
nothing changed; every set but checkpoint), delta-s3 / delta-local (the checkpoint changed by
bench_mutate: local → meta A / local → local), delta-newstep (local ckpt/ → meta A ckpt/: the
first sync writes step-1/ of the mixed set, the timed one adds step-2/, ~3% of its tensor bytes
new, which mcsync composes from step-1's objects); gs-to-meta (fake-gcs-server over https → B:
mcsync to meta://, rclone, gsutil and gcloud storage to s3://) and az-to-meta (Azurite → B:
mcsync and rclone), each beside mcsync's s3 A → meta B.
Data sets: checkpoint (one safetensors file), shards (64 x 32 MiB), small (10,000 x 16 KiB),
midsize (32 x 64 MiB), mixed (a training checkpoint directory of ~2 GiB: safetensors shards,
index, configs, tokenizer, trainer and optimizer states); --quick shrinks them to 256 MiB,
8 x 32 MiB, 1,000 x 16 KiB, 16 x 16 MiB and ~256 MiB.
--link-mbit N puts SeaweedFS B in a network namespace behind a veth pair capped at N Mbit/s
each way (root only) and moves the upload, resync-noop, delta-s3 and delta-newstep targets to B
(bench_netns). Servers, seeding and targets are in bench_setup, the options in bench_args.

Each timed run writes into a fresh empty target (new bucket or directory) that is checked
(object count and sizes; for the re-sync and gs paths also every object's bytes) and deleted
afterwards. Tables go to stdout, progress to stderr. See benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import platform
import re
import shutil
import signal
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.append(str(Path(__file__).resolve().parents[1]))  # testbed/: not installed

import bench_netns
from bench_args import (
    CLOUD_PATHS,
    DELTA_SETS,
    FRESH_PATHS,
    LINK_PATHS,
    MIB,
    NEWSTEP,
    NEWSTEP_FRACTION,
    NEWSTEP_SETS,
    NOOP_SETS,
    RESYNC_PATHS,
    RTT_PATHS,
    S3_REF,
    S3_SOURCE_PATHS,
    SOURCE_BUCKET,
    TARGET_PREFIX,
    log,
    parse_args,
)
from bench_data import FULL, QUICK, Dataset, prepare
from bench_measure import ServerCpu, free_bytes, run_measured, tail
from bench_mutate import MUTATIONS, Mutation, mutate, new_step
from bench_report import render, summarize
from bench_setup import Setup
from bench_tools import (
    TOOLS,
    AzLoc,
    Context,
    GcsLoc,
    LocalLoc,
    McsyncTool,
    S3Loc,
    Tool,
    base_env,
    describe,
)


def report_failure(report: dict | None) -> str | None:
    """'N objects failed: <first error>' from an mcsync JSON report, if it lists failures."""
    if not report or not report.get("failures"):
        return None
    first = report["failures"][0]
    error = first.get("error", first) if isinstance(first, dict) else first
    error = str(error).splitlines()[0] if str(error).strip() else "?"
    if len(error) > 300:
        error = error[:300] + "…"
    return f"{report.get('objects_failed', '?')} objects failed, first: {error}"


def link_tree(files: dict[str, Path], root: Path) -> None:
    """Hard-link each file to root/<relative path> (no bytes copied)."""
    for rel, path in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        os.link(path, root / rel)


def slug(text: str) -> str:
    """Lower-case letters, digits and dashes: usable in a bucket name and a directory name."""
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


class Bench(Setup):
    def __init__(self, args: argparse.Namespace, workdir: Path) -> None:
        self.args = args
        self.workdir = workdir
        self.gcs: Any = None  # testbed.gcs.GCSServer, once started (gs-to-meta)
        self.azurite: Any = None  # testbed.azurite.AzuriteEndpoint (az-to-meta)
        self.mutations: dict[str, tuple[Path, Mutation]] = {}  # name -> (mutated file, what)
        self.servers: dict[str, object] = {}
        self.link: bench_netns.Link | None = None  # B's capped link (--link-mbit), if it is up
        self.link_note: str | None = None  # why --link-mbit was not applied
        self.link_probe: dict | None = None  # one PUT/GET through the link, timed
        self.clients: dict[str, object] = {}
        self.runs: list[dict] = []
        self.trash_bytes = 0  # in local targets set aside, not yet deleted
        self.server_cpu = ServerCpu()
        self.nonce = uuid.uuid4().hex[:6]
        self.tools: list[Tool] = []
        self.skipped: dict[str, str] = {}
        self.versions: dict[str, str] = {}
        for name in args.tools:
            tool = TOOLS[name]()
            why = tool.missing()
            if why:
                self.skipped[name] = why
                log(f"skipping {name}: {why}")
            else:
                self.tools.append(tool)
                self.versions[name] = tool.version()
                log(f"{name}: {tool.exe} ({self.versions[name]})")
                if isinstance(tool, McsyncTool):
                    log(f"mcsync: compiled to bytecode, as an install does: "
                        f"{tool.compile_bytecode()}")

    # -- changed data (servers, source data and targets: bench_setup.Setup) --------------------

    def prepare_mutations(self, ds: Dataset) -> None:
        """Write each mutated checkpoint once (not timed) under data/mutated/<mutation>/."""
        (rel,) = ds.files  # the checkpoint set is the one safetensors file
        for kind in MUTATIONS:
            out = self.workdir / "data" / "mutated" / kind / rel
            out.parent.mkdir(parents=True, exist_ok=True)
            what = mutate(kind, ds.root / rel, out, seed=0)
            self.mutations[kind] = (out, what)
            log(f"mutated checkpoint {what.describe()}")

    def prepare_newstep(self, ds: Dataset) -> None:
        """Write step-2/ of delta-newstep once (not timed) under data/newstep/step-2/."""
        out = self.workdir / "data" / "newstep" / "step-2"
        what = new_step(ds.root, out, NEWSTEP_FRACTION, seed=0)
        self.mutations[NEWSTEP] = (out, what)
        log(f"next step of {ds.name}: {what.describe()}")

    # -- one timed run ------------------------------------------------------------------------

    def _ctx(self, run_id: str) -> Context:
        rundir = self.workdir / "runs" / run_id
        # Fresh for every run: in a reused --workdir, a run of an earlier invocation left its
        # state here (mcsync's manifest, of a target since deleted), and the next run of the
        # same id found it. mcsync then took the targets for wiped ones, whose stale records
        # made each new object a delta candidate read twice: the 16 x 16 MiB download took
        # 0.69-0.71 s instead of 0.46-0.54 s, at twice the RSS.
        shutil.rmtree(rundir, ignore_errors=True)
        rundir.mkdir(parents=True)
        return Context(servers=self.servers, confdir=rundir)

    def locations(self, path: str, ds: Dataset, run_id: str, label: str):
        bucket = slug(f"{TARGET_PREFIX}{run_id}-{self.nonce}")[:63]
        src_s3 = S3Loc("A", SOURCE_BUCKET, f"{ds.name}/")
        # With --link-mbit the local → s3 paths write to B, behind the capped link; with
        # --rtt-ms the request-bound ones write to R (B, every answer held back).
        to = ("R" if self.args.rtt_ms and path in RTT_PATHS
              else "B" if self.args.link_mbit and path in LINK_PATHS else "A")
        if path in ("upload", "resync-noop"):
            return LocalLoc(ds.root), S3Loc(to, bucket)
        if path in CLOUD_PATHS and label == S3_REF:
            return src_s3, S3Loc("B", bucket)
        if path == "az-to-meta":
            return AzLoc(self.azurite.url, SOURCE_BUCKET, f"{ds.name}/"), S3Loc("B", bucket)
        if path == "gs-to-meta":
            ca = str(self.gcs.ca) if self.gcs and self.gcs.ca else None
            src = GcsLoc(self.gcs.url if self.gcs else "", SOURCE_BUCKET, f"{ds.name}/", ca)
            return src, S3Loc("B", bucket)
        if path == "delta-s3":
            return LocalLoc(self.workdir / "runs" / run_id / "src"), S3Loc(to, bucket)
        if path == "delta-newstep":  # sync ./ckpt/ meta://bucket/ckpt/
            return LocalLoc(self.workdir / "runs" / run_id / "ckpt"), S3Loc(to, bucket, "ckpt/")
        if path == "delta-local":
            src = LocalLoc(self.workdir / "runs" / run_id / "src")
            return src, LocalLoc(self.workdir / "targets" / run_id)
        if path == "download":
            return src_s3, LocalLoc(self.workdir / "targets" / run_id)
        if path == "server-copy":
            return src_s3, S3Loc("A", bucket)
        return src_s3, S3Loc("B", bucket)

    @staticmethod
    def _logs(ctx: Context, name: str) -> tuple[Path, Path]:
        """stdout.log, stderr.log of the timed run; <name>.stdout.log etc. of another."""
        pre = f"{name}." if name else ""
        return ctx.confdir / f"{pre}stdout.log", ctx.confdir / f"{pre}stderr.log"

    def _run_tool(self, inv, ctx: Context, name: str = ""):
        out, err = self._logs(ctx, name)
        return run_measured(
            inv.argv, base_env() | inv.env, stdout=out, stderr=err, timeout=self.args.timeout
        )

    def _failure(self, res, ctx: Context, name: str, report: dict | None) -> str | None:
        """Why a finished run failed (timeout, exit status, report), or None."""
        if res.timed_out:
            return f"killed after {self.args.timeout:.0f} s"
        if res.returncode != 0:
            out, err_log = self._logs(ctx, name)
            err = report_failure(report) or tail(err_log) or tail(out)
            return f"exit {res.returncode}: {err or 'no output'}"
        rep_code = (report or {}).get("exit_code")
        if rep_code not in (None, 0):
            return f"report says exit_code {rep_code}"
        return None

    def _first_sync(self, inv, ctx: Context, tool: Tool, dst, files: dict) -> str | None:
        """The untimed sync before a re-sync: same command, same state dir. None when it worked;
        the target must then hold ``files`` (keys and sizes)."""
        res = self._run_tool(inv, ctx, "initial")
        report = tool.parse_report(self._logs(ctx, "initial")[0].read_text(errors="replace"))
        reason = self._failure(res, ctx, "initial", report)
        if reason is None:
            _got, reason = self._check_target(dst, files, {}, content=False)
        return None if reason is None else f"initial sync: {reason}"

    def run_one(
        self, path: str, ds: Dataset, tool: Tool, rep: int,
        mutation: str | None = None, label: str | None = None,
    ) -> dict:  # fmt: skip
        label = label or tool.name
        group = ds.name if mutation is None else f"{ds.name}+{mutation}"
        run_id = f"{path}-{slug(group)}-{slug(label)}-{rep}"
        src, dst = self.locations(path, ds, run_id, label)
        # What the target must hold after the timed run, and the files it must equal.
        files, sources, change = dict(ds.files), {k: ds.root / k for k in ds.files}, None
        first = dict(sources)  # the source of the first sync of a re-sync path
        if mutation == NEWSTEP:
            # step-1/ first; then step-2/ appears beside it. The target keeps step-1, the
            # table counts step-2 and the check reads it back.
            step2, what = self.mutations[mutation]
            first = {f"step-1/{k}": ds.root / k for k in ds.files}
            new = {f"step-2/{k}": step2 / k for k in ds.files}
            files = {r: f.stat().st_size for r, f in (first | new).items()}
            sources, change = {r: src.path / r for r in new}, what.describe()
        elif mutation:
            mutated, what = self.mutations[mutation]
            (rel,) = ds.files
            files, sources, change = {rel: what.file_size}, {rel: src.path / rel}, what.describe()
        record = {
            "path": path, "data": group, "dataset": ds.name, "mutation": mutation,
            "change": change, "tool": label, "rep": rep,
            "src": str(src), "dst": str(dst),
            "expected_objects": len(sources), "expected_bytes": sum(files[k] for k in sources),
            "status": None, "reason": None,
            "wall_s": None, "cpu_user_s": None, "cpu_sys_s": None, "cpu_s": None,
            "maxrss_mib": None, "server_cpu_s": None, "returncode": None,
            "target_objects": None, "target_bytes": None, "report": None,
            "bytes_sent": None, "bytes_sent_assumed": None,
            "maxrss_wait4_mib": None, "rss_tree_peak_mib": None, "procs_max": None,
            "link": None, "link_tx_bytes": None,
        }  # fmt: skip
        if self.args.link_mbit and any(
            isinstance(loc, S3Loc) and loc.server == "B" for loc in (src, dst)
        ):
            record["link"] = self.link_label()
        na = tool.unsupported(src, dst)
        if na:
            record.update(status="n/a", reason=na)
            return record

        # Data, a mutated copy and a target (two for a local delta) at most.
        need = ds.nbytes * (3.2 if mutation else 1.2) + 512 * MIB
        if free_bytes(self.workdir) < need and self.trash_bytes:
            self.empty_trash()  # the targets set aside give their space back first
        if free_bytes(self.workdir) < need:
            raise SystemExit(
                f"error: only {free_bytes(self.workdir) / MIB:,.0f} MiB free in {self.workdir}, "
                f"{need / MIB:,.0f} MiB needed for {run_id}"
            )
        ctx = self._ctx(run_id)
        if mutation:
            # The source starts as the original checkpoint (hard links: no bytes copied).
            shutil.rmtree(src.path, ignore_errors=True)
            link_tree(first, src.path)
        inv = tool.invocation(src, dst, ctx)
        record["command"] = describe(inv)
        record["argv"] = inv.argv
        if self.args.verbose:
            log(f"  $ {record['command']}")
        self._make_target(dst)
        try:
            if path in RESYNC_PATHS:
                before = {r: f.stat().st_size for r, f in first.items()}
                why = self._first_sync(inv, ctx, tool, dst, before)
                if why:
                    record.update(status="FAIL", reason=why)
                    return record
                synced = time.time()
            if mutation == NEWSTEP:
                link_tree(new, src.path)  # new keys: no mtime to wait for
            elif mutation:
                # The checkpoint is replaced by its changed version, written after the first
                # sync: a new mtime at least a second after it (s5cmd and aws compare mtimes
                # with the target's second-granular LastModified), the target untouched.
                (rel,) = ds.files
                tmp = src.path / f".{rel}.new"
                os.link(mutated, tmp)
                os.replace(tmp, src.path / rel)
                time.sleep(max(0.0, synced + 1.1 - time.time()))
                os.utime(src.path / rel)
            tx0 = self.link.tx_bytes() if record["link"] and self.link else None
            srv0 = self.server_cpu.total()
            res = self._run_tool(inv, ctx)
            srv1 = self.server_cpu.total()
            tx1 = None if tx0 is None else self.link.tx_bytes()
            record.update(
                returncode=res.returncode,
                wall_s=res.wall_s,
                cpu_user_s=res.user_s,
                cpu_sys_s=res.sys_s,
                cpu_s=res.cpu_s,
                maxrss_mib=res.peak_rss_kib / 1024,
                maxrss_wait4_mib=res.maxrss_kib / 1024,
                rss_tree_peak_mib=(
                    None if res.tree_rss_peak_kib is None else res.tree_rss_peak_kib / 1024
                ),
                procs_max=res.tree_procs_max,
                server_cpu_s=None if srv0 is None or srv1 is None else srv1 - srv0,
                link_tx_bytes=None if tx0 is None or tx1 is None else tx1 - tx0,
            )
            stdout = (ctx.confdir / "stdout.log").read_text(errors="replace")
            record["report"] = tool.parse_report(stdout)
            reason = self._failure(res, ctx, "", record["report"])
            # The new paths check every object's bytes (a rewrite keeps the size); the fresh-copy
            # paths keep their key-and-size check.
            content = path not in FRESH_PATHS
            got, why = self._check_target(dst, files, sources, content)
            record.update(target_objects=len(got), target_bytes=sum(got.values()))
            reason = reason or why
            if record["report"] and "bytes_sent" in record["report"]:
                record.update(bytes_sent=record["report"]["bytes_sent"], bytes_sent_assumed=False)
            elif mutation:
                # Peers have no delta: a changed or new file is sent whole (assumed, not measured).
                record.update(bytes_sent=record["expected_bytes"], bytes_sent_assumed=True)
            record.update(status="FAIL" if reason else "ok", reason=reason)
        finally:
            self._drop_target(dst)
            if mutation:
                shutil.rmtree(src.path, ignore_errors=True)
        return record

    # -- the whole matrix -----------------------------------------------------------------------

    def scenarios(self) -> list[tuple[str, str, str | None]]:
        """(path, data set, mutation) in run order; a path runs only on the sets it is for."""
        out: list[tuple[str, str, str | None]] = []
        for path in self.args.only:
            mine: list[tuple[str, str, str | None]] = []
            for name in self.args.data:
                if path == "resync-noop" and name not in NOOP_SETS:
                    continue
                if path == "delta-newstep":
                    if name in NEWSTEP_SETS:
                        mine.append((path, name, NEWSTEP))
                    continue
                if path.startswith("delta-"):
                    if name in DELTA_SETS:
                        mine += [(path, name, m) for m in MUTATIONS]
                    continue
                mine.append((path, name, None))
            if not mine:
                only = {"resync-noop": NOOP_SETS, "delta-newstep": NEWSTEP_SETS}
                sets = only.get(path, DELTA_SETS)
                log(f"note: {path} runs on {','.join(sets)}, none of which is in --data")
            out += mine
        return out

    def run_matrix(self, sets: dict[str, Dataset]) -> None:
        plan = [
            (path, name, mutation, rep) for path, name, mutation in self.scenarios()
            for rep in range(1, self.args.repeat + 1)
        ]  # fmt: skip
        total = sum(len(self._entrants(p)) for p, _n, _m, _r in plan)
        i = 0
        for path, name, mutation, rep in plan:
            ds = sets[name]
            group = name if mutation is None else f"{name}+{mutation}"
            entrants = self._entrants(path)
            # Rotate the order each repeat so no tool always runs right after the same one.
            k = (rep - 1) % max(1, len(entrants))
            for tool, label in entrants[k:] + entrants[:k]:
                i += 1
                if rep > 1 and any(
                    r["status"] == "n/a"
                    and (r["path"], r["data"], r["tool"]) == (path, group, label)
                    for r in self.runs
                ):
                    continue
                head = (
                    f"[{i:>{len(str(total))}}/{total}] {path:<11} {group:<22} "
                    f"rep {rep}/{self.args.repeat} {label:<14}"
                )
                record = self.run_one(path, ds, tool, rep, mutation, label)
                self.runs.append(record)
                if record["status"] == "n/a":
                    log(f"{head}  n/a ({record['reason']})")
                elif record["status"] == "ok":
                    mbs = record["expected_bytes"] / record["wall_s"] / 1e6
                    rate = "  (no-op)     " if path == "resync-noop" else f"{mbs:8.1f} MB/s"
                    sent = record.get("bytes_sent")
                    sent_s = "" if sent is None else f"  sent {sent / 1e6:,.1f} MB"
                    sent_s += "~" if record.get("bytes_sent_assumed") else ""
                    log(
                        f"{head}  {record['wall_s']:7.2f} s {rate}  "
                        f"cpu {record['cpu_s']:6.2f} s  rss {record['maxrss_mib']:6.0f} MiB"
                        f"{sent_s}  ok"
                    )
                else:
                    log(f"{head}  FAIL: {record['reason']}")

    def _entrants(self, path: str) -> list[tuple[Tool, str]]:
        """(tool, label) for each row of a path's table; gs-to-meta adds mcsync's s3 → meta."""
        out = [(t, t.name) for t in self.tools]
        if path in CLOUD_PATHS:
            out += [(t, S3_REF) for t in self.tools if t.name == "mcsync"]
        return out


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # SIGTERM (a CI time limit, `kill PID`) stops like Ctrl-C: current tool killed, targets and
    # servers cleaned up, the runs done so far reported.
    signal.signal(signal.SIGTERM, _interrupt)
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:  # started in the background by sh
        signal.signal(signal.SIGINT, _interrupt)
    sizes = QUICK if args.quick else FULL
    started = time.time()
    if args.workdir:
        workdir = args.workdir.resolve()
        workdir.mkdir(parents=True, exist_ok=True)
        cleanup = False
    else:
        workdir = Path(tempfile.mkdtemp(prefix="mcsync-bench-"))
        cleanup = True
    log(f"work dir: {workdir}  ({free_bytes(workdir) / (1 << 30):.1f} GiB free)")

    bench = Bench(args, workdir)
    rows: list[dict] = []
    interrupted = False
    try:
        if not bench.tools:
            raise SystemExit("error: none of the selected tools is installed")
        sets = prepare(workdir, sizes, args.data, log)
        for ds in sets.values():
            log(
                f"data set {ds.name}: {ds.count:,} file{'s' if ds.count != 1 else ''}, "
                f"{ds.nbytes / MIB:,.1f} MiB in {ds.root}"
            )
        with contextlib.ExitStack() as stack:
            bench.start_servers(stack)
            if set(args.only) & set(S3_SOURCE_PATHS):
                bench.seed(sets)
            if "gs-to-meta" in args.only:
                bench.seed_gcs(sets)
            if "az-to-meta" in args.only:
                bench.seed_azure(sets)
            if {"delta-s3", "delta-local"} & set(args.only) and "checkpoint" in sets:
                bench.prepare_mutations(sets["checkpoint"])
            if "delta-newstep" in args.only and set(NEWSTEP_SETS) & set(sets):
                bench.prepare_newstep(sets[NEWSTEP_SETS[0]])
            try:
                bench.run_matrix(sets)
            finally:
                bench.empty_trash()
    except KeyboardInterrupt:
        interrupted = True
        log("interrupted: reporting the runs done so far")
    finally:
        if bench.runs:
            peers = {t.name for t in bench.tools if t.is_peer}
            names = [t.name for t in bench.tools] + [S3_REF]
            rows = summarize(bench.runs, names, peers)
        elapsed = time.time() - started
        if args.json:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps({
                "argv": sys.argv,
                "sizes": dataclasses.asdict(sizes),
                "quick": args.quick,
                "repeat": args.repeat,
                "machine": {"platform": platform.platform(), "python": platform.python_version()},
                "tools": {
                    **{n: {"version": v} for n, v in bench.versions.items()},
                    **{n: {"skipped": why} for n, why in bench.skipped.items()},
                },
                "link": {
                    "mbit": args.link_mbit,
                    "applied": bench.link is not None,
                    "note": bench.link_note,
                    "description": bench.link.describe() if bench.link else None,
                    "probe": bench.link_probe,
                } if args.link_mbit else None,
                "rtt_ms": args.rtt_ms if "R" in bench.servers else None,
                "elapsed_s": elapsed,
                "interrupted": interrupted,
                "runs": bench.runs,
                "summary": rows,
            }, indent=2, default=str) + "\n")  # fmt: skip
            log(f"wrote {args.json}")
        if cleanup:
            shutil.rmtree(workdir, ignore_errors=True)

    print()
    where = "SeaweedFS on 127.0.0.1"
    if bench.link:
        where = (
            f"SeaweedFS A on 127.0.0.1, B on {bench.link.ns_ip} behind a "
            f"{bench.link.mbit} Mbit/s link"
        )
    if "R" in bench.servers:
        where += f" · R: B, every answer held back {args.rtt_ms} ms"
    print(
        f"mcsync benchmark · {'quick' if args.quick else 'full'} data · "
        f"{args.repeat} run(s) each · {where} · {elapsed / 60:.1f} min"
    )
    print(
        "wall s / CPU s / RSS: medians for the client process tree (CPU = user + sys); "
        "range: fastest-slowest wall time of the runs; srv CPU s: the SeaweedFS servers; "
        "MB/s = 10^6 bytes/s;"
    )
    print(
        "CPU s/GiB: client CPU s per GiB (2^30 bytes) of the data set copied or re-synced; "
        "RSS: peak of the tree (ru_maxrss, or its sampled sum when larger);"
    )
    print("÷ best peer: wall time over the fastest non-mcsync tool's (lower is better); * = mcsync")
    if bench.link:
        print(f"link to B: {bench.link.describe()}")
        print(f"  measured: {bench.link_capacity()}")
        print(f"  targets on B: {', '.join(p for p in bench.b_paths() if p in args.only)}")
    elif bench.link_note:
        print(f"note: {bench.link_note}")
    for name, version in bench.versions.items():
        print(f"  {name}: {version}")
    for name, why in bench.skipped.items():
        print(f"  {name}: skipped: {why}")
    print()
    print(render(rows, args.repeat))
    failed = any(r["status"] == "FAIL" for r in bench.runs)
    return 130 if interrupted else (1 if failed else 0)


if __name__ == "__main__":
    sys.exit(main())
