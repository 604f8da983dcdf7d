"""Scripted processes in virtual time, plugged in through `actors.processes.ProcessBackend`.

A `Script` says what a command does: which bytes its shell prints at which (virtual) times,
when the shell exits and with which code, whether the shell ignores SIGTERM, whether starting
it fails, and which other processes (`Member`s) it leaves in its process group. A `SimProcess`
plays the script against trio's clock. Its state is a pure function of time and of the signals
it received, so nothing runs in the background: the chat actor's own pump and reaper tasks
wake up at the scripted instants (MockClock jumps straight to them).

Signals go to the whole process group, as `killpg` sends them. SIGKILL ends every member at
once. SIGTERM (and the other catchable signals) end the shell unless the script ignores them;
each member reacts on its own: it exits at once, ignores the signal, or traps it and exits
after a cleanup of its own length (`sh -c 'trap "sleep 0.3; echo cleaned > marker" TERM; ...'`),
whose side effect (the marker) exists only when the cleanup ran to its end. The shell's exit
does not end its members: a child may outlive it (`sleep 60 &`), and the group lives until its
last member is gone. Every process prints only while it lives: everything scheduled up to its
end, nothing after. The output pipe reaches end of file when the shell and every member that
holds the pipe are gone.
"""

from __future__ import annotations

import bisect
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

# How a process died when its agent crashed: the simulated host killed it, not the agent.
CRASH_KILL = "crash"

# The writer of a shell's chunk in the merged output timeline (members are 0, 1, ...).
_SHELL = -1


@dataclass(frozen=True, slots=True)
class Member:
    """Another process of a command's group (a child of the shell), relative to the command's
    start. It starts only if the shell still runs at `start`."""

    start: float  # seconds after the command started (> 0)
    duration: float  # its natural lifetime from its own start (it may outlive the shell)
    # On SIGTERM (or another catchable signal): exits after this many seconds of cleanup (0: at
    # once); None: ignores it. A second signal during the cleanup changes nothing.
    term_cleanup: float | None = 0.0
    holds_pipe: bool = True  # keeps the output pipe open (else it writes elsewhere)
    chunks: tuple[tuple[float, bytes], ...] = ()  # printed to the pipe, after its own start


@dataclass(frozen=True, slots=True)
class Reader:
    """How a command reads its stdin (`execute` with `stdin` or `pty`): the pipe (or terminal)
    holds `capacity` bytes, and every `period` seconds from its start the shell takes up to
    `chunk` of them and prints what it read (`<token> got <bytes>`), so its output depends on
    its input and a large input waits for room."""

    capacity: int
    period: float
    chunk: int


@dataclass(frozen=True, slots=True)
class Script:
    """What one simulated command does, relative to its start."""

    chunks: tuple[tuple[float, bytes], ...]  # the shell's (seconds after start, bytes)
    duration: float
    exit_code: int = 0
    ignores_term: bool = False
    spawn_error: str | None = None  # SPAWN_OSERROR / SPAWN_RAISES
    members: tuple[Member, ...] = ()
    reader: Reader | None = None  # reads its stdin (else: takes every byte, prints nothing)
    echo_prefix: bytes = b""  # what starts each line it prints about its input


class MemberRun:
    """One member of a running group: its state, a function of time and the signals it got."""

    __slots__ = ("end_at", "killed_at", "killed_by", "spec", "start_at", "term_at")

    def __init__(self, spec: Member, started: float) -> None:
        self.spec = spec
        self.start_at = started + spec.start
        self.end_at = self.start_at + spec.duration  # natural exit
        self.term_at: float | None = None  # the first catchable signal it handles
        self.killed_at: float | None = None  # SIGKILL (or the agent's crash) ended it here
        self.killed_by: str | None = None

    @property
    def cleanup_done_at(self) -> float | None:
        """When its cleanup ends, once a SIGTERM started one (its trap then exits: the rest of
        its natural life no longer happens)."""
        if self.term_at is None or self.spec.term_cleanup is None:
            return None
        return self.term_at + self.spec.term_cleanup

    @property
    def death(self) -> float:
        done = self.cleanup_done_at
        end = self.end_at if done is None else done
        if self.killed_at is not None and self.killed_at < end:
            return self.killed_at
        return end

    @property
    def cleaned_up(self) -> bool:
        """True when a SIGTERM started its cleanup and the cleanup ran to its end (its marker
        was written): it was not killed first."""
        done = self.cleanup_done_at
        return done is not None and (self.killed_at is None or self.killed_at >= done)


class SimStdin:
    """A simulated command's input (`execute` with `stdin` or `pty`). Implements
    `actors.processes.StdinPort`. Without a `Reader` the command takes every byte at once;
    with one, the pipe holds `capacity` bytes and the shell drains it at its read ticks (a
    full pipe makes the writer wait for room) and prints what it read. Every byte that went in
    is kept, with its virtual time, for the checker (the stdin ledger)."""

    def __init__(self, process: SimProcess, terminal: TerminalSize | None) -> None:
        self._process = process
        self.terminal = terminal is not None
        self.size = terminal
        self.received: list[tuple[float, bytes]] = []
        self.closed = False  # an `eof` closed the (simulated) pipe
        self.reader = process.script.reader
        self.buffer = bytearray()  # written, not read yet
        self._tick = process.started  # the last read tick handled

    def _next_tick(self, now: float) -> float:
        """The first read tick after `now`."""
        reader = self.reader
        assert reader is not None
        k = int((now - self._process.started) / reader.period) + 1
        return self._process.started + k * reader.period

    def next_read(self) -> float:
        """When the shell next reads something (inf when it has nothing to read)."""
        if self.reader is None or not self.buffer:
            return float("inf")
        return self._tick + self.reader.period

    def advance(self, now: float) -> None:
        """Play the read ticks up to `now`: the shell takes its chunks and prints them."""
        reader = self.reader
        if reader is None:
            return
        proc = self._process
        while self.buffer:
            t = self._tick + reader.period
            if t > now or t >= proc.death:
                break
            self._tick = t
            taken = bytes(self.buffer[: reader.chunk])
            del self.buffer[: reader.chunk]
            proc.echo(t, taken)
        if not self.buffer:
            # Idle: the next read is the first tick after whatever comes next.
            self._tick = max(self._tick, self._next_tick(now) - reader.period)

    def write_some(self, data: memoryview) -> int:
        now = trio.current_time()
        self.advance(now)
        if self.closed or not self._process.alive(now):
            raise InputClosed
        reader = self.reader
        n = len(data) if reader is None else min(len(data), reader.capacity - len(self.buffer))
        if n <= 0:
            return 0
        chunk = bytes(data[:n])
        self.received.append((now, chunk))
        if reader is not None:
            self.buffer += chunk
            self._process.wake()
        return n

    async def wait_room(self) -> None:
        while True:
            now = trio.current_time()
            self.advance(now)
            if self.closed or not self._process.alive(now):
                raise InputClosed
            if self.reader is None or len(self.buffer) < self.reader.capacity:
                await trio.lowlevel.checkpoint()
                return
            await trio.sleep_until(min(self.next_read(), self._process.death))

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
        on_signal: Callable[[SimProcess, str], None] | None = None,
        reap_delay_s: float = 0.0,
        *,
        stdin: bool = False,
        terminal: TerminalSize | None = None,
    ) -> None:
        self.script = script
        # How long after the shell's exit `wait` returns: the moment a real agent sees a zombie
        # (`poll_exited`) before its reap task has run.
        self.reap_delay_s = reap_delay_s
        self.pid: int | None = pid
        self.started = started
        self.end_at = started + script.duration  # the shell's natural exit
        self.killed_at: float | None = None  # a signal (or the agent's crash) ended the shell
        self.killed_by: str | None = None
        self.members = [MemberRun(m, started) for m in script.members]
        # Every chunk printed to the pipe, by time: (time, writer, bytes), the shell's first.
        timeline = [(started + dt, _SHELL, data) for dt, data in script.chunks]
        for index, member in enumerate(self.members):
            if member.spec.holds_pipe:
                timeline += [(member.start_at + dt, index, d) for dt, d in member.spec.chunks]
        timeline.sort(key=lambda chunk: (chunk[0], chunk[1]))
        self._timeline = timeline
        self._pipe_members = [m for m in self.members if m.spec.holds_pipe]
        self._read = 0  # timeline entries decided and handed to the reader (or skipped)
        self._changed = trio.Event()
        self._on_signal = on_signal
        self.signals: list[tuple[float, str]] = []
        self.owner: tuple[str, str] = ("", "")  # (chat_id, call_id), set by whoever spawned it
        self.stdin: SimStdin | None = (
            SimStdin(self, terminal) if stdin or terminal is not None else None
        )

    # -- state, a function of time -------------------------------------------------------------

    @property
    def death(self) -> float:
        """When the shell exits (or exited)."""
        if self.killed_at is not None and self.killed_at < self.end_at:
            return self.killed_at
        return self.end_at

    def alive(self, now: float) -> bool:
        return now < self.death

    def member_exists(self, member: MemberRun) -> bool:
        """A member is started by the shell: only if the shell still ran at its start."""
        return member.start_at < self.death

    def member_alive(self, member: MemberRun, now: float) -> bool:
        return member.start_at <= now < member.death and self.member_exists(member)

    def group_alive_at(self, now: float) -> bool:
        return now < self.death or any(self.member_alive(m, now) for m in self.members)

    def status(self) -> ExitStatus:
        if self.killed_at is not None and self.killed_at < self.end_at:
            return ExitStatus(exit_code=None, signal=self.killed_by)
        return ExitStatus(exit_code=self.script.exit_code, signal=None)

    def _printed_chunk(self, t: float, writer: int) -> bool:
        """Whether the chunk of `writer` due at `t` (<= now) was printed: its writer lived."""
        if writer == _SHELL:
            return t <= self.death
        member = self.members[writer]
        return t <= member.death and self.member_exists(member)

    def printed(self, now: float) -> bytes:
        """Every byte the group wrote to the pipe by `now`, in order."""
        return b"".join(
            data
            for t, writer, data in self._timeline
            if t <= now and self._printed_chunk(t, writer)
        )

    def _pipe_closed(self, now: float) -> bool:
        """Every writer of the pipe is gone (end of file once the pipe is drained)."""
        if now < self.death:
            return False
        return not any(self.member_alive(m, now) for m in self._pipe_members)

    def pipe_open_at(self, now: float) -> bool:
        """The shell runs, or a member that holds the output pipe does (the agent still
        reads this process's output)."""
        return not self._pipe_closed(now)

    def _wake(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    def wake(self) -> None:
        """Its stdin took bytes: the pump re-checks when the shell reads them."""
        self._wake()

    def echo(self, t: float, data: bytes) -> None:
        """At read tick `t` (<= now) the shell read `data` and prints it back."""
        line = self.script.echo_prefix + b" got " + data.replace(b"\n", b"|") + b"\n"
        # After every chunk already handed to the reader (their times are <= t).
        at = bisect.bisect_right(
            self._timeline, (t, _SHELL), lo=self._read, key=lambda chunk: (chunk[0], chunk[1])
        )
        self._timeline.insert(at, (t, _SHELL, line))
        self._wake()

    def kill(self, now: float, sig: str) -> None:
        """The shell alone dies of `sig` now (if it still runs)."""
        if now < self.death:
            self.killed_at = now
            self.killed_by = sig
            self._wake()

    def crash(self, now: float) -> None:
        """The agent died: the simulated host kills the whole group at once."""
        for member in self.members:
            if self.member_alive(member, now):
                member.killed_at, member.killed_by = now, CRASH_KILL
        self.kill(now, "SIGKILL")
        self._wake()

    # -- SpawnedProcess ------------------------------------------------------------------------

    def _take(self, now: float) -> bytes:
        if self.stdin is not None:
            self.stdin.advance(now)
        timeline = self._timeline
        pieces: list[bytes] = []
        size = 0
        while self._read < len(timeline) and size < READ_CHUNK_BYTES:
            t, writer, data = timeline[self._read]
            if t > now:
                break
            self._read += 1
            if self._printed_chunk(t, writer):
                pieces.append(data)
                size += len(data)
        return b"".join(pieces)

    def _next_change(self, now: float) -> float:
        """The next instant the pipe may have something new to say: a chunk falls due, or a
        writer exits (which may close the pipe)."""
        wake = self.death if now < self.death else float("inf")
        if self.stdin is not None:
            wake = min(wake, self.stdin.next_read())
        if self._read < len(self._timeline):
            wake = min(wake, self._timeline[self._read][0])
        for member in self._pipe_members:
            if self.member_alive(member, now):
                wake = min(wake, member.death)
        return wake

    async def read_some(self) -> bytes:
        while True:
            now = trio.current_time()
            data = self._take(now)
            if data:
                return data
            if self._pipe_closed(now):
                # Every writer closed the pipe. Chunks still due later on the timeline are never
                # printed: their writers died first.
                self._read = len(self._timeline)
                return b""
            with trio.move_on_at(self._next_change(now)):
                await self._changed.wait()

    def read_available(self) -> bytes:
        return self._take(trio.current_time())

    async def wait(self) -> ExitStatus:
        while True:
            now = trio.current_time()
            if now >= self.death:
                if self.reap_delay_s:
                    await trio.sleep_until(self.death + self.reap_delay_s)
                return self.status()
            with trio.move_on_at(self.death):
                await self._changed.wait()

    def poll_exited(self) -> bool:
        return trio.current_time() >= self.death

    def signal_group(self, sig: signal.Signals) -> bool:
        now = trio.current_time()
        if not self.group_alive_at(now):
            return False
        self.signals.append((now, sig.name))
        if self._on_signal is not None:
            self._on_signal(self, sig.name)
        for member in self.members:
            if not self.member_alive(member, now):
                continue
            if sig is signal.SIGKILL:
                member.killed_at, member.killed_by = now, sig.name
            elif member.spec.term_cleanup is not None and member.term_at is None:
                member.term_at = now  # its trap runs; it exits when the cleanup is done
        if sig is signal.SIGKILL or not self.script.ignores_term:
            self.kill(now, sig.name)
        self._wake()
        return True

    def group_alive(self) -> bool:
        return self.group_alive_at(trio.current_time())

    def close(self) -> None:
        pass


class SimBackend:
    """The world's process backend: looks the script up by its command line and records every
    start in the side-effect ledger (through `on_spawn`) and every signal sent to a group (through
    `on_signal`)."""

    def __init__(
        self,
        scripts: Mapping[str, Script],
        on_spawn: Callable[[str, SimProcess], None],
        on_signal: Callable[[SimProcess, str], None] | None = None,
        *,
        reap_delay_s: float = 0.0,
    ) -> None:
        self._scripts = scripts
        self._reap_delay_s = reap_delay_s
        self._on_spawn = on_spawn
        self._on_signal = on_signal
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
            script,
            self._next_pid,
            trio.current_time(),
            self._on_signal,
            self._reap_delay_s,
            stdin=stdin,
            terminal=terminal,
        )
        self.running.append(proc)
        self._on_spawn(command, proc)
        return proc

    def kill_all(self, now: float) -> None:
        """The agent died: its process groups die with it (the simulated host reaps them)."""
        for proc in self.running:
            proc.crash(now)
        self.running.clear()
