"""The event loop before the worker threads, in the one place Python lets a process choose.

The agent's file tools, journal commits and big-message steps run on worker threads that share
the GIL with the event loop. When the loop wakes (a frame came, a timer fired) while a worker
runs Python code, it waits for the GIL until the interpreter asks the worker to hand it over,
after ``sys.getswitchinterval()``: 5 ms by default, which is then the p99 of the loop's lag
during a big edit in another chat however short each of the worker's steps is (issue 26: the
goal is a p99 below 5 ms). At 1 ms the wait is bounded by about 1 ms; the cost, more hand-overs
between threads that both want the GIL, falls on the workers, whose work is big and rare.

The same holds for the cyclic garbage collector: a full (generation 2) collection walks every
tracked object it has not been told to skip in one piece, with the GIL held and the loop
waiting. Most of what an agent holds is what its start made, its modules, classes and functions:
about 40,000 objects for `toolwire serve`, 15 ms a full collection on the benchmark machine,
before any chat; frozen (`gc.freeze`, which moves every tracked object into a permanent
generation that no collection walks) they are never walked again.

The chats then grow the walk. A flood of 5,000 chats of one call each (issue 27) takes it to
about 100,000 objects (about 13 for each finished chat, the rest the calls in flight), and
CPython's rule (a full collection once the objects that reached the oldest generation since the
last one are a quarter of what that one left, and 10 collections of the middle generation have
run) walked them all several times: 26-31 and 52-59 ms at a load of about 1 on the benchmark
machine's 2 cores, more when loaded. So the survivors of every full collection are frozen as
well (`FoldedCollections`): the next full collection walks only what reached the oldest
generation since the last one, and with a full collection every `OLDEST_GENERATION_THRESHOLD`
(2) collections of the middle generation, that is 10,000-30,000 objects in the same flood, 2-10
ms. The frozen heap becomes a fourth generation, which the interpreter never collects on its
own: a cycle frozen while it was alive and dropped since would stay for ever (the agent breaks
the one among a chat's objects when it forgets the chat, `ChatActor.forgotten`, so that
reference counting frees them; any other cycle waits for the collector). So the frozen heap is
bounded: once it holds more than `THAW_GROWTH` (2) times the larger of what the last full walk
of it left and `THAW_FLOOR_OBJECTS`, it is unfrozen, and the next full collection walks and
collects all of it, as CPython's own would, and freezes what lives. A walk of the whole heap
then comes once for each doubling of the tracked heap, instead of at each quarter, and the
cyclic garbage held back is at most about the larger of what lived at the last one and
`THAW_FLOOR_OBJECTS` (and what reached the frozen heap in the second since it was last counted,
`FROZEN_COUNT_EVERY_S`). That walk is the one long pause left (about 0.5 ms per 1,000 objects on
the benchmark machine): the price of a bound on memory. Measured on CPython 3.11, the oldest
Python the project supports; the rule quoted above is 3.11's (Modules/gcmodule.c).

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
# 40,000-60,000 objects in a flood of chats at 10 (15-34 ms, load about 1), 10,000-30,000 at 2
# (2-10 ms).
OLDEST_GENERATION_THRESHOLD = 2
# The frozen heap is thawed (walked by the next full collection) once it holds this many times
# the objects it held after the last full walk: a doubling, so that the whole heap is walked
# about once for each time it doubles, and cyclic garbage held back in it stays below about the
# live heap that walk left.
THAW_GROWTH = 2
# ... and never below this many objects: the start alone freezes about 40,000, and 5,000 chats
# of one call each add about 65,000 (a full walk of 100,000 took 52-59 ms on the benchmark
# machine, load about 1). The bound counts objects, as CPython's own rule does: tracked objects
# are mostly 50-200 bytes, but what a garbage cycle refers to (a big string) is not counted.
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
