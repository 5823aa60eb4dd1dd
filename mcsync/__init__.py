"""mcsync: move ML datasets and checkpoints to Meta Storage, fast and resumably.

    import mcsync
    report = mcsync.sync("s3://datasets/llama-ft/", "meta://ckpt-store/llama-ft/")
    report = await mcsync.async_sync(src, dst, concurrency=64, on_event=print)

Options are the fields of ``SyncOptions``, given as a record, as keywords, or both (keywords
win). ``stop`` ends a run as SIGTERM ends the command: work in flight finishes or is
journalled, state is saved, the report says ``interrupted`` (exit code 130), and the same
call again resumes.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import difflib
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from ._version import __version__
from .config import StoreOptions, SyncOptions, parse_duration
from .errors import (
    ConfigError,
    IntegrityError,
    Locked,
    MCSyncError,
    NoCheckpoint,
    NotFound,
    Permanent,
    PreconditionFailed,
    Transient,
    UnsafeKey,
    UsageError,
)
from .events import CallbackSink, Event, EventSink
from .report import ObjectFailure, ObjectResult, SyncReport
from .stores.base import ReadStore, Store

if TYPE_CHECKING:
    from .run.watching import Cycle

__all__ = [
    "ConfigError",
    "Cycle",
    "Event",
    "EventSink",
    "IntegrityError",
    "Locked",
    "MCSyncError",
    "NoCheckpoint",
    "NotFound",
    "ObjectFailure",
    "ObjectResult",
    "Permanent",
    "PreconditionFailed",
    "ReadStore",
    "Store",
    "StoreOptions",
    "SyncOptions",
    "SyncReport",
    "Transient",
    "UnsafeKey",
    "UsageError",
    "__version__",
    "async_sync",
    "async_watch",
    "sync",
    "tune_process",
    "watch",
]

T = TypeVar("T")
OnEvent = EventSink | Callable[[Event], None] | None
# The blocking forms also take a threading.Event: blocking code stops a run from another
# thread (a signal handler, a trainer's loop), where an asyncio.Event may not be set.
Stop = asyncio.Event | threading.Event | None


async def async_sync(src: str | ReadStore, dst: str | Store, options: SyncOptions | None = None,
                     *, stop: asyncio.Event | None = None, on_event: OnEvent = None,
                     **overrides: Any) -> SyncReport:
    """Sync ``src`` to ``dst`` in the running event loop; the run's report. Each side is an
    address (``s3://``, ``meta://``, ``gs://``, ``az://``, a path), opened with that side's
    ``StoreOptions`` (``SyncOptions.source`` / ``.target``) and closed at the end, or a store
    object (``mcsync.stores``: one of your own, or wrapped), which stays open, yours to close.
    ``overrides`` are fields of ``SyncOptions`` (a name that is not one is a TypeError).
    Setting ``stop`` ends the run gracefully (see the module's doc). ``on_event`` receives
    every engine event (``mcsync.events``), on the loop's thread. Raises ``UsageError`` /
    ``ConfigError`` before anything moves, ``Locked`` when another run holds the pair;
    per-object failures are in the report (``failures``, ``exit_code`` 1)."""
    from .run.engine import run_sync
    from .run.pools import reopenable

    opts = _options(options, overrides)
    async with _opened(src, dst, opts) as (source, target):
        addresses = None
        if opts.workers and isinstance(src, str) and isinstance(dst, str):
            opts, addresses = reopenable(source, target, opts)
        return await run_sync(source, target, opts, _sink(on_event), stop=stop,
                              addresses=addresses)


def sync(src: str | ReadStore, dst: str | Store, options: SyncOptions | None = None, *,
         stop: Stop = None, on_event: OnEvent = None, **overrides: Any) -> SyncReport:
    """Blocking form of :func:`async_sync` (its own event loop, on uvloop if installed).
    ``stop`` may also be a ``threading.Event``, set from another thread."""
    opts = _options(options, overrides)  # a bad option is refused here, in the caller's thread
    return _blocking(lambda ended: async_sync(src, dst, opts, stop=ended, on_event=on_event),
                     stop)


async def async_watch(src: str | ReadStore, dst: str | Store, options: SyncOptions | None = None,
                      *, stop: asyncio.Event | None = None, on_event: OnEvent = None,
                      interval: float | str = 60.0,
                      on_cycle: Callable[[Cycle], Awaitable[None] | None] | None = None,
                      **overrides: Any) -> Cycle | None:
    """Keep ``dst`` current, as ``mcsync sync --watch`` does: a run (a *cycle*) every
    ``interval`` seconds (or a duration such as ``"5m"``) from one start to the next, sooner
    when files of a local source change, under the pair's lock, until ``stop`` is set (or
    the task is cancelled); the last cycle. ``on_cycle`` is handed each cycle as it ends: its
    report, or the error that failed it (a failed cycle is tried again at the next interval;
    only a setup error or ``Locked`` ends the watch, raised). Unless ``options`` or
    ``min_age_s=`` says otherwise, files modified in the last 30 s wait for a later cycle
    (they may still be written). A stop lets the cycle in flight finish within ``grace_s``."""
    from .run.watching import watch as watching

    opts = _options(options, overrides)
    if options is None and "min_age_s" not in overrides:
        opts = dataclasses.replace(opts, min_age_s=30.0)  # as the command's --watch
    interval_s = parse_duration(interval) if isinstance(interval, str) else float(interval)
    async with _opened(src, dst, opts) as (source, target):
        return await watching(source, target, opts, _sink(on_event), stop or asyncio.Event(),
                              interval_s=interval_s, on_cycle=on_cycle)


def watch(src: str | ReadStore, dst: str | Store, options: SyncOptions | None = None, *,
          stop: Stop = None, on_event: OnEvent = None, interval: float | str = 60.0,
          on_cycle: Callable[[Cycle], Awaitable[None] | None] | None = None,
          **overrides: Any) -> Cycle | None:
    """Blocking form of :func:`async_watch`: returns once ``stop`` is set (an
    ``asyncio.Event`` set from ``on_event`` / ``on_cycle``, or a ``threading.Event`` set
    from another thread)."""
    _options(options, overrides)  # refused here, in the caller's thread

    def watching(ended: asyncio.Event) -> Coroutine[Any, Any, Cycle | None]:
        return async_watch(src, dst, options, stop=ended, on_event=on_event, interval=interval,
                           on_cycle=on_cycle, **overrides)

    return _blocking(watching, stop)


def tune_process() -> None:
    """Tune this process for moving data, as the ``mcsync`` command does: glibc's malloc keeps
    freed part buffers for reuse and the garbage collector runs less often. Opt-in: these are
    the whole process's settings, which a host (a trainer, a notebook) may have chosen for
    itself. Call it once, early, after your imports, in a process whose job is a sync. The
    process's environment is left as it is (the command's entry point sets what it needs:
    ``cli.main.main``)."""
    _keep_freed_buffers()
    _collect_less()


def __getattr__(name: str) -> Any:
    if name == "Cycle":  # in watching, which imports the engine: loaded when asked for
        from .run.watching import Cycle

        return Cycle
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _options(options: SyncOptions | None, overrides: dict[str, Any]) -> SyncOptions:
    if options is not None and not isinstance(options, SyncOptions):
        raise TypeError(f"options must be mcsync.SyncOptions, got {type(options).__name__}")
    base = options or SyncOptions()
    if not overrides:
        return _ray_workers(base)
    known = [f.name for f in dataclasses.fields(SyncOptions)]
    for name in overrides:
        if name not in known:
            close = difflib.get_close_matches(name, known, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise TypeError(f"unknown option {name!r} (not a field of mcsync.SyncOptions){hint}")
    if "workers" in overrides:  # as --workers: auto is the cores here, or the Ray cluster's
        from .config import workers_for

        overrides["workers"] = workers_for(overrides["workers"],
                                           overrides.get("executor", base.executor))
    for name in ("include", "exclude"):
        if isinstance(overrides.get(name), str):
            overrides[name] = (overrides[name],)
        elif name in overrides:
            overrides[name] = tuple(overrides[name])
    return _ray_workers(dataclasses.replace(base, **overrides))


def _ray_workers(options: SyncOptions) -> SyncOptions:
    """``executor="ray"`` without a number of workers: one per CPU the cluster has free."""
    if options.executor == "ray" and options.workers == 0:
        from .config import WORKERS_AUTO

        return dataclasses.replace(options, workers=WORKERS_AUTO)
    return options


def _sink(on_event: OnEvent) -> EventSink | None:
    return on_event if on_event is None or isinstance(on_event, EventSink) else CallbackSink(
        on_event)


@contextlib.asynccontextmanager
async def _opened(src: str | ReadStore, dst: str | ReadStore,
                  options: SyncOptions) -> AsyncIterator[tuple[ReadStore, ReadStore]]:
    """The two stores: an address opened with its side's options (and closed at the end;
    two addresses through ``open_pair``, where a source may be one file or object), a store
    object as given."""
    from .run.engine import close_quietly
    from .stores.registry import open_store

    sides: tuple[tuple[str | ReadStore, Literal["source", "target"]], ...] = (
        (src, "source"), (dst, "target"))
    async with contextlib.AsyncExitStack() as opened:
        if isinstance(src, str) and isinstance(dst, str):  # SRC may be one file or object
            from .stores.single import open_pair

            pair = await open_pair(src, dst, open_store, open_store,
                                   options.store_options("source"),
                                   options.store_options("target"), delete=options.delete)
            for store in pair:
                opened.push_async_callback(close_quietly, store)
            yield pair
            return
        stores: list[ReadStore] = []
        for where, side in sides:
            if isinstance(where, str):
                store = open_store(where, options.store_options(side))
                opened.push_async_callback(close_quietly, store)
                where = store
            stores.append(where)
        yield stores[0], stores[1]


def _blocking(start: Callable[[asyncio.Event], Coroutine[Any, Any, T]], stop: Stop) -> T:
    """Run ``start(stop)`` to its end on a loop of its own; ``stop`` as the caller gave it."""
    ran: dict[str, Any] = {}  # the run's loop and stop event, for the interrupt below

    async def main() -> T:
        ended = stop if isinstance(stop, asyncio.Event) else asyncio.Event()
        ran["loop"], ran["stop"] = asyncio.get_running_loop(), ended
        over = threading.Event()
        if isinstance(stop, threading.Event):
            _relay(stop, ended, asyncio.get_running_loop(), over)
        try:
            return await start(ended)
        finally:
            over.set()

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return run_blocking(main())
    # Called from inside a running event loop: a notebook cell (Jupyter runs one), or async
    # code calling the blocking form. A notebook user wants the call to do what it says, not
    # an error to rewrite it: the run gets a fresh loop in a thread of its own, and this call
    # blocks until it ends, as it would anywhere else (the caller's loop waits meanwhile, as
    # it does for any blocking call; async code should await async_sync instead). A store
    # object passed in must not be bound to the caller's loop.
    with ThreadPoolExecutor(1, thread_name_prefix="mcsync") as pool:
        future = pool.submit(run_blocking, main())
        try:
            return future.result()
        except KeyboardInterrupt:
            # The notebook's "interrupt kernel": stop the run as a stop does (state saved,
            # the same call resumes) rather than leave it running behind the prompt.
            if "loop" in ran:
                ran["loop"].call_soon_threadsafe(ran["stop"].set)
            with contextlib.suppress(Exception):
                future.result()
            raise


def _relay(source: threading.Event, target: asyncio.Event, loop: asyncio.AbstractEventLoop,
           over: threading.Event) -> None:
    """Set ``target`` on its loop as soon as ``source`` is set, until ``over``."""

    def wait() -> None:
        while not over.is_set():
            if source.wait(0.1):  # returns at once when set; the timeout only looks at over
                with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                    loop.call_soon_threadsafe(target.set)
                return

    threading.Thread(target=wait, name="mcsync-stop", daemon=True).start()


def run_blocking(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` on a new event loop (uvloop if installed) in this thread."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency off Windows
        return asyncio.run(coro)
    return uvloop.run(coro)


def _keep_freed_buffers() -> None:
    """Let glibc's malloc reuse freed part buffers instead of returning them to the kernel.

    By default a buffer of 8 MiB or more is its own mmap, unmapped when freed, so every part
    received faults in fresh zeroed pages (on the 2-core benchmark VM, where freed memory goes
    back to the host, that was ~15% of a 2 GiB download's CPU). Buffers up to 32 MiB now come
    from malloc's heaps and stay there; memory held stays bounded by ``--memory-limit``."""
    import ctypes

    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc
        return
    m_trim_threshold, m_mmap_threshold = -1, -3
    mallopt(m_mmap_threshold, 32 << 20)
    mallopt(m_trim_threshold, 1 << 30)


def _collect_less() -> None:
    """Garbage collection for a process that lives minutes, not days. What was imported is
    frozen (never garbage, never scanned again), and the youngest generation is collected
    every 50,000 allocations instead of 700: botocore makes thousands of short-lived objects
    per request, and the collections they set off were ~7% of an upload's client CPU (perf).
    Reference cycles are still found, a little later."""
    import gc

    gc.freeze()
    gc.set_threshold(50_000, 20, 20)
