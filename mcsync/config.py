"""Options of a sync and the arithmetic that turns them into part sizes and limits.

Memory: at most ``memory_limit`` bytes of object data are buffered at once. Every part or small
object acquires its size from that budget before its first byte is read and returns it when the
write is acknowledged, so 128 requests in flight never means 128 x part size of RAM unless the
budget allows it.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import os
import re
from dataclasses import dataclass, field
from typing import Literal

from .errors import UsageError
from .retry import RetryPolicy
from .types import Capabilities, GiB, KiB, MiB

__all__ = ["WORKERS_AUTO", "GiB", "KiB", "MiB", "StoreOptions", "SyncOptions", "available_cores",
           "format_size", "parse_concurrency", "parse_duration", "parse_size", "parse_workers",
           "workers_for"]

DEFAULT_CONCURRENCY = 128
# --concurrency auto: objects in flight are tuned from what the run measures (limits.Limits),
# never past this; connection pools are sized to it. Twice the default: a distant target's
# round trips want more small objects in flight than a near one.
AUTO_CONCURRENCY_CEILING = 256
DEFAULT_PART_CONCURRENCY = 8
DEFAULT_MEMORY_LIMIT = 1 * GiB
MIN_PART_SIZE = 8 * MiB  # S3's floor is 5 MiB; 8 MiB keeps request overhead negligible
# What --part-size may be: S3's limits, the narrowest of the targets (a store's own limits
# then bound the parts it gets, see part_size_for).
S3_LIMITS = Capabilities()
S3_MIN_PART_SIZE = S3_LIMITS.min_part_size
S3_MAX_PART_SIZE = S3_LIMITS.max_part_size
CHUNKERS = ("auto", "fixed", "safetensors", "cdc")
DELTA_SCOPES = ("key", "prefix", "target")
EXECUTORS = ("local", "ray")
# --executor ray with --workers auto (or none given): one worker per CPU the cluster has free,
# counted once connected (ray_pool).
WORKERS_AUTO = -1


@dataclass(frozen=True, slots=True)
class StoreOptions:
    """What a store opened from an address is told: where (an S3 endpoint, an AWS profile:
    its keys and region), how many connections to pool, and how patiently to retry. A sync
    builds one per side from its own options, or takes ``SyncOptions.source`` / ``.target``."""

    endpoint_url: str | None = None  # for s3:// (meta:// has its own, see stores.registry)
    profile: str | None = None  # AWS profile, for s3://
    max_connections: int | None = None  # None: the run's concurrency (128 for a store alone)
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    # PEM files presented in every TLS handshake (mutual TLS), for s3:// (meta://: its own)
    client_cert: str | None = None
    client_key: str | None = None  # None: in client_cert's file


@dataclass(frozen=True, slots=True)
class SyncOptions:
    """Everything that shapes one sync. The CLI and the library build the same record."""

    # Objects (and requests) in flight at once; "auto": tuned during the run from its own
    # measurements, up to AUTO_CONCURRENCY_CEILING (see ``in_flight``).
    concurrency: int | Literal["auto"] = DEFAULT_CONCURRENCY
    # Parts of one object in flight at once. Many objects still move in parallel up to
    # ``concurrency``; measured against SeaweedFS on 2 cores, 8 parts of one 512 MiB object
    # upload in 3.9 s and 128 in 4.9 s (more parts only contend for the server's disk/CPU).
    part_concurrency: int = DEFAULT_PART_CONCURRENCY
    part_size: int | None = None  # None: auto, see part_size_for()
    memory_limit: int = DEFAULT_MEMORY_LIMIT
    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    delete: bool = False
    dry_run: bool = False
    # For s3:// addresses on both sides (--endpoint-url, --profile), unless a side has its own:
    endpoint_url: str | None = None  # (meta:// has its own, see stores.registry)
    profile: str | None = None
    # One side's store options, for an address the run opens: an s3:// source on AWS and an
    # s3:// target on another endpoint in one run. A side given them ignores the two above.
    source: StoreOptions | None = None
    target: StoreOptions | None = None
    server_side_copy: bool = True
    manifest: str | None = None  # path of the manifest; None: the default for the pair
    use_manifest: bool = True
    verify: bool = False  # re-read what the target holds and compare with the manifest
    # Decide "unchanged" by content hashes, never by size and mtime (list the target, read and
    # hash where no recorded hash or ETag is evidence).
    checksum: bool = False
    grace_s: float = 20.0  # after a stop request, how long work in flight may take
    lock: bool = True
    # The block delta: a changed object mcsync wrote before sends only its changed chunks.
    delta: bool = True
    # auto: as the recorded version was cut; new objects by tensor for .safetensors files,
    # else fixed blocks. fixed, safetensors, cdc (content-defined): see mcsync.chunking.
    chunker: str = "auto"
    # Where a delta may copy from: the key's own previous version (key), objects under the
    # same parent as its directory (prefix: a run's other steps), or the whole pair (target).
    delta_scope: str = "target"
    # A source file modified less than this long ago is still being written: deferred to a
    # later run (0 for one-shot runs; --watch makes it 30 s).
    min_age_s: float = 0.0
    # Requests per second across the run (--tpslimit; None: no cap), and bytes per second
    # through the client, both directions together: a SIZE, or a timetable of them
    # ("08:00,100MiB 20:00,off"; --bwlimit; None: no cap). See mcsync.ratelimit.
    tps_limit: float | None = None
    bw_limit: str | None = None
    # Worker processes on this machine that move whole objects (--workers; 0: all in this
    # process). Multipart uploads, block deltas and resumed uploads stay in this process.
    workers: int = 0
    # One shard of the keys, (index, count) numbered from 0 (--shard I/N): this run touches
    # only the keys that hash to it, with a manifest and lock of its own (mcsync.state.shard).
    shard: tuple[int, int] | None = None
    # For s3:// on both sides unless a side has its own (--client-cert, --client-key; see
    # StoreOptions): fields last, so that positional uses of the others stay as they were.
    client_cert: str | None = None
    client_key: str | None = None
    # Only the newest complete checkpoint under the source and the marker naming it
    # (--latest-checkpoint; see mcsync.checkpoints.latest).
    latest_checkpoint: bool = False
    # Where the workers run (--executor): processes on this machine (local), or Ray actors on
    # the cluster at ray_address (None: RAY_ADDRESS, else one on this machine;
    # mcsync.scale.ray_pool).
    executor: str = "local"
    ray_address: str | None = None
    # Seconds a worker's task may run before its worker is taken for stuck, killed and the
    # task given to another (--task-timeout; None: from the task's bytes, at least a minute:
    # mcsync.scale.workers.task_deadline).
    task_timeout: float | None = None
    # Retention at the target (--keep-last N, --keep-every K, --prune-optimizer-older-than M;
    # None: off): after a run, the checkpoints neither rule keeps are deleted from the target,
    # marker first (mcsync.checkpoints.retention, mcsync.run.prune).
    keep_last: int | None = None
    keep_every: int | None = None
    prune_optimizer_older_than: int | None = None

    def __post_init__(self) -> None:
        for side in ("source", "target"):
            if not isinstance(getattr(self, side), StoreOptions | None):
                raise TypeError(f"{side} must be mcsync.StoreOptions, got "
                                f"{type(getattr(self, side)).__name__}")
        if self.shard is not None:
            if (not isinstance(self.shard, tuple) or len(self.shard) != 2 or not all(
                    isinstance(n, int) and not isinstance(n, bool) for n in self.shard)):
                raise UsageError(f"shard must be (index, count), two integers, got "
                                 f"{self.shard!r}")
            if not 0 <= self.shard[0] < self.shard[1]:
                raise UsageError(f"--shard {self.shard[0]}/{self.shard[1]}: the index goes "
                                 "from 0 to count - 1 (as JOB_COMPLETION_INDEX)")
        if self.concurrency != "auto" and not (
                isinstance(self.concurrency, int) and not isinstance(self.concurrency, bool)
                and self.concurrency >= 1):
            raise UsageError(f"--concurrency must be at least 1 (or auto), got "
                             f"{self.concurrency!r}")
        if self.part_concurrency < 1:
            raise UsageError(
                f"--part-concurrency must be at least 1, got {self.part_concurrency}")
        if self.part_size is not None and not (
            S3_MIN_PART_SIZE <= self.part_size <= S3_MAX_PART_SIZE
        ):
            raise UsageError(
                f"--part-size must be between 5 MiB and 5 GiB, got {format_size(self.part_size)}"
            )
        if self.delta_scope not in DELTA_SCOPES:
            raise UsageError(f"--delta-scope must be one of {', '.join(DELTA_SCOPES)}, got "
                             f"{self.delta_scope}")
        if self.chunker not in CHUNKERS:
            raise UsageError(f"--chunker must be one of {', '.join(CHUNKERS)}, got {self.chunker}")
        if self.memory_limit < S3_MIN_PART_SIZE:
            raise UsageError(
                f"--memory-limit must be at least 5 MiB, got {format_size(self.memory_limit)}"
            )
        if self.latest_checkpoint and self.delete:
            # What --delete would remove is every other checkpoint at the target: the ones a
            # trainer may still be writing there, or the previous restore. Not a side effect
            # to leave to a flag's combination.
            raise UsageError("--latest-checkpoint cannot be combined with --delete: it copies "
                             "one checkpoint and leaves everything else at the target as it is")
        self._check_retention()
        if self.executor not in EXECUTORS:
            raise UsageError(f"--executor must be one of {', '.join(EXECUTORS)}, got "
                             f"{self.executor!r}")
        if self.ray_address is not None and self.executor != "ray":
            raise UsageError("--ray-address is where the workers of --executor ray run")
        if self.task_timeout is not None and not self.task_timeout > 0:
            raise UsageError(f"--task-timeout must be a positive number of seconds, got "
                             f"{self.task_timeout}")
        if self.workers < 0 and not (self.workers == WORKERS_AUTO and self.executor == "ray"):
            raise UsageError(f"--workers must be at least 1 (or auto), got {self.workers}")

    def _check_retention(self) -> None:
        if self.keep_last is None:
            if self.keep_every is not None or self.prune_optimizer_older_than is not None:
                raise UsageError("--keep-every and --prune-optimizer-older-than are rules of "
                                 "retention: give --keep-last N too")
            return
        if self.keep_last < 1:
            # As torchtitan's keep_latest_k: the newest complete checkpoint is never deleted,
            # so at least one is always kept.
            raise UsageError(f"--keep-last must be at least 1 (the newest complete checkpoint "
                             f"is always kept), got {self.keep_last}")
        if self.keep_every is not None and self.keep_every < 1:
            raise UsageError(f"--keep-every must be at least 1 step, got {self.keep_every}")
        if self.prune_optimizer_older_than is not None and self.prune_optimizer_older_than < 1:
            raise UsageError("--prune-optimizer-older-than must be at least 1, got "
                             f"{self.prune_optimizer_older_than}")
        for flag, given in (("--delete", self.delete),
                            ("--latest-checkpoint", self.latest_checkpoint),
                            ("--shard", self.shard is not None)):
            if given:
                raise UsageError(f"--keep-last cannot be combined with {flag}: retention "
                                 "decides alone what the target keeps, over all its "
                                 "checkpoints")

    @property
    def tuned(self) -> bool:
        """Whether what is in flight is tuned during the run (``--concurrency auto``)."""
        return self.concurrency == "auto"

    @property
    def in_flight(self) -> int:
        """The most objects and requests in flight at once: ``--concurrency``, or auto's
        ceiling."""
        return AUTO_CONCURRENCY_CEILING if self.concurrency == "auto" else self.concurrency

    def store_options(self, side: Literal["source", "target"]) -> StoreOptions:
        """What the store of one side, opened from its address, is told."""
        given = self.source if side == "source" else self.target
        if given is None:
            return StoreOptions(endpoint_url=self.endpoint_url, profile=self.profile,
                                client_cert=self.client_cert, client_key=self.client_key,
                                max_connections=self.in_flight)
        if given.max_connections is None:
            return dataclasses.replace(given, max_connections=self.in_flight)
        return given

    def part_size_for(self, size: int, caps: Capabilities = S3_LIMITS) -> int:
        """Part size for an object of ``size`` bytes written to a store with ``caps``: 8 MiB
        (or the chosen size), grown so that the object needs no more than ``caps.max_parts``
        parts, within the store's part-size limits and never above the memory budget. The one
        place a part size is computed: a transfer asks once per object and passes it down."""
        part = self.part_size or MIN_PART_SIZE
        if size > part * caps.max_parts:
            part = -(-size // caps.max_parts)  # ceil
            part = -(-part // MiB) * MiB  # round up to whole MiB
        part = min(part, max(self.memory_limit, caps.min_part_size), caps.max_part_size)
        return max(part, caps.min_part_size)

    @property
    def multipart_threshold(self) -> int:
        """Objects larger than this move as parts; smaller ones in one request."""
        return self.part_size or MIN_PART_SIZE

    def selects(self, key: str) -> bool:
        """Include/exclude filtering, rsync-like: a key must match an include (if any is given)
        and no exclude. A pattern matches the whole key or its last path component."""
        if not (self.include or self.exclude):
            return True  # asked once per key: a million keys, no filters, no work

        def matches(pattern: str) -> bool:
            name = key.rsplit("/", 1)[-1]
            return fnmatch.fnmatchcase(key, pattern) or fnmatch.fnmatchcase(name, pattern)

        if self.include and not any(matches(p) for p in self.include):
            return False
        return not any(matches(p) for p in self.exclude)


def available_cores() -> int:
    """The cores this process may run on (its CPU affinity, which a container's cpuset
    narrows), as ``--workers auto`` takes them."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def workers_for(workers: int | str, executor: str) -> int:
    """``--workers`` given (a number, ``auto`` or 0: none given) for ``executor``: auto is the
    cores here, or on Ray the cluster's CPUs (``WORKERS_AUTO``: counted once connected), which
    is also what Ray without a number takes."""
    if executor == "ray" and workers in ("auto", 0):
        return WORKERS_AUTO
    if isinstance(workers, str):
        return parse_workers(workers)
    return workers


def parse_concurrency(text: str) -> int | Literal["auto"]:
    """``--concurrency``: objects and requests in flight (1 or more), or ``auto``."""
    s = text.strip().lower()
    if s == "auto":
        return "auto"
    if not s.isdigit() or int(s) < 1:
        raise UsageError(f"--concurrency must be a number (1 or more) or auto, got {text!r}")
    return int(s)


def parse_workers(text: str) -> int:
    """``--workers``: a number of worker processes, or ``auto`` (the cores available)."""
    s = text.strip().lower()
    if s == "auto":
        return available_cores()
    if not s.isdigit() or int(s) < 1:
        raise UsageError(f"--workers must be a number of processes (1 or more) or auto, "
                         f"got {text!r}")
    return int(s)


_UNITS = {"": 1, "b": 1, "k": KiB, "kb": KiB, "kib": KiB, "m": MiB, "mb": MiB, "mib": MiB,
          "g": GiB, "gb": GiB, "gib": GiB, "t": 1024 * GiB, "tb": 1024 * GiB, "tib": 1024 * GiB}


def parse_size(text: str) -> int:
    """``"8MiB"`` → 8388608. Units are binary (K = 1024) whatever their spelling."""
    s = text.strip().lower().replace(" ", "")
    num = s.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = s[len(num):]
    if unit not in _UNITS or not num:
        raise UsageError(f"not a size: {text!r} (examples: 8MiB, 512K, 2G)")
    try:
        value = float(num)
    except ValueError:
        raise UsageError(f"not a size: {text!r} (examples: 8MiB, 512K, 2G)") from None
    # float() also reads "1e400" (infinity) and "-5": no size is either
    if not 0 <= value * _UNITS[unit] < 2**63:
        raise UsageError(f"not a size: {text!r} (sizes go from 0 B to 8 EiB; examples: 8MiB, "
                         "512K, 2G)")
    return int(value * _UNITS[unit])


_DURATION = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ms|s|m|h|d)")
_SECONDS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str) -> float:
    """``"90s"``, ``"5m"``, ``"1h30m"``, ``"250ms"`` or a plain number of seconds → seconds."""
    s = text.strip().lower().replace(" ", "")
    try:
        value = float(s)
    except ValueError:
        pos, value = 0, 0.0
        for m in _DURATION.finditer(s):
            if m.start() != pos:
                break
            value += float(m.group(1)) * _SECONDS[m.group(2)]
            pos = m.end()
        if pos != len(s) or not s:
            raise UsageError(f"not a duration: {text!r} (examples: 30s, 5m, 1h30m, 90)") from None
    if not 0 <= value < 10**9:  # also refuses nan and inf
        raise UsageError(f"not a duration: {text!r} (from 0 s to ~30 years)")
    return value


def format_size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")
