"""The node cache (``mcsync.cache``): how fast it fills, how fast it serves, how soon the first
byte of a large object arrives (``benchmarks/README.md``, *Node cache*).

1. **Warm-up**: ``mcsync cache warm meta://B/ds/ --cache-dir D`` of ``--objects`` objects of
   ``--object-mib`` each into a fresh D, from SeaweedFS behind the capped link (``--link-mbit
   N``, root: ``bench_netns``) and from one on 127.0.0.1, uncapped. MB/s against the link's
   rate (N / 8 MB/s). Wall, CPU and peak RSS of the process tree by ``testbed/rusage.py``.
2. **Re-read**: every entry of that warm read in full (8 MiB ``readinto``) through
   ``Cache.open()`` and through ``Cache.path()`` + a plain ``open()``, against the same bytes in
   plain local files (the source files the objects were uploaded from, same disk), with the
   page cache warm (each file read once before, untimed) and with it dropped for those files
   (``posix_fadvise(DONTNEED)`` on each file: no root, nothing else on the machine touched).
   ``validate="never"``: no request. The entries are compared byte for byte with the source
   files first.
3. **Time to first byte** of a cold ``--big-mib`` object (capped link when given):
   ``Cache.open(url).read(1 MiB)`` in a fresh cache (then the rest, streamed), against
   ``s5cmd cat`` (its first MiB on the pipe; the process start included) and against
   ``Cache.path(url)``, the whole object fetched before anything is returned. The cache's own
   opening (``Cache(dir)``) is timed apart. Each cached copy is compared with the source.

Steps 2 and 3 run in a child (``--probe``) that times its own phases; ``--repeat`` rounds,
entrants rotated; medians and ranges; the load average is sampled each round.

    python benchmarks/cache.py [--quick] [--repeat 3] [--link-mbit N] [--objects 64]
                               [--object-mib 16] [--big-mib 1024] [--workdir DIR] [--json OUT]
    python benchmarks/cache.py --merge A.json B.json ...   # one table over several runs
    python benchmarks/cache.py --hits | --warm-scale ...  # benchmarks/cache_scale.py
    python benchmarks/cache.py --epoch ...  # a data-loader epoch: benchmarks/cache_epoch.py
"""

from __future__ import annotations

import argparse
import filecmp
import json
import os
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
sys.path.append(str(Path(__file__).resolve().parents[1] / "scripts"))

from make_sample_data import random_chunks, write_file

MiB = 1 << 20
CHUNK = 8 * MiB
BUCKET = "cachebench"
REPO = Path(__file__).resolve().parents[1]


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# --- the child: phases timed in-process ------------------------------------------------------

def _read_all(f: Any, buf: bytearray) -> int:
    total = 0
    while n := f.readinto(buf):
        total += n
    return total


def _drop(paths: list[Path]) -> None:
    """These files' pages out of the page cache (clean pages only: the cache fsyncs)."""
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def _timed(fn: Any) -> tuple[float, float, Any]:
    w0, c0 = time.perf_counter(), time.process_time()
    out = fn()
    return time.perf_counter() - w0, time.process_time() - c0, out


def probe_reread(cache_dir: str, pairs: list[tuple[str, str]], rep: int) -> dict[str, Any]:
    from mcsync.cache import Cache

    buf = bytearray(CHUNK)
    with Cache(cache_dir, validate="never") as cache:
        paths = [cache.path(url) for url, _ in pairs]
        for (url, local), path in zip(pairs, paths, strict=True):
            if not filecmp.cmp(path, local, shallow=False):
                raise SystemExit(f"{url}: the cached bytes differ from the source's")
        locals_ = [Path(local) for _, local in pairs]

        def plain(files: list[Path]) -> int:
            n = 0
            for p in files:
                with open(p, "rb", buffering=0) as f:
                    n += _read_all(f, buf)
            return n

        def through_open() -> int:
            n = 0
            for url, _ in pairs:
                with cache.open(url) as f:
                    n += _read_all(f, buf)
            return n

        methods = {"local file": (lambda: plain(locals_), locals_),
                   "Cache.path() + read": (lambda: plain([cache.path(u) for u, _ in pairs]),
                                           paths),
                   "Cache.open()": (through_open, paths)}
        names = list(methods)
        k = rep % len(names)
        out: dict[str, Any] = {}
        for mode in ("page cache warm", "page cache dropped"):
            for name in names[k:] + names[:k]:
                fn, files = methods[name]
                if mode == "page cache warm":
                    plain(files)
                else:
                    os.sync()
                    _drop(files)
                wall, cpu, nbytes = _timed(fn)
                out[f"{name} · {mode}"] = {"wall_s": wall, "cpu_s": cpu, "bytes": nbytes}
    return out


def probe_ttfb(cache_dir: str, url: str, local: str, how: str) -> dict[str, Any]:
    from mcsync.cache import Cache

    w0 = time.perf_counter()
    cache = Cache(cache_dir, validate="never")
    opened = time.perf_counter()
    out: dict[str, Any] = {"init_s": opened - w0}
    try:
        if how == "open":
            with cache.open(url) as f:
                first = f.read(MiB)
                out["first_s"] = time.perf_counter() - opened
                nbytes = len(first) + _read_all(f, bytearray(CHUNK))
        else:
            nbytes = cache.path(url).stat().st_size
        out["whole_s"] = time.perf_counter() - opened
        out["bytes"] = nbytes
        if not filecmp.cmp(cache.path(url), local, shallow=False):
            raise SystemExit(f"{url}: the cached bytes differ from the source's")
    finally:
        cache.close()
    return out


def child(argv: list[str]) -> int:
    kind, spec = argv
    args = json.loads(spec)
    if kind == "reread":
        res = probe_reread(args["cache_dir"], [tuple(p) for p in args["pairs"]], args["rep"])
    else:
        res = probe_ttfb(args["cache_dir"], args["url"], args["local"], args["how"])
    print(json.dumps(res))
    return 0


# --- the harness -----------------------------------------------------------------------------

def make_source(root: Path, objects: int, object_bytes: int, big_bytes: int) -> dict[str, Path]:
    """ds/part-NNN.bin and big/model.bin (seeded bytes; reused when the sizes match)."""
    want = {f"ds/part-{i:03d}.bin": object_bytes for i in range(objects)}
    want["big/model.bin"] = big_bytes
    for d in ("ds", "big"):
        if (root / d).exists():
            for p in (root / d).iterdir():
                if f"{d}/{p.name}" not in want:
                    p.unlink()
    out = {}
    for key, size in want.items():
        path = root / key
        if not (path.exists() and path.stat().st_size == size):
            write_file(path, random_chunks(key, size))
        out[key] = path
    return out


def summary(values: list[float]) -> dict[str, float]:
    s = sorted(values)
    return {"median": statistics.median(s), "lo": s[0], "hi": s[-1], "n": len(s)}


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--probe":
        return child(sys.argv[2:])
    if len(sys.argv) > 1 and sys.argv[1] == "--merge":
        return merge([Path(p) for p in sys.argv[2:]])
    if len(sys.argv) > 1 and sys.argv[1] in ("--hits", "--warm-scale"):
        import cache_scale  # hits/s with 1 and 8 processes; a warm of 100k objects

        return cache_scale.main(sys.argv[1:])
    if len(sys.argv) > 1 and sys.argv[1] == "--epoch":
        import cache_epoch  # a data-loader epoch: 8 readers, local / cold / warm / store

        return cache_epoch.main(sys.argv[2:])
    import bench_netns
    from bench_measure import run_measured
    from bench_tools import _venv_or_path, base_env

    from testbed.servers import S3Endpoint, seaweedfs

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--objects", type=int, default=64)
    ap.add_argument("--object-mib", type=int, default=16)
    ap.add_argument("--big-mib", type=int, default=1024)
    ap.add_argument("--quick", action="store_true", help="16 x 4 MiB, a 128 MiB big object")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--link-mbit", type=int, default=None)
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--timeout", type=float, default=1800)
    args = ap.parse_args()
    if args.quick:
        args.objects, args.object_mib, args.big_mib = 16, 4, 128
    workdir = (args.workdir or Path(tempfile.mkdtemp(prefix="mcsync-cachebench-"))).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    started = time.time()
    loads = [os.getloadavg()[0]]

    env0 = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(REPO / "mcsync")], env=env0,
                   check=True, stdout=subprocess.DEVNULL)
    log(f"work dir {workdir}; making the source ({args.objects} x {args.object_mib} MiB, "
        f"one of {args.big_mib} MiB)")
    files = make_source(workdir / "data", args.objects, args.object_mib * MiB,
                        args.big_mib * MiB)
    ds_keys = sorted(k for k in files if k.startswith("ds/"))
    ds_bytes = sum(files[k].stat().st_size for k in ds_keys)
    big_bytes = files["big/model.bin"].stat().st_size
    s5cmd = _venv_or_path("s5cmd") or "s5cmd"

    runs: list[dict[str, Any]] = []
    link_note = "no --link-mbit"
    rate_mb_s: float | None = None
    with ExitStack() as stack:
        servers: dict[str, S3Endpoint] = {}
        for d in ("weed", "weed-capped"):
            shutil.rmtree(workdir / d, ignore_errors=True)  # a fresh server: a reused --workdir
        if args.link_mbit:
            try:
                link = bench_netns.open_link(args.link_mbit, log)
                stack.callback(link.close)
                servers["capped"] = stack.enter_context(
                    bench_netns.seaweedfs_in(link, workdir / "weed-capped", S3Endpoint))
                probe = bench_netns.measure(servers["capped"])
                rate_mb_s = args.link_mbit / 8
                link_note = (f"{link.describe()}; one {probe['bytes'] / MiB:.0f} MiB GET "
                             f"{probe['get_mb_s']:.1f} MB/s")
            except bench_netns.LinkUnavailable as exc:
                link_note = f"--link-mbit {args.link_mbit} not applied ({exc})"
        servers["uncapped"] = stack.enter_context(seaweedfs(workdir / "weed"))
        for name, ep in servers.items():
            log(f"{name}: SeaweedFS at {ep.url}; uploading the source")
            ep.create_bucket(BUCKET)
            subprocess.run([s5cmd, "--endpoint-url", ep.url, "--log", "error", "cp",
                            f"{workdir / 'data'}/*", f"s3://{BUCKET}/"],
                           env=base_env() | {"AWS_ACCESS_KEY_ID": ep.access_key,
                                             "AWS_SECRET_ACCESS_KEY": ep.secret_key,
                                             "AWS_REGION": ep.region}, check=True)
        far = servers.get("capped", servers["uncapped"])
        env = base_env() | {"PYTHONPATH": str(REPO)}
        me = [sys.executable, str(Path(__file__).resolve()), "--probe"]
        big_url = f"meta://{BUCKET}/big/model.bin"

        def measured(tag: str, rep: int, argv: list[str], ep: S3Endpoint) -> dict[str, Any]:
            logs = workdir / "runs" / f"{tag.replace(' ', '-')}-{rep}"
            shutil.rmtree(logs, ignore_errors=True)
            logs.mkdir(parents=True)
            res = run_measured(argv, env | ep.meta_env(), stdout=logs / "stdout.log",
                               stderr=logs / "stderr.log", timeout=args.timeout)
            out = (logs / "stdout.log").read_text()
            why = None
            if res.returncode != 0:
                why = (f"exit {res.returncode}: "
                       f"{(logs / 'stderr.log').read_text(errors='replace')[-300:]}")
            row = {"what": tag, "rep": rep, "argv": argv, "ok": why is None, "why": why,
                   "wall_s": res.wall_s, "cpu_s": res.cpu_s,
                   "rss_mib": res.peak_rss_kib / 1024}
            if why is None:
                row["out"] = json.loads(out)
            runs.append(row)
            return row

        def fresh(name: str) -> Path:
            d = workdir / "caches" / name
            shutil.rmtree(d, ignore_errors=True)
            return d

        for rep in range(1, args.repeat + 1):
            for name, ep in servers.items():
                d = fresh(f"warm-{name}")
                tag = f"warm {name}"
                r = measured(tag, rep, [sys.executable, "-m", "mcsync.cli.main", "cache", "warm",
                                        f"meta://{BUCKET}/ds/", "--cache-dir", str(d),
                                        "--validate", "never", "--json"], ep)
                if r["ok"] and (len(r["out"]["fetched"]) != len(ds_keys)
                                or r["out"]["bytes_fetched"] != ds_bytes):
                    r["ok"], r["why"] = False, f"fetched {r['out']['fetched'][:3]}..."
                log(f"rep {rep} {tag:<22} {r['wall_s']:7.2f} s  cpu {r['cpu_s']:6.2f} s  "
                    f"rss {r['rss_mib']:5.0f} MiB  {r['why'] or 'ok'}")
                if name == "uncapped" and r["ok"]:
                    pairs = [(f"meta://{BUCKET}/{k}", str(files[k])) for k in ds_keys]
                    rr = measured("reread", rep, [*me, "reread", json.dumps(
                        {"cache_dir": str(d), "pairs": pairs, "rep": rep})], ep)
                    for k, v in (rr.get("out") or {}).items():
                        log(f"rep {rep} reread {k:<40} {v['wall_s']:6.2f} s  "
                            f"cpu {v['cpu_s']:5.2f} s")
                    if not rr["ok"]:
                        log(f"rep {rep} reread FAIL {rr['why']}")
                shutil.rmtree(d, ignore_errors=True)
            loads.append(os.getloadavg()[0])
            entrants = ["open", "path", "s5cmd"]
            k = (rep - 1) % len(entrants)
            for how in entrants[k:] + entrants[:k]:
                if how == "s5cmd":
                    r = s5cmd_cat(s5cmd, far, f"s3://{BUCKET}/big/model.bin", big_bytes,
                                  base_env())
                    r.update(what="ttfb s5cmd", rep=rep)
                    runs.append(r)
                    log(f"rep {rep} ttfb s5cmd cat   first {r.get('first_s', 0):6.3f} s  "
                        f"whole {r.get('whole_s', 0):6.2f} s  {r['why'] or 'ok'}")
                    continue
                d = fresh(f"ttfb-{how}")
                r = measured(f"ttfb {how}", rep, [*me, "ttfb", json.dumps(
                    {"cache_dir": str(d), "url": big_url, "local": str(files["big/model.bin"]),
                     "how": how})], far)
                o = r.get("out") or {}
                first = f"first {o['first_s']:6.3f} s  " if "first_s" in o else ""
                log(f"rep {rep} ttfb Cache.{how:<5}  init {o.get('init_s', 0):6.3f} s  {first}"
                    f"whole {o.get('whole_s', 0):6.2f} s  {r['why'] or 'ok'}")
                shutil.rmtree(d, ignore_errors=True)
            loads.append(os.getloadavg()[0])

    print(render(runs, args, link_note, rate_mb_s, ds_bytes, big_bytes, loads,
                 (time.time() - started) / 60))
    if args.json:
        args.json.write_text(json.dumps({"args": vars(args), "link": link_note, "loads": loads,
                                         "minutes": (time.time() - started) / 60,
                                         "runs": runs}, indent=2, default=str) + "\n")
    if args.workdir is None:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0 if all(r["ok"] for r in runs) else 1


def s5cmd_cat(exe: str, ep: Any, url: str, size: int, env: dict[str, str]) -> dict[str, Any]:
    """``s5cmd cat URL``: when its first MiB is on the pipe, when its last; bytes counted."""
    keys = {"AWS_ACCESS_KEY_ID": ep.access_key, "AWS_SECRET_ACCESS_KEY": ep.secret_key,
            "AWS_REGION": ep.region}
    argv = [exe, "--endpoint-url", ep.url, "--log", "error", "cat", url]
    w0 = time.perf_counter()
    proc = subprocess.Popen(argv, env=env | keys, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    assert proc.stdout is not None
    got, first = 0, None
    while chunk := proc.stdout.read1(CHUNK):
        got += len(chunk)
        if first is None and got >= MiB:
            first = time.perf_counter() - w0
    err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
    rc = proc.wait()
    why = None if rc == 0 and got == size else f"exit {rc}, {got} of {size} bytes: {err[-200:]}"
    return {"argv": argv, "ok": why is None, "why": why, "first_s": first,
            "whole_s": time.perf_counter() - w0}


def render(runs: list[dict[str, Any]], args: argparse.Namespace, link_note: str,
           rate_mb_s: float | None, ds_bytes: int, big_bytes: int, loads: list[float],
           minutes: float) -> str:
    def cell(vals: list[float], fmt: str = ".2f") -> str:
        if not vals:
            return "FAIL | |"
        s = summary(vals)
        return f"{s['median']:{fmt}} | {s['lo']:{fmt}}–{s['hi']:{fmt}} |"

    ok = [r for r in runs if r["ok"]]
    lines = [f"node cache · {args.objects} x {args.object_mib} MiB "
             f"({ds_bytes / MiB:,.0f} MiB) and one {big_bytes / MiB:,.0f} MiB object · "
             f"link: {link_note} · {args.repeat} rounds · load average (1 min) "
             f"{min(loads):.1f}–{max(loads):.1f}" + (f" · {minutes:.1f} min" if minutes else ""),
             "",
             "| measurement | s (median) | range | MB/s | ÷ link rate | CPU s | RSS MiB |",
             "|---|---|---|---|---|---|---|"]
    for name in ("capped", "uncapped"):
        mine = [r for r in ok if r["what"] == f"warm {name}"]
        if not any(r["what"] == f"warm {name}" for r in runs):
            continue
        walls = [r["wall_s"] for r in mine]
        mb = ds_bytes / statistics.median(walls) / 1e6 if walls else 0
        ratio = f"{mb / rate_mb_s:.2f}" if rate_mb_s and name == "capped" and walls else "—"
        cpu, rss = _med(r["cpu_s"] for r in mine), _med((r["rss_mib"] for r in mine), ".0f")
        lines.append(f"| `cache warm`, {name} (process) | {cell(walls)} {mb:,.0f} | {ratio} | "
                     f"{cpu} | {rss} |")
        inner = [r["out"]["elapsed_s"] for r in mine]
        mb = ds_bytes / statistics.median(inner) / 1e6 if inner else 0
        ratio = f"{mb / rate_mb_s:.2f}" if rate_mb_s and name == "capped" and inner else "—"
        lines.append(f"| `cache warm`, {name} (its elapsed_s) | {cell(inner)} {mb:,.0f} | "
                     f"{ratio} | | |")
    rereads = [r for r in ok if r["what"] == "reread"]
    keys = list(rereads[0]["out"]) if rereads else []
    for key in sorted(keys, key=lambda k: ("dropped" in k, k)):
        walls = [r["out"][key]["wall_s"] for r in rereads]
        mb = ds_bytes / statistics.median(walls) / 1e6
        lines.append(f"| re-read: {key} | {cell(walls, '.3f')} {mb:,.0f} | | "
                     f"{_med(r['out'][key]['cpu_s'] for r in rereads)} | |")
    for key in sorted(keys, key=lambda k: ("dropped" in k, k)):
        if key.startswith("local file"):
            continue
        base = key.replace(key.split(" · ")[0], "local file")
        ratios = [r["out"][key]["wall_s"] / r["out"][base]["wall_s"] for r in rereads]
        lines.append(f"| re-read ÷ local file, same round: {key} | {cell(ratios)} | | | |")
    big = f"{big_bytes / MiB:,.0f} MiB"
    for what, label in (("ttfb open", "`Cache.open().read(1 MiB)`"),
                        ("ttfb s5cmd", "`s5cmd cat`, first MiB (incl. process start)")):
        mine = [r for r in ok if r["what"] == what]
        firsts = [r.get("out", r)["first_s"] for r in mine]
        lines.append(f"| first byte: {label}, cold {big} | {cell(firsts, '.3f')} | | | |")
    for what, label in (("ttfb open", "`Cache.open()` streamed to the end"),
                        ("ttfb path", "`Cache.path()`: the whole object"),
                        ("ttfb s5cmd", "`s5cmd cat` to the end")):
        mine = [r for r in ok if r["what"] == what]
        walls = [r.get("out", r)["whole_s"] for r in mine]
        mb = big_bytes / statistics.median(walls) / 1e6 if walls else 0
        ratio = f"{mb / rate_mb_s:.2f}" if rate_mb_s and walls else "—"
        cpu = _med(r["cpu_s"] for r in mine) if what != "ttfb s5cmd" else ""
        lines.append(f"| whole: {label}, cold {big} | {cell(walls)} {mb:,.0f} | {ratio} | "
                     f"{cpu} | |")
    inits = [r["out"]["init_s"] for r in ok if r["what"].startswith("ttfb ") and "out" in r]
    if inits:
        lines.append(f"| `Cache(dir)` itself (new directory) | {cell(inits, '.3f')} | | | |")
    for r in runs:
        if not r["ok"]:
            lines.append(f"\nFAIL {r['what']} rep {r['rep']}: {r['why']}")
    return "\n".join(lines)


def merge(paths: list[Path]) -> int:
    """``--merge A.json B.json ...``: one table over the rounds of several runs' ``--json``
    (same sizes; the first one's link described)."""
    got = [json.loads(p.read_text()) for p in paths]
    a = argparse.Namespace(**got[0]["args"])
    a.repeat = sum(g["args"]["repeat"] for g in got)
    print(render([r for g in got for r in g["runs"]], a, got[0]["link"],
                 a.link_mbit / 8 if a.link_mbit else None, a.objects * a.object_mib * MiB,
                 a.big_mib * MiB, [x for g in got for x in g["loads"]], 0.0))
    return 0


def _med(vals: Any, fmt: str = ".2f") -> str:
    v = list(vals)
    return f"{statistics.median(v):{fmt}}" if v else ""


if __name__ == "__main__":
    sys.exit(main())
