"""The command line of benchmarks/run.py: its options and the names of paths and sets."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bench_data import DATASETS
from bench_tools import ASKED_FOR, TOOLS

REPO = Path(__file__).resolve().parent.parent
FRESH_PATHS = ("upload", "download", "server-copy", "cross")
PATHS = (
    *FRESH_PATHS, "resync-noop", "gs-to-meta", "az-to-meta", "delta-s3", "delta-local",
    "delta-newstep",
)  # fmt: skip
# A first sync of the same source and target (untimed), then the timed re-sync.
RESYNC_PATHS = ("resync-noop", "delta-s3", "delta-local", "delta-newstep")
NOOP_SETS = ("small", "shards", "midsize", "mixed")  # resync-noop runs on these
DELTA_SETS = ("checkpoint",)  # delta-s3 and delta-local run on these, once per mutation
# delta-newstep: the set is step-1/ of a checkpoint directory; step-2/ (~3% of the tensor bytes
# rewritten, every other byte as in step-1) is added after the first sync and synced, timed.
NEWSTEP_SETS = ("mixed",)
NEWSTEP_FRACTION = 0.03
NEWSTEP = "new-step"  # its mutation: the table is mixed+new-step
CLOUD_PATHS = ("gs-to-meta", "az-to-meta")  # from a GCS / Azure server to B
S3_SOURCE_PATHS = ("download", "server-copy", "cross", *CLOUD_PATHS)  # need bench-src on A
SERVER_B_PATHS = ("cross", *CLOUD_PATHS)
# With --link-mbit these write to B (behind the capped link) instead of A: with cross, the paths
# of a migration across clouds.
LINK_PATHS = ("upload", "resync-noop", "delta-s3", "delta-newstep")
# With --rtt-ms these write to R: B seen through a proxy that holds every answer back. The
# proxy is Python in the harness's process, so only paths bound by requests, not bytes, use it.
RTT_PATHS = ("resync-noop", "delta-s3", "delta-newstep")
S3_REF = "mcsync s3→meta"  # the cloud paths' reference row: mcsync, s3 A → meta B (as cross)
SOURCE_BUCKET = "bench-src"
PROBE_KEY = ".bench-probe"
TARGET_PREFIX = "t-"  # every timed run's target bucket: t-<path>-<set>-<tool>-<rep>-<nonce>
MIB = 1 << 20


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def csv_choice(allowed: tuple[str, ...]):
    def parse(text: str) -> list[str]:
        items = [t.strip() for t in text.split(",") if t.strip()]
        bad = [t for t in items if t not in allowed]
        if bad or not items:
            raise argparse.ArgumentTypeError(
                f"expected a comma-separated subset of {','.join(allowed)}, got {text!r}"
            )
        return [a for a in allowed if a in items]  # canonical order, no duplicates

    return parse


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="benchmarks/run.py",
        description="Benchmark mcsync against s5cmd, rclone and aws s3 sync on loopback SeaweedFS.",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="small data: 256 MiB, 8 x 32 MiB, 1,000 x 16 KiB, 16 x 16 MiB, ~256 MiB",
    )
    p.add_argument(
        "--repeat",
        type=int,
        default=3,
        metavar="N",
        help="timed runs per tool (default 3; medians reported)",
    )
    p.add_argument(
        "--only",
        type=csv_choice(PATHS),
        default=list(PATHS),
        metavar="PATH,...",
        help=f"paths to run (default all: {','.join(PATHS)})",
    )
    p.add_argument(
        "--tools",
        type=csv_choice(tuple(TOOLS)),
        default=[t for t in TOOLS if t not in ASKED_FOR],
        metavar="TOOL,...",
        help=f"tools to run (default: {','.join(t for t in TOOLS if t not in ASKED_FOR)}; "
        f"run only when named: {','.join(ASKED_FOR)}, benchmarks/floor.py)",
    )
    p.add_argument(
        "--data",
        type=csv_choice(DATASETS),
        default=list(DATASETS),
        metavar="SET,...",
        help=f"data sets (default all: {','.join(DATASETS)})",
    )
    p.add_argument(
        "--link-mbit",
        type=int,
        metavar="N",
        help="run SeaweedFS B in a network namespace behind a veth pair capped at N Mbit/s each"
        " way (HTB; root only, else skipped with a note) and write the upload, resync-noop,"
        " delta-s3 and delta-newstep targets to B",
    )
    p.add_argument(
        "--rtt-ms",
        type=int,
        metavar="N",
        help="write the resync-noop, delta-s3 and delta-newstep targets to SeaweedFS B through"
        " mcsync's fault proxy, which holds every answer back N ms: a round trip of a WAN",
    )
    p.add_argument(
        "--workdir",
        type=Path,
        metavar="DIR",
        help="keep data, servers and logs here (data is reused by the next run with the same"
        " sizes); default: a temporary directory, removed at the end",
    )
    p.add_argument(
        "--json",
        type=Path,
        metavar="OUT",
        help="write every run (raw numbers, command lines) and the medians as JSON",
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=1800,
        metavar="S",
        help="kill a run after this many seconds and mark it FAIL (default 1800)",
    )
    p.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="print each command line (with its environment) before running it",
    )
    args = p.parse_args(argv)
    if args.repeat < 1:
        p.error("--repeat must be at least 1")
    if args.link_mbit is not None and args.link_mbit < 1:
        p.error("--link-mbit must be at least 1")
    if args.rtt_ms is not None and args.rtt_ms < 1:
        p.error("--rtt-ms must be at least 1")
    return args
