"""A fault-injecting HTTP/1.1 proxy on 127.0.0.1 in front of an S3 endpoint, for tests.

Requests go on byte for byte (request line, headers, body: a SigV4 signature still verifies
upstream), bodies streamed both ways, one upstream connection per client connection, kept alive
while both sides keep theirs. Raw asyncio streams, no HTTP library: a fault in the middle of a
body happens exactly where it says, and nothing is re-framed on the way.

Each request is named by its S3 operation (``s3_requests``: from method, path and query) and meets
the ``Rule``s in order; the first that matches (operation glob or set, key glob, access key of
its ``Credential=``, a header, a time window, at most ``count`` times, ``probability``) applies
its fault: a ``Reply`` (an S3 error instead of forwarding: ``SLOW_DOWN``, ``INTERNAL_ERROR``,
``TOO_MANY_REQUESTS``, ``EXPIRED_TOKEN``, ``INVALID_ACCESS_KEY`` or any), a ``Reset`` (TCP RST
before forwarding, in the request body or in the response body), a ``Stall``, a ``ShortBody``
or a ``Corrupt`` request body. Probabilities are drawn from a ``random.Random`` seeded with the
proxy's seed, the rule and the request's identity (operation, key, part number, how often that
was seen), so a run faults the same requests however its requests interleave. Every request is
recorded (``Exchange``: operation, key, access key, status, fault, outcome). Rules may change
while the proxy runs, from any thread::

    with FaultProxy(seaweed, seed=7).running() as proxy:
        proxy.add(Rule(SLOW_DOWN, op="PutObject", count=2))
        client = proxy.endpoint.client(retries={"total_max_attempts": 1})
"""

from __future__ import annotations

import asyncio
import contextlib
import fnmatch
import http
import random
import socket
import struct
import threading
import time
import uuid
from collections import Counter
from collections.abc import Collection, Iterable, Iterator
from dataclasses import dataclass, field
from email.utils import formatdate
from typing import ClassVar, Literal
from urllib.parse import urlsplit
from xml.sax.saxutils import escape

from .s3_requests import UPLOADS, Exchange, header_map, parse_request, s3_operation
from .servers import LOOPBACK, S3Endpoint

__all__ = [
    "EXPIRED_TOKEN",
    "INTERNAL_ERROR",
    "INVALID_ACCESS_KEY",
    "SLOW_DOWN",
    "TOO_MANY_REQUESTS",
    "UPLOADS",
    "Corrupt",
    "Exchange",
    "Fault",
    "FaultProxy",
    "Reply",
    "Reset",
    "Rule",
    "ShortBody",
    "Stall",
    "expire_key",
    "s3_operation",
]

_CHUNK = 1 << 18
SETTLE_S = 1.0  # see FaultProxy.exchanges
_LIMIT = 1 << 20  # longest message head


@dataclass(frozen=True)
class Reply:
    """Answer ``status`` with an S3 error ``code`` instead of forwarding the request."""

    status: int
    code: str
    message: str

    @property
    def name(self) -> str:
        return self.code


SLOW_DOWN = Reply(503, "SlowDown", "Please reduce your request rate.")
INTERNAL_ERROR = Reply(500, "InternalError", "We encountered an internal error. Please try again.")
TOO_MANY_REQUESTS = Reply(429, "TooManyRequests", "Please reduce your request rate.")
EXPIRED_TOKEN = Reply(403, "ExpiredToken", "The provided token has expired.")
INVALID_ACCESS_KEY = Reply(403, "InvalidAccessKeyId",
                           "The AWS Access Key Id you provided does not exist in our records.")


@dataclass(frozen=True)
class Reset:
    """A TCP RST to the client: ``before`` the request is forwarded, or once ``fraction`` of
    the ``request`` body (the server's connection is reset too; a request without a body: once
    its head reached the server) or of the ``response`` body was passed on."""

    at: Literal["before", "request", "response"] = "before"
    fraction: float = 0.5

    @property
    def name(self) -> str:
        return f"reset-{self.at}"


@dataclass(frozen=True)
class Stall:
    """Hold the server's answer back ``seconds`` (less if the client gives up first)."""

    seconds: float
    name: ClassVar[str] = "stall"


@dataclass(frozen=True)
class ShortBody:
    """The answer's head unchanged (its Content-Length too), ``fraction`` of its body, a close."""

    fraction: float = 0.5
    name: ClassVar[str] = "short-body"


@dataclass(frozen=True)
class Corrupt:
    """Flip the lowest bit of the middle byte of the request body (a Content-Length body)."""

    name: ClassVar[str] = "corrupt"


Fault = Reply | Reset | Stall | ShortBody | Corrupt


@dataclass
class Rule:
    """Apply ``fault`` to requests meeting every condition given. ``op``: a glob or a set of
    operation names; ``key``: a glob on the object key; ``header``: a header the request
    carries; ``after_s`` / ``for_s``: the window, in seconds since the proxy started (or since
    the rule was added ``from_now``); ``count``: at most so many times."""

    fault: Fault
    op: str | Collection[str] = "*"
    key: str = "*"
    access_key: str | None = None
    header: str | None = None
    probability: float = 1.0
    count: int | None = None
    after_s: float = 0.0
    for_s: float | None = None
    name: str = ""
    applied: int = field(default=0, init=False)  # requests it faulted so far
    origin: float | None = field(default=None, repr=False)  # monotonic; None: proxy start

    def matches(self, req: Exchange, age: float) -> bool:
        op_ok = (fnmatch.fnmatchcase(req.op, self.op) if isinstance(self.op, str)
                 else req.op in self.op)
        return (op_ok and fnmatch.fnmatchcase(req.key, self.key)
                and (self.access_key is None or req.access_key == self.access_key)
                and (self.header is None or self.header.lower() in req.headers)
                and (self.count is None or self.applied < self.count)
                and age >= self.after_s and (self.for_s is None or age < self.after_s + self.for_s))


def expire_key(access_key: str, after_s: float, fault: Reply = EXPIRED_TOKEN) -> Rule:
    """Requests signed with ``access_key`` are refused (403 ExpiredToken) from ``after_s`` on."""
    return Rule(fault, access_key=access_key, after_s=after_s, name=f"expire {access_key}")


class _Gone(Exception):
    """One side ("client" or "upstream") closed or reset its connection."""

    def __init__(self, side: str) -> None:
        super().__init__(side)
        self.side = side


class _Cut(Exception):
    """The request body was cut short by a Reset: reset both connections."""


Framing = int | Literal["chunked", "eof"]
_Conn = tuple[asyncio.StreamReader, asyncio.StreamWriter]


def _framing(headers: dict[str, str], method: str = "", status: int | None = None) -> Framing:
    if status is not None and (method == "HEAD" or status in (204, 304) or status < 200):
        return 0
    if "chunked" in headers.get("transfer-encoding", "").lower():
        return "chunked"
    if "content-length" in headers:
        return int(headers["content-length"])
    return "eof" if status is not None else 0  # a response without length ends with its stream


async def _read(reader: asyncio.StreamReader, side: str, n: int = _CHUNK,
                until: bytes | None = None) -> bytes:
    try:
        return await (reader.readuntil(until) if until else reader.read(n))
    except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError) as exc:
        raise _Gone(side) from exc


async def _write(writer: asyncio.StreamWriter | None, data: bytes, side: str) -> None:
    if writer is not None:
        try:
            writer.write(data)
            await writer.drain()
        except ConnectionError as exc:
            raise _Gone(side) from exc


async def _body(reader: asyncio.StreamReader, writer: asyncio.StreamWriter | None,
                framing: Framing, sides: tuple[str, str], *, cut: float | None = None,
                flip: bool = False) -> None:
    """Pass a message body on as it comes (``writer`` None: drop it); with ``cut``, only that
    fraction of it (of its first read, if its length is not known)."""
    src, dst = sides
    if isinstance(framing, int):
        todo, flip_at, sent = framing if cut is None else int(framing * cut), framing // 2, 0
        while sent < todo:
            data = await _read(reader, src, min(_CHUNK, todo - sent))
            if not data:
                raise _Gone(src)
            if flip and sent <= flip_at < sent + len(data):
                data = bytearray(data)
                data[flip_at - sent] ^= 0x01
            await _write(writer, bytes(data), dst)
            sent += len(data)
        return
    while framing == "eof":
        data = await _read(reader, src)
        await _write(writer, data, dst)
        if not data or cut is not None:
            return
    while True:  # chunked: passed on with its framing
        line = await _read(reader, src, until=b"\r\n")
        await _write(writer, line, dst)
        if cut is not None:
            return
        if int(line.split(b";")[0], 16) == 0:
            while (trailer := await _read(reader, src, until=b"\r\n")) != b"\r\n":
                await _write(writer, trailer, dst)
            return await _write(writer, trailer, dst)
        await _body(reader, writer, int(line.split(b";")[0], 16) + 2, sides)


async def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with a TCP RST (SO_LINGER 0), not a FIN, once what was written left the process."""
    with contextlib.suppress(ConnectionError):
        writer.transport.set_write_buffer_limits(0)
        await writer.drain()
    with contextlib.suppress(OSError, AttributeError):
        writer.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                                   struct.pack("ii", 1, 0))
    writer.transport.abort()


def _gone(reader: asyncio.StreamReader) -> bool:
    return reader.at_eof() or reader.exception() is not None


class FaultProxy:
    """The proxy. ``upstream``: the endpoint (whose keys ``endpoint`` carries) or its URL."""

    def __init__(self, upstream: S3Endpoint | str, rules: Iterable[Rule] = (), *,
                 seed: int = 0) -> None:
        self.upstream = (upstream if isinstance(upstream, S3Endpoint)
                         else S3Endpoint(upstream, "", ""))
        self.rules: list[Rule] = list(rules)
        self.seed = seed
        self.log: list[Exchange] = []
        self.url = ""
        self._lock = threading.Lock()
        self._draws: Counter[tuple[str, ...]] = Counter()
        self._started = time.monotonic()
        self._writers: set[asyncio.StreamWriter] = set()
        self._idle: set[asyncio.StreamWriter] = set()  # clients between two requests
        self._conns = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def endpoint(self) -> S3Endpoint:
        """The upstream endpoint's keys and region at the proxy's address."""
        up = self.upstream
        return S3Endpoint(self.url, up.access_key, up.secret_key, up.region)

    def elapsed(self) -> float:
        return time.monotonic() - self._started

    # -- rules and records (any thread) --------------------------------------------------------

    def add(self, rule: Rule, *, from_now: bool = False) -> Rule:
        """Add ``rule`` after the others; ``from_now``: its window starts now."""
        with self._lock:
            if from_now:
                rule.origin = time.monotonic()
            self.rules.append(rule)
        return rule

    def remove(self, rule: Rule) -> None:
        with self._lock:
            self.rules.remove(rule)

    def clear(self) -> None:
        with self._lock:
            self.rules.clear()

    def exchanges(self, op: str | None = None, *, fault: str | None = None,
                  key: str | None = None) -> list[Exchange]:
        """The requests recorded so far; of operation ``op`` (a glob), with ``fault`` (its
        name; "" for none) and of ``key`` (a glob), as far as given. A client holds its whole
        answer a moment before the proxy's thread records how the exchange ended: those still
        "pending" are given up to ``SETTLE_S`` to settle first."""
        deadline = time.monotonic() + SETTLE_S
        while True:
            with self._lock:
                found = list(self.log)
            if all(e.outcome != "pending" for e in found) or time.monotonic() > deadline:
                break
            time.sleep(0.005)
        return [e for e in found if (op is None or fnmatch.fnmatchcase(e.op, op))
                and (fault is None or (e.fault or "") == fault)
                and (key is None or fnmatch.fnmatchcase(e.key, key))]

    def summary(self) -> Counter[tuple[str, str, str]]:
        """(operation, fault or "-", outcome) → requests: what happened, for a message."""
        return Counter((e.op, e.fault or "-", e.outcome) for e in self.exchanges())

    def _choose(self, req: Exchange) -> Rule | None:
        now = time.monotonic()
        with self._lock:
            for i, rule in enumerate(self.rules):
                if not rule.matches(req, now - (rule.origin or self._started)):
                    continue
                if rule.probability < 1.0:
                    ident = (rule.name or str(i), req.op, req.key, req.part)
                    self._draws[ident] += 1
                    draw = random.Random(f"{self.seed}|{ident}|{self._draws[ident]}").random()
                    if draw >= rule.probability:
                        continue
                rule.applied += 1
                return rule
        return None

    def _record(self, head: bytes, conn: int) -> Exchange:
        ex = parse_request(head)
        with self._lock:
            ex.seq, ex.t, ex.conn = len(self.log) + 1, self.elapsed(), conn
            self.log.append(ex)
        return ex

    # -- one client connection -----------------------------------------------------------------

    async def _serve(self, cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        self._writers.add(cw)
        self._conns += 1
        conn = self._conns
        up: _Conn | None = None
        ex: Exchange | None = None
        try:
            while True:
                self._idle.add(cw)
                try:
                    head = await cr.readuntil(b"\r\n\r\n")
                except (ConnectionError, asyncio.IncompleteReadError):
                    return  # the client closed between requests (or inside a head)
                finally:
                    self._idle.discard(cw)
                ex = self._record(head, conn)
                rule = self._choose(ex)
                fault = rule.fault if rule is not None else None
                if rule is not None:
                    ex.fault, ex.rule = rule.fault.name, rule.name or None
                if isinstance(fault, Reset) and fault.at == "before":
                    ex.outcome = "reset"
                    return await _reset(cw)
                if isinstance(fault, Reply):
                    await self._reply(ex, cr, cw, fault)
                    continue
                if up is None or _gone(up[0]):
                    up = await self._connect(up)
                if not await self._exchange(ex, head, cr, cw, up, fault):
                    return
        except _Gone as exc:
            if ex is not None and ex.outcome == "pending":
                ex.outcome = f"{exc.side}-gone"
        except _Cut:
            if ex is not None:
                ex.outcome = "reset"
            await _reset(cw)
        except asyncio.CancelledError:  # the proxy is stopping; nothing awaits this handler
            if ex is not None and ex.outcome == "pending":
                ex.outcome = "stopped"
        finally:
            for writer in (cw, up[1] if up is not None else None):
                if writer is not None:
                    writer.close()
                    self._writers.discard(writer)

    async def _connect(self, old: _Conn | None) -> _Conn:
        if old is not None:
            old[1].close()
            self._writers.discard(old[1])
        where = urlsplit(self.upstream.url)
        try:
            up = await asyncio.open_connection(where.hostname, where.port, limit=_LIMIT)
        except OSError as exc:
            raise _Gone("upstream") from exc
        self._writers.add(up[1])
        return up

    async def _reply(self, ex: Exchange, cr: asyncio.StreamReader, cw: asyncio.StreamWriter,
                     fault: Reply) -> None:
        if ex.headers.get("expect", "").lower() == "100-continue":
            await _write(cw, b"HTTP/1.1 100 Continue\r\n\r\n", "client")
        await _body(cr, None, _framing(ex.headers), ("client", "client"))
        rid = uuid.uuid4().hex[:16].upper()
        body = (f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{fault.code}</Code>'
                f"<Message>{escape(fault.message)}</Message><Resource>"
                f"{escape(urlsplit(ex.target).path)}</Resource><RequestId>{rid}</RequestId>"
                "</Error>").encode() if ex.method != "HEAD" else b""  # HEAD: no body
        try:
            phrase = http.HTTPStatus(fault.status).phrase
        except ValueError:
            phrase = "Error"
        head = (f"HTTP/1.1 {fault.status} {phrase}\r\nContent-Type: application/xml\r\n"
                f"Content-Length: {len(body)}\r\nx-amz-request-id: {rid}\r\n"
                f"Date: {formatdate(usegmt=True)}\r\nServer: mcsync-faultproxy\r\n\r\n")
        ex.status = fault.status
        await _write(cw, head.encode() + body, "client")
        ex.outcome = "ok"

    async def _exchange(self, ex: Exchange, head: bytes, cr: asyncio.StreamReader,
                        cw: asyncio.StreamWriter, up: _Conn, fault: Fault | None) -> bool:
        """Forward one request and its answer; whether both connections stay usable."""
        ur, uw = up
        await _write(uw, head, "upstream")
        cut = fault.fraction if isinstance(fault, Reset) and fault.at == "request" else None

        async def send_body() -> None:
            await _body(cr, uw, _framing(ex.headers), ("client", "upstream"), cut=cut,
                        flip=isinstance(fault, Corrupt))
            if cut is not None:
                await _reset(uw)
                raise _Cut

        sending = asyncio.ensure_future(send_body())
        answering = asyncio.ensure_future(self._respond(ex, ur, cr, cw, fault))
        try:
            await asyncio.wait({sending, answering}, return_when=asyncio.FIRST_EXCEPTION)
            failed = sending.exception() if sending.done() else None
            if failed is not None:
                raise failed
            keep = await answering
            # The body went on whole, unless the server answered before reading it.
            done, _ = await asyncio.wait({sending}, timeout=1.0)
            return keep and bool(done) and sending.exception() is None
        finally:
            for task in (sending, answering):
                task.cancel()
            await asyncio.gather(sending, answering, return_exceptions=True)

    async def _respond(self, ex: Exchange, ur: asyncio.StreamReader, cr: asyncio.StreamReader,
                       cw: asyncio.StreamWriter, fault: Fault | None) -> bool:
        while True:  # interim answers (100 Continue) go on as they come
            head = await _read(ur, "upstream", until=b"\r\n\r\n")
            line, *lines = head.decode("latin-1").split("\r\n")
            if (status := int(line.split(" ", 2)[1])) >= 200 or status == 101:
                break
            await _write(cw, head, "client")
        headers = header_map(lines)
        framing = _framing(headers, ex.method, status)
        ex.status = status
        if isinstance(fault, Stall):
            until = time.monotonic() + fault.seconds
            while time.monotonic() < until and not _gone(cr):
                await asyncio.sleep(min(0.05, max(0.0, until - time.monotonic())))
            if _gone(cr):
                raise _Gone("client")
        await _write(cw, head, "client")
        if isinstance(fault, ShortBody) or (isinstance(fault, Reset) and fault.at == "response"):
            await _body(ur, cw, framing, ("upstream", "client"), cut=fault.fraction)
            ex.outcome = "reset" if isinstance(fault, Reset) else "short"
            await (_reset(cw) if isinstance(fault, Reset) else cw.drain())
            return False
        await _body(ur, cw, framing, ("upstream", "client"))
        ex.outcome = "ok"
        closing = "close" in headers.get("connection", "") + ex.headers.get("connection", "")
        return framing != "eof" and not closing

    # -- running -------------------------------------------------------------------------------

    def start(self) -> FaultProxy:
        """Listen on 127.0.0.1 (a free port), served by a thread and event loop of its own."""
        loop = self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=loop.run_forever, name="faultproxy", daemon=True)
        self._thread.start()

        async def listen() -> asyncio.Server:
            return await asyncio.start_server(self._serve, LOOPBACK, 0, limit=_LIMIT)

        self._server = asyncio.run_coroutine_threadsafe(listen(), loop).result(10)
        self.url = f"http://{LOOPBACK}:{self._server.sockets[0].getsockname()[1]}"
        self._started = time.monotonic()
        return self

    def close_idle(self) -> int:
        """Close every client connection that is between two requests, as a server's idle
        timeout does (a FIN, no answer); how many."""
        loop = self._loop
        if loop is None:
            return 0

        async def close() -> int:
            idle = list(self._idle)
            for writer in idle:
                writer.close()
            return len(idle)

        return asyncio.run_coroutine_threadsafe(close(), loop).result(10)

    def stop(self) -> None:
        """Close every connection (a client in the middle of a request sees it reset)."""
        loop, server = self._loop, self._server
        if loop is None or server is None:
            return

        async def close() -> None:
            server.close()
            for writer in list(self._writers):
                writer.transport.abort()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()  # _serve ends quietly
            await asyncio.gather(*tasks, return_exceptions=True)
            await server.wait_closed()

        asyncio.run_coroutine_threadsafe(close(), loop).result(15)
        loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(10)
        loop.close()
        self._loop = self._server = self._thread = None

    @contextlib.contextmanager
    def running(self) -> Iterator[FaultProxy]:
        self.start()
        try:
            yield self
        finally:
            self.stop()
