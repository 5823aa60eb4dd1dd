"""--shard: the split of the keys (every key in exactly one shard, the same in every process,
one checkpoint directory's files spread over the shards), --shard auto's variables, and the
names a shard's state takes."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mcsync.config import SyncOptions
from mcsync.errors import UsageError
from mcsync.records import Pair
from mcsync.run.plan import plan
from mcsync.state.manifest import default_path
from mcsync.state.shard import holds, of_name, parse, shard_of, sharded, suffix
from mcsync.types import ObjectInfo

keys = st.text(st.characters(blacklist_categories=["Cs"]), min_size=1, max_size=80)

# Computed once: a change of the hash (or of what is hashed) moves keys between shards, and a
# Job resumed after an upgrade would copy keys another shard already copied. Pinned (the last
# moved once, on purpose, when a checkpoint directory stopped being one unit: issue 40).
PINNED = {("data/train-00000.parquet", 8): 0, ("data/train-00001.parquet", 8): 2,
          ("a", 3): 1, ("日本語/ファイル.bin", 5): 3,
          ("run/checkpoint-500/model.safetensors", 7): 1}


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


@pytest.mark.parametrize("directory", ["run/checkpoint-500", "ds/global_step100",
                                       "mg/iter_0000100/mp_rank_00", "dcp/step_5",
                                       "nemo/gpt--step=1000-consumed=8"])
def test_one_checkpoint_directory_s_files_spread_over_the_shards(directory: str) -> None:
    """Each file is hashed on its own key: the shard files of one 500 GB directory go to every
    pod of the Job, not to the one its directory's name hashes to."""
    files = [f"{directory}/zero_pp_rank_{i}_mp_rank_00_optim_states.pt" for i in range(64)]
    counts = [sum(1 for k in files if shard_of(k, 8) == i) for i in range(8)]
    assert min(counts) > 0 and max(counts) <= 2 * len(files) // 8, counts


def test_a_key_is_hashed_whole() -> None:
    """Two keys differing only in the file name, or only in the directory, are hashed apart:
    nothing of the key is cut away before hashing."""
    assert len({shard_of(f"run/checkpoint-500/{f}", 64) for f in
                ("config.json", "trainer_state.json", "model.safetensors",
                 "optimizer.pt", "scheduler.pt", "rng_state.pth")}) > 1
    assert len({shard_of(f"run/checkpoint-{s}/config.json", 64) for s in range(0, 600, 100)}) > 1


def test_sharded_is_a_split_of_more_than_one() -> None:
    assert not sharded(None) and not sharded((0, 1))
    assert sharded((0, 2)) and sharded((7, 8))


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
