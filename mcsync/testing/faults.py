"""``faulty(store, faults)``: any store, with faults injected by rule — for tests.

As restic's ``backend/mock`` and object_store's ``throttle.rs`` wrap a backend, this wraps a
mcsync store (and the uploads it opens) and, on each operation, applies the ``Rule``s that
match it: raise an error, wait, cut a read short, or run an action (kill the process, count
the bytes acknowledged, change the source behind the engine's back). Every call is counted
by operation, so a test can also assert what was asked of a store.

Operations are named after the protocol's methods (``list``, ``head``, ``get``, ``read_into``,
``open_range``,
``put``, ``delete``, ``open_upload``, ``resume_upload``, ``put_part``, ``write_at``,
``part_written``, ``copy_part``, ``complete``, ``abort``, ``copy_object``, ``clear`` ...), each
at two points: ``before`` the call reaches the store and ``after`` it returned (``list`` has
one point per entry, after it was handed on). The key of an upload's operation is its object's
key.

The wrapper offers exactly the abilities of the store it wraps (``isinstance`` against the
protocols of ``mcsync.stores.base`` answers as for the inner store), so the engine takes the
same paths through it: it is ``mcsync.stores.wrap.wrap`` with the rules as its hooks.
"""

from __future__ import annotations

import asyncio
import fnmatch
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Literal, TypeVar

from ..errors import Transient
from ..stores.base import ReadStore
from ..stores.wrap import Op, inner_of, wrap
from ..types import Buffer, ObjectInfo

__all__ = ["Call", "Faults", "Rule", "faulty", "inner_of"]

T = TypeVar("T")

Phase = Literal["before", "after"]


@dataclass(frozen=True, slots=True)
class Call:
    """One operation as a rule sees it."""

    op: str
    key: str
    phase: Phase
    nbytes: int = 0  # bytes sent (put, put_part, write_at) or acknowledged (after)


@dataclass
class Rule:
    """What to do at the ``nth`` .. ``nth + times - 1``-th call that matches ``op`` (a glob),
    ``key`` (a glob; ``skip`` excludes keys) and ``phase``. ``times`` None: every one from
    ``nth`` on."""

    op: str
    key: str = "*"
    phase: Phase = "before"
    nth: int = 1
    times: int | None = 1
    skip: str | None = None
    error: BaseException | Callable[[Call], BaseException] | None = None
    delay_s: float = 0.0
    short: int = 0  # get / open_range: hand out this many bytes fewer than asked
    action: Callable[[Call], None] | None = None
    seen: int = field(default=0, init=False)  # matching calls so far

    def matches(self, call: Call) -> bool:
        return (call.phase == self.phase and fnmatch.fnmatchcase(call.op, self.op)
                and fnmatch.fnmatchcase(call.key, self.key)
                and not (self.skip and fnmatch.fnmatchcase(call.key, self.skip)))

    def due(self) -> bool:
        """Counts this match; True when it falls in the rule's window."""
        self.seen += 1
        return self.seen >= self.nth and (self.times is None
                                           or self.seen < self.nth + self.times)


class Faults:
    """The rules one or more wrapped stores apply, and the calls they saw."""

    def __init__(self, rules: Sequence[Rule] = ()) -> None:
        self.rules = list(rules)
        self.calls: Counter[str] = Counter()  # op → calls seen (before)

    def add(self, rule: Rule) -> Rule:
        self.rules.append(rule)
        return rule

    def _due(self, call: Call) -> list[Rule]:
        if call.phase == "before":
            self.calls[call.op] += 1
        return [r for r in self.rules if r.matches(call) and r.due()]

    def _fire(self, call: Call, due: list[Rule]) -> int:
        short = 0
        for rule in due:
            if rule.action is not None:
                rule.action(call)
            if rule.error is not None:
                error = rule.error(call) if callable(rule.error) else rule.error
                raise error
            short = max(short, rule.short)
        return short

    async def at(self, op: str, key: str, phase: Phase, nbytes: int = 0) -> int:
        """Apply the rules due for this call (from the event loop); the bytes to cut short."""
        call = Call(op, key, phase, nbytes)
        due = self._due(call)
        delay = sum(r.delay_s for r in due)
        if delay:
            await asyncio.sleep(delay)
        return self._fire(call, due)

    def at_blocking(self, op: str, key: str, phase: Phase, nbytes: int = 0) -> int:
        """The same, from a worker thread (``write_at``)."""
        call = Call(op, key, phase, nbytes)
        due = self._due(call)
        delay = sum(r.delay_s for r in due)
        if delay:
            time.sleep(delay)
        return self._fire(call, due)


def faulty(store: ReadStore, faults: Faults) -> ReadStore:
    """``store`` with ``faults`` applied to every operation, offering the same abilities."""
    return wrap(store, _FaultHooks(faults), name="Faulty")


# Each operation is a rule's at two points, but these: nothing can follow them (before only),
# or they are bookkeeping of bytes already written (after only).
_BEFORE_ONLY = frozenset({"check", "abort_upload", "clear", "confirm_parts", "abort", "write_at"})
_AFTER_ONLY = frozenset({"part_written"})
_NAMES = {"open_file": "open_upload"}  # to a rule, a file target's upload is an upload


class _FaultHooks:
    """The rules applied around each operation (``mcsync.stores.wrap.Hooks``)."""

    def __init__(self, faults: Faults) -> None:
        self.faults = faults

    async def call(self, op: Op, fn: Callable[[], Awaitable[T]]) -> T:
        name = _NAMES.get(op.name, op.name)
        if name not in _AFTER_ONLY:
            await self.faults.at(name, op.key, "before", op.nbytes)
        result = await fn()
        if name not in _BEFORE_ONLY:
            await self.faults.at(name, op.key, "after", op.nbytes)
        return result

    async def read(self, op: Op, fn: Callable[[], Awaitable[Buffer]]) -> Buffer:
        """What was read, cut short if a rule says so."""
        short = await self.faults.at(op.name, op.key, "before", op.nbytes)
        data = await fn()
        short = max(short, await self.faults.at(op.name, op.key, "after", len(data)))
        return memoryview(data)[:len(data) - short] if short else data

    async def stream(self, op: Op,
                     fn: Callable[[], Awaitable[Iterator[Buffer]]]) -> Iterator[Buffer]:
        """The body, each piece a rule's (``range_piece``), cut short if a rule says so."""
        short = await self.faults.at(op.name, op.key, "before", op.nbytes)
        pieces = await fn()
        await self.faults.at(op.name, op.key, "after", op.nbytes)
        assert op.rng is not None
        return _pieces(pieces, op.key, op.rng.length - short, self.faults)

    def call_blocking(self, op: Op, fn: Callable[[], T]) -> T:
        if op.name not in _AFTER_ONLY:
            self.faults.at_blocking(op.name, op.key, "before", op.nbytes)
        result = fn()
        if op.name not in _BEFORE_ONLY:
            self.faults.at_blocking(op.name, op.key, "after", op.nbytes)
        return result

    async def listing(self, entries: AsyncIterator[ObjectInfo]) -> AsyncIterator[ObjectInfo]:
        await self.faults.at("list", "", "before")
        async for info in entries:
            yield info
            await self.faults.at("list", info.key, "after")


def _pieces(pieces: Iterator[Buffer], key: str, keep: int, faults: Faults) -> Iterator[Buffer]:
    """A streamed range's pieces, each one a ``range_piece`` call (a rule raising there breaks
    the body off mid-way, as a reset connection does); with ``keep`` short of the range, the
    body ends early and the stream raises Transient, as a store's own length check does."""
    for piece in pieces:
        faults.at_blocking("range_piece", key, "before", len(piece))
        if len(piece) >= keep:
            if keep > 0:
                yield memoryview(piece)[:keep]
            if len(piece) > keep:
                raise Transient(f"{key}: the body ended early (fault injected)")
            keep = 0
            continue
        yield piece
        keep -= len(piece)
