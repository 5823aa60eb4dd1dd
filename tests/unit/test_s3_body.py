"""A part body (``s3_body.Body``) read as a stream: botocore signs with the CRT's signer
when ``awscrt`` is importable, and that signer wraps the body in a stream and reads it."""

from __future__ import annotations

import hashlib

import pytest

from mcsync.stores.s3_body import Body


def test_a_part_body_reads_as_a_stream_for_the_crt_signer() -> None:
    data = bytes(range(256)) * 5000
    body = Body(memoryview(data))
    into = bytearray(100_000)
    got = bytearray()
    while n := body.readinto(into):
        got += into[:n]
    assert bytes(got) == data and body.tell() == len(data)
    assert body.read() == b""
    assert body.seek(0) == 0 and body.tell() == 0
    assert hashlib.sha256(body.read(10) + body.read()).digest() == hashlib.sha256(data).digest()
    with pytest.raises(OSError, match="rewinds to its start only"):
        body.seek(5)
