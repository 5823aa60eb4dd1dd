"""Before a run touches anything: does the pair make sense, and do both stores answer as
they should? A bad setup is a one-line error (exit 2) before any byte moves."""

from __future__ import annotations

import asyncio
import os

from ..config import SyncOptions
from ..errors import UsageError
from ..stores.base import CheckMode, LocalTree, ReadStore, Store


async def check_pair(source: ReadStore, target: ReadStore, options: SyncOptions) -> Store:
    """Both sides usable (ConfigError, exit 2, when not); the target as a Store."""
    store = writable_pair(source, target)
    await check_stores(source, store, options)
    return store


def writable_pair(source: ReadStore, target: ReadStore) -> Store:
    """The target as a Store, once the pair makes sense (UsageError, exit 2, when not)."""
    refuse_nested(source, target)  # before check(), which may create the target directory
    if not isinstance(target, Store):
        raise UsageError(f"{target.url}: a source only: mcsync reads it but cannot write to it")
    return target


async def check_stores(source: ReadStore, target: Store, options: SyncOptions) -> None:
    """Both stores answer as they should (ConfigError, exit 2, when not)."""
    mode: CheckMode = "plan" if options.dry_run else "write"
    if not target.facts.round_trips:
        # After the source's: checking a directory may create it, and a run whose source
        # cannot be read should leave nothing behind. It costs no round trip to wait.
        await source.check(mode="read")
        await target.check(mode=mode)
        return
    # Two remote sides are checked at once: over a WAN each check is a round trip or two
    # before anything else can start. The source's failure is the one told when both fail.
    checks = await asyncio.gather(source.check(mode="read"), target.check(mode=mode),
                                  return_exceptions=True)
    for outcome in checks:
        if isinstance(outcome, BaseException):
            raise outcome


def refuse_nested(src: ReadStore, dst: ReadStore) -> None:
    """Raise UsageError when ``src`` and ``dst`` are local directories one of which holds the
    other (or the same one): a target inside the source would be listed as source and copied
    into itself, run after run; a source inside the target would be written into (and, with
    --delete, deleted as a target key missing at the source). Paths are compared resolved, so
    a symlink does not hide the nesting. Stores of other kinds: nothing to say."""
    if not (isinstance(src, LocalTree) and isinstance(dst, LocalTree)):
        return
    real_src, real_dst = os.path.realpath(src.root), os.path.realpath(dst.root)
    if real_src == real_dst:
        raise UsageError(f"{dst.url}: the target is the source directory itself")
    if real_dst.startswith(real_src.rstrip(os.sep) + os.sep):
        raise UsageError(f"{dst.url}: the target is inside the source {src.url}: mcsync would "
                         "copy its own output back into it; choose a target outside the source")
    if real_src.startswith(real_dst.rstrip(os.sep) + os.sep):
        raise UsageError(f"{src.url}: the source is inside the target {dst.url}: writing the "
                         "target would change the source; choose a target outside it")
