"""The agent's side of the keeper (actors/keeper.py): commands spawned by it, and re-adopted
from it after a restart (PROTOCOL.md 10.1).

`KeptProcessBackend` is the process backend of `toolwire serve` with a state dir: each spawn
is one request to the keeper on its control socket (the keeper spawns, exactly as the agent
did, and hands back the read end of a pipe the process's output is forwarded on, a pidfd and
the process's input). A chat's spawn (`start_spawn`) does not wait for the reply: the loop
sends the request and goes on, and the reply comes through the event reader (`KeeperClient.run`)
to a `SpawnWaiter`, so the loop every chat shares is never held for the keeper's posix_spawn.
A `KeptProcess` then behaves as a process the agent spawned itself:
its output is read from that pipe as it was from the command's own, its stdin is written through the
agent's copy, its group signalled with killpg; only its exit comes from the keeper (its parent),
after everything the command wrote before it.

`readopt` runs at start, before any request is taken: every process directory the keeper
recorded is found again, its process handed back by the keeper if it still holds it, and its
recorded output read from the state dir.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import logging
import os
import select
import signal
import socket
import subprocess
import sys
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Protocol

import msgspec
import trio

from toolwire.actors import keeper_store
from toolwire.actors.keeper import SOCKET_NAME, MessageReader, read_secret
from toolwire.actors.landlock import Ruleset
from toolwire.actors.output import OutputBuffer
from toolwire.actors.processes import (
    ExitStatus,
    PipeInput,
    TerminalInput,
    group_alive,
    signal_group,
)
from toolwire.actors.sandbox import MAX_MADE_CONFINEMENTS, Confinement
from toolwire.actors.terminal import TerminalSize

log = logging.getLogger("toolwire.keeper")

# How long a request to the keeper may take before the agent gives up on it (a spawn takes
# well under a millisecond; a keeper that does not answer in this long is stuck or gone).
REQUEST_TIMEOUT_S: Final = 5.0
# How long a new keeper may take to listen (a Python start: tens of milliseconds).
START_TIMEOUT_S: Final = 10.0
READ_BYTES: Final = 256 * 1024
# The most rulesets one connection keeps told to the keeper (`KeeperClient.ruleset_id`): as
# many as the sandbox keeps made.
MAX_RULESETS: Final = MAX_MADE_CONFINEMENTS
# The most `adopt` requests a restarting agent keeps in flight (`readopt`); see `adopt_window`.
ADOPT_WINDOW: Final = 32
# Where Linux says how many messages a unix datagram or seqpacket socket queues for its reader
# (10 by default): one more and the sender's `send` fails with EAGAIN.
_QUEUE_LENGTH_PATH: Final = "/proc/sys/net/unix/max_dgram_qlen"

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder()


class KeeperLost(Exception):
    """The keeper is gone: the exit of what it held can no longer be learnt."""


class StartedAndStopped(OSError):
    """The keeper started the process but could not hold it (out of descriptors), and killed
    it at once: it may have done something, so its call's outcome is unknown."""


@dataclass(frozen=True, slots=True)
class KeepInfo:
    """What the keeper records of a command beside its output: enough for a restarted agent
    to rebuild the call (the `execute` args as the wire gave them)."""

    chat_id: str
    call_id: str
    args: Any
    started_at_ms: int
    # Its hard deadline (9.2), which the keeper enforces while no agent is connected.
    kill_after_ms: int | None = None
    grace_ms: int = 2000


class ReplyWaiter(Protocol):
    """Where the reply to a request sent with `KeeperClient.request_later` goes."""

    def replied(self, reply: dict[str, Any], fds: list[int]) -> None:
        """The reply and the descriptors it carries (the waiter's to close). Also after
        `unanswered` if the keeper answers late."""

    def unanswered(self, error: OSError) -> None:
        """The keeper went, or did not answer within `REQUEST_TIMEOUT_S`: what was asked may
        or may not have happened. Called at most once."""


class KeeperClient:
    """The control socket to the keeper, from the agent's event loop thread."""

    def __init__(self, keeper_dir: str, sock: socket.socket, child: subprocess.Popen[bytes] | None):
        self.keeper_dir = keeper_dir
        self._sock = sock
        self._child = child  # the keeper, when this agent started it (reaped if it dies)
        self._rid = 0
        self._handles: dict[str, KeptProcess] = {}
        self._reader = MessageReader()
        # Requests sent and not waited for yet, and replies that came before their turn.
        self._awaited: set[int] = set()
        self._replies: dict[int, tuple[dict[str, Any], list[int]]] = {}
        # The rulesets this connection told the keeper, by the identity of their confinement
        # (actors/sandbox.py hands back the same object while it holds): see `ruleset_id`.
        self._rulesets: dict[int, tuple[Confinement, int]] = {}
        self._last_ruleset_id = 0
        # The keeper's protocol (`hello`): the keeper outlives an upgrade of its agent, so a
        # newer agent may be talking to an older keeper, and speaks what that one knows.
        self.protocol = 1
        # Requests whose reply goes to a waiter (`request_later`), and their deadlines in the
        # order they were sent (trio time): a timed-out one keeps its waiter for a late reply.
        self._waiters: dict[int, ReplyWaiter] = {}
        self._deadlines: deque[tuple[float, int]] = deque()
        # Messages the socket had no room for, sent in order by `_flush` (a task of `nursery`)
        # as the keeper reads: the loop never waits for the keeper's queue to drain.
        self._outgoing: deque[bytes] = deque()
        self.nursery: trio.Nursery | None = None
        self.lost = False

    @classmethod
    def connect_or_start(cls, state_dir: str) -> KeeperClient:
        """Connect to the state dir's keeper, starting one if none listens."""
        keeper_dir = os.path.join(state_dir, "keeper")
        os.makedirs(keeper_dir, mode=0o700, exist_ok=True)
        os.chmod(keeper_dir, 0o700)  # the control socket is reachable only by this user
        # What proves this is the agent (actors/keeper.py, SECRET_NAME), before any keeper runs.
        hello = {"op": "ping", "secret": read_secret(keeper_dir)}
        path = os.path.join(keeper_dir, SOCKET_NAME)
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            sock = _connect(path)
            if sock is not None:
                client = cls(keeper_dir, sock, None)
                try:
                    client.hello(hello)  # a keeper that was exiting answers none
                    return client
                except OSError:
                    sock.close()
            if time.monotonic() > deadline:
                raise OSError(errno.ECONNREFUSED, f"no keeper answers in {keeper_dir}")
            child = _start_keeper(keeper_dir)
            sock = None
            while sock is None and child.poll() is None and time.monotonic() < deadline:
                time.sleep(0.005)
                sock = _connect(path)
            if sock is not None:
                client = cls(keeper_dir, sock, child)
                try:
                    client.hello(hello)
                    return client
                except OSError:
                    sock.close()

    # -- requests -------------------------------------------------------------------------------

    def send(self, message: dict[str, Any]) -> None:
        """Send `message`, in order after every message before it. A full socket (the keeper
        behind on its reading) is waited for by `_flush` when there is a nursery, by blocking
        before there is one (at start, `readopt` keeps its requests few enough)."""
        if self.lost:
            return
        data = _encoder.encode(message)
        if self._outgoing:
            self._outgoing.append(data)
            return
        try:
            self._sock.send(data)
        except BlockingIOError:
            if self.nursery is None:
                self._blocking_send(data)
                return
            # Not a wait on the loop: meanwhile `run` goes on reading the keeper's replies and
            # events, so neither side can wait on the other's full queue.
            self._outgoing.append(data)
            self.nursery.start_soon(self._flush)
        except OSError:
            self._lose()

    async def _flush(self) -> None:
        """Send the queued messages as the socket has room; a keeper that takes none of them
        for `REQUEST_TIMEOUT_S` is stuck: it is lost, as a blocked send would have found."""
        while self._outgoing and not self.lost:
            try:
                self._sock.send(self._outgoing[0])
            except BlockingIOError:
                with trio.move_on_after(REQUEST_TIMEOUT_S) as waited:
                    try:
                        await trio.lowlevel.wait_writable(self._sock)
                    except trio.ClosedResourceError:
                        return
                if waited.cancelled_caught:
                    self._lose()
                continue
            except OSError:
                self._lose()
                return
            self._outgoing.popleft()

    def _blocking_send(self, data: bytes) -> None:
        poller = select.poll()
        poller.register(self._sock, select.POLLOUT)
        poller.poll(REQUEST_TIMEOUT_S * 1000)
        try:
            self._sock.send(data)
        except OSError:
            self._lose()

    def hello(self, hello: dict[str, Any]) -> None:
        """The connection's first request, which proves this is the agent; its reply says
        which keeper protocol the keeper speaks (a keeper before `KEEPER_PROTOCOL` 2 says
        none: 1). OSError if it does not answer."""
        reply, fds = self.request(dict(hello))
        for fd in fds:
            os.close(fd)
        protocol = reply.get("protocol", 1)
        self.protocol = protocol if isinstance(protocol, int) else 1

    def ruleset_id(self, confinement: Confinement) -> int:
        """The keeper's number for `confinement`'s ruleset on this connection, told to it first
        if it is new. A spawn then names its sandbox in a few bytes: a ruleset that leaves out
        the agent's own files has hundreds of rules (actors/hidden_paths.py), which cost more
        to encode, send, decode and hash than the spawn itself when sent with each one."""
        known = self._rulesets.get(id(confinement))
        if known is not None and known[0] is confinement:
            return known[1]
        self._last_ruleset_id += 1
        number = self._last_ruleset_id
        self.send(
            {
                "op": "ruleset",
                "id": number,
                "ruleset": ruleset_fields(confinement.ruleset),
                "refuse_tcp": confinement.refuse_tcp,
            }
        )
        self._rulesets[id(confinement)] = (confinement, number)
        if len(self._rulesets) > MAX_RULESETS:
            # The oldest goes, on both sides (a spawn already sent with it was handled first:
            # one connection, in order).
            _, oldest = self._rulesets.pop(next(iter(self._rulesets)))
            self.send({"op": "forget_ruleset", "id": oldest})
        return number

    def request(self, message: dict[str, Any]) -> tuple[dict[str, Any], list[int]]:
        """Send `message` and wait (blocking) for its reply and the descriptors it carries;
        the keeper's events that come first are handled on the way. OSError if the keeper is
        gone or does not answer."""
        return self.wait_reply(self.start_request(message))

    def start_request(self, message: dict[str, Any]) -> int:
        """Send `message` without waiting for its reply: its rid, for `wait_reply`. Several may
        be in flight, each matched to its reply by its rid (the keeper answers a sandboxed
        spawn once its confined thread started it, after requests sent later); each must be
        waited for."""
        if self.lost:
            raise OSError(errno.ENOTCONN, "the keeper is gone")
        self._rid += 1
        rid = message["rid"] = self._rid
        self._awaited.add(rid)
        self.send(message)
        return rid

    def request_later(self, message: dict[str, Any], waiter: ReplyWaiter) -> None:
        """Send `message` and return at once: its reply goes to `waiter` when the event reader
        (`run`) reads it (see `ReplyWaiter`). OSError, nothing sent, if the keeper is gone."""
        if self.lost:
            raise OSError(errno.ENOTCONN, "the keeper is gone")
        self._rid += 1
        rid = message["rid"] = self._rid
        self.send(message)
        if self.lost:
            raise OSError(errno.ENOTCONN, "the keeper is gone")
        self._waiters[rid] = waiter
        self._deadlines.append((trio.current_time() + REQUEST_TIMEOUT_S, rid))

    def wait_reply(self, rid: int) -> tuple[dict[str, Any], list[int]]:
        """The reply to the request `rid` (see `request`); replies to other requests still in
        flight that come first are kept for their own `wait_reply`."""
        self._awaited.discard(rid)
        early = self._replies.pop(rid, None)
        if early is not None:
            return early
        deadline = time.monotonic() + REQUEST_TIMEOUT_S
        poller = select.poll()
        poller.register(self._sock, select.POLLIN)
        while not self.lost:
            try:
                data, fds = self._reader.recv_fds(self._sock, 16)
            except BlockingIOError:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                poller.poll(left * 1000)
                continue
            except OSError:
                self._lose()
                break
            if not data:
                self._lose()
                break
            reply: dict[str, Any] = _decoder.decode(data)
            got = reply.get("rid")
            if got == rid:
                return reply, fds
            if got in self._awaited:
                self._replies[got] = (reply, fds)
                continue
            self._take(reply, fds)
        raise OSError(errno.ETIMEDOUT if not self.lost else errno.ENOTCONN, "the keeper is gone")

    # -- events ---------------------------------------------------------------------------------

    async def run(self) -> None:
        """Read the keeper's events (exits) and the replies waiters wait for until it goes;
        then every process it held is lost (its exit can no longer be known), and every
        request still waiting is unanswered."""
        while not self.lost:
            try:
                deadline = self._next_deadline()
                if deadline is None:
                    await trio.lowlevel.wait_readable(self._sock)
                else:
                    with trio.move_on_at(deadline):
                        await trio.lowlevel.wait_readable(self._sock)
                    self._expire(trio.current_time())
            except trio.ClosedResourceError:
                return
            while not self.lost:
                fds: list[int] = []
                try:
                    if self._waiters:  # a reply may carry descriptors
                        data, fds = self._reader.recv_fds(self._sock, 16)
                    else:
                        data = self._reader.recv(self._sock)
                except BlockingIOError:
                    break
                except OSError:
                    data = memoryview(b"")
                if not data:
                    self._lose()
                    break
                self._take(_decoder.decode(data), fds)

    def _next_deadline(self) -> float | None:
        deadlines = self._deadlines
        while deadlines and deadlines[0][1] not in self._waiters:
            deadlines.popleft()  # answered
        return deadlines[0][0] if deadlines else None

    def _expire(self, now: float) -> None:
        """Requests not answered in `REQUEST_TIMEOUT_S`: unanswered (a late reply still goes
        to its waiter, which knows it gave up)."""
        deadlines = self._deadlines
        while deadlines and deadlines[0][0] <= now:
            _, rid = deadlines.popleft()
            waiter = self._waiters.get(rid)
            if waiter is not None:
                waiter.unanswered(OSError(errno.ETIMEDOUT, "the keeper does not answer"))

    def _take(self, message: dict[str, Any], fds: list[int]) -> None:
        """A message read from the keeper: a reply a waiter waits for, or an event."""
        rid = message.get("rid")
        waiter = self._waiters.pop(rid, None) if rid is not None else None
        if waiter is not None:
            try:
                waiter.replied(message, fds)
            except Exception:
                # The reader goes on: every other command's exit still comes through it.
                log.exception("handling the keeper's reply to request %s failed", rid)
            return
        for fd in fds:
            os.close(fd)
        self._dispatch(message)

    def _dispatch(self, event: dict[str, Any]) -> None:
        if event.get("ev") == "exit":
            handle = self._handles.get(event["key"])
            if handle is not None:
                handle.exit_told(ExitStatus(event["code"], event["signal"]))

    def _lose(self) -> None:
        if self.lost:
            return
        self.lost = True
        log.error("the keeper is gone: the commands it held are lost")
        for handle in list(self._handles.values()):
            handle.keeper_lost()
        waiters = list(self._waiters.values())
        self._waiters.clear()
        self._deadlines.clear()
        self._outgoing.clear()
        for waiter in waiters:
            waiter.unanswered(OSError(errno.ENOTCONN, "the keeper is gone"))
        if self._child is not None:
            self._child.poll()

    def register(self, key: str, handle: KeptProcess) -> None:
        self._handles[key] = handle

    def unregister(self, key: str, handle: KeptProcess) -> None:
        if self._handles.get(key) is handle:
            del self._handles[key]

    def close(self) -> None:
        """Leave the keeper (at a shutdown that keeps the commands, or at the end): it goes on
        holding and recording what runs."""
        self.lost = True
        trio.lowlevel.notify_closing(self._sock)
        self._sock.close()


def ruleset_fields(rules: Ruleset) -> list[Any]:
    """A ruleset as the keeper reads it (actors/keeper.py, `ruleset_from`)."""
    return [
        rules.abi,
        rules.handled_fs,
        rules.handled_net,
        rules.scoped,
        [list(rule) for rule in rules.rules],
    ]


def _connect(path: str) -> socket.socket | None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        sock.connect(path)
    except (FileNotFoundError, ConnectionRefusedError):
        sock.close()
        return None
    sock.setblocking(False)
    return sock


def _start_keeper(keeper_dir: str) -> subprocess.Popen[bytes]:
    """A keeper for `keeper_dir`, in a session of its own: not in the agent's process group,
    so neither a Ctrl-C at the agent's terminal nor a killpg of the agent's group reaches it."""
    with open(os.path.join(keeper_dir, "keeper.log"), "ab") as log_file:
        return subprocess.Popen(
            [sys.executable, "-m", "toolwire.actors.keeper", keeper_dir],
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=log_file,
            start_new_session=True,
            close_fds=True,
        )


class _KeptPipePort(PipeInput):
    """The agent's copy of the write end of a kept command's stdin pipe. An `eof` closes it
    here and asks the keeper to close its own, so the command reads the end of its input."""

    def __init__(self, process: KeptProcess, fd: int) -> None:
        super().__init__(fd)
        self._process = process

    def end(self) -> bytes:
        super().end()
        self._process.close_stdin()
        return b""


class _KeptTerminalPort(TerminalInput):
    """The agent's copy of a kept command's terminal master: input, EOF character, size."""

    def __init__(self, fd: int) -> None:
        self._copy: int | None = fd

    def _master(self) -> int | None:
        return self._copy

    def close(self) -> None:
        fd, self._copy = self._copy, None
        if fd is not None:
            trio.lowlevel.notify_closing(fd)
            os.close(fd)


class KeptProcess:
    """A command held by the keeper, as the chat actor sees it (`processes.SpawnedProcess`)."""

    def __init__(
        self,
        client: KeeperClient,
        key: str,
        pid: int,
        fds: dict[str, int],
        *,
        terminal: bool,
        status: ExitStatus | None = None,
    ) -> None:
        self._client = client
        self.key = key
        self.pid: int | None = pid
        self._out: int | None = fds.get("out")
        if self._out is not None:
            os.set_blocking(self._out, False)
        self._pidfd: int | None = fds.get("pidfd")
        self._status = status
        self._lost = False
        self._exited = trio.Event()
        if status is not None:
            self._exited.set()
        self._terminal = terminal
        input_fd = fds.get("input")
        self.stdin: _KeptPipePort | _KeptTerminalPort | None = None
        if input_fd is not None:
            os.set_blocking(input_fd, False)
            self.stdin = _KeptTerminalPort(input_fd) if terminal else _KeptPipePort(self, input_fd)
        client.register(key, self)

    # -- what the keeper tells ------------------------------------------------------------------

    def exit_told(self, status: ExitStatus) -> None:
        if self._status is None:
            self._status = status
        self._exited.set()

    def keeper_lost(self) -> None:
        self._lost = True
        self._exited.set()

    def close_stdin(self) -> None:
        self._client.send({"op": "close_stdin", "key": self.key})

    # -- SpawnedProcess -------------------------------------------------------------------------

    async def read_some(self) -> bytes:
        while True:
            fd = self._out
            if fd is None:
                return b""
            try:
                data = os.read(fd, READ_BYTES)
            except BlockingIOError:
                try:
                    await trio.lowlevel.wait_readable(fd)
                except trio.ClosedResourceError:
                    return b""
                continue
            except OSError as exc:
                if exc.errno in (errno.EBADF, errno.ECONNRESET):
                    return b""
                raise
            if not data and self._terminal and self.stdin is not None:
                # The terminal's output ended: nothing can be typed into it any more.
                self.stdin.close()
            return data

    def read_available(self) -> bytes:
        pieces: list[bytes] = []
        while self._out is not None:
            try:
                piece = os.read(self._out, READ_BYTES)
            except BlockingIOError:
                break
            except OSError as exc:
                if exc.errno == errno.ECONNRESET:
                    break
                raise
            if not piece:
                break
            pieces.append(piece)
        return b"".join(pieces)

    async def wait(self) -> ExitStatus:
        await self._exited.wait()
        if self._status is None:
            raise KeeperLost(f"the keeper holding process {self.pid} is gone")
        return self._status

    def poll_exited(self) -> bool:
        if self._status is not None or self._lost:
            return True
        fd = self._pidfd
        if fd is None:
            return False
        # A pidfd is readable once its process exited (a zombie not yet reaped included).
        return bool(select.select([fd], [], [], 0)[0])

    def signal_group(self, sig: signal.Signals) -> bool:
        assert self.pid is not None
        return signal_group(self.pid, sig)

    def group_alive(self) -> bool:
        assert self.pid is not None
        return group_alive(self.pid)

    def close(self) -> None:
        """Release the agent's copies (its output ended and its exit is known); the keeper
        keeps its record until the process is forgotten (`release`)."""
        if self.stdin is not None:
            self.stdin.close()
        for name in ("_out", "_pidfd"):
            fd: int | None = getattr(self, name)
            if fd is not None:
                setattr(self, name, None)
                trio.lowlevel.notify_closing(fd)
                os.close(fd)

    def release(self) -> None:
        """The process is forgotten (its listing expired): the keeper drops its files."""
        self.close()
        self._client.unregister(self.key, self)
        self._client.send({"op": "release", "key": self.key})


class KeptProcessBackend:
    """The process backend whose commands the keeper holds (see the module docstring)."""

    def __init__(self, client: KeeperClient, retention_bytes: int) -> None:
        self.client = client
        self._retention_bytes = retention_bytes
        # Where a new keeper's event reader runs (the agent's nursery, set by `Agent.run`).
        self.nursery: trio.Nursery | None = None

    def _live_client(self) -> KeeperClient:
        """The keeper, or a new one if it was killed under this agent: the commands it held
        are lost (their calls end `unknown`), the next ones are held by its successor."""
        client = self.client
        if client.lost and self.nursery is not None:
            client = KeeperClient.connect_or_start(os.path.dirname(client.keeper_dir))
            self.client = client
            client.nursery = self.nursery
            self.nursery.start_soon(client.run)
        return client

    def start_spawn(
        self,
        argv: list[str],
        cwd: str,
        env: Mapping[str, str],
        waiter: SpawnWaiter,
        *,
        keep: KeepInfo,
        stdin: bool = False,
        terminal: TerminalSize | None = None,
        confinement: Confinement | None = None,
    ) -> None:
        """Ask the keeper to spawn and return at once: `waiter` learns how it went once the
        keeper answers (see `SpawnWaiter`). OSError, nothing asked, if no keeper can be
        reached."""
        key, message = self._spawn_message(argv, cwd, env, stdin, terminal, keep)
        client = self._live_client()
        _name_sandbox(client, message, confinement)
        client.request_later(message, _SpawnReply(client, key, terminal is not None, waiter))

    def _spawn_message(
        self,
        argv: list[str],
        cwd: str,
        env: Mapping[str, str],
        stdin: bool,
        terminal: TerminalSize | None,
        keep: KeepInfo,
    ) -> tuple[str, dict[str, Any]]:
        key = keeper_store.key_for(keep.chat_id, keep.call_id)
        message: dict[str, Any] = {
            "op": "spawn",
            "key": key,
            "argv": argv,
            "cwd": cwd,
            "env": dict(env),
            "stdin": stdin,
            "meta": {
                "chat_id": keep.chat_id,
                "call_id": keep.call_id,
                "args": keep.args,
                "started_at_ms": keep.started_at_ms,
                "retention_bytes": self._retention_bytes,
            },
        }
        if keep.kill_after_ms:
            message["kill_after_ms"] = keep.kill_after_ms
            message["grace_ms"] = keep.grace_ms
        if terminal is not None:
            message["rows"], message["cols"] = terminal.rows, terminal.cols
        return key, message


def _name_sandbox(
    client: KeeperClient, message: dict[str, Any], confinement: Confinement | None
) -> None:
    """Put a sandboxed spawn's ruleset into `message`, as `client`'s keeper reads it: by its
    number on the connection (protocol 2, told once), or whole (an older keeper, left running
    by an upgrade with `--on-shutdown keep`)."""
    if confinement is None:
        return
    if client.protocol >= 2:
        message["ruleset_id"] = client.ruleset_id(confinement)
    else:
        message["ruleset"] = ruleset_fields(confinement.ruleset)
        message["refuse_tcp"] = confinement.refuse_tcp


def _spawned(
    client: KeeperClient, key: str, reply: dict[str, Any], fds: list[int], *, terminal: bool
) -> KeptProcess:
    """The process of a spawn's reply; OSError (its descriptors closed) if the keeper could
    not spawn it, `StartedAndStopped` if it could not hold what it spawned."""
    if "pid" not in reply:
        for fd in fds:
            os.close(fd)
        failed = StartedAndStopped if reply.get("started") else OSError
        raise failed(reply.get("errno", errno.EIO), reply.get("error", "spawn failed"))
    return KeptProcess(
        client, key, reply["pid"], dict(zip(reply["fds"], fds, strict=True)), terminal=terminal
    )


class SpawnWaiter(Protocol):
    """How a spawn asked with `KeptProcessBackend.start_spawn` went: exactly one of these is
    called, from the keeper client's event reader."""

    def spawned(self, handle: KeptProcess) -> None:
        """The command runs, held by the keeper."""

    def spawn_failed(self, error: OSError) -> None:
        """The keeper answered that it could not spawn it: nothing ran; or, a
        `StartedAndStopped`, that it started it and could not hold it, and killed it."""

    def spawn_unanswered(self, error: OSError) -> None:
        """The keeper went, or did not answer in time: the command may have started."""


class _SpawnReply:
    """The `ReplyWaiter` of one spawn. A reply after the waiter was told `spawn_unanswered`
    is a process nobody waits for: its group is killed and the keeper told to drop it, so
    nothing runs that no call answers for."""

    __slots__ = ("_client", "_given_up", "_key", "_terminal", "_waiter")

    def __init__(self, client: KeeperClient, key: str, terminal: bool, waiter: SpawnWaiter):
        self._client = client
        self._key = key
        self._terminal = terminal
        self._waiter = waiter
        self._given_up = False

    def replied(self, reply: dict[str, Any], fds: list[int]) -> None:
        try:
            handle = _spawned(self._client, self._key, reply, fds, terminal=self._terminal)
        except OSError as exc:
            if not self._given_up:
                self._waiter.spawn_failed(exc)
            return
        if self._given_up:
            log.error("the keeper answered the spawn of %s too late: it is stopped", self._key)
            handle.signal_group(signal.SIGKILL)
            handle.release()
            return
        self._waiter.spawned(handle)

    def unanswered(self, error: OSError) -> None:
        if not self._given_up:
            self._given_up = True
            self._waiter.spawn_unanswered(error)


@dataclass(eq=False, slots=True)
class Readopted:
    """A process the keeper recorded before this agent started: held still (`handle`), or
    gone (`handle` None), with its exit status if one was recorded and its retained output."""

    meta: keeper_store.Meta
    handle: KeptProcess | None
    status: ExitStatus | None
    output: OutputBuffer
    exited_at_ms: int | None
    path: str
    # The keeper stopped its group at its kill_after_ms while no agent ran (9.2, 10.1).
    killed_after: bool = False


def adopt_window() -> int:
    """How many `adopt` requests may be in flight at once. The keeper's queue then holds at
    most that many of them and as many `resume`s, so with fewer than half the kernel's queue
    length the agent's `send` never has to wait, and it always goes on to read the keeper's
    replies: had both sides waited for the other's queue to drain, each would have given up on
    the other after `REQUEST_TIMEOUT_S`, the keeper dropping the connection."""
    try:
        with open(_QUEUE_LENGTH_PATH, "rb") as file:
            queue_length = int(file.read())
    except (OSError, ValueError):
        queue_length = 10
    return max(1, min(ADOPT_WINDOW, (queue_length - 1) // 2))


def readopt(client: KeeperClient, retention_bytes: int, result_bytes: int) -> list[Readopted]:
    """Every process recorded in the keeper's directory, found again (at start, before any
    request is taken): the keeper hands back what it still holds, and what it no longer holds
    is what its files say (an exit status, or none: gone unrecorded).

    The `adopt` requests are pipelined, `adopt_window()` in flight: one round trip per
    process, each waiting for the keeper and then the agent to get a CPU, was most of a
    restart's re-adoption on a loaded machine. Each process's file is still read only once its
    own reply came (the keeper has stopped reading its output by then), and its `resume` sent
    after that, so the file holds exactly the bytes before the new pipe's first."""
    base = keeper_store.procs_dir(client.keeper_dir)
    try:
        names = sorted(os.listdir(base))
    except FileNotFoundError:
        return []
    recorded: list[tuple[str, str]] = []
    for name in names:
        path = os.path.join(base, name)
        # A spare file (keeper_store.SpareFiles) holds no record: the keeper's, left alone.
        header = keeper_store.read_meta(path)
        if header is not None:
            recorded.append((path, keeper_store.key_for(header.chat_id, header.call_id)))
    found: list[Readopted] = []
    asked: deque[tuple[str, str, int | None]] = deque()

    def ask(path: str, key: str) -> None:
        # Asked before the file is read, so that nothing is recorded between the keeper's
        # count and the read (the keeper reads none of that process's output until `resume`).
        try:
            rid: int | None = client.start_request({"op": "adopt", "key": key})
        except OSError:
            rid = None
        asked.append((path, key, rid))

    upcoming = iter(recorded)
    for path, key in itertools.islice(upcoming, adopt_window()):
        ask(path, key)
    while asked:
        path, key, rid = asked.popleft()
        reply: dict[str, Any] = {"held": False}
        fds: list[int] = []
        if rid is not None:
            with contextlib.suppress(OSError):  # gone or silent: what its file says
                reply, fds = client.wait_reply(rid)
        readopted = _readopted(client, path, key, reply, fds, retention_bytes, result_bytes)
        if readopted is not None:
            found.append(readopted)
        following = next(upcoming, None)
        if following is not None:
            ask(*following)
    return found


def _readopted(
    client: KeeperClient,
    path: str,
    key: str,
    reply: dict[str, Any],
    fds: list[int],
    retention_bytes: int,
    result_bytes: int,
) -> Readopted | None:
    """One recorded process, from the keeper's answer to its `adopt` and its file."""
    recorded = keeper_store.read_process_file(path)
    if recorded is None:
        for fd in fds:
            os.close(fd)
        return None
    meta = recorded.meta
    handle: KeptProcess | None = None
    status: ExitStatus | None = None
    total = recorded.output.total
    killed_after = recorded.exit is not None and recorded.exit.killed_after
    if reply.get("held"):
        killed_after = bool(reply.get("killed_after"))
        exit_ = reply.get("exit")
        if exit_ is not None:
            status = ExitStatus(exit_[0], exit_[1])
        handle = KeptProcess(
            client,
            key,
            reply["pid"],
            dict(zip(reply["fds"], fds, strict=True)),
            terminal=meta.terminal,
            status=status,
        )
        total = reply["total"]
        client.send({"op": "resume", "key": key})  # forwarding starts after `total`
    elif recorded.exit is not None:
        status = ExitStatus(recorded.exit.exit_code, recorded.exit.signal)
    output = OutputBuffer.restored(
        recorded.output.head,
        recorded.output.tail,
        total,
        retention_bytes=retention_bytes,
        head_bytes=min(meta.head_bytes, retention_bytes),
        result_bytes=result_bytes,
    )
    return Readopted(
        meta=meta,
        handle=handle,
        status=status,
        output=output,
        exited_at_ms=recorded.exit.at_ms if recorded.exit is not None else None,
        path=path,
        killed_after=killed_after,
    )


def stop_orphan(meta: keeper_store.Meta) -> bool:
    """Kill the group of a process whose keeper is gone without its exit recorded (it may
    still run, its output going nowhere): nothing runs on that no call answers for. Only if
    `meta.pid` still leads a group that started no earlier than the call did (a recycled pid
    is left alone). True if a signal went."""
    pid = meta.pid
    if pid <= 0:
        return False
    try:
        with open(f"/proc/{pid}/stat", "rb") as file:
            fields = file.read().rsplit(b")", 1)[1].split()
        with open("/proc/stat", "rb") as file:
            boot_s = next(int(line.split()[1]) for line in file if line.startswith(b"btime"))
    except (OSError, StopIteration, IndexError, ValueError):
        return False
    pgrp, start_ticks = int(fields[2]), int(fields[19])
    started_ms = (boot_s + start_ticks / os.sysconf("SC_CLK_TCK")) * 1000
    # btime is whole seconds and the tick 10 ms: a margin of two seconds either way.
    if pgrp != pid or started_ms < meta.started_at_ms - 2000:
        return False
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        return False
    return True


class RecordedProcess:
    """A process whose keeper recorded its exit and is gone since (it exited too, its work
    done): what is left of it is its record, for its call's real result (10.1)."""

    stdin = None

    def __init__(self, pid: int, status: ExitStatus, path: str) -> None:
        self.pid: int | None = pid
        self._status = status
        self._path = path

    async def read_some(self) -> bytes:
        return b""  # its recorded output is the buffer it was re-adopted with

    def read_available(self) -> bytes:
        return b""

    async def wait(self) -> ExitStatus:
        return self._status

    def poll_exited(self) -> bool:
        return True

    def signal_group(self, sig: signal.Signals) -> bool:
        assert self.pid is not None
        return signal_group(self.pid, sig)

    def group_alive(self) -> bool:
        assert self.pid is not None
        return group_alive(self.pid)

    def close(self) -> None:
        pass

    def release(self) -> None:
        keeper_store.remove(self._path)
