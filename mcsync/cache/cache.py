"""``Cache``: a node-local cache of remote objects, shared by every process that opens its
directory, bounded by a hard limit, safe across kill -9 (the layout, locks and commit order:
``files.py``, ``fill.py``; the index: ``index.py``; room and eviction: ``room.py``, ``space.py``,
``order.py``; what a process holds and the recency of its hits: ``holds.py``).

The blocking API (``path``, ``open``, ``pin``) and the async one (``apath``) run on one event
loop of the cache's own, in a thread, where its stores live: a store is bound to the loop it
was first used on. A hit is served in the caller's thread (an index read and a lock: no write,
no trip through the loop); the loop's own index and room work runs in worker threads, so a
long transaction never stalls it.

A process forked from one that used the cache (a data loader's worker) opens its own index,
loop and store clients on first use, and never touches its parent's (``os.register_at_fork``:
the index's connections are closed before the fork, so none crosses it, and the parent
reopens them after); a cache pickled into a spawned process is opened there anew with the
same arguments.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import io
import logging
import os
import sqlite3
import threading
import weakref
from collections.abc import Coroutine, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, BinaryIO, Literal, TypeVar

from ..config import StoreOptions, parse_size
from ..errors import UsageError
from ..events import EventSink
from ..stores.base import ReadStore
from ..stores.registry import open_store
from ..stores.resilience import Pacing, resilient
from ..types import MiB, ObjectInfo
from . import files
from .against import Recorded, target_of, verify_against
from .fetching import Fetching
from .files import Layout
from .fill import Landed
from .holds import MAX_HELD, Holds, Recency
from .index import Entry, Index
from .order import NextUse
from .reader import FillingReader
from .room import Room
from .terms import CacheStats, Validation, object_url

__all__ = ["Cache", "CacheStats", "Validation", "object_url"]

log = logging.getLogger(__name__)
T = TypeVar("T")

ENV_DIR = "MCSYNC_CACHE_DIR"
PART_SIZE = 16 * MiB  # a range GET; a reader streaming while it fills waits for one at most
CONCURRENCY = 8  # parts of one object in flight

# Whether this process was forked from one whose cache had used a store: obstore's runtime
# threads are not in a forked child. S3 stores then send through botocore
# (``stores.s3_clients``); an Azure store, which has only obstore, refuses.
_FORK = {"used": False, "after_use": False}
_LIVE: weakref.WeakSet[Cache] = weakref.WeakSet()
# A forked child's copies of its parent's loops and clients: never used and never closed (a
# copied loop's selector is the parent's epoll instance).
_ABANDONED: list[object] = []


def _before_fork() -> None:
    # No SQLite connection of the cache crosses a fork (SQLite's documented corruption case):
    # they are closed here, once this process's index work is out of them, and reopened after.
    for cache in list(_LIVE):
        cache._suspend()


def _after_fork_in_parent() -> None:
    for cache in list(_LIVE):
        cache._resume()


def _after_fork_in_child() -> None:
    _FORK["after_use"] = _FORK["used"]
    for cache in list(_LIVE):
        cache._forked()


os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent,
                    after_in_child=_after_fork_in_child)


class Cache(Fetching):
    """A cache directory, opened. ``max_size`` (bytes, or a size such as ``"50GiB"``) is
    recorded in the directory, and every process using it keeps the limit recorded last
    (read at each reservation); None: the recorded one, or none when none was given.
    ``wait``: seconds a fill that finds no room waits for other processes to release what
    they hold before it raises CacheFull (0: at once). ``max_held``: implicit holds (paths
    from ``path()``) this process keeps, the newest (``holds.py``)."""

    def __init__(self, cache_dir: str | os.PathLike[str] | None = None, *,
                 max_size: int | str | None = None, validate: str = "ttl:60s",
                 on_event: EventSink | None = None, options: StoreOptions | None = None,
                 part_size: int = PART_SIZE, concurrency: int = CONCURRENCY,
                 wait: float = 0.0, max_held: int = MAX_HELD) -> None:
        where = cache_dir if cache_dir is not None else os.environ.get(ENV_DIR)
        if not where:
            raise UsageError(f"no cache directory: pass cache_dir or set {ENV_DIR}")
        if wait < 0:
            raise UsageError(f"wait={wait}: seconds, 0 or more")
        self.validation = Validation.parse(validate)
        self.layout = Layout(Path(where))
        self.layout.make()
        self.part_size = part_size
        self.concurrency = concurrency
        self.wait = float(wait)
        self.stats = CacheStats()
        self.next_use: Mapping[str, int] | None = None  # a known order of reads: Belady
        self._sink = on_event
        self.store_options = options or StoreOptions()
        self._validate = validate
        self._max_held = max_held
        self._closed = False
        self._suspended = False  # its index closed for a fork under way
        self._open_here()
        files.empty_trash(self.layout)
        if isinstance(max_size, str):
            max_size = parse_size(max_size)
        if max_size is not None:
            self.index.set_setting("max_size", str(max_size))
        self.max_size = self.room.limit()
        _LIVE.add(self)

    def _open_here(self) -> None:
        """This process's index, holds, loop, stores and tasks (again in a forked child: a
        data loader's worker, where the parent's loop thread does not exist and its
        connections are not ours)."""
        self._pid = os.getpid()
        self.index = Index(self.layout.index)
        self.room = Room(self.layout, self.index)
        self.holds = Holds(self._max_held)
        self.recency = Recency()
        self._order: NextUse | None = None
        self._pacing = Pacing()
        self._stores: dict[str, ReadStore] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._landed: dict[int, Landed] = {}  # entry id → its parts' bytes written, here
        self._fill_fds: set[int] = set()  # descriptors holding a fill's LOCK_EX
        self._loop = asyncio.new_event_loop()
        # Each part in flight drains its stream in a to_thread worker, and asyncio's default
        # pool can be smaller than one fill's parts: part 0 would wait for another to end
        # (first-byte figures: benchmarks/results/2026-12-05-cache.md).
        self._loop.set_default_executor(concurrent.futures.ThreadPoolExecutor(
            max(32, self.concurrency + 8), thread_name_prefix="mcsync-cache-io"))
        self._thread = threading.Thread(target=self._loop.run_forever, name="mcsync-cache",
                                        daemon=True)
        self._thread.start()
        self._loop.call_soon_threadsafe(lambda: self._spawn(self._flush_every()))

    def _suspend(self) -> None:
        self._suspended = not self._closed and self._pid == os.getpid()
        if self._suspended:
            self.index.suspend()

    def _resume(self) -> None:
        if getattr(self, "_suspended", False):
            self._suspended = False
            self.index.resume()

    def _forked(self) -> None:
        """In a forked child, at once: let go of what is the parent's (its index connections
        were closed before the fork). The copies of the descriptors holding locks are closed
        (a lock stays with the parent's descriptor; a copy left open would keep a fill's
        ``LOCK_EX`` after the parent let go of it)."""
        self._suspended = False
        if self._closed:
            return
        _ABANDONED.append((self.index, self.room, self._loop, self._thread, self._stores,
                           self._tasks, self._pacing))
        for fd in [*self._fill_fds, *self.holds.descriptors()]:
            with contextlib.suppress(OSError):
                os.close(fd)
        self._pid = -1  # opened again on first use (``_here``)

    def _here(self) -> None:
        if self._pid != os.getpid():
            if self._closed:
                raise UsageError("the cache is closed")
            self._open_here()

    def __reduce__(self) -> tuple[Any, ...]:
        """Sent to a spawned process (a data loader's worker), a cache is opened there anew
        on the same directory, with the same arguments (not its event sink)."""
        return (_reopen, (str(self.layout.root), self._validate, self.store_options,
                          self.part_size, self.concurrency, self.wait, self._max_held))

    # -- the API ---------------------------------------------------------------------------

    def path(self, url: str) -> Path:
        """A complete local copy of ``url``, fetched if needed, and held: no process evicts
        it until this one releases it (``release``, ``close``, or more than ``max_held``
        paths taken since: the oldest goes; also when this process's own fill needs the
        room). ``held(url)`` holds for a block."""
        self._here()
        return self._take(url, explicit=False)

    def release(self, url: str) -> bool:
        """Let other processes evict ``url``'s entry again (unless a ``held`` block holds
        it); whether it was held."""
        self._here()
        return self.holds.release(object_url(url)[0])

    @contextlib.contextmanager
    def held(self, url: str) -> Iterator[Path]:
        """``with cache.held(url) as p:`` the path of ``url``, held until the block ends."""
        self._here()
        path = self._take(url, explicit=True)
        try:
            yield path
        finally:
            self.holds.release(object_url(url)[0], explicit=True)

    def _take(self, url: str, *, explicit: bool) -> Path:
        norm = object_url(url)[0]
        hold = self.holds.get(norm)
        if hold is not None and self._fresh(hold.entry) and \
                self.holds.add(norm, hold.entry, None, explicit=explicit):
            self.recency.touch(hold.entry.id, checked=False)
            self._served(hold.entry, hit=True)
            return self.layout.object(hold.entry.id)
        got = self._hit(norm) or self._run(self._obtain(url))
        self.holds.add(norm, *got, explicit=explicit)
        return self.layout.object(got[0].id)

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the cache's loop (where its stores live) and wait for it."""
        return self._run(coro)

    async def apath(self, url: str) -> Path:
        """``path``, awaited."""
        self._here()
        norm = object_url(url)[0]
        got = await asyncio.wrap_future(self._submit(self._obtain(url)))
        self.holds.add(norm, *got, explicit=False)
        return self.layout.object(got[0].id)

    def open(self, url: str) -> BinaryIO:
        """``url`` as a readable binary file; while it fills, reads wait for their bytes.
        Held against eviction while it is open."""
        self._here()
        got = self._hit(object_url(url)[0])
        raw = FillingReader(got[1], got[0], self.index, None) if got else \
            self._run(self._open(url))
        return io.BufferedReader(raw, buffer_size=1 << 20)

    def iter_safetensors(self, url: str, framework: Literal["np", "pt"] = "np",
                         ) -> Iterator[tuple[str, Any]]:
        """``(name, tensor)`` of a safetensors object, each as its bytes land (numpy arrays;
        torch's with ``framework="pt"``): ``safetensors.py``."""
        # Opened first: the fill (HEAD, then the first part's GET) is under way while numpy
        # (the cache extra) is imported, which is slow on a busy machine.
        f = self.open(url)
        try:
            from .safetensors import iter_safetensors
        except BaseException:
            f.close()
            raise
        return iter_safetensors(lambda _: f, url, framework)

    def load_safetensors(self, url: str, framework: Literal["np", "pt"] = "np",
                         ) -> dict[str, Any]:
        return dict(self.iter_safetensors(url, framework))

    def prefetch(self, urls: Iterable[str]) -> concurrent.futures.Future[list[Path]]:
        """Start fetching ``urls`` in the background (a few at a time, the iterable read as
        they start); the future is done when all are. The paths are not held: ``path()``
        holds one."""
        return self._submit(self._prefetch(urls))

    def pin(self, url_or_prefix: str) -> int:
        """Keep ``url_or_prefix`` (an object, or every object under a prefix ending in ``/``)
        in the cache, fetching what is missing; never evicted until unpinned. Raises
        CacheFull at once, with the numbers, when the pinned objects cannot all fit. Returns
        the number of objects pinned."""
        return self._run(self._pin(url_or_prefix))

    def objects(self, address: str) -> list[tuple[str, ObjectInfo]]:
        """The objects an address names at its store (a request: nothing is cached): every
        one under it when it ends with ``/``, else the one object."""
        return self._run(self._objects_under(address))

    def unpin(self, url_or_prefix: str) -> bool:
        self._here()
        return self.index.unpin(object_url(url_or_prefix)[0])

    def entries(self, prefix: str = "") -> list[Entry]:
        self._here()
        return self.index.entries(object_url(prefix)[0] if prefix else "")

    def in_use(self) -> int:
        self._here()
        return self.index.totals()[0]

    def evict(self, prefix: str = "") -> list[Entry]:
        """Evict the entries under ``prefix`` (all: "") that are neither pinned nor open nor
        held, and partial ones whose filler is gone; the entries evicted."""
        self._here()
        gone = self.room.evict(object_url(prefix)[0] if prefix else "")
        for e in gone:
            self._evicted(e.url, e.charge)
        return gone

    def verify(self, against: Recorded | None = None) -> list[tuple[Entry, str]]:
        """Re-hash every complete entry; those whose bytes are not what was fetched are
        dropped. The entries found so, and what was wrong. ``against``: the records mcsync
        keeps at a target (``mcsync.run.target_manifests``): the entries under it are compared
        with the chunk hashes recorded when their objects were written there
        (``against.py``)."""
        self._here()
        if against is not None:
            return verify_against(self.entries(target_of(against)), self.layout, against,
                                  self.room.drop).bad
        return self.room.verify()

    def close(self) -> None:
        """Release every hold, record the recency of the last hits, close the stores."""
        if self._closed:
            return
        if self._pid != os.getpid():  # a forked child that never used it: nothing of its own
            self._closed = True
            return
        try:
            self._run(self._aclose())
        finally:
            self._closed = True
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()
            self._loop.close()
            self.holds.close()
            with contextlib.suppress(sqlite3.Error):
                self._flush()
            self.index.close()

    def __enter__(self) -> Cache:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- recency -------------------------------------------------------------------------

    def _flush(self) -> None:
        touches = self.recency.take()
        if not touches:
            return
        try:
            with self.index.transaction() as db:
                Index.touch_many(db, touches)
        except BaseException:
            self.recency.restore(touches)
            raise

    async def _flush_every(self) -> None:
        while True:
            await asyncio.sleep(Recency.FLUSH_S)
            try:
                await asyncio.to_thread(self._flush)
            except sqlite3.Error as exc:  # kept for the next turn
                log.warning("%s: recording recent hits: %s", self.layout.index, exc)

    # -- on the cache's loop ---------------------------------------------------------------

    def _submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        if self._closed:
            coro.close()
            raise UsageError("the cache is closed")
        self._here()
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self._submit(coro).result()

    async def _aclose(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for store in self._stores.values():
            await store.aclose()

    def store_for(self, root: str) -> ReadStore:
        if _FORK["after_use"] and root.startswith("az://"):
            raise UsageError("this process was forked from one whose cache had used its "
                             "stores, and the Azure client's runtime does not survive a fork: "
                             "start workers by spawn or forkserver (a torch DataLoader's "
                             "multiprocessing_context), or fork before the first use")
        _FORK["used"] = True
        if root not in self._stores:
            self._stores[root] = resilient(open_store(root, self.store_options), self._pacing)
        return self._stores[root]


def _reopen(cache_dir: str, validate: str, options: StoreOptions, part_size: int,
            concurrency: int, wait: float, max_held: int) -> Cache:
    return Cache(cache_dir, validate=validate, options=options, part_size=part_size,
                 concurrency=concurrency, wait=wait, max_held=max_held)
