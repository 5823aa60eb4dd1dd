"""``mcsync status DST``: the state mcsync keeps at a target as a table (read by ``status``)."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click

from .. import run_blocking
from ..config import format_size
from ..stores.registry import StoreOptions, open_store
from ..types import RESERVED_PREFIX
from .run import EXIT_CODES_HELP, EXIT_OK, EXIT_USAGE, guarded, write_stdout


@click.command(epilog=EXIT_CODES_HELP)
@click.argument("dst")
@click.option("--endpoint-url", default=None, metavar="URL")
@click.option("--profile", default=None)
@click.option("--json", "as_json", is_flag=True, help="Print the rows as JSON on stdout.")
def status(dst: str, endpoint_url: str | None, profile: str | None, as_json: bool) -> None:
    """Show what the state mcsync keeps at DST says: per pair, or per shard of a pair run with
    --shard, done / running / failed / interrupted / not started, objects and bytes recorded,
    failures and time of the newest run, and when the last run that ended well finished; for
    the last run with --workers, its tasks per worker (done, retried, failed, objects, bytes,
    the slowest, the last done)."""
    import tempfile

    from ..state.status import status as read_status  # the status command's alone

    async def go() -> list[Any]:
        where = dst if dst.endswith("/") else dst + "/"
        state = open_store(where + RESERVED_PREFIX,
                           StoreOptions(endpoint_url=endpoint_url, profile=profile))
        try:
            with tempfile.TemporaryDirectory(prefix="mcsync-status-") as tmp:
                return await read_status(state, Path(tmp))
        finally:
            await state.aclose()

    rows = guarded(lambda: run_blocking(go()))
    if not isinstance(rows, list):
        sys.exit(rows)
    if not rows:
        click.echo(f"mcsync: error: {dst}: no mcsync state there (.mcsync/): nothing was "
                   "synced to it", err=True)
        sys.exit(EXIT_USAGE)
    if as_json:
        write_stdout(json.dumps([r.to_dict() for r in rows], indent=2) + "\n")
        sys.exit(EXIT_OK)

    def when(t: float | None) -> str:
        return (datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M:%S") if t is not None
                else "-")

    click.echo(f"{'pair':<20}  {'shard':>7}  {'state':<12}  {'objects':>9}  {'bytes':>10}  "
               f"{'failed':>6}  {'took':>8}  last success (UTC)")
    for r in rows:
        shard = f"{r.shard[0]}/{r.shard[1]}" if r.shard else "-"
        took = f"{r.elapsed_s:.0f}s" if r.elapsed_s is not None else "-"
        click.echo(f"{r.pair:<20}  {shard:>7}  {r.state:<12}  {r.objects:>9}  "
                   f"{format_size(r.bytes):>10}  {r.failed:>6}  {took:>8}  "
                   f"{when(r.last_success)}" + (f"  ({r.holder})" if r.holder else ""))
    for r in rows:
        if r.tasks:
            _print_tasks(r, when)
    sources = sorted({(r.pair, r.src) for r in rows if r.src})
    for pair, src in sources:
        click.echo(f"{pair}: from {src}", err=True)
    sys.exit(EXIT_OK)


def _print_tasks(r: Any, when: Callable[[float | None], str]) -> None:
    """The tasks of a row's last run with workers, a line per worker (status.ShardStatus)."""
    shard = f" shard {r.shard[0]}/{r.shard[1]}" if r.shard else ""
    run_id, state = r.tasks_run
    click.echo(f"\ntasks of {r.pair}{shard}, run {run_id} ({state}):")
    click.echo(f"{'worker':<28}  {'tasks':>6}  {'retried':>7}  {'failed':>6}  {'objects':>9}  "
               f"{'bytes':>10}  {'slowest':>8}  last done (UTC)")
    for t in r.tasks:
        slowest = f"{t.slowest_s:.1f}s" if t.slowest_s is not None else "-"
        click.echo(f"{t.worker or '(unknown)':<28}  {t.tasks:>6}  {t.retried:>7}  {t.failed:>6}  "
                   f"{t.objects:>9}  {format_size(t.bytes):>10}  {slowest:>8}  "
                   f"{when(t.last_done)}" + (f"  ({t.slowest})" if t.slowest else ""))
