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
import math
import sys
import time

# 1 ms: the loop-lag probe beside a 16 MiB edit's worker thread gave a p99 of 5.5 ms at
# Python's default of 5 ms and 2.0 ms at 1 ms (one run each, same machine).
GIL_SWITCH_INTERVAL_S = 0.001


def favour_the_event_loop() -> None:
    """Make the interpreter hand the GIL over after `GIL_SWITCH_INTERVAL_S` instead of 5 ms."""
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)


# The oldest generation's threshold: a full collection once this many collections of the middle
# one have run (and, CPython's own rule, the objects that reached the oldest since the last full
# collection are a quarter of what it left). Python's default is 10: with the survivors frozen,
# each full collection walks only what reached the oldest generation since the last one, about
# 40,000 objects in a flood of chats at 10 (26-34 ms, idle machine), 10,000-30,000 at 2 (2-7 ms).
OLDEST_GENERATION_THRESHOLD = 2
# The frozen heap is thawed (walked by the next full collection) once it holds this many times
# the objects it held after the last full walk: a doubling, so that the whole heap is walked
# about once for each time it doubles, and cyclic garbage held back in it stays below about the
# live heap that walk left.
THAW_GROWTH = 2
# ... and never below this many objects: the start alone freezes about 40,000, and 5,000 chats
# of one call each add about 65,000 (a full walk of 100,000 took 52-59 ms on the benchmark
# machine, idle). Tracked objects are mostly 50-200 bytes: tens of MiB held back at most.
THAW_FLOOR_OBJECTS = 150_000
# Counting the frozen objects walks their list (about 1 ms per 100,000): at most once a second.
FROZEN_COUNT_EVERY_S = 1.0


class FoldedCollections:
    """A `gc.callbacks` entry that freezes the survivors of every full (generation 2)
    collection, and unfreezes the frozen heap once it has grown past `thaw_above`, so that the
    next full collection walks everything and collects its garbage.

    Freezing in the callback's "stop" phase is safe: the collection is over (its garbage freed,
    its finalizers run, the younger generations empty), and `gc.freeze` only moves the
    generations' lists onto the permanent one, running no Python code. The callback may run on
    any thread that allocates; it holds the GIL, and the interpreter never starts a collection,
    nor so its callbacks, inside another.
    """

    def __init__(
        self,
        growth: int = THAW_GROWTH,
        floor: int = THAW_FLOOR_OBJECTS,
        count_every_s: float = FROZEN_COUNT_EVERY_S,
    ) -> None:
        self.growth = growth
        self.floor = floor
        self.count_every_s = count_every_s
        self.thaw_above = growth * floor
        self.thawed = False  # the frozen heap is in the oldest generation, for the next walk
        self.counted_at = -math.inf
        self.folds = 0
        self.thaws = 0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase != "stop" or info["generation"] != 2:
            return
        gc.freeze()
        self.folds += 1
        now = time.monotonic()
        if not self.thawed and now - self.counted_at < self.count_every_s:
            return
        self.counted_at = now
        frozen = gc.get_freeze_count()
        if self.thawed:  # that collection walked the whole heap: `frozen` is what lives
            self.thawed = False
            self.thaw_above = self.growth * max(frozen, self.floor)
        elif frozen > self.thaw_above:
            gc.unfreeze()
            self.thawed = True
            self.thaws += 1


def fold_survivors_out_of_the_collector(folded: FoldedCollections | None = None) -> None:
    """Collect what the start left as garbage and freeze every object still tracked (most of
    them live as long as the process), then do the same after every later full collection,
    run every `OLDEST_GENERATION_THRESHOLD` collections of the middle generation, with
    `FoldedCollections`' bound on the frozen heap. Installs `folded` (a new one if None) in
    `gc.callbacks` once: a second call only collects and freezes again."""
    if not any(isinstance(cb, FoldedCollections) for cb in gc.callbacks):
        gc.callbacks.append(folded if folded is not None else FoldedCollections())
    young, middle, _ = gc.get_threshold()
    gc.set_threshold(young, middle, OLDEST_GENERATION_THRESHOLD)
    gc.collect()  # the callback freezes its survivors
