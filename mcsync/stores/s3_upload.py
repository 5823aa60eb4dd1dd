"""Multipart uploads to an S3-compatible target: one upload's ids and the protocol's rules
around them. Its requests go by a ``MultipartTransport`` the store's clients hand out
(``S3Clients.multipart``: the CRT's client or botocore's, chosen per request), so an upload
opened by one client is resumed by the other, and nothing here asks which.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

from ..errors import NotFound, PreconditionFailed
from ..types import Buffer, ByteRange, ObjectInfo, PartClaim, PartRef
from .s3_body import S3CopySource
from .s3_errors import answer_of
from .s3_transport import MultipartTransport, UploadIds


class S3Upload:
    """One multipart upload; its id outlives the process (the journal keeps it), so a later
    run can resume it. ``key`` is the store's key; ``ids`` name the upload at the endpoint."""

    def __init__(self, transport: MultipartTransport, key: str, ids: UploadIds,
                 size: int) -> None:
        self.transport = transport
        self.key = key
        self.ids = ids
        self.upload_id = ids.upload_id
        self.size = size
        # Set once this handle completed or aborted the upload. S3 answers a repeated
        # CompleteMultipartUpload with success (it is idempotent, for retries), so only the
        # handle can tell that the protocol's second completion must raise NotFound.
        self._finished: str | None = None

    @classmethod
    async def create(cls, transport: MultipartTransport, key: str, bucket: str, full_key: str,
                     what: str, size: int) -> S3Upload:
        """CreateMultipartUpload of ``full_key`` in ``bucket`` (``what`` names it in errors)."""
        upload_id = await transport.create(bucket, full_key, what)
        return cls(transport, key, UploadIds(bucket, full_key, upload_id, what), size)

    async def put_part(self, number: int, offset: int, data: Buffer, *,
                       crc32c: int | None = None) -> PartRef:
        etag = await self.transport.upload_part(self.ids, number, data, crc32c=crc32c)
        return PartRef(number, etag or "", len(data))

    async def list_parts(self) -> list[PartRef]:
        return await self.transport.list_parts(self.ids)

    async def confirm_parts(self, claims: Sequence[PartClaim]) -> set[int]:
        held = {(p.number, p.etag, p.size) for p in await self.list_parts()}
        return {c.ref.number for c in claims if (c.ref.number, c.ref.etag, c.ref.size) in held}

    async def copy_part(self, number: int, offset: int, source: S3CopySource,
                        rng: ByteRange) -> PartRef:
        try:
            etag = await self.transport.copy_part(self.ids, number, source, rng)
        except NotFound as exc:
            # NoSuchKey names the copy source (NoSuchUpload the upload): like a source that
            # changed, one that is gone is a failed precondition of the copy, for the caller
            # to plan without it, not an error of the object being written.
            answer = answer_of(exc.__cause__) if exc.__cause__ is not None else None
            if answer is None or answer.code != "NoSuchKey":
                raise
            raise PreconditionFailed(f"{self.ids.what}: its copy source {source.bucket}/"
                                     f"{source.key} no longer exists") from exc
        return PartRef(number, etag or "", rng.length)

    async def complete(self, parts: Sequence[PartRef]) -> ObjectInfo:
        if self._finished is not None:
            raise NotFound(f"{self.ids.what}: upload {self.upload_id} already {self._finished}")
        ordered = sorted(parts, key=lambda p: p.number)
        etag = await self.transport.complete(self.ids, ordered)
        self._finished = "completed"
        return ObjectInfo(self.key, self.size, etag, None)

    async def abort(self) -> None:
        with contextlib.suppress(NotFound):  # completed or aborted already
            await self.transport.abort(self.ids)
        self._finished = self._finished or "aborted"
