"""One ``sync`` / ``plan`` / ``resume`` command: stores opened from the addresses, a run (or a
watch of cycles) of the engine, its events rendered, its report and metrics written, and what
ended it turned into an exit code."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import select
import signal
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import click

from .. import run_blocking
from ..config import SyncOptions
from ..errors import MCSyncError, NoCheckpoint, UsageError
from ..events import EventSink, FanOut
from ..report import SyncReport, report_json
from ..run.engine import ManifestFactory, close_quietly, run_sync
from ..run.pools import reopenable
from ..state.lock import Locked
from ..state.manifest import Manifest
from ..stores.base import ReadStore
from ..stores.registry import StoreOptions, open_store
from ..stores.single import open_pair
from .progress import (
    ChosenLine,
    FailureLines,
    LogProgress,
    PrunedLines,
    TerminalProgress,
    cycle_line,
    summary,
)

if TYPE_CHECKING:
    from ..observe.metrics import Metrics
    from ..run.watching import Cycle

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_LOCKED, EXIT_INTERRUPTED = 0, 1, 2, 3, 130
# What the commands of a run say of their exit codes (their help's epilog).
EXIT_CODES_HELP = """\b
Exit codes:
  0    everything done (deferred objects are no failure; a --watch stopped
       by SIGTERM/SIGINT ends with 0)
  1    some objects failed (listed; the rest were committed)
  2    usage or configuration error (bad URL, missing bucket, bad credentials,
       unwritable target, --keep-last with no checkpoint under SRC); nothing
       moved. Also: --workers that cannot start, 3 in a row (what moved before
       is recorded; the same command resumes)
  3    another run holds the lock (or the manifest)
  4    --latest-checkpoint found no complete checkpoint under SRC; nothing
       moved
  130  interrupted (state saved; run the same command again to resume)
"""
EXIT_NO_CHECKPOINT = 4  # --latest-checkpoint found none: a first start, nothing to restore


@dataclass(frozen=True)
class Seams:
    """What the command builds a run from: the real ones unless a test hands in its own,
    ``main(Seams(...))`` (the crash harness wraps the stores it opens in faults)."""

    open_source: Callable[[str, StoreOptions], ReadStore] = open_store
    open_target: Callable[[str, StoreOptions], ReadStore] = open_store
    open_manifest: ManifestFactory = Manifest


@dataclass(frozen=True)
class Output:
    """How the command shows and keeps what happened."""

    as_json: bool = False
    quiet: bool = False
    show_plan: bool = False
    long: bool = False
    report_path: str | None = None
    metrics_addr: tuple[str, int] | None = None
    metrics_file: str | None = None


def run_command(src: str, dst: str, options: SyncOptions, out: Output, seams: Seams, *,
                watch_interval_s: float | None = None) -> int:
    """The exit code of one run, or of a watch (cycles every ``watch_interval_s``)."""
    metrics = _metrics_for(out.metrics_addr, out.metrics_file)
    if isinstance(metrics, int):
        return metrics
    watching = watch_interval_s is not None
    if out.quiet or watching:  # a watch logs one line per cycle, not a bar per cycle
        display: Any = FailureLines()
    elif sys.stderr.isatty():
        display = TerminalProgress()
    else:
        display = LogProgress()
    sinks: list[EventSink] = [display]
    if options.latest_checkpoint and not out.quiet:
        sinks.append(ChosenLine())
    if options.keep_last is not None and not out.quiet and not options.dry_run:
        sinks.append(PrunedLines())
    if out.show_plan and not out.as_json:
        from .plan_view import PlanLines, PlanSummary

        sinks.append(PlanLines() if out.long else PlanSummary())
    if metrics is not None:
        sinks.append(metrics)

    async def go(stop: asyncio.Event) -> SyncReport | Cycle | None:
        opened: list[ReadStore] = []
        try:
            pair = await open_pair(src, dst, seams.open_source, seams.open_target,
                                   options.store_options("source"),
                                   options.store_options("target"), delete=options.delete)
            roles: tuple[Literal["source", "target"], ...] = ("source", "target")
            for store, role in zip(pair, roles, strict=True):
                opened.append(store if metrics is None else metrics.wrap(store, role))
            if watch_interval_s is None:
                run_options, addresses = reopenable(pair[0], pair[1], options)
                return await run_sync(opened[0], opened[1], run_options, FanOut(sinks),
                                      stop=stop, manifest_factory=seams.open_manifest,
                                      addresses=addresses)
            from ..run.watching import watch  # watchfiles only for a watch

            return await watch(opened[0], opened[1], options, FanOut(sinks), stop,
                               interval_s=watch_interval_s,
                               on_cycle=lambda cycle: _cycle_done(cycle, out, metrics),
                               manifest_factory=seams.open_manifest)
        finally:
            await asyncio.gather(*(close_quietly(store) for store in opened))

    with contextlib.ExitStack() as serving:
        if metrics is not None and out.metrics_addr is not None:
            host, port = out.metrics_addr
            try:
                serving.enter_context(metrics.serving(host, port))
            except OSError as exc:
                click.echo(f"mcsync: error: --metrics-addr {host}:{port}: "
                           f"{exc.strerror or exc}", err=True)
                display.close()
                return EXIT_USAGE
        result = guarded(lambda: run_blocking(until_signalled(go, options.grace_s, watching)))
    if metrics is not None and not (watching and not isinstance(result, int)):
        _metrics_done(metrics, result, out.metrics_file)  # a watch wrote them per cycle
    display.close()
    if isinstance(result, int):
        return result
    if watching:
        return EXIT_OK  # a stop is how a watch ends; each cycle was reported as it ended
    assert isinstance(result, SyncReport)
    for sink in sinks[1:]:
        if sink is not metrics and not isinstance(sink, ChosenLine | PrunedLines):
            sink.close()  # type: ignore[attr-defined]
    if out.as_json:
        write_stdout(report_json(result.to_dict()) + "\n")
    if out.report_path:
        write_report(Path(out.report_path), result.to_dict())
    if result.manifest_note:
        click.echo(f"mcsync: note: {result.manifest_note}", err=True)
    if not out.quiet:
        click.echo(summary(result), err=True)
        if result.limited_by is not None and result.limited_by.verdict != "none":
            click.echo(f"mcsync: {result.limited_by.describe()}", err=True)
        if result.concurrency is not None:
            click.echo(f"mcsync: {result.concurrency.describe()}", err=True)
    if result.interrupted:
        click.echo("mcsync: interrupted: state saved; run the same command again to resume",
                   err=True)
    return result.exit_code


def _cycle_done(cycle: Cycle, out: Output, metrics: Metrics | None) -> None:
    """After each cycle of a watch: its line, its report, its metrics."""
    failed = cycle.report is None or cycle.report.objects_failed > 0
    if not out.quiet or failed:
        click.echo(cycle_line(cycle), err=True)
    if cycle.report is not None and cycle.report.manifest_note:
        click.echo(f"mcsync: note: {cycle.report.manifest_note}", err=True)
    if out.report_path:
        doc: dict[str, Any] = {"cycle": cycle.number,
                               "cycle_started_at": datetime.fromtimestamp(
                                   cycle.started, UTC).isoformat(timespec="seconds")}
        if cycle.report is not None:
            doc |= cycle.report.to_dict()
        else:
            doc |= {"error": cycle.error, "exit_code": EXIT_FAILED}
        try:
            write_report(Path(out.report_path), doc)
        except OSError as exc:
            click.echo(f"mcsync: warning: could not write --report {out.report_path}: "
                       f"{exc.strerror or exc}", err=True)
    if metrics is not None:
        if cycle.report is None:
            metrics.run_aborted("error")
        if out.metrics_file is not None:
            _write_metrics(metrics, out.metrics_file)


def write_stdout(text: str) -> None:
    """Write ``text`` to standard output whole: what a command prints after its run (a JSON
    report can be hundreds of KB). Right after uvloop closes its loop, a write of more than
    a pipe holds (64 KiB) to a slow reader came back short, and Python's stream dropped the
    rest: ``--json | (sleep 2; wc -c)`` got 65,536 of 349,449 bytes, exit 0. So the bytes
    go out here, written again from where a short write stopped."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # a test runner's stream: no descriptor
        click.echo(text, nl=False)
        return
    sys.stdout.flush()
    view = memoryview(text.encode())
    while view:
        try:
            view = view[os.write(fd, view):]
        except BlockingIOError:  # a descriptor someone made non-blocking: wait until it drains
            select.select([], [fd], [])


def write_report(path: Path, doc: dict[str, Any]) -> None:
    """The JSON report, replaced whole (a reader never sees half of it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(report_json(doc))
    tmp.replace(path)


def _metrics_for(addr: tuple[str, int] | None, path: str | None) -> Metrics | int | None:
    """The run's metrics when --metrics-addr or --metrics-file asks for them (None otherwise),
    or EXIT_USAGE when the file could never be written: found out before anything moves."""
    if addr is None and path is None:
        return None
    from prometheus_client import disable_created_metrics

    from ..observe.metrics import Metrics

    # No *_created series: this process is the command's own. (prometheus_client is untyped.)
    disable_created_metrics()  # type: ignore[no-untyped-call]
    metrics = Metrics()
    if path is not None:
        where = Path(path).parent
        try:
            where.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            click.echo(f"mcsync: error: --metrics-file {path}: {exc.strerror or exc}", err=True)
            return EXIT_USAGE
        if not os.access(where, os.W_OK | os.X_OK):
            click.echo(f"mcsync: error: --metrics-file {path}: {where} is not writable",
                       err=True)
            return EXIT_USAGE
        metrics.carry_over(Path(path))
    return metrics


def _metrics_done(metrics: Metrics, result: Any, path: str | None) -> None:
    """Count a run that ended without a report, and write the textfile."""
    if isinstance(result, int):
        metrics.run_aborted("locked" if result == EXIT_LOCKED else
                            "interrupted" if result == EXIT_INTERRUPTED else "error")
    if path is not None:
        _write_metrics(metrics, path)


def _write_metrics(metrics: Metrics, path: str) -> None:
    try:
        metrics.write_textfile(Path(path))
    except OSError as exc:
        click.echo(f"mcsync: warning: could not write --metrics-file {path}: "
                   f"{exc.strerror or exc}", err=True)


async def until_signalled(start: Callable[[asyncio.Event], Awaitable[Any]], grace_s: float,
                          watching: bool = False) -> Any:
    """Run the engine with SIGINT/SIGTERM turned into a stop request: work in flight gets
    ``grace_s`` seconds, then the state is saved and the run ends (exit 130; a watch: 0). A
    second signal stops at once (still saving state)."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    main = asyncio.current_task()
    what = "the cycle in flight" if watching else "work in flight"

    def on_signal(signame: str) -> None:
        if stop.is_set():
            click.echo(f"mcsync: {signame} again: stopping now", err=True)
            if main is not None:
                main.cancel()
            return
        click.echo(f"mcsync: {signame}: finishing {what} (up to {grace_s:.0f}s), then saving "
                   "state", err=True)
        stop.set()

    installed = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(sig, on_signal, sig.name)
            installed.append(sig)
        except (NotImplementedError, RuntimeError, ValueError):
            pass  # not the main thread (e.g. embedded): the caller handles signals
    try:
        return await start(stop)
    finally:
        for sig in installed:
            loop.remove_signal_handler(sig)


def guarded(fn: Callable[[], Any]) -> Any:
    """Run ``fn``; turn the errors a user can act on into one line and an exit code."""
    try:
        return fn()
    except NoCheckpoint as exc:
        click.echo(f"mcsync: no checkpoint: {exc}", err=True)
        return EXIT_NO_CHECKPOINT
    except UsageError as exc:  # ConfigError included
        click.echo(f"mcsync: error: {exc}", err=True)
        return EXIT_USAGE
    except Locked as exc:
        click.echo(f"mcsync: locked: {exc}", err=True)
        return EXIT_LOCKED
    except MCSyncError as exc:
        click.echo(f"mcsync: error: {exc}", err=True)
        return EXIT_FAILED
    except (KeyboardInterrupt, asyncio.CancelledError):
        click.echo("mcsync: interrupted", err=True)
        return EXIT_INTERRUPTED


def configure_logging(verbose: bool) -> None:
    logging.basicConfig(level=logging.DEBUG if verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr,
                        force=True)
    # At DEBUG, botocore logs every request's headers: the access key and the session token
    # among them. Credentials never reach a log, so the SDKs stay at INFO whatever -v says.
    for sdk in ("botocore", "aiobotocore", "s3transfer", "urllib3"):
        logging.getLogger(sdk).setLevel(logging.INFO)
