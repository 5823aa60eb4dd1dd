"""mcsync's own HTTP/1.1 connections to one address: a request's body sent straight from the
caller's buffer and a GET's body read straight into one, for the relay (``s3_wire`` for S3
and Meta Storage, ``azure_wire`` for Azure Blob's GETs).

Between two stores every byte passes through the client, and what it costs there is copies.
obstore hands a GET's body out in pieces of its own (fresh memory: page faults, then a copy
into the part's buffer) and the CRT copies every body it sends into a buffer of its own. Here
the socket reads into the part's buffer (``recv_into``) and writes from it (``sendall``), each
in a C loop with the GIL released, as ``io.Copy`` does in rclone: the kernel's copy is the
only one (figures: benchmarks/results/2026-12-07-relay-wire.md).

Blocking connections on threads of their own (one per connection in use), kept alive between
requests. What a request means, how it is signed and what its errors say are the caller's;
a failed connection is mcsync's error here. No retries: those are the store's one retry
layer's (a reused connection the server had closed is the exception: a request that failed
there before any answer is sent once more on a new connection, as Go's client does, but for a
POST, which the server may have acted on).
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
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

from .._version import __version__
from ..errors import Permanent, Transient, Unreachable
from ..tasks import Threads
from ..types import Buffer, ByteRange

CONNECT_TIMEOUT_S = 10.0
# botocore's read_timeout: a CopyObject answers when the copy is done, so this bounds a copy
# as it does botocore's (which fails a read that waits longer, and tries again). A request with
# a body is given longer by its size: a client that reports no progress of a body it sends
# bounds a part on a slow link by the slowest rate worth waiting for instead.
ANSWER_TIMEOUT_S = 120.0
SLOWEST_SEND_BYTES_S = 256 * 1024
USER_AGENT = ("User-Agent", f"mcsync/{__version__} wire")
# How long a cancelled request may take to let go of the caller's buffer (its socket is shut
# down at once; this bounds the thread's way out).
RELEASE_TIMEOUT_S = 10.0
# A kept connection that fails on its next request before any answer (the server closed it as
# the request went, past the idle check): sent again at once, unless it is a POST (create,
# complete), which the server may have acted on.
_STALE = (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError)


@dataclass(frozen=True, slots=True)
class Reply:
    """What came back: the status, the headers (names in lower case), the body unless it was
    read into the caller's buffer, and how much was."""

    status: int
    headers: dict[str, str]
    body: bytes
    read: int  # bytes read into the caller's buffer (a GET into one)


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


class HttpWire:
    """Kept-alive connections to ``address`` (TLS when ``tls`` is given), at most
    ``max_connections`` at once, each request on a thread of this wire's own. ``ca_hint``:
    where a private CA goes, for the error of a certificate that does not verify."""

    def __init__(self, address: tuple[str, int | None], tls: ssl.SSLContext | None,
                 max_connections: int, *, ca_hint: str) -> None:
        self.address = address
        self._tls = tls
        self._ca_hint = ca_hint
        self._max_connections = max(1, max_connections)
        self._start()

    def _start(self) -> None:
        """Threads and connections of this process's own: a forked child (a data loader's
        worker) starts again, since the parent's threads are not in it and its connections
        are the parent's."""
        self._pid = os.getpid()
        self._closed = False
        self._idle: list[http.client.HTTPConnection] = []
        self._lock = threading.Lock()
        self._threads = Threads(self._max_connections, "mcsync-wire")

    async def exchange(self, what: str, method: str, target: str,
                       headers: Sequence[tuple[str, str]], body: Buffer | None,
                       into: memoryview | None) -> Reply:
        """``method`` on ``target`` with ``headers`` (complete: Host and signature included),
        ``body`` sent from the caller's buffer, and a successful answer's body read into
        ``into`` when given. When cancelled, the socket is shut and the thread waited for:
        the caller's buffers are free again once this returns."""
        if os.getpid() != self._pid:
            self._start()  # the parent's connections are never used here
        call = _Call()
        future = self._threads.run(self._exchange, call, what, method, target, headers, body,
                                   into)
        try:
            return await asyncio.shield(future)
        except asyncio.CancelledError:
            call.abort()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(future, RELEASE_TIMEOUT_S)
            raise

    def close(self) -> None:
        self._closed = True
        self._threads.close()
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()

    # -- one exchange -----------------------------------------------------------------------------

    def _exchange(self, call: _Call, what: str, method: str, target: str,
                  headers: Sequence[tuple[str, str]], body: Buffer | None,
                  into: memoryview | None) -> Reply:
        if call.cancelled or self._closed:  # let go of while it waited for a thread: unsent
            why = "the wire was closed" if self._closed else "it was cancelled"
            raise Transient(f"{what}: not sent: {why} while it waited for a connection")
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
            reason = exc.verify_message or str(exc)
            raise Permanent(f"{what}: the endpoint's TLS certificate is not trusted ({reason}): "
                            f"a private CA goes in {self._ca_hint}") from None
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

    def _send(self, call: _Call, method: str, target: str, headers: Sequence[tuple[str, str]],
              body: Buffer | None, into: memoryview | None) -> Reply:
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
                return Reply(early.status, {k.lower(): v for k, v in early.getheaders()},
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
                return Reply(resp.status, answered, b"", read)
            data = b""
        else:
            data = resp.read()
        if resp.will_close:
            self._drop(call)
        else:
            self._give(call)
        return Reply(resp.status, answered, data, read)

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
        if conn is None:
            return
        with self._lock:
            if not self._closed:
                self._idle.append(conn)
                return
        conn.close()  # answered after close: nothing will take it up

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


def the_range(got: Reply, rng: ByteRange) -> bool:
    """Is the answer the range asked for: a 206 naming it, or a 200 of a whole object that is
    exactly the range (a server that ignores Range answers 200 with the whole object)?"""
    if got.status == 200:
        return rng.start == 0 and got.headers.get("content-length") == str(rng.length)
    found = got.headers.get("content-range", "").removeprefix("bytes ").partition("/")[0]
    return found == f"{rng.start}-{rng.end - 1}"


def check_range(got: Reply, rng: ByteRange, what: str) -> None:
    """Transient unless ``got`` read exactly the range asked for, and said so."""
    if got.read != rng.length:
        raise Transient(f"{what}: read {got.read} bytes of a {rng.length}-byte range")
    if not the_range(got, rng):
        raise Transient(f"{what}: asked for bytes {rng.start}-{rng.end - 1}, answered "
                        f"{got.status} {got.headers.get('content-range', '(no range)')}")


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


def behind_proxy(url: str) -> bool:
    """Would the environment's proxy (``HTTPS_PROXY``, ``ALL_PROXY``, less ``NO_PROXY``) carry
    requests to ``url``? The wire connects directly: a store reached through a proxy keeps
    its SDK's client, which goes through it."""
    parts = urlsplit(url)
    proxies = urllib.request.getproxies_environment()
    if parts.scheme not in proxies and "all" not in proxies:
        return False
    return not urllib.request.proxy_bypass(parts.hostname or "")


def tls_context(ca_pem: str | None, client_cert: tuple[str, str] | None = None) -> ssl.SSLContext:
    """Trust and identity as the store's other clients have them: the bundle's CAs (else the
    system's), and the client certificate of mutual TLS (certificate and key files)."""
    context = ssl.create_default_context(cadata=ca_pem)
    if client_cert is not None:
        context.load_cert_chain(*client_cert)
    return context
