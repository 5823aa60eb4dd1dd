"""What one hand-off of a blocking call to a thread costs, by the ways mcsync could make it:
process CPU per hand-off of a call that returns at once, 16 in flight, on mcsync's loop.

    python benchmarks/handoff.py [--calls 20000]

Results: benchmarks/results/2026-12-07-thread-handoff.md.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor

from mcsync import run_blocking
from mcsync.tasks import Threads

IN_FLIGHT = 16


def answer(x: int) -> int:
    return x


async def measure(hand_off: Callable[[int], Awaitable[int]], calls: int) -> float:
    slots = asyncio.Semaphore(IN_FLIGHT)

    async def one(i: int) -> None:
        async with slots:
            assert await hand_off(i) == i

    start = time.process_time()
    await asyncio.gather(*(one(i) for i in range(calls)))
    return (time.process_time() - start) / calls * 1e6


async def main(calls: int) -> None:
    executor = ThreadPoolExecutor(8)
    threads = Threads(8, "handoff")
    loop = asyncio.get_running_loop()
    ways: dict[str, Callable[[int], Awaitable[int]]] = {
        "asyncio.to_thread": lambda i: asyncio.to_thread(answer, i),
        "run_in_executor": lambda i: loop.run_in_executor(executor, answer, i),
        "run_in_executor, shielded": lambda i: asyncio.shield(
            loop.run_in_executor(executor, answer, i)),
        "tasks.Threads": lambda i: threads.run(answer, i),
    }
    for name, way in ways.items():
        print(f"{name:28s} {await measure(way, calls):6.1f} µs CPU per hand-off")
    executor.shutdown()
    threads.close()


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--calls", type=int, default=20000)
    run_blocking(main(p.parse_args().calls))
