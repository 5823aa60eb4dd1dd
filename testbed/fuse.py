"""A SeaweedFS bucket mounted as a directory with ``weed mount`` (FUSE), for the tests of a
mounted target or source: the stand-in for a Meta Storage Direct mount (a bucket mounted into
the pod's namespace through a CSI driver).

:func:`weed_mount` mounts ``/buckets/<bucket>`` of a :func:`testbed.servers.seaweedfs` server's
filer at a directory (by default a new temporary one, out of pytest's tree), waits until
``/proc/self/mountinfo`` shows a FUSE mount there, and at the end unmounts it (``umount``, else
``umount -l``) and stops the ``weed mount`` process by its PID. Its cache, socket and log stay
in ``workdir``; it talks to the filer on 127.0.0.1 only and opens no listener of its own
(``-peer.enable`` and ``-debug`` stay off). :func:`unmount_dead` takes down what a killed run
left (a mount whose process is gone).

:func:`fuse_unavailable` says why no mount can be made here (no ``/dev/fuse``, not root, no
``umount``), or None.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from .processes import Child, ServerStartError, child_env
from .servers import S3Endpoint, find_weed

__all__ = ["MOUNT_PREFIX", "fuse_unavailable", "is_fuse_mount", "unmount_dead", "weed_mount"]

log = logging.getLogger(__name__)

MOUNT_PREFIX = "mcsync-weed-mount-"  # the temporary directories weed_mount mounts at


def fuse_unavailable() -> str | None:
    """Why no FUSE mount can be made on this machine, or None where one can."""
    if not sys.platform.startswith("linux"):
        return "FUSE mounts are tested on Linux only"
    if not os.path.exists("/dev/fuse"):
        return "no /dev/fuse (a container without the FUSE device: run with --device /dev/fuse)"
    if os.geteuid() != 0:
        return "weed mount needs root here (no fusermount3 setuid helper is used)"
    if shutil.which("umount") is None:
        return "no umount binary to take the mount down"
    try:
        find_weed()
    except FileNotFoundError as exc:
        return str(exc)
    return None


def _fuse_mounts() -> list[str]:
    """The mount points of every FUSE mount ``/proc/self/mountinfo`` lists."""
    try:
        mountinfo = Path("/proc/self/mountinfo").read_text()
    except OSError:
        return []
    found = []
    for line in mountinfo.splitlines():
        fields, _, after = line.partition(" - ")
        parts = fields.split()
        if len(parts) < 5 or not after or not after.split()[0].startswith("fuse"):
            continue
        found.append(re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), parts[4]))
    return found


def is_fuse_mount(directory: Path) -> bool:
    """Whether ``/proc/self/mountinfo`` lists a FUSE mount exactly at ``directory``."""
    return os.path.realpath(directory) in _fuse_mounts()


def unmount_dead(under: Path | None = None) -> list[str]:
    """Lazily unmount the mounts :func:`weed_mount` made (in temporary directories of its own,
    ``MOUNT_PREFIX``) below ``under`` (default: the temporary directory) whose process is gone:
    a test run killed with its ``weed mount`` leaves the kernel's mount behind, and every call
    on it fails with ENOTCONN. The mount points unmounted."""
    root = os.path.realpath(under or tempfile.gettempdir()).rstrip("/") + "/"
    dead = []
    for mount in _fuse_mounts():
        if not mount.startswith(root) or not os.path.basename(mount).startswith(MOUNT_PREFIX):
            continue
        try:
            os.statvfs(mount)  # asks the mount's process (a stat may come from a cache)
        except OSError as exc:
            if exc.errno == errno.ENOTCONN:
                _unmount(Path(mount), lazy=True)
                dead.append(mount)
    return dead


@contextlib.contextmanager
def weed_mount(endpoint: S3Endpoint, bucket: str, mountpoint: Path | None = None, *,
               workdir: Path, timeout: float = 30.0,
               extra: tuple[str, ...] = ()) -> Iterator[Path]:
    """Mount bucket ``bucket`` of the SeaweedFS server behind ``endpoint`` at ``mountpoint``
    (made if missing; by default a new temporary directory, ``MOUNT_PREFIX``, removed after);
    yields the mount point once the kernel shows the mount. ``extra``: more ``weed mount``
    flags.

    The default keeps the mount out of pytest's temporary tree, whose clean-up of old runs
    would otherwise walk into a mount (deleting through it, or failing on a dead one)."""
    if endpoint.filer is None:
        raise ValueError(f"{endpoint.url}: not a SeaweedFS endpoint of testbed.servers "
                         "(no filer address)")
    reason = fuse_unavailable()
    if reason is not None:
        raise ServerStartError(f"cannot mount: {reason}")
    workdir.mkdir(parents=True, exist_ok=True)
    own_dir = mountpoint is None
    if mountpoint is None:
        mountpoint = Path(tempfile.mkdtemp(prefix=MOUNT_PREFIX))
    cache = workdir / "cache"
    cache.mkdir(exist_ok=True)
    mountpoint = Path(os.path.abspath(mountpoint))
    argv = [
        find_weed(), "-logtostderr", f"-config_dir={workdir}", "mount",
        f"-filer={endpoint.filer}", f"-dir={mountpoint}", f"-filer.path=/buckets/{bucket}",
        "-dirAutoCreate", f"-cacheDir={cache}", f"-localSocket={workdir / 'mount.sock'}",
        *extra,
    ]
    child = Child("weed mount", argv, workdir / "mount.log", cwd=workdir, env=child_env())
    try:
        deadline = time.monotonic() + timeout
        while not is_fuse_mount(mountpoint):
            if not child.running():
                raise ServerStartError(
                    f"weed mount exited with code {child.proc.returncode} before the mount "
                    f"showed (log {child.log_path}):\n{child.log_tail()}")
            if time.monotonic() > deadline:
                raise ServerStartError(
                    f"no FUSE mount at {mountpoint} within {timeout:.0f} s (log "
                    f"{child.log_path}):\n{child.log_tail()}")
            time.sleep(0.05)
        log.info("weed mount of %s at %s (pid %d)", bucket, mountpoint, child.pid)
        yield mountpoint
    finally:
        _unmount(mountpoint)
        child.stop(grace=5.0)
        if is_fuse_mount(mountpoint):  # the process is gone: only a lazy unmount is left
            _unmount(mountpoint, lazy=True)
        if own_dir and not is_fuse_mount(mountpoint):
            with contextlib.suppress(OSError):
                mountpoint.rmdir()  # empty once unmounted; never a walk into a mount


def _unmount(mountpoint: Path, *, lazy: bool = False) -> None:
    if not lazy and not is_fuse_mount(mountpoint):
        return
    argv = ["umount", *(["-l"] if lazy else []), str(mountpoint)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    if done.returncode != 0 and not lazy:  # busy (a reader left open): detach it lazily
        log.warning("umount %s: %s; unmounting lazily", mountpoint, done.stderr.strip())
        _unmount(mountpoint, lazy=True)
