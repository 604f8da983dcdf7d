"""The keeper: the process that holds an agent's commands so that they outlive the agent
(PROTOCOL.md 10.1, docs/durability.md). One per state dir, started by the first agent that
needs it, in a session of its own; `python -m toolwire.actors.keeper KEEPER_DIR`.

Why one per agent (docs/architecture.md, "The keeper", has the figures): a Python keeper per
command would cost ~10 MiB and tens of milliseconds per `execute`; one keeper costs that once,
and each process it holds costs a few kilobytes of it. A keeper's death costs exactly the
processes it holds, which are all of them: it does as little as it can (no trio, one
`selectors` loop; no thread but the sandbox's spawners and the one that makes spare files
ahead of the spawns, keeper_store.SpareFiles), so that it has little to fail on.

What it does for each command, and nothing it was not asked for by its agent:
- spawns it (it is the parent: only a parent learns a process's exit status), in a process
  group of its own, with posix_spawn (actors/spawn.py), confined by the agent's ruleset on a
  confined thread of its own where the call has a sandbox (actors/confined.py): the agent
  decides the policy, the keeper applies it. The loop does not wait for that thread: it
  answers the spawn once the thread posts that the process started (`_on_spawned`);
- records its output in `keeper_store` under 5.2's retention, always, and forwards it to the
  agent on a pipe of that process (the agent reads it as it read the command's pipe before):
  duplicated into that pipe by tee(2), then spliced into the record, so the keeper copies
  nothing itself (actors/pipe_tee.py); a terminal's output is read and written out. While no
  agent holds that pipe the output is only recorded;
- reaps it, records its exit status, and tells the agent, after every byte printed before
  the exit was forwarded (the result carries everything the command wrote before it exited);
- holds its stdin pipe's write end or its terminal's master, so that a restarted agent can
  still type into it; the agent writes through its own copy, and an `eof` is a request here.

The control channel is a SOCK_SEQPACKET unix socket in the keeper's directory, which is mode
0700, and a peer of another user is refused (SO_PEERCRED). Same user is not enough: a command
the agent started under a sandbox runs as that user too, and Landlock does not govern
connecting to a unix socket by its path, so a confined command could otherwise ask the keeper
for an unconfined spawn. So a connection counts only once its first message proves it knows
the directory's secret (`SECRET_NAME`, 0600, made by the agent; a sandboxed command cannot
read the state dir, actors/hidden_paths.py); anything else first, and it is closed, the
agent's connection untouched. One agent at a time: a new connection that proved itself
replaces the old one (an agent killed with -9 may not have been seen to go yet).
The keeper exits once no agent is connected and no process it holds runs or prints.

A request it cannot carry out fails alone (logged, answered with an error): the keeper holds
every command, so nothing one request meets may end it. What a spawn needs is made before the
process starts where it can be (its file, its pipes), so that a refusal there runs nothing;
what can only come after (its pidfd, the agent's sockets) failing gets the process killed with
its group and reaped at once, and the reply says it started (its call ends `unknown`).
"""

from __future__ import annotations

import array
import contextlib
import ctypes
import errno
import fcntl
import hmac
import logging
import mmap
import os
import resource
import secrets
import select
import selectors
import signal
import socket
import struct
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

import msgspec

from toolwire.actors import keeper_store, landlock, pipe_tee
from toolwire.actors import terminal as terminals
from toolwire.actors.confined import Completions, ConfinedThread, ConfinedThreads
from toolwire.actors.spawn import PosixSpawner, pipe_above_stdio

log = logging.getLogger("toolwire.keeper")

SOCKET_NAME: Final = "keeper.sock"
# The control protocol this keeper speaks, told in its answer to the first `ping` (a keeper
# outlives an upgrade of its agent, so the agent must know): 2 added rulesets told once per
# connection (`ruleset`, `forget_ruleset`) and named by a spawn's `ruleset_id`; a spawn's
# inline `ruleset`, all that 1 knew, is still taken.
KEEPER_PROTOCOL: Final = 2
# The most rulesets one connection may have told at once (its agent keeps 64: actors/kept.py).
MAX_TOLD_RULESETS: Final = 256
# The secret a connection's first message must carry (hex; made by the first agent, 0600).
SECRET_NAME: Final = "secret"
# Messages on the control socket are small (a spawn's env is the largest: a few KiB).
MAX_MESSAGE_BYTES: Final = 1024 * 1024
READ_CHUNK_BYTES: Final = 64 * 1024
BULK_PIPE_BYTES: Final = 256 * 1024
# The pipe a process's output is forwarded on: room for a fast producer's reads.
FORWARD_BUFFER_BYTES: Final = 1024 * 1024
# A keeper nobody connects to (its agent died before it connected) does not wait forever.
FIRST_CONNECT_WAIT_S: Final = 30.0
# How long a new keeper waits for one that is exiting to be gone.
LOCK_WAIT_S: Final = 5.0

_PR_SET_DUMPABLE: Final = 4

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder()
_handler = Callable[[int], None]


def wall_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass(eq=False)
class Held:
    """One process the keeper holds."""

    key: str
    pid: int
    pidfd: int | None  # closed once the process is done (reaped, its output ended)
    read_fd: int | None  # output pipe, or the terminal's master
    input_fd: int | None  # stdin pipe's write end, or the terminal's master
    terminal: bool
    recording: keeper_store.Recording | None = None  # made right after the spawn's reply
    # The write end of the agent's output pipe for this process (the agent holds the other).
    forward: int | None = None
    backlog: bytearray = field(default_factory=bytearray)  # read, not yet in `forward`
    # `forward` is watched for room (what is left of a read waits in `backlog`, or the
    # output waits in the command's own pipe for `tee`): nothing more is read meanwhile.
    waiting_room: bool = False
    # Whether the output is duplicated into `forward` by tee(2) and spliced into the record
    # (a pipe, on Linux: actors/pipe_tee.py) rather than read and written twice.
    teeing: bool = False
    status: tuple[int | None, str | None] | None = None
    exit_sent: bool = True  # only an agent that holds the process is told of its exit
    read_bytes: int = READ_CHUNK_BYTES
    grown: bool = False
    grown_forward: bool = False
    reading: bool = False  # its output is registered with the selector
    # Re-adopted, until the agent read the recording: nothing is read meanwhile, so the file
    # holds exactly the bytes before the new pipe's first.
    paused: bool = False
    # Its hard deadline (PROTOCOL.md 9.2), enforced here while no agent is connected: the
    # wall-clock ms it passes at (from the FIRST start) and the grace between TERM and KILL.
    kill_at_ms: int | None = None
    grace_s: float = 2.0
    kill_due: float | None = None  # monotonic time of the SIGKILL once the SIGTERM went
    killed_after: bool = False
    reaping: bool = False  # inside `_on_exit`, which writes the exit after a last drain

    @property
    def done(self) -> bool:
        return self.status is not None and self.read_fd is None


class Keeper:
    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.procs_dir = keeper_store.procs_dir(directory)
        os.makedirs(self.procs_dir, mode=0o700, exist_ok=True)
        _drop_stale_spares(self.procs_dir)
        self.spares = keeper_store.SpareFiles(self.procs_dir)
        self.selector = selectors.DefaultSelector()
        self.held: dict[str, Held] = {}
        # Those of `held` with a hard deadline not yet enforced (few, usually none).
        self.deadlines: dict[str, Held] = {}
        self.conn: socket.socket | None = None
        self.secret = read_secret(directory)
        # Connections that have not proved they know the secret yet.
        self.pending: set[socket.socket] = set()
        self.ever_connected = False
        # What is done once the reply went out: the agent need not wait for the disk.
        self.after_reply: list[Callable[[], None]] = []
        self.reader = MessageReader()
        self.spawner = PosixSpawner.load()
        self.confined = ConfinedThreads()
        # Spawns handed to a confined thread and not answered yet, by key, and where the
        # threads post what each came to (`_on_spawned` takes it on this loop).
        self.spawning: dict[str, _Spawning] = {}
        self.spawned: Completions[tuple[_Spawning, int | None, BaseException | None]] = (
            Completions()
        )
        self.selector.register(self.spawned.fd, selectors.EVENT_READ, self._on_spawned)
        # How many connections proved themselves so far: the one a spawn was asked on.
        self.connections = 0
        # The rulesets the connected agent told (`ruleset`), by its number for each.
        self.rulesets: dict[int, _Told] = {}
        path = os.path.join(directory, SOCKET_NAME)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)  # a keeper that held the lock before this one is gone
        listener.bind(path)
        listener.listen(4)
        listener.setblocking(False)
        self.listener = listener
        self.selector.register(listener, selectors.EVENT_READ, self._accept)

    # -- the loop -------------------------------------------------------------------------------

    def run(self) -> None:
        started = time.monotonic()
        while True:
            # (A spawn still on a confined thread is waited for: `_on_spawned` decides.)
            idle = (
                self.conn is None and not self.spawning and all(h.done for h in self.held.values())
            )
            if idle and (self.ever_connected or time.monotonic() - started > FIRST_CONNECT_WAIT_S):
                return
            timeout = self._enforce_deadlines() if self.deadlines else 1.0
            for selected, mask in self.selector.select(timeout=timeout):
                handler: Callable[[int], None] = selected.data
                handler(mask)

    def _enforce_deadlines(self) -> float:
        """A hard deadline that passes while no agent is connected (9.2, 10.1): the group gets
        SIGTERM, then SIGKILL after the grace, as the agent would have done; the record says
        so. With an agent connected the agent enforces it (a kill under way goes on). Returns
        how long the loop may wait before the next step is due."""
        wait = 1.0
        now_ms, now = wall_ms(), time.monotonic()
        for held in list(self.deadlines.values()):
            if held.kill_due is not None:
                if now >= held.kill_due:
                    with contextlib.suppress(OSError):
                        os.killpg(held.pid, signal.SIGKILL)
                    del self.deadlines[held.key]
                else:
                    wait = min(wait, held.kill_due - now)
                continue
            if self.conn is not None:
                continue
            assert held.kill_at_ms is not None
            if now_ms < held.kill_at_ms:
                wait = min(wait, (held.kill_at_ms - now_ms) / 1000)
                continue
            try:
                os.killpg(held.pid, signal.SIGTERM)
            except OSError:
                del self.deadlines[held.key]  # no member left: nothing to stop
                continue
            held.killed_after = True
            if held.recording is not None and not held.done:  # a done one's record is closed
                held.recording.write_killed_after()
            held.kill_due = now + held.grace_s
            wait = min(wait, held.grace_s)
        return max(wait, 0.0)

    def close(self) -> None:
        self.listener.close()
        self.spares.close()
        self.spawned.close()
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(self.directory, SOCKET_NAME))

    # -- the agent's connection -----------------------------------------------------------------

    def _accept(self, _mask: int) -> None:
        try:
            conn, _ = self.listener.accept()
        except BlockingIOError:
            return
        creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        _, uid, _ = struct.unpack("3i", creds)
        if uid != os.getuid():
            conn.close()  # only the agent's own user (the directory is 0700 as well)
            return
        conn.setblocking(False)
        self.pending.add(conn)
        self.selector.register(conn, selectors.EVENT_READ, lambda _mask: self._on_pending(conn))

    def _on_pending(self, conn: socket.socket) -> None:
        """A new connection's first message: a `ping` with the secret makes it the agent's
        connection; anything else (or nothing) closes it, and the agent's stays."""
        try:
            data: memoryview | bytes = self.reader.recv(conn)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        self.pending.discard(conn)
        self.selector.unregister(conn)
        try:
            message = _decoder.decode(data) if data else None
        except Exception:
            message = None
        given = message.get("secret") if isinstance(message, dict) else None
        if (
            not isinstance(given, str)
            or message is None
            or message.get("op") != "ping"
            or not hmac.compare_digest(given.encode(), self.secret.encode())
        ):
            conn.close()
            return
        if self.conn is not None:
            self._drop_conn()
        self.conn = conn
        self.connections += 1
        self.ever_connected = True
        self.selector.register(conn, selectors.EVENT_READ, self._on_conn)
        self._tell({"rid": message.get("rid"), "protocol": KEEPER_PROTOCOL})

    def _drop_conn(self) -> None:
        """No agent from now on (its connection failed, went or was replaced); also for what
        was attached for an agent since it went (a reply made with no connection)."""
        conn, self.conn = self.conn, None
        if conn is not None:
            self.selector.unregister(conn)
            conn.close()
            self.rulesets.clear()  # told on that connection, and named by its spawns only
        # Its output pipes die with it (the agent held their other ends): only recorded now.
        for held in self.held.values():
            self._stop_forwarding(held)
            held.exit_sent = True

    def _on_conn(self, _mask: int) -> None:
        conn = self.conn
        assert conn is not None
        while True:
            try:
                data: memoryview | bytes = self.reader.recv(conn)
            except BlockingIOError:
                return
            except OSError:
                data = b""
            if not data:
                self._drop_conn()
                return
            reply: dict[str, Any] | None
            fds: list[int] = []
            message: Any = None
            try:
                message = _decoder.decode(data)
                reply, fds = self._handle(message)
            except Exception as exc:
                # One request the keeper could not carry out (a bug, or a resource it lacks)
                # fails alone: the keeper holds every command, and must not end with them.
                log.exception("a request could not be carried out")
                rid = message.get("rid") if isinstance(message, dict) else None
                reply = {"rid": rid, "errno": errno.EIO, "error": f"keeper error: {exc}"}
                if rid is None:
                    reply = None
            self._reply(reply, fds)
            if self.conn is not conn:
                return  # the reply could not be sent: the connection is gone

    def _reply(self, reply: dict[str, Any] | None, fds: list[int]) -> None:
        """Send a request's reply (None: no reply, or one sent later) and the descriptors it
        carries, then do what waited for it (`after_reply`)."""
        if reply is not None:
            self._tell(reply, fds)
        for fd in fds:
            os.close(fd)  # the agent holds its own copies now (or the send failed)
        after, self.after_reply = self.after_reply, []
        for action in after:
            try:
                action()
            except Exception:
                log.exception("what follows a reply could not be done")

    def _tell(self, message: dict[str, Any], fds: list[int] | None = None) -> None:
        conn = self.conn
        if conn is None:
            # Nobody to tell: what was attached for the message (a spawn's output pipe)
            # goes as it would had the send failed.
            self._drop_conn()
            return
        data = _encoder.encode(message)
        for attempt in range(2):
            try:
                if fds:
                    socket.send_fds(conn, [data], fds)
                else:
                    conn.send(data)
                return
            except BlockingIOError:
                if attempt:
                    break
                # Replies are small and the agent reads them at once: a full socket is an
                # agent that stopped reading; it gets one wait.
                _wait_writable(conn, 5.0)
            except OSError:
                break
        self._drop_conn()

    def _handle(self, message: dict[str, Any]) -> tuple[dict[str, Any] | None, list[int]]:
        op = message.get("op")
        rid = message.get("rid")
        if op == "spawn":
            return self._spawn(message)
        if op == "adopt":
            return self._adopt(message)
        held = self.held.get(message.get("key", ""))
        if op == "close_stdin" and held is not None:
            if held.input_fd is not None and not held.terminal:
                os.close(held.input_fd)
                held.input_fd = None
        elif op == "release":
            if held is not None and held.done:
                self._forget(held)
        elif op == "resume" and held is not None and held.paused:
            held.paused = False
            self._drain(held)
            self._update_reading(held)
            self._maybe_tell_exit(held)
        elif op == "ping":
            return {"rid": rid}, []
        elif op == "ruleset":
            number = message.get("id")
            if isinstance(number, int):
                # Checked when a spawn first uses it: a bad one fails that spawn, nothing else.
                told = _Told(message.get("ruleset"), bool(message.get("refuse_tcp")))
                self.rulesets[number] = told
                if len(self.rulesets) > MAX_TOLD_RULESETS:  # the agent forgets before this
                    del self.rulesets[next(iter(self.rulesets))]
        elif op == "forget_ruleset":
            number = message.get("id")
            if isinstance(number, int):
                self.rulesets.pop(number, None)
        return None, []

    # -- spawning -------------------------------------------------------------------------------

    def _spawn(self, message: dict[str, Any]) -> tuple[dict[str, Any] | None, list[int]]:
        """A spawn: started here (unconfined), or handed to its ruleset's confined thread, whose
        result `_on_spawned` takes; then None is the reply, sent once the spawn is done."""
        rid = message["rid"]
        key: str = message["key"]
        if self.spawner is None:
            return {"rid": rid, "errno": errno.ENOSYS, "error": "no posix_spawn"}, []
        if key in self.held or key in self.spawning or not _plain_name(key):
            return {"rid": rid, "errno": errno.EEXIST, "error": "already held"}, []
        argv: list[str] = message["argv"]
        cwd: str = message["cwd"]
        env: dict[str, str] = message["env"]
        rows, cols = message.get("rows"), message.get("cols")
        try:
            thread = self._confined_thread(message)
        except (KeyError, TypeError, ValueError) as exc:
            # Never run unconfined what was asked confined: the spawn is refused.
            return {"rid": rid, "errno": errno.EINVAL, "error": f"bad sandbox: {exc}"}, []
        spawning = _Spawning(
            rid=rid,
            key=key,
            meta=keeper_store.Meta(**message["meta"]),
            terminal=rows is not None and cols is not None,
            kill_after_ms=message.get("kill_after_ms"),
            grace_ms=message.get("grace_ms", 2000),
            connection=self.connections,
        )
        # One spawner for this loop and every confined thread, spawning at once: what it keeps
        # between spawns (the last environment block) is replaced, never changed, and each
        # spawn holds the block it uses.
        spawner = self.spawner
        start: Callable[[], int]
        try:
            # Its file first (a disk that refuses one refuses the spawn: nothing ran).
            spawning.spare = self.spares.take()
            if rows is not None and cols is not None:
                term = terminals.open_terminal(terminals.TerminalSize(int(rows), int(cols)))
                spawning.keep += [term.master]
                spawning.after_start.append(term.slave)
                spawning.read_fd, spawning.input_fd = term.master, term.master

                def start() -> int:
                    return spawner.spawn(argv, cwd, env, None, terminal_path=term.slave_path)

            else:
                read_fd, write_fd = pipe_above_stdio()
                spawning.keep.append(read_fd)
                spawning.after_start.append(write_fd)
                spawning.read_fd = read_fd
                if message.get("stdin"):
                    in_read, in_write = pipe_above_stdio()
                    spawning.keep.append(in_write)
                    spawning.after_start.append(in_read)
                    spawning.input_fd = in_write
                else:
                    in_read = None

                def start() -> int:
                    return spawner.spawn(argv, cwd, env, write_fd, stdin_fd=in_read)

            if thread is None:
                pid = start()
            else:
                # The loop goes on meanwhile: the reply goes out from `_on_spawned`.
                thread.submit(start, lambda pid, error: self.spawned.post((spawning, pid, error)))
        except (OSError, ValueError) as exc:
            return self._spawned(spawning, None, exc)
        if thread is None:
            return self._spawned(spawning, pid, None)
        self.spawning[key] = spawning
        return None, []

    def _on_spawned(self, _mask: int) -> None:
        """Spawns the confined threads finished: each answered, as `_spawn` answers one it
        started itself. One whose agent has gone, with no other connected since, is held as
        an unconfined spawn read after its agent went is: recorded, for the next agent to
        re-adopt by its key (its start row is durable: 10.1). One asked on a connection that
        another agent's has replaced is killed: that agent listed what it re-adopts when it
        connected, so no agent would ever answer for it."""
        for spawning, pid, error in self.spawned.take():
            del self.spawning[spawning.key]
            reply: dict[str, Any] | None
            fds: list[int] = []
            try:
                if spawning.connection != self.connections:
                    self._unasked(spawning, pid)
                    continue
                reply, fds = self._spawned(spawning, pid, error)
            except Exception as exc:
                log.exception("a spawn could not be carried out")
                reply = {"rid": spawning.rid, "errno": errno.EIO, "error": f"keeper error: {exc}"}
            self._reply(reply, fds)

    def _spawned(
        self, spawning: _Spawning, pid: int | None, error: BaseException | None
    ) -> tuple[dict[str, Any], list[int]]:
        """The reply to a spawn once its process started (`pid`) or could not be (`error`,
        which is raised again unless it is a refusal: an OSError or a ValueError)."""
        for fd in spawning.after_start:
            with contextlib.suppress(OSError):
                os.close(fd)  # the child's ends (its copies are the child's now)
        spawning.after_start.clear()
        if pid is None:
            for fd in spawning.keep:
                with contextlib.suppress(OSError):
                    os.close(fd)
            if spawning.spare is not None:
                self.spares.give_back(*spawning.spare)
            if not isinstance(error, (OSError, ValueError)):
                raise error if error is not None else RuntimeError("no pid and no error")
            code = error.errno if isinstance(error, OSError) and error.errno else errno.EINVAL
            text = error.strerror if isinstance(error, OSError) and error.strerror else str(error)
            return {"rid": spawning.rid, "errno": code, "error": text}, []
        rid, key, meta, spare = spawning.rid, spawning.key, spawning.meta, spawning.spare
        assert spare is not None and spawning.read_fd is not None
        read_fd, input_fd = spawning.read_fd, spawning.input_fd
        meta.pid = pid
        meta.terminal = spawning.terminal
        own = spawning.keep
        try:
            os.set_blocking(read_fd, False)
            pidfd = os.pidfd_open(pid)
        except OSError as exc:
            return self._started_and_stopped(rid, pid, own, spare, exc), []
        held = Held(
            key=key,
            pid=pid,
            pidfd=pidfd,
            read_fd=read_fd,
            input_fd=input_fd,
            terminal=spawning.terminal,
            # A terminal's master is no pipe: its output is read and written out.
            teeing=not spawning.terminal and pipe_tee.available(),
        )
        try:
            fds, names = self._attach(held)
        except OSError as exc:
            return self._started_and_stopped(rid, pid, [*own, pidfd], spare, exc), []
        if spawning.kill_after_ms:
            held.kill_at_ms = meta.started_at_ms + int(spawning.kill_after_ms)
            held.grace_s = float(spawning.grace_ms) / 1000
            self.deadlines[key] = held
        self.held[key] = held

        def record() -> None:
            # Before the loop reads anything of it: its first byte goes into this file.
            path, fd = spare
            held.recording = keeper_store.Recording(path, meta, fd)
            assert held.pidfd is not None  # closed only once it is done
            self.selector.register(held.pidfd, selectors.EVENT_READ, lambda _m: self._on_exit(held))
            self._update_reading(held)

        self.after_reply.append(record)
        return {"rid": rid, "pid": pid, "fds": names}, fds

    def _unasked(self, spawning: _Spawning, pid: int | None) -> None:
        """A spawn whose agent was replaced by another while its confined thread ran it:
        nothing of it is kept."""
        for fd in [*spawning.after_start, *spawning.keep]:
            with contextlib.suppress(OSError):
                os.close(fd)
        if pid is not None:
            log.error("process %d started for an agent another one replaced: killed", pid)
            with contextlib.suppress(OSError):
                os.killpg(pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)
        if spawning.spare is not None:
            self.spares.give_back(*spawning.spare)  # never written: a spare again

    def _started_and_stopped(
        self, rid: Any, pid: int, fds: list[int], spare: tuple[str, int], exc: OSError
    ) -> dict[str, Any]:
        """A process started, but what the keeper needs to hold it (a pidfd, the agent's
        sockets: descriptors, when the keeper is at its limit) could not be made: it is
        killed with its group and reaped at once, so nothing runs that no one answers for, and
        the reply says it started (its call ends `unknown`: it may have done something)."""
        log.error("process %d started but could not be held (%s): killed", pid, exc)
        with contextlib.suppress(OSError):
            os.killpg(pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        self.spares.give_back(*spare)  # its file was never written: a spare again
        return {
            "rid": rid,
            "errno": exc.errno or errno.EIO,
            "error": exc.strerror or str(exc),
            "started": True,
        }

    def _confined_thread(self, message: dict[str, Any]) -> ConfinedThread | None:
        """The thread that spawns this command under its sandbox (None: unconfined). A
        `ruleset_id` names a ruleset told before on this connection; a ruleset unknown there
        is a KeyError, never an unconfined spawn."""
        number = message.get("ruleset_id")
        if number is not None:
            told = self.rulesets[number]
            if told.thread is None or not told.thread.alive:
                # Made once per ruleset told (and again if the thread was let go): the lookup
                # hashes every rule, as much work as building them.
                told.thread = self.confined.thread_for(
                    ruleset_from(told.fields), refuse_tcp=told.refuse_tcp
                )
            return told.thread
        fields = message.get("ruleset")
        if fields is None:
            return None
        return self.confined.thread_for(
            ruleset_from(fields), refuse_tcp=bool(message.get("refuse_tcp"))
        )

    def _attach(self, held: Held) -> tuple[list[int], list[str]]:
        """A new output pipe for the agent, and the agent's copies of what it needs to watch
        the process and type into it: the descriptors to send, and what each is."""
        self._stop_forwarding(held)
        fds: list[int] = []
        names: list[str] = []
        mine: int | None = None
        try:
            if held.read_fd is not None:
                # A pipe, as the command's own output is: the agent reads it as it read the
                # command's pipe before there was a keeper, and `tee` can fill it.
                theirs, mine = os.pipe()
                fds.append(theirs)
                names.append("out")
            if held.pidfd is not None:  # a process that is done needs none: its exit is known
                fds.append(os.dup(held.pidfd))
                names.append("pidfd")
            if held.input_fd is not None:
                fds.append(os.dup(held.input_fd))
                names.append("input")
        except OSError:
            # Out of descriptors: nothing half made is left open (the caller says why).
            for fd in fds:
                os.close(fd)
            if mine is not None:
                os.close(mine)
            raise
        if mine is not None:
            os.set_blocking(mine, False)
            held.forward = mine
            held.grown_forward = False
        held.exit_sent = held.status is not None  # an exit after this is told
        return fds, names

    def _adopt(self, message: dict[str, Any]) -> tuple[dict[str, Any], list[int]]:
        rid = message["rid"]
        held = self.held.get(message["key"])
        if held is None:
            return {"rid": rid, "held": False}, []
        try:
            fds, names = self._attach(held)
        except OSError as exc:
            # Not handed back: the agent takes it for gone and stops it (kept.stop_orphan),
            # its call ending `unknown`; the keeper goes on recording it until then.
            log.error("process %d could not be handed back (%s)", held.pid, exc)
            return {"rid": rid, "held": False, "errno": exc.errno or errno.EIO}, []
        held.paused = True  # until the agent read the recording ("resume")
        self._update_reading(held)
        status = held.status
        reply = {
            "rid": rid,
            "held": True,
            "pid": held.pid,
            "total": held.recording.total if held.recording is not None else 0,
            "fds": names,
            "exit": list(status) if status is not None else None,
            "killed_after": held.killed_after,
        }
        return reply, fds

    # -- output ---------------------------------------------------------------------------------

    def _on_output(self, held: Held) -> None:
        fd = held.read_fd
        if fd is None:
            return
        if held.teeing and held.forward is not None:
            self._tee_output(held, fd)
            return
        try:
            data = os.read(fd, held.read_bytes)
        except BlockingIOError:
            return
        except OSError as exc:
            if exc.errno in (errno.EIO, errno.EBADF):
                data = b""  # a terminal nobody holds: the end of its output
            else:
                raise
        if not data:
            self._output_ended(held)
            return
        if len(data) == held.read_bytes and not held.grown:
            self._grow(held, fd)
        self._record(held, data)

    def _tee_output(self, held: Held, fd: int) -> None:
        """What the command's pipe holds, duplicated into the agent's pipe (as much as it has
        room for) and then moved into the record, each byte copied once, by the kernel: the
        agent's pace is the command's, as with `_record`, but nothing waits in `backlog`
        (what the agent's pipe has no room for yet stays in the command's)."""
        assert held.forward is not None and held.recording is not None
        try:
            count = pipe_tee.tee(fd, held.forward, held.read_bytes)
        except OSError as exc:
            if exc.errno == errno.EPIPE:
                self._stop_forwarding(held)  # the agent closed its end: recorded only
            else:
                held.teeing = False  # no pipe to tee here after all: read and written out
            self._on_output(held)
            return
        if count is None:
            if pipe_tee.pending(fd):  # (else a wake with nothing in the pipe)
                self._grow_forward(held)
                self._wait_for_room(held)
            return
        if not count:
            self._output_ended(held)
            return
        if count == held.read_bytes and not held.grown:
            self._grow(held, fd)
        held.recording.append_from_pipe(fd, count)

    def _grow(self, held: Held, fd: int) -> None:
        held.grown = True
        self._grow_forward(held)
        try:
            size = fcntl.fcntl(fd, fcntl.F_GETPIPE_SZ)
            if size < BULK_PIPE_BYTES:
                size = fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, BULK_PIPE_BYTES)
        except OSError:
            return
        held.read_bytes = max(held.read_bytes, size)

    def _grow_forward(self, held: Held) -> None:
        """A fast producer: room for more of it in flight to the agent (only such processes
        pay for it; beyond the user's share of pipe memory the pipe keeps its size)."""
        if held.grown_forward or held.forward is None:
            return
        held.grown_forward = True
        with contextlib.suppress(OSError):
            fcntl.fcntl(held.forward, fcntl.F_SETPIPE_SZ, FORWARD_BUFFER_BYTES)

    def _record(self, held: Held, data: bytes) -> None:
        assert held.recording is not None
        held.recording.append(data)
        forward = held.forward
        if forward is None:
            return
        if held.backlog:
            held.backlog += data
            return
        try:
            sent = os.write(forward, data)
        except BlockingIOError:
            sent = 0
        except OSError:
            self._stop_forwarding(held)
            return
        if sent < len(data):
            self._grow_forward(held)
            # Stop reading until the agent took it: the agent's pace is the process's, as it
            # was when the agent read the pipe itself.
            held.backlog += memoryview(data)[sent:]
            self._wait_for_room(held)

    def _wait_for_room(self, held: Held) -> None:
        if held.waiting_room:
            return
        assert held.forward is not None
        held.waiting_room = True
        self._update_reading(held)
        self.selector.register(held.forward, selectors.EVENT_WRITE, lambda _m: self._flush(held))

    def _flush(self, held: Held) -> None:
        forward = held.forward
        if forward is None:
            return
        if held.backlog:
            try:
                sent = os.write(forward, held.backlog)
            except BlockingIOError:
                return
            except OSError:
                self._stop_forwarding(held)
                self._after_flush(held)
                return
            del held.backlog[:sent]
            if held.backlog:
                return
        self._stop_waiting_room(held)
        self._update_reading(held)
        self._after_flush(held)

    def _stop_waiting_room(self, held: Held) -> None:
        if held.waiting_room:
            assert held.forward is not None
            self.selector.unregister(held.forward)
            held.waiting_room = False

    def _after_flush(self, held: Held) -> None:
        if held.read_fd is None and held.forward is not None:
            self._close_forward(held)
        self._maybe_tell_exit(held)

    def _stop_forwarding(self, held: Held) -> None:
        if held.forward is None:
            return
        held.backlog.clear()
        self._close_forward(held)
        self._update_reading(held)

    def _update_reading(self, held: Held) -> None:
        # (A backlog is only ever waiting for room: `waiting_room` covers it.)
        want = held.read_fd is not None and not held.waiting_room and not held.paused
        if want == held.reading:
            return
        held.reading = want
        if want:
            assert held.read_fd is not None
            self.selector.register(
                held.read_fd, selectors.EVENT_READ, lambda _m: self._on_output(held)
            )
        else:
            assert held.read_fd is not None
            self.selector.unregister(held.read_fd)

    def _close_forward(self, held: Held) -> None:
        self._stop_waiting_room(held)
        forward, held.forward = held.forward, None
        if forward is not None:
            os.close(forward)  # the agent reads the end of the output after the last byte

    def _output_ended(self, held: Held) -> None:
        fd = held.read_fd
        if fd is None:
            return
        if held.reading:  # unregistered while its descriptor is still open
            self.selector.unregister(fd)
            held.reading = False
        held.read_fd = None
        if not held.terminal or held.input_fd is None:
            os.close(fd)
        if not held.backlog:
            self._close_forward(held)
        if held.terminal and held.input_fd is not None:
            # The master is also the terminal's input: nothing can be typed once its output
            # ended (no process holds the slave), so it goes.
            os.close(held.input_fd)
            held.input_fd = None
        # A command's output mostly ends with its exit (`true`: its shell closes the pipe as it
        # exits): reaped here if it is already gone, its end of output and its exit then reach
        # the agent together, in one wake of each side, where waiting for its pidfd cost the
        # keeper a second wake and the agent a second one on the path to the call's result.
        if held.status is None and held.recording is not None:
            self._on_exit(held)
        elif not held.reaping:  # (`_on_exit` settles it itself, once its exit is written)
            self._settle(held)

    def _drain(self, held: Held) -> None:
        """What the pipe holds right now, recorded and queued for the agent (at most a pipe's
        worth): a process's exit is told only after what it wrote before it."""
        while held.read_fd is not None:
            try:
                data = os.read(held.read_fd, held.read_bytes)
            except BlockingIOError:
                return
            except OSError as exc:
                if exc.errno in (errno.EIO, errno.EBADF):
                    return
                raise
            if not data:
                self._output_ended(held)
                return
            self._record(held, data)

    # -- exits ----------------------------------------------------------------------------------

    def _on_exit(self, held: Held) -> None:
        """Reap `held` if it exited (its pidfd turned readable, or its output just ended):
        record its status, then tell the agent once every byte before it went out."""
        if held.status is not None:
            return  # reaped already, when its output ended (this event came in the same batch)
        try:
            pid, status = os.waitpid(held.pid, os.WNOHANG)
        except ChildProcessError:
            pid, status = held.pid, 0xFF00  # cannot happen to a child of ours: exit 255
        if pid == 0:
            return
        assert held.pidfd is not None
        self.selector.unregister(held.pidfd)
        signum = 0
        if os.WIFSIGNALED(status):
            signum = os.WTERMSIG(status)
            held.status = (None, keeper_store.signal_name(signum))
        else:
            held.status = (os.waitstatus_to_exitcode(status), None)
        held.reaping = True
        if not held.paused:
            self._drain(held)
        assert held.recording is not None
        held.recording.write_exit(held.status[0], signum, wall_ms(), killed_after=held.killed_after)
        held.reaping = False
        self._maybe_tell_exit(held)
        self._settle(held)

    def _settle(self, held: Held) -> None:
        """A process that is done (reaped, its output ended) keeps no descriptor here until it
        is forgotten: it stays listed, its record on disk, for an hour (`exited_retention_s`),
        and a pidfd and an open file for each such process would run the keeper out of
        descriptors after some 10,000 commands within the hour at a hard limit of 20,000,
        past which every spawn fails. A record
        is opened again only when it is given back as a spare."""
        if not held.done:
            return
        if held.pidfd is not None:
            os.close(held.pidfd)
            held.pidfd = None
        if held.input_fd is not None:
            # Its stdin pipe's write end, held for a later agent to type into: nothing of the
            # command reads it any more (an agent that still holds its own copy keeps it).
            os.close(held.input_fd)
            held.input_fd = None
        if held.recording is not None:
            held.recording.close()

    def _maybe_tell_exit(self, held: Held) -> None:
        if held.status is None or held.exit_sent or held.backlog or held.paused:
            return
        held.exit_sent = True
        code, sig = held.status
        self._tell({"ev": "exit", "key": held.key, "code": code, "signal": sig})

    def _forget(self, held: Held) -> None:
        del self.held[held.key]
        self.deadlines.pop(held.key, None)
        self._stop_forwarding(held)
        if held.input_fd is not None:
            os.close(held.input_fd)
        if held.pidfd is not None:
            os.close(held.pidfd)
        if held.recording is not None:
            self.spares.give_back(held.recording.path, held.recording.detach())


@dataclass(eq=False)
class _Spawning:
    """A spawn on its way: what it asked for, and what was made for it before its process
    starts (so that a refusal, however late, closes all of it)."""

    rid: Any
    key: str
    meta: keeper_store.Meta
    terminal: bool
    kill_after_ms: Any
    grace_ms: Any
    connection: int  # the keeper's count of connections when it was asked (`connections`)
    spare: tuple[str, int] | None = None
    read_fd: int | None = None
    input_fd: int | None = None
    keep: list[int] = field(default_factory=list)  # the keeper's ends: its output, its input
    after_start: list[int] = field(default_factory=list)  # the child's ends, closed after


@dataclass(eq=False)
class _Told:
    """A ruleset the agent told on its connection, and the confined thread made for it."""

    fields: Any
    refuse_tcp: bool
    thread: ConfinedThread | None = None


def ruleset_from(fields: Any) -> landlock.Ruleset:
    """A ruleset as the agent sends it (actors/kept.py, `ruleset_fields`)."""
    abi, handled_fs, handled_net, scoped, rule_list = fields
    return landlock.Ruleset(
        int(abi),
        int(handled_fs),
        int(handled_net),
        int(scoped),
        tuple((str(path), int(rights)) for path, rights in rule_list),
    )


class MessageReader:
    """Reads the control socket's messages (up to MAX_MESSAGE_BYTES each) into one buffer kept
    for all of them. `recv(MAX_MESSAGE_BYTES)` made and shrank a megabyte for each message: ~18
    us a message on top of the ~4 us of the message itself, and an `execute` takes three or four
    messages (spawn, its reply, exit, release). The buffer is anonymous memory that is only
    resident where a message was written into it (a few kilobytes)."""

    def __init__(self) -> None:
        self._buffer = mmap.mmap(-1, MAX_MESSAGE_BYTES)
        self._view = memoryview(self._buffer)

    def recv(self, sock: socket.socket) -> memoryview:
        """The next message (empty at the end of the connection), valid until the next read.
        Raises what `sock.recv` raises (BlockingIOError, OSError)."""
        return self._view[: sock.recv_into(self._view)]

    def recv_fds(self, sock: socket.socket, max_fds: int) -> tuple[memoryview, list[int]]:
        """The next message and the descriptors it carries (as `socket.recv_fds`)."""
        fds = array.array("i")
        size, ancillary, _flags, _address = sock.recvmsg_into(
            [self._view], socket.CMSG_LEN(max_fds * fds.itemsize)
        )
        for level, kind, data in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds.frombytes(data[: len(data) - len(data) % fds.itemsize])
        return self._view[:size], list(fds)


def _wait_writable(sock: socket.socket, timeout_s: float) -> None:
    poller = select.poll()
    poller.register(sock, select.POLLOUT)
    poller.poll(timeout_s * 1000)


def _drop_stale_spares(procs_dir: str) -> None:
    """Files of an earlier keeper that hold no record (its spares, or a record it was making):
    nobody can read anything from them. Records stay, for the agents that re-adopt them."""
    for name in os.listdir(procs_dir):
        path = os.path.join(procs_dir, name)
        if not keeper_store.is_record(path):
            keeper_store.remove(path)


def _plain_name(key: str) -> bool:
    """A key names a file of the keeper's directory, never a path elsewhere."""
    return bool(key) and key not in (".", "..") and "/" not in key and "\0" not in key


def read_secret(directory: str) -> str:
    """The directory's secret, made (0600, 256 bits) if it has none yet. Raises OSError."""
    path = os.path.join(directory, SECRET_NAME)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:
        with open(path, encoding="ascii") as f:
            return f.read().strip()
    made = secrets.token_hex(32)
    try:
        os.write(fd, made.encode("ascii"))
        os.fsync(fd)
    finally:
        os.close(fd)
    return made


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m toolwire.actors.keeper KEEPER_DIR", file=sys.stderr)
        return 2
    # Ctrl-C at the agent's terminal must not reach the commands' keeper (it has a session of
    # its own as well); SIGTERM still ends it, as the administrator asks.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    # As the agent (cli/private_process.py): its descriptors (every command's input) and its
    # memory are not for the commands of its user to take through /proc or ptrace.
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s keeper %(message)s")
    # One keeper per state dir: a second one waits until the first has gone (it is exiting:
    # an agent connects to whichever listens), or leaves it be.
    os.makedirs(args[0], mode=0o700, exist_ok=True)
    lock = os.open(
        os.path.join(args[0], "keeper.lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600
    )
    deadline = time.monotonic() + LOCK_WAIT_S
    while True:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if time.monotonic() > deadline:
                return 0
            time.sleep(0.01)
    # Four descriptors per process held (output, pidfd, recording, the agent's socket): the
    # usual soft limit of 1,024 would hold only ~250 commands.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    keeper = Keeper(args[0])
    try:
        keeper.run()
    finally:
        keeper.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
