"""The closed set of errors mcsync raises; stores translate SDK errors into these at the edge.

Retry decisions are made by type (``Transient``), never by matching message text.
"""

from __future__ import annotations

import errno
from collections.abc import Callable

__all__ = [
    "AccessDenied",
    "CacheFull",
    "ComposeRefused",
    "ConfigError",
    "CredentialsExpired",
    "IntegrityError",
    "Interrupted",
    "ListingOrderError",
    "Locked",
    "MCSyncError",
    "NoCheckpoint",
    "NoSuchBucket",
    "NotFound",
    "Permanent",
    "PreconditionFailed",
    "SourceGone",
    "Throttled",
    "Transient",
    "Unreachable",
    "UnsafeKey",
    "UsageError",
    "failure_kind",
]


class MCSyncError(Exception):
    """Base class of every error mcsync raises on purpose."""


class UsageError(MCSyncError):
    """Bad command line, URL, option or configuration (exit code 2)."""


class ConfigError(UsageError):
    """The target or source cannot be used at all: missing bucket, bad credentials, unwritable
    directory. Raised before any byte moves (exit code 2)."""


class NoCheckpoint(UsageError):
    """``--latest-checkpoint`` found no complete checkpoint under the source: nothing moved
    (exit code 4, so a pod's first start, with nothing to restore, is told from a failure)."""


class Locked(MCSyncError):
    """Another run of this sync pair holds the lock (exit code 3)."""


class NotFound(MCSyncError):
    """The object does not exist."""


class SourceGone(NotFound):
    """The source object was deleted after it was listed (a trainer rotating its checkpoints):
    nothing to copy. Reported, not a failure."""


class PreconditionFailed(MCSyncError):
    """A conditional request failed: the object changed since it was planned."""


class CacheFull(MCSyncError):
    """The node cache cannot make room for an object within its limit: what is left is
    pinned, open or being filled (the message gives the numbers). Raised at once, never
    waited out."""


class ListingOrderError(MCSyncError):
    """A store listed keys out of UTF-8 byte order. ``fallback`` switches that store to a
    listing that is ordered (slower); the engine then starts the pass again."""

    def __init__(self, message: str, fallback: Callable[[], None] | None = None) -> None:
        super().__init__(message)
        self.fallback = fallback


class Interrupted(Exception):
    """The run was asked to stop: work in flight finished or was checkpointed, and what is left
    resumes on the next run. Deliberately not an MCSyncError: it is not a failure."""


class UnsafeKey(MCSyncError):
    """A key that cannot be written under a filesystem root (``..``, absolute, NUL byte)."""


class Transient(MCSyncError):
    """Worth retrying: throttling, a dropped connection, a 5xx."""


class Throttled(Transient):
    """The store asked us to slow down (503 SlowDown, 429): retry, and send less."""


class CredentialsExpired(Transient):
    """The store refused keys that expired (or were replaced) since they were resolved. The
    store has renewed them (or will before its next request): a new try carries new keys."""


class Unreachable(Transient):
    """No answer from the endpoint at all (refused, reset before an answer, name lookup)."""


class Permanent(MCSyncError):
    """Not worth retrying: access denied, invalid request."""


class AccessDenied(Permanent):
    """The store refused our credentials, or refused them this operation."""


class NoSuchBucket(Permanent):
    """The bucket (or container) named in the address does not exist."""


class IntegrityError(MCSyncError):
    """Bytes read or written do not match what was expected."""


class ComposeRefused(MCSyncError):
    """The target does not take ranged part copies: send changed objects whole."""


def failure_kind(exc: BaseException) -> tuple[str, bool]:
    """What a per-object failure reports of its cause: its kind (the name of its class in this
    module; ``"OSError"`` for a local filesystem error, ``"InternalError"`` for anything else,
    a bug) and whether the same object may succeed if tried again later. Transient errors may;
    so may bytes that arrived damaged and an object that changed while it was copied (a later
    run reads it anew). Refusals, bad keys and a full or read-only disk will not."""
    if isinstance(exc, MCSyncError):
        kind = next(c.__name__ for c in type(exc).__mro__ if c.__module__ == __name__)
        return kind, isinstance(exc, Transient | IntegrityError | PreconditionFailed)
    if isinstance(exc, OSError):
        return "OSError", exc.errno in _RETRYABLE_ERRNO
    return "InternalError", False


def as_config_error(exc: MCSyncError, what: str, endpoint: str) -> ConfigError:
    """What ``check`` raises for a failure of its probe: the same cause, as the configuration
    error it is when nothing has moved yet (exit code 2). ``endpoint`` names the server for
    messages (never with credentials)."""
    if isinstance(exc, ConfigError):
        return exc
    if isinstance(exc, NoSuchBucket):
        return ConfigError(str(exc))
    if isinstance(exc, AccessDenied):
        return ConfigError(f"{exc}: check credentials")
    if isinstance(exc, Unreachable):
        cause = str(exc).removeprefix(f"{what}: ")
        return ConfigError(f"{what}: cannot reach {endpoint} ({cause})")
    return ConfigError(str(exc))


# Local filesystem errors that pass (an NFS handle gone stale, a busy or interrupted call);
# the rest (ENOSPC, EACCES, EROFS, EIO, ...) need someone to act first.
_RETRYABLE_ERRNO = frozenset({errno.EAGAIN, errno.EINTR, errno.ETIMEDOUT, errno.ESTALE,
                              errno.EBUSY})


def first_error(exc: BaseException) -> BaseException:
    """The first leaf of a (nested) exception group, or ``exc`` itself: a TaskGroup wraps
    what its body raised, and callers want the error, not the wrapper."""
    while isinstance(exc, BaseExceptionGroup):
        exc = exc.exceptions[0]
    return exc
