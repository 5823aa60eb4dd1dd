"""Decide, per key, what a sync does. Pure: no IO, so every rule is unit-testable."""

from __future__ import annotations

import re

from ..checkpoints.frameworks import is_commit_marker
from ..config import SyncOptions
from ..events import ActionKind
from ..records import Action, ManifestEntry, Pair
from ..state.shard import holds
from ..types import RESERVED_PREFIX, ObjectInfo

_PLAIN_MD5 = re.compile(r"[0-9a-f]{32}")

# S3 LastModified has one-second precision: a file uploaded within the second it was written
# lists as "older" than its source. Times this close count as equal (rclone's modify window).
MODIFY_WINDOW_S = 1.0
def plan(pair: Pair, options: SyncOptions, *, server_side: bool,
         target_listed: bool = True, files: bool = False) -> Action | None:
    """The action for one key, or None when the key is not ours to touch (filtered out, or a
    target-only key without --delete, or another shard's key). ``target_listed`` is False when
    the manifest stands in for a listing of the target; ``files``: the target is a file
    system."""
    if pair.key.startswith(RESERVED_PREFIX) or not options.selects(pair.key):
        return None
    if (options.shard is not None and not holds(options.shard, pair.key)
            and not is_commit_marker(pair.key)):
        # Another shard's: it copies, skips, records and deletes it. A marker is every
        # shard's: the last to finish writes it (``markers``), and each deletes it before
        # the files it names.
        return None
    src, dst, known = pair.src, pair.dst, pair.known
    if src is None:
        if dst is None:
            return None  # only the manifest knows it; deletes need a listing of the target
        return Action("delete", pair.key, None, dst, "not at source") if options.delete else None
    if files and src.size == 0 and pair.key.endswith("/"):
        # An S3 "directory marker" (a console's "Create folder"): a file system holds the
        # directory, made with the first file under it; no file can have that name.
        return Action("skip", pair.key, src, None, "a directory marker: no file to write")
    copy: ActionKind = "server_copy" if server_side else "copy"
    if options.checksum and dst is not None:
        return _by_content(pair.key, src, dst, known, copy)
    if known is not None and known.matches_source(src):
        if not target_listed:
            return Action("skip", pair.key, src, None, "unchanged since last sync")
        if dst is None:
            return Action(copy, pair.key, src, None, "missing at target")
        if known.matches_target(dst):
            return Action("skip", pair.key, src, dst, "unchanged since last sync")
        return Action(copy, pair.key, src, dst, "target changed behind mcsync's back")
    if known is not None:
        delta_from = known if copy == "copy" and options.delta else None
        return Action(copy, pair.key, src, dst, "source changed since last sync", delta_from)
    if dst is None:
        return Action(copy, pair.key, src, None, "new" if target_listed else "not in manifest")
    if src.size != dst.size:
        return Action(copy, pair.key, src, dst, "size differs")
    if pair.journalled:
        # A killed run may have completed it and died before recording it: the transfer
        # recognises that upload's result (and keeps its chunk digests) or sends it again.
        return Action(copy, pair.key, src, dst, "a killed run's upload: its journal decides")
    if src.etag and dst.etag and src.etag == dst.etag:
        return Action("skip", pair.key, src, dst, "same etag")
    if src.mtime is not None and dst.mtime is not None and dst.mtime + MODIFY_WINDOW_S > src.mtime:
        # Same size and the target was written after the source last changed: the rule of
        # `aws s3 sync`, for objects mcsync has no record of.
        return Action("skip", pair.key, src, dst, "same size, target not older")
    return Action(copy, pair.key, src, dst, "source is newer")


def _by_content(key: str, src: ObjectInfo, dst: ObjectInfo, known: ManifestEntry | None,
                copy: ActionKind) -> Action:
    """--checksum: skip only on evidence that the bytes are equal; mtimes count for nothing."""
    if src.size != dst.size:
        return Action(copy, key, src, dst, "size differs")
    if src.size == 0:
        return Action("skip", key, src, dst, "both empty")
    if src.etag and dst.etag and src.etag == dst.etag:
        # An S3 ETag is derived from the content (MD5, or MD5 of the parts' MD5s).
        return Action("skip", key, src, dst, "same etag")
    if (known is not None and known.xxh3 is not None and src.etag is not None
            and known.matches_source(src) and known.matches_target(dst)):
        # The source's ETag names the content mcsync hashed when it wrote the target, and the
        # target's ETag says it was not rewritten since.
        return Action("skip", key, src, dst, "unchanged since last sync (recorded hashes)")
    if known is not None and src.etag is not None:
        from_source, as_written = known.matches_source(src), known.matches_target(dst)
        if from_source and not as_written:
            return Action(copy, key, src, dst, "target changed behind mcsync's back")
        if as_written and not from_source:
            return Action(copy, key, src, dst, "source changed since last sync")
    if (src.etag and dst.etag and _PLAIN_MD5.fullmatch(src.etag)
            and _PLAIN_MD5.fullmatch(dst.etag)):
        return Action(copy, key, src, dst, "content differs (MD5 ETags)")
    return Action("compare", key, src, dst, "same size: comparing content")
