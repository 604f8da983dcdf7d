"""What the simulation takes from trio beyond its runtime API, in one place: the virtual time
and in-memory streams of `trio.testing`, and trio's private hook for a deterministic
scheduler. The simulation is a harness (DESIGN.md: it runs the real shells in virtual time),
so these are its purpose, not test hooks in the server: `toolwire serve` never imports
`trio.testing` (tests/test_ws_private.py), and no other product module uses either
(tests/test_no_test_helpers.py).

trio's private names used here, all in `trio._core._run` (the ones trio's own hypothesis
plugin sets): `_ALLOW_DETERMINISTIC_SCHEDULING` and `_r`, the scheduler's `random.Random`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import trio
import trio.testing


def deterministic_scheduling(seed: int) -> None:
    """Make trio's scheduler a function of the seed.

    trio shuffles each batch of runnable tasks with its own `random.Random` (to keep code from
    relying on an order). Its hypothesis plugin makes that reproducible by sorting each batch by
    task creation order before shuffling with a seeded generator; the simulator does the same,
    seeding the generator with the seed.
    """
    import trio._core._run as trio_run

    setattr(trio_run, "_ALLOW_DETERMINISTIC_SCHEDULING", True)  # noqa: B010 - a Final global
    trio_run._r.seed(f"{seed}/trio")


def run_in_virtual_time(main: Callable[[], Awaitable[None]]) -> None:
    """`trio.run(main)` on a clock that jumps to the next deadline the moment every task
    waits: hours of timeouts and retries pass in milliseconds, in the same order every run."""
    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def memory_stream_pair() -> tuple[trio.StapledStream[Any, Any], trio.StapledStream[Any, Any]]:
    """Two connected in-memory byte streams (client end, server end): a simulated connection
    with no socket, whose bytes move only when the scheduler runs the tasks at its ends."""
    return trio.testing.memory_stream_pair()
