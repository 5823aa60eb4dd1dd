"""The typed result of a sync: what the library returns and what ``--json`` prints."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field, fields
from typing import Any, Literal

from .bottleneck import LimitedBy

ResultAction = Literal["copy", "server_copy", "delete"]
# The report names at most this many objects changed and this many failures (the first ones);
# every one is counted all the same (``objects_*``, ``*_not_listed``). A run of a million
# keys must not hold a million results: memory stays flat in the number of keys.
MAX_LISTED_OBJECTS = 10_000
MAX_LISTED_FAILURES = 10_000


@dataclass(frozen=True, slots=True)
class ObjectResult:
    """One object the run changed at the target."""

    key: str
    action: ResultAction
    size: int
    bytes_sent: int  # bytes that went through this client to the target
    xxh3_128: str | None = None  # digest of the bytes moved; None for server-side copies/deletes
    hash_block_size: int | None = None  # digest = leaf if one block, else xxh3_128(leaves)
    etag: str | None = None  # the target's ETag after the write
    bytes_reused: int = 0  # composed at the target from objects it holds (block delta)
    bytes_changed: int | None = None  # new bytes (the whole object unless sent as a delta)
    bytes_reused_own: int = 0  # of bytes_reused: from the key's own previous version
    reused_from: tuple[tuple[str, int], ...] = ()  # (key, bytes composed from it)

    def to_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in _RESULT_FIELDS}


_RESULT_FIELDS = tuple(f.name for f in fields(ObjectResult))


@dataclass(frozen=True, slots=True)
class ObjectFailure:
    """One object the run could not bring to the target; the rest of the run went on."""

    key: str
    error: str  # what went wrong, one line
    # The cause's class in mcsync.errors ("AccessDenied", "Throttled", "IntegrityError"...;
    # "OSError", "InternalError"), see errors.failure_kind. None: no error of its own (a
    # checkpoint marker held back because other objects failed, a --verify mismatch).
    kind: str | None = None
    retryable: bool = False  # whether the same object may succeed on a later run

    # The report's failures were (key, error) pairs before they had a kind: they still
    # unpack as one, so ``dict(report.failures)`` and ``key, error = failure`` keep working.
    def __iter__(self) -> Iterator[str]:
        return iter((self.key, self.error))

    def __getitem__(self, index: int) -> str:
        return (self.key, self.error)[index]

    def to_dict(self) -> dict[str, Any]:
        return {"key": self.key, "error": self.error, "kind": self.kind,
                "retryable": self.retryable}


@dataclass(frozen=True, slots=True)
class SettledConcurrency:
    """``--concurrency auto``: what a run's tuning settled on (the limits at its end) and the
    most each was allowed (``limits.GoodputSlots``)."""

    objects: int  # objects in flight at once
    objects_peak: int
    parts: int  # data-bearing requests (parts, large objects) on the wire at once
    parts_peak: int

    def to_dict(self) -> dict[str, int]:
        return {"objects": self.objects, "objects_peak": self.objects_peak,
                "parts": self.parts, "parts_peak": self.parts_peak}

    def describe(self) -> str:
        return (f"--concurrency auto settled on {self.objects} objects and {self.parts} parts "
                f"in flight (at most {self.objects_peak} and {self.parts_peak})")


@dataclass(frozen=True, slots=True)
class RunTotals:
    """What a run knows of itself at its end, beyond its events: handed to the report's
    builder (``events.StatsCollector.finish``), the one place a report is filled in."""

    interrupted: bool = False
    manifest: str | None = None
    manifest_note: str | None = None
    objects_compared: int = 0
    bytes_compared: int = 0
    requests_throttled: int = 0
    requests_retried: int = 0
    requests_credentials_expired: int = 0
    requests_in_flight_low: int | None = None
    requests_in_flight_end: int | None = None
    parts_in_flight_peak: int = 0
    parts_in_flight_limit_peak: int = 0
    tasks: int = 0
    tasks_retried: int = 0
    retried_tasks: tuple[str, ...] = ()
    limited_by: LimitedBy | None = None
    deferred_until: float | None = None
    concurrency: SettledConcurrency | None = None


@dataclass
class SyncReport:
    """A run's report; filled in by ``events.StatsCollector`` alone."""

    src: str
    dst: str
    dry_run: bool = False
    objects_copied: int = 0  # through the client
    objects_server_copied: int = 0
    objects_skipped: int = 0
    objects_deleted: int = 0
    objects_failed: int = 0
    # Not copied by design this run (a checkpoint not complete yet, a file still being
    # written): a later run picks them up. Not failures.
    objects_deferred: int = 0
    bytes_deferred: int = 0
    # When the first file deferred for its age alone (--min-age) comes of age (Unix time): a
    # watch starts its next cycle then.
    deferred_until: float | None = None
    bytes_copied: int = 0  # size of the objects copied through the client
    bytes_sent: int = 0  # bytes this run really sent (less than bytes_copied when resumed)
    bytes_server_copied: int = 0
    bytes_skipped: int = 0
    # The block delta: bytes of copied objects that were new (no old chunk matched), and bytes
    # the target composed from objects it held, split into those from the key's own previous
    # version and those from other objects (a new checkpoint from earlier ones). A full copy
    # counts as all changed.
    bytes_changed: int = 0
    bytes_reused: int = 0
    bytes_reused_same_key: int = 0
    bytes_reused_cross_object: int = 0
    # --checksum: objects whose bytes were read and hashed to decide skip or copy, and the
    # bytes read for it (source, and target where no recorded hash stood in for it)
    objects_compared: int = 0
    bytes_compared: int = 0
    # Resilience: answers that said slow down, requests tried again (for any transient
    # cause), the fewest requests in flight to a store that throttling left, the most parts
    # that were on the wire at once, and the most the goodput limit ever allowed.
    requests_throttled: int = 0
    requests_retried: int = 0
    requests_credentials_expired: int = 0  # refused for expired keys, renewed and retried
    requests_in_flight_low: int | None = None
    requests_in_flight_end: int | None = None  # ...and where it had grown back to at the end
    parts_in_flight_peak: int = 0
    parts_in_flight_limit_peak: int = 0
    # --workers: the tasks (batches of whole objects) worker processes ran, those given to a
    # fresh pool because a worker process died (a pool breaks whole: the tasks of the other
    # workers in flight too), and each of those named (the first 1000: "task 7 (32 objects,
    # a/0001 .. a/0032): a worker process died (...); run again on a fresh pool").
    tasks: int = 0
    tasks_retried: int = 0
    retried_tasks: tuple[str, ...] = ()
    elapsed_s: float = 0.0
    # What bounded the throughput, judged from what the run measured (bottleneck.py); None
    # for a dry run
    limited_by: LimitedBy | None = None
    # --concurrency auto: what the tuning settled on; None for a fixed --concurrency
    concurrency: SettledConcurrency | None = None
    failures: list[ObjectFailure] = field(default_factory=list)  # the first MAX_LISTED_FAILURES
    deferred: list[tuple[str, str]] = field(default_factory=list)  # (key, why), the first 1000
    objects: list[ObjectResult] = field(default_factory=list)  # the first MAX_LISTED_OBJECTS
    objects_not_listed: int = 0  # changed objects past that cap: counted, not named
    failures_not_listed: int = 0  # failures past MAX_LISTED_FAILURES: counted, not named
    interrupted: bool = False
    manifest: str | None = None
    manifest_note: str | None = None  # e.g. a damaged manifest was set aside and rebuilt
    latest_checkpoint: str | None = None  # --latest-checkpoint: the directory it restored
    # Retention (--keep-last): checkpoints deleted from the target whole, those thinned to
    # their weights (--prune-optimizer-older-than), the objects and bytes of both (in a plan:
    # what would be), and the newest complete checkpoint at the target after the run.
    checkpoints_pruned: int = 0
    checkpoints_thinned: int = 0
    objects_pruned: int = 0
    bytes_pruned: int = 0
    newest_checkpoint: str | None = None

    @property
    def ok(self) -> bool:
        return self.objects_failed == 0 and not self.interrupted

    @property
    def bytes_transferred(self) -> int:
        return self.bytes_copied + self.bytes_server_copied

    @property
    def sent_per_changed(self) -> float | None:
        """Bytes sent per byte that really changed (1.0 for full copies; above 1 by the part
        padding of a delta)."""
        return self.bytes_sent / self.bytes_changed if self.bytes_changed else None

    @property
    def throughput_bps(self) -> float:
        return self.bytes_transferred / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def exit_code(self) -> int:
        """0 all done, 1 some objects failed, 130 interrupted (see README: exit codes)."""
        if self.interrupted:
            return 130
        return 0 if self.objects_failed == 0 else 1

    def to_dict(self) -> dict[str, Any]:
        # Field by field: dataclasses.asdict deep-copies every value of every object result,
        # 20-35 ms for a run of 1,000 objects, and a run asks twice (its record in the
        # manifest, and --json). Every value here is immutable but the lists, remade below.
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d["objects"] = [r.to_dict() for r in self.objects]
        d["failures"] = [f.to_dict() for f in self.failures]
        d["deferred"] = [{"key": k, "reason": why} for k, why in self.deferred]
        d["limited_by"] = self.limited_by.to_dict() if self.limited_by is not None else None
        d["concurrency"] = self.concurrency.to_dict() if self.concurrency is not None else None
        d["bytes_transferred"] = self.bytes_transferred
        d["throughput_bps"] = round(self.throughput_bps, 1)
        ratio = self.sent_per_changed
        d["sent_per_changed"] = None if ratio is None else round(ratio, 4)
        d["exit_code"] = self.exit_code
        return d


def report_json(doc: dict[str, Any]) -> str:
    """A report as JSON a person can read: one field a line, and one line for each entry of a
    list (an object, a failure). ``json.dumps(indent=...)`` would do the same a value a line,
    but only in its pure-Python encoder: 18 ms for a report of 1,000 objects against 5 here."""
    lines = []
    for name, value in doc.items():
        if isinstance(value, list) and value:
            entries = ",\n    ".join(json.dumps(v) for v in value)
            text = f"[\n    {entries}\n  ]"
        else:
            text = json.dumps(value)
        lines.append(f"  {json.dumps(name)}: {text}")
    return "{\n" + ",\n".join(lines) + "\n}" if lines else "{}"
