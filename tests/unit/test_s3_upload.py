"""``S3Upload``'s own rules over any ``MultipartTransport`` (a fake here; the CRT's and
botocore's are run against servers by the conformance suite): parts completed in number order,
a second completion through one handle refused, a copy source gone refused as a precondition,
an abort of a finished upload fine."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from mcsync.errors import NotFound, PreconditionFailed
from mcsync.stores.s3_body import S3CopySource
from mcsync.stores.s3_errors import Answer, S3Answered
from mcsync.stores.s3_transport import UploadIds
from mcsync.stores.s3_upload import S3Upload
from mcsync.types import Buffer, ByteRange, PartRef


class FakeTransport:
    def __init__(self, copy_error: str | None = None) -> None:
        self.sent: list[tuple[str, object]] = []
        self.copy_error = copy_error

    async def create(self, bucket: str, key: str, what: str) -> str:
        self.sent.append(("create", (bucket, key)))
        return "u1"

    async def upload_part(self, ids: UploadIds, number: int, data: Buffer, *,
                          crc32c: int | None = None) -> str | None:
        self.sent.append(("upload_part", number))
        return f"e{number}"

    async def copy_part(self, ids: UploadIds, number: int, source: S3CopySource,
                        rng: ByteRange) -> str | None:
        if self.copy_error is not None:
            answered = S3Answered(Answer(self.copy_error, 404))
            raise NotFound(f"{ids.what}: no such object") from answered
        return f"c{number}"

    async def list_parts(self, ids: UploadIds) -> list[PartRef]:
        return [PartRef(1, "e1", 5)]

    async def complete(self, ids: UploadIds, parts: Sequence[PartRef]) -> str | None:
        self.sent.append(("complete", [p.number for p in parts]))
        return "done"

    async def abort(self, ids: UploadIds) -> None:
        self.sent.append(("abort", ids.upload_id))
        raise NotFound("gone already")

    async def copy_object(self, source: S3CopySource, bucket: str, key: str,
                          what: str) -> str | None:
        return None


def test_an_upload_completes_its_parts_in_order_once() -> None:
    async def go() -> None:
        transport = FakeTransport()
        upload = await S3Upload.create(transport, "k", "b", "p/k", "s3://b/p/k", 10)
        assert upload.upload_id == "u1" and upload.ids.key == "p/k"
        second = await upload.put_part(2, 5, b"world")
        first = await upload.put_part(1, 0, b"hello")
        assert first == PartRef(1, "e1", 5)
        info = await upload.complete([second, first])
        assert (info.key, info.size, info.etag) == ("k", 10, "done")
        assert ("complete", [1, 2]) in transport.sent
        with pytest.raises(NotFound, match="already completed"):
            await upload.complete([first, second])
        await upload.abort()  # finished already: fine

    asyncio.run(go())


@pytest.mark.parametrize(("code", "raised"), [("NoSuchKey", PreconditionFailed),
                                              ("NoSuchUpload", NotFound)])
def test_a_copy_source_gone_is_a_failed_precondition(code: str,
                                                     raised: type[Exception]) -> None:
    upload = S3Upload(FakeTransport(copy_error=code), "k",
                      UploadIds("b", "p/k", "u1", "s3://b/p/k"), 10)
    source = S3CopySource("b", "p/old", "e")
    with pytest.raises(raised) as info:
        asyncio.run(upload.copy_part(1, 0, source, ByteRange(0, 5)))
    assert type(info.value) is raised
