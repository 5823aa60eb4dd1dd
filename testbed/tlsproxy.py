"""A TLS-terminating TCP proxy on 127.0.0.1 that requires a client certificate (mutual TLS), in
front of a plain-HTTP server: how a store that authenticates its clients by certificate is
tested (SeaweedFS's S3 port behind it).

Bytes go on unchanged both ways once the handshake is done — the request line and the
``Host`` header the client signed included, so a SigV4 signature made for the proxy's address
still verifies upstream. The handshake requires a certificate that chains to ``client_ca``
(``ssl.CERT_REQUIRED``): a client without one, or with one of another CA, is refused there.
Every connection is recorded (``Handshake``: the certificate's subject, or why the handshake
failed).

    with TlsProxy(seaweed, server=ca.server(), client_ca=ca.ca).running() as proxy:
        proxy.endpoint  # https at the proxy, the server's keys, ca_bundle=ca.ca

Run in the foreground (for measurements by hand)::

    python -m testbed.tlsproxy --upstream http://127.0.0.1:8333 --dir /tmp/pki [--port N]

makes a throwaway CA, server and client certificates in ``--dir``, prints the proxy's URL and
the files, and runs until SIGINT / SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import signal
import ssl
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from .servers import LOOPBACK, S3Endpoint
from .tls import Authority, KeyPair

__all__ = ["Handshake", "TlsProxy"]

_CHUNK = 1 << 18
HANDSHAKE_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class Handshake:
    """One client connection: the subject of the certificate it presented (its CN), or the
    reason the handshake failed."""

    subject: str | None
    error: str | None = None


class TlsProxy:
    """The proxy. ``upstream``: the plain-HTTP server (an ``S3Endpoint`` whose keys
    ``endpoint`` carries, or its URL); ``server``: the proxy's own certificate and key;
    ``client_ca``: the PEM file of the CA client certificates must chain to."""

    def __init__(self, upstream: S3Endpoint | str, *, server: KeyPair, ca: Path,
                 client_ca: Path | None = None, port: int = 0) -> None:
        self.upstream = (upstream if isinstance(upstream, S3Endpoint)
                         else S3Endpoint(upstream, "", ""))
        self.server = server
        self.ca = ca  # the CA of the proxy's own certificate: what a client trusts
        self.client_ca = client_ca or ca
        self.port = port
        self.url = ""
        self.handshakes: list[Handshake] = []
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.Server | None = None
        self._thread: threading.Thread | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._tls = self._context()

    @property
    def endpoint(self) -> S3Endpoint:
        """The upstream's keys and region at the proxy's https address, trusting ``ca``."""
        up = self.upstream
        return dataclasses.replace(up, url=self.url, ca_bundle=str(self.ca))

    def refused(self) -> list[Handshake]:
        with self._lock:
            return [h for h in self.handshakes if h.error is not None]

    def accepted(self) -> list[Handshake]:
        with self._lock:
            return [h for h in self.handshakes if h.error is None]

    def _context(self) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(self.server.cert, self.server.key)
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_verify_locations(cafile=self.client_ca)
        return context

    # -- one connection -------------------------------------------------------------------------

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        tls = _Tls(self._tls, reader, writer)
        try:
            try:
                await asyncio.wait_for(tls.handshake(), HANDSHAKE_TIMEOUT_S)
            except (ssl.SSLError, ConnectionError, TimeoutError, EOFError) as exc:
                self._record(Handshake(None, getattr(exc, "reason", None) or type(exc).__name__))
                return
            peer = tls.peercert()
            self._record(Handshake(next((value for rdn in peer.get("subject", ())
                                         for key, value in rdn if key == "commonName"), "?")))
            where = urlsplit(self.upstream.url)
            try:
                up_reader, up_writer = await asyncio.open_connection(where.hostname, where.port)
            except OSError:
                return
            self._writers.add(up_writer)
            try:
                async with asyncio.TaskGroup() as tasks:
                    tasks.create_task(tls.decrypt_to(up_writer))
                    tasks.create_task(tls.encrypt_from(up_reader))
            except* (ConnectionError, ssl.SSLError, OSError, EOFError):
                pass
            finally:
                up_writer.close()
                self._writers.discard(up_writer)
        finally:
            writer.close()
            self._writers.discard(writer)

    def _record(self, handshake: Handshake) -> None:
        with self._lock:
            self.handshakes.append(handshake)

    # -- running --------------------------------------------------------------------------------

    def start(self) -> TlsProxy:
        """Listen on 127.0.0.1 (``port``, or a free one), served by a thread of its own."""
        loop = self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=loop.run_forever, name="tlsproxy", daemon=True)
        self._thread.start()

        async def listen() -> asyncio.Server:
            # The handshake is _serve's (start_tls), so that a refused one is recorded.
            return await asyncio.start_server(self._serve, LOOPBACK, self.port)

        self._server = asyncio.run_coroutine_threadsafe(listen(), loop).result(10)
        self.url = f"https://{LOOPBACK}:{self._server.sockets[0].getsockname()[1]}"
        return self

    def stop(self) -> None:
        loop, server = self._loop, self._server
        if loop is None or server is None:
            return

        async def close() -> None:
            server.close()
            for writer in list(self._writers):
                writer.transport.abort()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(close(), loop).result(15)
        loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(10)
        loop.close()
        self._loop = self._server = self._thread = None

    @contextlib.contextmanager
    def running(self) -> Iterator[TlsProxy]:
        self.start()
        try:
            yield self
        finally:
            self.stop()


class _Tls:
    """The server's side of one TLS connection over a plain stream, through memory BIOs: as
    a TLS server does (and asyncio's own ``start_tls`` does not), a refused handshake sends
    its alert (certificate required, unknown CA) before the connection closes."""

    def __init__(self, context: ssl.SSLContext, reader: asyncio.StreamReader,
                 writer: asyncio.StreamWriter) -> None:
        self._in, self._out = ssl.MemoryBIO(), ssl.MemoryBIO()
        self._obj = context.wrap_bio(self._in, self._out, server_side=True)
        self._reader, self._writer = reader, writer

    def peercert(self) -> dict[str, Any]:
        return self._obj.getpeercert() or {}

    async def _flush(self) -> None:
        if data := self._out.read():
            self._writer.write(data)
            await self._writer.drain()

    async def _feed(self) -> None:
        data = await self._reader.read(_CHUNK)
        if not data:
            raise EOFError
        self._in.write(data)

    async def handshake(self) -> None:
        while True:
            try:
                self._obj.do_handshake()
                break
            except ssl.SSLWantReadError:
                await self._flush()
                await self._feed()
            except ssl.SSLError:
                with contextlib.suppress(OSError):
                    await self._flush()  # the alert
                raise
        await self._flush()

    async def decrypt_to(self, writer: asyncio.StreamWriter) -> None:
        """The client's bytes, decrypted, to ``writer`` until the client's end."""
        while True:
            try:
                data = self._obj.read(_CHUNK)
            except ssl.SSLWantReadError:
                await self._flush()
                await self._feed()
                continue
            except ssl.SSLZeroReturnError:
                data = b""
            if not data:
                if writer.can_write_eof():
                    with contextlib.suppress(OSError):
                        writer.write_eof()
                return
            writer.write(data)
            await writer.drain()

    async def encrypt_from(self, reader: asyncio.StreamReader) -> None:
        """``reader``'s bytes, encrypted, to the client until ``reader``'s end."""
        while data := await reader.read(_CHUNK):
            self._obj.write(data)
            await self._flush()
        with contextlib.suppress(ssl.SSLError):
            self._obj.unwrap()
        with contextlib.suppress(OSError):
            await self._flush()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m testbed.tlsproxy", description=__doc__)
    parser.add_argument("--upstream", required=True, help="the plain-HTTP server's URL")
    parser.add_argument("--dir", required=True, type=Path, help="where the PEM files go")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args(argv)
    ca = Authority(args.dir)
    client = ca.client()
    proxy = TlsProxy(args.upstream, server=ca.server(), ca=ca.ca, port=args.port).start()
    print(f"url={proxy.url}\nca={ca.ca}\nclient_cert={client.cert}\nclient_key={client.key}",
          flush=True)

    def on_signal(signum: int, frame: object) -> None:
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, on_signal)
    try:
        while True:
            time.sleep(3600)
    except (KeyboardInterrupt, SystemExit):
        return 0
    finally:
        proxy.stop()


if __name__ == "__main__":
    sys.exit(main())
