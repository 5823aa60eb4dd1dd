"""Only complete checkpoints move: one test per framework line of checkpoints.FRAMEWORKS, each
with the directory complete and not yet complete."""

from __future__ import annotations

import asyncio

import pytest

from mcsync.checkpoints.frameworks import FRAMEWORKS, MARKERS, Completion, Listed, is_commit_marker
from mcsync.stores.memory import MemoryStore
from mcsync.types import ObjectInfo


def waiting(files: dict[str, bytes], key: str, *, atomic_renames: bool = False,
            min_age_s: float = 0.0, now: float | None = None) -> str | None:
    async def go() -> str | None:
        store = MemoryStore("src")
        for k, data in files.items():
            await store.put(k, data)
        info = await store.head(key)
        completion = Completion(store, min_age_s=min_age_s, atomic_renames=atomic_renames,
                                clock=(lambda: now) if now is not None else lambda: info.mtime)
        return await completion.waiting(info)

    return asyncio.run(go())


CASES = {
    # framework: (files of a complete checkpoint, a key of it, the file to remove or change
    #             to make it incomplete, what it becomes: None removes it)
    "PyTorch DCP": ({"run/step-9/.metadata": b"m", "run/step-9/__0_0.distcp": b"d"},
                    "run/step-9/__0_0.distcp", "run/step-9/.metadata", None),
    "DeepSpeed": ({"ds/global_step200/mp_rank_00_model_states.pt": b"w",
                   "ds/latest": b"global_step200"},
                  "ds/global_step200/mp_rank_00_model_states.pt", "ds/latest",
                  b"global_step100"),
    "Megatron-LM": ({"mg/iter_0000300/mp_rank_00/model_optim_rng.pt": b"w",
                     "mg/latest_checkpointed_iteration.txt": b"300"},
                    "mg/iter_0000300/mp_rank_00/model_optim_rng.pt",
                    "mg/latest_checkpointed_iteration.txt", b"200"),
    "Orbax": ({"ox/100/_CHECKPOINT_METADATA": b"{}", "ox/100/state/d": b"w",
               "ox/100/commit_success.txt": b"ok"},
              "ox/100/state/d", "ox/100/commit_success.txt", None),
    "NeMo": ({"nemo/gpt--step=500.ckpt/weights": b"w"}, "nemo/gpt--step=500.ckpt/weights",
             "nemo/gpt--step=500.ckpt-unfinished", b""),
    "Hugging Face Trainer": ({"hf/checkpoint-500/model.safetensors": b"w",
                              "hf/checkpoint-500/trainer_state.json": b"{}"},
                             "hf/checkpoint-500/model.safetensors",
                             "hf/checkpoint-500/trainer_state.json", None),
}


def test_every_framework_has_a_case():
    assert sorted(CASES) == sorted(f.name for f in FRAMEWORKS)


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_checkpoint_waits_until_its_framework_says_it_is_complete(name):
    files, key, change, becomes = CASES[name]
    assert waiting(files, key) is None
    incomplete = dict(files)
    if becomes is None:
        del incomplete[change]
    else:
        incomplete[change] = becomes
    why = waiting(incomplete, key)
    assert why is not None and why.startswith(f"{name} checkpoint not complete"), why


def test_orbax_on_a_filesystem_is_final_once_renamed():
    files = {"ox/100/_CHECKPOINT_METADATA": b"{}", "ox/100/state/d": b"w"}  # no commit file
    assert waiting(files, "ox/100/state/d") is not None
    assert waiting(files, "ox/100/state/d", atomic_renames=True) is None
    tmp = {"ox/100.orbax-checkpoint-tmp-12/state/d": b"w"}
    assert "still being written" in (waiting(tmp, "ox/100.orbax-checkpoint-tmp-12/state/d",
                                             atomic_renames=True) or "")


def test_a_trainer_staging_directory_waits_for_its_rename():
    staged = {"out/tmp-checkpoint-500/model.safetensors": b"w",
              "out/tmp-checkpoint-500/trainer_state.json": b"{}"}
    assert "still being written" in (waiting(staged, "out/tmp-checkpoint-500/model.safetensors")
                                     or "")
    renamed = {k.replace("tmp-checkpoint", "checkpoint"): v for k, v in staged.items()}
    assert waiting(renamed, "out/checkpoint-500/model.safetensors") is None


def test_ordinary_data_never_waits_and_costs_no_request():
    files = {f"data/shard-{i}.bin": b"x" for i in range(3)} | {"data/100/x.bin": b"y"}
    assert waiting(files, "data/shard-1.bin") is None
    assert waiting(files, "data/100/x.bin") is None  # a numbered dir without Orbax's file


def test_a_file_modified_within_min_age_waits():
    files = {"a/b.bin": b"x"}
    assert waiting(files, "a/b.bin", min_age_s=30) is not None  # modified "now"

    async def mtime() -> float:
        store = MemoryStore("src")
        await store.put("a/b.bin", b"x")
        return (await store.head("a/b.bin")).mtime or 0.0

    info_mtime = asyncio.run(mtime())
    assert waiting(files, "a/b.bin", min_age_s=30, now=info_mtime + 3600) is None


def test_every_framework_marker_is_written_last():
    for framework in FRAMEWORKS:
        if framework.marker:
            assert is_commit_marker(f"some/dir/{framework.marker}"), framework.name
    assert set(MARKERS) >= {"*.index.json", "config.json", "latest", "COMMIT", "_SUCCESS"}
    assert not is_commit_marker("some/dir/model-00001-of-00002.safetensors")


def test_completion_caches_one_check_per_directory():
    calls: list[str] = []

    class Counting(MemoryStore):
        async def head(self, key: str) -> ObjectInfo:
            calls.append(key)
            return await super().head(key)

    async def go() -> None:
        store = Counting("src")
        for i in range(5):
            await store.put(f"hf/checkpoint-7/f{i}", b"x")
        completion = Completion(store)
        for i in range(5):
            info = await store.head(f"hf/checkpoint-7/f{i}")
            assert await completion.waiting(info) is not None
        assert completion.waiting_dirs == {
            "hf/checkpoint-7": "Hugging Face Trainer checkpoint not complete: no "
                               "trainer_state.json yet"}

    asyncio.run(go())
    assert calls.count("hf/checkpoint-7/trainer_state.json") == 1


def test_the_listing_answers_for_the_keys_it_has_passed():
    listed = Listed(keep=2)
    assert listed.holds("a") is None  # nothing listed yet
    for key in ("b", "d", "f", "h"):
        listed.add(key)
    assert listed.holds("d") is True and listed.holds("h") is True
    assert listed.holds("c") is False and listed.holds("a") is False  # passed, not there
    assert listed.holds("i") is None  # not reached yet
    listed.add("j")  # "b" and "d" fall out: before "f" nothing is known any more
    assert listed.holds("c") is None and listed.holds("d") is None
    assert listed.holds("g") is False and listed.holds("f") is True


def _checked(files: dict[str, bytes], key: str) -> tuple[str | None, list[str]]:
    """``waiting`` for ``key`` with the listing run up to it (as the engine calls it): the
    verdict and the keys HEAD was asked for."""
    heads: list[str] = []

    class Counting(MemoryStore):
        async def head(self, key: str) -> ObjectInfo:
            heads.append(key)
            return await super().head(key)

    async def go() -> str | None:
        store = Counting("src")
        for k, data in files.items():
            await store.put(k, data)
        info = await store.head(key)
        heads.clear()
        completion = Completion(store, clock=lambda: info.mtime)
        for k in sorted(files):
            if k > key:
                break
            completion.listed(k)
        return await completion.waiting(info)

    return asyncio.run(go()), heads


def test_markers_the_listing_has_passed_cost_no_head():
    # Orbax's probe (sorts before a directory's lower-case files) is answered by the listing:
    # a Hugging Face directory costs one HEAD, for trainer_state.json, still ahead.
    hf = {"hf/checkpoint-5/config.json": b"{}", "hf/checkpoint-5/model.safetensors": b"w",
          "hf/checkpoint-5/trainer_state.json": b"{}"}
    assert _checked(hf, "hf/checkpoint-5/config.json") == (
        None, ["hf/checkpoint-5/trainer_state.json"])
    # DCP's .metadata and NeMo's -unfinished sibling come before the files they speak for.
    dcp = {"run/step-9/.metadata": b"m", "run/step-9/__0_0.distcp": b"d"}
    assert _checked(dcp, "run/step-9/__0_0.distcp") == (None, [])
    why, heads = _checked({"run/step-9/__0_0.distcp": b"d"}, "run/step-9/__0_0.distcp")
    assert why is not None and "no .metadata yet" in why and heads == []
    nemo = {"n/gpt--step=5.ckpt-unfinished": b"", "n/gpt--step=5.ckpt/weights": b"w"}
    why, heads = _checked(nemo, "n/gpt--step=5.ckpt/weights")
    assert why is not None and "still being written" in why and heads == []
    # Orbax recognised from the listing; its commit file asked for while still ahead of the
    # key, answered by the listing once passed. Missing either way.
    ox = {"ox/100/_CHECKPOINT_METADATA": b"{}", "ox/100/array_metadatas/a": b"w",
          "ox/100/state/d": b"w"}
    why, heads = _checked(ox, "ox/100/array_metadatas/a")
    assert why is not None and why.startswith("Orbax") and heads == ["ox/100/commit_success.txt"]
    why, heads = _checked(ox, "ox/100/state/d")
    assert why is not None and why.startswith("Orbax") and heads == []
    complete = ox | {"ox/100/commit_success.txt": b"ok"}
    assert _checked(complete, "ox/100/state/d") == (None, [])
