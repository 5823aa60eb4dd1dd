"""The dispatch unit alone, with no manifest: what a worker process of a distributed run does.
Actions go in; outcomes (the record to commit, the event) come out; each upload's id and parts
go to the journal it was given, and an upload that journal names is resumed from its parts."""

from __future__ import annotations

import asyncio
from typing import Any

from mcsync.config import SyncOptions
from mcsync.events import BytesMoved, Event, ObjectDone
from mcsync.limits import Limits
from mcsync.move.context import RunContext
from mcsync.move.dispatch import Dispatch, Outcome
from mcsync.records import Action, OpenUpload, WrittenPart
from mcsync.stores.memory import MemoryStore
from mcsync.testing.faults import Call, Faults, Rule, faulty
from mcsync.types import ObjectInfo

from .test_engine import PART, MiB, contents, payload, seed


class Journal:
    """What a worker would send back to its driver: every journal call, in order."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.open: dict[str, OpenUpload] = {}

    def begin_upload(self, key: str, upload_id: str, src: ObjectInfo, part_size: int,
                     layout: str | None = None) -> None:
        self.calls.append(("begin", key, upload_id))
        self.open[key] = OpenUpload(key, upload_id, src.size, src.etag, src.mtime, part_size,
                                    0.0, layout)

    def record_part(self, key: str, part: WrittenPart) -> None:
        self.calls.append(("part", key, part.number))
        self.open[key].parts[part.number] = part

    def drop_upload(self, key: str) -> None:
        self.calls.append(("drop", key))
        self.open.pop(key, None)


def _dispatch(src: Any, dst: Any, journal: Journal, events: list[Event],
              open_uploads: dict[str, OpenUpload] | None = None,
              stop: asyncio.Event | None = None) -> Dispatch:
    options = SyncOptions(part_size=PART, part_concurrency=1)
    ctx = RunContext(src, dst, options, Limits.for_options(options),
                     events.append, stop or asyncio.Event())
    return Dispatch(ctx, journal=journal, known=None, open_uploads=dict(open_uploads or {}))


async def _copy(dispatch: Dispatch, src: MemoryStore, key: str) -> Outcome:
    return await dispatch.run(Action("copy", key, await src.head(key), None, "new"))


def test_an_action_comes_back_as_a_record_to_commit_and_its_event() -> None:
    src, dst = MemoryStore("src"), MemoryStore("dst")
    data = payload(3 * PART + 5, 1)
    seed(src, {"big.bin": data, "small.bin": b"small"})
    journal, events = Journal(), list[Event]()

    async def run() -> list[Outcome]:
        dispatch = _dispatch(src, dst, journal, events)
        return [await _copy(dispatch, src, "big.bin"), await _copy(dispatch, src, "small.bin")]

    big, small = asyncio.run(run())
    assert contents(dst) == {"big.bin": data, "small.bin": b"small"}
    for outcome, key, size in ((big, "big.bin", len(data)), (small, "small.bin", 5)):
        assert isinstance(outcome.event, ObjectDone) and outcome.event.result.key == key
        assert outcome.record is not None and outcome.record.key == key
        assert outcome.record.dst_size == size and outcome.record.block_hashes
    assert [c[0] for c in journal.calls] == ["begin", "part", "part", "part", "part"]
    assert sum(e.nbytes for e in events if isinstance(e, BytesMoved)) == len(data) + 5


def test_an_upload_the_journal_names_is_resumed_from_its_parts() -> None:
    src, dst = MemoryStore("src"), MemoryStore("dst")
    data = payload(4 * PART, 2)
    seed(src, {"big.bin": data})
    journal, events = Journal(), list[Event]()

    async def stopped_after_two_parts() -> Outcome:
        stop = asyncio.Event()
        second = Rule("put_part", phase="after", nth=2, action=lambda _: stop.set())
        dispatch = _dispatch(src, faulty(dst, Faults([second])), journal, events, stop=stop)
        return await _copy(dispatch, src, "big.bin")

    first = asyncio.run(stopped_after_two_parts())
    assert first.interrupted and first.record is None
    assert [c[0] for c in journal.calls] == ["begin", "part", "part"]
    assert contents(dst) == {}

    sent: list[Call] = []
    counted = Rule("put_part", phase="before", times=None, action=sent.append)

    async def resumed() -> Outcome:
        dispatch = _dispatch(src, faulty(dst, Faults([counted])), journal, events, journal.open)
        return await _copy(dispatch, src, "big.bin")

    second = asyncio.run(resumed())
    assert isinstance(second.event, ObjectDone) and contents(dst) == {"big.bin": data}
    assert second.record is not None and second.record.dst_size == len(data)
    assert len(sent) == 2, "only the two parts the journal did not name were sent"
    assert second.event.result.bytes_sent == 2 * PART


def test_a_whole_objects_only_dispatch_hands_back_what_would_go_in_parts() -> None:
    """A worker process's dispatch (no journal) moves objects of one request and hands back,
    having written nothing, one that is larger: the source's new version included."""
    src, dst = MemoryStore("src"), MemoryStore("dst")
    seed(src, {"big.bin": payload(PART + 1, 3), "small.bin": b"small", "grows.bin": b"x"})
    options = SyncOptions(part_size=PART)
    events = list[Event]()

    async def run() -> list[Outcome]:
        ctx = RunContext(src, dst, options, Limits(8, options.memory_limit), events.append,
                         asyncio.Event())
        dispatch = Dispatch(ctx, journal=None, known=None, open_uploads={}, whole_only=True)
        listed = await src.head("grows.bin")
        seed(src, {"grows.bin": payload(PART + 7, 4)})  # changed after it was listed
        stale = Action("copy", "grows.bin", listed, None, "new")
        assert dispatch.is_whole(stale) and not dispatch.is_whole(
            Action("copy", "big.bin", await src.head("big.bin"), None, "new"))
        return [await _copy(dispatch, src, "big.bin"), await _copy(dispatch, src, "small.bin"),
                await dispatch.run(stale)]

    big, small, grown = asyncio.run(run())
    assert big.handed_back and big.event is None and big.record is None
    assert grown.handed_back and grown.record is None
    assert not small.handed_back and isinstance(small.event, ObjectDone)
    assert contents(dst) == {"small.bin": b"small"}


def test_whole_objects_of_a_megabyte_or_more_reuse_one_buffer_of_the_run(tmp_path) -> None:
    """From a source that reads into the caller's buffer (files here), each whole object of
    a megabyte or more is read into a buffer of the run's pool, as a part is: one buffer
    serves them all, one after another; a smaller object is read as before."""
    from mcsync.stores.local import LocalStore

    root = tmp_path / "src"
    root.mkdir()
    objects = {f"o{i}.bin": payload(2 * MiB + i, i) for i in range(6)} | {"small.bin": b"s"}
    for key, data in objects.items():
        (root / key).write_bytes(data)
    src, dst = LocalStore(str(root)), MemoryStore("dst")
    journal, events = Journal(), list[Event]()

    async def run() -> int:
        dispatch = _dispatch(src, dst, journal, events)
        for key in objects:
            await dispatch.run(Action("copy", key, await src.head(key), None, "new"))
        return dispatch._transfer.limits.buffers.kept

    kept = asyncio.run(run())
    assert contents(dst) == objects
    assert kept == 3 * MiB  # the one buffer (2 MiB + 5 rounded up to whole MiB), given back
    assert not journal.calls  # all whole objects: nothing journalled
