"""tasks.Threads: what to_thread promised (an answer, an error, a bounded set of threads, a
cancelled caller left alone), on real threads and, for fork, a real child process."""

from __future__ import annotations

import asyncio
import multiprocessing
import threading
import time

import pytest

from mcsync import run_blocking
from mcsync.tasks import Threads, off_loop


def test_answers_and_errors_come_back_to_the_caller() -> None:
    threads = Threads(2, "t-answers")

    def fail() -> None:
        raise ValueError("no such part")

    async def main() -> tuple[int, str]:
        total = await threads.run(sum, [1, 2, 3])
        name = await threads.run(lambda: threading.current_thread().name)
        with pytest.raises(ValueError, match="no such part"):
            await threads.run(fail)
        return total, name

    total, name = run_blocking(main())
    assert total == 6
    assert name.startswith("t-answers_") and name != threading.main_thread().name
    threads.close()


def test_no_more_than_the_limit_run_at_once() -> None:
    threads = Threads(3, "t-limit")
    lock = threading.Lock()
    running = most = 0

    def work() -> None:
        nonlocal running, most
        with lock:
            running += 1
            most = max(most, running)
        time.sleep(0.02)
        with lock:
            running -= 1

    async def main() -> None:
        await asyncio.gather(*(threads.run(work) for _ in range(24)))

    run_blocking(main())
    assert most == 3  # all three were used, never a fourth
    assert len([t for t in threading.enumerate() if t.name.startswith("t-limit_")]) == 3
    threads.close()


def test_a_cancelled_caller_leaves_the_threads_working() -> None:
    threads = Threads(1, "t-cancel")
    release = threading.Event()
    finished = threading.Event()
    errors: list[BaseException] = []

    def slow() -> str:
        release.wait(5)
        finished.set()
        return "late"

    async def main() -> str:
        asyncio.get_running_loop().set_exception_handler(
            lambda _loop, ctx: errors.append(ctx.get("exception") or RuntimeError(ctx)))
        waiting = asyncio.ensure_future(threads.run(slow))
        await asyncio.sleep(0.01)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        release.set()
        # the one thread finishes the dropped call, then takes the next
        return await threads.run(lambda: "next")

    assert run_blocking(main()) == "next"
    assert finished.is_set()
    assert errors == []
    threads.close()


def test_an_answer_for_a_closed_loop_is_dropped_quietly() -> None:
    threads = Threads(1, "t-closed")
    release = threading.Event()
    raised: list[BaseException | None] = []
    old_hook = threading.excepthook
    threading.excepthook = lambda args: raised.append(args.exc_value)

    def slow() -> None:
        release.wait(5)

    async def main() -> None:
        threads.run(slow)  # never awaited: the loop ends first

    try:
        run_blocking(main())
        release.set()  # the answer goes to a closed loop; the thread must live on
        assert run_blocking(asyncio.wait_for(_answer(threads), 5)) == 42
    finally:
        threading.excepthook = old_hook
    assert raised == []
    threads.close()


async def _answer(threads: Threads) -> int:
    return await threads.run(lambda: 42)


def _in_child(out: multiprocessing.Queue[object]) -> None:
    async def main() -> tuple[int, str]:
        return await off_loop(sum, [4, 5]), await off_loop(
            lambda: threading.current_thread().name)

    out.put(run_blocking(main()))


def test_a_forked_child_starts_threads_of_its_own() -> None:
    async def warm() -> int:
        return await off_loop(len, b"abc")  # the parent's threads exist before the fork

    assert run_blocking(warm()) == 3
    ctx = multiprocessing.get_context("fork")
    out: multiprocessing.Queue[object] = ctx.Queue()
    child = ctx.Process(target=_in_child, args=(out,))
    child.start()
    got = out.get(timeout=20)
    child.join(20)
    assert child.exitcode == 0
    assert got == (9, "mcsync-offload_1")


def test_a_closed_set_takes_no_more_work() -> None:
    threads = Threads(2, "t-close")
    assert run_blocking(_answer(threads)) == 42
    threads.close()
    with pytest.raises(RuntimeError, match="t-close: closed"):
        run_blocking(_answer(threads))
    deadline = time.monotonic() + 5
    while any(t.name.startswith("t-close_") for t in threading.enumerate()):
        assert time.monotonic() < deadline, "the threads did not end"
        time.sleep(0.01)
