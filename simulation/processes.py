"""Scripted processes in virtual time, plugged in through `actors.processes.ProcessBackend`.

A `Script` says what a command does: which bytes it prints at which (virtual) times, when it
exits and with which code, whether it ignores SIGTERM, and whether starting it fails. A
`SimProcess` plays the script against trio's clock. Its state is a pure function of time and
of the signals it received, so nothing runs in the background: the chat actor's own pump and
reaper tasks wake up at the scripted instants (MockClock jumps straight to them).

Signals are honoured like a shell's process group: SIGKILL always ends it; SIGTERM and the other
catchable signals end it unless the script ignores them. A process ends with its printed bytes:
everything scheduled up to its end, nothing after.
"""

from __future__ import annotations

import errno
import signal
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import trio

from toolwire.actors.processes import READ_CHUNK_BYTES, ExitStatus, InputClosed
from toolwire.actors.terminal import DEFAULT_EOF_CHAR, TerminalSize

# What a failing spawn raises: OSError is "the command could not start" (outcome failed), any
# other exception is a failure inside the agent (outcome unknown).
SPAWN_OSERROR = "oserror"
SPAWN_RAISES = "raises"


@dataclass(frozen=True, slots=True)
class Script:
    """What one simulated command does, relative to its start."""

    chunks: tuple[tuple[float, bytes], ...]  # (seconds after start, bytes), times < duration
    duration: float
    exit_code: int = 0
    ignores_term: bool = False
    spawn_error: str | None = None  # SPAWN_OSERROR / SPAWN_RAISES

    @property
    def output(self) -> bytes:
        return b"".join(data for _, data in self.chunks)


class SimStdin:
    """A simulated command's input (`execute` with `stdin` or `pty`). Implements
    `actors.processes.StdinPort`: while the command lives it takes every byte at once (a reader
    that never falls behind) and keeps what it got, with the virtual time, for the checker."""

    def __init__(self, process: SimProcess, terminal: TerminalSize | None) -> None:
        self._process = process
        self.terminal = terminal is not None
        self.size = terminal
        self.received: list[tuple[float, bytes]] = []
        self.closed = False  # an `eof` closed the (simulated) pipe

    def write_some(self, data: memoryview) -> int:
        now = trio.current_time()
        if self.closed or not self._process.alive(now):
            raise InputClosed
        self.received.append((now, bytes(data)))
        return len(data)

    async def wait_room(self) -> None:
        await trio.lowlevel.checkpoint()  # never full: write_some always takes everything

    def end(self) -> bytes:
        if self.terminal:
            return DEFAULT_EOF_CHAR
        self.closed = True
        return b""

    def resize(self, size: TerminalSize) -> None:
        if not self.terminal:
            raise ValueError("a pipe has no size")
        if not self._process.alive(trio.current_time()):
            raise InputClosed
        self.size = size

    @property
    def data(self) -> bytes:
        """Everything the command was given, in the order it got it."""
        return b"".join(data for _, data in self.received)


class SimProcess:
    """One run of a script. Implements `actors.processes.SpawnedProcess`."""

    def __init__(
        self,
        script: Script,
        pid: int,
        started: float,
        *,
        stdin: bool = False,
        terminal: TerminalSize | None = None,
    ) -> None:
        self.script = script
        self.pid: int | None = pid
        self.stdin: SimStdin | None = (
            SimStdin(self, terminal) if stdin or terminal is not None else None
        )
        self.started = started
        self._times = [started + dt for dt, _ in script.chunks]
        self._data = [data for _, data in script.chunks]
        self.end_at = started + script.duration  # natural exit
        self.killed_at: float | None = None  # a signal (or the agent's crash) ended it here
        self.killed_by: str | None = None
        self._read = 0  # chunks handed to the reader
        self._changed = trio.Event()
        self.signals: list[tuple[float, str]] = []

    # -- state, a function of time -------------------------------------------------------------

    @property
    def death(self) -> float:
        if self.killed_at is not None and self.killed_at < self.end_at:
            return self.killed_at
        return self.end_at

    def alive(self, now: float) -> bool:
        return now < self.death

    def status(self) -> ExitStatus:
        if self.killed_at is not None and self.killed_at < self.end_at:
            return ExitStatus(exit_code=None, signal=self.killed_by)
        return ExitStatus(exit_code=self.script.exit_code, signal=None)

    def printed_count(self, now: float) -> int:
        """How many chunks the command has written by `now` (all of them once it ended)."""
        limit = min(now, self.death)
        count = 0
        for t in self._times:
            if t > limit:
                break
            count += 1
        return count

    def printed(self, now: float) -> bytes:
        return b"".join(self._data[: self.printed_count(now)])

    def _wake(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    def kill(self, now: float, sig: str) -> None:
        if now < self.death:
            self.killed_at = now
            self.killed_by = sig
            self._wake()

    # -- SpawnedProcess ------------------------------------------------------------------------

    def _take(self, now: float) -> bytes:
        ready = self.printed_count(now)
        if ready <= self._read:
            return b""
        pieces: list[bytes] = []
        size = 0
        while self._read < ready and size < READ_CHUNK_BYTES:
            piece = self._data[self._read]
            pieces.append(piece)
            size += len(piece)
            self._read += 1
        return b"".join(pieces)

    async def read_some(self) -> bytes:
        while True:
            now = trio.current_time()
            data = self._take(now)
            if data:
                return data
            if now >= self.death:
                return b""  # every writer closed the pipe
            wake = self.death
            if self._read < len(self._times):
                wake = min(wake, self._times[self._read])
            with trio.move_on_at(wake):
                await self._changed.wait()

    def read_available(self) -> bytes:
        return self._take(trio.current_time())

    async def wait(self) -> ExitStatus:
        while True:
            now = trio.current_time()
            if now >= self.death:
                return self.status()
            with trio.move_on_at(self.death):
                await self._changed.wait()

    def poll_exited(self) -> bool:
        return trio.current_time() >= self.death

    def signal_group(self, sig: signal.Signals) -> bool:
        now = trio.current_time()
        if now >= self.death:
            return False
        self.signals.append((now, sig.name))
        if sig is signal.SIGKILL or not self.script.ignores_term:
            self.kill(now, sig.name)
        return True

    def group_alive(self) -> bool:
        # A simulated command is its whole process group: the group lives as long as it does.
        return trio.current_time() < self.death

    def close(self) -> None:
        pass


class SimBackend:
    """The world's process backend: looks the script up by its command line and records every
    start in the side-effect ledger (through `on_spawn`)."""

    def __init__(
        self,
        scripts: Mapping[str, Script],
        on_spawn: Callable[[str, SimProcess], None],
    ) -> None:
        self._scripts = scripts
        self._on_spawn = on_spawn
        self._next_pid = 1000
        self.running: list[SimProcess] = []

    def spawn(
        self,
        argv: list[str],
        cwd: str,
        env: Mapping[str, str],
        *,
        stdin: bool = False,
        terminal: TerminalSize | None = None,
    ) -> SimProcess:
        command = argv[-1]
        script = self._scripts[command]
        if script.spawn_error == SPAWN_OSERROR:
            raise OSError(errno.EACCES, "simulated: permission denied")
        if script.spawn_error == SPAWN_RAISES:
            raise RuntimeError("simulated: the process backend failed")
        self._next_pid += 1
        proc = SimProcess(
            script, self._next_pid, trio.current_time(), stdin=stdin, terminal=terminal
        )
        self.running.append(proc)
        self._on_spawn(command, proc)
        return proc

    def kill_all(self, now: float) -> None:
        """The agent died: its process groups die with it (the simulated host reaps them)."""
        for proc in self.running:
            proc.kill(now, "SIGKILL")
        self.running.clear()
