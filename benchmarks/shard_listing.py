"""What one shard of an Indexed Job pays to list: ``--shard I/N`` at 100k keys, 1 and 8 shards.

A key is its shard's by a hash of the whole key (so one checkpoint directory's files spread
over the pods), so every shard must see every key of the source to find its own: each shard
lists the whole source. This measures what that costs per shard: ``mcsync plan
meta://synthetic/ EMPTY [--shard I/N]`` against a synthetic bucket (``testbed.synthetic``, a
child process, not counted) through the fault proxy, which counts the requests; an empty local
target costs no request. Each run is a child process measured as the other benchmarks
(``bench_measure.run_measured``); medians and ranges over ``--repeat`` runs::

    .venv/bin/python benchmarks/shard_listing.py                  # 100k keys, 1 and 8 shards
    .venv/bin/python benchmarks/shard_listing.py --keys 100000 --shards 1,8 --repeat 3
    .venv/bin/python benchmarks/shard_listing.py --rtt-ms 50   # every answer held 50 ms

"listing s" is the span the proxy saw the listing requests over: the first's arrival to the
last's, plus the held answer (``--rtt-ms``) of the last.

Everything listens on 127.0.0.1.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.append(str(Path(__file__).resolve().parents[1]))  # testbed/: not installed

from bench_measure import run_measured
from scale import env_for, mcsync_exe

from testbed.faultproxy import FaultProxy, Rule, Stall
from testbed.servers import S3Endpoint
from testbed.synthetic import synthetic_server


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--shards", default="1,8", help="shard counts, comma-separated")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--rtt-ms", type=float, default=0.0,
                        help="hold every answer back so long at the proxy (a remote S3)")
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="mcsync-shard-listing-"))
    logs, empty = work / "logs", work / "empty"
    logs.mkdir()
    print("| keys | RTT ms | shards | shard | requests | listing s, median (range) "
          "| wall s, median (range) | CPU s, median |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    rtt = [Rule(Stall(args.rtt_ms / 1000), name="rtt")] if args.rtt_ms else []
    try:
        with synthetic_server(args.keys, log_path=logs / "syn.log") as syn, FaultProxy(
                S3Endpoint(syn.url, syn.access_key, syn.secret_key), rtt).running() as proxy:
            env = env_for({**syn.meta_env(), "MCSYNC_META_ENDPOINT_URL": proxy.url},
                          work / "state")
            for count in (int(n) for n in args.shards.split(",")):
                for index in range(count):
                    shard = ["--shard", f"{index}/{count}"] if count > 1 else []
                    walls, cpus, requests, spans = [], [], [], []
                    for n in range(args.repeat):
                        shutil.rmtree(empty, ignore_errors=True)
                        seen = len(proxy.exchanges())
                        r = run_measured([mcsync_exe(), "plan", "meta://synthetic/",
                                          str(empty), *shard], env,
                                         stdout=logs / f"{count}-{index}-{n}.out",
                                         stderr=logs / f"{count}-{index}-{n}.err",
                                         timeout=1800)
                        if r.returncode != 0:
                            print(f"shard {index}/{count}: exit {r.returncode}, see {logs}",
                                  file=sys.stderr)
                            return 1
                        new = proxy.exchanges()[seen:]
                        ops = Counter(e.op for e in new)
                        lists = [e.t for e in new if e.op == "ListObjectsV2"]
                        spans.append(max(lists) - min(lists) + args.rtt_ms / 1000)
                        walls.append(r.wall_s)
                        cpus.append(r.cpu_s)
                        requests.append(sum(ops.values()))
                        print(f"  {index}/{count} #{n + 1}: {r.wall_s:.2f} s, {dict(ops)}",
                              file=sys.stderr)
                    print(f"| {args.keys} | {args.rtt_ms:g} | {count} | {index} | "
                          f"{statistics.median(requests):.0f} ({min(requests)}-{max(requests)})"
                          f" | {statistics.median(spans):.2f} ({min(spans):.2f}-{max(spans):.2f})"
                          " | "
                          f"{statistics.median(walls):.2f} ({min(walls):.2f}-{max(walls):.2f})"
                          f" | {statistics.median(cpus):.2f} |", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
