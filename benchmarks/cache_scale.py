"""The node cache under many readers and many objects (``benchmarks/cache.py --hits`` and
``--warm-scale`` run this):

1. **Hits per second**, 1 and 8 processes: a cache of ``--entries`` complete entries (small
   objects from a synthetic bucket, ``testbed/synthetic.py``, fetched once, untimed); each
   reader process opens the cache (``validate="never"``: no request), waits for a common
   start, and takes ``Cache.path()`` of random entries for ``--seconds``; the hits of all of
   them over the seconds. More entries than a process holds (64), so hits go through the
   index and a lock, not only the process's own holds. ``--code DIR``: the mcsync package
   the readers import (e.g. an older commit's, ``git archive``), for a before/after figure.
2. **A warm of many objects**: ``mcsync cache warm meta://synthetic/`` of ``--keys`` objects
   (0 to ``--max-object`` bytes each) into a fresh cache, wall time, CPU and peak RSS of the
   process tree by ``testbed/rusage.py``.

    python benchmarks/cache.py --hits [--entries 256] [--seconds 5] [--rounds 5]
                                      [--procs 1,8] [--code DIR]
    python benchmarks/cache.py --warm-scale [--keys 100000] [--max-object 4096] [--code DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.append(str(REPO))  # testbed/: not installed


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def probe_hits(cache_dir: str, urls_file: str, start: str, seconds: float,
               seed: int) -> tuple[int, float]:
    """In a reader process: hits taken in ``seconds`` from the start file's appearance, and
    the CPU seconds the process spent meanwhile."""
    from mcsync.cache import Cache

    urls = Path(urls_file).read_text().split()
    rng = random.Random(seed)
    picks = [rng.choice(urls) for _ in range(1 << 16)]
    with Cache(cache_dir, validate="never") as cache:
        cache.path(urls[0])  # (the first use opens what it opens: not timed)
        while not Path(start).exists():
            time.sleep(0.001)
        n, end, cpu = 0, time.perf_counter() + seconds, time.process_time()
        while time.perf_counter() < end:
            for url in picks[n & 0xFFFF: (n & 0xFFFF) + 64]:
                cache.path(url)
            n += 64
        cpu = time.process_time() - cpu
    return n, cpu


def hits(args: argparse.Namespace) -> int:
    from testbed.synthetic import SyntheticBucket, serve_in_thread

    work = Path(tempfile.mkdtemp(prefix="mcsync-hits-"))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (args.code, str(REPO)) if p)
    procs = [int(p) for p in args.procs.split(",")]
    rows: dict[int, list[float]] = {p: [] for p in procs}
    cpu_us: dict[int, list[float]] = {p: [] for p in procs}  # CPU per hit
    loads = [os.getloadavg()[0]]
    with serve_in_thread(SyntheticBucket(args.entries, max_size=64 * 1024)) as ep:
        os.environ.update(ep.meta_env())
        env.update(ep.meta_env())
        from mcsync.cache import Cache
        from testbed.synthetic import SyntheticBucket as B

        bucket = B(args.entries, max_size=64 * 1024)
        urls = [f"meta://{ep.bucket}/{bucket.key(i)}" for i in range(args.entries)]
        cache_dir = work / "cache"
        with Cache(cache_dir, validate="never") as cache:
            for url in urls:
                cache.path(url)
                cache.release(url)
        (work / "urls").write_text("\n".join(urls))
        for rnd in range(args.rounds):
            for p in procs if rnd % 2 == 0 else procs[::-1]:
                start = work / f"start-{rnd}-{p}"
                children = [subprocess.Popen(
                    [sys.executable, __file__, "--probe-hits", str(cache_dir),
                     str(work / "urls"), str(start), str(args.seconds), str(rnd * 100 + i)],
                    env=env, stdout=subprocess.PIPE, text=True) for i in range(p)]
                time.sleep(2.0 + 0.5 * p)  # every reader imported and waiting
                start.touch()
                outs = [c.communicate(timeout=args.seconds + 120)[0].split() for c in children]
                if any(c.returncode for c in children):
                    raise SystemExit("a reader failed")
                counts = [int(o[0]) for o in outs]
                rate = sum(counts) / args.seconds
                rows[p].append(rate)
                cpu_us[p].append(sum(float(o[1]) for o in outs) / sum(counts) * 1e6)
                loads.append(os.getloadavg()[0])
                log(f"round {rnd + 1}: {p} process(es): {rate:,.0f} hits/s "
                    f"(per process {[round(c / args.seconds) for c in counts]})")
    shutil.rmtree(work, ignore_errors=True)
    base = statistics.median(rows[procs[0]])
    print(f"hits/s · {args.entries} entries · {args.seconds:g} s a round · {args.rounds} rounds "
          f"· code {args.code or 'this tree'} · load average (1 min) "
          f"{min(loads):.1f}–{max(loads):.1f}\n")
    print("| processes | hits/s (median) | range | ÷ 1 process | CPU µs per hit (median) |\n"
          "|---|---|---|---|---|")
    for p in procs:
        med = statistics.median(rows[p])
        print(f"| {p} | {med:,.0f} | {min(rows[p]):,.0f}–{max(rows[p]):,.0f} | "
              f"{med / base:.2f} | {statistics.median(cpu_us[p]):.0f} |")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "rates": rows,
                                               "cpu_us_per_hit": cpu_us,
                                               "loads": loads}, indent=2) + "\n")
    return 0


def warm_scale(args: argparse.Namespace) -> int:
    from bench_measure import run_measured

    from testbed.synthetic import synthetic_server

    work = Path(tempfile.mkdtemp(prefix="mcsync-warmscale-"))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (args.code, str(REPO)) if p)
    rows: list[dict[str, Any]] = []
    with synthetic_server(args.keys, max_size=args.max_object) as ep:
        for rnd in range(args.rounds):
            cache_dir = work / "cache"
            shutil.rmtree(cache_dir, ignore_errors=True)
            res = run_measured(
                [sys.executable, "-m", "mcsync.cli.main", "cache", "warm",
                 f"meta://{ep.bucket}/", "--cache-dir", str(cache_dir), "--validate", "never",
                 "--part-size", "1MiB", "--quiet", "--json",
                 *(["--max-size", args.max_size] if args.max_size else [])],
                env | ep.meta_env(), stdout=work / "out.json", stderr=work / "err.log",
                timeout=args.timeout)
            if res.returncode != 0:
                raise SystemExit((work / "err.log").read_text()[-2000:])
            out = json.loads((work / "out.json").read_text())
            got = len(out["fetched"]) + len(out["present"])
            row = {"wall_s": res.wall_s, "cpu_s": res.cpu_s,
                   "rss_mib": res.peak_rss_kib / 1024, "objects": got,
                   "left_out": len(out["left_out"]), "failed": len(out["failed"])}
            rows.append(row)
            log(f"round {rnd + 1}: {row}")
    shutil.rmtree(work, ignore_errors=True)
    print(f"cache warm of {args.keys:,} objects (0–{args.max_object} B) · max size "
          f"{args.max_size or 'none'} · code {args.code or 'this tree'} · load average (1 min) "
          f"{os.getloadavg()[0]:.1f} at the end\n")
    print("| round | objects cached | left out | wall s | CPU s | peak RSS MiB |\n"
          "|---|---|---|---|---|---|")
    for i, r in enumerate(rows, 1):
        print(f"| {i} | {r['objects']:,} | {r['left_out']:,} | {r['wall_s']:.1f} | "
              f"{r['cpu_s']:.1f} | {r['rss_mib']:.0f} |")
    return 0


def main(argv: list[str]) -> int:
    if argv[0] == "--probe-hits":
        d, urls, start, seconds, seed = argv[1:]
        n, cpu = probe_hits(d, urls, start, float(seconds), int(seed))
        print(n, cpu)
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--entries", type=int, default=256)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--procs", default="1,8")
    ap.add_argument("--keys", type=int, default=100_000)
    ap.add_argument("--max-object", type=int, default=4096)
    ap.add_argument("--max-size", default=None,
                    help="the warm's cache limit: a small one stops the warm early (it "
                         "leaves the rest out), measuring the listing's cost alone")
    ap.add_argument("--timeout", type=float, default=3600)
    ap.add_argument("--code", default="", help="the mcsync package's parent directory")
    ap.add_argument("--json", default=None)
    mode, rest = argv[0], argv[1:]
    if mode not in ("--hits", "--warm-scale"):
        ap.error(f"{mode}: --hits or --warm-scale first")
    args = ap.parse_args(rest)
    if mode == "--warm-scale" and args.rounds == 5:
        args.rounds = 1
    return hits(args) if mode == "--hits" else warm_scale(args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
