"""The directory-by-directory listing of an S3 store, for an endpoint that does not list in
byte order; it sends no request itself (its pages come from the caller).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any


async def tree_walk(level_pages: Callable[[str], AsyncIterator[dict[str, Any]]],
                    prefix: str) -> AsyncIterator[dict[str, Any]]:
    """Every object under ``prefix`` in byte order, from ``level_pages(prefix)``: the pages
    (``Contents``, ``CommonPrefixes``) of one level listed with the delimiter "/". A level's
    subdirectories are collected first (a pass that keeps only their names), then its files
    are streamed with each subdirectory walked at its byte-order place. Within one level file
    names hold no '/', so any server's name order is byte order. A level that fits one page
    is listed once."""
    dirs: list[str] = []
    first_files: list[dict[str, Any]] = []
    pages = 0
    async for page in level_pages(prefix):
        pages += 1
        dirs.extend(cp["Prefix"] for cp in page.get("CommonPrefixes", ()))
        if pages == 1:
            first_files = page.get("Contents", [])
    dirs.sort()
    files = _aiter(first_files) if pages <= 1 else _contents(level_pages(prefix))
    i = 0
    async for c in files:
        while i < len(dirs) and dirs[i] < c["Key"]:
            async for sub in tree_walk(level_pages, dirs[i]):
                yield sub
            i += 1
        yield c
    for d in dirs[i:]:
        async for sub in tree_walk(level_pages, d):
            yield sub


async def _contents(pages: AsyncIterator[dict[str, Any]]) -> AsyncIterator[dict[str, Any]]:
    async for page in pages:
        for c in page.get("Contents", ()):
            yield c


async def _aiter(items: list[dict[str, Any]]) -> AsyncIterator[dict[str, Any]]:
    for item in items:
        yield item
