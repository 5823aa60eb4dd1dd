"""The ``mcsync`` command: click options → SyncOptions → engine; events → progress display."""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import click

from .. import run_blocking
from ..config import DEFAULT_CONCURRENCY, SyncOptions, format_size, parse_size
from ..engine import run_sync
from ..errors import MCSyncError, UsageError
from ..events import Event, FanOut, ObjectPlanned
from ..report import SyncReport
from ..stores.registry import open_store
from .progress import FailureLines, LogProgress, TerminalProgress, summary

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_LOCKED, EXIT_INTERRUPTED = 0, 1, 2, 3, 130

EXIT_CODES_HELP = """\b
Exit codes:
  0    everything done
  1    some objects failed (listed; the rest were committed)
  2    usage or configuration error (bad URL, missing bucket, bad credentials); nothing moved
  3    another run holds the lock
  130  interrupted
"""


class _Size(click.ParamType):
    name = "size"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int):
            return value
        try:
            return parse_size(value)
        except UsageError as exc:
            self.fail(str(exc), param, ctx)


SIZE = _Size()


def _sync_options(f: Callable[..., Any]) -> Callable[..., Any]:
    opts = [
        click.option("--concurrency", "-c", type=click.IntRange(min=1),
                     default=DEFAULT_CONCURRENCY, show_default=True,
                     help="Requests in flight."),
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
        click.option("--no-server-side-copy", is_flag=True,
                     help="Move bytes through this client even when both sides share an "
                          "endpoint."),
        click.option("--json", "as_json", is_flag=True,
                     help="Print the report as JSON on stdout."),
        click.option("--quiet", "-q", is_flag=True, help="No progress, no summary; failures only."),
        click.option("--verbose", "-v", is_flag=True, help="Debug logging."),
    ]
    for opt in reversed(opts):
        f = opt(f)
    return f


@click.group(epilog=EXIT_CODES_HELP)
@click.version_option(package_name="mcsync")
def cli() -> None:
    """Move ML datasets and checkpoints between S3, Meta Storage (meta://) and local disk."""


@cli.command(epilog=EXIT_CODES_HELP)
@click.argument("src")
@click.argument("dst")
@_sync_options
@click.option("--dry-run", "-n", is_flag=True, help="Plan and report; move nothing.")
def sync(src: str, dst: str, dry_run: bool, **kw: Any) -> None:
    """Make DST hold what SRC holds (new and changed objects are copied)."""
    sys.exit(_run(src, dst, dry_run=dry_run, show_plan=dry_run, long=True, **kw))


@cli.command(epilog=EXIT_CODES_HELP)
@click.argument("src")
@click.argument("dst")
@_sync_options
@click.option("--long", "-l", "long", is_flag=True, help="One line per object to change.")
def plan(src: str, dst: str, **kw: Any) -> None:
    """Show what `sync` would do, and the bytes it would move. Moves nothing."""
    sys.exit(_run(src, dst, dry_run=True, show_plan=True, **kw))


@cli.command(name="ls", epilog=EXIT_CODES_HELP)
@click.argument("url")
@click.option("--endpoint-url", default=None, metavar="URL")
@click.option("--profile", default=None)
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
def ls_cmd(url: str, endpoint_url: str | None, profile: str | None, as_json: bool) -> None:
    """List the objects under URL (size, modification time, key)."""

    async def go() -> tuple[int, int]:
        store = open_store(url, SyncOptions(endpoint_url=endpoint_url, profile=profile))
        count = total = 0
        try:
            await store.check(mode="read")
            async for info in store.list():
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

    code = _guarded(lambda: run_blocking(go()))
    if isinstance(code, tuple):
        if not as_json:
            click.echo(f"{code[0]} objects, {format_size(code[1])}", err=True)
        sys.exit(EXIT_OK)
    sys.exit(code)


def _run(src: str, dst: str, *, dry_run: bool, show_plan: bool, as_json: bool, quiet: bool,
         verbose: bool, no_server_side_copy: bool, long: bool = False, **kw: Any) -> int:
    logging.basicConfig(level=logging.DEBUG if verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr,
                        force=True)
    try:
        options = SyncOptions(dry_run=dry_run, server_side_copy=not no_server_side_copy,
                              include=tuple(kw.pop("include")), exclude=tuple(kw.pop("exclude")),
                              **kw)
    except UsageError as exc:
        click.echo(f"mcsync: error: {exc}", err=True)
        return EXIT_USAGE
    if quiet:
        display: Any = FailureLines()
    elif sys.stderr.isatty():
        display = TerminalProgress()
    else:
        display = LogProgress()
    sinks: list[Any] = [display]
    if show_plan and not as_json:
        sinks.append(_PlanPrinter() if long else _PlanSummary())
    result = _guarded(lambda: run_blocking(run_sync(src, dst, options, FanOut(sinks))))
    display.close()
    if isinstance(result, SyncReport):
        for sink in sinks[1:]:
            sink.close()
    if not isinstance(result, SyncReport):
        return result
    if as_json:
        click.echo(json.dumps(result.to_dict(), indent=2))
    if not quiet:
        click.echo(summary(result), err=True)
    return result.exit_code


class _PlanPrinter:
    """Each planned change on its own line (``plan --long``)."""

    def emit(self, event: Event) -> None:
        if isinstance(event, ObjectPlanned) and event.action != "skip":
            click.echo(f"{event.action:<12} {format_size(event.size):>10}  {event.key}"
                       f"  ({event.reason})")

    def close(self) -> None:
        pass


class _PlanSummary:
    """A plan at a glance: objects and bytes per action, and per top-level directory."""

    def __init__(self) -> None:
        self.by_action: dict[str, list[int]] = {}
        self.by_dir: dict[str, dict[str, list[int]]] = {}

    def emit(self, event: Event) -> None:
        if not isinstance(event, ObjectPlanned):
            return
        tally = self.by_action.setdefault(event.action, [0, 0])
        tally[0] += 1
        tally[1] += event.size
        top = event.key.split("/", 1)[0] + "/" if "/" in event.key else "(top level)"
        if len(self.by_dir) < 50 or top in self.by_dir:  # bounded, whatever the key count
            d = self.by_dir.setdefault(top, {}).setdefault(event.action, [0, 0])
            d[0] += 1
            d[1] += event.size

    def close(self) -> None:
        click.echo(f"{'action':<12} {'objects':>10} {'bytes':>12}")
        for action in ("copy", "server_copy", "delete", "skip"):
            n, size = self.by_action.get(action, (0, 0))
            click.echo(f"{action:<12} {n:>10} {format_size(size):>12}")
        if len(self.by_dir) > 1:
            click.echo("")
            click.echo(f"{'directory':<28} {'changes':>10} {'bytes to move':>14} {'skipped':>9}")
            for top, actions in sorted(self.by_dir.items()):
                moving = [v for a, v in actions.items() if a != "skip"]
                n = sum(v[0] for v in moving)
                size = sum(v[1] for v in moving)
                skipped = actions.get("skip", [0, 0])[0]
                click.echo(f"{top[:28]:<28} {n:>10} {format_size(size):>14} {skipped:>9}")


def _guarded(fn: Callable[[], Any]) -> Any:
    """Run ``fn``; turn the errors a user can act on into one line and an exit code."""
    try:
        return fn()
    except UsageError as exc:  # ConfigError included
        click.echo(f"mcsync: error: {exc}", err=True)
        return EXIT_USAGE
    except MCSyncError as exc:
        click.echo(f"mcsync: error: {exc}", err=True)
        return EXIT_FAILED
    except KeyboardInterrupt:
        click.echo("mcsync: interrupted", err=True)
        return EXIT_INTERRUPTED


def main() -> None:
    cli(prog_name="mcsync")


if __name__ == "__main__":
    main()
