import asyncio
import base64

import obstore
import pytest
from hypothesis import given
from hypothesis import strategies as st

from mcsync import checksums
from mcsync.errors import IntegrityError

blobs = st.binary(max_size=4096)


def test_known_values():
    assert checksums.crc32c(b"") == 0
    assert checksums.crc32c(b"123456789") == 0xE3069283  # the CRC-32C check value
    # What GCS (and its emulator) list for b"hello 1": big-endian, base64.
    assert checksums.to_base64(checksums.crc32c(b"hello 1")) == "S3d5gQ=="
    assert checksums.to_base64(0) == "AAAAAA=="


@given(blobs, blobs)
def test_combine_equals_the_crc_of_the_concatenation(a, b):
    whole = checksums.crc32c(a + b)
    assert checksums.combine(checksums.crc32c(a), checksums.crc32c(b), len(b)) == whole


@given(st.lists(blobs, max_size=12))
def test_parts_combine_into_the_whole(parts):
    crcs = [(checksums.crc32c(p), len(p)) for p in parts]
    assert checksums.combine_parts(crcs) == checksums.crc32c(b"".join(parts))


@given(st.binary(min_size=1, max_size=64), st.integers(min_value=0, max_value=1 << 40))
def test_combine_with_long_zero_runs(a, n):
    # Long lengths without long buffers: n zero bytes appended, checked in two ways.
    zeros = min(n, 3000)
    direct = checksums.crc32c(a + bytes(zeros))
    assert checksums.combine(checksums.crc32c(a), checksums.crc32c(bytes(zeros)), zeros) == direct
    # crc(A + B) ^ crc(B) does not depend on B's content, only on A and len(B).
    b1, b2 = bytes(zeros), b"\xff" * zeros
    assert (checksums.combine(checksums.crc32c(a), checksums.crc32c(b1), zeros)
            ^ checksums.crc32c(b1)) == (checksums.combine(checksums.crc32c(a),
                                                          checksums.crc32c(b2), zeros)
                                        ^ checksums.crc32c(b2))
    assert 0 <= checksums.combine(checksums.crc32c(a), 0, n) < 1 << 32


@given(st.integers(min_value=0, max_value=(1 << 32) - 1))
def test_base64_round_trip(crc):
    encoded = checksums.to_base64(crc)
    assert len(base64.b64decode(encoded)) == 4
    assert checksums.from_base64(encoded) == crc


@pytest.mark.parametrize("bad", ["", "AAAA", "AAAAAAAA", "not base64!", "AAAAAA=x"])
def test_from_base64_refuses_what_is_not_a_crc(bad):
    with pytest.raises(ValueError):
        checksums.from_base64(bad)


def test_any_buffer_and_the_async_form():
    data = bytes(range(256)) * 5000  # over the off-loop threshold
    want = checksums.crc32c(data)
    assert checksums.crc32c(bytearray(data)) == want
    assert checksums.crc32c(memoryview(data)) == want
    assert checksums.crc32c(obstore.Bytes(data)) == want  # what an S3 or Azure GET returns
    assert checksums.crc32c(memoryview(data)[100:], checksums.crc32c(data[:100])) == want
    assert asyncio.run(checksums.crc32c_async(data)) == want
    assert asyncio.run(checksums.crc32c_async(data[:10])) == checksums.crc32c(data[:10])


def test_verify():
    crc = checksums.crc32c(b"abc")
    checksums.verify(checksums.to_base64(crc), crc, "k")
    checksums.verify(None, crc, "k")  # nothing to compare with
    with pytest.raises(IntegrityError, match="k: CRC32C mismatch"):
        checksums.verify(checksums.to_base64(crc ^ 1), crc, "k")
    with pytest.raises(IntegrityError, match="malformed"):
        checksums.verify("nope", crc, "k")
