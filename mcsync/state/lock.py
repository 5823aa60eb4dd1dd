"""One run per sync pair at a time: a lock file next to the manifest (flock, so a dead run's lock
vanishes with its process) plus a lock object at the target, for runs on other machines that
share the target (it names its holder and expires unless renewed, so a run that died on
another machine blocks others for at most ``ttl`` seconds; one that died on this machine
blocks nothing, since the local lock proves it is gone).

The target lock is advisory: S3 offers no atomic create-if-absent everywhere, so two runs
that start within the same instant on two machines can both take it. The local lock is exact.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import logging
import os
import socket
import time
from collections.abc import AsyncIterator, Awaitable
from pathlib import Path

from ..errors import ConfigError, Locked, MCSyncError, NotFound
from ..stores.base import Store
from ..tasks import cancel_and_wait

# Locked lives in errors; named here as before
__all__ = ["Locked", "expires_at", "parsed_holder", "read_lock", "run_lock"]

log = logging.getLogger(__name__)


def _holder() -> dict[str, object]:
    return {"host": socket.gethostname(), "pid": os.getpid(), "started_at": time.time()}


def _describe(info: dict[str, object]) -> str:
    return (f"pid {info.get('pid', '?')} on {info.get('host', '?')}, started "
            f"{_when(info.get('started_at'), '%Y-%m-%d %H:%M:%S')}")


def _when(t: object, fmt: str) -> str:
    try:
        return time.strftime(fmt, time.localtime(float(t)))  # type: ignore[arg-type]
    except (TypeError, ValueError, OverflowError, OSError):
        return "?"


def parsed_holder(data: bytes) -> dict[str, object]:
    """A holder as a lock names it; {} for a lock file or object that holds anything else
    (empty, truncated by a crash, not JSON, not an object)."""
    try:
        info = json.loads(data or b"{}")
    except ValueError:
        return {}
    return info if isinstance(info, dict) else {}


def expires_at(info: dict[str, object]) -> float:
    value = info.get("expires_at", 0)
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0.0


@contextlib.contextmanager
def _local_lock(path: Path):  # type: ignore[no-untyped-def]
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:  # a directory of that name, a read-only or full state directory
        raise ConfigError(f"cannot open the run lock {path}: {exc.strerror}") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            info = parsed_holder(os.pread(fd, 4096, 0))
            raise Locked(f"another run of this sync holds {path} ({_describe(info)})") from None
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, json.dumps(_holder()).encode(), 0)
        except OSError as exc:  # the holder is for messages only; the flock is the lock
            log.warning("could not write the holder into %s: %s", path, exc.strerror)
        yield
    finally:
        os.close(fd)  # releases the flock


async def read_lock(dst: Store, target_key: str) -> dict[str, object]:
    """The target's lock object ({} when there is none, or it names nothing)."""
    try:
        return parsed_holder(bytes(await dst.get(target_key)))
    except NotFound:
        return {}


@contextlib.asynccontextmanager
async def run_lock(local_path: Path, dst: Store, target_key: str, *, ttl: float = 600.0,
                   held: Awaitable[dict[str, object]] | None = None) -> AsyncIterator[None]:
    """``held``: ``read_lock`` of the target's lock object, sent already."""
    with _local_lock(local_path):
        me = _holder() | {"expires_at": time.time() + ttl, "token": os.urandom(8).hex()}
        current = await (held if held is not None else read_lock(dst, target_key))
        # Holding the local lock proves no other run of this pair is alive on this host, so a
        # target lock left by this host belongs to a run that died: take it over at once. A
        # lock object that names no holder or no expiry (damaged) blocks nothing.
        foreign = bool(current) and current.get("host") != me["host"]
        if foreign and expires_at(current) > time.time():
            raise Locked(f"another run of this sync holds the target lock {target_key} "
                         f"({_describe(current)}); it expires at "
                         f"{_when(expires_at(current), '%H:%M:%S')}")
        await dst.put(target_key, json.dumps(me).encode())

        async def renew() -> None:
            while True:
                await asyncio.sleep(ttl / 4)
                me["expires_at"] = time.time() + ttl
                with contextlib.suppress(MCSyncError):
                    await dst.put(target_key, json.dumps(me).encode())

        renewer = asyncio.create_task(renew())
        try:
            yield
        finally:
            await cancel_and_wait(renewer)
            with contextlib.suppress(MCSyncError, OSError):
                await asyncio.shield(dst.delete(target_key))
