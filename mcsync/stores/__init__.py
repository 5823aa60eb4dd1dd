"""The stores mcsync reads and writes, and how to open one from an address::

    from mcsync.stores import StoreOptions, open_store
    store = open_store("s3://bucket/prefix/", StoreOptions(endpoint_url="https://..."))

``Store`` (and ``ReadStore``, a source only) is the protocol an implementation of your own
follows; ``mcsync.sync`` takes any store object in place of an address.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..config import StoreOptions
from ..types import ObjectInfo
from .base import ReadStore, Store

if TYPE_CHECKING:
    from .registry import open_store

__all__ = ["ObjectInfo", "ReadStore", "Store", "StoreOptions", "open_store"]


def __getattr__(name: str) -> Any:
    # The registry imports every store's module (botocore's among them): loaded when
    # open_store is first asked for, not by whoever imports one store or the protocols.
    if name == "open_store":
        from .registry import open_store

        return open_store
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
