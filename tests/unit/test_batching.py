"""The one batcher of tasks (``mcsync.batching``): a batch closes at its count, at its size or
when it has lingered; a waiter cancelled while its batch fills is left out of it."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

from mcsync.batching import Batcher


class Sender:
    """Records each batch it is given and answers each item with its double; ``hold`` keeps
    every send waiting until it is set."""

    def __init__(self) -> None:
        self.batches: list[list[int]] = []
        self.hold: asyncio.Event | None = None

    async def __call__(self, items: list[int]) -> list[int]:
        self.batches.append(list(items))
        if self.hold is not None:
            await self.hold.wait()
        return [2 * i for i in items]


def run(test: Callable[..., Coroutine[Any, Any, None]]) -> Callable[..., None]:
    """An async test run on a loop of its own."""
    @functools.wraps(test)
    def sync(*args: Any, **kwargs: Any) -> None:
        asyncio.run(asyncio.wait_for(test(*args, **kwargs), 10))

    return sync


def batcher(sender: Sender, *, max_items: int = 100, max_size: int = 10**9,
            linger_s: float = 60.0) -> Batcher[int, int]:
    return Batcher(sender, size=lambda item: item, max_items=max_items, max_size=max_size,
                   linger_s=linger_s)


@run
async def test_a_batch_closes_at_its_count_without_waiting_for_the_linger():
    sender = Sender()
    b = batcher(sender, max_items=3, linger_s=60.0)
    results = await asyncio.wait_for(asyncio.gather(*(b.submit(i) for i in range(1, 7))), 5)
    assert results == [2, 4, 6, 8, 10, 12]
    assert sender.batches == [[1, 2, 3], [4, 5, 6]]
    await b.aclose()


@run
async def test_a_batch_closes_at_its_size_with_the_item_that_reaches_it():
    sender = Sender()
    b = batcher(sender, max_size=10, linger_s=60.0)
    results = await asyncio.wait_for(asyncio.gather(b.submit(4), b.submit(5), b.submit(1),
                                                    b.submit(10)), 5)
    assert results == [8, 10, 2, 20]
    assert sender.batches == [[4, 5, 1], [10]]  # 4+5+1 reaches 10; 10 alone does too
    await b.aclose()


@run
async def test_a_part_full_batch_goes_when_its_linger_expires():
    sender = Sender()
    b = batcher(sender, max_items=100, linger_s=0.05)
    loop = asyncio.get_running_loop()
    began = loop.time()
    first = asyncio.create_task(b.submit(1))
    await asyncio.sleep(0.01)
    second = asyncio.create_task(b.submit(2))
    assert await asyncio.wait_for(asyncio.gather(first, second), 5) == [2, 4]
    # One batch, sent once the first item had waited its linger (not restarted by the second).
    assert sender.batches == [[1, 2]]
    assert loop.time() - began >= 0.05
    third = await asyncio.wait_for(b.submit(3), 5)  # a new batch, a new linger
    assert third == 6 and sender.batches == [[1, 2], [3]]
    await b.aclose()


@run
async def test_a_waiter_cancelled_while_its_batch_fills_is_left_out_of_it():
    sender = Sender()
    b = batcher(sender, max_items=3, linger_s=60.0)
    kept = asyncio.create_task(b.submit(1))
    gone = asyncio.create_task(b.submit(2))
    await asyncio.sleep(0)  # both are in the half-full batch
    gone.cancel()
    await asyncio.sleep(0)
    assert gone.cancelled() and sender.batches == []
    closing = asyncio.create_task(b.submit(3))  # the third item closes the batch
    assert await asyncio.wait_for(asyncio.gather(kept, closing), 5) == [2, 6]
    assert sender.batches == [[1, 3]]
    await b.aclose()


@run
async def test_a_batch_whose_waiters_were_all_cancelled_is_not_sent():
    sender = Sender()
    b = batcher(sender, linger_s=0.01)
    waiting = [asyncio.create_task(b.submit(i)) for i in (1, 2)]
    await asyncio.sleep(0)
    for task in waiting:
        task.cancel()
    await asyncio.sleep(0.05)  # the linger expired over an all-cancelled batch
    assert sender.batches == []
    await b.aclose()


@run
async def test_a_failed_send_fails_each_waiter_of_its_batch():
    async def failing(items: list[int]) -> list[int]:
        raise OSError(f"lost {items}")

    b: Batcher[int, int] = Batcher(failing, size=lambda item: item, max_items=2,
                                   max_size=10**9, linger_s=60.0)
    results = await asyncio.gather(b.submit(1), b.submit(2), return_exceptions=True)
    assert [str(r) for r in results] == ["lost [1, 2]", "lost [1, 2]"]
    await b.aclose()


@run
async def test_aclose_cancels_the_batches_being_sent_and_their_waiters():
    sender = Sender()
    sender.hold = asyncio.Event()  # never set: the send hangs
    b = batcher(sender, max_items=2)
    waiting = [asyncio.create_task(b.submit(i)) for i in (1, 2)]
    await asyncio.sleep(0.01)
    assert sender.batches == [[1, 2]]
    await asyncio.wait_for(b.aclose(), 5)
    done, _ = await asyncio.wait(waiting, timeout=5)
    assert len(done) == 2 and all(t.cancelled() for t in done)


@pytest.mark.parametrize("max_items", [1, 4])
@run
async def test_each_item_gets_its_own_result_across_overlapping_batches(max_items):
    sender = Sender()
    b = batcher(sender, max_items=max_items, linger_s=0.001)
    items = list(range(1, 20))
    assert await asyncio.wait_for(asyncio.gather(*(b.submit(i) for i in items)), 5) == [
        2 * i for i in items]
    assert sorted(i for batch in sender.batches for i in batch) == items
    assert all(len(batch) <= max_items for batch in sender.batches)
    await b.aclose()
