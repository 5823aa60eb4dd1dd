"""The node cache's tests: a SeaweedFS bucket of random objects, and children using it."""

from __future__ import annotations

import contextlib
import hashlib
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from testbed.faultproxy import FaultProxy
from testbed.processes import python_child_env
from testbed.servers import S3Endpoint


@dataclass
class Source:
    """A bucket seen through a proxy that names every request, and the bytes put there."""

    endpoint: S3Endpoint  # the proxy's address, the server's keys
    proxy: FaultProxy
    bucket: str
    objects: dict[str, bytes]

    def url(self, key: str = "") -> str:
        return f"s3://{self.bucket}/{key}"

    def put(self, key: str, data: bytes) -> None:
        self.endpoint.client().put_object(Bucket=self.bucket, Key=key, Body=data)
        self.objects[key] = data

    def gets(self, key: str = "*") -> int:
        return len(self.proxy.exchanges("GetObject", key=key))

    def env(self) -> dict[str, str]:
        return python_child_env(self.endpoint.aws_env())


@pytest.fixture
def source(seaweed_proxy: FaultProxy, bucket_factory, monkeypatch: pytest.MonkeyPatch,
           ) -> Iterator[Source]:
    bucket = bucket_factory(seaweed_proxy.upstream)
    src = Source(seaweed_proxy.endpoint, seaweed_proxy, bucket, {})
    for name, value in src.endpoint.aws_env().items():
        monkeypatch.setenv(name, value)
    yield src


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def disk_usage(root: Path) -> int:
    """What ``du -sb``'s block count says of ``root``: every file's and directory's blocks."""
    total = 0
    for dirpath, dirs, files in os.walk(root):
        for name in [*dirs, *files]:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_blocks * 512
            except FileNotFoundError:
                continue
    return total


@contextlib.contextmanager
def sampled_disk_usage(root: Path, every_s: float) -> Iterator[list[int]]:
    """``disk_usage(root)`` every ``every_s`` seconds in a thread while the block runs; the
    samples, complete once it has ended."""
    samples: list[int] = []
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            samples.append(disk_usage(root))
            time.sleep(every_s)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        yield samples
    finally:
        done.set()
        sampler.join()


def mcsync(*args: str, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "mcsync.cli.main", *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
