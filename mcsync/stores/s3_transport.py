"""The multipart upload requests (and CopyObject) as a small protocol, ``MultipartTransport``,
sent by one of two kinds of client: mcsync's own (``RequestsTransport``: mcsync's connections,
or the AWS CRT's for the requests without a body where a payload must be signed) or
botocore's (``BotocoreTransport``). Both send the same S3
API, so an upload opened by one is resumed by the other. Which one sends a request is the
store's clients' rule (``S3Clients.multipart``), not the caller's: ``S3Upload`` holds a
transport and never asks.

A transport sends and returns what the answer names (ETags unquoted); it translates no error:
the clients object that hands it out does, so the SDKs' own exceptions reach
``BodyChecksums`` (which reads a refusal of its header from them).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from ..types import Buffer, ByteRange, PartRef
from .s3_body import BodyChecksums, S3CopySource, botocore_body, unquote_etag
from .s3_requests import S3Requests


@dataclass(frozen=True, slots=True)
class UploadIds:
    """What names one multipart upload: its bucket, full key and id, and ``what`` for errors
    (the object's URL)."""

    bucket: str
    key: str
    upload_id: str
    what: str


class MultipartTransport(Protocol):
    async def create(self, bucket: str, key: str, what: str) -> str:
        """CreateMultipartUpload of ``key`` (a full key); the upload id."""
        ...

    async def upload_part(self, ids: UploadIds, number: int, data: Buffer, *,
                          crc32c: int | None = None) -> str | None:
        """UploadPart ``number`` with a checksum the target verifies (``crc32c``: ``data``'s
        CRC32C, when the caller has it); its ETag."""
        ...

    async def copy_part(self, ids: UploadIds, number: int, source: S3CopySource,
                        rng: ByteRange) -> str | None:
        """UploadPartCopy of bytes ``rng`` of ``source`` (while its ETag holds) as part
        ``number``; its ETag."""
        ...

    async def list_parts(self, ids: UploadIds) -> list[PartRef]: ...

    async def complete(self, ids: UploadIds, parts: Sequence[PartRef]) -> str | None:
        """CompleteMultipartUpload of ``parts`` (in number order); the object's ETag."""
        ...

    async def abort(self, ids: UploadIds) -> None: ...

    async def copy_object(self, source: S3CopySource, bucket: str, key: str,
                          what: str) -> str | None:
        """CopyObject of ``source`` (while its ETag holds) to ``key``; the new ETag."""
        ...


class RequestsTransport:
    """The requests through one of mcsync's own clients: its connections (``s3_wire``), or
    the AWS CRT's (``s3_crt``)."""

    def __init__(self, client: S3Requests, checksums: BodyChecksums) -> None:
        self._client = client
        self._checksums = checksums

    async def create(self, bucket: str, key: str, what: str) -> str:
        return await self._client.create_upload(bucket, key, what)

    async def upload_part(self, ids: UploadIds, number: int, data: Buffer, *,
                          crc32c: int | None = None) -> str | None:
        async def send(header: str, value: str) -> str:
            return await self._client.upload_part(ids.bucket, ids.key, ids.upload_id, number,
                                               data, (header, value), ids.what)

        return unquote_etag(await self._checksums.send("upload_part", data, send,
                                                       crc32c=crc32c))

    async def copy_part(self, ids: UploadIds, number: int, source: S3CopySource,
                        rng: ByteRange) -> str | None:
        return unquote_etag(await self._client.copy_part(
            ids.bucket, ids.key, ids.upload_id, number, source.bucket, source.key, source.etag,
            rng.start, rng.end - 1, ids.what))

    async def list_parts(self, ids: UploadIds) -> list[PartRef]:
        found = await self._client.list_parts(ids.bucket, ids.key, ids.upload_id, ids.what)
        return [PartRef(n, unquote_etag(etag) or "", size) for n, etag, size in found]

    async def complete(self, ids: UploadIds, parts: Sequence[PartRef]) -> str | None:
        return unquote_etag(await self._client.complete_upload(
            ids.bucket, ids.key, ids.upload_id, [(p.number, p.etag) for p in parts], ids.what))

    async def abort(self, ids: UploadIds) -> None:
        await self._client.abort_upload(ids.bucket, ids.key, ids.upload_id, ids.what)

    async def copy_object(self, source: S3CopySource, bucket: str, key: str,
                          what: str) -> str | None:
        return unquote_etag(await self._client.copy_object(source.bucket, source.key, source.etag,
                                                        bucket, key, what))


class BotocoreTransport:
    """The requests through aiobotocore's client."""

    def __init__(self, client: Any, checksums: BodyChecksums) -> None:
        self._client = client
        self._checksums = checksums

    async def create(self, bucket: str, key: str, what: str) -> str:
        r = await self._client.create_multipart_upload(Bucket=bucket, Key=key)
        upload_id: str = r["UploadId"]
        return upload_id

    async def upload_part(self, ids: UploadIds, number: int, data: Buffer, *,
                          crc32c: int | None = None) -> str | None:
        r = await self._checksums.send("upload_part", data, botocore_body(
            self._client.upload_part, data, PartNumber=number, **_ids(ids)), crc32c=crc32c)
        return unquote_etag(r["ETag"])

    async def copy_part(self, ids: UploadIds, number: int, source: S3CopySource,
                        rng: ByteRange) -> str | None:
        r = await self._client.upload_part_copy(
            **_ids(ids), PartNumber=number, **_copy_source(source),
            CopySourceRange=f"bytes={rng.start}-{rng.end - 1}")
        return unquote_etag(r["CopyPartResult"]["ETag"])

    async def list_parts(self, ids: UploadIds) -> list[PartRef]:
        parts: list[PartRef] = []
        async for page in self._client.get_paginator("list_parts").paginate(**_ids(ids)):
            parts.extend(PartRef(p["PartNumber"], unquote_etag(p["ETag"]) or "", p["Size"])
                         for p in page.get("Parts", ()))
        return parts

    async def complete(self, ids: UploadIds, parts: Sequence[PartRef]) -> str | None:
        r = await self._client.complete_multipart_upload(
            **_ids(ids),
            MultipartUpload={"Parts": [{"PartNumber": p.number, "ETag": f'"{p.etag}"'}
                                       for p in parts]})
        return unquote_etag(r.get("ETag"))

    async def abort(self, ids: UploadIds) -> None:
        await self._client.abort_multipart_upload(**_ids(ids))

    async def copy_object(self, source: S3CopySource, bucket: str, key: str,
                          what: str) -> str | None:
        r = await self._client.copy_object(Bucket=bucket, Key=key, **_copy_source(source))
        return unquote_etag(r.get("CopyObjectResult", {}).get("ETag"))


def _ids(ids: UploadIds) -> dict[str, str]:
    return {"Bucket": ids.bucket, "Key": ids.key, "UploadId": ids.upload_id}


def _copy_source(source: S3CopySource) -> dict[str, Any]:
    """botocore's parameters naming a copy's source, guarded by its ETag when one is given (a
    changed source is then refused with 412, never copied)."""
    kwargs: dict[str, Any] = {"CopySource": {"Bucket": source.bucket, "Key": source.key}}
    if source.etag:
        kwargs["CopySourceIfMatch"] = f'"{source.etag}"'
    return kwargs
