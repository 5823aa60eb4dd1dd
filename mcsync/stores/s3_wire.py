"""The relay's bodies over mcsync's own HTTP/1.1 connections: a ranged GET read straight into
the run's buffer, and an UploadPart (or a whole object's PUT) sent straight from it.

Between two stores every byte passes through the client, and what it costs there is copies.
obstore hands a GET's body out in pieces of its own (fresh memory: page faults, then a copy
into the part's buffer) and the CRT copies every body it sends into a buffer of its own. Here
the socket reads into the part's buffer (``recv_into``) and writes from it (``sendall``), each
in a C loop with the GIL released, as ``io.Copy`` does in rclone: the kernel's copy is the
only one (figures: benchmarks/results/2026-12-07-relay-wire.md).

Blocking connections on threads of the client's own (one per connection in use), kept alive
between requests. Besides the bodies, the wire sends the multipart API's other requests and
the copies (``S3Clients.sender``): a run that relays needs no other client of the target.
Requests are signed on the caller's thread (``s3_sign``: SigV4, UNSIGNED-PAYLOAD, used only
where ``ClientSettings.sign_payload`` is False, as the CRT's own S3 client is; every body
carries the checksum header its caller gives, which the target verifies). Answers are reduced
to ``s3_errors.Answer`` and translated by the one table; a failed connection is mcsync's error
here. No retries: those are the store's one retry layer's (a reused connection the server had
closed is the exception: a request that failed there before any answer is sent once more on a
new connection, as Go's client does, but for a POST, which the server may have acted on).
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import os
import select
import socket
import ssl
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from urllib.parse import urlsplit

from .._version import __version__
from ..errors import Permanent, Transient, Unreachable
from ..types import Buffer, ByteRange
from .s3_clients import ClientSettings
from .s3_errors import S3Answered, crt_answer, not_trusted
from .s3_keys import Keys
from .s3_requests import ANSWER_TIMEOUT_S, SLOWEST_SEND_BYTES_S, Endpoint, Response, S3Requests
from .s3_sign import sign

CONNECT_TIMEOUT_S = 10.0
USER_AGENT = ("User-Agent", f"mcsync/{__version__} wire")
# How long a cancelled request may take to let go of the caller's buffer (its socket is shut
# down at once; this bounds the thread's way out).
RELEASE_TIMEOUT_S = 10.0
# A kept connection that fails on its next request before any answer (the server closed it as
# the request went, past the idle check): sent again at once, unless it is a POST (create,
# complete), which the server may have acted on.
_STALE = (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError)


@dataclass
class _Call:
    """One request on its thread: the connection it holds, for a cancellation to shut."""

    conn: http.client.HTTPConnection | None = None
    cancelled: bool = False
    answered: bool = False  # a status line came back: not to be sent again

    def abort(self) -> None:
        self.cancelled = True
        conn = self.conn
        if conn is not None and conn.sock is not None:
            with contextlib.suppress(OSError):
                conn.sock.shutdown(socket.SHUT_RDWR)


@dataclass(frozen=True, slots=True)
class _Answer:
    status: int
    headers: dict[str, str]
    body: bytes
    read: int  # bytes read into the caller's buffer (a GET into one)


class WireClient(S3Requests):
    """GETs into caller's buffers and requests with bodies, to one store's endpoint."""

    def __init__(self, settings: ClientSettings, keys: Keys) -> None:
        self._settings = settings
        self._endpoint = Endpoint.of(settings)
        # Connected to the host its requests name: the bucket's own with virtual-hosted
        # requests (as the CRT and obstore connect), whose name the certificate must match.
        named = urlsplit("//" + self._endpoint.target(settings.bucket, None)[0])
        self.address = (named.hostname or "", named.port)
        self._keys = keys
        self._tls = _tls_context(settings) if self._endpoint.tls else None
        self._start()

    def _start(self) -> None:
        """Threads and connections of this process's own: a forked child (a data loader's
        worker) starts again, since the parent's threads are not in it and its connections
        are the parent's."""
        self._pid = os.getpid()
        self._idle: list[http.client.HTTPConnection] = []
        self._lock = threading.Lock()
        self._threads = ThreadPoolExecutor(max_workers=max(1, self._settings.max_connections),
                                           thread_name_prefix="mcsync-wire")

    async def request(self, method: str, bucket: str, key: str | None, what: str, *,
                      operation: str,
                      query: str = "", headers: Sequence[tuple[str, str]] = (),
                      body: Buffer | None = None) -> Response:
        host, path = self._endpoint.target(bucket, key)
        target = f"{path}?{query}" if query else path
        length = memoryview(body).nbytes if body is not None else 0
        sent = await self._signed(method, path, query, [("Host", host), USER_AGENT,
                                                        ("Content-Length", str(length)),
                                                        *headers])
        got = await self._run(what, method, target, sent, body, None)
        if got.status >= 300:
            raise S3Answered(crt_answer(got.status, got.body))
        return Response(got.status, got.headers, got.body)

    async def read_into(self, bucket: str, key: str, what: str, rng: ByteRange,
                        buf: bytearray, if_match: str | None) -> memoryview:
        """Bytes ``rng`` of ``key`` into the start of ``buf`` (only while its ETag is
        ``if_match``, if given); the view of them. Transient if the body is not exactly the
        range."""
        host, path = self._endpoint.target(bucket, key)
        asked = [("Host", host), USER_AGENT, ("Range", f"bytes={rng.start}-{rng.end - 1}")]
        if if_match:
            asked.append(("If-Match", f'"{if_match}"'))
        sent = await self._signed("GET", path, "", asked)
        view = memoryview(buf)[:rng.length]
        got = await self._run(what, "GET", path, sent, None, view)
        if got.status >= 300:
            raise S3Answered(crt_answer(got.status, got.body))
        if got.read != rng.length:
            raise Transient(f"{what}: read {got.read} bytes of a {rng.length}-byte range")
        if not _the_range(got, rng):
            raise Transient(f"{what}: asked for bytes {rng.start}-{rng.end - 1}, answered "
                            f"{got.status} {got.headers.get('content-range', '(no range)')}")
        return view

    def close(self) -> None:
        self._threads.shutdown(wait=False, cancel_futures=True)
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()

    # -- one exchange -----------------------------------------------------------------------------

    async def _signed(self, method: str, path: str, query: str,
                      headers: list[tuple[str, str]]) -> list[tuple[str, str]]:
        creds, _ = await self._keys.current()  # renewed keys, when they were
        return sign(method, path, query, headers, creds, self._settings.region)

    async def _run(self, what: str, method: str, target: str, headers: list[tuple[str, str]],
                   body: Buffer | None, into: memoryview | None) -> _Answer:
        """The exchange on a thread of this client's; when cancelled, its socket is shut and
        the thread waited for (the caller's buffer is free again once this returns)."""
        if os.getpid() != self._pid:
            self._start()  # the parent's connections are never used here
        call = _Call()
        loop = asyncio.get_running_loop()
        future = loop.run_in_executor(self._threads, self._exchange, call, what, method,
                                      target, headers, body, into)
        try:
            return await asyncio.shield(future)
        except asyncio.CancelledError:
            call.abort()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(future, RELEASE_TIMEOUT_S)
            raise

    def _exchange(self, call: _Call, what: str, method: str, target: str,
                  headers: list[tuple[str, str]], body: Buffer | None,
                  into: memoryview | None) -> _Answer:
        try:
            reused = self._take(call)
            try:
                return self._send(call, method, target, headers, body, into)
            except _STALE:
                if not reused or call.cancelled or call.answered or method == "POST":
                    raise
                self._drop(call)
                self._take(call, fresh=True)
                return self._send(call, method, target, headers, body, into)
        except ssl.SSLCertVerificationError as exc:
            self._drop(call)
            raise not_trusted(what, exc.verify_message or str(exc)) from None
        except ssl.SSLError as exc:
            self._drop(call)
            raise Permanent(f"{what}: TLS refused: {exc.reason or exc}") from None
        except (ConnectionRefusedError, socket.gaierror) as exc:
            self._drop(call)
            raise Unreachable(f"{what}: connection failed: {exc}") from None
        except TimeoutError:
            self._drop(call)
            raise Transient(f"{what}: no answer in time") from None
        except (OSError, http.client.HTTPException) as exc:
            self._drop(call)
            raise Transient(f"{what}: {type(exc).__name__}: {exc}") from None

    def _send(self, call: _Call, method: str, target: str, headers: list[tuple[str, str]],
              body: Buffer | None, into: memoryview | None) -> _Answer:
        conn = call.conn
        assert conn is not None
        conn.putrequest(method, target, skip_host=True, skip_accept_encoding=True)
        for name, value in headers:
            conn.putheader(name, value)
        conn.endheaders()
        sock = conn.sock
        assert sock is not None
        if body is not None:
            view = memoryview(body).cast("B")
            sock.settimeout(ANSWER_TIMEOUT_S + view.nbytes / SLOWEST_SEND_BYTES_S)
            try:
                sock.sendall(view)
            except OSError:
                # A server may refuse before it has the body (403, expired keys) and close:
                # its answer, if it sent one, is the error to report.
                sock.settimeout(1.0)
                try:
                    early = conn.getresponse()
                except (OSError, http.client.HTTPException):
                    early = None
                if early is None:
                    raise
                call.answered = True
                data = early.read()
                self._drop(call)
                return _Answer(early.status, {k.lower(): v for k, v in early.getheaders()},
                               data, 0)
            sock.settimeout(ANSWER_TIMEOUT_S)
        resp = conn.getresponse()
        call.answered = True
        answered = {name.lower(): value for name, value in resp.getheaders()}
        read = 0
        if into is not None and resp.status < 300:
            read = _read_into(resp, into)
            extra = resp.read(1)  # a longer body than the range is a wrong answer
            if extra:
                read += len(extra)
                resp.close()
                self._drop(call)
                return _Answer(resp.status, answered, b"", read)
            data = b""
        else:
            data = resp.read()
        if resp.will_close:
            self._drop(call)
        else:
            self._give(call)
        return _Answer(resp.status, answered, data, read)

    # -- connections ------------------------------------------------------------------------------

    def _take(self, call: _Call, *, fresh: bool = False) -> bool:
        """A connection for ``call``: an idle one (True) or a new one."""
        while not fresh:
            with self._lock:
                conn = self._idle.pop() if self._idle else None
            if conn is None:
                break
            if _closed_while_idle(conn):
                conn.close()
                continue
            call.conn = conn
            return True
        call.conn = self._connect()
        if call.cancelled:
            call.abort()
        return False

    def _connect(self) -> http.client.HTTPConnection:
        host, port = self.address
        conn: http.client.HTTPConnection
        if self._tls is not None:
            conn = http.client.HTTPSConnection(host, port, timeout=CONNECT_TIMEOUT_S,
                                               context=self._tls)
        else:
            conn = http.client.HTTPConnection(host, port, timeout=CONNECT_TIMEOUT_S)
        conn.connect()
        assert conn.sock is not None
        conn.sock.settimeout(ANSWER_TIMEOUT_S)
        return conn

    def _give(self, call: _Call) -> None:
        conn, call.conn = call.conn, None
        if conn is not None:
            with self._lock:
                self._idle.append(conn)

    def _drop(self, call: _Call) -> None:
        conn, call.conn = call.conn, None
        if conn is not None:
            conn.close()


def _closed_while_idle(conn: http.client.HTTPConnection) -> bool:
    """Has the server closed (or written to) this kept connection since its last answer? An
    idle connection has nothing to read: if it is readable, the server's idle timeout sent a
    FIN, and a request sent on it would fail with no answer, which for a POST (create,
    complete) nobody may send again. As Go's client and urllib3 check before reuse."""
    sock = conn.sock
    if sock is None:
        return True
    poll = select.poll()  # not select(): no limit on the descriptor's number
    poll.register(sock, select.POLLIN)
    try:
        return bool(poll.poll(0))
    except OSError:
        return True


def _the_range(got: _Answer, rng: ByteRange) -> bool:
    """Is the answer the range asked for: a 206 naming it, or a 200 of a whole object that is
    exactly the range (a server that ignores Range answers 200 with the whole object)?"""
    if got.status == 200:
        return rng.start == 0 and got.headers.get("content-length") == str(rng.length)
    found = got.headers.get("content-range", "").removeprefix("bytes ").partition("/")[0]
    return found == f"{rng.start}-{rng.end - 1}"


def _read_into(resp: http.client.HTTPResponse, view: memoryview) -> int:
    """The body of ``resp`` into ``view`` until either ends: each read a ``recv_into`` of what
    is left, straight into the caller's memory."""
    got = 0
    while got < len(view):
        n = resp.readinto(view[got:])
        if not n:
            break
        got += n
    return got


def _tls_context(settings: ClientSettings) -> ssl.SSLContext:
    """Trust and identity as the store's other clients have them: the bundle's CAs (else the
    system's), and the client certificate of mutual TLS."""
    context = ssl.create_default_context(cadata=settings.ca_pem)
    if settings.client_cert is not None:
        context.load_cert_chain(settings.client_cert.cert, settings.client_cert.key)
    return context
