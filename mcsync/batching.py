"""``Batcher``: items handed in one at a time, sent in batches, each item's result handed back.

A batch closes at ``max_items`` items or ``max_size`` summed size (whichever comes first), or
``linger_s`` after its first item when neither is reached (Kafka's ``linger.ms``). Each closed
batch is sent by ``send`` as a task of its own, so batches overlap; ``send`` returns one result
per item, in order. Whole-object tasks of ``--workers`` (``scale.workers``) and part tasks of an
upload (``move.part_tasks``) are both this.

Cancellation: the caller of ``submit`` may be cancelled while its item waits (a stop's grace
over). An item whose waiter is gone is left out of its batch when the batch closes, and a batch
left empty is not sent. A batch whose send fails gives each waiter the error (cancelled when
the send was cancelled), and ``aclose`` cancels what is being sent.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

from .tasks import cancel_and_wait, fail_waiting

T = TypeVar("T")
R = TypeVar("R")


class Batcher(Generic[T, R]):
    """Items in, batches of them sent by ``send``, each item's result out."""

    def __init__(self, send: Callable[[list[T]], Awaitable[Sequence[R]]], *,
                 size: Callable[[T], int], max_items: int, max_size: int,
                 linger_s: float) -> None:
        self._send_batch = send
        self._size = size
        self.max_items = max_items
        self.max_size = max_size
        self.linger_s = linger_s
        self._batch: list[tuple[T, asyncio.Future[R]]] = []
        self._batch_size = 0
        self._timer: asyncio.TimerHandle | None = None
        self._sending: set[asyncio.Task[None]] = set()

    async def submit(self, item: T) -> R:
        """``item``'s result, once the batch it went in was sent."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[R] = loop.create_future()
        self._batch.append((item, fut))
        self._batch_size += self._size(item)
        if len(self._batch) >= self.max_items or self._batch_size >= self.max_size:
            self.flush()
        elif self._timer is None:
            self._timer = loop.call_later(self.linger_s, self.flush)
        return await fut

    def flush(self) -> None:
        """Close the batch being filled now and start sending it."""
        self._stop_timer()
        # Items whose waiter was cancelled (a stop's grace over) are not sent.
        batch = [(item, fut) for item, fut in self._batch if not fut.cancelled()]
        self._batch, self._batch_size = [], 0
        if not batch:
            return
        sending = asyncio.create_task(self._send(batch))
        self._sending.add(sending)
        sending.add_done_callback(self._sending.discard)

    async def _send(self, batch: list[tuple[T, asyncio.Future[R]]]) -> None:
        try:
            results = await self._send_batch([item for item, _ in batch])
        except BaseException as exc:
            fail_waiting((fut for _, fut in batch), exc)
            raise
        for (_, fut), result in zip(batch, results, strict=True):
            if not fut.done():
                fut.set_result(result)

    async def aclose(self) -> None:
        """Nothing left waiting: the batch being filled is dropped (its waiters are the
        caller's to cancel) and the batches being sent are cancelled and waited for."""
        self._stop_timer()
        await cancel_and_wait(*self._sending, quiet=True)

    def _stop_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
