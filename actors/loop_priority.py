"""The event loop before the worker threads, in the one place Python lets a process choose.

The agent's file tools, journal commits and big-message steps run on worker threads that share
the GIL with the event loop. When the loop wakes (a frame came, a timer fired) while a worker
runs Python code, it waits for the GIL until the interpreter asks the worker to hand it over,
after ``sys.getswitchinterval()``: 5 ms by default, which is then the p99 of the loop's lag
during a big edit in another chat however short each of the worker's steps is (issue 26: the
goal is a p99 below 5 ms). At 1 ms the wait is bounded by about 1 ms; the cost, more hand-overs
between threads that both want the GIL, falls on the workers, whose work is big and rare.

The same holds for the cyclic garbage collector: a full (generation 2) collection walks every
tracked object in one piece, with the GIL held and the loop waiting. Most of what an agent holds
is what its start made, its modules, classes and functions: about 39,000 objects for `toolwire
serve`, 15 ms a full collection on the benchmark machine, before any chat. Frozen (`gc.freeze`)
they are never walked again: with 2,000 chats a full collection took 56-58 ms, and 9-12 ms with
the start's objects frozen (tests of one process each, a loaded machine); a flood of 5,000 new
chats makes several (issue 27). What is frozen is never collected as a cycle, so only what the
start made, which lives as long as the process, is frozen, before any request is served.

Process-wide, so only the programs that own their process call these: `toolwire serve` and the
benchmark's agent (which runs as serve's defaults). A program embedding the Agent keeps its own.
"""

from __future__ import annotations

import gc
import sys

# 1 ms: the loop-lag probe beside a 16 MiB edit's worker thread gave a p99 of 5.5 ms at
# Python's default of 5 ms and 2.0 ms at 1 ms (one run each, same machine).
GIL_SWITCH_INTERVAL_S = 0.001


def favour_the_event_loop() -> None:
    """Make the interpreter hand the GIL over after `GIL_SWITCH_INTERVAL_S` instead of 5 ms."""
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)


def keep_the_collector_off_the_start() -> None:
    """Collect what the start left as garbage, then move every object still tracked to the
    permanent generation (`gc.freeze`): later collections walk only what came after."""
    gc.collect()
    gc.freeze()
