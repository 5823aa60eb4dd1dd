"""A synthetic S3 bucket of N keys, served on 127.0.0.1: listing and planning at scale.

Nothing is stored: key *i* of the bucket, its size, its ETag and its bytes are functions of
*i* (``SyntheticBucket``), and the keys are generated in UTF-8 byte order, so a listing page is
computed on demand and a key is found by bisection. A million keys cost no disk and no memory.

What it answers (path-style, no signature checked, any keys accepted):

* ``GET /`` (ListBuckets), ``HEAD /bucket``, ``GET /bucket?location``;
* ``GET /bucket?list-type=2`` (ListObjectsV2: ``prefix``, ``delimiter``, ``max-keys`` up to
  1000, ``continuation-token``, ``start-after``, ``encoding-type=url``) and ListObjects v1
  (``marker``);
* ``GET`` / ``HEAD`` of an object (``Range``, ``If-Match``): the deterministic bytes of that
  key, so small syncs work too. Everything else (writes) is refused: the bucket is read-only.

Run it in a thread (``serve_in_thread``), as a child process (``synthetic_server``, for
measuring a client without the server in its process tree), or in the foreground::

    python -m testbed.synthetic --keys 1000000 --port 9100 [--json]
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import re
import signal
import sys
import tempfile
import threading
import time
import urllib.request
from bisect import bisect_left, bisect_right
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import format_datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlsplit
from xml.sax.saxutils import escape

from .processes import LOOPBACK, Child, free_port, python_child_env

__all__ = ["SyntheticBucket", "SyntheticEndpoint", "serve_in_thread", "synthetic_server"]

BUCKET = "synthetic"
ACCESS_KEY = "synthetic"
SECRET_KEY = "synthetic-secret"
MODIFIED = datetime(2026, 1, 1, tzinfo=UTC)  # every object's LastModified
_MODIFIED_ISO = MODIFIED.strftime("%Y-%m-%dT%H:%M:%S.000Z")
_MODIFIED_HTTP = format_datetime(MODIFIED, usegmt=True)
_PAGE_MAX = 1000
_MD5_BODIES = 4096
_NS = "http://s3.amazonaws.com/doc/2006-03-01/"


@dataclass(frozen=True)
class SyntheticBucket:
    """``keys`` objects named ``shard-DDDDDD/part-FFFF.bin``, ``per_dir`` to a directory, in
    byte order; sizes from 0 to ``max_size`` bytes, pseudo-random but fixed by the index."""

    keys: int
    per_dir: int = 1000
    max_size: int = 64 * 1024
    name: str = BUCKET

    def __post_init__(self) -> None:
        if not 1 <= self.per_dir <= 10_000:
            raise ValueError("per_dir must be between 1 and 10,000")

    def __len__(self) -> int:
        return self.keys

    def __getitem__(self, i: int) -> str:  # a sequence of keys, for bisect
        return self.key(i)

    def key(self, i: int) -> str:
        return f"shard-{i // self.per_dir:06d}/part-{i % self.per_dir:04d}.bin"

    def size(self, i: int) -> int:
        return ((i * 2654435761) & 0xFFFFFFFF) % (self.max_size + 1)

    def etag(self, i: int) -> str:
        """The MD5 of the body, as S3 has it, for buckets of small objects (up to
        ``_MD5_BODIES`` bytes: rclone checks it on download); of the key otherwise, so that a
        listing page costs no hashing of 64 MB of made-up bytes."""
        data = self.body(i) if self.max_size <= _MD5_BODIES else self.key(i).encode()
        return hashlib.md5(data, usedforsecurity=False).hexdigest()

    def total_size(self) -> int:
        return sum(self.size(i) for i in range(self.keys))

    def body(self, i: int) -> bytes:
        """The object's bytes: its key and index, repeated to its size."""
        size = self.size(i)
        unit = f"{self.key(i)} {i}\n".encode()
        return (unit * (size // len(unit) + 1))[:size]

    def index(self, key: str) -> int | None:
        i = bisect_left(self, key)
        return i if i < self.keys and self.key(i) == key else None

    def after(self, key: str) -> int:
        """The index of the first key greater than ``key``."""
        return bisect_right(self, key)

    def past_prefix(self, prefix: str) -> int:
        """The index of the first key that neither starts with ``prefix`` nor sorts before."""
        if not prefix:
            return self.keys
        return bisect_left(self, prefix[:-1] + chr(ord(prefix[-1]) + 1))

    def page(self, *, prefix: str = "", delimiter: str = "", start: str = "",
             max_keys: int = _PAGE_MAX) -> tuple[list[int], list[str], str | None]:
        """One listing page after ``start`` (exclusive; a common prefix ``start`` skips all
        under it): (key indexes, common prefixes, the last entry when more follow)."""
        i = max(bisect_left(self, prefix), self.after(start) if start else 0)
        if start and delimiter and start.endswith(delimiter):
            i = max(i, self.past_prefix(start))
        end = self.past_prefix(prefix)
        found: list[int] = []
        prefixes: list[str] = []
        last = ""
        while i < end and len(found) + len(prefixes) < max_keys:
            key = self.key(i)
            cut = key.find(delimiter, len(prefix)) if delimiter else -1
            if cut >= 0:
                last = key[:cut + len(delimiter)]
                prefixes.append(last)
                i = self.past_prefix(last)
            else:
                last = key
                found.append(i)
                i += 1
        return found, prefixes, (last if i < end else None)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "mcsync-synthetic"
    # Headers and body in one send, and no Nagle: else a client that waits for the whole
    # answer before its ACK waits 40 ms on every request (delayed ACK meets Nagle).
    wbufsize = 256 * 1024
    disable_nagle_algorithm = True
    bucket: SyntheticBucket  # set on the subclass made per server

    def log_message(self, format: str, *args: Any) -> None:  # quiet: a million requests
        pass

    def _reply(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None,
               *, content_type: str = "application/xml", send_body: bool = True) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("x-amz-request-id", "synthetic")
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if send_body and body:
            self.wfile.write(body)

    def _error(self, status: int, code: str, message: str, *, send_body: bool = True) -> None:
        body = (f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{code}</Code>'
                f"<Message>{escape(message)}</Message></Error>").encode()
        self._reply(status, body, send_body=send_body)

    def _target(self) -> tuple[str, str, dict[str, str]]:
        parts = urlsplit(self.path)
        query = {k: v[0] for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
        bucket, _, key = unquote(parts.path).lstrip("/").partition("/")
        return bucket, key, query

    def _drain(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)

    def do_GET(self) -> None:
        self._get(send_body=True)

    def do_HEAD(self) -> None:
        self._get(send_body=False)

    def _refuse(self) -> None:
        self._drain()
        self._error(403, "AccessDenied", "the synthetic bucket is read-only")

    do_PUT = do_POST = do_DELETE = _refuse

    def _get(self, *, send_body: bool) -> None:
        bucket, key, query = self._target()
        b = self.bucket
        if not bucket:
            body = (f'<?xml version="1.0" encoding="UTF-8"?><ListAllMyBucketsResult xmlns="{_NS}">'
                    f"<Owner><ID>synthetic</ID></Owner><Buckets><Bucket><Name>{b.name}</Name>"
                    f"<CreationDate>{_MODIFIED_ISO}</CreationDate></Bucket></Buckets>"
                    "</ListAllMyBucketsResult>").encode()
            return self._reply(200, body, send_body=send_body)
        if bucket != b.name:
            return self._error(404, "NoSuchBucket", bucket, send_body=send_body)
        if not key:
            if "location" in query:
                body = (f'<?xml version="1.0" encoding="UTF-8"?><LocationConstraint '
                        f'xmlns="{_NS}"></LocationConstraint>').encode()
                return self._reply(200, body, send_body=send_body)
            if not send_body:  # HeadBucket
                return self._reply(200, headers={"x-amz-bucket-region": "us-east-1"},
                                   send_body=False)
            return self._list(query)
        i = b.index(key)
        if i is None:
            return self._error(404, "NoSuchKey", key, send_body=send_body)
        self._object(i, send_body)

    def _object(self, i: int, send_body: bool) -> None:
        b = self.bucket
        etag = f'"{b.etag(i)}"'
        wanted = self.headers.get("If-Match")
        if wanted is not None and wanted.strip() not in (etag, "*"):
            return self._error(412, "PreconditionFailed", "If-Match", send_body=send_body)
        size = b.size(i)
        headers = {"ETag": etag, "Last-Modified": _MODIFIED_HTTP, "Accept-Ranges": "bytes"}
        status, lo, hi = 200, 0, size
        rng = self.headers.get("Range")
        if rng:
            m = re.fullmatch(r"bytes=(\d*)-(\d*)", rng.strip())
            if m is None or not (m.group(1) or m.group(2)):
                return self._error(416, "InvalidRange", rng, send_body=send_body)
            if m.group(1):
                lo, hi = int(m.group(1)), min(int(m.group(2) or size - 1) + 1, size)
            else:
                lo, hi = max(size - int(m.group(2)), 0), size
            if lo >= size or lo >= hi:
                return self._error(416, "InvalidRange", rng, send_body=send_body)
            status = 206
            headers["Content-Range"] = f"bytes {lo}-{hi - 1}/{size}"
        data = b.body(i)[lo:hi] if send_body else b""
        if not send_body:
            self.send_response(status)
            self.send_header("Content-Length", str(hi - lo))
            self.send_header("Content-Type", "application/octet-stream")
            for k, v in headers.items():
                self.send_header(k, v)
            self.end_headers()
            return None
        return self._reply(status, data, headers, content_type="application/octet-stream")

    def _list(self, q: dict[str, str]) -> None:
        b = self.bucket
        v2 = q.get("list-type") == "2"
        prefix, delimiter = q.get("prefix", ""), q.get("delimiter", "")
        try:
            max_keys = min(int(q.get("max-keys", _PAGE_MAX)), _PAGE_MAX)
        except ValueError:
            return self._error(400, "InvalidArgument", "max-keys")
        if v2:
            token = q.get("continuation-token")
            start = token if token is not None else q.get("start-after", "")
        else:
            start = q.get("marker", "")
        url = q.get("encoding-type") == "url"

        def enc(s: str) -> str:
            return quote(s, safe="/") if url else escape(s)

        found, prefixes, more = b.page(prefix=prefix, delimiter=delimiter, start=start,
                                       max_keys=max_keys)
        out = [f'<?xml version="1.0" encoding="UTF-8"?>\n<ListBucketResult xmlns="{_NS}">'
               f"<Name>{b.name}</Name><Prefix>{enc(prefix)}</Prefix>"
               f"<MaxKeys>{max_keys}</MaxKeys>"
               f"<IsTruncated>{'true' if more is not None else 'false'}</IsTruncated>"]
        if delimiter:
            out.append(f"<Delimiter>{enc(delimiter)}</Delimiter>")
        if url:
            out.append("<EncodingType>url</EncodingType>")
        if v2:
            out.append(f"<KeyCount>{len(found) + len(prefixes)}</KeyCount>")
            if "continuation-token" in q:
                out.append(f"<ContinuationToken>{escape(start)}</ContinuationToken>")
            if more is not None:
                out.append(f"<NextContinuationToken>{escape(more)}</NextContinuationToken>")
        else:
            out.append(f"<Marker>{enc(start)}</Marker>")
            if more is not None and delimiter:
                out.append(f"<NextMarker>{enc(more)}</NextMarker>")
        for i in found:
            out.append(f"<Contents><Key>{enc(b.key(i))}</Key>"
                       f"<LastModified>{_MODIFIED_ISO}</LastModified>"
                       f"<ETag>&quot;{b.etag(i)}&quot;</ETag><Size>{b.size(i)}</Size>"
                       "<StorageClass>STANDARD</StorageClass></Contents>")
        for p in prefixes:
            out.append(f"<CommonPrefixes><Prefix>{enc(p)}</Prefix></CommonPrefixes>")
        out.append("</ListBucketResult>")
        self._reply(200, "".join(out).encode())


@dataclass(frozen=True)
class SyntheticEndpoint:
    """Where a synthetic bucket is served, with the environment that points clients at it."""

    url: str
    bucket: str
    keys: int
    access_key: str = ACCESS_KEY
    secret_key: str = SECRET_KEY
    region: str = "us-east-1"

    def meta_env(self) -> dict[str, str]:
        """mcsync's ``meta://`` settings (as ``S3Endpoint.meta_env``)."""
        return {"MCSYNC_META_ENDPOINT_URL": self.url,
                "MCSYNC_META_ACCESS_KEY_ID": self.access_key,
                "MCSYNC_META_SECRET_ACCESS_KEY": self.secret_key,
                "MCSYNC_META_REGION": self.region}

    def rclone_env(self, remote: str = "SYN") -> dict[str, str]:
        """An rclone S3 remote named ``remote`` at this endpoint (``SYN:synthetic/``)."""
        pre = f"RCLONE_CONFIG_{remote.upper()}_"
        return {pre + "TYPE": "s3", pre + "PROVIDER": "Other", pre + "ENDPOINT": self.url,
                pre + "ACCESS_KEY_ID": self.access_key,
                pre + "SECRET_ACCESS_KEY": self.secret_key, pre + "REGION": self.region,
                pre + "FORCE_PATH_STYLE": "true", pre + "LIST_VERSION": "2"}


class _Server(ThreadingHTTPServer):
    # socketserver's listen backlog is 5: a client opening 128 connections at once (mcsync's
    # default) had SYNs dropped and retransmitted after 1, 3, 7, 15 s, so its last requests
    # stalled for tens of seconds. Real endpoints have backlogs in the thousands.
    request_queue_size = 1024
    daemon_threads = True


def make_server(bucket: SyntheticBucket, port: int = 0) -> ThreadingHTTPServer:
    handler = type("Handler", (_Handler,), {"bucket": bucket})
    return _Server((LOOPBACK, port), handler)


@contextlib.contextmanager
def serve_in_thread(bucket: SyntheticBucket, port: int = 0) -> Iterator[SyntheticEndpoint]:
    """Serve ``bucket`` from a thread of this process until the block ends."""
    server = make_server(bucket, port)
    thread = threading.Thread(target=server.serve_forever, name="synthetic-s3", daemon=True)
    thread.start()
    try:
        yield SyntheticEndpoint(f"http://{LOOPBACK}:{server.server_address[1]}", bucket.name,
                                bucket.keys)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


@contextlib.contextmanager
def synthetic_server(keys: int, *, per_dir: int = 1000, max_size: int = 64 * 1024,
                     log_path: Path | None = None,
                     startup_timeout: float = 30.0) -> Iterator[SyntheticEndpoint]:
    """Serve a synthetic bucket of ``keys`` keys from a child process (``python -m
    testbed.synthetic``) until the block ends."""
    port = free_port()
    argv = [sys.executable, "-m", "testbed.synthetic", "--keys", str(keys),
            "--per-dir", str(per_dir), "--max-size", str(max_size), "--port", str(port)]
    with contextlib.ExitStack() as stack:
        if log_path is None:
            log_path = Path(stack.enter_context(tempfile.TemporaryDirectory())) / "syn.log"
        child = Child("synthetic-s3", argv, log_path, cwd=None, env=python_child_env())
        stack.callback(child.stop)
        endpoint = SyntheticEndpoint(f"http://{LOOPBACK}:{port}", BUCKET, keys)
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        deadline = time.monotonic() + startup_timeout
        while True:
            try:
                with opener.open(endpoint.url + "/", timeout=2) as resp:
                    resp.read()
                break
            except OSError as exc:
                if not child.running() or time.monotonic() > deadline:
                    raise RuntimeError(f"the synthetic server did not start ({exc}):\n"
                                       f"{child.log_tail()}") from None
                time.sleep(0.05)
        yield endpoint


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m testbed.synthetic",
                                     description="Serve a synthetic S3 bucket on 127.0.0.1.")
    parser.add_argument("--keys", type=int, required=True)
    parser.add_argument("--per-dir", type=int, default=1000)
    parser.add_argument("--max-size", type=int, default=64 * 1024)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print the endpoint as JSON")
    args = parser.parse_args(argv)
    bucket = SyntheticBucket(args.keys, per_dir=args.per_dir, max_size=args.max_size)
    server = make_server(bucket, args.port)
    url = f"http://{LOOPBACK}:{server.server_address[1]}"

    def on_sigterm(signum: int, frame: Any) -> None:
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, on_sigterm)
    if args.json:
        print(json.dumps({"url": url, "bucket": bucket.name, "keys": bucket.keys}), flush=True)
    else:
        print(f"serving {bucket.keys} keys as s3://{bucket.name}/ at {url}", flush=True)
    try:
        server.serve_forever()
    except (KeyboardInterrupt, SystemExit):
        pass
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
