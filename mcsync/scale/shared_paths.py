"""Local paths under ``--executor ray``: does every node see the files this machine sees?

A worker on another node opens a local SRC or DST path on its own filesystem. Where that is a
filesystem every node mounts (NFS, Lustre, a volume on each node) the run is right; where it is
the node's own disk, a source's keys are "not found" there (as if deleted after the listing) and
a target's objects land on whichever node ran the task. So before its first task each actor is
asked what it sees at each local root, and the run is refused (exit 2) unless it sees what the
driver sees:

- a local target: the driver writes a marker of a random token under the target's
  ``.mcsync/`` (mcsync's own state there, never synced); the node must read that token back;
- a local source (read-only to mcsync): the driver samples up to ``SAMPLE`` files under the
  root (path, size, mtime to the second); the node must see each with the same size and
  mtime. A file that changed between the driver's look and the node's, as the driver sees it
  too, is not held against the node (a source being written to is not a refusal).

Pure file checks, no Ray: ``ray_pool`` runs ``probe_roots`` in the driver and ``view_of`` in
each actor.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import secrets
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from ..stores.local_paths import is_tmp_name
from ..stores.registry import parse_url
from ..types import RESERVED_PREFIX
from .worker_runner import Addresses

SAMPLE = 32  # files of a local source a node must see as the driver does
WALK = 256  # directories looked into for them, at most (breadth first: the top levels)
RECENT_S = 120.0  # a file changed this recently is sampled only where there are no others
MARKER = "node-check-"  # + the token: the marker a local target's nodes must read

Role = Literal["source", "target"]


@dataclass(frozen=True, slots=True)
class RootProbe:
    """What a node is asked to see at one local root (sent to each actor: no secret in it;
    the token only tells a filesystem apart)."""

    role: Role
    root: str  # absolute
    token: str = ""  # a target's marker: RESERVED_PREFIX + MARKER + token, holding the token
    sample: tuple[tuple[str, int, int], ...] = ()  # a source's (relative path, size, mtime s)

    def marker(self) -> Path:
        return Path(self.root) / RESERVED_PREFIX / f"{MARKER}{self.token}"


@dataclass(frozen=True, slots=True)
class NodeView:
    """What one node saw at a root: whether the root is a directory there, whether it read
    the target's marker, and the sampled files it saw otherwise (missing or changed)."""

    root_there: bool
    marker_read: bool = False
    differing: tuple[str, ...] = ()


def absolute(addresses: Addresses) -> Addresses:
    """``addresses`` with each local path made absolute (a relative path would be resolved
    against each worker's own working directory)."""
    def fixed(address: str) -> str:
        loc = parse_url(address)
        return os.path.abspath(loc.prefix) if loc.scheme == "file" else address

    return dataclasses.replace(addresses, source=fixed(addresses.source),
                               target=fixed(addresses.target))


def local_roots(addresses: Addresses) -> list[tuple[Role, str]]:
    """The local paths among the addresses, each with its role."""
    found: list[tuple[Role, str]] = []
    for role, address in (("source", addresses.source), ("target", addresses.target)):
        loc = parse_url(address)
        if loc.scheme == "file":
            found.append((role, os.path.abspath(loc.prefix)))  # type: ignore[arg-type]
    return found


def probe_roots(addresses: Addresses) -> list[RootProbe]:
    """The driver's side: a marker written at each local target, a sample taken of each
    local source. ``remove_markers`` once the nodes have looked."""
    probes = []
    for role, root in local_roots(addresses):
        if role == "target":
            probe = RootProbe(role, root, token=secrets.token_hex(16))
            path = probe.marker()
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(probe.token)
            probes.append(probe)
        else:
            probes.append(RootProbe(role, root, sample=_sample(Path(root))))
    return probes


def remove_markers(probes: list[RootProbe]) -> None:
    for probe in probes:
        if probe.token:
            with contextlib.suppress(OSError):
                probe.marker().unlink()


def view_of(probe: RootProbe) -> NodeView:
    """A node's side: what it sees at ``probe.root``."""
    root = Path(probe.root)
    if not root.is_dir():
        return NodeView(root_there=False)
    if probe.token:
        try:
            read = probe.marker().read_text() == probe.token
        except OSError:
            read = False
        return NodeView(root_there=True, marker_read=read)
    return NodeView(root_there=True, differing=tuple(
        rel for rel, size, mtime in probe.sample if _stat(root / rel) != (size, mtime)))


def unseen(probe: RootProbe, view: NodeView) -> str | None:
    """Why a node with ``view`` does not see the files the driver sees at ``probe.root`` (None:
    it does). Judged in the driver, which looks at the sampled files again."""
    if not view.root_there:
        return "no such directory there"
    if probe.token:
        return None if view.marker_read else (
            f"a file this machine wrote under it ({RESERVED_PREFIX}{MARKER}...) is not there")
    sampled = {rel: (size, mtime) for rel, size, mtime in probe.sample}
    root = Path(probe.root)
    # A file changed since the sample, here too, tells nothing about the node.
    differing = [rel for rel in view.differing if _stat(root / rel) == sampled[rel]]
    if differing:
        return (f"{len(differing)} of {len(sampled)} files sampled under it are missing or "
                f"differ there (such as {differing[0]})")
    return None


def _sample(root: Path) -> tuple[tuple[str, int, int], ...]:
    """Up to SAMPLE files under ``root``, the top levels first, in name order (mcsync's own
    state and hidden temporary files left out), files changed in the last ``RECENT_S`` only
    where there are no others (a network filesystem's client may show a node a size or mtime
    it cached a moment before)."""
    found: list[tuple[str, int, int]] = []
    recent: list[tuple[str, int, int]] = []
    since = time.time() - RECENT_S
    todo, looked = deque([root]), 0
    while todo and len(found) < SAMPLE and looked < WALK:
        directory, looked = todo.popleft(), looked + 1
        try:
            entries = sorted(os.scandir(directory), key=lambda e: e.name)
        except OSError:
            continue
        for entry in entries:
            if entry.name == RESERVED_PREFIX.rstrip("/") or is_tmp_name(entry.name):
                continue
            with contextlib.suppress(OSError):
                if entry.is_dir(follow_symlinks=False):
                    todo.append(Path(entry.path))
                elif entry.is_file() and len(found) < SAMPLE:
                    st = entry.stat()
                    seen = (os.path.relpath(entry.path, root), st.st_size, int(st.st_mtime))
                    if st.st_mtime < since:
                        found.append(seen)
                    elif len(recent) < SAMPLE:
                        recent.append(seen)
    return tuple(found or recent[:SAMPLE])


def _stat(path: Path) -> tuple[int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_size, int(st.st_mtime)
