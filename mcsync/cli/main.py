"""The ``mcsync`` command: click options → SyncOptions → engine; events → progress display."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click

from .. import run_blocking, tune_process
from .._version import __version__
from ..config import (
    AUTO_CONCURRENCY_CEILING,
    CHUNKERS,
    DEFAULT_CONCURRENCY,
    DEFAULT_PART_CONCURRENCY,
    DELTA_SCOPES,
    SyncOptions,
    format_size,
    parse_concurrency,
    parse_duration,
    parse_size,
    parse_workers,
    workers_for,
)
from ..errors import UsageError
from ..limits import Limits
from ..state.manifest import Manifest, last_run_status, manifest_dir, pair_of
from ..stores.registry import StoreOptions, open_store
from ..types import RESERVED_PREFIX
from .cache_cmd import cache as cache_group
from .progress import counted
from .run import (
    EXIT_CODES_HELP,
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_LOCKED,
    EXIT_OK,
    EXIT_USAGE,
    Output,
    Seams,
    configure_logging,
    guarded,
    run_command,
    write_stdout,
)
from .status_cmd import status as status_cmd

__all__ = ["EXIT_FAILED", "EXIT_INTERRUPTED", "EXIT_LOCKED", "EXIT_OK", "EXIT_USAGE", "Seams",
           "cli", "main"]



class _Parsed(click.ParamType):  # type: ignore[type-arg]  # generic only in newer clicks
    """An option value read by one of mcsync's parsers, its UsageError shown as click's."""

    def __init__(self, name: str, parse: Callable[[str], Any],
                 done: type[Any] | None = None) -> None:
        self.name = name
        self._parse = parse
        self._done = done  # a default already of this type needs no parsing

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> Any:
        if self._done is not None and isinstance(value, self._done):
            return value
        try:
            return self._parse(value)
        except UsageError as exc:
            self.fail(str(exc), param, ctx)


def _rate(text: str) -> str:
    """A bytes-per-second rate or a timetable of them: checked here, handed on as written."""
    from ..ratelimit import Timetable

    Timetable.parse(text)
    return text


def _addr(text: str) -> tuple[str, int]:
    from ..observe.metrics import parse_addr  # prometheus_client only for a run that asks for it

    return parse_addr(text)


SIZE = _Parsed("size", parse_size, int)
DURATION = _Parsed("duration", parse_duration, float)
RATE = _Parsed("rate", _rate)
ADDR = _Parsed("host:port", _addr, tuple)
CONCURRENCY = _Parsed("concurrency", parse_concurrency, int)
WORKERS = _Parsed("workers", lambda text: "auto" if text.strip().lower() == "auto"
                  else parse_workers(text), int)  # auto: resolved with --executor


_client_cert_options = (
    click.option("--client-cert", default=None, metavar="PEM",
                 help="Client certificate for s3:// over https (mutual TLS), presented by every "
                      "request (meta://: MCSYNC_META_CLIENT_CERT)."),
    click.option("--client-key", default=None, metavar="PEM",
                 help="The client certificate's private key (default: in --client-cert's "
                      "file)."),
)


def _client_cert(f: Callable[..., Any]) -> Callable[..., Any]:
    for opt in reversed(_client_cert_options):
        f = opt(f)
    return f


def _sync_options(f: Callable[..., Any]) -> Callable[..., Any]:
    opts = [
        click.option("--concurrency", "-c", type=CONCURRENCY, metavar="N|auto",
                     default=DEFAULT_CONCURRENCY, show_default=True,
                     help="Objects and requests in flight. auto: tuned during the run from "
                          f"what it measures (up to {AUTO_CONCURRENCY_CEILING}); the report "
                          "says what it settled on."),
        click.option("--part-concurrency", type=click.IntRange(min=1),
                     default=DEFAULT_PART_CONCURRENCY, show_default=True,
                     help="Parts of one large object in flight at once."),
        click.option("--part-size", type=SIZE, default=None,
                     help="Multipart part size (default: 8 MiB, grown to stay within 10,000 "
                          "parts)."),
        click.option("--memory-limit", type=SIZE, default="1GiB", show_default=True,
                     help="Most bytes of object data buffered at once."),
        click.option("--include", multiple=True, metavar="GLOB",
                     help="Only keys matching GLOB (whole key or file name). Repeatable."),
        click.option("--exclude", multiple=True, metavar="GLOB",
                     help="Skip keys matching GLOB. Repeatable."),
        click.option("--delete", is_flag=True,
                     help="Delete target objects that are not at the source (after every "
                          "copy succeeded)."),
        click.option("--endpoint-url", default=None, metavar="URL",
                     help="Endpoint for s3:// (default: AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL "
                          "/ AWS)."),
        click.option("--profile", default=None, help="AWS profile for s3://."),
        *_client_cert_options,
        click.option("--no-server-side-copy", is_flag=True,
                     help="Move bytes through this client even when both sides share an "
                          "endpoint."),
        click.option("--manifest", "manifest", default=None, metavar="PATH",
                     help="The pair's manifest (default: under $XDG_STATE_HOME/mcsync/)."),
        click.option("--no-manifest", is_flag=True,
                     help="Neither read nor write a manifest: plan from listings alone."),
        click.option("--verify", is_flag=True,
                     help="List the target instead of trusting the manifest, and re-read what "
                          "it holds afterwards to compare with the recorded hashes."),
        click.option("--checksum", is_flag=True,
                     help="Decide whether an object changed by its content, not by size and "
                          "modification time: list the target, skip on equal ETags or recorded "
                          "xxh3-128 hashes, otherwise read and hash both sides (costs reads)."),
        click.option("--no-delta", "no_delta", is_flag=True,
                     help="Send changed objects whole instead of only their changed chunks, "
                          "and new ones whole even where the target holds their chunks."),
        click.option("--delta-scope", type=click.Choice(DELTA_SCOPES), default="target",
                     show_default=True,
                     help="Where a delta may copy chunks from: key (the object's own previous "
                          "version), prefix (objects under the parent of its directory: a "
                          "run's other steps), target (any object mcsync wrote to this "
                          "target)."),
        click.option("--chunker", type=click.Choice(CHUNKERS), default="auto", show_default=True,
                     help="How objects are cut for the block delta. auto: as the target's "
                          "version was cut; new .safetensors files by tensor (a tensor keeps "
                          "its chunks when the header grows), others in fixed blocks of the part "
                          "size. cdc: content-defined chunks (FastCDC, ~2 MiB), for formats "
                          "where inserts shift the rest; costs one more read of new objects."),
        click.option("--tpslimit", "tps_limit", type=click.FloatRange(min=0, min_open=True),
                     default=None, metavar="N",
                     help="At most N requests per second, to both stores together."),
        click.option("--bwlimit", "bw_limit", type=RATE, default=None, metavar="RATE",
                     help="At most RATE bytes per second through this client, both directions "
                          "together: 50MiB, or a timetable such as '08:00,100MiB 20:00,off'."),
        click.option("--min-age", type=DURATION, default=None, metavar="DURATION",
                     help="Leave files modified less than DURATION ago for a later run: they "
                          "may still be written (default 0; 30s with --watch). Not the files "
                          "of a checkpoint whose completion marker vouches for them."),
        click.option("--shard", "shard", default=None, metavar="I/N|auto",
                     help="Only the keys of shard I of N (numbered from 0; by a stable hash of "
                          "the key), with a manifest and lock of their own: one pod of a "
                          "Kubernetes Indexed Job each. auto: I from JOB_COMPLETION_INDEX, N "
                          "from JOB_COMPLETIONS."),
        click.option("--latest-checkpoint", is_flag=True,
                     help="Copy only the newest complete checkpoint directly under SRC (of "
                          "DeepSpeed, Megatron-LM, PyTorch DCP, Hugging Face Trainer, Orbax, "
                          "NeMo; the one a 'latest' marker names, else the highest step) and "
                          "the marker naming it; exit 4 when there is none."),
        click.option("--keep-last", type=int, default=None, metavar="N",
                     help="Retention at the target: once a run's checkpoints are complete "
                          "there, delete the checkpoints directly under DST older than the "
                          "last N complete ones (marker first), unless --keep-every keeps "
                          "them. Never the source; exit 2 when SRC holds no checkpoints."),
        click.option("--keep-every", type=int, default=None, metavar="K",
                     help="With --keep-last: also keep every checkpoint whose step is a "
                          "multiple of K."),
        click.option("--prune-optimizer-older-than", type=int, default=None, metavar="N",
                     help="With --keep-last: of the checkpoints kept that are older than the "
                          "last N, delete the optimizer files (DeepSpeed, Hugging Face "
                          "Trainer, Megatron-LM distributed optimizer), keeping the weights."),
        click.option("--workers", type=WORKERS, default=0, metavar="N|auto",
                     help="Move objects in N worker processes on this machine (auto: the "
                          "cores available): small ones whole, larger ones by their parts "
                          "(the main process opens and completes each upload); deltas and "
                          "uploads into local files stay in the main process. Each worker "
                          "gets 1/N of --concurrency and --memory-limit, and it and the "
                          "main process 1/N of --tpslimit and --bwlimit (the run's total)."),
        click.option("--executor", type=click.Choice(("local", "ray")), default="local",
                     show_default=True,
                     help="Where the --workers run: processes on this machine, or Ray actors on "
                          "a Ray cluster (pip install 'mcsync[ray]'; --workers auto or none: "
                          "one per CPU the cluster has free)."),
        click.option("--ray-address", default=None, metavar="ADDR",
                     help="The Ray cluster of --executor ray (default: RAY_ADDRESS, else one "
                          "running on this machine)."),
        click.option("--task-timeout", "task_timeout", default=None, metavar="SECONDS",
                     type=click.FloatRange(min=0, min_open=True),
                     help="How long a task of the --workers may run before its worker is "
                          "taken for stuck, killed, and the task given to another (default: "
                          "from its bytes at 1 MiB/s, at least 60 s)."),
        click.option("--grace", "grace_s", type=click.FloatRange(min=0), default=20.0,
                     show_default=True, metavar="SECONDS",
                     help="On SIGINT/SIGTERM, how long work in flight may take to finish."),
        click.option("--report", "report_path", default=None, metavar="FILE",
                     help="Write the JSON report to FILE."),
        click.option("--json", "as_json", is_flag=True,
                     help="Print the report as JSON on stdout."),
        click.option("--metrics-addr", type=ADDR, default=None, metavar="HOST:PORT",
                     help="Serve Prometheus metrics at http://HOST:PORT/metrics while the "
                          "command runs (0.0.0.0:9108: every interface)."),
        click.option("--metrics-file", default=None, metavar="PATH",
                     help="At the end, write the metrics to PATH in the node_exporter "
                          "textfile format (a temporary file renamed into place)."),
        click.option("--quiet", "-q", is_flag=True, help="No progress, no summary; failures only."),
        click.option("--verbose", "-v", is_flag=True, help="Debug logging."),
    ]
    for opt in reversed(opts):
        f = opt(f)
    return f


@click.group(epilog=EXIT_CODES_HELP)
# The version given, not looked up: click's lookup by package name reads every installed
# distribution's metadata (importlib.metadata), ~60 ms of a command that prints one line.
@click.version_option(version=__version__, prog_name="mcsync")
def cli() -> None:
    """Move ML datasets and checkpoints between S3, Meta Storage (meta://) and local disk."""


@cli.command(epilog=EXIT_CODES_HELP)
@click.argument("src")
@click.argument("dst")
@_sync_options
@click.option("--dry-run", "-n", is_flag=True, help="Plan and report; move nothing.")
@click.option("--watch", is_flag=True,
              help="Keep DST current: incremental cycles until SIGTERM/SIGINT (exit 0), under "
                   "one lock; a local SRC's file changes start a cycle early.")
@click.option("--interval", type=DURATION, default=None, metavar="DURATION",
              help="With --watch: time from one cycle's start to the next (default 60s).")
def sync(src: str, dst: str, dry_run: bool, **kw: Any) -> None:
    """Make DST hold what SRC holds (new and changed objects are copied).

    SRC may be one file or object: a DST ending in / receives it under its own name, any
    other DST names the object itself (as `aws s3 cp`)."""
    sys.exit(_run(src, dst, dry_run=dry_run, show_plan=dry_run, long=True, **kw))


@cli.command(epilog=EXIT_CODES_HELP)
@click.argument("src")
@click.argument("dst")
@_sync_options
@click.option("--long", "-l", "long", is_flag=True, help="One line per object to change.")
def plan(src: str, dst: str, **kw: Any) -> None:
    """Show what `sync` would do, and the bytes it would move. Moves nothing."""
    sys.exit(_run(src, dst, dry_run=True, show_plan=True, **kw))


@cli.command(epilog=EXIT_CODES_HELP)
@click.argument("src", required=False)
@click.argument("dst", required=False)
@_sync_options
def resume(src: str | None, dst: str | None, **kw: Any) -> None:
    """Finish an interrupted sync. With SRC and DST it is `sync SRC DST`; without, it takes
    the pair whose last run on this machine was interrupted."""
    if src is None or dst is None:
        from ..state.shard import of_name

        pending = []
        for path in manifest_dir().glob("*.sqlite"):
            status, pair = last_run_status(path), pair_of(path)
            if status and pair and status[1] in ("interrupted", "running"):
                pending.append((status[0], pair, of_name(path.name)))
        if not pending:
            click.echo("mcsync: error: no interrupted sync found on this machine; "
                       "give SRC and DST", err=True)
            sys.exit(EXIT_USAGE)
        _, (src, dst), shard = max(pending, key=lambda p: p[0])
        if shard is not None and kw.get("shard") is None:  # a shard's run resumes as one
            kw["shard"] = f"{shard[0]}/{shard[1]}"
        click.echo(f"mcsync: resuming {src} -> {dst}"
                   + (f" (shard {kw['shard']})" if kw.get("shard") else ""), err=True)
    sys.exit(_run(src, dst, dry_run=False, show_plan=False, **kw))


@cli.command(epilog=EXIT_CODES_HELP)
@click.argument("dst")
@click.option("--manifest", "manifests", multiple=True, metavar="PATH",
              help="Manifest(s) to check against (default: every manifest of DST on this "
                   "machine, else the copies kept at DST).")
@click.option("--endpoint-url", default=None, metavar="URL")
@click.option("--profile", default=None)
@_client_cert
@click.option("--concurrency", "-c", type=click.IntRange(min=1), default=DEFAULT_CONCURRENCY)
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON on stdout.")
def verify(dst: str, manifests: tuple[str, ...], endpoint_url: str | None, profile: str | None,
           concurrency: int, as_json: bool, client_cert: str | None = None,
           client_key: str | None = None) -> None:
    """Re-read DST and compare every object mcsync wrote there with the hashes it recorded."""
    import tempfile

    from ..move.verify import verify_entries  # the verify command's alone: not imported by a sync

    async def go() -> tuple[int, list[tuple[str, str]]]:
        options = SyncOptions(endpoint_url=endpoint_url, profile=profile,
                              concurrency=concurrency)
        store = open_store(dst, StoreOptions(endpoint_url=endpoint_url, profile=profile,
                                             client_cert=client_cert, client_key=client_key,
                                             max_connections=concurrency))
        try:
            await store.check(mode="read")
            with tempfile.TemporaryDirectory(prefix="mcsync-verify-") as tmp:
                paths = [Path(p) for p in manifests] or await _manifests_of(store, Path(tmp))
                if not paths:
                    raise UsageError(f"{store.url}: no manifest found for this target "
                                     "(sync to it first, or give --manifest)")
                checked, problems = 0, []
                limits = Limits.for_options(options)
                for path in paths:
                    pair = pair_of(path)
                    if pair is None:
                        raise UsageError(f"{path}: not a readable mcsync manifest")
                    manifest = Manifest(path, *pair)
                    try:
                        n, p = await verify_entries(store, manifest.entries(), limits)
                    finally:
                        manifest.close()
                    checked += n
                    problems += p
            return checked, problems
        finally:
            await store.aclose()

    result = guarded(lambda: run_blocking(go()))
    if not isinstance(result, tuple):
        sys.exit(result)
    checked, problems = result
    if as_json:
        write_stdout(json.dumps({"checked": checked, "problems": [
            {"key": k, "problem": p} for k, p in problems]}, indent=2) + "\n")
    for key, problem in problems:
        click.echo(f"mismatch: {key}: {problem}", err=True)
    click.echo(f"verified {counted(checked, 'object')}: {counted(len(problems), 'problem')}",
               err=True)
    sys.exit(EXIT_FAILED if problems else EXIT_OK)


async def _manifests_of(store: Any, tmp: Path) -> list[Path]:
    """Manifests on this machine whose target is ``store``; failing that, the copies kept at
    the target, downloaded into ``tmp``."""
    found = [p for p in sorted(manifest_dir().glob("*.sqlite"))
             if (pair := pair_of(p)) is not None and pair[1] == store.url]
    if found:
        return found
    async for info in store.list():
        if info.key.startswith(".mcsync/manifest-") and info.key.endswith(".sqlite"):
            path = tmp / info.key.rsplit("/", 1)[-1]
            path.write_bytes(bytes(await store.get(info.key)))
            found.append(path)
    return found


@cli.command(name="ls", epilog=EXIT_CODES_HELP)
@click.argument("url")
@click.option("--endpoint-url", default=None, metavar="URL")
@click.option("--profile", default=None)
@_client_cert
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
@click.option("--all", "-a", "show_all", is_flag=True,
              help="Also list mcsync's own state (.mcsync/: manifest copy, lock).")
def ls_cmd(url: str, endpoint_url: str | None, profile: str | None, as_json: bool,
           show_all: bool, client_cert: str | None = None,
           client_key: str | None = None) -> None:
    """List the objects under URL (size, modification time, key)."""

    async def go() -> tuple[int, int]:
        store = open_store(url, StoreOptions(endpoint_url=endpoint_url, profile=profile,
                                             client_cert=client_cert, client_key=client_key))
        count = total = 0
        try:
            await store.check(mode="read")
            async for info in store.list():
                if info.key.startswith(RESERVED_PREFIX) and not show_all:
                    continue
                count += 1
                total += info.size
                if as_json:
                    click.echo(json.dumps({"key": info.key, "size": info.size,
                                           "etag": info.etag, "mtime": info.mtime}))
                else:
                    when = (datetime.fromtimestamp(info.mtime, UTC).strftime("%Y-%m-%d %H:%M:%S")
                            if info.mtime is not None else "-")
                    click.echo(f"{info.size:>14}  {when}  {info.key}")
        finally:
            await store.aclose()
        return count, total

    code = guarded(lambda: run_blocking(go()))
    if isinstance(code, tuple):
        if not as_json:
            click.echo(f"{counted(code[0], 'object')}, {format_size(code[1])}", err=True)
        sys.exit(EXIT_OK)
    sys.exit(code)


cli.add_command(cache_group)
cli.add_command(status_cmd)


def _run(src: str, dst: str, *, dry_run: bool, show_plan: bool, as_json: bool, quiet: bool,
         verbose: bool, no_server_side_copy: bool, no_manifest: bool, no_delta: bool,
         report_path: str | None, long: bool = False,
         metrics_addr: tuple[str, int] | None = None, metrics_file: str | None = None,
         watch: bool = False, interval: float | None = None, min_age: float | None = None,
         **kw: Any) -> int:
    configure_logging(verbose)
    try:
        if interval is not None and not watch:
            raise UsageError("--interval is the time between the cycles of --watch")
        if watch and dry_run:
            raise UsageError("--watch keeps a target current; it cannot be a --dry-run")
        if watch and kw.get("latest_checkpoint"):
            raise UsageError("--latest-checkpoint restores one checkpoint once; it cannot be "
                             "a --watch")
        if min_age is None:
            min_age = 30.0 if watch else 0.0  # a watch meets files as they are written
        shard = kw.pop("shard")
        if shard is not None:
            from ..state.shard import parse as parse_shard

            kw["shard"] = parse_shard(shard)
        kw["workers"] = workers_for(kw["workers"], kw["executor"])
        options = SyncOptions(dry_run=dry_run, server_side_copy=not no_server_side_copy,
                              use_manifest=not no_manifest, delta=not no_delta,
                              include=tuple(kw.pop("include")), exclude=tuple(kw.pop("exclude")),
                              min_age_s=min_age, **kw)
    except UsageError as exc:
        click.echo(f"mcsync: error: {exc}", err=True)
        return EXIT_USAGE
    out = Output(as_json=as_json, quiet=quiet, show_plan=show_plan, long=long,
                 report_path=report_path, metrics_addr=metrics_addr, metrics_file=metrics_file)
    return run_command(src, dst, options, out, _seams(),
                       watch_interval_s=(60.0 if interval is None else interval) if watch
                       else None)


def _botocore_signs_itself() -> None:
    """Keep botocore's own SigV4 signer, in the command's process and the worker processes it
    starts (which inherit its environment). With ``awscrt`` importable (mcsync's CopyObject
    client) botocore signs with the CRT's instead, which costs more per request here: 1,000
    HeadBucket took 0.54-0.62 CPU s with it against 0.51-0.52 with botocore's own (3 runs
    each). ``BOTO_DISABLE_CRT`` is botocore's switch, read when botocore is imported (so this
    does nothing once it is); a value already set wins. Set here, at the command's entry, not
    by the library: a library does not change its caller's environment."""
    os.environ.setdefault("BOTO_DISABLE_CRT", "true")


def _seams() -> Seams:
    ctx = click.get_current_context(silent=True)
    found = ctx.find_object(Seams) if ctx is not None else None
    return found or Seams()


def main(seams: Seams | None = None) -> None:
    tune_process()  # the command's process is the sync's own
    _botocore_signs_itself()
    cli(prog_name="mcsync", obj=seams or Seams())


if __name__ == "__main__":
    main()
