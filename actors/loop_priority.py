"""The event loop before the worker threads, in the one place Python lets a process choose.

The agent's file tools, journal commits and big-message steps run on worker threads that share
the GIL with the event loop. When the loop wakes (a frame came, a timer fired) while a worker
runs Python code, it waits for the GIL until the interpreter asks the worker to hand it over,
after ``sys.getswitchinterval()``: 5 ms by default, which is then the p99 of the loop's lag
during a big edit in another chat however short each of the worker's steps is (issue 26: the
goal is a p99 below 5 ms). At 1 ms the wait is bounded by about 1 ms; the cost, more hand-overs
between threads that both want the GIL, falls on the workers, whose work is big and rare.

Process-wide, so only the programs that own their process call it: `toolwire serve` and the
benchmark's agent (which runs as serve's defaults). A program embedding the Agent keeps its own.
"""

from __future__ import annotations

import sys

# 1 ms: the loop-lag probe beside a 16 MiB edit's worker thread gave a p99 of 5.5 ms at
# Python's default of 5 ms and 2.0 ms at 1 ms (one run each, same machine).
GIL_SWITCH_INTERVAL_S = 0.001


def favour_the_event_loop() -> None:
    """Make the interpreter hand the GIL over after `GIL_SWITCH_INTERVAL_S` instead of 5 ms."""
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
