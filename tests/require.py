"""``MCSYNC_TEST_REQUIRE``: what a machine must have for its tests (``.ci/run`` sets it). A test
that needs something named there (FUSE mounts, a Ray cluster, promtool) and cannot get it
FAILS with the reason, instead of skipping: on CI a skip would hide the test that never ran.
Unset (a developer's machine), such a test skips with the same reason.

    MCSYNC_TEST_REQUIRE=fuse,ray,promtool pytest ...
"""

from __future__ import annotations

import os
from typing import NoReturn

import pytest

VARIABLE = "MCSYNC_TEST_REQUIRE"
KNOWN = {
    "fuse": "a FUSE mount of a bucket (weed mount): /dev/fuse, root, umount",
    "ray": "a local Ray cluster (the ray extra: pip install 'mcsync[ray]')",
    "promtool": "Prometheus's promtool, for the alert rules (Debian's prometheus package)",
}


def required() -> frozenset[str]:
    """What ``MCSYNC_TEST_REQUIRE`` names; a name it does not know is a usage error (a typo
    would otherwise require nothing)."""
    names = frozenset(n.strip() for n in os.environ.get(VARIABLE, "").split(",") if n.strip())
    unknown = sorted(names - KNOWN.keys())
    if unknown:
        raise pytest.UsageError(f"{VARIABLE}: unknown {', '.join(unknown)} (known: "
                                f"{', '.join(sorted(KNOWN))})")
    return names


def unavailable(need: str, reason: str) -> NoReturn:
    """``need`` (a key of ``KNOWN``) is missing here, for ``reason``: the test fails when
    ``MCSYNC_TEST_REQUIRE`` names it, and skips otherwise."""
    assert need in KNOWN, need
    if need in required():
        pytest.fail(f"{VARIABLE} requires {need} ({KNOWN[need]}), not here: {reason}",
                    pytrace=False)
    pytest.skip(reason)
