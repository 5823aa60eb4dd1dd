"""`mcsync` that SIGKILLs itself at a chosen instant, for the resume tests.

The command runs as shipped; only its seams differ (``mcsync.cli.main.Seams``): the stores it
opens are wrapped in ``mcsync.testing.faults`` rules, and the manifest it opens counts its
commits.

CRASH_AT=point:n kills the process the n-th time it reaches ``point``:

  list         after the n-th source listing entry
  put          before the n-th whole-object PUT        put-done       after it was acknowledged
  begin        after the n-th multipart upload was created (before it is journalled)
  part         before the n-th part is sent            part-done      after it was acknowledged
  piece        before the n-th piece of a part streamed into a file is written (S3 → local)
  copy         before the n-th part is copied at the target (UploadPartCopy, block delta)
  stage-part, stage-part-done, stage-complete, stage-complete-done
               the same for the staging objects of a block delta (under .mcsync/stage/)
  complete     before the n-th CompleteMultipartUpload complete-done  after it returned
  commit       at the n-th manifest commit (before it)
  lock         after the n-th write of the target lock object (1: taken; later: renewed)
  unlock       before the target lock object is deleted at the end of the run
  state        before the n-th upload of the manifest's copy to the target
  prune        before the n-th delete at the target (retention's, with --keep-last)
  prune-done   after it returned

DELAY_AT=op:seconds slows every call of a target operation down (``put_part:0.5``), for the
tests that stop a run while it is busy.

CRASH_ACKED=FILE receives the bytes the target acknowledged so far, rewritten on every ack, so
the test can tell how much a resumed run re-sent.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Any

from mcsync.cli.main import Seams, main
from mcsync.state.manifest import Manifest
from mcsync.stores.base import ReadStore
from mcsync.stores.registry import StoreOptions, open_store
from mcsync.testing.faults import Call, Faults, Rule, faulty

STATE = ".mcsync/*"
STAGE = ".mcsync/stage/*"

# point → the operations that reach it: (operation, phase, key glob, key glob skipped)
POINTS: dict[str, list[tuple[str, str, str, str | None]]] = {
    "put": [("put", "before", "*", STATE)],
    "put-done": [("put", "after", "*", STATE)],
    "begin": [("open_upload", "after", "*", STAGE)],
    "part": [("put_part", "before", "*", STAGE)],
    "part-done": [("put_part", "after", "*", STAGE), ("part_written", "after", "*", STAGE)],
    "piece": [("write_at", "before", "*", STAGE)],
    "copy": [("copy_part", "before", "*", None)],
    "stage-part": [("put_part", "before", STAGE, None)],
    "stage-part-done": [("put_part", "after", STAGE, None)],
    "stage-complete": [("complete", "before", STAGE, None)],
    "stage-complete-done": [("complete", "after", STAGE, None)],
    "complete": [("complete", "before", "*", STAGE)],
    "complete-done": [("complete", "after", "*", STAGE)],
    "lock": [("put", "after", ".mcsync/lock-*", None)],
    "unlock": [("delete", "before", ".mcsync/lock-*", None)],
    "state": [("put", "before", ".mcsync/manifest-*", None)],
    "prune": [("delete", "before", "*", STATE)],
    "prune-done": [("delete", "after", "*", STATE)],
}


def kill(_: Call | None = None) -> None:
    os.kill(os.getpid(), signal.SIGKILL)


class KillAt:
    """Kills the process the n-th time any of its rules fires."""

    def __init__(self, nth: int) -> None:
        self.left = nth

    def __call__(self, _: Call) -> None:
        self.left -= 1
        if self.left == 0:
            kill()


class Acked:
    """Bytes the target acknowledged (whole PUTs and parts, not mcsync's own state)."""

    def __init__(self, path: str | None) -> None:
        self.path = path
        self.total = 0

    def __call__(self, call: Call) -> None:
        self.total += call.nbytes
        if self.path:  # replaced whole: a kill from a worker thread may come mid-write
            with open(self.path + ".new", "w") as f:
                f.write(str(self.total))
            os.replace(self.path + ".new", self.path)


def target_faults() -> Faults:
    point, nth = os.environ.get("CRASH_AT", "none:0").split(":")
    faults = Faults()
    at = KillAt(int(nth))
    for op, phase, key, skip in POINTS.get(point, ()):
        faults.add(Rule(op, key, phase, times=None, skip=skip, action=at))  # type: ignore[arg-type]
    acked = Acked(os.environ.get("CRASH_ACKED"))
    for op in ("put", "put_part", "part_written"):
        faults.add(Rule(op, "*", "after", times=None, skip=STATE, action=acked))
    if "DELAY_AT" in os.environ:
        op, seconds = os.environ["DELAY_AT"].split(":")
        faults.add(Rule(op, times=None, delay_s=float(seconds)))
    return faults


def source_faults() -> Faults:
    point, nth = os.environ.get("CRASH_AT", "none:0").split(":")
    faults = Faults()
    if point == "list":
        faults.add(Rule("list", phase="after", nth=int(nth), action=kill))
    return faults


class CrashingManifest(Manifest):
    commits = 0

    def commit(self) -> None:
        point, nth = os.environ.get("CRASH_AT", "none:0").split(":")
        CrashingManifest.commits += 1
        if point == "commit" and CrashingManifest.commits == int(nth):
            kill()
        super().commit()


def open_source(url: str, options: StoreOptions) -> ReadStore:
    return faulty(open_store(url, options), source_faults())


def open_target(url: str, options: StoreOptions) -> ReadStore:
    return faulty(open_store(url, options), target_faults())


def open_manifest(path: Path, src: str, dst: str) -> Any:
    return CrashingManifest(path, src, dst)


if __name__ == "__main__":
    sys.argv[0] = "mcsync"
    sys.exit(main(Seams(open_source, open_target, open_manifest)))
