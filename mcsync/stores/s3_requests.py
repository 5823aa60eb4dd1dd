"""The S3 requests mcsync sends by its own clients (the AWS CRT's, ``s3_crt``; its own HTTP/1.1
connections, ``s3_wire``), written once over one method, ``S3Requests.request``: CopyObject,
the multipart upload API (create, UploadPart, UploadPartCopy, ListParts, complete, abort) and
a listing delimited by "/" (a page at a time, which obstore cannot). Answers are reduced to
``s3_errors.Answer`` (status and XML code) and translated by the one table.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from urllib.parse import quote, unquote_plus, urlsplit

from ..errors import Transient
from ..types import Buffer
from .s3_body import BodyChecksums
from .s3_clients import ClientSettings
from .s3_errors import S3Answered, crt_answer


@dataclass(frozen=True, slots=True)
class Endpoint:
    """Where the requests go: ``host`` (with its port, if one is given) for the Host header,
    the endpoint's own path (a store behind a path of a gateway), and whether they go over
    TLS."""

    host: str
    tls: bool
    path_style: bool
    base: str = ""

    @classmethod
    def of(cls, settings: ClientSettings) -> Endpoint:
        parts = urlsplit(settings.endpoint_url or "")
        if not parts.netloc:
            raise ValueError("the CRT client needs an explicit endpoint")
        return cls(parts.netloc, parts.scheme == "https", settings.path_style,
                   parts.path.rstrip("/"))

    def target(self, bucket: str, key: str | None) -> tuple[str, str]:
        """(Host header, path) of ``key`` in ``bucket`` (None: the bucket itself): keys
        encoded as botocore does."""
        if key is None:
            return ((self.host, f"{self.base}/{bucket}") if self.path_style
                    else (f"{bucket}.{self.host}", f"{self.base}/"))
        if self.path_style:
            return self.host, f"{self.base}/{bucket}/{quote(key, safe='/~')}"
        return f"{bucket}.{self.host}", f"{self.base}/{quote(key, safe='/~')}"


@dataclass(frozen=True, slots=True)
class Response:
    """A 2xx answer: its headers (names lower-cased) and body."""

    status: int
    headers: dict[str, str]
    body: bytes


def xml_fields(body: bytes, *names: str) -> dict[str, list[str]]:
    """The texts of the elements named ``names`` anywhere in an S3 XML answer (namespaces
    dropped), each in document order; empty lists for an answer that is no XML."""
    import xml.etree.ElementTree as ET  # paid by the runs that need it, not every run

    found: dict[str, list[str]] = {name: [] for name in names}
    try:
        root = ET.fromstring(body)
    except ET.ParseError:
        return found
    for element in root.iter():
        name = element.tag.rpartition("}")[2]
        if name in found:
            found[name].append(element.text or "")
    return found


def first(fields: dict[str, list[str]], name: str) -> str | None:
    values = fields.get(name)
    return values[0] if values else None


class S3Requests:
    """The S3 operations, each one ``request`` of the client beneath (its 2xx answer; an S3
    error answer raises ``S3Answered``, the client's own failures mcsync's errors)."""

    async def request(self, method: str, bucket: str, key: str | None, what: str, *,
                      operation: str,
                      query: str = "", headers: Sequence[tuple[str, str]] = (),
                      body: Buffer | None = None) -> Response:
        raise NotImplementedError

    async def copy_object(self, source_bucket: str, source_key: str, source_etag: str | None,
                          bucket: str, key: str, what: str) -> str | None:
        """CopyObject ``source_bucket/source_key`` (only while its ETag is ``source_etag``,
        if given) to ``bucket/key``; the new object's ETag (None if the answer holds none,
        as botocore's would)."""
        r = await self.request("PUT", bucket, key, what, operation="CopyObject",
                               headers=_copy_source(source_bucket, source_key, source_etag))
        return first(_checked(r, "ETag"), "ETag")

    async def create_upload(self, bucket: str, key: str, what: str) -> str:
        r = await self.request("POST", bucket, key, what, operation="CreateMultipartUpload",
                               query="uploads")
        upload_id = first(_checked(r, "UploadId"), "UploadId")
        if not upload_id:
            raise Transient(f"{what}: CreateMultipartUpload answered no upload id")
        return upload_id

    async def upload_part(self, bucket: str, key: str, upload_id: str, number: int,
                          data: Buffer, checksum: tuple[str, str], what: str) -> str:
        """UploadPart ``number`` with ``checksum`` (header, value) of ``data``; its ETag."""
        r = await self.request("PUT", bucket, key, what, operation="UploadPart",
                               query=f"partNumber={number}&uploadId={_q(upload_id)}",
                               headers=[checksum], body=data)
        etag = r.headers.get("etag")
        if not etag:
            raise Transient(f"{what}: UploadPart {number} answered no ETag")
        return etag

    async def put_object(self, bucket: str, key: str, data: Buffer, checksums: BodyChecksums,
                         what: str, *, crc32c: int | None = None) -> str | None:
        """PutObject of ``data`` with a checksum the target verifies (``crc32c``: data's,
        when known already); its ETag."""
        async def send(header: str, value: str) -> Response:
            return await self.request("PUT", bucket, key, what, operation="PutObject",
                                      headers=[(header, value)], body=data)

        return (await checksums.send("put_object", data, send, crc32c=crc32c)).headers.get("etag")

    async def copy_part(self, bucket: str, key: str, upload_id: str, number: int,
                        source_bucket: str, source_key: str, source_etag: str | None,
                        first_byte: int, last_byte: int, what: str) -> str | None:
        """UploadPartCopy of bytes ``first_byte``-``last_byte`` (inclusive) of ``source_key``
        (only while its ETag is ``source_etag``, if given) as part ``number``; its ETag."""
        r = await self.request("PUT", bucket, key, what, operation="UploadPartCopy",
                               query=f"partNumber={number}&uploadId={_q(upload_id)}",
                               headers=[*_copy_source(source_bucket, source_key, source_etag),
                                        ("x-amz-copy-source-range",
                                         f"bytes={first_byte}-{last_byte}")])
        return first(_checked(r, "ETag"), "ETag")

    async def list_parts(self, bucket: str, key: str, upload_id: str,
                         what: str) -> list[tuple[int, str, int]]:
        """(number, ETag, size) of every part the upload holds, page after page."""
        parts: list[tuple[int, str, int]] = []
        marker = ""
        while True:
            query = f"uploadId={_q(upload_id)}" + (f"&part-number-marker={marker}"
                                                   if marker else "")
            r = await self.request("GET", bucket, key, what, operation="ListParts", query=query)
            fields = _checked(r, "PartNumber", "ETag", "Size", "IsTruncated",
                              "NextPartNumberMarker")
            numbers, etags, sizes = fields["PartNumber"], fields["ETag"], fields["Size"]
            if not len(numbers) == len(etags) == len(sizes):
                raise Transient(f"{what}: ListParts answered parts without number, ETag or size")
            parts.extend((int(n), e, int(z)) for n, e, z in zip(numbers, etags, sizes,
                                                                strict=True))
            following = first(fields, "NextPartNumberMarker")
            if first(fields, "IsTruncated") != "true" or not following or following == marker:
                return parts
            marker = following

    async def complete_upload(self, bucket: str, key: str, upload_id: str,
                              parts: Sequence[tuple[int, str]], what: str) -> str | None:
        """CompleteMultipartUpload of ``parts`` (number, ETag as recorded); the object's ETag."""
        xml = "".join(f"<Part><PartNumber>{n}</PartNumber><ETag>&quot;{_xml(e)}&quot;</ETag>"
                      "</Part>" for n, e in parts)
        body = f"<CompleteMultipartUpload>{xml}</CompleteMultipartUpload>".encode()
        r = await self.request("POST", bucket, key, what, operation="CompleteMultipartUpload",
                               query=f"uploadId={_q(upload_id)}", body=body)
        return first(_checked(r, "ETag"), "ETag")

    async def abort_upload(self, bucket: str, key: str, upload_id: str, what: str) -> None:
        await self.request("DELETE", bucket, key, what, operation="AbortMultipartUpload",
                           query=f"uploadId={_q(upload_id)}")

    async def list_level(self, bucket: str, prefix: str, *, after: str, token: str,
                         page: int, what: str, delimiter: str = "/") -> dict[str, Any]:
        """One ListObjectsV2 page under ``prefix`` delimited by ``delimiter`` ("": not
        delimited), from the first name after ``after`` or from the continuation ``token``,
        as botocore's: ``Contents`` (Key, Size, ETag, LastModified), ``CommonPrefixes``,
        ``IsTruncated``, ``NextContinuationToken``."""
        asked = [("list-type", "2"), ("delimiter", delimiter), ("encoding-type", "url"),
                 ("max-keys", str(page)), ("prefix", prefix)]
        asked.append(("continuation-token", token) if token else ("start-after", after))
        query = "&".join(f"{name}={_q(value)}" for name, value in asked if value)
        r = await self.request("GET", bucket, None, what, operation="ListObjectsV2",
                               query=query)
        if b"<Error>" in r.body:
            raise S3Answered(crt_answer(r.status, r.body))
        return listing_page(r.body, what)



def listing_page(body: bytes, what: str) -> dict[str, Any]:
    """A ListObjectsV2 answer as botocore parses it (keys URL-decoded where the answer says
    they are encoded, as botocore does)."""
    import xml.etree.ElementTree as ET  # paid by the runs that need it, not every run

    try:
        root = ET.fromstring(body)
    except ET.ParseError:
        raise Transient(f"{what}: a listing answered no XML") from None

    def text(element: ET.Element, name: str) -> str:
        for child in element:
            if child.tag.rpartition("}")[2] == name:
                return child.text or ""
        return ""

    contents: list[dict[str, Any]] = []
    prefixes: list[str] = []
    for element in root:
        tag = element.tag.rpartition("}")[2]
        if tag == "Contents":
            contents.append({"Key": text(element, "Key"), "Size": int(text(element, "Size")),
                             "ETag": text(element, "ETag"),
                             "LastModified": datetime.fromisoformat(
                                 text(element, "LastModified"))})
        elif tag == "CommonPrefixes":
            prefixes.append(text(element, "Prefix"))
    if text(root, "EncodingType") == "url":
        for c in contents:
            c["Key"] = unquote_plus(c["Key"])
        prefixes = [unquote_plus(p) for p in prefixes]
    return {"Contents": contents, "CommonPrefixes": [{"Prefix": p} for p in prefixes],
            "IsTruncated": text(root, "IsTruncated") == "true",
            "NextContinuationToken": text(root, "NextContinuationToken")}


def _checked(r: Response, *names: str) -> dict[str, list[str]]:
    """The fields ``names`` of a 200 answer, which may still be an error: S3 answers
    CompleteMultipartUpload and copies with 200 before it knows how they end."""
    if b"<Error>" in r.body:
        raise S3Answered(crt_answer(r.status, r.body))
    return xml_fields(r.body, *names)


def _copy_source(bucket: str, key: str, etag: str | None) -> list[tuple[str, str]]:
    """The headers naming a copy's source, encoded as botocore does, and guarding it with its
    ETag when one is given (a changed source is then refused with 412, never copied)."""
    headers = [("x-amz-copy-source", quote(f"{bucket}/{key}", safe="/~"))]
    if etag:
        headers.append(("x-amz-copy-source-if-match", f'"{etag}"'))
    return headers


def _q(value: str) -> str:
    return quote(value, safe="")


def _xml(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


