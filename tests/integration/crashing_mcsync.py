"""`mcsync` that SIGKILLs itself at a chosen instant, for the resume tests.

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

CRASH_ACKED=FILE receives the bytes the target acknowledged so far, rewritten on every ack, so
the test can tell how much a resumed run re-sent.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

import mcsync.engine
import mcsync.manifest
from mcsync.cli.main import main
from mcsync.stores.registry import open_store

POINT, NTH = os.environ["CRASH_AT"].split(":")
COUNTS: dict[str, int] = {}
ACKED = [0]


def reach(point: str) -> None:
    COUNTS[point] = COUNTS.get(point, 0) + 1
    if point == POINT and COUNTS[point] == int(NTH):
        os.kill(os.getpid(), signal.SIGKILL)


def acked(n: int) -> None:
    ACKED[0] += n
    path = os.environ.get("CRASH_ACKED")
    if path:  # replaced whole: a kill from a worker thread may come mid-write
        with open(path + ".new", "w") as f:
            f.write(str(ACKED[0]))
        os.replace(path + ".new", path)


class CrashingUpload:
    def __init__(self, inner: Any, points: str = "") -> None:
        self._inner = inner
        self._points = points  # "stage-" for a delta's staging objects
        self.upload_id = inner.upload_id

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def put_part(self, number: int, offset: int, data: Any) -> Any:
        reach(self._points + "part")
        ref = await self._inner.put_part(number, offset, data)
        acked(len(data))
        reach(self._points + "part-done")
        return ref

    def write_at(self, offset: int, data: Any) -> None:  # streamed parts (worker thread)
        reach(self._points + "piece")
        self._inner.write_at(offset, data)

    def part_written(self, number: int, size: int) -> Any:
        ref = self._inner.part_written(number, size)
        acked(size)
        reach(self._points + "part-done")
        return ref

    async def copy_part(self, *args: Any) -> Any:
        reach("copy")
        return await self._inner.copy_part(*args)

    async def complete(self, parts: Any) -> Any:
        reach(self._points + "complete")
        info = await self._inner.complete(parts)
        reach(self._points + "complete-done")
        return info


class CrashingStore:
    """Wraps the target store."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def put(self, key: str, data: Any, **kw: Any) -> Any:
        if key.startswith(".mcsync/"):
            return await self._inner.put(key, data, **kw)
        reach("put")
        info = await self._inner.put(key, data, **kw)
        acked(len(data))
        reach("put-done")
        return info

    async def open_upload(self, key: str, size: int, **kw: Any) -> Any:
        if key.startswith(".mcsync/stage/"):
            return CrashingUpload(await self._inner.open_upload(key, size, **kw), "stage-")
        upload = CrashingUpload(await self._inner.open_upload(key, size, **kw))
        reach("begin")
        return upload

    async def resume_upload(self, *args: Any, **kw: Any) -> Any:
        upload = await self._inner.resume_upload(*args, **kw)
        return CrashingUpload(upload) if upload is not None else None


class CountingSource:
    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def list(self) -> Any:
        async for info in self._inner.list():
            yield info
            reach("list")


_opened: list[str] = []


def crashing_open_store(url: str, options: Any) -> Any:
    store = open_store(url, options)
    _opened.append(url)
    return CountingSource(store) if len(_opened) % 2 == 1 else CrashingStore(store)


_commit = mcsync.manifest.Manifest.commit


def crashing_commit(self: Any) -> None:
    reach("commit")
    _commit(self)


mcsync.engine.open_store = crashing_open_store  # type: ignore[assignment]
mcsync.manifest.Manifest.commit = crashing_commit  # type: ignore[method-assign]

if __name__ == "__main__":
    sys.argv[0] = "mcsync"
    sys.exit(main())
