"""A root marker (DeepSpeed's ``latest``, Megatron's tracker file) never names, at the target, a
checkpoint whose files are not all there: the trainer finishes a step and rewrites the marker
while a run's listing walks the source (a hook between listing and read does it at that
instant), and the run holds the marker back instead of writing it ahead of its directory."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

import mcsync
from mcsync.events import Event, ObjectDeferred
from mcsync.stores.local import LocalStore
from mcsync.stores.memory import MemoryEndpoint, MemoryStore
from mcsync.testing.faults import Faults, Rule, faulty

from .test_engine import contents, payload

LAYOUTS = {
    "deepspeed": ("latest", lambda n: f"global_step{n}", lambda n: f"global_step{n}".encode()),
    "megatron": ("latest_checkpointed_iteration.txt", lambda n: f"iter_{n:07d}",
                 lambda n: str(n).encode()),
}


def write_step(root: Path, layout: str, step: int) -> None:
    marker, directory, text = LAYOUTS[layout]
    d = root / directory(step)
    (d / "mp_rank_00").mkdir(parents=True, exist_ok=True)
    (d / "mp_rank_00" / "model_optim_rng.pt").write_bytes(payload(20_000, step))
    (d / "mp_rank_01_model_states.pt").write_bytes(payload(10_000, step + 1))
    (root / marker).write_bytes(text(step))


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_a_marker_rewritten_during_the_listing_waits_for_its_directory(tmp_path, layout):
    root = tmp_path / "ckpt"
    write_step(root, layout, 600)
    marker, directory, _ = LAYOUTS[layout]
    last_of_600 = f"{directory(600)}/mp_rank_01_model_states.pt"
    # The trainer finishes step 700 just as the listing passes step 600's last file: the
    # listing of the top level was taken already (no step 700 in it), the marker is not yet.
    source = faulty(LocalStore(root), Faults([Rule(
        "list", key=last_of_600, phase="after",
        action=lambda call: write_step(root, layout, 700))]))
    target = MemoryStore("t", endpoint=MemoryEndpoint("target"))
    seen: list[Event] = []

    report = asyncio.run(mcsync.async_sync(source, target, on_event=seen.append,
                                           manifest=str(tmp_path / "m.sqlite")))

    assert report.exit_code == 0
    there = contents(target)
    assert marker not in there, "the marker went ahead of the directory it names"
    held = [e for e in seen if isinstance(e, ObjectDeferred) and e.key == marker]
    assert held and "not complete at the target" in held[0].reason
    assert f"{directory(600)}/mp_rank_01_model_states.pt" in there

    # The next run copies step 700, then the marker naming it.
    again = asyncio.run(mcsync.async_sync(LocalStore(root), target,
                                          manifest=str(tmp_path / "m.sqlite")))
    assert again.exit_code == 0
    assert contents(target) == {p.relative_to(root).as_posix(): p.read_bytes()
                                for p in root.rglob("*") if p.is_file()}


def test_a_marker_naming_a_complete_directory_goes_at_once(tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    write_step(root, "deepspeed", 100)
    target = MemoryStore("t", endpoint=MemoryEndpoint("target"))
    seen: list[Any] = []
    report = asyncio.run(mcsync.async_sync(LocalStore(root), target, on_event=seen.append,
                                           manifest=str(tmp_path / "m.sqlite")))
    assert report.exit_code == 0 and contents(target)["latest"] == b"global_step100"
    assert not [e for e in seen if isinstance(e, ObjectDeferred)]
