"""The check's page an S3 store keeps for the listing that follows: what a write of mcsync's own
state does to it (pure logic; the store around it is tested against SeaweedFS in
tests/stores/s3/test_check.py)."""

from __future__ import annotations

from datetime import UTC, datetime

from mcsync.stores.s3_listing import CheckPage, own_state

THEN = datetime(2026, 1, 1, tzinfo=UTC)


def _page(*keys: str, rest_after: str | None = None) -> CheckPage:
    return CheckPage([{"Key": k, "Size": 1, "ETag": '"e"', "LastModified": THEN} for k in keys],
                     rest_after)


def _keys(page: CheckPage) -> list[str]:
    return [c["Key"] for c in page.entries]


def test_a_write_goes_in_at_its_place_and_a_rewrite_replaces_the_entry() -> None:
    page = _page("p/a", "p/k")
    page.wrote("p/.mcsync/lock", 4, "e1")
    page.wrote("p/.mcsync/lock", 5, "e2")
    assert _keys(page) == ["p/.mcsync/lock", "p/a", "p/k"]
    entry = page.entries[0]
    assert (entry["Size"], entry["ETag"]) == (5, "e2")
    assert entry["LastModified"] > THEN


def test_a_write_beyond_a_full_page_is_left_to_the_rest_of_the_listing() -> None:
    page = _page("p/-a", "p/-b", rest_after="p/-b")
    page.wrote("p/.mcsync/lock", 4, "e")
    assert _keys(page) == ["p/-a", "p/-b"]


def test_a_delete_takes_the_entry_out_and_one_of_a_missing_key_changes_nothing() -> None:
    page = _page("p/.mcsync/old", "p/a")
    page.deleted("p/.mcsync/gone")
    page.deleted("p/.mcsync/old")
    assert _keys(page) == ["p/a"]


def test_only_mcsync_s_own_keys_count_as_its_state() -> None:
    assert own_state(".mcsync/lock-0123.json")
    assert not own_state("data/.mcsync/x") and not own_state(".mcsyncx")
