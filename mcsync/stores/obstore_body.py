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
# to it. Small pieces are written while still in the CPU's cache: 64 x 32 MiB downloaded at
# once took 4.0 s in 1 MiB pieces, 3.1 s in 256 KiB, 2.8 s in 64 KiB (2 GiB checkpoint: 2.46,
# 2.59, 2.52 s; medians of 5), with no more CPU in Python.
PIECE = 64 * 1024


async def whole(resp: Any, length: int | None, what: str,
                translating: Callable[[], AbstractContextManager[None]]) -> Buffer:
    """The body of ``resp`` as one zero-copy buffer (obstore's ``Bytes``): ``length`` bytes,
    or the object's size when None; Transient if it came back short."""
    with translating():
        data = await resp.bytes_async()
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
