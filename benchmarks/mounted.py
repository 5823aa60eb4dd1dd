"""The upload path onto a mounted target: a bucket mounted as a directory (FUSE, as Meta
Storage Direct mounts one into a pod), filled by ``mcsync sync``, ``cp -r`` and ``rclone copy``
from the same local tree. SeaweedFS on 127.0.0.1 and its ``weed mount`` (``testbed.fuse``);
every tool writes into a fresh directory of the mount, and its result is checked through the
S3 view of the bucket (every key there, with its size and bytes). Root and ``/dev/fuse`` only:
elsewhere it prints why and exits 0 (``benchmarks/README.md``, *Mounted target*).

    python benchmarks/mounted.py [--quick] [--workdir DIR] [--repeat N]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import statistics
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.append(str(Path(__file__).resolve().parents[1]))  # testbed/: not installed

from bench_measure import ProcResult, run_measured

from testbed.fuse import fuse_unavailable, weed_mount
from testbed.servers import seaweedfs

MiB = 1 << 20


def make_tree(root: Path, *, checkpoint_mib: int, small: int) -> dict[str, str]:
    """A checkpoint of four shards and ``small`` 16 KiB files; their MD5s by key."""
    rnd = os.urandom
    files = {f"ckpt/model-{i:05d}-of-00004.safetensors": checkpoint_mib * MiB // 4
             for i in range(1, 5)}
    files |= {f"data/part-{i:05d}.jsonl": 16 * 1024 for i in range(small)}
    sums = {}
    for key, size in files.items():
        path = root / key
        path.parent.mkdir(parents=True, exist_ok=True)
        data = rnd(size)
        path.write_bytes(data)
        sums[key] = hashlib.md5(data).hexdigest()
    return sums


def tools(src: Path, dst: Path) -> dict[str, list[str]]:
    py = sys.executable
    return {
        "mcsync": [py, "-m", "mcsync.cli.main", "sync", f"{src}/", str(dst), "-q"],
        "cp -r": ["cp", "-r", f"{src}/.", str(dst)],
        "rclone copy": ["rclone", "copy", "--config", os.devnull, "--transfers", "32",
                        str(src), str(dst)],
    }


def wrong_through_s3(client, bucket: str, prefix: str, sums: dict[str, str]) -> str | None:
    got = {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket,
                                                                   Prefix=prefix + "/"):
        for c in page.get("Contents", ()):
            key = c["Key"][len(prefix) + 1:]
            if key.startswith(".mcsync/"):
                continue
            body = client.get_object(Bucket=bucket, Key=c["Key"])["Body"].read()
            got[key] = hashlib.md5(body).hexdigest()
    if got != sums:
        bad = sorted(set(got) ^ set(sums) | {k for k in got if got[k] != sums.get(k)})
        return f"{len(bad)} keys differ through S3, e.g. {bad[:3]}"
    return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="64 MiB checkpoint, 200 small files")
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args(argv)
    reason = fuse_unavailable()
    if reason is not None:
        print(f"mounted target: skipped ({reason})")
        return 0
    if shutil.which("rclone") is None:
        print("note: no rclone on PATH; its row is left out", file=sys.stderr)
    ckpt_mib, small = (64, 200) if args.quick else (1024, 2000)
    with ExitStack() as stack:
        work = args.workdir or Path(stack.enter_context(
            tempfile.TemporaryDirectory(prefix="mcsync-mounted-")))
        src = work / "src"
        shutil.rmtree(src, ignore_errors=True)
        sums = make_tree(src, checkpoint_mib=ckpt_mib, small=small)
        total = sum((src / k).stat().st_size for k in sums)
        endpoint = stack.enter_context(seaweedfs(work / "seaweed"))
        endpoint.create_bucket("mounted")
        mnt = stack.enter_context(weed_mount(endpoint, "mounted", work / "mnt",
                                             workdir=work / "mount-state"))
        # The first file into a new bucket waits for its volumes to be made (~0.2 s, an
        # empty mcsync run's lock file measured it): paid here, not by whichever tool is first.
        (mnt / "warm").write_bytes(b"x")
        (mnt / "warm").unlink()
        client = endpoint.client()
        env = dict(os.environ) | {"PYTHONPATH": str(Path(__file__).resolve().parents[1])}
        rows: dict[str, list[ProcResult]] = {}
        for n in range(args.repeat):
            for name, argv_ in tools(src, mnt / "x").items():
                if shutil.which(argv_[0]) is None:
                    continue
                dst = mnt / f"{name.split()[0]}-{n}"
                argv_ = [a if a != str(mnt / "x") else str(dst) for a in argv_]
                if name == "cp -r":
                    dst.mkdir()
                log = work / "logs"
                log.mkdir(exist_ok=True)
                res = run_measured(argv_, env, stdout=log / f"{dst.name}.out",
                                   stderr=log / f"{dst.name}.err", timeout=1800)
                if res.returncode != 0:
                    print(f"{name}: exit {res.returncode}; see {log}", file=sys.stderr)
                    return 1
                wrong = wrong_through_s3(client, "mounted", dst.name, sums)
                if wrong:
                    print(f"{name}: {wrong}", file=sys.stderr)
                    return 1
                rows.setdefault(name, []).append(res)
    print(f"\nMounted target (weed mount of SeaweedFS on 127.0.0.1): {len(sums)} files, "
          f"{total / MiB:.0f} MiB, median of {args.repeat}; checked through S3\n")
    print("| tool | wall s | MiB/s | CPU s | peak RSS MiB |")
    print("|---|---:|---:|---:|---:|")
    for name, results in rows.items():
        wall = statistics.median(r.wall_s for r in results)
        cpu = statistics.median(r.cpu_s for r in results)
        rss = max(r.peak_rss_kib for r in results) / 1024
        print(f"| {name} | {wall:.2f} | {total / MiB / wall:.0f} | {cpu:.2f} | {rss:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
