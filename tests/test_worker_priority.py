"""`run_sync_below_the_loop`: work on a thread of its own at a lower OS priority than the event
loop's, otherwise as `trio.to_thread.run_sync` runs it (actors/worker_priority.py). Real
threads and the kernel's own per-thread nice values."""

from __future__ import annotations

import contextvars
import os
import sys
import threading

import pytest
import trio
import trio.testing

from toolwire.actors.worker_priority import WORKER_NICE, lower_this_thread, run_sync_below_the_loop

linux_only = pytest.mark.skipif(sys.platform != "linux", reason="per-thread nice is Linux's")


def nice_of_this_thread() -> int:
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


@pytest.fixture
def below_worker_nice() -> None:
    if os.getpriority(os.PRIO_PROCESS, 0) >= WORKER_NICE:
        pytest.skip(f"the tests run at nice {WORKER_NICE} already: nothing to lower")


@linux_only
async def test_the_work_runs_on_a_new_lowered_thread_and_nothing_else_is_lowered(
    below_worker_nice: None,
) -> None:
    loop_nice = nice_of_this_thread()
    seen = await run_sync_below_the_loop(
        lambda: (threading.get_ident(), nice_of_this_thread(), threading.current_thread().name)
    )
    ident, nice, name = seen
    assert ident != threading.get_ident()
    assert nice == WORKER_NICE
    assert name.startswith("toolwire worker below the loop")
    assert nice_of_this_thread() == loop_nice
    # trio's cached workers, which run every other job of the process, keep their priority.
    for _ in range(3):
        assert await trio.to_thread.run_sync(nice_of_this_thread) == loop_nice


async def test_the_result_and_the_exception_of_the_work_reach_the_caller() -> None:
    assert await run_sync_below_the_loop(lambda a, b: a + b, 2, 3) == 5

    def fails() -> None:
        raise KeyError("no such thing")

    with pytest.raises(KeyError, match="no such thing"):
        await run_sync_below_the_loop(fails)


async def test_the_work_sees_the_callers_context() -> None:
    var: contextvars.ContextVar[str] = contextvars.ContextVar("var")
    var.set("the caller's")
    assert await run_sync_below_the_loop(var.get) == "the caller's"


async def test_a_cancel_waits_for_the_real_end_and_the_result_is_kept() -> None:
    started = threading.Event()
    go_on = threading.Event()
    results: list[str] = []

    def work() -> str:
        started.set()
        go_on.wait()
        return "done"

    async def call(scope: trio.CancelScope) -> None:
        with scope:
            results.append(await run_sync_below_the_loop(work))

    scope = trio.CancelScope()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(call, scope)
        await trio.to_thread.run_sync(started.wait)
        scope.cancel()
        await trio.testing.wait_all_tasks_blocked()
        assert results == []  # still waiting for the thread, cancel or not
        go_on.set()
    assert results == ["done"]


async def test_the_calls_count_against_trios_default_thread_limiter() -> None:
    trio.to_thread.current_default_thread_limiter().total_tokens = 1
    first_in = threading.Event()
    release_first = threading.Event()
    order: list[str] = []

    def first() -> None:
        order.append("first starts")
        first_in.set()
        release_first.wait()
        order.append("first ends")

    def second() -> None:
        order.append("second starts")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(run_sync_below_the_loop, first)
        await trio.to_thread.run_sync(first_in.wait, limiter=trio.CapacityLimiter(1))
        nursery.start_soon(run_sync_below_the_loop, second)
        await trio.testing.wait_all_tasks_blocked()
        assert order == ["first starts"]  # the second waits for the one token
        release_first.set()
    assert order == ["first starts", "first ends", "second starts"]


@linux_only
def test_lowering_never_raises_priority_and_says_where_the_thread_is(
    below_worker_nice: None,
) -> None:
    def in_a_thread(nice: int) -> tuple[bool, int]:
        out: list[tuple[bool, int]] = []

        def body() -> None:
            out.append((lower_this_thread(nice), nice_of_this_thread()))

        t = threading.Thread(target=body)
        t.start()
        t.join()
        return out[0]

    process_nice = os.getpriority(os.PRIO_PROCESS, 0)
    assert in_a_thread(WORKER_NICE) == (True, WORKER_NICE)
    # Asked for a higher priority than it has, a thread keeps its own, lower one.
    assert in_a_thread(process_nice - 1) == (True, process_nice)
