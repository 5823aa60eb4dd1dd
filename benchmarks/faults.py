"""What mcsync keeps under faults: one 60-object set synced to SeaweedFS through the fault proxy
(``testbed.faultproxy``), once per fault kind, against a fault-free run in the same
process. Prints a table: fault, runs, objects, bytes, objects lost or corrupt (read back and
compared byte for byte), wall time (median), throughput as a share of the fault-free run,
and what the report said (throttled, retried, fewest requests in flight).

    python benchmarks/faults.py [--repeat 2] [--big-mib 200]

Loopback only (127.0.0.1). What it measures: benchmarks/README.md; figures and their reading:
benchmarks/results/ (the last run: 2026-12-01.md).
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parents[1]))  # testbed/: not installed

import mcsync
from testbed.faultproxy import (
    INTERNAL_ERROR,
    SLOW_DOWN,
    TOO_MANY_REQUESTS,
    UPLOADS,
    FaultProxy,
    Reset,
    Rule,
    ShortBody,
    Stall,
)
from testbed.servers import S3Endpoint, seaweedfs

MiB = 1 << 20

# name -> the rules of one run
SCENARIOS: dict[str, Callable[[], list[Rule]]] = {
    "none": lambda: [],
    "SlowDown 20%": lambda: [Rule(SLOW_DOWN, probability=0.20)],
    "429 20%": lambda: [Rule(TOO_MANY_REQUESTS, probability=0.20)],
    "500 5%": lambda: [Rule(INTERNAL_ERROR, probability=0.05)],
    "reset mid-body 5%": lambda: [Rule(Reset("request"), op=UPLOADS, probability=0.05)],
    "short response body 5%": lambda: [Rule(ShortBody(), op="GetObject", probability=0.05)],
    "stall 2% (3 s)": lambda: [Rule(Stall(3), probability=0.02)],
    "SlowDown 100% for 10 s": lambda: [Rule(SLOW_DOWN, for_s=10)],
    "all of the above mixed": lambda: [
        Rule(SLOW_DOWN, probability=0.20), Rule(Reset("request"), op=UPLOADS, probability=0.05),
        Rule(Stall(3), probability=0.02), Rule(INTERNAL_ERROR, probability=0.03)],
}


def dataset(big_mib: int) -> dict[str, bytes]:
    rng = random.Random(60)
    objects = {f"data/small/{i:02d}.bin": rng.randbytes(rng.randint(1, 512) * 1024)
               for i in range(55)}
    objects |= {f"data/mp/{n}MiB.bin": rng.randbytes(n * MiB + 99) for n in (12, 14, 17, 20)}
    objects["data/big.bin"] = rng.randbytes(big_mib * MiB)
    return objects


def write_tree(root: Path, objects: dict[str, bytes]) -> None:
    for key, data in objects.items():
        path = root / key
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


def read_back(ep: S3Endpoint, bucket: str, objects: dict[str, bytes]) -> int:
    """Objects missing or not byte-identical at the target."""
    client = ep.client()
    bad = 0
    for key, data in objects.items():
        try:
            got = client.get_object(Bucket=bucket, Key=key)["Body"].read()
        except client.exceptions.NoSuchKey:
            got = None
        bad += got != data
    return bad


def one(ep: S3Endpoint, proxy: FaultProxy, src: Path, objects: dict[str, bytes], n: int,
        rules: list[Rule]) -> tuple[float, int, mcsync.SyncReport]:
    bucket = f"faults-{n}-{os.getpid()}"
    ep.client().create_bucket(Bucket=bucket)
    proxy.clear()
    proxy.seed = n
    for rule in rules:
        proxy.add(rule, from_now=True)
    for k, v in proxy.endpoint.meta_env().items():
        os.environ[k] = v
    with tempfile.TemporaryDirectory() as state:
        start = time.monotonic()
        report = mcsync.sync(str(src), f"meta://{bucket}/", manifest=f"{state}/m.sqlite")
        elapsed = time.monotonic() - start
    return elapsed, read_back(ep, bucket, objects), report


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--big-mib", type=int, default=200)
    ap.add_argument("--only", nargs="*", help="scenario names (default: all)")
    args = ap.parse_args()
    objects = dataset(args.big_mib)
    total = sum(map(len, objects.values()))
    with tempfile.TemporaryDirectory() as tmp, seaweedfs(Path(tmp) / "weed") as ep:
        src = Path(tmp) / "src"
        write_tree(src, objects)
        with FaultProxy(ep).running() as proxy:
            rows, baseline, n = [], None, 0
            for name, rules in SCENARIOS.items():
                if args.only and name not in args.only and name != "none":
                    continue
                times, bad, reports = [], 0, []
                for _ in range(args.repeat):
                    n += 1
                    elapsed, lost, report = one(ep, proxy, src, objects, n, rules())
                    times.append(elapsed)
                    bad += lost
                    reports.append(report)
                med = statistics.median(times)
                baseline = baseline or med
                ok = sum(r.exit_code == 0 for r in reports)
                rows.append((name, args.repeat, len(objects), total, bad, ok, med, baseline / med,
                             max(r.requests_throttled for r in reports),
                             max(r.requests_retried for r in reports),
                             min((r.requests_in_flight_low or 128) for r in reports)))
    print(f"{'fault':<26} {'runs':>4} {'objects':>7} {'MiB':>6} {'lost/corrupt':>12} "
          f"{'exit 0':>6} {'wall s':>7} {'kept':>6} {'throttled':>9} {'retried':>7} "
          f"{'low':>4}")
    for (name, runs, nobj, size, bad, ok, med, share, thr, ret, low) in rows:
        print(f"{name:<26} {runs:>4} {nobj:>7} {size / MiB:>6.0f} {bad:>12} {ok:>6} {med:>7.2f} "
              f"{share:>6.0%} {thr:>9} {ret:>7} {low:>4}")


if __name__ == "__main__":
    main()
