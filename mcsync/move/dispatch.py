"""The dispatch unit: carries out planned actions and returns what came of each — the record to
commit, the event that ends it, or the failure — for the driver (``driver``) to commit.

It is the part of a run that moves bytes, and all it knows of the run comes in through its
constructor as data or narrow interfaces: the uploads a killed run left open (``OpenUpload``s,
to take up), a ``Journal`` that each upload's id and acknowledged parts are reported to the
moment they happen (the single-process run hands in its manifest, so ``kill -9`` resumes as
before), and ``Holdings``, the records and chunk index a block delta composes from. It never
writes an object record: it returns it. Progress (bytes moved, deltas planned) goes out as it
happens, through ``emit``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..delta.planner import Holdings
from ..errors import Interrupted, MCSyncError, PreconditionFailed, SourceGone, UnsafeKey
from ..events import ActionKind, DeltaPlanned, ObjectDeferred, ObjectDone, ObjectFailed
from ..records import Action, ManifestEntry, OpenUpload, Pair
from .context import RunContext
from .hash_tasks import WorkerTasks
from .transfer import NotWhole, Transfer
from .upload import Journal

if TYPE_CHECKING:
    from .compare import Verdict

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Outcome:
    """What one action came to. ``event`` ends it in the report (None: interrupted, to be
    resumed by a later run); ``record`` is the object record to commit (with its block
    hashes, from which the chunk index is kept); ``forget``: the key's record goes (a
    delete); ``handed_back``: a worker process's dispatch (whole objects only) met an object
    that goes in parts: nothing was written, the driver's process moves it."""

    key: str
    event: ObjectDone | ObjectFailed | ObjectDeferred | None
    record: ManifestEntry | None = None
    forget: bool = False
    handed_back: bool = False

    @property
    def interrupted(self) -> bool:
        return self.event is None


class Dispatch:
    """Carries out the actions of one run (or of one task of a run, in a worker)."""

    def __init__(self, ctx: RunContext, *, journal: Journal | None, known: Holdings | None,
                 open_uploads: dict[str, OpenUpload], whole_only: bool = False,
                 part_tasks: WorkerTasks | None = None) -> None:
        """``journal``: where open uploads are recorded (None: a dry run, a worker);
        ``known``: the records and chunk index a delta composes from; ``open_uploads``: those
        a killed run left, to take up; ``whole_only``: a worker process's, which has no
        journal: an action that is not one request comes back ``handed_back``;
        ``part_tasks``: workers that send the parts of what this process uploads in parts
        (``part_tasks``) and read and hash large objects for it (``hash_tasks``)."""
        self.src = ctx.src
        self.dst = ctx.dst
        self.options = ctx.options
        self.limits = ctx.limits
        self.emit = ctx.emit
        self._transfer = Transfer(ctx, journal=journal, open_uploads=open_uploads, known=known,
                                  whole_only=whole_only, part_tasks=part_tasks)

    async def run(self, action: Action) -> Outcome:
        """Carry out ``action``; every error of the object is in the outcome, none raised."""
        try:
            done = await self._transfer.run(action)
        except Interrupted:
            return Outcome(action.key, None)
        except NotWhole:
            return Outcome(action.key, None, handed_back=True)
        except PreconditionFailed as exc:  # changed again while its new version was copied
            return Outcome(action.key, ObjectDeferred(
                action.key, action.size, f"still being written: {exc}; a later run takes it"))
        except SourceGone as exc:
            return Outcome(action.key, ObjectDeferred(action.key, action.size, str(exc)))
        except (MCSyncError, OSError) as exc:
            return Outcome(action.key, ObjectFailed.of(action.key, kind_of(action), action.size,
                                                       exc, describe(exc)))
        except Exception as exc:  # a bug must not take the other objects down with it
            log.exception("unexpected error on %s", action.key)
            return Outcome(action.key, ObjectFailed.of(
                action.key, kind_of(action), action.size, exc,
                f"internal error: {type(exc).__name__}: {exc}"))
        return Outcome(action.key, ObjectDone(done.result), done.entry,
                       forget=done.entry is None)

    async def compare(self, pair: Pair) -> Verdict | ObjectFailed:
        """``--checksum``: hash what the planner could not decide from metadata."""
        src, dst = pair.src, pair.dst
        assert src is not None and dst is not None
        from .compare import compare  # --checksum runs only

        try:
            return await compare(self.src, self.dst, src, dst, pair.known, self.options,
                                 self.limits)
        except (MCSyncError, OSError) as exc:
            return ObjectFailed.of(pair.key, "copy", src.size, exc,
                                   f"comparing content: {describe(exc)}")

    def journalled(self, key: str) -> bool:
        """Whether a killed run's upload of ``key`` is in the journal, not yet taken up."""
        return self._transfer.uploads.journalled(key)

    def is_whole(self, action: Action) -> bool:
        """One request, never journalled: what a worker process may take."""
        return self._transfer.is_whole(action)

    def may_go_as_delta(self, action: Action) -> bool:
        return self._transfer.may_go_as_delta(action)

    async def preview_delta(self, action: Action) -> DeltaPlanned | None:
        """Dry run: what a block delta of this object would send (reads the source, sends
        nothing), for ``mcsync plan``; None when it would be sent whole."""
        assert action.src is not None
        try:
            found = await self._transfer.delta_planner.plan(action, action.src)
        except (MCSyncError, OSError) as exc:
            log.warning("%s: no delta preview: %s", action.key, describe(exc))
            return None
        if isinstance(found, str):
            log.info("%s: would be sent whole: %s", action.key, found)
            return None
        return found.event(action.key)

    async def finish(self) -> None:
        """After the last action: abort the uploads a killed run left that no action took up,
        and, after a stop, sweep the staging space."""
        await self._transfer.finish()


def kind_of(action: Action) -> ActionKind:
    """A dispatched action's kind: never ``compare``, which the driver settles first."""
    kind = action.kind
    assert kind != "compare"
    return kind


def describe(exc: BaseException) -> str:
    if isinstance(exc, UnsafeKey):
        return f"unsafe key refused: {exc}"
    if isinstance(exc, OSError) and exc.strerror:
        where = f" ({exc.filename})" if exc.filename else ""
        return f"{exc.strerror}{where}"
    return str(exc)
