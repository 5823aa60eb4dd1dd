"""A process of its own using the node cache, for the tests that need several:
``python -m tests.cache.child DIR read URL [START_FILE]`` opens URL through the cache in DIR
(after START_FILE exists, so several start together) and prints the SHA-256 of what it read
and the bytes it fetched itself."""

from __future__ import annotations

import hashlib
import sys
import time
from pathlib import Path

from mcsync.cache import Cache


def digest_of(cache: Cache, url: str) -> tuple[str, int]:
    """In a worker process (a data loader's): the SHA-256 of ``url`` read through ``cache``,
    and the bytes this process fetched."""
    with cache.open(url) as f:
        return hashlib.sha256(f.read()).hexdigest(), cache.stats.bytes_fetched


def main(argv: list[str]) -> int:
    cache_dir, command, url, *rest = argv
    if rest:
        while not Path(rest[0]).exists():
            time.sleep(0.002)
    with Cache(cache_dir, part_size=1 << 20) as cache:
        if command == "read":
            with cache.open(url) as f:
                digest = hashlib.sha256(f.read()).hexdigest()
        elif command == "path":
            digest = hashlib.sha256(cache.path(url).read_bytes()).hexdigest()
        else:
            raise SystemExit(f"unknown command {command}")
        print(digest, cache.stats.bytes_fetched, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
