"""The copy of a pair's manifest that mcsync keeps at the target (``.mcsync/manifest-*.sqlite``).

A job on a fresh machine fetches it when the local manifest is missing; a run trusts the local
manifest in place of a target listing only while the target still holds the copy (one HEAD);
a run that changed something sends a new copy at its end, and a long run refreshes it as it
goes. A manifest takes ~200 bytes a key (20 GB at 100M keys), so the copy is sent from a
snapshot file a part at a time, and refreshed no more often than its sending cost allows.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from pathlib import Path

from ..config import SyncOptions
from ..errors import MCSyncError, NotFound
from ..limits import Limits
from ..move.upload import Journal, abort_left_open
from ..records import OpenUpload
from ..state.manifest import Manifest, pair_id
from ..state.shard import Shard, suffix
from ..stores.base import ReadStore, Store
from ..types import RESERVED_PREFIX, ObjectInfo, PartRef

log = logging.getLogger(__name__)

# A long run refreshes the copy this often, or less often when sending it takes long: after
# nine times as long as the last sending took, so it never takes over a tenth of the run.
REFRESH_EVERY_S = 300.0


def target_manifest_key(src: ReadStore, dst: ReadStore, shard: Shard | None = None) -> str:
    """Each shard's manifest has a copy of its own (1 of 1 keeps the pair's)."""
    return f"{RESERVED_PREFIX}manifest-{pair_id(src.url, dst.url)}{suffix(shard)}.sqlite"


async def _copy_of(src: ReadStore, dst: Store, shard: Shard | None = None) -> bytes | None:
    """The target's copy, or None when there is none; other errors raised (``fetch``)."""
    try:
        return bytes(await dst.get(target_manifest_key(src, dst, shard)))
    except NotFound:
        return None


async def fetch(src: ReadStore, dst: Store, shard: Shard | None = None) -> bytes | None:
    """The target's copy (the local manifest is missing), or None when there is none or it
    cannot be read (a warning: the run then lists the target instead)."""
    try:
        return await _copy_of(src, dst, shard)
    except MCSyncError as exc:
        log.warning("could not fetch the manifest copy at the target: %s", exc)
        return None


def install(data: bytes, path: Path) -> None:
    """Put a fetched copy in place as the local manifest (whole, or not at all)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".download")
    tmp.write_bytes(data)
    tmp.replace(path)
    log.info("manifest fetched from the target (%d bytes)", len(data))


async def _head_copy(src: ReadStore, dst: Store, limits: Limits | None = None,
                     shard: Shard | None = None) -> None:
    async with limits.requests if limits is not None else contextlib.nullcontext():
        await dst.head(target_manifest_key(src, dst, shard))


async def kept(src: ReadStore, dst: Store, limits: Limits | None = None,
               shard: Shard | None = None) -> bool:
    """Does the target still hold the copy? A manifest stands in for a listing of the target
    only then: a target emptied or replaced since (a wiped prefix, a new directory) is listed,
    not trusted."""
    try:
        await _head_copy(src, dst, limits, shard)
    except NotFound:
        log.info("%s holds no copy of this pair's manifest: listing it", dst.url)
        return False
    except (MCSyncError, OSError) as exc:
        log.warning("could not look for the manifest's copy at %s (%s): listing it",
                    dst.url, exc)
        return False
    return True


class Keeper:
    """Sends the copy of one run's manifest: ``send`` (at the end), ``refresh`` (while the run
    lasts, cancelled at its end)."""

    def __init__(self, src: ReadStore, dst: Store, manifest: Manifest, options: SyncOptions,
                 stale: OpenUpload | None = None) -> None:
        """``stale``: a killed run's upload of the copy, never to be finished."""
        self.dst = dst
        self.manifest = manifest
        self.options = options
        self.stale = stale
        self.key = target_manifest_key(src, dst, options.shard)

    async def abort_stale(self) -> None:
        """Abort the upload of the copy a killed run left (once)."""
        stale, self.stale = self.stale, None
        if stale is not None:
            await abort_left_open(self.dst, stale, self.manifest)

    async def refresh(self) -> None:
        took = 0.0
        while True:
            await asyncio.sleep(max(REFRESH_EVERY_S, 9 * took))
            began = time.monotonic()
            await self.send()
            took = time.monotonic() - began

    async def send(self) -> None:
        """A snapshot of the manifest to the target; a failure is logged, never the run's."""
        await self.abort_stale()
        import tempfile  # here, not at start-up: a run to a local target never needs it

        with tempfile.TemporaryDirectory(prefix="mcsync-manifest-") as tmp:
            snap = Path(tmp) / "manifest.sqlite"
            self.manifest.snapshot(snap)
            size = (await asyncio.to_thread(snap.stat)).st_size
            try:
                await send_file(self.dst, self.key, snap,
                                self.options.part_size_for(size, self.dst.caps), self.manifest)
            except (MCSyncError, OSError) as exc:
                log.warning("could not keep a copy of the manifest at the target: %s", exc)


async def send_file(dst: Store, key: str, path: Path, part_size: int,
                    journal: Journal | None = None) -> None:
    """Write the local file ``path`` to ``key`` holding at most one part of it in memory: a
    PUT when it fits in a part, else an upload journalled in ``journal`` while it is open (a
    killed run's is aborted by the next) and aborted on any failure."""
    size = (await asyncio.to_thread(path.stat)).st_size
    if size <= part_size:
        await dst.put(key, await asyncio.to_thread(path.read_bytes))
        return
    upload = await dst.open_upload(key, size)
    if journal is not None:
        journal.begin_upload(key, upload.upload_id, ObjectInfo(key, size, None, None), part_size)
    try:
        parts: list[PartRef] = []
        with open(path, "rb") as f:
            for number, offset in enumerate(range(0, size, part_size), start=1):
                data = await asyncio.to_thread(f.read, part_size)
                parts.append(await upload.put_part(number, offset, data))
        await upload.complete(parts)
    except BaseException:
        await asyncio.shield(upload.abort())
        raise
    finally:
        if journal is not None:
            journal.drop_upload(key)
