"""Content-defined chunking read window by window finds the boundaries one pass would, and an
insert shifts no boundary far from it."""

import asyncio
import random

import xxhash

from mcsync.chunking import CDC_MAX, cdc_cut
from mcsync.delta.read import scan_cdc
from mcsync.limits import Limits
from mcsync.stores.local import LocalStore

MiB = 1 << 20


def test_windowed_scan_matches_one_pass(tmp_path):
    data = random.Random(1).randbytes(41 * MiB + 77)
    (tmp_path / "f.bin").write_bytes(data)
    store = LocalStore(tmp_path)
    info = asyncio.run(store.head("f.bin"))
    chunks, digests = asyncio.run(scan_cdc(store, info, Limits(4, 256 * MiB), window=2 * CDC_MAX))
    lengths = cdc_cut(data, eof=True)
    assert [c.length for c in chunks] == lengths
    assert chunks[0].start == 0 and chunks[-1].end == len(data)
    assert digests == [xxhash.xxh3_128_digest(data[c.start:c.end]) for c in chunks]


def test_an_insert_keeps_the_boundaries_after_it():
    rnd = random.Random(2)
    old = rnd.randbytes(30 * MiB)
    new = old[:10 * MiB] + rnd.randbytes(1000) + old[10 * MiB:]

    def bounds(data: bytes, shift: int = 0) -> set[int]:
        pos, out = 0, set()
        for n in cdc_cut(data, eof=True):
            pos += n
            out.add(pos - shift)
        return out

    after_insert = {b for b in bounds(old) if b > 10 * MiB + CDC_MAX}
    assert after_insert and after_insert <= bounds(new, shift=1000)
