"""The watch's lag and retention's prune, on SeaweedFS (127.0.0.1).

Lag: ``mcsync sync SRC meta://bucket/ --watch --interval 60s`` (the default ``--min-age``, 30 s)
beside a writer that, every few seconds, writes a checkpoint (two files, then its marker by
rename: PyTorch DCP's ``.metadata``, or with ``--framework hf`` the Trainer's
``trainer_state.json``) into the local SRC; the lag is from the marker's rename at the source
to the marker answering a HEAD at the target (polled every 50 ms). ``--code DIR`` runs
the command from another tree (``git archive <commit> | tar -x -C DIR``: the code before).

Prune: a bucket holding N checkpoints of F files each (all of them at the target already, as a
sync without retention left them); then ``mcsync sync --keep-last 2`` (the scan and the prune
of N - 2 checkpoints), against the same no-op sync without ``--keep-last`` (the listing that any
run costs), and a second ``--keep-last`` run with nothing left to prune (what retention adds to
each run: a scan of the target and of the source).

    python benchmarks/retention.py [--steps 5] [--checkpoints 50] [--files 20] [--code DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parents[1]))  # testbed/: not installed

from testbed.servers import S3Endpoint, seaweedfs

MiB = 1 << 20


def command(code: Path | None) -> tuple[list[str], dict[str, str]]:
    env = dict(os.environ)
    if code is not None:
        env["PYTHONPATH"] = str(code)
    return [sys.executable, "-m", "mcsync.cli.main"], env


LAYOUTS = {  # framework: (directory, first file, second file, marker)
    "dcp": ("step-{}", "__0_0.distcp", "__1_0.distcp", ".metadata"),
    "hf": ("checkpoint-{}", "model.safetensors", "optimizer.pt", "trainer_state.json"),
}


def lag(ep: S3Endpoint, steps: int, code: Path | None, size: int,
        framework: str = "dcp") -> list[float]:
    bucket = f"lag-{uuid.uuid4().hex[:8]}"
    ep.create_bucket(bucket)
    client = ep.client()
    out: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "ckpt"
        src.mkdir()
        argv, env = command(code)
        env |= ep.meta_env()
        # From the other tree's directory: ``-m`` puts the working directory first on the path.
        proc = subprocess.Popen([*argv, "sync", str(src), f"meta://{bucket}/", "--watch",
                                 "--interval", "60s", "--manifest", f"{tmp}/m.sqlite"],
                                env=env, cwd=code or Path.cwd(), stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True)
        try:
            time.sleep(4)  # the first cycle, of an empty source
            for step in range(1, steps + 1):
                name, first, second, marker = LAYOUTS[framework]
                d = src / name.format(step * 100)
                d.mkdir()
                (d / first).write_bytes(os.urandom(size))
                (d / second).write_bytes(os.urandom(size // 2))
                tmp_marker = d / (marker + ".tmp")
                tmp_marker.write_text(json.dumps({"global_step": step * 100}))
                os.replace(tmp_marker, d / marker)
                written = time.time()
                key = f"{d.name}/{marker}"
                while True:
                    try:
                        client.head_object(Bucket=bucket, Key=key)
                        break
                    except client.exceptions.ClientError:
                        if time.time() - written > 120:
                            raise RuntimeError(f"{key} not at the target after 120 s") from None
                        time.sleep(0.05)
                out.append(time.time() - written)
                print(f"  step {step}: {out[-1]:.2f} s", flush=True)
                time.sleep(3)
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.communicate(timeout=60)
    return out


def prune(ep: S3Endpoint, checkpoints: int, files: int, size: int) -> dict[str, float]:
    bucket = f"prune-{uuid.uuid4().hex[:8]}"
    ep.create_bucket(bucket)
    argv, env = command(None)
    env |= ep.meta_env()
    timings: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "ckpt"
        for n in range(1, checkpoints + 1):
            d = src / f"checkpoint-{n * 100}"
            d.mkdir(parents=True)
            for f in range(files):
                (d / f"shard-{f:03d}.bin").write_bytes(os.urandom(size))
            (d / "trainer_state.json").write_text("{}")
        base = [*argv, "sync", str(src), f"meta://{bucket}/", "--json", "--quiet",
                "--manifest", f"{tmp}/m.sqlite"]

        def run(*extra: str) -> dict[str, object]:
            start = time.monotonic()
            done = subprocess.run([*base, *extra], env=env, capture_output=True, text=True,
                                  check=True)
            report: dict[str, object] = json.loads(done.stdout)
            report["wall_s"] = time.monotonic() - start
            return report

        run()  # everything at the target
        noop = run()
        first = run("--keep-last", "2")
        again = run("--keep-last", "2")
        timings = {"no-op sync, no retention": float(noop["wall_s"]),  # type: ignore[arg-type]
                   "--keep-last 2, pruning": float(first["wall_s"]),  # type: ignore[arg-type]
                   "--keep-last 2, nothing to prune": float(again["wall_s"]),  # type: ignore[arg-type]
                   "checkpoints pruned": float(first["checkpoints_pruned"]),  # type: ignore[arg-type]
                   "objects pruned": float(first["objects_pruned"])}  # type: ignore[arg-type]
    return timings


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--checkpoints", type=int, default=50)
    parser.add_argument("--files", type=int, default=20)
    parser.add_argument("--size-mib", type=float, default=8.0,
                        help="the lag's model file (the optimizer half of it)")
    parser.add_argument("--code", type=Path, default=None,
                        help="run the lag's command from this tree (the code before)")
    parser.add_argument("--skip-prune", action="store_true")
    parser.add_argument("--framework", choices=sorted(LAYOUTS), default="dcp")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work, seaweedfs(Path(work)) as ep:
        print(f"lag, {args.framework} marker at the source -> marker at the target "
              f"({args.steps} steps, "
              f"{args.size_mib * 1.5:.0f} MiB each, --interval 60s, --min-age 30s)"
              + (f", code from {args.code}" if args.code else ""), flush=True)
        lags = lag(ep, args.steps, args.code, int(args.size_mib * MiB), args.framework)
        print(f"lag: median {statistics.median(lags):.2f} s, max {max(lags):.2f} s")
        if not args.skip_prune:
            print(f"prune: {args.checkpoints} checkpoints x {args.files + 1} files at the "
                  "target", flush=True)
            for name, value in prune(ep, args.checkpoints, args.files, 4096).items():
                print(f"  {name}: {value:.2f}" + ("" if "pruned" in name else " s"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
