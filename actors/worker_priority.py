"""Worker threads that give the CPU to the event loop when both want it (issue 26).

What a big `edit_files` or `write_file` still cost the agent's loop, once no step of it held the
GIL for long (actors/tools/big_text.py, actors/tools/whole_files.py, the 1 ms switch interval of
actors/loop_priority.py), was mostly not the GIL: beside edits of four 16 MiB files in another
chat, the loop's thread spent 82% of the lateness of its late ticks (4.3 of 5.3 s in all, over
10 s of calls) waiting in the kernel's run queue (`/proc/self/task/TID/schedstat`), runnable and
without a CPU, while the tool's thread hashed and copied into the page cache and the clients
took the other core. The loop's work is short and the tool's is long, so the tool's thread
should lose every such race: on Linux the nice value is a property of each thread
(`setpriority(PRIO_PROCESS, tid)`), and a worker at `WORKER_NICE` gets the CPU when the loop's
thread does not want it.

Why a thread of its own for each call, not trio's cached workers: an unprivileged thread may
raise its nice value but never lower it again (RLIMIT_NICE is 0 by default), so a lowered
thread given back to trio's cache would run every later `trio.to_thread` job of the process
(the journal's reads, `list_dir`, searches) at that priority. A new thread costs about 0.2 ms
more than a cached one (0.30 against 0.09 ms for a no-op, on a loaded machine), next to the
fsyncs of the writes that run this way (8-10 ms for an edit of a small file). The calls still count
against trio's default thread limiter, as `trio.to_thread.run_sync` would.

The price: while the lowered thread holds the GIL it can lose its CPU to a thread of normal
priority, and the loop, waiting for the GIL, waits for that too; and a tool's own run takes
longer when normal-priority work of the same scheduling group (with autogroups, the agent's own
process: the commands it runs have sessions of their own) keeps the CPUs busy. The measurement
in docs/benchmarks.md ("The loop during big writes and edits") is why it is worth it.

Elsewhere than Linux the nice value belongs to the process, so nothing is lowered there.
"""

from __future__ import annotations

import contextvars
import os
import sys
import threading
from collections.abc import Callable
from typing import TypeVar, cast

import trio

T = TypeVar("T")

# The lowest priority there is: the measurement's p99 of the loop's lag was lowest at 19 (of
# 0, 10 and 19), and the work lowered (hashing, writing, fsyncs) waits for the disk anyway.
WORKER_NICE = 19


def lower_this_thread(nice: int = WORKER_NICE) -> bool:
    """Raise the calling thread's nice value to `nice` (never lower it); whether it is at
    `nice` or above now. Only the calling thread changes: Linux only, where the nice value is
    per thread; elsewhere nothing changes and the answer is False."""
    if sys.platform != "linux":
        return False
    tid = threading.get_native_id()
    try:
        if os.getpriority(os.PRIO_PROCESS, tid) < nice:
            os.setpriority(os.PRIO_PROCESS, tid, nice)
        return os.getpriority(os.PRIO_PROCESS, tid) >= nice
    except OSError:  # a sandbox that refuses the call: run at the priority the thread has
        return False


async def run_sync_below_the_loop(fn: Callable[..., T], *args: object) -> T:
    """`fn(*args)` on a new thread whose priority is lowered first (`lower_this_thread`), as
    `trio.to_thread.run_sync(fn, *args)` runs it otherwise: under trio's default thread
    limiter, in a copy of the caller's context, and a cancel waits for the thread's real end
    (its result is returned; the cancel comes at the caller's next checkpoint)."""
    token = trio.lowlevel.current_trio_token()
    context = contextvars.copy_context()
    done = trio.Event()
    ended: list[tuple[bool, object]] = []

    def body() -> None:
        lower_this_thread()
        try:
            ended.append((True, context.run(fn, *args)))
        except BaseException as e:  # handed to the caller, raised there
            ended.append((False, e))
        token.run_sync_soon(done.set)

    async with trio.to_thread.current_default_thread_limiter():
        name = f"toolwire worker below the loop: {getattr(fn, '__name__', 'work')}"
        threading.Thread(target=body, name=name, daemon=True).start()
        with trio.CancelScope(shield=True):
            await done.wait()
    ok, value = ended.pop()
    if ok:
        return cast(T, value)
    try:
        raise cast(BaseException, value)
    finally:
        del value  # the traceback holds this frame: no cycle through it
