"""What the run asks of a wrapped store is typed (``stores.wrap.Wrapped``, ``CaseFolding``,
``StoreFacts.one_object``): it holds through every layer of wrapping, with no look at a
wrapper's attributes by name."""

from __future__ import annotations

from pathlib import Path

import pytest

from mcsync.config import SyncOptions
from mcsync.run.pools import folds_case, reopenable
from mcsync.stores.base import CaseFolding
from mcsync.stores.local import LocalStore
from mcsync.stores.local_paths import RootedPaths
from mcsync.stores.memory import MemoryStore
from mcsync.stores.resilience import Pacing, pacing_of, resilient
from mcsync.stores.single import is_one_object, one_object
from mcsync.stores.wrap import PassThrough, Wrapped, inner_of, innermost, wrap


def test_a_wrapped_store_names_what_it_wraps_through_every_layer():
    store = MemoryStore()
    once = wrap(store, PassThrough(), name="Once")
    twice = resilient(once, Pacing())
    assert isinstance(twice, Wrapped) and not isinstance(store, Wrapped)
    assert inner_of(twice) is once and innermost(twice) is store
    assert inner_of(store) is store and innermost(store) is store
    assert pacing_of(twice) is not None and pacing_of(once) is None


def test_a_directory_that_folds_case_is_told_through_its_wrappers(tmp_path: Path,
                                                                  monkeypatch):
    local = LocalStore(str(tmp_path / "dst"))
    wrapped = resilient(wrap(local, PassThrough(), name="Metrics"), Pacing())
    assert isinstance(wrapped, CaseFolding)
    assert not folds_case(wrapped)  # a case-sensitive filesystem here
    monkeypatch.setattr(RootedPaths, "_folds_case", staticmethod(lambda probe: True))
    assert folds_case(resilient(LocalStore(str(tmp_path / "other")), Pacing()))
    # An object store has no case to fold: not asked.
    assert not isinstance(MemoryStore(), CaseFolding) and not folds_case(MemoryStore())


def test_a_directory_that_cannot_be_probed_counts_as_folding(tmp_path: Path, monkeypatch):
    def refuse(probe: Path) -> bool:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(RootedPaths, "_folds_case", staticmethod(refuse))
    assert folds_case(resilient(LocalStore(str(tmp_path)), Pacing()))


@pytest.mark.parametrize("layers", [0, 1, 2])
def test_a_one_object_view_is_one_under_any_wrapping_and_moves_without_workers(layers):
    inner = MemoryStore()
    view = one_object(inner, shown="m.bin", real="m.bin", url="mem://m.bin")
    for n in range(layers):
        view = wrap(view, PassThrough(), name=f"Layer{n}") if n % 2 else resilient(view, Pacing())
    assert is_one_object(view) and not is_one_object(inner)
    options, addresses = reopenable(view, MemoryStore(), SyncOptions(workers=2))
    assert options.workers == 0 and addresses is None
    options, addresses = reopenable(inner, MemoryStore(), SyncOptions(workers=2))
    assert options.workers == 2 and addresses is not None


def test_an_ability_asked_once_per_class_answers_as_isinstance(tmp_path: Path):
    """``has`` remembers a class's answer: it must be isinstance's for every store and
    wrapper a run makes, asked first and asked again."""
    from mcsync.stores import base

    abilities = [c for c in vars(base).values()
                 if isinstance(c, type) and getattr(c, "_is_runtime_protocol", False)]
    assert len(abilities) >= 10
    local = LocalStore(str(tmp_path / "d"))
    stores = [MemoryStore(), local, wrap(MemoryStore(), PassThrough(), name="Once"),
              resilient(wrap(local, PassThrough(), name="Metrics"), Pacing()),
              wrap(local, PassThrough(), name="NoReads", without=(base.ReadsInto,))]
    for _ in range(2):
        for store in stores:
            for ability in abilities:
                assert base.has(store, ability) == isinstance(store, ability), (store, ability)
    assert base.has(local, base.ReadsInto) and not base.has(stores[-1], base.ReadsInto)
