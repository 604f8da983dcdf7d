"""A loop-lag probe inside a benchmark agent's own trio loop
(`python PATH/loop_lag.py MODULE ARGS...`, the agent module's own command line after it).

It runs MODULE (a benchmark server such as `toolwire.benchmarks.toolwire_server`) as `python -m
MODULE ARGS...` would, with one change: the server's `trio.run` gets two more tasks in its loop.

- A ticker that asks to wake every `TICK_S` (1 ms) and records how late each wake was: the
  time the loop was busy elsewhere (a step of another task, a GC pause, the GIL held by another
  thread) when the tick was due. Node's `monitorEventLoopDelay` measures the same way.
- A reader of this process's stdin: each line `lag` gets one JSON line on stdout with the ticks
  since the previous `lag` (`{"ticks": n, "worst_ms": .., "p99_ms": .., "p50_ms": ..}`), and
  starts a new window.

Why a wrapper run by path, not a flag of the server: the same probe must run in the working
tree's agent and in REF's (`toolwire bench --against REF`, `benchmarks/against.py`), whose
server may predate it; this file imports only the standard library and trio, so REF's
interpreter runs it unchanged, and both builds are measured by the same code. Why not always
on in the agent (`/metrics`): 1,000 wakeups a second cost an idle agent CPU and power, for a
figure only a benchmark needs. Why stdin: the benchmark already owns the server's pipes, and a
control line needs no port or endpoint the server under test would have to have.
"""

from __future__ import annotations

import json
import math
import os
import runpy
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import trio

# 1 ms: the ticker. Finer than the 5 ms a goal is judged at, coarse enough that the
# ticker's own wakeups (1,000/s, a few microseconds each) stay out of what it measures.
TICK_S = 0.001


class LagWindow:
    """The lateness of every tick since the window began."""

    def __init__(self) -> None:
        self.lags_s: list[float] = []

    def take(self) -> dict[str, float]:
        lags, self.lags_s = sorted(self.lags_s), []
        if not lags:
            return {"ticks": 0, "worst_ms": math.nan, "p99_ms": math.nan, "p50_ms": math.nan}

        def at(q: float) -> float:
            return lags[min(len(lags) - 1, math.ceil(q * len(lags)) - 1)] * 1000

        return {"ticks": len(lags), "worst_ms": lags[-1] * 1000, "p99_ms": at(0.99),
                "p50_ms": at(0.5)}  # fmt: skip


async def tick(window: LagWindow) -> None:
    due = trio.current_time() + TICK_S
    while True:
        await trio.sleep_until(due)
        now = trio.current_time()
        window.lags_s.append(max(0.0, now - due))
        # The next tick is due one interval after this one woke: a stall is one late tick,
        # not a burst of catch-up ticks with nothing between them.
        due = now + TICK_S


async def answer(window: LagWindow) -> None:
    stdin = trio.lowlevel.FdStream(os.dup(sys.stdin.fileno()))
    buffered = b""
    while True:
        data = await stdin.receive_some(4096)
        if not data:
            return  # the benchmark closed the pipe: keep serving, stop answering
        buffered += data
        while b"\n" in buffered:
            line, buffered = buffered.split(b"\n", 1)
            if line.strip() == b"lag":
                print(json.dumps(window.take()), flush=True)


def with_probe(run: Callable[..., Any]) -> Callable[..., Any]:
    """`trio.run` with the ticker and the stdin reader in the loop beside `main`."""

    def probed_run(main: Callable[..., Awaitable[Any]], *args: Any, **kwargs: Any) -> Any:
        async def probed() -> Any:
            window = LagWindow()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(tick, window)
                nursery.start_soon(answer, window)
                result = await main(*args)
                nursery.cancel_scope.cancel()
            return result

        return run(probed, **kwargs)

    return probed_run


if __name__ == "__main__":
    if len(sys.argv) < 2:
        raise SystemExit("usage: loop_lag.py MODULE [ARGS...]")
    module = sys.argv[1]
    sys.argv = [module, *sys.argv[2:]]
    trio.run = with_probe(trio.run)  # the server's own `trio.run(main, ...)` gets the probe
    runpy.run_module(module, run_name="__main__", alter_sys=True)
