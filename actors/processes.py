"""Processes: spawn in a new process group, pump output into a retention buffer, wait, signal.

The process backend is an interface (`ProcessBackend`) so that the simulation harness can plug in
scripted processes in virtual time without forking the runtime. `RealProcessBackend` spawns
directly on the event loop thread, with libc's posix_spawn (actors/spawn.py) or, where the C
library lacks what that needs, `subprocess.Popen`: both vfork+exec and return in well under a
millisecond, whereas `trio.lowlevel.open_process` hops to a worker thread for every spawn
(measured here: ~1,240 spawns/s vs ~1,800/s for a bare posix_spawn+waitpid; spawning on worker
threads was tried and was slower on 2 cores). Exit is awaited through a pidfd, so no thread is
ever parked in waitpid.

A command's stdin is closed (/dev/null) unless `execute` asks for `stdin` (a pipe whose write
end the agent keeps, non-blocking) or `pty` (a new pseudo-terminal, actors/terminal.py: its
master is then both the output the pump reads and the input `process_input` writes). Either way
the agent writes through a `StdinPort`; the order of inputs is actors/stdin.py's business.

Known hazard (trio issue #3237): `trio.run_process` cancellation signals only the direct child,
so a grandchild of `sh -c` survives. Every command here runs in its own process group and we
always signal the whole group.
"""

from __future__ import annotations

import errno
import fcntl
import math
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Final, Protocol, runtime_checkable

import trio

from toolwire.actors import terminal as terminals
from toolwire.actors.confined import ConfinedThreads
from toolwire.actors.input_queue import InputQueue
from toolwire.actors.output import OutputBuffer
from toolwire.actors.sandbox import Confinement
from toolwire.actors.spawn import PosixSpawner, pipe_above_stdio
from toolwire.actors.terminal import TerminalSize

# One pipe read. 64 KiB is Linux's default pipe capacity, so one read drains a full pipe, and it
# becomes one `output` message (never one message per line).
READ_CHUNK_BYTES = 64 * 1024
# A process that fills its pipe between two reads writes faster than the agent reads: its pipe
# grows to this (once), and reads take this much. Fewer, larger reads and `output` messages cost
# both ends less per byte (issue 6: a 200 MB stream, 648 -> 848 MB/s in an A/B run). Only such
# processes get it: every pipe counts against its user's pipe quota (fs.pipe-user-pages-soft,
# 64 MiB by default; beyond it the kernel gives that user's new pipes 2 pages), so a thousand
# quiet processes must keep the default. Refused (quota, pipe-max-size): the default stays.
BULK_PIPE_BYTES = 256 * 1024

SIGNALS: dict[str, signal.Signals] = {
    name: getattr(signal, name)
    for name in ("SIGINT", "SIGTERM", "SIGKILL", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2")
}


@dataclass(frozen=True, slots=True)
class ExitStatus:
    exit_code: int | None  # None when killed by a signal
    signal: str | None  # e.g. "SIGKILL"

    @classmethod
    def from_wait_status(cls, status: int) -> ExitStatus:
        if os.WIFSIGNALED(status):
            sig = os.WTERMSIG(status)
            try:
                name = signal.Signals(sig).name
            except ValueError:
                name = f"SIG{sig}"
            return cls(exit_code=None, signal=name)
        return cls(exit_code=os.waitstatus_to_exitcode(status), signal=None)


class InputClosed(Exception):
    """Nothing can be written to the command's input any more: its stdin pipe was closed (by an
    `eof`, or when the process was released), every reader of the pipe is gone, or its terminal
    was released."""


class StdinPort(Protocol):
    """Where `process_input` writes: the write end of a stdin pipe, or a terminal's master."""

    @property
    def terminal(self) -> bool:
        """True for a terminal: `end` then sends the EOF character and `resize` works."""

    def write_some(self, data: memoryview) -> int:
        """Write what fits now without waiting: how many bytes went in (0 when none fit).
        Raises InputClosed."""

    async def wait_room(self) -> None:
        """Wait until `write_some` may take more. Raises InputClosed if the port is closed
        meanwhile."""

    def end(self) -> bytes:
        """End the input, as `process_input`'s `eof` asks: a pipe is closed now (returns b""); a
        terminal stays open and returns its EOF character, for the caller to write in turn."""

    def resize(self, size: TerminalSize) -> None:
        """Resize the terminal (the kernel sends SIGWINCH). Raises InputClosed once the
        terminal was released; ValueError for a pipe."""


class SpawnedProcess(Protocol):
    """One running command, as the chat actor sees it."""

    pid: int | None

    @property
    def stdin(self) -> StdinPort | None:
        """Where its input goes: None when its stdin is closed (the default of `execute`)."""

    async def read_some(self) -> bytes:
        """Wait for output; b"" at end of output (every writer closed the pipe)."""

    def read_available(self) -> bytes:
        """Output that can be read right now without waiting (b"" if none)."""

    async def wait(self) -> ExitStatus:
        """Wait for the command's own process (the shell) to exit."""

    def signal_group(self, sig: signal.Signals) -> bool:
        """Signal the whole process group; False when no process of it is left."""

    def group_alive(self) -> bool:
        """True while any member of the command's process group exists (the shell counts until
        it is reaped), whether or not the shell itself has exited."""

    def poll_exited(self) -> bool:
        """True once the command's own process has exited, even before `wait` returned (a
        zombie not reaped yet): a cancel arriving then must not call a finished run canceled."""

    def close(self) -> None:
        """Release OS resources (pipe, pidfd). Idempotent."""


@runtime_checkable
class Releasable(Protocol):
    """A process held elsewhere (by the keeper) that is told when it is forgotten."""

    def release(self) -> None: ...


class ProcessBackend(Protocol):
    def spawn(
        self,
        argv: list[str],
        cwd: str,
        env: Mapping[str, str],
        *,
        stdin: bool = False,
        terminal: TerminalSize | None = None,
    ) -> SpawnedProcess:
        """Start argv in a new process group (a new session). Its stdin is closed, or a pipe
        with `stdin`; with `terminal` it runs on a new pseudo-terminal of that size as its
        controlling terminal (stdin, stdout and stderr), which implies `stdin`. Raises OSError
        if it cannot start."""


class PipeInput:
    """The agent's end of a command's stdin pipe (non-blocking); the keeper's handle
    (actors/kept.py) uses it for its copy of the pipe too."""

    terminal = False

    def __init__(self, fd: int) -> None:
        self._fd: int | None = fd

    def write_some(self, data: memoryview) -> int:
        fd = self._fd
        if fd is None:
            raise InputClosed
        try:
            return os.write(fd, data)
        except BlockingIOError:
            return 0
        except (BrokenPipeError, OSError) as exc:
            # EPIPE: every reader exited (the agent ignores SIGPIPE, as Python does).
            raise InputClosed from exc

    async def wait_room(self) -> None:
        fd = self._fd
        if fd is None:
            raise InputClosed
        try:
            await trio.lowlevel.wait_writable(fd)
        except trio.ClosedResourceError:
            raise InputClosed from None

    def end(self) -> bytes:
        self.close()
        return b""

    def resize(self, size: TerminalSize) -> None:
        raise ValueError("a pipe has no size")

    def close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            trio.lowlevel.notify_closing(fd)  # a writer waiting for room gets InputClosed
            os.close(fd)


class TerminalInput:
    """Input into a command's terminal through its master: bytes typed, the end of input, the
    size. Where the master comes from is the subclass's (`_master`: None once it is closed):
    the agent's own terminal (`_TerminalPort`) or its copy of the keeper's (actors/kept.py)."""

    terminal = True

    def _master(self) -> int | None:
        raise NotImplementedError

    def _fd(self) -> int:
        fd = self._master()
        if fd is None:
            raise InputClosed
        return fd

    def write_some(self, data: memoryview) -> int:
        fd = self._fd()
        try:
            return os.write(fd, data)
        except BlockingIOError:
            return 0  # the terminal's input queue is full: the program reads nothing now
        except OSError as exc:
            raise InputClosed from exc

    async def wait_room(self) -> None:
        try:
            await trio.lowlevel.wait_writable(self._fd())
        except trio.ClosedResourceError:
            raise InputClosed from None

    def end(self) -> bytes:
        # What Ctrl-D does: at the start of a line the program reads the end of its input;
        # the terminal stays open (it is also the command's output).
        return terminals.eof_char(self._fd())

    def resize(self, size: TerminalSize) -> None:
        try:
            terminals.set_size(self._fd(), size)
        except OSError as exc:
            raise InputClosed from exc


class _TerminalPort(TerminalInput):
    """The input side of a command's terminal: the master the pump reads from. The process owns
    that descriptor (it closes it with the output); this port only writes to it while open."""

    def __init__(self, process: _RealProcess) -> None:
        self._process = process

    def _master(self) -> int | None:
        return self._process.master_fd


class _RealProcess:
    def __init__(
        self,
        pid: int,
        read_fd: int,
        popen: subprocess.Popen[bytes] | None,
        *,
        stdin_fd: int | None = None,
        terminal: bool = False,
    ) -> None:
        # Popen, when it spawned: told about the reap, so it neither warns nor reaps again.
        self._popen = popen
        self.pid: int | None = pid
        self._read_fd: int | None = read_fd
        self._pidfd: int | None = os.pidfd_open(pid)
        self._status: ExitStatus | None = None
        self.read_bytes = READ_CHUNK_BYTES  # grows with the pipe (_grow_pipe)
        self._grown = False
        self._terminal = terminal
        self._stdin_pipe = PipeInput(stdin_fd) if stdin_fd is not None else None
        self.stdin: StdinPort | None = _TerminalPort(self) if terminal else self._stdin_pipe

    @property
    def master_fd(self) -> int | None:
        """The terminal's master (while open), for a command on a terminal."""
        return self._read_fd if self._terminal else None

    async def read_some(self) -> bytes:
        while True:
            fd = self._read_fd
            if fd is None:
                return b""
            try:
                data = os.read(fd, self.read_bytes)
            except BlockingIOError:
                await trio.lowlevel.wait_readable(fd)
                continue
            except OSError as exc:
                # EIO: a terminal's master once no process holds its slave side any more (what
                # end of output is on a terminal; whatever was printed was read before it).
                if exc.errno == errno.EBADF or (exc.errno == errno.EIO and self._terminal):
                    return b""
                raise
            if len(data) == self.read_bytes and not self._grown:
                self._grow_pipe(fd)
            return data

    def _grow_pipe(self, fd: int) -> None:
        """The pipe was full: let the producer run further ahead, and read more at once."""
        self._grown = True
        try:
            size = fcntl.fcntl(fd, fcntl.F_GETPIPE_SZ)
            if size < BULK_PIPE_BYTES:  # never shrink one (64 KiB pages make 1 MiB pipes)
                size = fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, BULK_PIPE_BYTES)
        except OSError:
            return  # refused: keep the default pipe and reads
        self.read_bytes = max(self.read_bytes, size)

    def read_available(self) -> bytes:
        pieces: list[bytes] = []
        while self._read_fd is not None:
            try:
                piece = os.read(self._read_fd, self.read_bytes)
            except BlockingIOError:
                break
            except OSError as exc:
                if exc.errno == errno.EIO and self._terminal:
                    break  # a terminal nobody holds: nothing more to read
                raise
            if not piece:
                break
            pieces.append(piece)
        return b"".join(pieces)

    async def wait(self) -> ExitStatus:
        if self._status is not None:
            return self._status
        assert self._pidfd is not None and self.pid is not None
        await trio.lowlevel.wait_readable(self._pidfd)
        # The pidfd is readable: the child has exited, so this waitpid returns at once.
        _, status = os.waitpid(self.pid, 0)  # noqa: ASYNC222
        self._status = ExitStatus.from_wait_status(status)
        if self._popen is not None:
            self._popen.returncode = (
                self._status.exit_code if self._status.exit_code is not None else -1
            )
        self._close_fd("_pidfd")
        return self._status

    def poll_exited(self) -> bool:
        if self._status is not None:
            return True
        assert self.pid is not None
        try:
            # WNOWAIT: look without reaping; the reap task still collects the status.
            info = os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return True
        return info is not None

    def signal_group(self, sig: signal.Signals) -> bool:
        assert self.pid is not None
        return signal_group(self.pid, sig)

    def group_alive(self) -> bool:
        assert self.pid is not None
        return group_alive(self.pid)

    def _close_fd(self, name: str) -> None:
        fd: int | None = getattr(self, name)
        if fd is not None:
            setattr(self, name, None)
            trio.lowlevel.notify_closing(fd)
            os.close(fd)

    def close(self) -> None:
        if self._stdin_pipe is not None:
            self._stdin_pipe.close()
        self._close_fd("_read_fd")
        self._close_fd("_pidfd")


# The Popen path cannot give the child a clean signal state (Popen's restore_signals puts back
# only SIGPIPE and SIGXFSZ: an agent started with SIGINT ignored would hand that on, and Ctrl-C
# on a terminal would do nothing) nor make a terminal the controlling terminal of the child's
# session, and a `preexec_fn` is unsafe in an agent with worker threads. So a tiny isolated
# Python (`-I -S`: no PYTHON* variables, no site, no cwd on the path) does both, as posix_spawn
# does in actors/spawn.py: every signal back to its default, none blocked, then the exec.
_EXEC_HELPER = (
    "import fcntl, os, signal, sys, termios\n"
    "mode, lc_ctype, argv = sys.argv[1], sys.argv[2], sys.argv[3:]\n"
    "if mode == 'terminal':\n"
    "    fcntl.ioctl(0, termios.TIOCSCTTY, 0)\n"
    "for sig in signal.valid_signals():\n"
    "    try:\n"
    "        signal.signal(sig, signal.SIG_DFL)\n"
    "    except (OSError, ValueError):\n"
    "        pass  # SIGKILL and SIGSTOP: their action cannot change\n"
    "signal.pthread_sigmask(signal.SIG_SETMASK, ())\n"
    # Python's start may coerce the C locale by setting LC_CTYPE (PEP 538, and -I cannot turn
    # it off): the command gets the variable exactly as it was asked for.
    "env = dict(os.environ)\n"
    "env.pop('LC_CTYPE', None)\n"
    "if lc_ctype.startswith('='):\n"
    "    env['LC_CTYPE'] = lc_ctype[1:]\n"
    "os.execve(argv[0], argv, env)\n"
)


def _through_exec_helper(argv: list[str], env: Mapping[str, str], *, terminal: bool) -> list[str]:
    """`argv` run by `_EXEC_HELPER`. The helper would only print a traceback and exit 1 where
    Popen raises for a command it cannot run, so this raises Popen's OSError first."""
    if not os.access(argv[0], os.X_OK):
        code = errno.ENOENT if not os.path.exists(argv[0]) else errno.EACCES
        raise OSError(code, os.strerror(code), argv[0])
    mode = "terminal" if terminal else "pipe"
    lc_ctype = "-" if "LC_CTYPE" not in env else "=" + env["LC_CTYPE"]
    return [sys.executable, "-I", "-S", "-c", _EXEC_HELPER, mode, lc_ctype, *argv]


# A spawn's pid, and its Popen when Popen made it; and who runs the spawn: this thread, or the
# confined thread of the command's sandbox (`ConfinedThread.call`).
_Started = tuple[int, "subprocess.Popen[bytes] | None"]
_Runner = Callable[[Callable[[], _Started]], _Started]


def _run_here(start: Callable[[], _Started]) -> _Started:
    return start()


class RealProcessBackend:
    """Real processes. `posix_spawn=False` forces the Popen path (tests cover both). A command
    with a `confinement` is spawned (either way) by the confined thread of its policy
    (actors/confined.py), so it and all it starts inherit that sandbox."""

    def __init__(self, *, posix_spawn: bool = True) -> None:
        self._spawner = PosixSpawner.load() if posix_spawn else None
        self._confined = ConfinedThreads()

    def spawn(
        self,
        argv: list[str],
        cwd: str,
        env: Mapping[str, str],
        *,
        stdin: bool = False,
        terminal: TerminalSize | None = None,
        confinement: Confinement | None = None,
    ) -> SpawnedProcess:
        # Pipes and terminals are made here, unconfined (a confined thread may not even open
        # /dev/ptmx); only the spawn itself runs on the confined thread of the policy.
        run: _Runner = _run_here
        if confinement is not None:
            run = self._confined.thread_for(
                confinement.ruleset, refuse_tcp=confinement.refuse_tcp
            ).call
        if terminal is not None:
            return self._spawn_on_terminal(argv, cwd, env, terminal, run)
        read_fd, write_fd = pipe_above_stdio()
        in_read, in_write = pipe_above_stdio() if stdin else (None, None)

        def start() -> _Started:
            if self._spawner is not None:
                return self._spawner.spawn(argv, cwd, env, write_fd, stdin_fd=in_read), None
            popen = subprocess.Popen(
                _through_exec_helper(argv, env, terminal=False),
                stdin=subprocess.DEVNULL if in_read is None else in_read,
                stdout=write_fd,
                stderr=write_fd,  # one merged output, as a terminal shows it
                cwd=cwd,
                env=dict(env),
                start_new_session=True,  # own session and process group: killed as a group
                close_fds=True,
            )
            return popen.pid, popen

        try:
            pid, popen = run(start)
        except BaseException:
            for fd in (read_fd, write_fd, in_read, in_write):
                if fd is not None:
                    os.close(fd)
            raise
        os.close(write_fd)
        os.set_blocking(read_fd, False)
        if in_read is not None and in_write is not None:
            os.close(in_read)
            # Non-blocking: a large input waits for room on the loop, never in a write().
            os.set_blocking(in_write, False)
        return _RealProcess(pid, read_fd, popen, stdin_fd=in_write)

    def _spawn_on_terminal(
        self,
        argv: list[str],
        cwd: str,
        env: Mapping[str, str],
        size: TerminalSize,
        run: _Runner,
    ) -> SpawnedProcess:
        term = terminals.open_terminal(size)

        def start() -> _Started:
            if self._spawner is not None:
                pid = self._spawner.spawn(argv, cwd, env, None, terminal_path=term.slave_path)
                return pid, None
            popen = subprocess.Popen(
                _through_exec_helper(argv, env, terminal=True),
                stdin=term.slave,
                stdout=term.slave,
                stderr=term.slave,
                cwd=cwd,
                env=dict(env),
                start_new_session=True,
                close_fds=True,
            )
            return popen.pid, popen

        try:
            pid, popen = run(start)
        except BaseException:
            os.close(term.master)
            raise
        finally:
            # The child holds its own slave side now (posix_spawn and Popen return after its
            # exec), so once it and its children close theirs, the master reads EIO: the end.
            os.close(term.slave)
        return _RealProcess(pid, term.master, popen, terminal=True)


@dataclass(eq=False)
class ProcessRecord:
    """One process of a chat, as `process_list` and `process_output` show it."""

    process_id: str
    command: str
    handle: SpawnedProcess
    output: OutputBuffer
    started_at_ms: int
    exited_at_ms: int | None = None
    exited_at: float | None = None  # trio clock, for exited_retention_s
    status: ExitStatus | None = None
    timed_out: bool = False
    canceled: bool = False
    exited: trio.Event = field(default_factory=trio.Event)
    # Set when a stop of the group (`runners.kill_group`) has finished: the group is empty (or
    # what is left of it could not be seen to go, see GROUP_GONE_AFTER_KILL_S). A cancel's
    # reply waits for it.
    stopped: trio.Event = field(default_factory=trio.Event)
    output_closed: trio.Event = field(default_factory=trio.Event)
    # Set whenever output arrives or the process changes state: waiters re-check.
    changed: trio.Event = field(default_factory=trio.Event)
    # Its inputs (PROTOCOL.md 9.1, actors/stdin.py): their order, the bytes written to its stdin
    # by all of them, whether an `eof` closed the stdin pipe, and an event set (and replaced)
    # whenever the input at the head of the queue changes.
    inputs: InputQueue = field(default_factory=InputQueue)
    stdin_offset: int = 0
    stdin_closed: bool = False
    input_turn: trio.Event = field(default_factory=trio.Event)

    @property
    def running(self) -> bool:
        return self.status is None

    def notify(self) -> None:
        self.changed.set()
        self.changed = trio.Event()

    def next_input(self) -> None:
        """Wake the inputs waiting for their turn: the head of the queue changed."""
        self.input_turn.set()
        self.input_turn = trio.Event()


class ProcessTable:
    """The processes of one chat, keyed by process_id. A chat sees and signals only its own."""

    def __init__(
        self,
        backend: ProcessBackend,
        *,
        retention_bytes: int,
        result_bytes: int,
    ) -> None:
        self._backend = backend
        self._retention_bytes = retention_bytes
        self._result_bytes = result_bytes
        self._processes: dict[str, ProcessRecord] = {}
        # The running ones, kept apart: exited processes stay listed for an hour, and the
        # per-spawn limit check must not walk all of them (O(1), not O(listed)).
        self._running: dict[str, ProcessRecord] = {}

    def __len__(self) -> int:
        return len(self._processes)

    def get(self, process_id: str) -> ProcessRecord | None:
        return self._processes.get(process_id)

    def running_count(self) -> int:
        return len(self._running)

    def listing(self) -> list[ProcessRecord]:
        """Newest first, as `process_list` shows them: by start order (the dict keeps it), not
        by `started_at_ms`, which ties within a millisecond and steps back with the wall clock."""
        return list(reversed(self._processes.values()))

    def spawn(
        self,
        process_id: str,
        command: str,
        argv: list[str],
        cwd: str,
        env: Mapping[str, str],
        started_at_ms: int,
        *,
        stdin: bool = False,
        terminal: TerminalSize | None = None,
        confinement: Confinement | None = None,
    ) -> ProcessRecord:
        """Start a process (OSError if it cannot start). The caller runs `pump` and `reap`.
        `stdin`: its stdin is a pipe `process_input` writes to; `terminal`: it runs on a new
        pseudo-terminal of that size (PROTOCOL.md 9.1)."""
        # Only a command with an input asks the backend for one: a backend of scripted
        # processes that offers none (a test's) is still a backend for everything else.
        if confinement is not None:
            # Only real processes can be confined by the kernel; a scripted backend (the
            # simulation's) refuses rather than run a command less restricted than asked.
            if not isinstance(self._backend, RealProcessBackend):
                raise OSError(errno.ENOSYS, "this process backend cannot sandbox a command")
            handle = self._backend.spawn(
                argv, cwd, env, stdin=stdin, terminal=terminal, confinement=confinement
            )
        elif terminal is not None or stdin:
            handle = self._backend.spawn(argv, cwd, env, stdin=stdin, terminal=terminal)
        else:
            handle = self._backend.spawn(argv, cwd, env)
        return self.add(process_id, command, handle, started_at_ms)

    def add(
        self,
        process_id: str,
        command: str,
        handle: SpawnedProcess,
        started_at_ms: int,
        output: OutputBuffer | None = None,
    ) -> ProcessRecord:
        """List a process spawned elsewhere (by the keeper, actors/kept.py), with the output
        recorded of it so far if it was re-adopted. The caller runs `pump` and `reap`."""
        buffer = output or OutputBuffer(
            retention_bytes=self._retention_bytes, result_bytes=self._result_bytes
        )
        record = ProcessRecord(
            process_id=process_id,
            command=command,
            handle=handle,
            output=buffer,
            started_at_ms=started_at_ms,
        )
        old = self._processes.pop(process_id, None)  # re-inserted below: now the newest
        if old is not None and old.running:
            # Unreachable through the record table (process_id == call_id, run at most once),
            # but never orphan a live process silently.
            old.handle.signal_group(signal.SIGKILL)
        self._processes[process_id] = record
        self._running[process_id] = record
        return record

    def drop(self, process_id: str) -> None:
        """Forget an exited process (ChatState decides when: `DropProcess`); a kept one's
        keeper drops what it recorded of it as well (PROTOCOL.md 10.1)."""
        record = self._processes.get(process_id)
        if record is not None and not record.running:
            del self._processes[process_id]
            if isinstance(record.handle, Releasable):
                record.handle.release()

    def running(self) -> list[ProcessRecord]:
        return list(self._running.values())

    def exited(self, record: ProcessRecord) -> None:
        """The reap of `record` saw its shell exit (pass as `reap`'s on_exit)."""
        if self._running.get(record.process_id) is record:
            del self._running[record.process_id]


def signal_group(pgid: int, sig: signal.Signals) -> bool:
    """Signal every member of process group `pgid`; False when none is left. Whoever holds the
    command's process (this module's own, or the keeper's: actors/kept.py) stops it so."""
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    return True


def group_alive(pgid: int) -> bool:
    """True while a member of process group `pgid` still runs."""
    try:
        os.killpg(pgid, 0)  # signal 0: only asks whether the group has a member
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # a member runs as another user (a setuid program): look closer
    # killpg counts zombies too: members that exited and wait for a reaper. Init reaps
    # orphans at once on most hosts, but not every PID 1 does (some container and VM inits
    # never do), so only a member that still runs keeps the group alive.
    return has_live_member(pgid)


def has_live_member(pgid: int) -> bool:
    """True when a process of group `pgid` still runs (is not a zombie), from /proc: one read
    per process on the host, so only asked after the one-syscall `killpg(pgid, 0)` said the
    group has a member."""
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as stat:
                # "pid (comm) state ppid pgrp ...": comm may hold spaces and parentheses.
                fields = stat.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue  # it exited while we looked
        if int(fields[2]) == pgid and fields[0] != b"Z":
            return True
    return False


def has_exited(record: ProcessRecord) -> bool:
    """True once the command's shell has exited, also in the moment between its exit and its
    reap task running (a zombie): a cancel arriving then must not call a finished run
    "canceled", and a signal sent then reaches nothing."""
    return record.status is not None or record.handle.poll_exited()


# Looks at a stopping process group: from 1 ms (a shell that obeys SIGTERM is gone within a
# millisecond or two, and the cancel's reply waits for it), doubling to 20 ms (a member that
# cleans up for seconds costs 50 syscalls a second at most).
GROUP_POLL_FIRST_S: Final = 0.001
GROUP_POLL_MAX_S: Final = 0.02
# A group watched after its command ended (only a member that left the output pipe is in it:
# a server started with `nohup ... &`) is looked at no more than once a second: it may live
# for hours, and nobody waits on it.
GROUP_WATCH_MAX_S: Final = 1.0
# After SIGKILL every member dies at once, but only the shell is ours to reap; the others are
# reaped by init. Where nothing reaps them (the agent as PID 1 of a container without an init)
# their zombies would keep the group non-empty forever, so the wait for that is bounded.
GROUP_GONE_AFTER_KILL_S: Final = 1.0


async def pump(record: ProcessRecord, on_output: Callable[[ProcessRecord], None]) -> None:
    """Read the pipe until every writer closed it (which may be long after the shell exited,
    when a background child holds the pipe). Each read becomes one append."""
    try:
        while True:
            data = await record.handle.read_some()
            if not data:
                break
            record.output.append(data)
            on_output(record)
            record.notify()
            # A fast producer keeps the pipe readable, so read_some never waits: yield after
            # each append, or the senders starve and a fast follower sees retention jumps.
            # (After the append: a checkpoint inside a read could reorder appended chunks.)
            await trio.lowlevel.checkpoint()
    finally:
        record.output_closed.set()
        if record.status is not None:
            record.handle.close()
        record.notify()
        on_output(record)


def drain_available(record: ProcessRecord, on_output: Callable[[ProcessRecord], None]) -> None:
    """Take what the pipe holds right now. Called when the shell exits, so the result carries
    everything the command wrote before it exited without waiting for EOF."""
    data = record.handle.read_available()
    if data:
        record.output.append(data)
        on_output(record)
        record.notify()


async def reap(
    record: ProcessRecord, wall_ms: Callable[[], int], on_exit: Callable[[ProcessRecord], None]
) -> None:
    """Wait for the shell to exit and record its status."""
    status = await record.handle.wait()
    record.status = status
    record.exited_at_ms = wall_ms()
    record.exited_at = trio.current_time()
    record.exited.set()
    if record.output_closed.is_set():
        record.handle.close()
    on_exit(record)
    record.notify()


async def wait_until_group_empty(
    record: ProcessRecord, timeout_s: float = math.inf, *, max_delay_s: float = GROUP_POLL_MAX_S
) -> bool:
    """Poll the group (one `killpg(pgid, 0)` a look) on a backoff up to `max_delay_s` until it
    has no member, for at most `timeout_s`; True when it emptied. A pidfd per member would wake
    us exactly, but members are not our children and come and go; a look costs one syscall."""
    delay = GROUP_POLL_FIRST_S
    with trio.move_on_after(timeout_s):
        while record.handle.group_alive():
            await trio.sleep(delay)
            delay = min(delay * 2, max_delay_s)
        return True
    return False
