"""The deterministic world of one seed: the real `Agent` and chat actors, scripted processes in
virtual time, real file tools on a throwaway workspace, a journal that survives crashes, and
in-memory connections driven the way `transport/server.py`'s Session drives them.

A connection is an `Outbox` plus a reader task: requests are applied by calling the agent's
methods directly (what the Session's reader does after decoding), and the reader drains the
outbox with `take()` (what the Session's sender does before encoding). Dropping a connection
closes its outbox: everything queued is lost, as when a socket dies.

Side effects are recorded in a ledger (trace entries of kind EFFECT) where they happen: the
simulated process backend records every process start, and the file tools `write_file` and
`edit_files` are wrapped (for the duration of a run) to record every write that took place.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import random
import shutil
import tempfile
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

import trio
from trio_websocket import ConnectionClosed, WebSocketConnection, wrap_client_stream

from toolwire.actors import events
from toolwire.actors.agent import Agent, AgentContext
from toolwire.actors.chat_state import ChatState
from toolwire.actors.hidden_paths import NOTHING_HIDDEN, HiddenPaths
from toolwire.actors.outbox import Outbox
from toolwire.actors.results import Outcome, ToolReport, ToolwireError
from toolwire.actors.tools import files as file_tools
from toolwire.actors.tools import registry
from toolwire.simulation.journal import SimJournal
from toolwire.simulation.processes import Script, SimBackend, SimProcess
from toolwire.simulation.scenario import EPOCH_MS, CallPlan, Plan
from toolwire.simulation.trace import (
    BOOT,
    CLOSE,
    CRASH,
    DROP,
    EFFECT,
    EV,
    LOST,
    OPEN,
    REJECT,
    REQ,
    SHUTDOWN,
    SIGNAL,
    STOPPED,
    ApproveReq,
    AttachReq,
    CallReq,
    CancelReq,
    CloseChatReq,
    DetachReq,
    InterruptReq,
    Request,
    Trace,
    TurnReq,
)
from toolwire.simulation.virtual_trio import memory_stream_pair
from toolwire.simulation.wire import SUBPROTOCOL_NAMES, RecordingAgent, from_message, to_message
from toolwire.transport.codec import SUBPROTOCOLS, Codec, Encoding
from toolwire.transport.server import Server, ServerConfig

T = TypeVar("T")

# A run that has not finished after this much virtual time is stuck (a liveness violation).
RUN_DEADLINE_S = 900.0

# The agent's recent-results cache, drawn per seed: none (every repeat, attach, cancel and turn
# reads its result back from the journal), one or a few (some hits, some reads, evictions),
# or the production size (all hits).
RESULT_CACHE_SIZES = (0, 1, 3, 1024)


def _describe(exc: BaseException) -> str:
    """The innermost non-Cancelled exceptions of a (group) error, with where they were raised."""
    if isinstance(exc, BaseExceptionGroup):
        parts = [_describe(e) for e in exc.exceptions if not isinstance(e, trio.Cancelled)]
        return "; ".join(dict.fromkeys(p for p in parts if p))
    if isinstance(exc, trio.Cancelled):
        return ""
    tb = exc.__traceback__
    where = ""
    while tb is not None:
        where = f"{tb.tb_frame.f_code.co_filename.rsplit('/', 2)[-2:]}:{tb.tb_lineno}"
        tb = tb.tb_next
    where = where.replace("[", "").replace("]", "").replace("', '", "/").replace("'", "")
    return f"{type(exc).__name__}: {exc} at {where}"


class Reroute(Exception):
    """The driver's connection is gone (or its chat moves to another replica)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class Inbox:
    """The events of one chat that its driver's current connection received."""

    def __init__(self) -> None:
        self.items: deque[events.Event] = deque()
        self.reroute: str | None = None
        self._wake = trio.Event()

    def put(self, event: events.Event) -> None:
        self.items.append(event)
        self._wake.set()

    def signal(self, reason: str) -> None:
        if self.reroute is None:
            self.reroute = reason
        self._wake.set()

    async def get(self) -> events.Event:
        while True:
            if self.items:
                return self.items.popleft()
            if self.reroute is not None:
                reason, self.reroute = self.reroute, None
                raise Reroute(reason)
            self._wake = trio.Event()
            await self._wake.wait()


@dataclass(eq=False)
class WireLink:
    """The client end of a wire connection (see simulation/wire.py)."""

    stream: trio.StapledStream[Any, Any]
    ws: WebSocketConnection
    codec: Codec
    send: trio.MemorySendChannel[str | bytes]


@dataclass(eq=False)
class Conn:
    id: int
    replica: int
    # The connection's outbox: ours, or (on the wire) the server Session's once it is known.
    outbox: Outbox | None
    batch: int  # events per take(): a sender's batch
    delay: float  # virtual seconds between takes: a slow network
    alive: bool = True
    stall_until: float = 0.0
    unstall: trio.Event = field(default_factory=trio.Event)  # ends a stall early (settling)
    routes: dict[str, Inbox] = field(default_factory=dict)
    link: WireLink | None = None


_log = logging.getLogger("toolwire")


@contextlib.contextmanager
def quiet_runtime_logs() -> Iterator[None]:
    """Injected failures make the chat actors log tracebacks; a simulation expects them."""
    level, propagate = _log.level, _log.propagate
    _log.setLevel(logging.CRITICAL + 1)
    _log.propagate = False
    try:
        yield
    finally:
        _log.setLevel(level)
        _log.propagate = propagate


# ---------------------------------------------------------------------------------------------
# File tools: the real ones, wrapped for the ledger while a world runs

_ACTIVE: World | None = None
_REAL_WRITE = file_tools.write_file
_REAL_EDIT = file_tools.edit_files
# The writers' registry entries: while a world runs, the same entries with the wrapped runs
# (the chat finds a tool's run in the registry, actors/tools/registry.py).
_REAL_ENTRIES = {name: registry.TOOLS[name] for name in ("write_file", "edit_files")}
_REAL_TO_THREAD = trio.to_thread.run_sync

# Virtual seconds a worker thread's run takes (see `World.thread_hop`): a write with its two
# fsyncs takes from well under a millisecond to tens of them.
THREAD_HOP_S = (0.0, 0.02)


def _sim_write_file(
    workspace: str, args: file_tools.WriteFileArgs, *, hidden: HiddenPaths = NOTHING_HIDDEN
) -> ToolReport:
    world = _ACTIVE
    if world is None:
        return _REAL_WRITE(workspace, args, hidden=hidden)
    token = args.content.split("\n", 1)[0]
    return world.file_effect("write", token, lambda: _REAL_WRITE(workspace, args, hidden=hidden))


def _sim_edit_files(
    workspace: str, args: file_tools.EditFilesArgs, *, hidden: HiddenPaths = NOTHING_HIDDEN
) -> ToolReport:
    world = _ACTIVE
    if world is None:
        return _REAL_EDIT(workspace, args, hidden=hidden)
    token = args.files[0].edits[0].new.split("\n", 1)[0] if args.files else ""
    return world.file_effect("edit", token, lambda: _REAL_EDIT(workspace, args, hidden=hidden))


async def _sim_to_thread(
    sync_fn: Callable[..., T],
    *args: Any,
    thread_name: str | None = None,
    abandon_on_cancel: bool = False,
    limiter: Any = None,
) -> T:
    world = _ACTIVE
    if world is None:
        return await _REAL_TO_THREAD(
            sync_fn,
            *args,
            thread_name=thread_name,
            abandon_on_cancel=abandon_on_cancel,
            limiter=limiter,
        )
    return await world.thread_hop(sync_fn, *args)


@contextlib.contextmanager
def instrumented(world: World) -> Iterator[None]:
    """While `world` runs: the file tools record their effects in its ledger, and every
    worker-thread hop of the agent (`trio.to_thread.run_sync`: the writers, search_files) is a
    hop in virtual time (`World.thread_hop`), since a real thread's duration would make the
    trace depend on real time."""
    global _ACTIVE
    previous = _ACTIVE
    _ACTIVE = world
    registry.TOOLS["write_file"] = dataclasses.replace(
        _REAL_ENTRIES["write_file"], run=registry.OnThread(_sim_write_file)
    )
    registry.TOOLS["edit_files"] = dataclasses.replace(
        _REAL_ENTRIES["edit_files"], run=registry.OnThread(_sim_edit_files)
    )
    trio.to_thread.run_sync = _sim_to_thread  # type: ignore[assignment]
    try:
        yield
    finally:
        _ACTIVE = previous
        if previous is None:
            registry.TOOLS.update(_REAL_ENTRIES)
            trio.to_thread.run_sync = _REAL_TO_THREAD


def make_workspace(files: dict[str, bytes]) -> str:
    # tmpfs when there is one: the file tools fsync every write, which costs nothing there.
    base = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    root = tempfile.mkdtemp(prefix="toolwire-sim-", dir=base)
    for rel, data in files.items():
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)
    return root


def remove_workspace(root: str) -> None:
    shutil.rmtree(root, ignore_errors=True)


# ---------------------------------------------------------------------------------------------


class World:
    def __init__(
        self,
        plan: Plan,
        workspace: str,
        *,
        state_class: type[ChatState] = ChatState,
        trace: Trace | None = None,
    ) -> None:
        self.plan = plan
        self.workspace = workspace
        self.state_class = state_class
        self.trace = trace if trace is not None else Trace()
        self.rng = random.Random(f"{plan.seed}/world")
        self.gen = 0
        self.agent: Agent | None = None
        self.agent_up = trio.Event()
        self._agent_scope: trio.CancelScope | None = None
        self._nursery: trio.Nursery | None = None
        self.conns: list[Conn] = []
        self._conn_ids = 0
        self.replica_conn: dict[int, Conn] = {}
        self._connecting: dict[int, trio.Event] = {}
        self._rid = 0
        # The wire slice: connections go through the real server (simulation/wire.py).
        self.wire = plan.wire
        self.server: Server | None = None
        self.rid_conn: dict[int, Conn] = {}
        self.outbox_conn: dict[Outbox, Conn] = {}
        self.finished = False
        self.stuck: list[str] = []
        self.stop_errors: list[str] = []
        # Who owns each simulated command and file token: (chat_id, call_id, plan).
        self.scripts: dict[str, Script] = {}
        self.owners: dict[str, tuple[str, str, CallPlan]] = {}
        self.calls: dict[tuple[str, str], CallPlan] = {}
        for chat, _, call in plan.calls():
            if call.call_id is None:
                continue
            self.calls[(chat.chat_id, call.call_id)] = call
            self.owners[call.token] = (chat.chat_id, call.call_id, call)
            if call.script is not None:
                self.scripts[str(call.args["command"])] = call.script
                self.owners[str(call.args["command"])] = (chat.chat_id, call.call_id, call)
        self.processes: dict[tuple[str, str], list[SimProcess]] = {}
        self._thread_rng = random.Random(f"{plan.seed}/threads")
        self.journal = SimJournal(
            random.Random(f"{plan.seed}/journal"),
            read_rng=random.Random(f"{plan.seed}/journal-reads"),
        )
        self.backend = SimBackend(self.scripts, self._on_spawn, self._on_signal)
        self.ctx = AgentContext(
            workspace=workspace,
            approve_tools=plan.approve_tools,
            approval_timeout_s=plan.approval_timeout_s,
            kill_grace_s=plan.kill_grace_s,
            backend=self.backend,
            wall_ms=self.wall_ms,
            base_env={},
            journal=self.journal,
            # Most runs keep few recent results, so repeats, attaches, cancels and turns are
            # answered from the journal as often as from memory.
            result_cache_entries=random.Random(f"{plan.seed}/cache").choice(RESULT_CACHE_SIZES),
        )

    # -- clocks and ids ------------------------------------------------------------------------

    @staticmethod
    def now() -> float:
        return trio.current_time()

    @staticmethod
    def wall_ms() -> int:
        return EPOCH_MS + int(trio.current_time() * 1000)

    def next_rid(self) -> int:
        self._rid += 1
        return self._rid

    # -- the agent -----------------------------------------------------------------------------

    async def _run_agent(
        self, agent: Agent, *, task_status: trio.TaskStatus[Agent] = trio.TASK_STATUS_IGNORED
    ) -> None:
        with trio.CancelScope() as scope:
            self._agent_scope = scope
            try:
                await agent.run(task_status=task_status)
            except BaseException as exc:
                if not scope.cancel_called or isinstance(exc, KeyboardInterrupt):
                    raise
                # Stopping the agent must end its tasks quietly; anything else escaping
                # Agent.run here would also crash `toolwire serve` on SIGTERM.
                described = _describe(exc)
                if not described:
                    raise  # only Cancelled: the scope absorbs it
                self.stop_errors.append(described)

    async def start_agent(self) -> None:
        assert self._nursery is not None
        agent = Agent(self.ctx, agent_id="sim", state_class=self.state_class)
        restored = tuple(
            (row.chat_id, row.call_id, row.turn_id, row.state) for row in self.journal.rows.values()
        )
        # The tools chats approved with scope "chat" that are on disk (PROTOCOL.md 9.5).
        approvals = tuple(self.journal.approvals)
        # Before the agent starts: its recovery may already run calls (a gate a restored
        # approval opens), and their effects belong after the boot.
        self.trace.add(BOOT, self.now(), self.gen, restored, approvals)
        self.agent = await self._nursery.start(self._run_agent, agent)
        if self.wire:
            config = ServerConfig(host="sim", port=0, token=None)
            self.server = Server(RecordingAgent(self, agent), config)  # type: ignore[arg-type]
        self.agent_up.set()

    async def crash(self) -> None:
        """Kill the agent (its nursery is cancelled, like kill -9: no cleanup runs), lose what
        the journal had not committed, and start a new agent on the same journal."""
        if self.agent is None or self._agent_scope is None:
            return
        now = self.now()
        self.trace.add(CRASH, now, self.gen)
        self.trace.fault(now, "crash", f"g{self.gen}")
        self._agent_scope.cancel()
        self.agent = None
        self.agent_up = trio.Event()
        lost = self.journal.crash()
        if lost:
            self.trace.fault(now, "journal_writes_lost", str(lost))
        self.backend.kill_all(now)
        for conn in list(self.conns):
            if conn.alive:
                self.drop(conn, "agent crashed", fault=False)
        self.gen += 1
        await trio.sleep(self.rng.uniform(0.01, 1.5))
        await self.start_agent()

    async def shutdown(self) -> None:
        """Stop the agent gracefully (PROTOCOL.md 9.3, what SIGTERM to `toolwire serve` does):
        `Agent.shutdown()` refuses requests, stops every group and saves the calls it stopped;
        then the agent's tasks end, every connection closes (1001) and a new `Agent` starts on
        the same journal. A shutdown that does not end within the kill grace plus 5 s is a
        liveness violation (the agent is then stopped as by a crash)."""
        agent = self.agent
        if agent is None or self._agent_scope is None:
            return
        self.trace.add(SHUTDOWN, self.now(), self.gen)
        self.trace.fault(self.now(), "shutdown", f"g{self.gen}")
        with trio.move_on_after(self.plan.kill_grace_s + 5.0) as limit:
            await agent.shutdown()
        if limit.cancelled_caught:
            self.stuck.append(f"the shutdown of g{self.gen} did not end in time")
        self._agent_scope.cancel()
        self.agent = None
        self.agent_up = trio.Event()
        # Everything was made durable: a write lost here is a violation (s.journal_lost).
        lost = self.journal.crash()
        # The groups the shutdown left alive (it must leave none), before the host reaps them.
        survivors = tuple(p.owner for p in self.backend.running if p.group_alive())
        self.trace.add(STOPPED, self.now(), self.gen, lost, survivors)
        self.backend.kill_all(self.now())
        for conn in list(self.conns):
            if conn.alive:
                self.drop(conn, "agent shut down (1001)", fault=False)
        self.gen += 1
        await trio.sleep(self.rng.uniform(0.01, 1.5))
        await self.start_agent()

    # -- connections ---------------------------------------------------------------------------

    async def _open(self, replica: int) -> Conn | None:
        """A new connection (None if the agent died during the handshake)."""
        assert self._nursery is not None
        gen = self.gen
        self._conn_ids += 1
        cid = self._conn_ids
        conn = Conn(
            id=cid,
            replica=replica,
            outbox=None if self.wire else Outbox(f"c{cid}"),
            batch=self.rng.choice((1, 4, 64, 256)),
            delay=self.rng.choice((0.0, 0.0, 0.0005, 0.01)),
        )
        self.trace.add(OPEN, self.now(), cid, replica)
        if self.wire:
            await self._open_wire(conn)  # the handshake
            if gen != self.gen or self.agent is None:
                conn.alive = False  # its server died with the agent meanwhile
                self._close_transport(conn)
                self.trace.add(DROP, self.now(), cid, "agent crashed during the handshake")
                return None
        else:
            self._nursery.start_soon(self._reader, conn)
        self.conns.append(conn)
        self.replica_conn[replica] = conn
        return conn

    async def _open_wire(self, conn: Conn) -> None:
        assert self._nursery is not None and self.server is not None
        client, server_end = memory_stream_pair()
        self._nursery.start_soon(self.server.handle_connection, server_end)
        subprotocol = self.rng.choice(SUBPROTOCOL_NAMES)
        ws = await wrap_client_stream(
            self._nursery,
            client,  # type: ignore[arg-type]
            "sim",
            "/v1",
            subprotocols=[subprotocol],
            message_queue_size=100_000,
        )
        send, receive = trio.open_memory_channel[str | bytes](float("inf"))
        encoding: Encoding = "json" if SUBPROTOCOLS[subprotocol] == "json" else "msgpack"
        conn.link = WireLink(client, ws, Codec(encoding, side="client"), send)
        self._nursery.start_soon(self._wire_writer, conn, receive)
        self._nursery.start_soon(self._wire_reader, conn)

    async def conn_for(self, replica: int) -> Conn:
        """The replica's live connection, reconnecting (after a short backoff) if it died."""
        while True:
            conn = self.replica_conn.get(replica)
            if conn is not None and conn.alive:
                return conn
            pending = self._connecting.get(replica)
            if pending is not None:
                await pending.wait()
                continue
            pending = self._connecting[replica] = trio.Event()
            try:
                if conn is not None:
                    await trio.sleep(self.rng.uniform(0.005, 0.5))  # reconnect backoff
                while self.agent is None:
                    await self.agent_up.wait()
                conn = await self._open(replica)
            finally:
                del self._connecting[replica]
                pending.set()
            if conn is not None:
                return conn

    def drop(self, conn: Conn, reason: str, *, fault: bool = True) -> None:
        if not conn.alive:
            return
        conn.alive = False
        self._close_transport(conn)
        now = self.now()
        self.trace.add(DROP, now, conn.id, reason)
        if fault:
            self.trace.fault(now, "drop", f"c{conn.id}")
        for inbox in conn.routes.values():
            inbox.signal("drop")
        conn.routes.clear()

    def _close_transport(self, conn: Conn) -> None:
        if conn.link is None:
            assert conn.outbox is not None
            conn.outbox.close()
            return
        # The socket dies at once: no close handshake, whatever is in flight is lost.
        conn.link.send.close()
        stream = conn.link.stream
        stream.send_stream.close()
        stream.receive_stream.close()

    async def _wire_writer(
        self, conn: Conn, receive: trio.MemoryReceiveChannel[str | bytes]
    ) -> None:
        assert conn.link is not None
        ws = conn.link.ws
        async with receive:
            async for frame in receive:
                try:
                    await ws.send_message(frame)
                except (ConnectionClosed, trio.BrokenResourceError, trio.ClosedResourceError):
                    return

    async def _wire_reader(self, conn: Conn) -> None:
        assert conn.link is not None
        link = conn.link
        trace = self.trace.entries
        while conn.alive:
            if conn.stall_until > trio.current_time():
                with trio.move_on_at(conn.stall_until):
                    await conn.unstall.wait()
                continue
            try:
                frame = await link.ws.get_message()
            except (ConnectionClosed, trio.BrokenResourceError, trio.ClosedResourceError):
                break
            event = from_message(link.codec.decode(frame))
            if event is None or not conn.alive:
                continue
            trace.append((EV, trio.current_time(), conn.id, event))
            inbox = conn.routes.get(_chat_of(event))
            if inbox is not None:
                inbox.put(event)
            if conn.delay:
                await trio.sleep(conn.delay)
        if conn.alive:
            self.drop(conn, "closed by the agent", fault=False)

    def applied(self, outbox: Outbox, req: Request) -> int:
        """The server's Session hands a request to the agent (wire runs): its trace entry."""
        conn = self.outbox_conn.get(outbox)
        if conn is None:
            conn = self.rid_conn[req.rid]
            conn.outbox = outbox
            self.outbox_conn[outbox] = conn
        return self.trace.add(REQ, self.now(), self.gen, conn.id, req)

    def rejected(self, entry: int, code: str) -> None:
        """The agent refused the request of trace entry `entry` (the client gets an `error`)."""
        self.trace.add(REJECT, self.now(), self.gen, entry, code)

    async def _reader(self, conn: Conn) -> None:
        outbox = conn.outbox
        assert outbox is not None
        trace = self.trace.entries
        while True:
            await outbox.wait()
            if outbox.closed:
                return
            now = trio.current_time()
            if conn.stall_until > now:
                with trio.move_on_at(conn.stall_until):
                    await conn.unstall.wait()
                continue
            for event in outbox.take(conn.batch):
                trace.append((EV, now, conn.id, event))
                inbox = conn.routes.get(_chat_of(event))
                if inbox is not None:
                    inbox.put(event)
            if conn.delay:
                await trio.sleep(conn.delay)
            else:
                await trio.lowlevel.checkpoint()

    # -- requests ------------------------------------------------------------------------------

    def send(self, conn: Conn, req: Request) -> bool:
        """Apply one request as the Session does: errors go to the outbox as `error` events."""
        agent = self.agent
        if not conn.alive or agent is None:
            self.trace.add(LOST, self.now(), self.gen, conn.id, req)
            return False
        if conn.link is not None:
            # On the wire the request is recorded when the server's Session applies it.
            self.rid_conn[req.rid] = conn
            conn.link.send.send_nowait(conn.link.codec.encode(to_message(req)))
            return True
        entry = self.trace.add(REQ, self.now(), self.gen, conn.id, req)
        outbox = conn.outbox
        assert outbox is not None
        call_id: str | None = None
        try:
            match req:
                case CallReq():
                    call_id = req.spec.call_id
                    agent.call(outbox, req.chat, req.spec, stream=req.stream, rid=req.rid)
                case AttachReq():
                    call_id = req.call_id
                    agent.attach(outbox, req.chat, req.call_id, req.from_offset, req.rid)
                case DetachReq():
                    call_id = req.call_id
                    agent.detach(outbox, req.chat, req.call_id)
                case CancelReq():
                    agent.cancel(outbox, req.chat, list(req.call_ids), req.rid)
                case ApproveReq():
                    call_id = req.call_id
                    agent.approve(
                        outbox, req.chat, req.call_id, req.approved, req.rid, None, req.scope
                    )
                case TurnReq():
                    agent.turn(
                        outbox,
                        req.chat,
                        req.turn_id,
                        list(req.specs),
                        stream=req.stream,
                        rid=req.rid,
                    )
                case InterruptReq():
                    agent.interrupt(outbox, req.chat, req.turn_id, req.rid)
                case CloseChatReq():
                    agent.close_chat(outbox, req.chat, req.rid)
        except ToolwireError as exc:
            self.rejected(entry, exc.code)
            outbox.put(events.ErrorEvent(exc.code, exc.message, req.rid, req.chat, call_id))
        except Exception as exc:  # what the Session answers with `internal`
            self.rejected(entry, "internal")
            outbox.put(
                events.ErrorEvent(
                    "internal", f"{type(exc).__name__}: {exc}", req.rid, req.chat, call_id
                )
            )
        return True

    # -- the ledger ----------------------------------------------------------------------------

    def _on_spawn(self, command: str, proc: SimProcess) -> None:
        chat_id, call_id, _ = self.owners[command]
        proc.owner = (chat_id, call_id)
        self.processes.setdefault((chat_id, call_id), []).append(proc)
        self.trace.add(EFFECT, self.now(), self.gen, chat_id, call_id, "spawn")

    def _on_signal(self, proc: SimProcess, name: str) -> None:
        chat_id, call_id = proc.owner
        self.trace.add(SIGNAL, self.now(), self.gen, chat_id, call_id, name)

    def register_call(self, chat_id: str, call: CallPlan) -> None:
        """A call a driver made at run time (a read-modify-write step): known to the ledger and
        the checker like a planned one."""
        assert call.call_id is not None
        self.calls[(chat_id, call.call_id)] = call
        self.owners[call.token] = (chat_id, call.call_id, call)

    async def thread_hop(self, sync_fn: Callable[..., T], *args: Any) -> T:
        """A worker thread's run in virtual time. The function runs at once, on the loop's
        thread, at one virtual instant (in one agent two of them never overlap), so an effect
        lands in the ledger the moment its durable start lets it begin: a write under way
        cannot be stopped, so the checker counts it as begun there. Then the thread's duration
        passes: a cancel, an interrupt or a repeat of the call may arrive while it runs and must
        get its real result, and a crash meanwhile loses the result of an effect that
        happened, as a kill -9 of the agent's process would."""
        result = sync_fn(*args)
        await trio.sleep(self._thread_rng.uniform(*THREAD_HOP_S))
        return result

    def file_effect(self, what: str, token: str, run: Callable[[], ToolReport]) -> ToolReport:
        owner = self.owners.get(token)
        if owner is None:
            return run()
        chat_id, call_id, plan = owner
        if plan.fail == "before":
            raise RuntimeError("simulated: the file tool failed before writing")
        report = run()
        if report.outcome is Outcome.COMPLETED:
            self.trace.add(EFFECT, self.now(), self.gen, chat_id, call_id, what)
        if plan.fail == "after":
            raise RuntimeError("simulated: the file tool failed after writing")
        return report

    # -- faults --------------------------------------------------------------------------------

    def live_conns(self) -> list[Conn]:
        return [c for c in self.conns if c.alive]

    async def _faults(self) -> None:
        for at, kind in self.plan.faults:
            await trio.sleep_until(at)
            if self.finished:
                return
            live = self.live_conns()
            if kind == "drop" and live:
                self.drop(self.rng.choice(live), "injected")
            elif kind == "stall" and live:
                conn = self.rng.choice(live)
                stall = self.rng.choice((self.rng.uniform(0.05, 1.0), self.rng.uniform(1.0, 12.0)))
                conn.stall_until = max(conn.stall_until, self.now() + stall)
                self.trace.fault(self.now(), "stall", f"c{conn.id} {stall:.3f}s")
            elif kind == "crash":
                await self.crash()
            elif kind == "shutdown":
                await self.shutdown()

    # -- the run -------------------------------------------------------------------------------

    async def run(self, drivers: list[Callable[[], Any]]) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            await self.start_agent()
            nursery.start_soon(self._faults)
            with trio.move_on_after(RUN_DEADLINE_S) as deadline:
                async with trio.open_nursery() as inner:
                    for driver in drivers:
                        inner.start_soon(driver)
            self.finished = True
            if deadline.cancelled_caught:
                self.stuck.append(f"the run did not finish within {RUN_DEADLINE_S:.0f} s")
            await self.settle()
            nursery.cancel_scope.cancel()

    async def settle(self) -> None:
        """Let cancels and kills in flight finish, then drain every live connection."""
        await trio.sleep(self.plan.kill_grace_s + 0.5)
        for conn in self.live_conns():
            conn.stall_until = 0.0
            conn.unstall.set()
        # Drained: every outbox is empty and no connection has taken an event for a while
        # (on the wire, frames may still be on their way through a socket).
        quiet_since, seen = self.now(), len(self.trace.entries)
        for _ in range(400):
            await trio.sleep(0.05)
            if len(self.trace.entries) != seen:
                quiet_since, seen = self.now(), len(self.trace.entries)
            elif self.now() - quiet_since >= 0.5 and all(
                c.outbox is None or len(c.outbox) == 0 for c in self.live_conns()
            ):
                break
        else:
            self.stuck.append("connections still had queued events after draining")
        now = self.now()
        for conn in self.live_conns():
            conn.alive = False
            self.trace.add(CLOSE, now, conn.id)
            self._close_transport(conn)


def _chat_of(event: events.Event) -> str:
    """The chat an event is routed to: "" for the replies that name none (`tool_definitions`:
    the simulation never asks for it)."""
    if isinstance(event, events.ToolDefinitionsEvent):
        return ""
    return event.chat_id or ""
