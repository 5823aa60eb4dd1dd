"""Sending a block delta: a changed object that mcsync wrote before is rebuilt at the target
from the version it holds plus the new bytes, in one upload (``delta_planner`` plans it).

Here: the parts the target composes — ranged part copies from its current version,
and *staged* parts (a short run of new bytes behind a minimum part's worth of copied bytes,
built as a scratch object under ``.mcsync/stage/`` and copied whole into the upload) — the
fallback to a full upload when a target refuses ranged part copies (found out once per run),
and the sweep of the staging space a killed run left.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import xxhash

from ..config import SyncOptions
from ..delta.match import Part
from ..delta.planner import DeltaFound, Holdings
from ..errors import ComposeRefused, MCSyncError, Permanent, PreconditionFailed
from ..events import Event
from ..limits import Limits
from ..records import Action, OpenUpload, WrittenPart
from ..state.shard import Shard, suffix
from ..stores.base import (
    Composer,
    CopySource,
    PartCopyUpload,
    ReadStore,
    ScratchSpace,
    ServerSideCopier,
    Store,
    Upload,
)
from ..types import RESERVED_PREFIX, ByteRange, ObjectInfo
from .context import RunContext
from .upload import MovePart, Uploaded, UploadPlan, Uploads

log = logging.getLogger(__name__)

STAGING_PREFIX = f"{RESERVED_PREFIX}stage/"  # a block delta's staging objects at the target


def staging_space(shard: Shard | None) -> str:
    """Where one run's staging objects live: a shard has its own, beside (not under) the
    unsharded run's, so a shard's sweep after a kill never clears another's part in flight."""
    tag = suffix(shard)
    return f"{RESERVED_PREFIX}stage{tag}/" if tag else STAGING_PREFIX


@dataclass(frozen=True, slots=True)
class Composed:
    """A delta that was sent: its plan, the upload's result, and the bytes composed at the
    target instead of sent (in all, and from the object's own previous version)."""

    found: DeltaFound
    uploaded: Uploaded
    reused: int
    reused_own: int


@dataclass
class DeltaSender:
    """Sends the block deltas of one run, as their planner laid them out."""

    ctx: RunContext
    known: Holdings | None = None  # told of an object composed from that went away
    # The target refused a ranged part copy: no more deltas this run.
    refused: bool = field(default=False, init=False)
    _stage_creates: set[asyncio.Future[PartCopyUpload]] = field(default_factory=set, init=False)
    # The run's, read once from ``ctx``.
    src: ReadStore = field(init=False)
    dst: Store = field(init=False)
    options: SyncOptions = field(init=False)
    limits: Limits = field(init=False)
    emit: Callable[[Event], None] = field(init=False)

    def __post_init__(self) -> None:
        c = self.ctx
        self.src, self.dst, self.options, self.limits, self.emit = (c.src, c.dst, c.options,
                                                                    c.limits, c.emit)

    async def send(self, action: Action, src: ObjectInfo, found: DeltaFound,
                   prior: OpenUpload | None, uploads: Uploads, send_part: MovePart, *,
                   streamed: bool) -> Composed | str:
        """Send only what changed and have the target compose the rest, or say why not (the
        caller then sends the object whole). ``send_part`` moves a part of new bytes
        (``streamed``: into a file as they arrive, holding a few pieces of memory)."""
        if self.refused:
            return "the target refused ranged part copies"
        self.emit(found.event(action.key))
        key, dst = action.key, self.dst
        assert isinstance(dst, Composer)  # plan() said so
        sources = [dst.compose_source(b.info) for b in found.bases]
        specs = found.plan.parts
        staged = any(spec.stage for spec in specs)
        if staged:  # what a killed run of this key left (a lock keeps other runs away)
            await self.clear_staging(key)

        async def move(spec: Part, upload: Upload) -> WrittenPart:
            if spec.old_start is None:
                return await send_part(spec, upload)
            base = found.bases[spec.source]
            try:
                if spec.stage:
                    return await self._staged_part(key, src, upload, spec, sources[spec.source])
                old = ByteRange(spec.old_start, spec.old_start + spec.rng.length)
                return await self._copy_part(key, upload, spec, sources[spec.source], old)
            except PreconditionFailed:
                # The base is no longer the version recorded, or is gone: never compose from
                # it again.
                # Raised on, the object is planned afresh (transfer), without it.
                if self.known is not None:
                    self.known.gone(base.key)
                log.info("%s: %s changed or went away behind mcsync's back; not composing "
                         "from it", key, base.key)
                raise

        plan = UploadPlan(key, src, specs, self.options.part_size_for(src.size, dst.caps),
                          found.fingerprint(), streamed=streamed)
        try:
            uploaded = await uploads.run(plan, prior, move, n_chunks=len(found.layout.chunks))
        except ComposeRefused as exc:
            self.refused = True
            log.warning("%s; sending changed objects whole from now on", exc)
            await self.clear_staging(key)
            return "the target refused ranged part copies"
        except (MCSyncError, OSError):
            if staged:  # a part cancelled while its staging upload was being created
                await self.clear_staging(key)
            raise
        reused = sum(spec.rng.length - spec.sent for spec in specs)
        return Composed(found, uploaded, reused, found.reused_from_own())

    async def _copy_part(self, key: str, upload: Upload, spec: Part, source: CopySource,
                         old: ByteRange) -> WrittenPart:
        assert isinstance(upload, PartCopyUpload)  # a Composer's upload
        async with self.limits.requests:
            with _refusal_means_no_compose(self.dst.url, key):
                ref = await upload.copy_part(spec.number, spec.rng.start, source, old)
        return WrittenPart.of(ref)  # no byte passed through us

    async def _staged_part(self, key: str, src: ObjectInfo, upload: Upload, spec: Part,
                           source: CopySource) -> WrittenPart:
        """A part of unchanged bytes followed by a few new ones, built at the target: a staging
        object under .mcsync/ gets the unchanged bytes by copy and the new bytes as its short
        last part, and is then copied whole into the upload and deleted."""
        assert spec.old_start is not None
        dst = self.dst
        assert isinstance(dst, ServerSideCopier) and isinstance(upload, PartCopyUpload)
        stage_key = (f"{self._staging_prefix(key)}"
                     f"{xxhash.xxh3_64_hexdigest(upload.upload_id.encode())}-{spec.number}")
        new = ByteRange(spec.rng.start + spec.stage, spec.rng.end)
        # Shielded: a part cancelled while its staging upload is being created must not leave
        # an upload the server creates after we stopped listening; clear_staging waits for it.
        create = asyncio.ensure_future(dst.open_upload(stage_key, spec.rng.length))
        self._stage_creates.add(create)
        create.add_done_callback(self._stage_creates.discard)
        async with self.limits.requests:
            staging = await asyncio.shield(create)
        try:
            async with self.limits.requests:
                with _refusal_means_no_compose(self.dst.url, key):
                    first = await staging.copy_part(
                        1, 0, source, ByteRange(spec.old_start, spec.old_start + spec.stage))
            async with self.limits.requests:
                data = await self.src.get(key, new, expect=src)
                second = await staging.put_part(2, spec.stage, data)
            del data
            async with self.limits.requests:
                staged = await staging.complete([first, second])
        except BaseException:
            await asyncio.shield(staging.abort())
            raise
        try:
            async with self.limits.requests:
                with _refusal_means_no_compose(self.dst.url, key):
                    ref = await upload.copy_part(
                        spec.number, spec.rng.start, dst.copy_source(stage_key, staged.etag),
                        ByteRange(0, spec.rng.length))
            return WrittenPart.of(ref)
        finally:
            with contextlib.suppress(MCSyncError, OSError):
                async with self.limits.requests:
                    await asyncio.shield(dst.delete(stage_key))

    async def clear_staging(self, key: str) -> None:
        await self._clear(self._staging_prefix(key))

    async def sweep(self) -> None:
        """After an interrupted run: the staging objects a killed delta of this run's pair
        (or shard) may have left."""
        await self._clear(staging_space(self.options.shard))

    def _staging_prefix(self, key: str) -> str:
        """Where the staging objects of ``key``'s delta live."""
        return f"{staging_space(self.options.shard)}{xxhash.xxh3_64_hexdigest(key.encode())}-"

    async def _clear(self, prefix: str) -> None:
        if not isinstance(self.dst, ScratchSpace):
            return
        if self._stage_creates:  # let creates in flight land, so the listing below sees them
            await asyncio.gather(*self._stage_creates, return_exceptions=True)
        try:
            async with self.limits.requests:
                await asyncio.shield(self.dst.clear(prefix))
        except (MCSyncError, OSError) as exc:
            log.warning("could not clear %s at the target: %s", prefix, exc)


@contextlib.contextmanager
def _refusal_means_no_compose(target: str, key: str) -> Iterator[None]:
    """A ranged part copy the target answers with a permanent error (not implemented, not
    allowed): this target does not compose; the delta falls back to a full upload."""
    try:
        yield
    except Permanent as exc:
        raise ComposeRefused(f"{target}: a ranged part copy for {key} was refused: "
                             f"{exc}") from exc

