"""Ending background tasks: ``cancel_and_wait``, the one way mcsync stops a task it started
(a lock's renewer, a listing's pump, a run's watchdog and manifest uploader, a watch's file
watcher); ``fail_waiting``, what the futures waiting on a task that failed are told."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any


async def cancel_and_wait(*tasks: asyncio.Task[Any] | None, quiet: bool = False) -> None:
    """Cancel ``tasks`` (None ones are skipped) and wait until each has ended. An error a task
    ended with is raised (the first one), unless ``quiet``; being cancelled is not an error.

    Unlike ``with suppress(CancelledError): await task``, a cancellation of the caller that
    comes while the tasks unwind is not swallowed: it propagates at once (the tasks, cancelled
    already, end on their own). The suppressing form cannot tell the task's CancelledError from
    the caller's, and a second Ctrl-C arriving there was lost."""
    live = [t for t in tasks if t is not None]
    for task in live:
        task.cancel()
    if not live:
        return
    try:
        await asyncio.wait(live)  # raises nothing of theirs; a CancelledError here is ours
    except asyncio.CancelledError:
        for task in live:  # read their outcome when they end: none "never retrieved"
            task.add_done_callback(_outcome)
        raise
    errors = [e for e in map(_outcome, live) if e is not None]
    if errors and not quiet:
        raise errors[0]


def fail_waiting(futures: Iterable[asyncio.Future[Any]], exc: BaseException) -> None:
    """The futures still waiting on work that ended with ``exc``: cancelled when it was
    cancelled, else given its error (a batch sent as one task answers each of its items)."""
    for fut in futures:
        if fut.done():
            continue
        if isinstance(exc, asyncio.CancelledError):
            fut.cancel()
        else:
            fut.set_exception(exc)


def _outcome(task: asyncio.Task[Any]) -> BaseException | None:
    return None if task.cancelled() else task.exception()
