"""What the sync tests share: seeding data, reading a whole tree back, running the CLI."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

from click.testing import CliRunner, Result

import mcsync
from mcsync.cli.main import cli
from testbed.servers import S3Endpoint


def new_bucket(ep: S3Endpoint, stem: str = "b") -> str:
    name = f"{stem}-{uuid.uuid4().hex[:12]}"
    ep.create_bucket(name)
    return name


def put_objects(ep: S3Endpoint, bucket: str, objects: dict[str, bytes], prefix: str = "") -> None:
    client = ep.client()
    for key, data in objects.items():
        client.put_object(Bucket=bucket, Key=prefix + key, Body=data)


STATE = ".mcsync/"  # mcsync's own state at a target, not data


def read_bucket(
    ep: S3Endpoint, bucket: str, prefix: str = "", *, with_state: bool = False
) -> dict[str, bytes]:
    """Every object under ``prefix`` (keys relative to it), mcsync's state left out."""
    client = ep.client()
    out: dict[str, bytes] = {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for c in page.get("Contents", ()):
            key = c["Key"][len(prefix) :]
            if key.startswith(STATE) and not with_state:
                continue
            out[key] = client.get_object(Bucket=bucket, Key=c["Key"])["Body"].read()
    return out


def write_tree(root: Path, objects: dict[str, bytes]) -> None:
    for key, data in objects.items():
        path = root.joinpath(*key.split("/"))
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


def read_tree(root: Path, *, with_state: bool = False) -> dict[str, bytes]:
    """Every file under ``root`` by relative POSIX path, mcsync's state left out."""
    out: dict[str, bytes] = {}
    for dirpath, _, files in os.walk(root):
        for name in files:
            path = Path(dirpath, name)
            key = path.relative_to(root).as_posix()
            if key.startswith(STATE) and not with_state:
                continue
            out[key] = path.read_bytes()
    return out


def run_cli(*args: str, env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(cli, list(args), env=env, catch_exceptions=False)


CRASHING_MCSYNC = Path(__file__).with_name("crashing_mcsync.py")


def crashed_run(point: str, *args: str, env: dict[str, str],
                acked: Path | None = None) -> subprocess.CompletedProcess[str]:
    """``mcsync *args`` in a subprocess that kills itself with SIGKILL at ``point`` (see
    crashing_mcsync.py); with ``acked``, it writes there the bytes the target acknowledged."""
    crash = {"CRASH_AT": point} | ({"CRASH_ACKED": str(acked)} if acked else {})
    return subprocess.run(
        [sys.executable, str(CRASHING_MCSYNC), *args], env=dict(os.environ) | env | crash,
        capture_output=True, text=True, timeout=120, check=False,
        cwd=Path(__file__).parents[2])


def payload(size: int, seed: int = 0) -> bytes:
    """Deterministic, incompressible-enough bytes (os.urandom would make failures unrepeatable)."""
    import random

    return random.Random(seed).randbytes(size)


def sync_stores(source: Any, target: Any, **options: Any) -> mcsync.SyncReport:
    """``mcsync.sync`` with store objects (or addresses), closing the store objects after:
    they are the caller's to close."""

    async def go() -> mcsync.SyncReport:
        try:
            return await mcsync.async_sync(source, target, **options)
        finally:
            for store in (source, target):
                if not isinstance(store, str):
                    await store.aclose()

    result: mcsync.SyncReport = mcsync.run_blocking(go())
    return result
