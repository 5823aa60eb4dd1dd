"""Run one command as a child process and measure it; list and compare targets.

Client CPU is the tool's own ``os.wait4`` rusage: on Linux it covers the tool and every
descendant it waited for (``aws`` is one Python process, ``env -u X rclone`` execs rclone in
the same process). Peak RSS is the larger of ``ru_maxrss`` (the largest resident set of any
*one* process of that tree, exact) and the peak of the whole tree's summed RSS, sampled by the
launcher every 0.1 s from /proc (which catches several processes at once). The tool is forked
by a small launcher (``testbed/rusage.py``) rather than by this process, because a child
inherits its parent's pre-exec RSS high-water mark into ``ru_maxrss`` (see the launcher's
docstring).
The SeaweedFS servers are *not* the client: their CPU is sampled separately with psutil.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from testbed.rusage import launcher_argv

try:
    import psutil
except ImportError:  # psutil is in the bench extra; without it there is no server CPU column
    psutil = None

# Keys a tool may keep next to the data it wrote (mcsync's manifest copy); not counted.
IGNORED_PREFIXES = (".mcsync/",)


@dataclass
class ProcResult:
    returncode: int | None  # None: killed after the timeout
    wall_s: float
    user_s: float
    sys_s: float
    maxrss_kib: int  # ru_maxrss: the largest RSS of one process of the tree
    timed_out: bool
    tree_rss_peak_kib: int | None = None  # sampled peak of the tree's summed RSS
    tree_procs_max: int | None = None  # most processes of the tree seen at once
    tool_hwm_kib: int | None = None  # the tool's own peak RSS (VmHWM), without its children

    @property
    def cpu_s(self) -> float:
        return self.user_s + self.sys_s

    @property
    def peak_rss_kib(self) -> int:
        """The tool's peak RSS: ``ru_maxrss``, or the sampled tree sum where that is larger."""
        return max(self.maxrss_kib, self.tree_rss_peak_kib or 0)


def run_measured(
    argv: list[str],
    env: Mapping[str, str],
    *,
    stdout: Path,
    stderr: Path,
    timeout: float,
    cwd: Path | None = None,
) -> ProcResult:
    """Run ``argv`` (through the launcher, in a session of its own) and return its costs.

    Dirty pages are written back first (untimed): otherwise a run pays for the writeback of
    what the run before it wrote (a 2 GiB target, the servers' volumes). Measured here, a 2 GiB
    download: s5cmd 1.67-1.83 s and mcsync 2.11-2.30 s after a ``sync``, 1.96-3.00 s and
    2.45-3.51 s without one."""
    os.sync()
    timed_out = threading.Event()
    report = stdout.with_name(stdout.stem + ".rusage.json")
    report.unlink(missing_ok=True)
    launcher = launcher_argv(report, argv)
    with open(stdout, "wb") as out, open(stderr, "wb") as err:
        start = time.perf_counter()
        proc = subprocess.Popen(
            launcher,
            env=dict(env),
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=err,
            start_new_session=True,
        )

        def kill_group() -> None:
            timed_out.set()
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)

        timer = threading.Timer(timeout, kill_group)
        timer.daemon = True
        timer.start()
        try:
            _, status, ru = os.wait4(proc.pid, 0)
        except BaseException:
            # Ctrl-C or similar: do not leave the tool running.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(proc.pid, 0)
            proc.returncode = -9
            raise
        finally:
            timer.cancel()
        wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here; Popen must not wait
    try:
        inner = json.loads(report.read_text())
    except (OSError, ValueError):
        # Launcher killed (timeout) or broken: fall back to the outer numbers (RSS floored at
        # this process's size, see the module docstring).
        inner = {
            "returncode": proc.returncode,
            "wall_s": wall,
            "user_s": ru.ru_utime,
            "sys_s": ru.ru_stime,
            "maxrss_kib": ru.ru_maxrss,
        }
    return ProcResult(
        returncode=None if timed_out.is_set() else inner["returncode"],
        wall_s=inner["wall_s"],
        user_s=inner["user_s"],
        sys_s=inner["sys_s"],
        maxrss_kib=inner["maxrss_kib"],
        timed_out=timed_out.is_set(),
        tree_rss_peak_kib=inner.get("tree_rss_peak_kib"),
        tree_procs_max=inner.get("tree_procs_max"),
        tool_hwm_kib=inner.get("tool_hwm_kib"),
    )


class ServerCpu:
    """CPU seconds used by this process's ``weed`` descendants (the SeaweedFS servers)."""

    def __init__(self) -> None:
        self._procs: dict[int, object] = {}

    def _weeds(self) -> Iterable[object]:
        if psutil is None:
            return []
        found = []
        for p in psutil.Process().children(recursive=True):
            try:
                if "weed" in p.name():
                    found.append(self._procs.setdefault(p.pid, p))
            except psutil.Error:
                continue
        return found

    def total(self) -> float | None:
        if psutil is None:
            return None
        total = 0.0
        for p in self._weeds():
            try:
                t = p.cpu_times()  # type: ignore[attr-defined]
            except psutil.Error:
                continue
            total += t.user + t.system + t.children_user + t.children_system
        return total


def tail(path: Path, lines: int = 3, width: int = 300) -> str:
    """Last non-empty lines of a log file, joined, for a one-line failure reason."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    # Skip lines of bare punctuation (the end of a pretty-printed structure or traceback).
    kept = [ln.strip() for ln in text.splitlines() if sum(c.isalnum() for c in ln) >= 3]
    kept = kept[-lines:]
    joined = " | ".join(kept)
    return joined if len(joined) <= width else "…" + joined[-width:]


def _ignored(key: str) -> bool:
    return any(key.startswith(p) for p in IGNORED_PREFIXES)


def list_local(root: Path) -> dict[str, int]:
    """Relative POSIX path → size for every regular file under ``root``."""
    found: dict[str, int] = {}
    if not root.exists():
        return found
    for dirpath, _dirnames, filenames in os.walk(root):
        for name in filenames:
            full = Path(dirpath) / name
            rel = full.relative_to(root).as_posix()
            if not _ignored(rel):
                found[rel] = full.stat().st_size
    return found


def list_s3(client, bucket: str, prefix: str = "") -> dict[str, int]:
    """Key (relative to ``prefix``) → size for every object under ``bucket/prefix``."""
    found: dict[str, int] = {}
    paginator = client.get_paginator("list_objects_v2")
    for page in paginator.paginate(Bucket=bucket, Prefix=prefix):
        for obj in page.get("Contents", []):
            rel = obj["Key"][len(prefix) :]
            if not _ignored(rel):
                found[rel] = obj["Size"]
    return found


def compare(expected: Mapping[str, int], got: Mapping[str, int]) -> str | None:
    """None when ``got`` holds exactly the expected keys and sizes, else a one-line reason."""
    if dict(expected) == dict(got):
        return None
    missing = sorted(set(expected) - set(got))
    extra = sorted(set(got) - set(expected))
    wrong = sorted(k for k in set(expected) & set(got) if expected[k] != got[k])
    parts = [
        f"target has {len(got)}/{len(expected)} objects, "
        f"{sum(got.values()):,}/{sum(expected.values()):,} bytes"
    ]
    for label, keys in (("missing", missing), ("unexpected", extra), ("wrong size", wrong)):
        if keys:
            shown = ", ".join(keys[:3]) + (f" (+{len(keys) - 3})" if len(keys) > 3 else "")
            parts.append(f"{label}: {shown}")
    return "; ".join(parts)


def empty_bucket(client, bucket: str) -> None:
    """Delete every object and open multipart upload in ``bucket``, then the bucket itself."""
    with contextlib.suppress(Exception):
        for page in client.get_paginator("list_multipart_uploads").paginate(Bucket=bucket):
            for up in page.get("Uploads", []):
                with contextlib.suppress(Exception):
                    client.abort_multipart_upload(
                        Bucket=bucket, Key=up["Key"], UploadId=up["UploadId"]
                    )
    paginator = client.get_paginator("list_objects_v2")
    for page in paginator.paginate(Bucket=bucket):
        keys = [{"Key": o["Key"]} for o in page.get("Contents", [])]
        for i in range(0, len(keys), 1000):
            client.delete_objects(
                Bucket=bucket, Delete={"Objects": keys[i : i + 1000], "Quiet": True}
            )
    client.delete_bucket(Bucket=bucket)


def free_bytes(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


# -- content checks ------------------------------------------------------------------------------

_MD5_CACHE: dict[tuple[int, int, int], str] = {}
_MD5_LOCK = threading.Lock()
HASH_CHUNK = 8 << 20


def _md5_stream(read) -> str:
    h = hashlib.md5(usedforsecurity=False)
    while chunk := read(HASH_CHUNK):
        h.update(chunk)
    return h.hexdigest()


def md5_file(path: Path, *, cache: bool = False) -> str:
    """MD5 of a local file. With ``cache``, remembered by (device, inode, size): for sources,
    which the benchmark replaces (new inode) but never rewrites in place; a re-sync's source
    only gets a new mtime, which must not cost a second hash of a 2 GiB file."""
    st = path.stat()
    key = (st.st_dev, st.st_ino, st.st_size)
    with _MD5_LOCK:
        found = _MD5_CACHE.get(key) if cache else None
    if found is None:
        with open(path, "rb") as f:
            found = _md5_stream(f.read)
        if cache:
            with _MD5_LOCK:
                _MD5_CACHE[key] = found
    return found


def content_mismatch_local(expected: Mapping[str, Path], root: Path) -> str | None:
    """None when every file under ``root`` has the bytes of its source, else a reason."""

    def bad(rel: str) -> bool:
        return md5_file(root / rel) != md5_file(expected[rel], cache=True)

    with ThreadPoolExecutor(4) as pool:
        wrong = sorted(k for k, b in zip(expected, pool.map(bad, expected), strict=True) if b)
    return _wrong_bytes(wrong)


def content_mismatch_s3(
    client, bucket: str, prefix: str, expected: Mapping[str, Path]
) -> str | None:
    """None when every object holds the bytes of its source file, else a reason.

    An object whose listed ETag is the source's MD5 (a single-part upload) is taken as equal
    without reading it; any other object is read whole and hashed.
    """
    etags: dict[str, str] = {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for obj in page.get("Contents", []):
            etags[obj["Key"][len(prefix) :]] = obj.get("ETag", "").strip('"')

    def bad(rel: str) -> bool:
        want = md5_file(expected[rel], cache=True)
        if etags.get(rel) == want:
            return False
        body = client.get_object(Bucket=bucket, Key=prefix + rel)["Body"]
        try:
            return _md5_stream(body.read) != want
        finally:
            body.close()

    with ThreadPoolExecutor(8) as pool:
        wrong = sorted(k for k, b in zip(expected, pool.map(bad, expected), strict=True) if b)
    return _wrong_bytes(wrong)


def _wrong_bytes(keys: list[str]) -> str | None:
    if not keys:
        return None
    shown = ", ".join(keys[:3]) + (f" (+{len(keys) - 3})" if len(keys) > 3 else "")
    return f"{len(keys)} object{'s' if len(keys) != 1 else ''} with wrong bytes: {shown}"
