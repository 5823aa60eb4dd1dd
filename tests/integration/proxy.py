"""A TCP proxy on 127.0.0.1 in front of a real S3 server that damages request bodies in flight.

It stands for a bad NIC, a buggy middlebox or a memory error between mcsync and the store: the
client computed its checksums over the right bytes, the server receives other bytes. Requests
are forwarded unchanged (signatures stay valid: SigV4 signs the Host header the client used,
which the proxy passes on); only the body of a PUT whose path contains ``marker`` gets one
byte flipped, after the client has sent it.

With ``refuse_header`` it also stands for an S3 implementation that does not take that header:
such a request is answered 400 InvalidRequest (AWS's answer to a part checksum on an upload
created without the algorithm) and not forwarded.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from urllib.parse import urlsplit

_REFUSAL = (b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>InvalidRequest</Code><Message>'
            b"Checksum Type mismatch occurred, expected checksum Type: null, actual checksum "
            b"Type: crc32c</Message></Error>")


@dataclass
class CorruptingProxy:
    upstream: str  # http://host:port
    marker: str | None = None  # a PUT whose path contains this gets one body byte flipped
    refuse_header: str | None = None  # requests carrying this header are refused
    damaged: list[str] = field(default_factory=list)  # request lines of the damaged requests
    refused: list[str] = field(default_factory=list)
    url: str = ""
    _writers: set[asyncio.StreamWriter] = field(default_factory=set)

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            while data := await reader.read(1 << 16):
                writer.write(data)
                await writer.drain()
        writer.close()

    async def _requests(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                        client: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                line, *header_lines = head.decode("latin-1").split("\r\n")
                headers = {k.strip().lower(): v.strip() for k, _, v in
                           (h.partition(":") for h in header_lines if h)}
                if "chunked" in headers.get("transfer-encoding", ""):
                    raise AssertionError(f"chunked bodies are not handled: {line}")
                length = int(headers.get("content-length", 0))
                if self.refuse_header and self.refuse_header in headers:
                    # one request at a time per connection: no response of the server is due
                    if headers.get("expect", "").lower() == "100-continue":
                        client.write(b"HTTP/1.1 100 Continue\r\n\r\n")
                    await reader.readexactly(length)
                    self.refused.append(line)
                    client.write(b"HTTP/1.1 400 Bad Request\r\nContent-Type: application/xml\r\n"
                                 b"Content-Length: %d\r\n\r\n%s" % (len(_REFUSAL), _REFUSAL))
                    await client.drain()
                    continue
                writer.write(head)
                body = bytearray(await reader.readexactly(length))
                if body and line.startswith("PUT ") and self.marker and self.marker in line:
                    body[len(body) // 2] ^= 0x01
                    self.damaged.append(line)
                writer.write(body)
                await writer.drain()
        writer.close()

    async def _connection(self, client_r: asyncio.StreamReader,
                          client_w: asyncio.StreamWriter) -> None:
        up = urlsplit(self.upstream)
        self._writers.add(client_w)
        server_r, server_w = await asyncio.open_connection(up.hostname, up.port)
        self._writers.add(server_w)
        with contextlib.suppress(asyncio.CancelledError):  # the proxy is being stopped
            await asyncio.gather(self._requests(client_r, server_w, client_w),
                                 self._pipe(server_r, client_w))

    @contextlib.contextmanager
    def running(self) -> Iterator[CorruptingProxy]:
        loop = asyncio.new_event_loop()
        started = threading.Event()
        server: list[asyncio.Server] = []

        async def start() -> None:
            srv = await asyncio.start_server(self._connection, "127.0.0.1", 0)
            server.append(srv)
            self.url = f"http://127.0.0.1:{srv.sockets[0].getsockname()[1]}"
            started.set()

        thread = threading.Thread(target=loop.run_forever, daemon=True)
        thread.start()
        asyncio.run_coroutine_threadsafe(start(), loop).result(10)
        started.wait(10)
        try:
            yield self
        finally:
            async def stop() -> None:
                server[0].close()
                for writer in self._writers:
                    writer.close()
                tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
                _, pending = await asyncio.wait(tasks, timeout=5) if tasks else (set(), set())
                for task in pending:
                    task.cancel()
                await asyncio.gather(*pending, return_exceptions=True)
                await server[0].wait_closed()

            asyncio.run_coroutine_threadsafe(stop(), loop).result(10)
            loop.call_soon_threadsafe(loop.stop)
            thread.join(10)
            loop.close()
