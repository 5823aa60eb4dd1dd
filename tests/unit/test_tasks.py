"""``tasks.cancel_and_wait``: tasks end before it returns, their errors are raised or not as
asked, and a cancellation of the caller is never swallowed."""

from __future__ import annotations

import asyncio

import pytest

from mcsync.tasks import cancel_and_wait


async def _slow_to_unwind(unwound: list[str]) -> None:
    try:
        await asyncio.sleep(100)
    except asyncio.CancelledError:
        await asyncio.sleep(0.05)  # cleanup that takes a moment (a request being closed)
        unwound.append("done")
        raise


def test_tasks_have_ended_when_it_returns() -> None:
    asyncio.run(_test_tasks_have_ended_when_it_returns())


async def _test_tasks_have_ended_when_it_returns() -> None:
    unwound: list[str] = []
    tasks = [asyncio.create_task(_slow_to_unwind(unwound)) for _ in range(3)]
    await asyncio.sleep(0)
    await cancel_and_wait(tasks[0], None, tasks[1], tasks[2])
    assert unwound == ["done"] * 3
    assert all(t.cancelled() for t in tasks)


def test_an_error_a_task_ended_with_is_raised_unless_quiet() -> None:
    asyncio.run(_test_an_error_a_task_ended_with_is_raised_unless_quiet())


async def _test_an_error_a_task_ended_with_is_raised_unless_quiet() -> None:
    async def fails() -> None:
        raise ValueError("renewal broke")

    for quiet in (False, True):
        task = asyncio.create_task(fails())
        await asyncio.sleep(0)  # it has failed before it is cancelled
        if quiet:
            await cancel_and_wait(task, quiet=True)
        else:
            with pytest.raises(ValueError, match="renewal broke"):
                await cancel_and_wait(task)


def test_the_callers_cancellation_is_not_swallowed() -> None:
    """The case ``with suppress(CancelledError): await task`` got wrong: the caller is
    cancelled (a second Ctrl-C) while it waits for a cancelled task to unwind."""
    asyncio.run(_test_the_callers_cancellation_is_not_swallowed())


async def _test_the_callers_cancellation_is_not_swallowed() -> None:
    unwound: list[str] = []
    went_on: list[str] = []

    async def caller() -> None:
        child = asyncio.create_task(_slow_to_unwind(unwound))
        await asyncio.sleep(0.01)
        await cancel_and_wait(child)
        went_on.append("after")

    outer = asyncio.create_task(caller())
    await asyncio.sleep(0.03)  # caller is waiting for the child to unwind
    outer.cancel()
    with pytest.raises(asyncio.CancelledError):
        await outer
    assert went_on == []
    await asyncio.sleep(0.1)
    assert unwound == ["done"]  # the child still ended
