"""Multipart uploads to an S3-compatible target, and the checksum every body carries.

Their requests go through the AWS CRT's client where the store has one for them
(``S3Store.crt_client``: an explicit endpoint, keys, and no payload that must be signed), else
through botocore. Both send the same S3 API, so an upload opened by one is resumed by the
other.

Every UploadPart (and the S3 API PUT) carries an ``x-amz-checksum-crc32c`` computed here, off
the event loop, so the target refuses a body damaged on the way (400 BadDigest) and nothing of
it is stored. An endpoint that refuses that header (some want the algorithm declared at
CreateMultipartUpload) gets ``Content-MD5`` instead, found out by its first refusal, logged
once and remembered by the store for that operation.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from .. import checksums
from ..errors import NotFound, PreconditionFailed
from ..types import Buffer, ByteRange, ObjectInfo, PartClaim, PartRef
from .s3_errors import Answer, answer_of

if TYPE_CHECKING:
    from .s3 import S3CopySource, S3Store

log = logging.getLogger(__name__)
T = TypeVar("T")


CRC32C_HEADER = "x-amz-checksum-crc32c"
MD5_HEADER = "Content-MD5"
# The same headers as botocore's parameters.
_BOTOCORE_PARAM = {CRC32C_HEADER: "ChecksumCRC32C", MD5_HEADER: "ContentMD5"}


@dataclass
class BodyChecksums:
    """Per operation (``upload_part``, ``put_object``), the body checksum an endpoint takes:
    "crc32c" once one was accepted, "md5" once it refused x-amz-checksum-crc32c (AWS may take
    it on PutObject but not on UploadPart). One per store: an endpoint's answer."""

    endpoint: str
    _taken: dict[str, str] = field(default_factory=dict)

    async def send(self, operation: str, data: Buffer,
                   call: Callable[[str, str], Awaitable[T]]) -> T:
        """``call(header, value)`` sends ``data`` with a checksum the target verifies: the
        header (``CRC32C_HEADER`` or ``MD5_HEADER``) and its value. Errors are the client's
        (botocore's or the CRT's): the caller translates them."""
        if self._taken.get(operation) != "md5":
            crc = checksums.to_base64(await checksums.crc32c_async(data))
            try:
                r = await call(CRC32C_HEADER, crc)
            except Exception as exc:
                answer = answer_of(exc)
                if self._taken.get(operation) == "crc32c" or not _refuses_header(answer):
                    raise
                if operation not in self._taken:
                    self._taken[operation] = "md5"
                    log.warning("%s refuses x-amz-checksum-crc32c on %s (%s); sending "
                                "Content-MD5 instead", self.endpoint, operation,
                                answer.code if answer is not None else None)
            else:
                self._taken.setdefault(operation, "crc32c")
                return r
        md5 = await asyncio.to_thread(lambda: hashlib.md5(data, usedforsecurity=False).digest())
        return await call(MD5_HEADER, base64.b64encode(md5).decode("ascii"))


def botocore_body(call: Callable[..., Awaitable[dict[str, Any]]], data: Buffer,
                  **kwargs: Any) -> Callable[[str, str], Awaitable[dict[str, Any]]]:
    """``BodyChecksums.send``'s ``call`` for a botocore operation that takes ``data``."""
    return lambda header, value: call(Body=Body(data), **{_BOTOCORE_PARAM[header]: value},
                                      **kwargs)


class S3Upload:
    """One multipart upload; its id outlives the process (the journal keeps it), so a later
    run can resume it."""

    def __init__(self, store: S3Store, key: str, upload_id: str, size: int) -> None:
        self.store = store
        self.key = key
        self.upload_id = upload_id
        self.size = size
        # Set once this handle completed or aborted the upload. S3 answers a repeated
        # CompleteMultipartUpload with success (it is idempotent, for retries), so only the
        # handle can tell that the protocol's second completion must raise NotFound.
        self._finished: str | None = None

    @classmethod
    async def create(cls, store: S3Store, key: str, size: int) -> S3Upload:
        """CreateMultipartUpload of ``key``, by whichever client the store has for it."""
        crt = await store.crt_client()
        with store.translating(key):
            if crt is not None:
                upload_id = await crt.create_upload(store.bucket, store.full_key(key),
                                                    f"{store.url}{key}")
            else:
                r = await (await store.botocore()).create_multipart_upload(
                    Bucket=store.bucket, Key=store.full_key(key))
                upload_id = r["UploadId"]
        return cls(store, key, upload_id, size)

    def _ids(self) -> dict[str, Any]:
        s = self.store
        return {"Bucket": s.bucket, "Key": s.full_key(self.key), "UploadId": self.upload_id}

    def _what(self) -> str:
        return f"{self.store.url}{self.key}"

    async def put_part(self, number: int, offset: int, data: Buffer) -> PartRef:
        s = self.store
        crt = await s.crt_client(body=True)
        if crt is not None:
            def send(header: str, value: str) -> Awaitable[str]:
                return crt.upload_part(s.bucket, s.full_key(self.key), self.upload_id, number,
                                       data, (header, value), self._what())

            with s.translating(self.key):
                etag = await s.body_checksums.send("upload_part", data, send)
        else:
            client = await s.botocore()
            with s.translating(self.key):
                r = await s.body_checksums.send("upload_part", data, botocore_body(
                    client.upload_part, data, PartNumber=number, **self._ids()))
            etag = r["ETag"]
        return PartRef(number, unquote_etag(etag) or "", len(data))

    async def list_parts(self) -> list[PartRef]:
        s = self.store
        crt = await s.crt_client()
        if crt is not None:
            with s.translating(self.key):
                found = await crt.list_parts(s.bucket, s.full_key(self.key), self.upload_id,
                                             self._what())
            return [PartRef(n, unquote_etag(etag) or "", size) for n, etag, size in found]
        client = await s.botocore()
        parts: list[PartRef] = []
        with s.translating(self.key):
            async for page in client.get_paginator("list_parts").paginate(**self._ids()):
                parts.extend(PartRef(p["PartNumber"], unquote_etag(p["ETag"]) or "", p["Size"])
                             for p in page.get("Parts", ()))
        return parts

    async def confirm_parts(self, claims: Sequence[PartClaim]) -> set[int]:
        held = {(p.number, p.etag, p.size) for p in await self.list_parts()}
        return {c.ref.number for c in claims if (c.ref.number, c.ref.etag, c.ref.size) in held}

    async def copy_part(self, number: int, offset: int, source: S3CopySource,
                        rng: ByteRange) -> PartRef:
        s = self.store
        crt = await s.crt_client()
        try:
            with s.translating(self.key):
                if crt is not None:
                    etag = await crt.copy_part(s.bucket, s.full_key(self.key), self.upload_id,
                                               number, source.bucket, source.key, source.etag,
                                               rng.start, rng.end - 1, self._what())
                else:
                    etag = await self._copy_part_by_botocore(number, source, rng)
        except NotFound as exc:
            # NoSuchKey names the copy source (NoSuchUpload the upload): like a source that
            # changed, one that is gone is a failed precondition of the copy, for the caller
            # to plan without it, not an error of the object being written.
            answer = answer_of(exc.__cause__) if exc.__cause__ is not None else None
            if answer is None or answer.code != "NoSuchKey":
                raise
            raise PreconditionFailed(f"{s.url}{self.key}: its copy source {source.bucket}/"
                                     f"{source.key} no longer exists") from exc
        return PartRef(number, unquote_etag(etag) or "", rng.length)

    async def _copy_part_by_botocore(self, number: int, source: S3CopySource,
                                     rng: ByteRange) -> str | None:
        kwargs: dict[str, Any] = {
            **self._ids(), "PartNumber": number,
            "CopySource": {"Bucket": source.bucket, "Key": source.key},
            "CopySourceRange": f"bytes={rng.start}-{rng.end - 1}",
        }
        if source.etag:
            kwargs["CopySourceIfMatch"] = f'"{source.etag}"'
        r = await (await self.store.botocore()).upload_part_copy(**kwargs)
        etag: str | None = r["CopyPartResult"]["ETag"]
        return etag

    async def complete(self, parts: Sequence[PartRef]) -> ObjectInfo:
        s = self.store
        if self._finished is not None:
            raise NotFound(f"{s.url}{self.key}: upload {self.upload_id} already {self._finished}")
        ordered = sorted(parts, key=lambda p: p.number)
        crt = await s.crt_client()
        if crt is not None:
            with s.translating(self.key):
                etag = await crt.complete_upload(s.bucket, s.full_key(self.key), self.upload_id,
                                                 [(p.number, p.etag) for p in ordered],
                                                 self._what())
        else:
            client = await s.botocore()
            with s.translating(self.key):
                r = await client.complete_multipart_upload(
                    **self._ids(),
                    MultipartUpload={"Parts": [{"PartNumber": p.number, "ETag": f'"{p.etag}"'}
                                               for p in ordered]},
                )
            etag = r.get("ETag")
        self._finished = "completed"
        return ObjectInfo(self.key, self.size, unquote_etag(etag), None)

    async def abort(self) -> None:
        s = self.store
        crt = await s.crt_client()
        with contextlib.suppress(NotFound), s.translating(self.key):
            if crt is not None:
                await crt.abort_upload(s.bucket, s.full_key(self.key), self.upload_id,
                                       self._what())
            else:
                await (await s.botocore()).abort_multipart_upload(**self._ids())
        self._finished = self._finished or "aborted"


def _refuses_header(answer: Answer | None) -> bool:
    """Could this be an endpoint refusing x-amz-checksum-crc32c itself? (AWS answers
    InvalidRequest "Checksum Type mismatch" when an upload was created without the algorithm;
    others may not implement the header.) A wrong checksum is BadDigest, never this."""
    return answer is not None and answer.code in {"InvalidRequest", "InvalidArgument",
                                                  "NotImplemented"}


class Body:
    """A body for botocore and aiohttp that copies nothing: the buffer handed out in slices.

    Given ``bytes``, botocore wraps them in a BytesIO, whose buffer aiohttp then takes with
    ``getbuffer()`` — a copy of every part (tracemalloc: 96 MiB of copies with 12 parts in
    flight); other buffers (obstore's, memoryviews) botocore refuses unless copied to bytes.
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


def unquote_etag(value: str | None) -> str | None:
    """An ETag as S3 sends it (quoted) → as mcsync records it."""
    return value.strip('"') if value else None
