"""A node-local cache of remote objects: ``from mcsync.cache import Cache``."""

from ..errors import CacheFull
from .cache import Cache, Validation

__all__ = ["Cache", "CacheFull", "Validation"]
