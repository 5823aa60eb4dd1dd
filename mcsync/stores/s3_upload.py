"""Multipart uploads to an S3-compatible target.

Their requests go through the AWS CRT's client where the store has one for them
(``S3Store.crt_client``: an explicit endpoint, keys, and no payload that must be signed), else
through botocore. Both send the same S3 API, so an upload opened by one is resumed by the
other. Every part carries a checksum the target verifies (``s3_body.BodyChecksums``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Sequence
from typing import TYPE_CHECKING, Any

from ..errors import NotFound, PreconditionFailed
from ..types import Buffer, ByteRange, ObjectInfo, PartClaim, PartRef
from .s3_body import S3CopySource, botocore_body, unquote_etag
from .s3_errors import answer_of

if TYPE_CHECKING:
    from .s3 import S3Store


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
