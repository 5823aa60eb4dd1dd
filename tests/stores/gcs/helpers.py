"""What the gs:// tests share: payloads, the CLI runner, reading targets back."""

from __future__ import annotations

import os
import random
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from mcsync.cli.main import cli
from testbed.gcs import GCSServer, patch_object, upload
from testbed.servers import S3Endpoint


def payload(size: int, seed: int = 0) -> bytes:
    """Deterministic bytes, so a failure repeats."""
    return random.Random(seed).randbytes(size)


def run_cli(*args: str, env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(cli, list(args), env=env, catch_exceptions=False)


def error_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith("mcsync: error:")]


def seed(server: GCSServer, bucket: str, objects: dict[str, bytes], prefix: str = "") -> None:
    """Upload ``objects`` under ``prefix``, eight at a time (thousands of small objects are
    a request each)."""
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda item: upload(server, bucket, prefix + item[0], item[1]),
                      objects.items()))


def set_wrong_crc32c(server: GCSServer, bucket: str, name: str, crc32c: str) -> None:
    """Make ``server`` list and send ``crc32c`` for ``name``, a CRC32C its bytes do not have.
    Only the emulator can (it takes one in a PATCH): fake-gcs-server, as GCS, keeps the CRC32C
    it computed, so the test is skipped there."""
    if server.name == "fake-gcs-server":
        pytest.skip("fake-gcs-server, as GCS, keeps the CRC32C it computed: it cannot be made "
                    "to serve bytes that do not match it (the emulator can)")
    assert patch_object(server, bucket, name, {"crc32c": crc32c})["crc32c"] == crc32c


STATE = ".mcsync/"  # mcsync's own state at a target (manifest), not synced data


def read_bucket(ep: S3Endpoint, bucket: str, prefix: str = "") -> dict[str, bytes]:
    """Every object under ``prefix`` but mcsync's own state, read back whole."""
    client = ep.client()
    out: dict[str, bytes] = {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for c in page.get("Contents", ()):
            key = c["Key"][len(prefix):]
            if not key.startswith(STATE):
                out[key] = client.get_object(Bucket=bucket, Key=c["Key"])["Body"].read()
    return out


def open_uploads(ep: S3Endpoint, bucket: str) -> list[str]:
    uploads = ep.client().list_multipart_uploads(Bucket=bucket).get("Uploads", [])
    return [u["Key"] for u in uploads]


def read_tree(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` but mcsync's own state, read back whole."""
    out: dict[str, bytes] = {}
    for dirpath, _, files in os.walk(root):
        for name in files:
            path = Path(dirpath, name)
            key = path.relative_to(root).as_posix()
            if not key.startswith(STATE):
                out[key] = path.read_bytes()
    return out
