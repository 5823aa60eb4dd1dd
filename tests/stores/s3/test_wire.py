"""The relay's bodies over mcsync's own connections (``stores/s3_wire.py``), against SeaweedFS
behind the fault proxy: which requests go by them, what a damaged, short, refused or stalled
exchange becomes, a cancelled read letting go of the caller's buffer, and a connection the
server dropped while idle."""

from __future__ import annotations

import asyncio
import multiprocessing
import time
from collections.abc import Iterator
from typing import Any

import pytest

from mcsync.errors import (
    AccessDenied,
    IntegrityError,
    NotFound,
    PreconditionFailed,
    Transient,
    Unreachable,
)
from mcsync.retry import RetryPolicy
from mcsync.stores.http_wire import Reply, the_range
from mcsync.stores.s3 import S3Store
from mcsync.stores.s3_clients import ClientSettings
from mcsync.stores.s3_keys import Keys, S3Credentials
from mcsync.stores.s3_requests import Endpoint
from mcsync.stores.s3_store_clients import WIRE_FROM
from mcsync.stores.s3_wire import WireClient
from mcsync.types import ByteRange, ObjectInfo
from testbed.faultproxy import EXPIRED_TOKEN, Corrupt, FaultProxy, Reset, Rule, ShortBody, Stall
from testbed.servers import S3Endpoint

from ...integration.helpers import new_bucket, payload, put_objects, read_bucket, sync_stores

MiB = 1 << 20
WIRE = "mcsync/"  # the wire's User-Agent starts so (with the version, then " wire")


@pytest.fixture
def proxy(seaweed: S3Endpoint) -> Iterator[FaultProxy]:
    with FaultProxy(seaweed, seed=3).running() as p:
        yield p


def _store(ep: S3Endpoint, bucket: str, prefix: str = "p/") -> S3Store:
    return S3Store(scheme="s3", bucket=bucket, prefix=prefix, endpoint_url=ep.url,
                   region=ep.region, credentials=S3Credentials(ep.access_key, ep.secret_key))


def _by_wire(proxy: FaultProxy, op: str) -> tuple[int, int]:
    """(by the wire, by any other client) of the requests ``op`` the proxy saw."""
    seen = proxy.exchanges(op)
    wire = sum(1 for e in seen if e.headers.get("user-agent", "").endswith(" wire"))
    return wire, len(seen) - wire


def test_a_relay_sends_its_bodies_by_the_wire_byte_for_byte(
        seaweed: S3Endpoint, proxy: FaultProxy) -> None:
    objects = {"big.bin": payload(21 * MiB + 5, 1), "mid.bin": payload(3 * MiB, 2),
               "tiny.json": payload(900, 3)}
    src, dst = new_bucket(seaweed, "src"), new_bucket(seaweed, "dst")
    put_objects(seaweed, src, objects, prefix="p/")
    # Two addresses, so the stores are two endpoints (one would copy server-side).
    with FaultProxy(seaweed).running() as target:
        report = sync_stores(_store(proxy.endpoint, src), _store(target.endpoint, dst))
        assert report.exit_code == 0, report.failures
        assert read_bucket(seaweed, dst, prefix="p/") == objects
        # big.bin: 3 parts read and sent by the wire; mid.bin read and PUT whole by it;
        # tiny.json, under WIRE_FROM, by obstore.
        assert WIRE_FROM > 900
        assert _by_wire(proxy, "GetObject") == (4, 1)
        assert _by_wire(target, "UploadPart") == (3, 0)
        assert _by_wire(target, "PutObject")[0] == 1
        # The rest of the multipart API too: a relay needs no other client of the target.
        assert _by_wire(target, "CreateMultipartUpload") == (1, 0)
        assert _by_wire(target, "CompleteMultipartUpload") == (1, 0)
        sent = [e for e in target.exchanges("PutObject") + target.exchanges("UploadPart")
                if e.headers.get("user-agent", "").endswith(" wire")]
    assert len(sent) == 4
    assert all("x-amz-checksum-crc32c" in e.headers for e in sent)


def test_a_body_damaged_on_the_way_is_refused_and_nothing_is_stored(
        seaweed: S3Endpoint, proxy: FaultProxy) -> None:
    bucket = new_bucket(seaweed, "dmg")
    proxy.add(Rule(Corrupt(), op="PutObject", count=1))
    store = _store(proxy.endpoint, bucket)

    async def go() -> None:
        try:
            with pytest.raises(IntegrityError, match=r"dmg\.bin"):
                await store.put("dmg.bin", payload(2 * MiB, 4))
        finally:
            await store.aclose()

    asyncio.run(go())
    assert read_bucket(seaweed, bucket) == {}


def _read(ep: S3Endpoint, bucket: str, key: str, rng: ByteRange,
          expect: ObjectInfo | None = None) -> bytes:
    async def go() -> bytes:
        store = _store(ep, bucket)
        try:
            return bytes(await store.read_into(key, rng, bytearray(rng.length), expect=expect))
        finally:
            await store.aclose()

    return asyncio.run(go())


def _get(ep: S3Endpoint, bucket: str, expect: ObjectInfo) -> bytes:
    async def go() -> bytes:
        store = _store(ep, bucket)
        try:
            return bytes(await store.get(expect.key, expect=expect))
        finally:
            await store.aclose()

    return asyncio.run(go())


def test_reads_and_their_failures(seaweed: S3Endpoint, proxy: FaultProxy) -> None:
    data = payload(4 * MiB + 3, 5)
    bucket = new_bucket(seaweed, "rd")
    put_objects(seaweed, bucket, {"x.bin": data}, prefix="p/")
    ep = proxy.endpoint
    whole = ByteRange(0, len(data))
    assert _read(ep, bucket, "x.bin", ByteRange(MiB + 1, 3 * MiB)) == data[MiB + 1:3 * MiB]
    assert _by_wire(proxy, "GetObject") == (1, 0)
    with pytest.raises(NotFound, match=r"gone\.bin"):
        _read(ep, bucket, "gone.bin", whole)
    etag = seaweed.client().head_object(Bucket=bucket, Key="p/x.bin")["ETag"].strip('"')
    assert _read(ep, bucket, "x.bin", whole, ObjectInfo("x.bin", len(data), etag, None)) == data
    with pytest.raises(PreconditionFailed, match=r"x\.bin"):
        _read(ep, bucket, "x.bin", whole, ObjectInfo("x.bin", len(data), "0" * 32, None))
    # a whole object read by the wire is pinned to its listed ETag: a changed one is refused,
    # not cut to the listed size
    assert _get(ep, bucket, ObjectInfo("x.bin", len(data), etag, None)) == data
    with pytest.raises(PreconditionFailed, match=r"x\.bin"):
        _get(ep, bucket, ObjectInfo("x.bin", MiB, "0" * 32, None))
    assert _by_wire(proxy, "GetObject")[1] == 0
    proxy.add(Rule(ShortBody(0.5), op="GetObject", count=1))
    with pytest.raises(Transient, match=r"x\.bin"):
        _read(ep, bucket, "x.bin", whole)
    with pytest.raises(Unreachable, match=r"x\.bin"):
        _read(S3Endpoint("http://127.0.0.1:9", ep.access_key, ep.secret_key), bucket, "x.bin",
              whole)


def test_a_cancelled_read_lets_go_of_the_buffer_at_once(
        seaweed: S3Endpoint, proxy: FaultProxy) -> None:
    data = payload(2 * MiB, 6)
    bucket = new_bucket(seaweed, "cx")
    put_objects(seaweed, bucket, {"s.bin": data}, prefix="p/")
    proxy.add(Rule(Stall(30), op="GetObject", count=1))
    store = _store(proxy.endpoint, bucket)

    async def go() -> tuple[float, bytes]:
        try:
            buf = bytearray(len(data))
            task = asyncio.create_task(store.read_into("s.bin", ByteRange(0, len(data)), buf))
            await asyncio.sleep(0.5)
            started = time.monotonic()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            took = time.monotonic() - started
            before = bytes(buf)
            await asyncio.sleep(0.3)
            assert bytes(buf) == before, "the buffer was written after the read returned"
            # the connection it held is not handed out again: the next read is whole
            again = await store.read_into("s.bin", ByteRange(0, len(data)), bytearray(len(data)))
            return took, bytes(again)
        finally:
            await store.aclose()

    took, again = asyncio.run(go())
    assert took < 3, f"the cancelled read took {took:.1f} s to let go"
    assert again == data


def test_a_request_let_go_of_while_it_waited_for_a_connection_is_never_sent(
        seaweed: S3Endpoint, proxy: FaultProxy) -> None:
    """With every connection busy a request waits for a thread; cancelled meanwhile, or still
    waiting when the wire is closed, it must not go out later (a part's PUT would land in an
    upload being aborted)."""
    data = payload(MiB, 8)
    bucket = new_bucket(seaweed, "wait")
    put_objects(seaweed, bucket, {"w.bin": data}, prefix="p/")
    proxy.add(Rule(Stall(1.5), op="GetObject", count=1))
    settings = ClientSettings(bucket=bucket, endpoint_url=proxy.endpoint.url,
                              region=seaweed.region, path_style=True, max_connections=1,
                              retry=RetryPolicy())
    wire = WireClient(settings, Keys(S3Credentials(seaweed.access_key, seaweed.secret_key)))
    rng = ByteRange(0, len(data))

    async def go() -> bytes:
        first = asyncio.create_task(
            wire.read_into(bucket, "p/w.bin", "w.bin", rng, bytearray(len(data)), None))
        await asyncio.sleep(0.3)  # the one connection is held at the proxy
        second, third = (asyncio.create_task(
            wire.read_into(bucket, "p/w.bin", "w.bin", rng, bytearray(len(data)), None))
            for _ in range(2))
        await asyncio.sleep(0.1)  # both wait for the one thread
        second.cancel()
        await asyncio.sleep(0.1)
        wire.close()  # the first is still on the wire
        got = bytes(await first)
        with pytest.raises(asyncio.CancelledError):
            await second
        with pytest.raises(Transient, match="not sent: the wire was closed"):
            await third
        assert wire._wire._idle == []  # the first's connection, answered after close, is shut
        with pytest.raises(RuntimeError, match="closed"):
            await wire.read_into(bucket, "p/w.bin", "w.bin", rng, bytearray(len(data)), None)
        return got

    try:
        assert asyncio.run(go()) == data
    finally:
        wire.close()
    assert len(proxy.exchanges("GetObject")) == 1  # neither the second nor the third went out


def test_a_connection_dropped_while_idle_is_replaced_without_a_failure(
        seaweed: S3Endpoint, proxy: FaultProxy) -> None:
    data = payload(2 * MiB, 7)
    bucket = new_bucket(seaweed, "idle")
    put_objects(seaweed, bucket, {"a.bin": data}, prefix="p/")
    store = _store(proxy.endpoint, bucket)
    rng = ByteRange(0, len(data))

    async def go() -> list[bytes]:
        try:
            first = bytes(await store.read_into("a.bin", rng, bytearray(len(data))))
            wire = await store._clients.wire()
            assert isinstance(wire, WireClient)
            # The next request on the kept connection is reset before it reaches the server,
            # as a connection the server closed while idle fails.
            proxy.add(Rule(Reset("before"), op="GetObject", count=1))
            second = bytes(await store.read_into("a.bin", rng, bytearray(len(data))))
            return [first, second]
        finally:
            await store.aclose()

    assert asyncio.run(go()) == [data, data]
    outcomes = [e.outcome for e in proxy.exchanges("GetObject")]
    assert outcomes == ["ok", "reset", "ok"]
    # on a connection of its own, a reset before any answer is the retry layer's, not the wire's
    proxy.add(Rule(Reset("before"), op="GetObject", count=1))
    with pytest.raises(Transient):
        _read(proxy.endpoint, bucket, "a.bin", rng)


def test_a_post_that_failed_before_any_answer_is_not_sent_again_by_the_wire(
        seaweed: S3Endpoint, proxy: FaultProxy) -> None:
    """A create (or complete) the server may have acted on is the retry layer's to send
    again, with its back-off, not the wire's at once, even on a connection kept alive."""
    data = payload(2 * MiB, 9)
    bucket = new_bucket(seaweed, "post")
    put_objects(seaweed, bucket, {"a.bin": data}, prefix="p/")
    store = _store(proxy.endpoint, bucket)

    async def go() -> None:
        try:
            await store.read_into("a.bin", ByteRange(0, len(data)), bytearray(len(data)))
            wire = await store._clients.wire()
            assert isinstance(wire, WireClient)
            proxy.add(Rule(Reset("before"), op="CreateMultipartUpload", count=1))
            with pytest.raises(Transient):
                await wire.create_upload(bucket, "p/b.bin", "b.bin")
            # the next one goes, on a connection of its own
            assert await wire.create_upload(bucket, "p/b.bin", "b.bin")
        finally:
            await store.aclose()

    asyncio.run(go())
    assert [e.outcome for e in proxy.exchanges("CreateMultipartUpload")] == ["reset", "ok"]


async def _close_idle(proxy: FaultProxy) -> None:
    """The proxy closes the client's kept connection once it waits for the next request (its
    handler gets there a moment after the client has the answer), and the FIN arrives."""
    deadline = time.monotonic() + 10
    while proxy.close_idle() == 0:
        assert time.monotonic() < deadline, "no connection went idle at the proxy"
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.2)


def test_a_connection_the_server_closed_while_idle_is_not_used_even_for_a_post(
        seaweed: S3Endpoint, proxy: FaultProxy) -> None:
    """A server's idle timeout closes a kept connection between requests: the wire sees it
    closed before sending and takes a new one, so even a create (never sent twice) goes."""
    data = payload(2 * MiB, 10)
    bucket = new_bucket(seaweed, "idleclose")
    put_objects(seaweed, bucket, {"a.bin": data}, prefix="p/")
    store = _store(proxy.endpoint, bucket)

    async def go() -> list[bytes]:
        try:
            got = [bytes(await store.read_into("a.bin", ByteRange(0, len(data)),
                                               bytearray(len(data))))]
            wire = await store._clients.wire()
            assert isinstance(wire, WireClient)
            await _close_idle(proxy)
            upload = await wire.create_upload(bucket, "p/b.bin", "b.bin")
            await wire.abort_upload(bucket, "p/b.bin", upload, "b.bin")
            await _close_idle(proxy)
            got.append(bytes(await store.read_into("a.bin", ByteRange(0, len(data)),
                                                   bytearray(len(data)))))
            return got
        finally:
            await store.aclose()

    assert asyncio.run(go()) == [data, data]
    assert [e.outcome for e in proxy.exchanges()] == ["ok"] * 4


def _read_in_child(store: S3Store, rng: ByteRange, out: Any) -> None:
    async def go() -> bytes:
        return bytes(await store.read_into("f.bin", rng, bytearray(rng.length)))

    out.put(asyncio.run(go()))


def test_a_child_forked_after_the_parent_read_reads_on_connections_of_its_own(
        seaweed: S3Endpoint) -> None:
    data = payload(3 * MiB, 8)
    bucket = new_bucket(seaweed, "fork")
    put_objects(seaweed, bucket, {"f.bin": data}, prefix="p/")
    store = _store(seaweed, bucket)
    rng = ByteRange(0, len(data))
    loop = asyncio.new_event_loop()
    try:
        assert bytes(loop.run_until_complete(
            store.read_into("f.bin", rng, bytearray(len(data))))) == data
        ctx = multiprocessing.get_context("fork")
        out = ctx.Queue()
        children = [ctx.Process(target=_read_in_child, args=(store, rng, out)) for _ in range(3)]
        for child in children:
            child.start()
        got = [out.get(timeout=60) for _ in children]
        for child in children:
            child.join(timeout=30)
        assert [child.exitcode for child in children] == [0, 0, 0]
        assert got == [data] * 3
        # the parent's own connection still answers after its children's exit
        assert bytes(loop.run_until_complete(
            store.read_into("f.bin", rng, bytearray(len(data))))) == data
    finally:
        loop.run_until_complete(store.aclose())
        loop.close()


def test_a_refused_put_is_reported_as_the_refusal(seaweed: S3Endpoint,
                                                   proxy: FaultProxy) -> None:
    # The proxy takes the whole body before it answers; a server that answers and closes
    # before the body is sent (the wire's "early answer") is not built here.
    bucket = new_bucket(seaweed, "ref")
    proxy.add(Rule(EXPIRED_TOKEN, op="PutObject", count=1))
    store = _store(proxy.endpoint, bucket)

    async def go() -> None:
        try:
            with pytest.raises(AccessDenied, match=r"big\.bin: credentials expired"):
                await store.put("big.bin", payload(16 * MiB, 9))
            await store.put("big.bin", payload(2 * MiB, 9))  # the next one is not refused
        finally:
            await store.aclose()

    asyncio.run(go())
    assert read_bucket(seaweed, bucket, prefix="p/") == {"big.bin": payload(2 * MiB, 9)}


@pytest.mark.parametrize(("status", "headers", "ok"), [
    (206, {"content-range": "bytes 5-9/100"}, True),
    (206, {"content-range": "bytes 0-4/100"}, False),  # another range than the one asked
    (206, {}, False),
    (200, {"content-length": "5"}, False),  # the whole object from 0, not bytes 5-9
])
def test_an_answer_is_the_range_asked_for(status: int, headers: dict[str, str],
                                          ok: bool) -> None:
    assert the_range(Reply(status, headers, b"", 5), ByteRange(5, 10)) is ok
    whole = Reply(200, {"content-length": "10"}, b"", 10)
    assert the_range(whole, ByteRange(0, 10))


@pytest.mark.parametrize(("path_style", "address"), [
    (True, ("store.example", 9000)),
    (False, ("bkt.store.example", 9000)),  # virtual-hosted: the bucket's own name
])
def test_the_wire_connects_to_the_host_its_requests_name(
        path_style: bool, address: tuple[str, int]) -> None:
    settings = ClientSettings(bucket="bkt", endpoint_url="https://store.example:9000",
                              region="us-east-1", path_style=path_style, max_connections=4,
                              retry=RetryPolicy())
    wire = WireClient(settings, Keys(S3Credentials("k", "s")))
    try:
        host_header = Endpoint.of(settings).target("bkt", "a/b")[0]
        assert wire.address == address
        assert host_header == f"{address[0]}:{address[1]}"
    finally:
        wire.close()
