"""--shard: the split of the keys (every key in exactly one shard, the same in every process),
what a key is hashed on, --shard auto's variables, and the names a shard's state takes."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mcsync.config import SyncOptions
from mcsync.errors import UsageError
from mcsync.records import Pair
from mcsync.run.plan import plan
from mcsync.state.manifest import default_path
from mcsync.state.shard import holds, of_name, parse, shard_key, shard_of, suffix
from mcsync.types import ObjectInfo

keys = st.text(st.characters(blacklist_categories=["Cs"]), min_size=1, max_size=80)

# Computed once: a change of the hash (or of what is hashed) moves keys between shards, and a
# Job resumed after an upgrade would copy keys another shard already copied. Pinned.
PINNED = {("data/train-00000.parquet", 8): 0, ("data/train-00001.parquet", 8): 2,
          ("a", 3): 1, ("日本語/ファイル.bin", 5): 3,
          ("run/checkpoint-500/model.safetensors", 7): 4}


@given(keys, st.integers(min_value=1, max_value=64))
def test_every_key_is_in_exactly_one_shard(key: str, count: int) -> None:
    owners = [i for i in range(count) if holds((i, count), key)]
    assert owners == [shard_of(key, count)]


@given(st.lists(keys, min_size=1, max_size=50), st.integers(min_value=1, max_value=16))
def test_the_shards_partition_any_set_of_keys(names: list[str], count: int) -> None:
    parts = [{k for k in names if holds((i, count), k)} for i in range(count)]
    assert set().union(*parts) == set(names)
    assert sum(map(len, parts)) == len(set(names))


@given(keys)
def test_one_shard_is_every_key_and_none_is_too(key: str) -> None:
    assert holds((0, 1), key) and holds(None, key)


def test_the_split_is_pinned() -> None:
    assert {k: shard_of(*k) for k in PINNED} == PINNED


def test_keys_spread_over_the_shards() -> None:
    names = [f"data/{i:05}.bin" for i in range(8000)]
    counts = [sum(1 for k in names if shard_of(k, 8) == i) for i in range(8)]
    assert min(counts) > 850 and max(counts) < 1150, counts


@pytest.mark.parametrize(("key", "hashed_on"), [
    ("run/checkpoint-500/model-00001-of-00002.safetensors", "run/checkpoint-500"),
    ("run/checkpoint-500/trainer_state.json", "run/checkpoint-500"),
    ("ds/global_step100/mp_rank_00_model_states.pt", "ds/global_step100"),
    ("mg/iter_0000100/mp_rank_00/model_optim_rng.pt", "mg/iter_0000100"),
    ("nemo/gpt--step=1000-consumed=8/weights.bin", "nemo/gpt--step=1000-consumed=8"),
    # not recognised by name: each key on its own
    ("ds/latest", "ds/latest"),
    ("data/2024/part-00001.parquet", "data/2024/part-00001.parquet"),
    ("dcp/step_5/__0_0.distcp", "dcp/step_5/__0_0.distcp"),
    ("checkpoint-500", "checkpoint-500"),  # a file of that name is no directory
    ("big.bin", "big.bin"),
])
def test_a_checkpoint_directory_known_by_name_is_one_unit(key: str, hashed_on: str) -> None:
    assert shard_key(key) == hashed_on


def test_a_checkpoint_and_its_markers_share_a_shard() -> None:
    files = ["model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors",
             "model.safetensors.index.json", "config.json", "trainer_state.json"]
    for step in range(0, 5000, 500):
        assert len({shard_of(f"run/checkpoint-{step}/{f}", 8) for f in files}) == 1


@pytest.mark.parametrize(("text", "shard"), [("0/1", (0, 1)), ("2/8", (2, 8)),
                                             (" 7 / 8 ", (7, 8))])
def test_shard_i_of_n(text: str, shard: tuple[int, int]) -> None:
    assert parse(text, {}) == shard


@pytest.mark.parametrize(("text", "says"), [
    ("8/8", "from 0 to N - 1"), ("1/0", "from 0 to N - 1"), ("-1/4", "I/N"),
    ("1-4", "I/N"), ("", "I/N"), ("a/b", "I/N"), ("1/2/3", "I/N")])
def test_a_malformed_shard_is_refused(text: str, says: str) -> None:
    with pytest.raises(UsageError, match=says):
        parse(text, {})


def test_auto_reads_the_jobs_variables() -> None:
    assert parse("auto", {"JOB_COMPLETION_INDEX": "3", "JOB_COMPLETIONS": "8"}) == (3, 8)


@pytest.mark.parametrize(("env", "says"), [
    ({"JOB_COMPLETIONS": "8"}, "JOB_COMPLETION_INDEX is not set"),
    ({"JOB_COMPLETION_INDEX": "3"}, "JOB_COMPLETIONS is not set"),
    ({"JOB_COMPLETION_INDEX": "3", "JOB_COMPLETIONS": ""}, "JOB_COMPLETIONS is not set"),
    ({"JOB_COMPLETION_INDEX": "x", "JOB_COMPLETIONS": "8"},
     "JOB_COMPLETION_INDEX is not a whole number: 'x'"),
    ({"JOB_COMPLETION_INDEX": "1", "JOB_COMPLETIONS": "-2"},
     "JOB_COMPLETIONS is not a whole number"),
    ({"JOB_COMPLETION_INDEX": "8", "JOB_COMPLETIONS": "8"},
     "JOB_COMPLETION_INDEX=8 is not below JOB_COMPLETIONS=8"),
])
def test_auto_names_the_variable_missing_or_malformed(env: dict[str, str], says: str) -> None:
    with pytest.raises(UsageError, match=says) as caught:
        parse("auto", env)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("shard", [(1, 1), (-1, 3), (3, 3), (1.0, 3), (True, 2), [0, 2], (0,)])
def test_options_refuse_a_shard_that_is_none(shard: object) -> None:
    with pytest.raises(UsageError):
        SyncOptions(shard=shard)  # type: ignore[arg-type]


def test_one_shard_of_one_is_the_pair_s_own_state() -> None:
    assert suffix(None) == suffix((0, 1)) == ""
    assert suffix((2, 8)) == ".shard-2-of-8"
    assert default_path("s3://a/", "meta://b/", suffix((0, 1))) == default_path("s3://a/",
                                                                                 "meta://b/")
    assert default_path("s3://a/", "meta://b/", suffix((2, 8))).name.endswith(
        ".shard-2-of-8.sqlite")


def test_the_planner_leaves_another_shard_s_keys_alone() -> None:
    names = [f"k{i}" for i in range(200)]
    for key in names:
        info = ObjectInfo(key, 1, "e", 1.0)
        mine = shard_of(key, 4)
        for index in range(4):
            options = SyncOptions(shard=(index, 4), delete=True)
            copy = plan(Pair(key, info, None), options, server_side=False)
            delete = plan(Pair(key, None, info), options, server_side=False)
            assert (copy is not None) == (index == mine)
            assert (delete is not None and delete.kind == "delete") == (index == mine)


@pytest.mark.parametrize("shard", [None, (0, 1), (0, 2), (7, 8), (12, 100)])
def test_a_shard_is_read_back_from_its_state_s_name(shard: tuple[int, int] | None) -> None:
    expect = shard if shard is not None and shard[1] > 1 else None
    assert of_name(default_path("s3://a/", "meta://b/", suffix(shard)).name) == expect


def test_the_quick_test_of_shard_key_covers_every_checkpoint_directory_known_by_name() -> None:
    """shard_key skips keys holding none of "step", "iter_", "checkpoint-": a framework
    recognised by its directory's name alone must be one whose names all hold one of them."""
    from mcsync.checkpoints.frameworks import FRAMEWORKS

    by_name = {f.name: f.directory for f in FRAMEWORKS
               if f.directory is not None and f.contains is None}
    assert by_name == {"DeepSpeed": r"global_step\d+", "Megatron-LM": r"iter_\d{7}",
                       "NeMo": r".*step=\d+.*", "Hugging Face Trainer": r"checkpoint-\d+"}, (
        "a checkpoint directory known by name changed: update shard_key's quick test")
