"""``MCSYNC_TEST_REQUIRE``: a test whose need is missing skips, unless the variable names the
need: then it fails (CI sets it, so a test that never ran cannot pass as skipped)."""

from __future__ import annotations

import pytest

from tests.require import VARIABLE, required, unavailable


def test_a_missing_need_skips_where_nothing_is_required(monkeypatch) -> None:
    monkeypatch.delenv(VARIABLE, raising=False)
    with pytest.raises(pytest.skip.Exception, match="no Ray here"):
        unavailable("ray", "no Ray here")
    monkeypatch.setenv(VARIABLE, "fuse")
    with pytest.raises(pytest.skip.Exception):
        unavailable("ray", "no Ray here")


def test_a_missing_need_fails_where_it_is_required(monkeypatch) -> None:
    monkeypatch.setenv(VARIABLE, "fuse, ray,promtool")
    assert required() == {"fuse", "ray", "promtool"}
    with pytest.raises(pytest.fail.Exception, match=r"requires ray .*: no Ray here"):
        unavailable("ray", "no Ray here")


def test_an_unknown_need_is_a_usage_error(monkeypatch) -> None:
    monkeypatch.setenv(VARIABLE, "fuse,rya")
    with pytest.raises(pytest.UsageError, match="unknown rya"):
        required()
