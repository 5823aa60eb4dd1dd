"""A process of its own using the node cache, for the tests that need several:
``python -m tests.cache.child DIR read URL [START_FILE]`` opens URL through the cache in DIR
(after START_FILE exists, so several start together) and prints the SHA-256 of what it read
and the bytes it fetched itself; ``DIR paths WAIT URL...`` takes each URL's path (a cache
with ``wait=WAIT``) and prints the SHA-256 of each file read through it. ``read_random`` is a
data loader's worker, for multiprocessing pools."""

from __future__ import annotations

import hashlib
import random
import sys
import time
from pathlib import Path

from mcsync.cache import Cache


def digest_of(cache: Cache, url: str) -> tuple[str, int]:
    """In a worker process (a data loader's): the SHA-256 of ``url`` read through ``cache``,
    and the bytes this process fetched."""
    with cache.open(url) as f:
        return hashlib.sha256(f.read()).hexdigest(), cache.stats.bytes_fetched


def read_random(cache: Cache, urls: list[str], seed: int, reads: int) -> dict[str, str]:
    """In a worker process: ``reads`` paths of random URLs, each file read through its path
    right after the path is handed out; URL → SHA-256 of every read (differing reads of one
    URL fail at once)."""
    seen: dict[str, str] = {}
    for url in random.Random(seed).choices(urls, k=reads):
        path = cache.path(url)
        time.sleep(0.01)  # others' fills meanwhile: the path must stay
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        if seen.setdefault(url, digest) != digest:
            raise AssertionError(f"{url}: two reads differ")
    return seen


def main(argv: list[str]) -> int:
    if argv[1] == "paths":
        cache_dir, _, wait, *urls = argv
        with Cache(cache_dir, wait=float(wait)) as cache:
            for url in urls:
                print(hashlib.sha256(cache.path(url).read_bytes()).hexdigest(), flush=True)
        return 0
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
