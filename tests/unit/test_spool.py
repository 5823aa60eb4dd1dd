"""The spool of held-back actions: everything added comes back, in order, a page at a time."""

from mcsync.records import Action
from mcsync.state.spool import Spool
from mcsync.types import ObjectInfo


def test_actions_come_back_in_the_order_they_were_added_across_pages():
    spool = Spool()
    try:
        added = [Action("delete", f"k/{i:05d}", None, ObjectInfo(f"k/{i:05d}", i, f"e{i}", 1.5),
                        "not at source") for i in range(2500)]  # more than two pages
        for action in reversed(added):
            spool.add(action)
        assert len(spool) == 2500
        assert list(spool) == list(reversed(added))
        assert list(spool) == list(reversed(added))  # read again: nothing is consumed
    finally:
        spool.close()


def test_an_empty_spool_is_false_and_yields_nothing():
    spool = Spool()
    assert not spool and list(spool) == []
    spool.close()
