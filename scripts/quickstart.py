"""The quickstart's body (see quickstart.sh): embedded Meta Storage, sample data, one sync."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

# The local SeaweedFS comes from testbed/, which the wheel does not ship: the quickstart runs
# from a checkout, so it finds it there.
sys.path.append(str(Path(__file__).resolve().parents[1]))

from mcsync.chunking import header_length, parse_safetensors
from testbed.servers import seaweedfs

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / ".quickstart"
BUCKET = "ckpt-store"


def run(*cmd: str, env: dict[str, str]) -> None:
    print("$", " ".join(cmd), flush=True)
    subprocess.run(cmd, env=env, check=False)


def show_report(report: dict) -> None:
    """The JSON report, with its per-object list cut to a few entries."""
    objects = report.pop("objects")
    report["objects"] = objects[:3] + ([f"... {len(objects) - 3} more"] if len(objects) > 3
                                       else [])
    print(json.dumps(report, indent=2), flush=True)


def main() -> int:
    if WORK.exists():
        shutil.rmtree(WORK)
    sample = WORK / "sample"
    subprocess.run([sys.executable, str(ROOT / "scripts" / "make_sample_data.py"), str(sample)],
                   check=True)
    mcsync = str(Path(sys.executable).with_name("mcsync"))
    with seaweedfs(WORK / "seaweedfs") as meta:
        meta.create_bucket(BUCKET)
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("AWS_", "MCSYNC_"))}
        env.update(meta.meta_env())
        print(f"Meta Storage (SeaweedFS) on {meta.url}, bucket {BUCKET}\n", flush=True)
        dst = f"meta://{BUCKET}/demo/"
        run(mcsync, "plan", str(sample), dst, env=env)
        print("$", mcsync, "sync", sample, dst, "--json", flush=True)
        out = subprocess.run([mcsync, "sync", str(sample), dst, "--json"], env=env,
                             stdout=subprocess.PIPE, text=True, check=False).stdout
        show_report(json.loads(out))
        print("$", mcsync, "ls", dst, flush=True)
        listing = subprocess.run([mcsync, "ls", dst], env=env, stdout=subprocess.PIPE,
                                 text=True, check=False).stdout.splitlines()
        print("\n".join(listing[:10] + ([f"   ... {len(listing) - 10} more"]
                                        if len(listing) > 10 else [])), flush=True)
        print("\nA second run finds nothing to do:", flush=True)
        run(mcsync, "sync", str(sample), dst, env=env)
        names = fine_tune(sample / "model.safetensors")
        print(f"\nA fine-tuning step rewrites {', '.join(names)}; the plan shows what changed, "
              "and the sync sends only that (the target copies the rest from the version it "
              "holds):", flush=True)
        run(mcsync, "plan", str(sample), dst, env=env)
        run(mcsync, "sync", str(sample), dst, env=env)
    return 0


def fine_tune(checkpoint: Path) -> list[str]:
    """Overwrite two tensors of the sample checkpoint in place with new bytes."""
    data = checkpoint.read_bytes()
    header = parse_safetensors(data[:header_length(data[:8], len(data))], len(data))
    chosen = [header.tensors[1], header.tensors[len(header.tensors) // 2]]
    with checkpoint.open("r+b") as f:
        for t in chosen:
            f.seek(t.start)
            f.write(os.urandom(t.end - t.start))
    return [t.name for t in chosen]


if __name__ == "__main__":
    sys.exit(main())
