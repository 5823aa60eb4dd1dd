"""What an S3 request carries and what its answer names, with no client of its own: a part's
body handed out without a copy (``Body``), the checksum every body carries (``BodyChecksums``),
a copy's source (``S3CopySource``) and the ETag as mcsync records it (``unquote_etag``).

Every UploadPart (and the S3 API PUT) carries an ``x-amz-checksum-crc32c`` computed here, off
the event loop, so the target refuses a body damaged on the way (400 BadDigest) and nothing of
it is stored. An endpoint that refuses that header (some want the algorithm declared at
CreateMultipartUpload) gets ``Content-MD5`` instead, found out by its first refusal, logged
once and remembered per operation.

A leaf: it imports no other S3 module, so every client and transport can build on it.
"""

from __future__ import annotations

import base64
import hashlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from .. import checksums
from ..tasks import off_loop
from ..types import Buffer

log = logging.getLogger(__name__)
T = TypeVar("T")

CRC32C_HEADER = "x-amz-checksum-crc32c"
MD5_HEADER = "Content-MD5"
# The same headers as botocore's parameters.
_BOTOCORE_PARAM = {CRC32C_HEADER: "ChecksumCRC32C", MD5_HEADER: "ContentMD5"}


@dataclass(frozen=True, slots=True)
class S3CopySource:
    """An object as the source of a server-side copy, pinned to ``etag`` if given."""

    bucket: str
    key: str  # the full key, prefix included
    etag: str | None


def unquote_etag(value: str | None) -> str | None:
    """An ETag as S3 sends it (quoted) → as mcsync records it."""
    return value.strip('"') if value else None


@dataclass
class BodyChecksums:
    """Per operation (``upload_part``, ``put_object``), the body checksum an endpoint takes:
    "crc32c" once one was accepted, "md5" once it refused x-amz-checksum-crc32c (AWS may take
    it on PutObject but not on UploadPart). One per store: an endpoint's answer.

    ``refusal(exc)``: the error code when ``exc`` may be the endpoint refusing the CRC32C
    header itself, else None (the error table's call: ``s3_errors.checksum_header_refusal``)."""

    endpoint: str
    refusal: Callable[[BaseException], str | None]
    _taken: dict[str, str] = field(default_factory=dict)

    async def send(self, operation: str, data: Buffer,
                   call: Callable[[str, str], Awaitable[T]], *, crc32c: int | None = None) -> T:
        """``call(header, value)`` sends ``data`` with a checksum the target verifies: the
        header (``CRC32C_HEADER`` or ``MD5_HEADER``) and its value (``crc32c``: ``data``'s,
        summed by the caller already). Errors are the client's (botocore's or the CRT's):
        the caller translates them."""
        if self._taken.get(operation) != "md5":
            if crc32c is None:
                crc32c = await checksums.crc32c_async(data)
            crc = checksums.to_base64(crc32c)
            try:
                r = await call(CRC32C_HEADER, crc)
            except Exception as exc:
                code = self.refusal(exc)
                if self._taken.get(operation) == "crc32c" or code is None:
                    raise
                if operation not in self._taken:
                    self._taken[operation] = "md5"
                    log.warning("%s refuses x-amz-checksum-crc32c on %s (%s); sending "
                                "Content-MD5 instead", self.endpoint, operation, code)
            else:
                self._taken.setdefault(operation, "crc32c")
                return r
        md5 = await off_loop(lambda: hashlib.md5(data, usedforsecurity=False).digest())
        return await call(MD5_HEADER, base64.b64encode(md5).decode("ascii"))


def botocore_body(call: Callable[..., Awaitable[dict[str, Any]]], data: Buffer,
                  **kwargs: Any) -> Callable[[str, str], Awaitable[dict[str, Any]]]:
    """``BodyChecksums.send``'s ``call`` for a botocore operation that takes ``data``."""
    return lambda header, value: call(Body=Body(data), **{_BOTOCORE_PARAM[header]: value},
                                      **kwargs)


class Body:
    """A body for botocore and aiohttp that copies nothing: the buffer handed out in slices.

    Given ``bytes``, botocore wraps them in a BytesIO, whose buffer aiohttp then takes with
    ``getbuffer()`` — a copy of every part; other buffers (obstore's, memoryviews) botocore
    refuses unless copied to bytes.
    Slices reach the socket as they fit, so a part waits in the transport a slice at a time.
    ``len`` gives botocore the Content-Length; ``seek(0)`` is botocore's rewind before a retry
    (each iteration starts from the first slice anyway). Needs the client's parameter
    validation off (``s3_clients``): botocore knows no such type.

    ``read``/``readinto`` are for the CRT: its S3 client (``s3_crt``) reads a part's body with
    ``readinto`` from its threads (``seek(0)`` before its own retries), and so does botocore's
    other signer: with ``awscrt`` importable (``boto3[crt]`` installs it, and so does mcsync)
    botocore signs with the CRT's, which wraps the body in a stream (a body with no ``read``
    failed every UploadPart: "I/O stream type expected") and reads it where the payload is
    signed. The command keeps botocore's own signer (``cli.main``); a library call gets
    whichever its process has."""

    SLICE = 1 << 20

    def __init__(self, data: Buffer) -> None:
        self._view = memoryview(data).cast("B")
        self._pos = 0  # of read/readinto only: the async iteration always starts at 0

    def __len__(self) -> int:
        return self._view.nbytes

    def __aiter__(self) -> AsyncIterator[memoryview]:
        return self._slices()

    async def _slices(self) -> AsyncIterator[memoryview]:
        view = self._view
        for start in range(0, len(view), self.SLICE):
            yield view[start:start + self.SLICE]

    def readinto(self, buffer: Buffer) -> int:
        out = memoryview(buffer).cast("B")
        n = min(len(out), len(self._view) - self._pos)
        out[:n] = self._view[self._pos:self._pos + n]
        self._pos += n
        return n

    def read(self, size: int = -1) -> bytes:
        end = len(self._view) if size < 0 else min(len(self._view), self._pos + size)
        data = self._view[self._pos:end].tobytes()
        self._pos = end
        return data

    def seek(self, offset: int, whence: int = 0) -> int:
        if (offset, whence) != (0, 0):
            raise OSError(f"a part body rewinds to its start only, not to {offset}")
        self._pos = 0
        return 0

    def tell(self) -> int:
        return self._pos
