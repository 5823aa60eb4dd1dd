"""What an S3 request is, read from its head: the operation (from method, path-style path and
query), bucket, key, the access key of its signature, and the record the fault proxy keeps of
it (``Exchange``). No I/O: ``faultproxy`` reads the bytes and passes them on."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from urllib.parse import parse_qsl, unquote, urlsplit

# The operations (``s3_operation``'s names) whose requests carry an object's bytes.
UPLOADS = frozenset({"PutObject", "UploadPart", "CompleteMultipartUpload"})


@dataclass
class Exchange:
    """One request through the proxy. ``status``: what the client was (being) answered;
    ``outcome``: "ok", "reset", "short", "client-gone" (it closed or reset first),
    "upstream-gone" (the server closed first, or could not be reached), "pending" (under way)
    or "stopped" (the proxy stopped first)."""

    method: str
    target: str
    op: str
    bucket: str
    key: str
    access_key: str | None
    part: str = ""  # an UploadPart's partNumber
    headers: dict[str, str] = field(default_factory=dict, repr=False)  # by lower-case name
    seq: int = 0
    t: float = 0.0  # seconds since the proxy started, when the request's head arrived
    conn: int = 0  # the client connection it came on (1, 2, ... in order of connection)
    fault: str | None = None
    rule: str | None = None
    status: int | None = None
    outcome: str = "pending"


_BUCKET_GETS = (("uploads", "ListMultipartUploads"), ("location", "GetBucketLocation"),
                ("versions", "ListObjectVersions"), ("versioning", "GetBucketVersioning"))


def s3_operation(method: str, path: str, query: dict[str, str],
                 headers: dict[str, str]) -> tuple[str, str, str]:
    """(operation, bucket, key) of a path-style S3 request ("Unknown" if not known)."""
    bucket, _, key = path.lstrip("/").partition("/")
    bucket, key, copy = unquote(bucket), unquote(key), "x-amz-copy-source" in headers
    upload = "uploadId" in query
    if not bucket:
        op = "ListBuckets" if method == "GET" else "Unknown"
    elif not key and method == "GET":
        op = next((op for q, op in _BUCKET_GETS if q in query),
                  "ListObjectsV2" if query.get("list-type") == "2" else "ListObjects")
    elif not key:
        op = {"HEAD": "HeadBucket", "PUT": "CreateBucket", "DELETE": "DeleteBucket",
              "POST": "DeleteObjects" if "delete" in query else "Unknown"}.get(method, "Unknown")
    elif method == "PUT":
        op = (("UploadPartCopy" if copy else "UploadPart") if upload and "partNumber" in query
              else "CopyObject" if copy else "PutObjectTagging" if "tagging" in query
              else "PutObject")
    elif method == "POST":
        op = ("CreateMultipartUpload" if "uploads" in query
              else "CompleteMultipartUpload" if upload else "Unknown")
    else:
        op = {"GET": "ListParts" if upload else "GetObjectTagging" if "tagging" in query
              else "GetObject", "HEAD": "HeadObject",
              "DELETE": "AbortMultipartUpload" if upload else "DeleteObject"}.get(method,
                                                                                  "Unknown")
    return op, bucket, key


_CREDENTIAL = re.compile(r"Credential=([^/,\s]+)/")


def header_map(lines: list[str]) -> dict[str, str]:
    """Header lines by lower-case name."""
    return {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in lines if h)}


def parse_request(head: bytes) -> Exchange:
    """The Exchange of a request's head (request line and headers, without the blank line)."""
    line, *lines = head.decode("latin-1").split("\r\n")
    method, target, _ = line.split(" ", 2)
    headers, parts = header_map(lines), urlsplit(target)
    query = dict(parse_qsl(parts.query, keep_blank_values=True))
    op, bucket, key = s3_operation(method, parts.path, query, headers)
    found = (_CREDENTIAL.search(headers.get("authorization", ""))
             or _CREDENTIAL.search("Credential=" + query.get("X-Amz-Credential", "")))
    return Exchange(method, target, op, bucket, key, found.group(1) if found else None,
                    query.get("partNumber", ""), headers)
