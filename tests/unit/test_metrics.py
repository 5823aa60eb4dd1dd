"""``mcsync.observe.metrics``: the sink's figures from events, the store wrapper's requests, the
exposition (the textfile; the HTTP server is tested in tests/integration/test_metrics.py), each
read back through prometheus_client's own parser."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

import prometheus_client
import pytest
from prometheus_client.parser import text_string_to_metric_families

from mcsync.errors import NotFound, Throttled, UsageError
from mcsync.events import (
    BytesMoved,
    DeltaPlanned,
    ListingDone,
    ObjectDone,
    ObjectFailed,
    ObjectPlanned,
    RequestsCounted,
    RunFinished,
    RunStarted,
)
from mcsync.observe.metrics import OBJECT_RESULTS, Metrics, parse_addr, status_of
from mcsync.observe.requests import RequestTally, meter
from mcsync.report import ObjectResult, SyncReport
from mcsync.stores.base import (
    Composer,
    FileTarget,
    FileUpload,
    PartCopyUpload,
    RangeStreamer,
    ReadsInto,
    ReadStore,
    ScratchSpace,
    ServerSideCopier,
    Store,
)
from mcsync.stores.local import LocalStore
from mcsync.stores.memory import MemoryEndpoint, MemoryStore
from mcsync.testing.faults import Faults, Rule, faulty
from mcsync.types import ByteRange

ABILITIES = (Store, RangeStreamer, ReadsInto, ServerSideCopier, Composer, ScratchSpace,
             FileTarget)
SECRET = "AKIAEXAMPLESECRET/wJalrXUtnFEMI"


def samples(metrics: Metrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of the registry's exposition, as (name, sorted labels) → value."""
    text = prometheus_client.generate_latest(metrics.registry).decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(metrics: Metrics, name: str, **labels: str) -> float:
    return samples(metrics)[name, tuple(sorted(labels.items()))]


def done(key: str, action: Any, size: int, sent: int, reused: int = 0) -> ObjectDone:
    return ObjectDone(ObjectResult(key, action, size, sent, bytes_reused=reused))


def feed(metrics: Metrics, events: Iterable[Any]) -> None:
    for event in events:
        metrics.emit(event)


def test_a_run_s_events_become_exact_figures() -> None:
    metrics = Metrics(clock=lambda: 1_700_000_000.0)
    report = SyncReport("file:///src/", "meta://b/run/", elapsed_s=12.5)
    feed(metrics, [
        RunStarted("file:///src/", "meta://b/run/", dry_run=False),
        ObjectPlanned("a", "copy", 100),
        ObjectPlanned("b", "skip", 7),
        ObjectPlanned("c", "skip", 9),
        DeltaPlanned("d", 50, 10, 10, 40, 2),
        ListingDone(),
        BytesMoved("a", 100),
        done("a", "copy", 100, 100),
        done("d", "copy", 50, 10, reused=40),
        done("e", "server_copy", 30, 0),
        done("f", "delete", 0, 0),
        ObjectFailed("g", "copy", 5, "reset"),
        object(),  # an event type this sink does not know is ignored
        RunFinished(report),
    ])
    assert value(metrics, "mcsync_sent_bytes_total") == 110
    assert value(metrics, "mcsync_reused_bytes_total") == 40
    objects = {r: value(metrics, "mcsync_objects_total", result=r) for r in OBJECT_RESULTS}
    assert objects == {"copied": 2, "server_copied": 1, "skipped": 2, "failed": 1, "deleted": 1}
    assert value(metrics, "mcsync_runs_total", result="ok") == 1
    assert value(metrics, "mcsync_run_duration_seconds_count") == 1
    assert value(metrics, "mcsync_run_duration_seconds_sum") == 12.5
    assert value(metrics, "mcsync_run_duration_seconds_bucket", le="15.0") == 1
    assert value(metrics, "mcsync_run_duration_seconds_bucket", le="5.0") == 0
    assert value(metrics, "mcsync_last_success_timestamp_seconds") == 1_700_000_000.0
    assert value(metrics, "mcsync_checkpoints_waiting") == 0
    assert value(metrics, "mcsync_received_bytes_total") == 0  # counted by wrapped sources


def test_runs_by_result_and_the_last_success_only_after_a_complete_run() -> None:
    now = [100.0]
    metrics = Metrics(clock=lambda: now[0])

    def run(dry_run: bool = False, **fields: Any) -> None:
        metrics.emit(RunStarted("s", "d", dry_run))
        metrics.emit(RunFinished(SyncReport("s", "d", dry_run=dry_run, elapsed_s=1.0, **fields)))
        now[0] += 10

    run()
    run(objects_failed=2)
    run(interrupted=True)
    metrics.run_aborted("locked")
    metrics.run_aborted("error")
    assert value(metrics, "mcsync_last_success_timestamp_seconds") == 100.0
    runs = {r: value(metrics, "mcsync_runs_total", result=r)
            for r in ("ok", "failed", "interrupted", "error", "locked", "dry_run")}
    assert runs == {"ok": 1, "failed": 1, "interrupted": 1, "error": 1, "locked": 1,
                    "dry_run": 0}
    assert value(metrics, "mcsync_run_duration_seconds_count") == 3


def test_a_dry_run_counts_its_run_and_no_objects() -> None:
    metrics = Metrics()
    feed(metrics, [RunStarted("s", "d", dry_run=True), ObjectPlanned("a", "copy", 10),
                   ObjectPlanned("b", "skip", 10), ObjectFailed("c", "copy", 1, "x"),
                   RunFinished(SyncReport("s", "d", dry_run=True))])
    assert all(value(metrics, "mcsync_objects_total", result=r) == 0 for r in OBJECT_RESULTS)
    assert value(metrics, "mcsync_runs_total", result="dry_run") == 1
    assert value(metrics, "mcsync_last_success_timestamp_seconds") == 0
    # The next run of the same process (a --watch cycle) is counted again.
    feed(metrics, [RunStarted("s", "d", dry_run=False), ObjectPlanned("b", "skip", 10)])
    assert value(metrics, "mcsync_objects_total", result="skipped") == 1


def test_each_metrics_has_a_registry_of_its_own_and_the_global_one_is_untouched() -> None:
    one, two = Metrics(), Metrics()
    one.emit(done("a", "copy", 5, 5))
    assert value(one, "mcsync_sent_bytes_total") == 5
    assert value(two, "mcsync_sent_bytes_total") == 0
    default = prometheus_client.generate_latest(prometheus_client.REGISTRY).decode()
    assert "mcsync_" not in default


# -- the store wrapper ---------------------------------------------------------------------------


def memory_pair() -> tuple[MemoryStore, MemoryStore]:
    endpoint = MemoryEndpoint("a")
    return MemoryStore("src", endpoint=endpoint), MemoryStore("dst", endpoint=endpoint)


@pytest.mark.parametrize("kind", ["memory", "local"])
def test_a_wrapped_store_offers_exactly_the_abilities_of_the_inner_one(kind, tmp_path) -> None:
    store: ReadStore = (MemoryStore() if kind == "memory" else LocalStore(str(tmp_path)))
    wrapped = Metrics().wrap(store, "target")
    assert [isinstance(wrapped, a) for a in ABILITIES] == [isinstance(store, a)
                                                           for a in ABILITIES]
    assert wrapped.url == store.url and wrapped.caps == store.caps

    async def uploads() -> tuple[Any, Any]:
        assert isinstance(store, Store) and isinstance(wrapped, Store)
        inner, outer = await store.open_upload("x", 1), await wrapped.open_upload("y", 1)
        await inner.abort()
        await outer.abort()
        return inner, outer

    inner, outer = asyncio.run(uploads())
    for ability in (PartCopyUpload, FileUpload):
        assert isinstance(outer, ability) == isinstance(inner, ability)


def test_requests_are_counted_by_store_operation_and_status() -> None:
    src, dst = memory_pair()
    metrics = Metrics()
    faults = Faults([Rule("put", key="key-9c1*", times=2, error=Throttled(f"msg-7f3 {SECRET}"))])
    source = metrics.wrap(src, "source")
    target = metrics.wrap(faulty(dst, faults), "target")

    async def go() -> None:
        assert isinstance(target, Store) and isinstance(source, Store)
        await src.put("obj", b"0123456789")
        assert bytes(await source.get("obj")) == b"0123456789"
        assert bytes(await source.get("obj", ByteRange(2, 5))) == b"234"
        with pytest.raises(NotFound):
            await target.head("missing")
        for _ in range(2):
            with pytest.raises(Throttled):
                await target.put("key-9c1", b"abc")
        await target.put("key-9c1", b"abc")
        assert [i.key async for i in source.list()] == ["obj"]
        assert target.can_copy_from(source)  # the same endpoint, seen through both wrappers

    asyncio.run(go())
    got = samples(metrics)
    requests = {dict(labels)["operation"] + "/" + dict(labels)["status"] + "@"
                + dict(labels)["store"]: v for (name, labels), v in got.items()
                if name == "mcsync_requests_total"}
    assert requests == {"get/ok@source": 2, "head/NotFound@target": 1,
                        "put/Throttled@target": 2, "put/ok@target": 1, "list/ok@source": 1}
    assert value(metrics, "mcsync_throttled_requests_total", store="target",
                 operation="put") == 2
    assert value(metrics, "mcsync_received_bytes_total") == 13  # the source's reads only
    assert value(metrics, "mcsync_request_duration_seconds_count", store="target",
                 operation="put") == 3
    assert value(metrics, "mcsync_requests_in_flight", store="source") == 0
    assert value(metrics, "mcsync_requests_in_flight", store="target") == 0
    text = prometheus_client.generate_latest(metrics.registry).decode()
    assert "AKIA" not in text and "msg-7f3" not in text and "key-9c1" not in text
    assert "memory://" not in text


def test_a_worker_s_tally_added_counts_as_if_this_process_made_its_requests() -> None:
    """What a worker counts with ``RequestTally`` and the driver adds (``RequestsCounted``)
    is exposed as the same figures a ``Metrics`` wrapping the stores itself shows."""

    def requests(source: ReadStore, target: ReadStore, src: MemoryStore) -> None:
        async def go() -> None:
            assert isinstance(target, Store) and isinstance(source, RangeStreamer)
            await src.put("obj", bytes(range(100)))
            assert len(await source.get("obj")) == 100
            with pytest.raises(NotFound):
                await target.head("missing")
            with pytest.raises(Throttled):
                await target.put("slow", b"abc")
            await asyncio.gather(target.put("a", b"abc"), target.put("b", b"de"))
            body = await source.open_range("obj", ByteRange(0, 40))
            assert sum(len(p) for p in body) == 40
            assert [i.key async for i in source.list()] == ["obj"]

        asyncio.run(go())

    def stores(wrap: Any) -> tuple[ReadStore, ReadStore, MemoryStore]:
        src, dst = memory_pair()
        faults = Faults([Rule("put", key="slow", times=1, error=Throttled("x")),
                         Rule("put", times=None, delay_s=0.02)])
        return wrap(src, "source"), wrap(faulty(dst, faults), "target"), src

    direct = Metrics()
    source, target, src = stores(direct.wrap)
    requests(source, target, src)

    driver, tally = Metrics(), RequestTally()
    driver.emit(RunStarted("s", "d", dry_run=False))
    source, target, src = stores(lambda store, role: meter(store, tally, role))
    requests(source, target, src)
    counted = tally.take("pid 1 on node-a")
    driver.emit(counted)
    assert tally.take("pid 1 on node-a").requests == ()  # taken: counted once

    def figures(metrics: Metrics) -> dict[Any, float]:
        return {k: v for k, v in samples(metrics).items()
                if k[0] in ("mcsync_requests_total", "mcsync_throttled_requests_total",
                            "mcsync_received_bytes_total",
                            "mcsync_request_duration_seconds_count")}

    assert figures(driver) == figures(direct)
    assert value(driver, "mcsync_received_bytes_total") == 140
    assert value(driver, "mcsync_requests_total", store="target", operation="put",
                 status="Throttled") == 1
    # Peaks: the two PUTs at once in the worker; a second worker's peak adds to it, a later
    # task of the same worker does not; the next run starts again.
    assert value(driver, "mcsync_requests_in_flight_peak", store="target") == 2
    driver.emit(RequestsCounted("pid 2 on node-b", (), 0, (("target", 3),)))
    driver.emit(RequestsCounted("pid 1 on node-a", (), 0, (("target", 1),)))
    assert value(driver, "mcsync_requests_in_flight_peak", store="target") == 5
    driver.emit(RunStarted("s", "d", dry_run=False))
    assert value(driver, "mcsync_requests_in_flight_peak", store="target") == 0


def test_requests_in_flight_while_they_wait_and_a_streamed_body_until_it_is_read() -> None:
    src, _ = memory_pair()
    metrics = Metrics()
    seen: list[float] = []
    faults = Faults([Rule("head", times=None, delay_s=0.05)])
    source = metrics.wrap(faulty(src, faults), "source")

    async def go() -> None:
        assert isinstance(source, RangeStreamer)
        await src.put("obj", bytes(range(200)))
        task = asyncio.gather(source.head("obj"), source.head("obj"))
        await asyncio.sleep(0.02)
        seen.append(value(metrics, "mcsync_requests_in_flight", store="source"))
        await task
        seen.append(value(metrics, "mcsync_requests_in_flight", store="source"))
        body = await source.open_range("obj", ByteRange(10, 110))
        seen.append(value(metrics, "mcsync_requests_in_flight", store="source"))
        assert sum(len(p) for p in await asyncio.to_thread(list, body)) == 100
        seen.append(value(metrics, "mcsync_requests_in_flight", store="source"))
        dropped = await source.open_range("obj", ByteRange(0, 100))
        del dropped  # never read: the request ends, as cancelled

    asyncio.run(go())
    assert seen == [2, 0, 1, 0]
    assert value(metrics, "mcsync_requests_in_flight", store="source") == 0
    assert value(metrics, "mcsync_requests_total", store="source", operation="open_range",
                 status="ok") == 1
    assert value(metrics, "mcsync_requests_total", store="source", operation="open_range",
                 status="Cancelled") == 1
    assert value(metrics, "mcsync_received_bytes_total") == 100


def test_status_labels_are_class_names_never_messages() -> None:
    assert status_of(Throttled(SECRET)) == "Throttled"
    assert status_of(PermissionError(13, SECRET)) == "PermissionError"
    assert status_of(asyncio.CancelledError()) == "Cancelled"

    class SdkError(Exception):
        pass

    assert status_of(SdkError(SECRET)) == "Error"


# -- exposition ----------------------------------------------------------------------------------


def test_the_textfile_is_written_whole_and_a_later_run_keeps_the_last_success(tmp_path) -> None:
    path = tmp_path / "textfile" / "mcsync.prom"
    first = Metrics(clock=lambda: 1234.0)
    feed(first, [RunStarted("s", "d", False), done("a", "copy", 7, 7),
                 RunFinished(SyncReport("s", "d"))])
    first.write_textfile(path)
    assert [p.name for p in path.parent.iterdir()] == ["mcsync.prom"]  # no temporary left
    families = {f.name: f for f in text_string_to_metric_families(path.read_text())}
    assert families["mcsync_sent_bytes"].samples[0].value == 7
    assert families["mcsync_last_success_timestamp_seconds"].samples[0].value == 1234.0

    second = Metrics()  # a failed run rewrites the file; the last success stays known
    second.carry_over(path)
    feed(second, [RunStarted("s", "d", False),
                  RunFinished(SyncReport("s", "d", objects_failed=1))])
    second.write_textfile(path)
    families = {f.name: f for f in text_string_to_metric_families(path.read_text())}
    assert families["mcsync_last_success_timestamp_seconds"].samples[0].value == 1234.0
    assert families["mcsync_sent_bytes"].samples[0].value == 0

    garbage = tmp_path / "garbage.prom"
    garbage.write_bytes(b"\xff\xfe not metrics {")
    Metrics().carry_over(garbage)  # ignored
    Metrics().carry_over(tmp_path / "missing.prom")


@pytest.mark.parametrize(("text", "addr"), [
    ("127.0.0.1:9108", ("127.0.0.1", 9108)),
    ("0.0.0.0:9108", ("0.0.0.0", 9108)),
    (":9108", ("0.0.0.0", 9108)),
    ("[::1]:9108", ("::1", 9108)),
    ("localhost:0", ("localhost", 0)),
])
def test_addresses(text: str, addr: tuple[str, int]) -> None:
    assert parse_addr(text) == addr


@pytest.mark.parametrize("text", ["9108", "host:", "host:port", "host:70000", ""])
def test_bad_addresses(text: str) -> None:
    with pytest.raises(UsageError):
        parse_addr(text)
