"""CRC32C (Castagnoli) of the bytes mcsync moves: one-shot, combined from parts, and in the
base64 form Google Cloud Storage keeps for every object (``crc32c`` of the object resource,
``x-goog-hash: crc32c=...``: the 4-byte big-endian CRC, base64-encoded).

Pure: no I/O, no state. The CRC itself is computed by the AWS CRT (``awscrt.checksums``,
aws-checksums' SSE4.2 / ARMv8 code, with the GIL released), which takes any buffer
(``obstore.Bytes``, ``bytearray``, ``memoryview``) without a copy. The runs that sum CRCs are
the ones that upload, and those load the CRT to send their parts anyway; the ``crc32c``
package it replaced was slower and cost a run more to import (it reads its own package
metadata through ``importlib.metadata``), and ``google-crc32c`` takes only ``bytes``: every
other buffer would cost a full copy first (figures: benchmarks/results/figures-from-code.md).

Why ``combine``: a large object moves as parts read in parallel, out of order. Each part's CRC
is computed as it arrives; ``combine`` joins ``crc(A)`` and ``crc(B)`` into ``crc(A + B)`` from
``len(B)`` alone (zlib's ``crc32_combine``, for the CRC32C polynomial), so the whole object's
CRC is known without a second pass over its bytes and compared with the one GCS keeps.

Where it is checked: a whole-object read by the GCS store itself; parts in ``transfer`` (each
part's CRC combined before Complete, so a mismatch is never committed); a block delta's full
read of the source in ``scan``.

Record ``checksums.to_base64(crc)`` beside the xxh3 digest (report / manifest): it is the value
GCS shows for the object, so a GCS object and its copy can be compared without re-reading
either. Parts of equal size share one cached operator, so joining even thousands of parts
costs a run far less than a second pass over the bytes (figures:
benchmarks/results/figures-from-code.md).
"""

from __future__ import annotations

import base64
import binascii
import functools
from collections.abc import Callable, Iterable

from .errors import IntegrityError
from .tasks import off_loop

Buffer = bytes | bytearray | memoryview

_POLY = 0x82F63B78  # CRC32C (Castagnoli), bit-reflected
_OFF_LOOP = 1 << 20  # buffers of 1 MiB and more are hashed in a worker thread (GIL released)


@functools.cache
def _implementation() -> Callable[[Buffer, int], int]:
    # Imported on first use: a run that sums no CRC (a download, a no-op re-sync) should not
    # pay the CRT's import at start-up (figures: benchmarks/results/figures-from-code.md).
    from awscrt.checksums import crc32c as implementation

    crc: Callable[[Buffer, int], int] = implementation
    return crc


def crc32c(data: Buffer, value: int = 0) -> int:
    """The CRC32C of ``data`` (any buffer: bytes, bytearray, memoryview, obstore.Bytes), or of
    the bytes before it followed by ``data`` when ``value`` is the CRC of those."""
    return _implementation()(data, value)


async def crc32c_async(data: Buffer) -> int:
    """``crc32c(data)``, off the event loop for large buffers."""
    if len(data) >= _OFF_LOOP:
        return await off_loop(_implementation(), data, 0)
    return _implementation()(data, 0)


# -- combine ------------------------------------------------------------------------------------
# Polynomials over GF(2) modulo the CRC polynomial, bit-reflected as the CRC is: bit 31 is x^0.


def _multmodp(a: int, b: int) -> int:
    """a(x) * b(x) modulo p(x)."""
    m = 1 << 31
    p = 0
    while True:
        if a & m:
            p ^= b
            if (a & (m - 1)) == 0:
                return p
        m >>= 1
        b = (b >> 1) ^ _POLY if b & 1 else b >> 1


def _x2n_table() -> tuple[int, ...]:
    """x^(2^k) modulo p(x) for k = 0..31."""
    table = []
    p = 1 << 30  # x^1
    for _ in range(32):
        table.append(p)
        p = _multmodp(p, p)
    return tuple(table)


_X2N = _x2n_table()


@functools.lru_cache(maxsize=256)
def _shift_operator(length: int) -> int:
    """x^(8 * length) modulo p(x): appending ``length`` zero bytes, as one multiplication."""
    p = 1 << 31  # x^0
    n, k = length, 3
    while n:
        if n & 1:
            p = _multmodp(_X2N[k & 31], p)
        n >>= 1
        k += 1
    return p


def combine(crc_a: int, crc_b: int, len_b: int) -> int:
    """CRC32C of ``A + B`` from ``crc32c(A)``, ``crc32c(B)`` and ``len(B)``."""
    if len_b < 0:
        raise ValueError(f"negative length {len_b}")
    return _multmodp(_shift_operator(len_b), crc_a) ^ crc_b


def combine_parts(parts: Iterable[tuple[int, int]]) -> int:
    """CRC32C of the concatenation of parts given in order as ``(crc, length)``."""
    total = 0
    for crc, length in parts:
        total = combine(total, crc, length)
    return total


# -- GCS's representation ---------------------------------------------------------------------


def to_base64(crc: int) -> str:
    """The form GCS shows: base64 of the 4-byte big-endian CRC (``AAAAAA==`` for no bytes)."""
    return base64.b64encode((crc & 0xFFFFFFFF).to_bytes(4, "big")).decode("ascii")


def from_base64(value: str) -> int:
    """The CRC that GCS's base64 ``crc32c`` stands for; ValueError if it is not one."""
    try:
        raw = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError(f"{value!r} is not base64") from None
    if len(raw) != 4:
        raise ValueError(f"{value!r} is {len(raw)} bytes, a CRC32C is 4")
    return int.from_bytes(raw, "big")


def verify(expected: str | None, actual: int, what: str) -> None:
    """Raise IntegrityError when ``actual`` differs from the base64 ``expected`` (a store's
    ``ObjectInfo.crc32c``). ``None`` (the store keeps no CRC32C) checks nothing."""
    if expected is None:
        return
    try:
        want = from_base64(expected)
    except ValueError as exc:
        raise IntegrityError(f"{what}: the source's crc32c is malformed: {exc}") from None
    if want != actual:
        raise IntegrityError(f"{what}: CRC32C mismatch: the source says {expected}, the bytes "
                             f"read have {to_base64(actual)}")
