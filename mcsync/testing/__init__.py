"""Helpers for tests, the quickstart and benchmarks: local S3-compatible servers.

Nothing in here is used by the engine itself. The names are loaded lazily so that
``python -m mcsync.testing.servers`` does not import the module twice.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mcsync.testing.servers import S3Endpoint, free_port, moto_server, seaweedfs

__all__ = ["S3Endpoint", "free_port", "moto_server", "seaweedfs"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from mcsync.testing import servers

        return getattr(servers, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
