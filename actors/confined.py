"""Threads confined by a sandbox, one per distinct ruleset, that start the sandboxed commands.

Why threads: Landlock (`landlock_restrict_self`), `no_new_privs` and a seccomp filter all act on
the calling thread only, and every process that thread then starts inherits them, across exec,
for good. posix_spawn runs no Python in the child, so a policy cannot be applied between fork
and exec without a `preexec_fn` (a Python child per spawn: slow, and unsafe in a threaded agent)
or a helper program. So a thread restricts itself once, and from then on spawns, through the
same posix_spawn as every other command (actors/spawn.py), each command of that policy: full
spawn speed, the whole process tree confined, and the agent's other threads untouched (its
event loop still writes its journal and binds its port). tests/test_confined.py checks both.

A spawn is handed to the thread and the caller waits for it (the event loop blocked for a
spawn before as well): two thread switches more per spawn. At most `MAX_THREADS` are kept, the
least recently used is let go (its commands stay confined: the domain lives in each process).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Final, TypeVar

from toolwire.actors import landlock, seccomp

T = TypeVar("T")

MAX_THREADS: Final = 16


class ConfinedThread:
    """One thread confined by `ruleset` (and, for no network, the TCP socket filter), running
    the functions handed to it one at a time."""

    def __init__(self, ruleset: landlock.Ruleset, *, refuse_tcp: bool) -> None:
        self._ruleset = ruleset
        self._refuse_tcp = refuse_tcp
        self._lock = threading.Lock()  # one caller at a time
        self._go = threading.Semaphore(0)
        self._done = threading.Semaphore(0)
        self._job: Callable[[], object] | None = None
        self._value: object = None
        self._error: BaseException | None = None
        self._closing = False
        self._thread = threading.Thread(
            target=self._main, name="toolwire-confined-spawner", daemon=True
        )
        self._thread.start()
        self._done.acquire()  # restricted, or failed to
        self._setup_error, self._error = self._error, None

    def _main(self) -> None:
        try:
            landlock.restrict_current_thread(self._ruleset)
            if self._refuse_tcp:
                seccomp.refuse_tcp_sockets_on_current_thread()
        except BaseException as exc:
            self._error = exc
        self._done.release()
        while True:
            self._go.acquire()
            job = self._job
            if self._closing or job is None:
                return
            try:
                self._value = job()
            except BaseException as exc:
                self._error = exc
            self._done.release()

    def call(self, job: Callable[[], T]) -> T:
        """Run `job` on the confined thread and return what it returns (or raise what it
        raises). Raises OSError if the thread could not be confined: nothing ran."""
        if self._setup_error is not None:
            raise OSError(f"the sandbox could not be applied: {self._setup_error}")
        with self._lock:
            self._job = job
            self._go.release()
            self._done.acquire()
            value, error = self._value, self._error
            self._job, self._value, self._error = None, None, None
        if error is not None:
            raise error
        return value  # type: ignore[return-value]

    def close(self) -> None:
        """Let the thread end, and wait for it (it is idle: microseconds). The commands it
        spawned stay confined: the domain lives in each of them."""
        with self._lock:
            self._closing = True
            self._go.release()
        self._thread.join()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()


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
