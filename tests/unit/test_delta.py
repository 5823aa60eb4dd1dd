"""The delta's pure logic: chunking, matching and part packing, checked by reconstruction."""

import itertools
import json
import random
import struct

import pytest
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

from mcsync.chunking import (
    NotSafetensors,
    fixed_chunks,
    group_parts,
    parse_safetensors,
    safetensors_chunks,
)
from mcsync.delta.match import Segment, changed_tensors, match, pack

# Small numbers stand in for S3's: a 64-byte "minimum part" exercises the same rules as 5 MiB.
MIN_PART = 64


def digests(data: bytes, chunks):
    return [(c, xxhash.xxh3_128_digest(data[c.start:c.end])) for c in chunks]


def rebuild(old: bytes, new: bytes, plan) -> bytes:
    """What the target does: copy parts from the old object, upload parts from the new."""
    out = bytearray()
    for p in plan.parts:
        if p.stage:  # a staging object: old bytes, then new bytes as its (short) last part
            assert p.stage >= MIN_PART
            out += old[p.old_start:p.old_start + p.stage]
            out += new[p.rng.start + p.stage:p.rng.end]
        elif p.is_copy:
            out += old[p.old_start:p.old_start + p.rng.length]
        else:
            out += new[p.rng.start:p.rng.end]
    return bytes(out)


def check_parts(plan, size: int, max_parts: int) -> None:
    assert plan.parts, "an upload needs at least one part"
    assert plan.parts[0].rng.start == 0 and plan.parts[-1].rng.end == size
    for a, b in zip(plan.parts, plan.parts[1:], strict=False):
        assert a.rng.end == b.rng.start
    for p in plan.parts[:-1]:
        assert p.rng.length >= MIN_PART, p
    assert [p.number for p in plan.parts] == list(range(1, len(plan.parts) + 1))
    assert len(plan.parts) <= max_parts
    assert plan.bytes_sent == sum(
        p.rng.length - p.stage if p.stage else (0 if p.is_copy else p.rng.length)
        for p in plan.parts)


@st.composite
def versions(draw):
    """An old byte string and a new one made from it by random edits: rewrites, inserts,
    deletes, appends and truncations."""
    rnd = random.Random(draw(st.integers(0, 2**32)))
    old = rnd.randbytes(draw(st.integers(MIN_PART, 3000)))
    new = bytearray(old)
    for _ in range(draw(st.integers(0, 6))):
        op = draw(st.sampled_from(["rewrite", "insert", "delete", "append", "truncate"]))
        pos = rnd.randrange(len(new) + 1)
        n = draw(st.integers(1, 200))
        if op == "rewrite":
            new[pos:pos + n] = rnd.randbytes(len(new[pos:pos + n]))
        elif op == "insert":
            new[pos:pos] = rnd.randbytes(n)
        elif op == "delete":
            del new[pos:pos + n]
        elif op == "append":
            new += rnd.randbytes(n)
        elif len(new) > n:
            del new[len(new) - n:]
    if len(new) == 0:
        new = bytearray(b"x")
    return old, bytes(new)


@settings(max_examples=300, deadline=None)
@given(versions(), st.sampled_from([16, 32, 64, 100]), st.sampled_from([64, 128, 300]))
def test_fixed_block_delta_rebuilds_the_new_version_exactly(pair, block, part_size):
    old, new = pair
    segs = match(digests(new, fixed_chunks(len(new), block)),
                 digests(old, fixed_chunks(len(old), block)))
    plan = pack(segs, len(new), part_size=part_size, min_part=MIN_PART, max_parts=10_000)
    check_parts(plan, len(new), 10_000)
    assert rebuild(old, new, plan) == new
    # Bytes sent beyond what changed: at most one minimum part per changed region.
    regions = sum(1 for s in segs if s.old_start is None)
    assert plan.bytes_sent <= plan.bytes_changed + regions * MIN_PART + MIN_PART


@settings(max_examples=200, deadline=None)
@given(versions(), st.integers(1, 8))
def test_packer_respects_the_part_count_limit(pair, max_parts):
    old, new = pair
    segs = match(digests(new, fixed_chunks(len(new), 16)), digests(old, fixed_chunks(len(old), 16)))
    plan = pack(segs, len(new), part_size=MIN_PART, min_part=MIN_PART, max_parts=max_parts)
    if plan is None:  # refused only when even one part per run would be too many
        unpacked = pack(segs, len(new), part_size=len(new), min_part=MIN_PART, max_parts=10**6)
        assert unpacked is not None and len(unpacked.parts) > max_parts
        return
    check_parts(plan, len(new), max_parts)
    assert rebuild(old, new, plan) == new


def test_an_unchanged_object_is_one_copy_and_nothing_is_sent():
    data = random.Random(1).randbytes(1000)
    chunks = digests(data, fixed_chunks(1000, 100))
    plan = pack(match(chunks, chunks), 1000, part_size=128, min_part=MIN_PART, max_parts=100)
    assert plan.bytes_sent == 0 and plan.bytes_changed == 0
    assert [(p.rng.start, p.rng.end, p.old_start) for p in plan.parts] == [(0, 1000, 0)]


def test_a_rewritten_block_is_sent_with_at_most_a_minimum_part_around_it():
    rnd = random.Random(2)
    old = rnd.randbytes(2000)
    new = bytearray(old)
    new[992:1008] = rnd.randbytes(16)  # exactly block 62
    new = bytes(new)
    segs = match(digests(new, fixed_chunks(2000, 16)), digests(old, fixed_chunks(2000, 16)))
    plan = pack(segs, 2000, part_size=128, min_part=MIN_PART, max_parts=100)
    assert plan.bytes_changed == 16
    assert 16 <= plan.bytes_sent <= MIN_PART
    assert rebuild(old, new, plan) == new


# -- safetensors ----------------------------------------------------------------------------


def safetensors(tensors: dict[str, bytes], metadata: dict | None = None) -> bytes:
    header: dict = {"__metadata__": metadata} if metadata else {}
    pos = 0
    for name, data in tensors.items():
        header[name] = {"dtype": "U8", "shape": [len(data)], "data_offsets": [pos, pos + len(data)]}
        pos += len(data)
    raw = json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw + b"".join(tensors.values())


def st_digests(data: bytes, block: int):
    header = parse_safetensors(data, len(data))
    return digests(data, safetensors_chunks(header, block)), header


def test_safetensors_chunks_follow_tensors_and_cover_the_file():
    rnd = random.Random(3)
    data = safetensors({"a": rnd.randbytes(250), "b": rnd.randbytes(10), "c": b""})
    header = parse_safetensors(data, len(data))
    chunks = safetensors_chunks(header, 100)
    assert chunks[0].start == 0
    assert [c.length for c in chunks[-4:]] == [100, 100, 50, 10]
    assert all(a.end == b.start for a, b in itertools.pairwise(chunks))
    assert chunks[-1].end == len(data)


def test_a_tensor_added_keeps_every_other_tensor_reused_at_its_old_offset():
    rnd = random.Random(4)
    tensors = {f"layer.{i}.weight": rnd.randbytes(400) for i in range(10)}
    old = safetensors(tensors)
    grown = dict(tensors)
    grown["extra.bias"] = rnd.randbytes(40)
    new = safetensors(dict(sorted(grown.items())), metadata={"step": "1200"})
    new_chunks, header = st_digests(new, 128)
    old_chunks, _ = st_digests(old, 128)
    segs = match(new_chunks, old_chunks)
    plan = pack(segs, len(new), part_size=256, min_part=MIN_PART, max_parts=1000)
    check_parts(plan, len(new), 1000)
    assert rebuild(old, new, plan) == new
    assert plan.bytes_reused >= 4000 - 10 * MIN_PART  # every old tensor, less part fixups
    names = changed_tensors(segs, [(t.name, t.start, t.end) for t in header.tensors])
    assert names == ["extra.bias"]


def test_rewritten_tensors_are_named():
    rnd = random.Random(5)
    tensors = {f"t{i}": rnd.randbytes(300) for i in range(8)}
    old = safetensors(tensors)
    tensors["t3"] = rnd.randbytes(300)
    new = safetensors(tensors)
    new_chunks, header = st_digests(new, 100)
    segs = match(new_chunks, st_digests(old, 100)[0])
    assert changed_tensors(segs, [(t.name, t.start, t.end) for t in header.tensors]) == ["t3"]
    plan = pack(segs, len(new), part_size=256, min_part=MIN_PART, max_parts=1000)
    assert rebuild(old, new, plan) == new
    assert plan.bytes_changed == 300


@pytest.mark.parametrize("data, why", [
    (b"\x01\x00", "shorter than 8"),
    (struct.pack("<Q", 10**12) + b"{}", "does not fit"),
    (struct.pack("<Q", 4) + b"nope", "not JSON"),
    (struct.pack("<Q", 2) + b"[]", "not a JSON object"),
    (safetensors({"a": b"xy"})[:-1], "out of range"),
    (safetensors({"a": b"xy"}) + b"z", "data section"),
])
def test_malformed_safetensors_headers_are_refused(data, why):
    with pytest.raises(NotSafetensors, match=why):
        parse_safetensors(data, len(data))


def test_overlapping_tensors_are_refused():
    raw = json.dumps({"a": {"data_offsets": [0, 4]}, "b": {"data_offsets": [2, 6]}}).encode()
    data = struct.pack("<Q", len(raw)) + raw + bytes(6)
    with pytest.raises(NotSafetensors, match="gap or overlap"):
        parse_safetensors(data, len(data))


def test_parts_group_whole_chunks():
    chunks = fixed_chunks(1000, 30)
    groups = group_parts(chunks, 100)
    assert groups[0] == (0, 4)  # 4 x 30 = 120 >= 100
    assert groups[-1][1] == len(chunks)
    assert all(a[1] == b[0] for a, b in itertools.pairwise(groups))


def test_the_fingerprint_names_the_part_layout():
    data = random.Random(6).randbytes(1000)
    chunks = digests(data, fixed_chunks(1000, 100))
    same = pack(match(chunks, chunks), 1000, part_size=128, min_part=MIN_PART, max_parts=100)
    again = pack(match(chunks, chunks), 1000, part_size=128, min_part=MIN_PART, max_parts=100)
    other = pack([Segment(0, 1000, None)], 1000, part_size=128, min_part=MIN_PART, max_parts=100)
    assert same is not again and same.fingerprint() == again.fingerprint()
    assert same.fingerprint() != other.fingerprint()


@settings(max_examples=300, deadline=None)
@given(versions(), st.sampled_from([16, 32, 64]), st.sampled_from([64, 128, 300]))
def test_staged_packing_rebuilds_exactly_and_sends_only_new_bytes(pair, block, part_size):
    old, new = pair
    segs = match(digests(new, fixed_chunks(len(new), block)),
                 digests(old, fixed_chunks(len(old), block)))
    plan = pack(segs, len(new), part_size=part_size, min_part=MIN_PART, max_parts=10_000,
                stage=True)
    check_parts(plan, len(new), 10_000)
    assert rebuild(old, new, plan) == new
    # The bound: changed bytes plus at most one minimum part per changed region.
    # Staging does not promise less: a copy run shortened by the padding of the change before
    # it can be left too short to stage the next change behind (hypothesis found such cases).
    # A run of old bytes shorter than a minimum part cannot be a part copy, so it is sent like
    # a change, new bytes or not (hypothesis found new = old[:32] + old[128:], nothing new).
    regions = sum(1 for s in segs if s.old_start is None or s.end - s.start < MIN_PART)
    assert plan.bytes_sent <= plan.bytes_changed + MIN_PART * regions


def test_a_copy_run_shorter_than_a_part_is_sent_though_nothing_is_new():
    old = random.Random(13608).randbytes(270)
    new = old[:32] + old[128:]
    segs = match(digests(new, fixed_chunks(len(new), 16)), digests(old, fixed_chunks(270, 16)))
    assert [s.old_start for s in segs] == [0, 128]
    plan = pack(segs, len(new), part_size=64, min_part=MIN_PART, max_parts=100, stage=True)
    assert rebuild(old, new, plan) == new
    assert plan.bytes_changed == 0 and plan.bytes_sent == MIN_PART


def test_scattered_small_changes_are_staged_not_padded():
    rnd = random.Random(8)
    old = rnd.randbytes(4000)
    new = bytearray(old)
    for pos in (704, 1600, 2496, 3392):  # 16-byte blocks far apart
        new[pos:pos + 16] = rnd.randbytes(16)
    new = bytes(new)
    segs = match(digests(new, fixed_chunks(4000, 16)), digests(old, fixed_chunks(4000, 16)))
    padded = pack(segs, 4000, part_size=128, min_part=MIN_PART, max_parts=100)
    staged = pack(segs, 4000, part_size=128, min_part=MIN_PART, max_parts=100, stage=True)
    assert rebuild(old, new, staged) == new == rebuild(old, new, padded)
    assert staged.bytes_changed == staged.bytes_sent == 64
    assert padded.bytes_sent == 4 * MIN_PART
    assert sum(1 for p in staged.parts if p.stage) == 4


def rebuild_from(sources: list[bytes], new: bytes, plan) -> bytes:
    """``rebuild`` with parts copied from several objects at the target."""
    out = bytearray()
    for p in plan.parts:
        src = sources[p.source]
        if p.stage:
            out += src[p.old_start:p.old_start + p.stage]
            out += new[p.rng.start + p.stage:p.rng.end]
        elif p.is_copy:
            out += src[p.old_start:p.old_start + p.rng.length]
        else:
            out += new[p.rng.start:p.rng.end]
    return bytes(out)


@st.composite
def spliced(draw):
    """Several objects at the target, and a new one made of blocks taken from any of them (at
    any block offset) and blocks of new bytes: a checkpoint sharing tensors with several
    earlier ones, or a renamed file."""
    rnd = random.Random(draw(st.integers(0, 2**32)))
    block = 16
    sources = [rnd.randbytes(block * draw(st.integers(1, 40))) for _ in range(draw(
        st.integers(1, 4)))]
    new = bytearray()
    for _ in range(draw(st.integers(1, 60))):
        if draw(st.booleans()):
            src = sources[rnd.randrange(len(sources))]
            at = rnd.randrange(len(src) // block) * block
            new += src[at:at + block]
        else:
            new += rnd.randbytes(block)
    return sources, bytes(new), block


@settings(max_examples=300, deadline=None)
@given(spliced(), st.booleans(), st.sampled_from([64, 128, 300]))
def test_a_delta_from_several_objects_rebuilds_exactly(case, stage, part_size):
    sources, new, block = case
    segs = match(digests(new, fixed_chunks(len(new), block)),
                 *(digests(s, fixed_chunks(len(s), block)) for s in sources))
    plan = pack(segs, len(new), part_size=part_size, min_part=MIN_PART, max_parts=10_000,
                stage=stage)
    check_parts(plan, len(new), 10_000)
    assert rebuild_from(sources, new, plan) == new
    assert sum(plan.reused_by_source().values()) == plan.bytes_reused
    assert set(plan.reused_by_source()) <= set(range(len(sources)))


def test_a_chunk_in_several_sources_comes_from_the_first():
    rnd = random.Random(3)
    base = rnd.randbytes(640)
    fresh = rnd.randbytes(640)
    new = base[:320] + fresh[320:]  # half from both candidates, half from the second only
    own = digests(base, fixed_chunks(640, 64))
    other = digests(base[:320] + fresh[320:], fixed_chunks(640, 64))
    segs = match(digests(new, fixed_chunks(640, 64)), own, other)
    assert [(s.start, s.end, s.source) for s in segs] == [(0, 320, 0), (320, 640, 1)]
    plan = pack(segs, 640, part_size=128, min_part=MIN_PART, max_parts=100)
    assert plan.reused_by_source() == {0: 320, 1: 320} and plan.bytes_sent == 0
    assert rebuild_from([base, base[:320] + fresh[320:]], new, plan) == new


def test_a_renamed_object_is_one_copy_from_its_old_name():
    data = random.Random(4).randbytes(1000)
    chunks = digests(data, fixed_chunks(1000, 100))
    plan = pack(match(chunks, [], chunks), 1000, part_size=128, min_part=MIN_PART, max_parts=9)
    assert [(p.old_start, p.source, p.rng.length) for p in plan.parts] == [(0, 1, 1000)]


def test_the_fingerprint_names_the_sources():
    data = random.Random(5).randbytes(300)
    chunks = digests(data, fixed_chunks(300, 100))
    plan = pack(match(chunks, chunks), 300, part_size=128, min_part=MIN_PART, max_parts=9)
    assert plan.fingerprint(["a@e1"]) != plan.fingerprint(["a@e2"]) != plan.fingerprint()
