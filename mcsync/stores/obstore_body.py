"""A GET answered by obstore, its body read whole (``get``), handed out in pieces
(``RangeStreamer.open_range``) or gathered into the caller's buffer (``ReadsInto``), for the
stores built on obstore (S3, Azure)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any

from ..errors import Transient
from ..types import Buffer

# A streamed range comes in pieces of at least this size: obstore joins the socket's reads up
# to it. Small pieces are written while still in the CPU's cache, with no more CPU in Python
# (figures: benchmarks/README.md).
PIECE = 64 * 1024


async def whole(resp: Any, length: int | None, what: str,
                translating: Callable[[], AbstractContextManager[None]]) -> Buffer:
    """The body of ``resp`` as one zero-copy buffer (obstore's ``Bytes``): ``length`` bytes,
    or the object's size when None; Transient if it came back short."""
    with translating():
        data: Buffer = await resp.bytes_async()
    expected = length if length is not None else resp.meta["size"]
    if len(data) != expected:
        raise Transient(f"{what}: short read ({len(data)} of {expected} bytes)")
    return data


def pieces(resp: Any, length: int, what: str,
           translating: Callable[[], AbstractContextManager[None]]) -> Iterator[Buffer]:
    """The body of ``resp`` (obstore's GetResult, body unread), ``length`` bytes of ``what``,
    as a blocking iterator; its errors pass through ``translating()``. Raises Transient if
    the body is shorter or longer than asked."""
    got = 0
    with translating():
        for piece in resp.stream(min_chunk_size=PIECE):
            got += len(piece)
            if got > length:
                break
            yield piece
    if got != length:
        raise Transient(f"{what}: read {got} bytes of a {length}-byte range")


def fill(body: Iterator[Buffer], buf: bytearray) -> memoryview:
    """The pieces of ``body`` (``pieces``) copied one after another into the start of
    ``buf``; the view of them. Blocking."""
    view = memoryview(buf)
    at = 0
    for piece in body:
        view[at:at + len(piece)] = piece
        at += len(piece)
    return view[:at]
