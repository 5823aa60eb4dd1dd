"""A part hashed piece by piece as it streams gives the digests of hashing it whole."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mcsync.hashing import chunk_digests
from mcsync.streaming import ChunkHasher
from mcsync.types import ByteRange


@given(
    base=st.integers(0, 1 << 40),
    lengths=st.lists(st.integers(1, 300), min_size=1, max_size=8),
    cuts=st.lists(st.integers(0, 2400), max_size=12),
    seed=st.integers(0, 255),
)
def test_piecewise_digests_equal_whole_part_digests(base, lengths, cuts, seed):
    size = sum(lengths)
    data = bytes((seed + i * 7) % 256 for i in range(size))
    chunks, pos = [], base
    for n in lengths:
        chunks.append(ByteRange(pos, pos + n))
        pos += n
    hasher = ChunkHasher(chunks)
    edges = sorted({0, size, *(c for c in cuts if c <= size)})
    for a, b in itertools.pairwise(edges):
        hasher.update(data[a:b])
    assert hasher.digests() == chunk_digests(data, base, chunks)


def test_a_part_that_comes_back_short_or_long_is_refused():
    chunks = [ByteRange(0, 4), ByteRange(4, 10)]
    short = ChunkHasher(chunks)
    short.update(b"123456789")
    with pytest.raises(ValueError, match="fewer"):
        short.digests()
    with pytest.raises(ValueError, match="more"):
        ChunkHasher(chunks).update(b"12345678901")
