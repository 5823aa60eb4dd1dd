"""The block delta: describe a new version of an object as ranges of objects the target holds
plus new bytes, and pack that description into the parts of one multipart upload. Pure: no IO.

``match`` pairs each chunk of the new version with a chunk of the same length and xxh3-128
digest in one of the *sources* — the object's own previous version, or other objects at the
target (an earlier checkpoint the new one shares tensors with) — wherever it was: a tensor
shifted by a grown header is found at its old offset. Sources are given in the caller's order
of preference; a chunk is taken from the first that has it.

``pack`` turns the resulting segments into upload parts that S3 accepts: every part but the
last at least 5 MiB, at most 10,000 parts. Copy runs shorter than that are sent as new bytes,
and a short run of new bytes borrows bytes from the copy run after it; the overhead is at most
one minimum part per changed region and is reported as ``bytes_sent - bytes_changed``.

With ``stage`` (S3 targets, which copy server-side), a short run of new bytes is not padded
with unchanged bytes sent again. The target builds a small staging object instead: a copy of
the minimum part's worth of unchanged bytes just before the run, then the new bytes as its
last part (S3 lets the last part be short); that object, copied whole, is one legal part of
the new version. Only the new bytes cross the network; the padding is copied twice at the
target. A short run at the very start (no unchanged bytes before it) is still padded.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import xxhash

from ..types import ByteRange

COPY_PIECE = 4 * 1024**3  # UploadPartCopy takes up to 5 GiB; + a merged remainder stays below


@dataclass(frozen=True, slots=True)
class Segment:
    """Bytes [start, end) of the new version: copied from source ``source`` at ``old_start``,
    or new bytes when ``old_start`` is None."""

    start: int
    end: int
    old_start: int | None = None
    # A staged run: its first ``stage`` bytes are the source's from ``old_start``, the rest
    # are new bytes (see the module's docstring).
    stage: int = 0
    source: int = 0  # index into the sources given to ``match``

    @property
    def length(self) -> int:
        return self.end - self.start


@dataclass(frozen=True, slots=True)
class Part:
    """One part of an upload: bytes ``rng`` of the new object, read from the source and sent,
    or, with ``old_start``, copied by the target from an object it holds. The one record of a
    part: a delta's plan, a copy in parts and a server-side copy in parts all lay out these."""

    number: int
    rng: ByteRange  # in the new version
    old_start: int | None = None  # a copy of the source's bytes from here; None: upload rng
    stage: int = 0  # > 0: staged; the first ``stage`` bytes copied, the rest new bytes
    source: int = 0  # which source a copy (or a staged part's copied bytes) comes from
    chunks: tuple[ByteRange, ...] = ()  # the chunks the part is hashed in; (): rng, whole
    first_chunk: int | None = None  # index of its first chunk in the object's chunk list

    @property
    def is_copy(self) -> bool:
        return self.old_start is not None and not self.stage

    @property
    def sent(self) -> int:
        return sent_bytes(self.rng.length, self.old_start, self.stage)

    @property
    def plain(self) -> bool:
        """All of its bytes cross the network (read from the source, sent whole)."""
        return self.old_start is None and not self.stage


def sent_bytes(length: int, old_start: int | None, stage: int) -> int:
    """Bytes of a part that cross the network: all of an uploaded part, none of a copied one,
    the new bytes after the copied ``stage`` of a staged one."""
    if old_start is None:
        return length
    return length - stage if stage else 0


@dataclass(frozen=True, slots=True)
class DeltaPlan:
    size: int
    bytes_changed: int  # bytes no old chunk matched
    parts: tuple[Part, ...]

    @property
    def bytes_sent(self) -> int:
        return sum(p.sent for p in self.parts)

    @property
    def bytes_reused(self) -> int:
        return self.size - self.bytes_sent

    def reused_by_source(self) -> dict[int, int]:
        """Bytes composed at the target, per source."""
        reused: dict[int, int] = {}
        for p in self.parts:
            if p.old_start is not None:
                took = p.rng.length - p.sent
                reused[p.source] = reused.get(p.source, 0) + took
        return reused

    def fingerprint(self, sources: Sequence[str] = ()) -> str:
        """Identifies the part layout and what it copies from (``sources``: one name per
        source, its key and version), so a resumed upload is only continued with the same."""
        text = ";".join(f"{p.rng.start},{p.rng.end},{p.old_start},{p.stage},{p.source}"
                        for p in self.parts)
        if sources:
            text += "|" + "|".join(sources)
        return "delta:" + xxhash.xxh3_64_hexdigest(text.encode())


Chunk = tuple[ByteRange, bytes]  # a chunk and its xxh3-128 digest


def match(new: Sequence[Chunk], *sources: Sequence[Chunk]) -> list[Segment]:
    """Segments covering the new version in order, each chunk copied from the first source
    that has it; adjacent ones merged where they continue each other (new after new; a copy
    that continues the previous copy's range in the same source)."""
    where: dict[tuple[int, bytes], tuple[int, int]] = {}
    for index, chunks in enumerate(sources):
        for rng, digest in chunks:
            where.setdefault((rng.length, digest), (index, rng.start))
    segments: list[Segment] = []
    for rng, digest in new:
        found = where.get((rng.length, digest)) if rng.length else None
        if found is None:
            _append(segments, Segment(rng.start, rng.end))
        else:
            _append(segments, Segment(rng.start, rng.end, found[1], source=found[0]))
    return segments


def _append(segments: list[Segment], s: Segment) -> None:
    if s.length == 0:
        return
    if segments:
        last = segments[-1]
        continues = not (last.stage or s.stage) and (
            (last.old_start is None and s.old_start is None) or (
                last.old_start is not None and s.old_start is not None
                and last.source == s.source and last.old_start + last.length == s.old_start))
        if continues and last.end == s.start:
            segments[-1] = Segment(last.start, s.end, last.old_start, source=last.source)
            return
    segments.append(s)


def pack(segments: Sequence[Segment], size: int, *, part_size: int, min_part: int,
         max_parts: int, stage: bool = False) -> DeltaPlan | None:
    """Parts for one multipart upload that rebuilds the new version from ``segments``, or None
    when no layout fits in ``max_parts`` (so many changed regions that a full upload is due)."""
    changed = sum(s.length for s in segments if s.old_start is None)
    runs = _with_min_parts(segments, min_part, stage)
    while True:
        parts = _split(runs, part_size, min_part)
        if len(parts) <= max_parts:
            return DeltaPlan(size, changed, tuple(parts))
        if part_size >= size:
            return None  # one part per run already
        part_size *= 2  # only for objects of tens of GiB with thousands of changed regions


def _with_min_parts(segments: Sequence[Segment], min_part: int, stage: bool) -> list[Segment]:
    # Copy runs too short to be a part are sent as new bytes; at the object's end one can be
    # the (short) last part.
    end = segments[-1].end if segments else 0
    runs: list[Segment] = []
    for s in segments:
        short = s.old_start is not None and s.length < min_part and s.end < end
        _append(runs, Segment(s.start, s.end, None) if short else s)
    # A run of new bytes too short to be a part (and not the object's end) takes bytes from
    # the copy run after it; a copy run left too short is taken whole.
    out: list[Segment] = []
    i = 0
    while i < len(runs):
        s = runs[i]
        short = s.old_start is None and s.length < min_part and i + 1 < len(runs)
        if short and stage and out and out[-1].old_start is not None and not out[-1].stage:
            # Stage it behind the unchanged bytes before it (a copy run, >= min_part).
            prev = out.pop()
            take = min_part if prev.length - min_part >= min_part else prev.length
            if take < prev.length:
                out.append(Segment(prev.start, prev.end - take, prev.old_start,
                                   source=prev.source))
            assert prev.old_start is not None
            out.append(Segment(prev.end - take, s.end, prev.old_start + prev.length - take,
                               stage=take, source=prev.source))
            i += 1
            continue
        if short:
            nxt = runs[i + 1]  # a copy run: runs alternate after merging
            assert nxt.old_start is not None
            need = min_part - s.length
            last = i + 2 == len(runs)  # what is left of the copy run may be a short last part
            if nxt.length - need >= min_part or (last and nxt.length > need):
                runs[i] = Segment(s.start, s.end + need, None)
                runs[i + 1] = Segment(nxt.start + need, nxt.end, nxt.old_start + need,
                                      source=nxt.source)
                _append(out, runs[i])
                i += 1
                continue
            merged = Segment(s.start, nxt.end, None)
            if i + 2 < len(runs):  # the new run after the copy joins too
                merged = Segment(s.start, runs[i + 2].end, None)
                del runs[i + 2]
            runs[i + 1] = merged
            i += 1
            continue
        _append(out, s)
        i += 1
    return out


def _split(runs: list[Segment], part_size: int, min_part: int) -> list[Part]:
    parts: list[Part] = []
    for s in runs:
        if s.stage:  # one part: a staging object copied whole
            parts.append(Part(len(parts) + 1, ByteRange(s.start, s.end), s.old_start,
                              s.stage, s.source))
            continue
        piece = part_size if s.old_start is None else COPY_PIECE
        pos = s.start
        while pos < s.end:
            end = min(pos + piece, s.end)
            if s.end - end < min_part:
                end = s.end  # a short remainder joins this piece rather than be a short part
            old = None if s.old_start is None else s.old_start + (pos - s.start)
            parts.append(Part(len(parts) + 1, ByteRange(pos, end), old, source=s.source))
            pos = end
    return parts


def changed_tensors(segments: Sequence[Segment],
                    tensors: Sequence[tuple[str, int, int]]) -> list[str]:
    """Names of the tensors with bytes no old chunk matched (``tensors``: name, start, end)."""
    fresh = [s for s in segments if s.old_start is None]
    names = []
    j = 0
    for name, start, end in tensors:
        while j < len(fresh) and fresh[j].end <= start:
            j += 1
        if j < len(fresh) and fresh[j].start < end and start < end:
            names.append(name)
    return names
