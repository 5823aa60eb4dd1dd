"""A Google Cloud Storage emulator on 127.0.0.1, run as a child process, for tests and benchmarks.

:func:`gcs_emulator` runs `gcp-storage-emulator <https://pypi.org/project/gcp-storage-emulator/>`_
(the ``test`` extra installs it) in memory, on a free port, and yields its URL: set it as
``STORAGE_EMULATOR_HOST`` and ``gs://`` talks to it, without authentication::

    with gcs_emulator(tmp_path) as url:
        create_bucket(url, "data")
        upload(url, "data", "shard-0.bin", payload)
        os.environ["STORAGE_EMULATOR_HOST"] = url

The child is ``python -m testbed.gcs serve``: the emulator with three changes made in
its process, each marked where it is made (:func:`_patch_emulator`):

1. **Generation preconditions.** GCS answers ``412`` to a read whose ``ifGenerationMatch`` /
   ``ifGenerationNotMatch`` no longer holds, and names the generation it served in
   ``x-goog-generation``. The emulator ignores both, so an object overwritten in the middle of a
   multipart copy would be read half old, half new. The child adds GCS's documented behaviour.
2. **Seeding speed.** The emulator rewrites one JSON file describing every object after each
   write, even in memory, so seeding n objects costs O(n^2): 2,000 objects took 35 s here. In
   memory nothing ever reads that file back, so the child skips writing it.
3. **Listen backlog** 128 instead of 5: the emulator serves one request at a time, and a client
   opening 128 connections at once would otherwise wait for SYN retries.

What the emulator cannot show, even so (test those against a fake, see ``tests/stores/gcs``):
it ignores ``maxResults`` and never pages; it answers a suffix range (``bytes=-N``) with the
whole object; it checks no credentials (``STORAGE_EMULATOR_HOST`` turns them off in every
client); it makes no composite objects without an MD5; it does no gzip transcoding; it never
throttles (429 / 503); and its ``etag`` is the MD5 where GCS's is opaque. It does let a PATCH
set ``crc32c`` and ``md5Hash`` to anything, which tests use to make it serve bytes that do not
match the CRC32C it lists.

Helpers for seeding (plain urllib, no proxy): :func:`create_bucket`, :func:`upload`,
:func:`patch_object`, :func:`object_resource`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

from .processes import (
    LOOPBACK,
    Child,
    ServerStartError,
    free_port,
    port_clash,
    python_child_env,
)

__all__ = ["create_bucket", "gcs_emulator", "object_resource", "patch_object", "upload"]

log = logging.getLogger(__name__)

_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback: no proxy


@contextlib.contextmanager
def gcs_emulator(
    workdir: str | Path, *, port: int | None = None, startup_timeout: float = 30.0
) -> Iterator[str]:
    """Run the emulator on 127.0.0.1 (a free port unless given); yield its URL
    (``http://127.0.0.1:PORT``) once it answers; stop it on exit. Data is kept in memory; the
    log is ``workdir/gcs-emulator.log``."""
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    log_path = workdir / "gcs-emulator.log"
    attempts = 1 if port is not None else 3
    for attempt in range(1, attempts + 1):
        the_port = port if port is not None else free_port()
        url = f"http://{LOOPBACK}:{the_port}"
        argv = [sys.executable, "-m", "testbed.gcs", "serve", "--port", str(the_port)]
        child = Child("gcs-emulator", argv, log_path, cwd=workdir,
                       env=python_child_env({"PYTHONUNBUFFERED": "1"}))
        try:
            try:
                seconds = _wait_until_ready(child, url, startup_timeout)
            except ServerStartError:
                if attempt < attempts and not child.running() and port_clash(child):
                    continue
                raise
            log.info("GCS emulator up at %s in %.1f s (pid %d)", url, seconds, child.pid)
            yield url
            return
        finally:
            child.stop(grace=5.0)


def _wait_until_ready(child: Child, url: str, timeout: float) -> float:
    start = time.monotonic()
    last = "no answer yet"
    while True:
        if not child.running():
            raise ServerStartError(f"{child.name} exited with code {child.proc.returncode} during "
                                   f"startup (log {child.log_path}):\n{child.log_tail()}")
        try:
            with _OPENER.open(f"{url}/storage/v1/b?project=mcsync", timeout=2) as resp:
                if resp.status == 200:
                    return time.monotonic() - start
        except (OSError, urllib.error.URLError) as exc:
            last = f"{type(exc).__name__}: {exc}"
        if time.monotonic() - start > timeout:
            raise ServerStartError(f"{child.name} did not answer at {url} within {timeout:.0f} s "
                                   f"(last: {last}; log {child.log_path}):\n{child.log_tail()}")
        time.sleep(0.05)


# -- seeding helpers (synchronous) -------------------------------------------------------------


def _call(method: str, url: str, body: bytes | None = None,
          content_type: str = "application/json") -> dict[str, Any]:
    req = urllib.request.Request(url, data=body, method=method)
    if body is not None:
        req.add_header("Content-Type", content_type)
    with _OPENER.open(req, timeout=60) as resp:
        data = resp.read()
    return json.loads(data) if data else {}


def create_bucket(url: str, name: str) -> None:
    _call("POST", f"{url}/storage/v1/b?project=mcsync", json.dumps({"name": name}).encode())


def upload(url: str, bucket: str, name: str, data: bytes) -> dict[str, Any]:
    """Create or replace object ``name``; returns its resource (``generation``, ``crc32c``...)."""
    base = f"{url}/upload/storage/v1/b/{quote(bucket, safe='')}/o"
    if not data:  # the emulator's media upload fails on an empty body; multipart takes it
        boundary = "mcsync-boundary"
        body = (f"--{boundary}\r\nContent-Type: application/json\r\n\r\n"
                f"{json.dumps({'name': name})}\r\n--{boundary}\r\n"
                f"Content-Type: application/octet-stream\r\n\r\n\r\n--{boundary}--\r\n")
        return _call("POST", f"{base}?uploadType=multipart", body.encode(),
                     f"multipart/related; boundary={boundary}")
    return _call("POST", f"{base}?uploadType=media&name={quote(name, safe='')}", data,
                 "application/octet-stream")


def patch_object(url: str, bucket: str, name: str, fields: dict[str, Any]) -> dict[str, Any]:
    """PATCH an object's metadata (the emulator lets ``crc32c`` and ``md5Hash`` be set)."""
    return _call("PATCH", f"{url}/storage/v1/b/{quote(bucket, safe='')}/o/"
                 f"{quote(name, safe='')}", json.dumps(fields).encode())


def object_resource(url: str, bucket: str, name: str) -> dict[str, Any]:
    return _call("GET", f"{url}/storage/v1/b/{quote(bucket, safe='')}/o/{quote(name, safe='')}")


# -- the child process --------------------------------------------------------------------------


def _patch_emulator() -> None:
    """The three changes of the module docstring; must run before the emulator's server
    module is imported (its routing table holds the handler functions)."""
    import http.server
    from http import HTTPStatus

    from gcp_storage_emulator.exceptions import NotFound
    from gcp_storage_emulator.handlers import objects
    from gcp_storage_emulator.storage import Storage

    # 1. Generation preconditions on object reads, and x-goog-generation on downloads.
    def precondition_holds(request: Any, response: Any, storage: Any) -> bool:
        match = request.query.get("ifGenerationMatch")
        not_match = request.query.get("ifGenerationNotMatch")
        if not match and not not_match:
            return True
        try:
            obj = storage.get_file_obj(request.params["bucket_name"],
                                       request.params["object_id"])
        except NotFound:
            return True  # the handler answers 404
        generation = str(obj.get("generation"))
        if (match and match[0] != generation) or (not_match and not_match[0] == generation):
            response.status = HTTPStatus.PRECONDITION_FAILED
            response.json({"error": {
                "code": 412, "errors": [{"reason": "conditionNotMet"}],
                "message": "At least one of the pre-conditions you specified did not hold."}})
            return False
        return True

    stock_get, stock_download = objects.get, objects.download

    def download(request: Any, response: Any, storage: Any, *args: Any, **kwargs: Any) -> None:
        if not precondition_holds(request, response, storage):
            return
        stock_download(request, response, storage, *args, **kwargs)
        if response.status in (HTTPStatus.OK, HTTPStatus.PARTIAL_CONTENT):
            obj = storage.get_file_obj(request.params["bucket_name"],
                                       request.params["object_id"])
            response["x-goog-generation"] = str(obj.get("generation"))

    def get(request: Any, response: Any, storage: Any, *args: Any, **kwargs: Any) -> None:
        if not precondition_holds(request, response, storage):
            return
        stock_get(request, response, storage, *args, **kwargs)  # alt=media: download above

    objects.download = download
    objects.get = get

    # 2. In memory, nothing reads the metadata file back: do not rewrite it on every write.
    stock_write = Storage._write_config_to_file

    def write_config(self: Any) -> None:
        if not self._use_memory_fs:
            stock_write(self)

    Storage._write_config_to_file = write_config  # type: ignore[method-assign]

    # 3. Listen backlog.
    http.server.HTTPServer.request_queue_size = 128


def _serve(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m testbed.gcs")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the patched emulator in memory (foreground)")
    serve.add_argument("--port", type=int, required=True)
    serve.add_argument("--host", default=LOOPBACK)
    args = parser.parse_args(argv)
    _patch_emulator()
    from gcp_storage_emulator.__main__ import main as emulator_main

    emulator_main(["start", "--host", args.host, "--port", str(args.port), "--in-memory",
                   "--quiet"])


if __name__ == "__main__":
    _serve(sys.argv[1:])
