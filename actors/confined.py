"""Threads confined by a sandbox, one per distinct ruleset, that start the sandboxed commands.

Why threads: Landlock (`landlock_restrict_self`), `no_new_privs` and a seccomp filter all act on
the calling thread only, and every process that thread then starts inherits them, across exec,
for good. posix_spawn runs no Python in the child, so a policy cannot be applied between fork
and exec without a `preexec_fn` (a Python child per spawn: slow, and unsafe in a threaded agent)
or a helper program. So a thread restricts itself once, and from then on spawns, through the
same posix_spawn as every other command (actors/spawn.py), each command of that policy: full
spawn speed, the whole process tree confined, and the agent's other threads untouched (its
event loop still writes its journal and binds its port). tests/test_landlock.py checks both.

A spawn is handed to the thread and its caller goes on (`submit`): the keeper's loop serves
its other requests meanwhile and takes the spawn's result through `Completions`, a descriptor
its selector watches. Waiting for the thread instead (`call`) left the loop idle for the
hand-off and back, about 0.15 ms a spawn, which at 8 spawns in flight was what the keeper's
rate lost (docs/benchmarks.md, `sandbox`). At most `MAX_THREADS` are kept, the least recently
used is let go (its commands stay confined: the domain lives in each process).
"""

from __future__ import annotations

import contextlib
import os
import queue
import threading
from collections import OrderedDict, deque
from collections.abc import Callable
from typing import Final, Generic, TypeVar

from toolwire.actors import landlock, seccomp

T = TypeVar("T")

MAX_THREADS: Final = 16

# What a job's caller is told, on the confined thread: its value, or what it raised.
Done = Callable[[T | None, BaseException | None], None]


class ConfinedThread:
    """One thread confined by `ruleset` (and, for no network, the TCP socket filter), running
    the jobs handed to it one at a time, in the order they were handed."""

    def __init__(self, ruleset: landlock.Ruleset, *, refuse_tcp: bool) -> None:
        self._ruleset = ruleset
        self._refuse_tcp = refuse_tcp
        # A C queue: a put and a blocking get cost no Python-level lock (threading.Semaphore
        # is a Condition in 3.11). None ends the thread.
        self._jobs: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._setup_error: BaseException | None = None
        self._closed = False
        started = threading.Event()
        self._thread = threading.Thread(
            target=self._main, args=(started,), name="toolwire-confined-spawner", daemon=True
        )
        self._thread.start()
        started.wait()  # restricted, or failed to

    def _main(self, started: threading.Event) -> None:
        try:
            landlock.restrict_current_thread(self._ruleset)
            if self._refuse_tcp:
                seccomp.refuse_tcp_sockets_on_current_thread()
        except BaseException as exc:
            self._setup_error = exc
        started.set()
        while True:
            job = self._jobs.get()
            if job is None:
                return
            job()

    def submit(self, job: Callable[[], T], done: Done[T]) -> None:
        """Run `job` on the confined thread, after those submitted before it, and return at
        once; `done(value, None)` or `done(None, what it raised)` is then called on that
        thread. Raises OSError if the thread could not be confined, or was let go (`close`):
        nothing is run."""
        if self._setup_error is not None:
            raise OSError(f"the sandbox could not be applied: {self._setup_error}")
        if self._closed:
            raise OSError("the sandbox's spawner thread was let go")

        def run() -> None:
            try:
                value = job()
            except BaseException as exc:
                done(None, exc)
                return
            done(value, None)

        self._jobs.put(run)

    def call(self, job: Callable[[], T]) -> T:
        """Run `job` on the confined thread and wait for it: what it returns (or raise what it
        raises). Raises OSError if the thread could not be confined: nothing ran."""
        finished = threading.Event()
        outcome: list[tuple[T | None, BaseException | None]] = []

        def done(value: T | None, error: BaseException | None) -> None:
            outcome.append((value, error))
            finished.set()

        self.submit(job, done)
        finished.wait()
        value, error = outcome[0]
        if error is not None:
            raise error
        return value  # type: ignore[return-value]

    def close(self) -> None:
        """Let the thread end once the jobs handed to it ran, and wait for it. The commands it
        spawned stay confined: the domain lives in each of them."""
        self._closed = True
        self._jobs.put(None)
        self._thread.join()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()


class Completions(Generic[T]):
    """What jobs on confined threads finished with, for one other thread to take (the keeper's
    loop): `fd` turns readable once there is any (an eventfd its selector watches)."""

    def __init__(self) -> None:
        self.fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._done: deque[T] = deque()

    def post(self, item: T) -> None:
        """From any thread: `item` is taken by the next `take`."""
        self._done.append(item)  # before the wake-up: a `take` it wakes finds it
        os.eventfd_write(self.fd, 1)

    def take(self) -> list[T]:
        """Everything posted so far (none if another `take` got it first)."""
        with contextlib.suppress(BlockingIOError):
            os.eventfd_read(self.fd)  # first: what is posted after this wakes the loop again
        taken: list[T] = []
        while self._done:
            taken.append(self._done.popleft())
        return taken

    def close(self) -> None:
        os.close(self.fd)


class ConfinedThreads:
    """The confined thread of each ruleset, made on first use."""

    def __init__(self) -> None:
        self._threads: OrderedDict[tuple[landlock.Ruleset, bool], ConfinedThread] = OrderedDict()
        self._lock = threading.Lock()

    def thread_for(self, ruleset: landlock.Ruleset, *, refuse_tcp: bool) -> ConfinedThread:
        key = (ruleset, refuse_tcp)
        with self._lock:
            thread = self._threads.get(key)
            if thread is not None:
                self._threads.move_to_end(key)
                return thread
            thread = self._threads[key] = ConfinedThread(ruleset, refuse_tcp=refuse_tcp)
            if len(self._threads) > MAX_THREADS:
                _, oldest = self._threads.popitem(last=False)
                oldest.close()
            return thread

    def __len__(self) -> int:
        return len(self._threads)

    def close(self) -> None:
        with self._lock:
            for thread in self._threads.values():
                thread.close()
            self._threads.clear()
