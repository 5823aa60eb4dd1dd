"""``mcsync cache warm | ls | verify | evict``: the node cache (``mcsync.cache``) from the
command line. The cache code returns records; what is printed is decided here."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from ..config import format_size, parse_size
from ..errors import UsageError
from .progress import LogProgress, TerminalProgress, counted
from .run import EXIT_FAILED, EXIT_OK, configure_logging, guarded, write_stdout

if TYPE_CHECKING:
    from ..cache import Cache
    from ..events import EventSink

CACHE_EXIT_CODES = """\b
Exit codes:
  0    done (warm: also when it stopped because the next object would not
       fit; what it left out is listed)
  1    warm: some objects failed or were not found; verify: corrupt entries
       found (and dropped); verify --against: also entries that differ from
       what mcsync wrote to the target
  2    usage or configuration error (bad address, no cache directory, a
       cache directory on a network or FUSE filesystem; verify --against: no
       manifest kept at the target)
"""


def _cache_dir(f: Any) -> Any:
    return click.option("--cache-dir", envvar="MCSYNC_CACHE_DIR", required=True,
                        metavar="DIR", help="The cache directory (default: $MCSYNC_CACHE_DIR).",
                        )(f)


def _open(cache_dir: str, *, max_size: str | None = None, validate: str = "ttl:60s",
          part_size: str = "16MiB", endpoint_url: str | None = None,
          profile: str | None = None, on_event: EventSink | None = None) -> Cache:
    from ..cache import Cache
    from ..stores.registry import StoreOptions

    size = parse_size(max_size) if max_size is not None else None
    part = parse_size(part_size)
    if part < 1:
        raise UsageError(f"--part-size {part_size}: a part holds at least one byte")
    return Cache(cache_dir, max_size=size, validate=validate, part_size=part, on_event=on_event,
                 options=StoreOptions(endpoint_url=endpoint_url, profile=profile))


@click.group(name="cache", epilog=CACHE_EXIT_CODES)
def cache() -> None:
    """A node-local cache of remote objects, shared by the processes that use its directory."""


@cache.command(epilog=CACHE_EXIT_CODES)
@click.argument("url")
@_cache_dir
@click.option("--max-size", default=None, metavar="SIZE",
              help="The cache's limit (recorded in the directory; default: the recorded one).")
@click.option("--order", "order_file", type=click.File("r"), default=None, metavar="FILE",
              help="Warm in this order: one key a line, relative to URL; only these keys.")
@click.option("--validate", default="ttl:60s", metavar="never|ttl:DURATION|always",
              show_default=True)
@click.option("--part-size", default="16MiB", metavar="SIZE", show_default=True,
              help="Bytes per range GET (a killed warm resumes an object by whole parts).")
@click.option("--endpoint-url", default=None, metavar="URL")
@click.option("--profile", default=None)
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON on stdout.")
@click.option("--verbose", "-v", is_flag=True, help="A line per object (instead of progress).")
@click.option("--quiet", "-q", is_flag=True, help="No progress; failures and the summary only.")
@click.option("--metrics-file", default=None, metavar="PATH",
              help="Write the cache's metrics there at the end (node_exporter textfile).")
def warm(url: str, cache_dir: str, max_size: str | None, order_file: Any, validate: str,
         part_size: str, endpoint_url: str | None, profile: str | None, as_json: bool,
         verbose: bool, quiet: bool, metrics_file: str | None) -> None:
    """Fetch the objects under URL into the cache, stopping (exit 0) when the next one would
    only fit by evicting one this warm brought in."""
    from ..cache.warm import read_order
    from ..cache.warm import warm as warm_objects

    configure_logging(False)
    started = time.monotonic()

    def say(obj: str, state: str, size: int) -> None:
        if verbose:
            click.echo(f"{state}: {obj} ({format_size(size)})", err=True)

    from ..events import FanOut

    sinks: list[EventSink] = []
    display: TerminalProgress | LogProgress | None = None
    if not (verbose or quiet):  # progress as a sync shows it: a bar, or a line every 5 s
        display = TerminalProgress() if sys.stderr.isatty() else LogProgress()
        sinks.append(display)
    metrics = None
    if metrics_file is not None:
        from ..observe.metrics import Metrics

        metrics = Metrics()
        sinks.append(metrics)

    def go() -> Any:
        order = read_order(order_file.read()) if order_file is not None else None
        with _open(cache_dir, max_size=max_size, validate=validate, part_size=part_size,
                   endpoint_url=endpoint_url, profile=profile,
                   on_event=FanOut(sinks) if sinks else None) as c:
            try:
                return c.run(warm_objects(c, url, order, on_object=say))
            finally:
                if display is not None:
                    display.close()
                if metrics is not None and metrics_file is not None:
                    metrics.write_textfile(Path(metrics_file))

    report = guarded(go)
    if isinstance(report, int):
        sys.exit(report)
    took = time.monotonic() - started
    if as_json:
        write_stdout(json.dumps({
            "fetched": report.fetched, "present": report.present, "left_out": report.left_out,
            "failed": [{"url": u, "error": e} for u, e in report.failed],
            "missing": report.missing, "bytes_fetched": report.bytes_fetched,
            "why_stopped": report.why_stopped, "elapsed_s": round(took, 3)}, indent=2) + "\n")
    for obj, error in report.failed:
        click.echo(f"failed: {obj}: {error}", err=True)
    for obj in report.missing:
        click.echo(f"not found: {obj}", err=True)
    click.echo(f"warmed {counted(len(report.fetched), 'object')} "
               f"({format_size(report.bytes_fetched)} fetched in {took:.1f} s), "
               f"{counted(len(report.present), 'object')} already cached", err=True)
    if report.left_out:
        click.echo(f"left out {counted(len(report.left_out), 'object')}, from "
                   f"{report.left_out[0]}: {report.why_stopped}", err=True)
        if verbose:
            for obj in report.left_out:
                click.echo(f"  left out: {obj}", err=True)
    sys.exit(EXIT_FAILED if report.failed or report.missing else EXIT_OK)


@cache.command(name="ls", epilog=CACHE_EXIT_CODES)
@click.argument("prefix", required=False, default="")
@_cache_dir
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
def ls_cmd(prefix: str, cache_dir: str, as_json: bool) -> None:
    """The cache's entries (under PREFIX): state, size, last use, URL."""
    from ..cache.index import pinned

    def go() -> Any:
        with _open(cache_dir) as c:
            return c.entries(prefix), c.in_use(), c.max_size, c.index.pins()

    got = guarded(go)
    if isinstance(got, int):
        sys.exit(got)
    entries, in_use, limit, pins = got
    lines = []
    for e in entries:
        if as_json:
            lines.append(json.dumps({"url": e.url, "version": e.version, "size": e.size,
                                     "state": e.state, "last_access": e.last_access,
                                     "pinned": pinned(e.url, pins)}))
        else:
            when = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(e.last_access))
            lines.append(f"{e.state:8} {e.size:>14} {when}  {e.url}")
    if lines:
        write_stdout("\n".join(lines) + "\n")
    click.echo(f"{counted(len(entries), 'entry', 'entries')}; {format_size(in_use)} in use"
               + (f" of {format_size(limit)}" if limit else " (no limit)"), err=True)
    sys.exit(EXIT_OK)


@cache.command(epilog=CACHE_EXIT_CODES)
@_cache_dir
@click.option("--against", default=None, metavar="TARGET",
              help="Compare the entries under TARGET (a prefix mcsync synced to, e.g. "
                   "meta://bucket/ds/) with the chunk hashes in the manifest mcsync keeps "
                   "there; entries it has no hashes for are re-hashed as without it.")
@click.option("--endpoint-url", default=None, metavar="URL")
@click.option("--profile", default=None)
def verify(cache_dir: str, against: str | None, endpoint_url: str | None,
           profile: str | None) -> None:
    """Re-hash every complete entry; drop those whose bytes are not what was fetched (with
    --against: not what mcsync wrote to the target)."""
    def go() -> Any:
        with _open(cache_dir, endpoint_url=endpoint_url, profile=profile) as c:
            if against is None:
                return len(c.entries()), c.verify(), None
            from ..cache.against import target_of, verify_against
            from ..run.target_manifests import TargetManifests

            with c.run(TargetManifests.fetch(against, c.store_options)) as recorded:
                report = verify_against(c.entries(target_of(recorded)), c.layout, recorded,
                                        c.room.drop)
            return report.recorded + report.unrecorded, report.bad, report

    got = guarded(go)
    if isinstance(got, int):
        sys.exit(got)
    checked, bad, report = got
    for entry, problem in bad:
        click.echo(f"corrupt: {entry.url}: {problem} (dropped)", err=True)
    summary = (f"verified {counted(checked, 'entry', 'entries')}: "
               f"{counted(len(bad), 'corrupt entry', 'corrupt entries')}")
    if report is not None:
        summary += (f" ({report.recorded} against the manifest at {report.target}, "
                    f"{report.unrecorded} it has no hashes for against their own digests)")
    click.echo(summary, err=True)
    sys.exit(EXIT_FAILED if bad else EXIT_OK)


@cache.command(epilog=CACHE_EXIT_CODES)
@click.argument("prefix", required=False, default="")
@_cache_dir
def evict(prefix: str, cache_dir: str) -> None:
    """Evict the entries (under PREFIX) that are neither pinned nor open."""
    def go() -> Any:
        with _open(cache_dir) as c:
            return c.evict(prefix)

    got = guarded(go)
    if isinstance(got, int):
        sys.exit(got)
    click.echo(f"evicted {counted(len(got), 'entry', 'entries')} "
               f"({format_size(sum(e.size for e in got))})", err=True)
    sys.exit(EXIT_OK)


__all__ = ["cache"]
