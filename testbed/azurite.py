"""Azurite (Microsoft's Azure Storage emulator, from npm) on 127.0.0.1, for tests.

:func:`azurite` runs ``azurite-blob`` — found in the repository's ``node_modules/.bin`` (the
project's ``package.json``; ``scripts/test.sh`` installs it) or on ``PATH`` — on a free port,
in a directory of its own, and yields an :class:`AzuriteEndpoint`: the well-known development
account, the endpoint URL, the environment that points ``az://`` at it, and seeding helpers
(the ``azure-storage-blob`` SDK, from the ``test`` extra)::

    with azurite(tmp_path) as az:
        az.create_container("data")
        az.upload("data", "shard-0.bin", payload)
        os.environ.update(az.env())
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .processes import (
    LOOPBACK,
    REPO_ROOT,
    Child,
    ServerStartError,
    child_env,
    free_port,
    port_clash,
)

__all__ = ["ACCOUNT", "AzuriteEndpoint", "azurite", "azurite_binary"]

log = logging.getLogger(__name__)

# Azurite's one built-in account: a published development key, no secret of anyone's.
ACCOUNT = "devstoreaccount1"
KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="


def azurite_binary() -> str | None:
    local = REPO_ROOT / "node_modules" / ".bin" / "azurite-blob"
    return str(local) if local.exists() else shutil.which("azurite-blob")


@dataclass(frozen=True)
class AzuriteEndpoint:
    url: str  # http://127.0.0.1:PORT/devstoreaccount1

    def env(self) -> dict[str, str]:
        """What points ``az://`` (obstore's Azure client) at this emulator."""
        return {"AZURE_STORAGE_ACCOUNT_NAME": ACCOUNT, "AZURE_STORAGE_ACCOUNT_KEY": KEY,
                "AZURE_STORAGE_ENDPOINT": self.url}

    def service(self) -> Any:
        from azure.storage.blob import BlobServiceClient

        return BlobServiceClient.from_connection_string(
            f"DefaultEndpointsProtocol=http;AccountName={ACCOUNT};AccountKey={KEY};"
            f"BlobEndpoint={self.url};")

    def create_container(self, name: str) -> None:
        self.service().create_container(name)

    def upload(self, container: str, name: str, data: bytes) -> None:
        self.service().get_blob_client(container, name).upload_blob(data, overwrite=True)

    def delete(self, container: str, name: str) -> None:
        self.service().get_blob_client(container, name).delete_blob()


@contextlib.contextmanager
def azurite(workdir: str | Path, *, startup_timeout: float = 30.0) -> Iterator[AzuriteEndpoint]:
    """Run azurite-blob on 127.0.0.1 (a free port), data under ``workdir``; yield its
    endpoint once it accepts connections; stop it on exit."""
    binary = azurite_binary()
    if binary is None:
        raise ServerStartError("azurite-blob not found: run `npm install` in the repository "
                               "(its package.json names azurite), or put it on PATH")
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    for attempt in range(1, 4):
        port = free_port()
        argv = [binary, "--blobHost", LOOPBACK, "--blobPort", str(port), "--location",
                str(workdir / "data"), "--skipApiVersionCheck", "--loose", "--silent",
                # Azurite sends usage telemetry to Microsoft by default (and leaves a
                # Microsoft-AzureMonitor-* directory in the temp dir): tests talk to
                # 127.0.0.1 only.
                "--disableTelemetry"]
        child = Child("azurite", argv, workdir / "azurite.log", cwd=workdir, env=child_env())
        try:
            try:
                seconds = _wait_until_ready(child, port, startup_timeout)
            except ServerStartError:
                if attempt < 3 and not child.running() and port_clash(child):
                    continue
                raise
            log.info("Azurite up on port %d in %.1f s (pid %d)", port, seconds, child.pid)
            yield AzuriteEndpoint(f"http://{LOOPBACK}:{port}/{ACCOUNT}")
            return
        finally:
            # Azurite waits for idle keep-alive connections before it exits on SIGTERM (5 s
            # and more seen): its data is a temporary directory, so it is not waited for long.
            child.stop(grace=1.0, expected_kill=True)


def _wait_until_ready(child: Child, port: int, timeout: float) -> float:
    start = time.monotonic()
    while True:
        if not child.running():
            raise ServerStartError(f"azurite exited with code {child.proc.returncode} during "
                                   f"startup (log {child.log_path}):\n{child.log_tail()}")
        with contextlib.suppress(OSError), socket.create_connection((LOOPBACK, port), 0.5):
            return time.monotonic() - start
        if time.monotonic() - start > timeout:
            raise ServerStartError(f"azurite did not listen on {port} within {timeout:.0f} s "
                                   f"(log {child.log_path}):\n{child.log_tail()}")
        time.sleep(0.05)
