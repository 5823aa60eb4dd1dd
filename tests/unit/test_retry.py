"""The one retry loop: by type, within attempts and deadline, never after a cancellation."""

import asyncio

import pytest

from mcsync.errors import NotFound, PreconditionFailed, Transient
from mcsync.retry import RetryPolicy, retrying


class Flaky:
    def __init__(self, *errors: BaseException) -> None:
        self.errors = list(errors)
        self.calls = 0

    async def __call__(self) -> str:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return "ok"


def run(coro):
    return asyncio.run(coro)


def test_transient_errors_are_retried_with_the_policys_backoff():
    slept: list[float] = []

    async def sleep(s: float) -> None:
        slept.append(s)

    call = Flaky(Transient("503"), Transient("reset"))
    policy = RetryPolicy(max_attempts=5, init_backoff_s=1.0, max_backoff_s=1.0)
    assert run(retrying(call, policy, sleep=sleep)) == "ok"
    assert call.calls == 3 and len(slept) == 2 and all(0 <= s <= 1.0 for s in slept)


def test_other_errors_are_raised_at_once():
    call = Flaky(NotFound("gone"))
    with pytest.raises(NotFound):
        run(retrying(call, RetryPolicy.immediate(5)))
    assert call.calls == 1


def test_the_last_error_is_raised_when_attempts_run_out():
    call = Flaky(*(Transient(f"try {i}") for i in range(5)))
    with pytest.raises(Transient, match="try 2"):
        run(retrying(call, RetryPolicy.immediate(3)))
    assert call.calls == 3


def test_the_deadline_ends_the_loop_before_a_wait_would_pass_it():
    now = [0.0]

    async def sleep(s: float) -> None:
        now[0] += s

    call = Flaky(*(Transient("slow down") for _ in range(100)))
    policy = RetryPolicy(max_attempts=100, init_backoff_s=4.0, max_backoff_s=4.0,
                         deadline_s=10.0)
    with pytest.raises(Transient):
        run(retrying(call, policy, sleep=sleep, clock=lambda: now[0]))
    assert now[0] <= 10.0 and call.calls < 100


def test_before_retry_is_awaited_and_sees_the_error():
    seen: list[str] = []

    async def refresh(exc: BaseException) -> None:
        seen.append(str(exc))

    call = Flaky(PreconditionFailed("changed"))
    assert run(retrying(call, RetryPolicy.immediate(2), retry_on=PreconditionFailed,
                        before_retry=refresh)) == "ok"
    assert seen == ["changed"]


def test_a_cancelled_call_is_not_retried():
    calls = []

    async def hangs() -> None:
        calls.append(1)
        await asyncio.sleep(3600)

    async def go() -> None:
        task = asyncio.create_task(retrying(hangs, RetryPolicy.immediate(5)))
        await asyncio.sleep(0.01)
        task.cancel()
        await task

    with pytest.raises(asyncio.CancelledError):
        run(go())
    assert calls == [1]
