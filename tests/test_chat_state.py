"""ChatState under every interleaving hypothesis finds: the rules of PROTOCOL.md 5.0-5.7 as
invariants, checked after every step (actors/chat_state.py is pure: no trio, no clock).

`World` plays the shell's part the way actors/chat.py does, with everything that takes time
left pending until a rule lets it happen: journal commits, tools on threads, process exits and
reaps, the grace of a stop, timers, read-backs. So the rules can race a cancel against a
command's natural end or against its durable start, an approval against its expiry, an
interrupt against a finish, a repeat against a read-back, forgetting against a pinned read,
and restart the agent at any point (what was committed survives; nothing else does).
"""

from __future__ import annotations

import os
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from toolwire.actors.calls import CallSpec
from toolwire.actors.chat_state import ChatConfig, ChatState
from toolwire.actors.effects import (
    AlreadyExited,
    ApprovalRestored,
    ApproveRequest,
    AttachRequest,
    CallEnded,
    CallRequest,
    CancelRequest,
    CancelTimer,
    CloseChatRequest,
    Deadline,
    Detach,
    DetachRequest,
    Effect,
    Follow,
    Forgotten,
    GroupEmpty,
    GroupStopped,
    Input,
    InterruptRequest,
    JournalApproveTool,
    JournalDelete,
    JournalFailed,
    JournalForgetApprovals,
    JournalTouch,
    JournalWrite,
    KillGroup,
    MarkTimedOut,
    OutputClosed,
    ProcessExited,
    ProcessSnapshot,
    Publish,
    ReadBack,
    Restored,
    ResultsRead,
    RunTool,
    Send,
    SendReplay,
    SendResult,
    Spawn,
    Spawned,
    StartTimer,
    StopGroup,
    StopRun,
    Sweep,
    ToolEnded,
    ToolStopped,
    TurnRequest,
)
from toolwire.actors.events import (
    AcceptedEvent,
    CancelResultEvent,
    ChatClosedEvent,
    InterruptedEvent,
    ResultEvent,
    TurnPlanEvent,
    TurnResultEvent,
)
from toolwire.actors.journal_rows import JournalRow
from toolwire.actors.result_cache import ResultCache
from toolwire.actors.results import (
    TEXT_AGENT_FAILURE,
    TEXT_AGENT_FAILURE_BEFORE_RUN,
    Outcome,
    Result,
    ToolReport,
    ToolwireError,
)
from toolwire.actors.tools.registry import TOOLS

CALL_IDS = ["k1", "k2", "k3", "k4"]
FORGET_AFTER_S = 30.0
GATE_TIMEOUT_S = 20.0
# The tools the machine calls, by what they make the state machine do: a command (a process
# group), an inline write (an effect journaled first), an inline read (no start row), a
# thread-run search and a stoppable wait (each a task the shell runs).
CALLS: dict[str, tuple[str, dict[str, Any]]] = {
    "cmd": ("execute", {"command": "make test"}),
    "bg": ("execute", {"command": "serve"}),
    "hard": ("execute", {"command": "build", "kill_after_ms": 5000}),
    "write": ("write_file", {"path": "f", "content": "x"}),
    "read": ("read_file", {"path": "f"}),
    "search": ("search_files", {"pattern": "x"}),
    "wait": ("process_output", {"process_id": "k1", "wait": True}),
}


@dataclass
class Written:
    """A journal write not committed yet, and the life of the record it belongs to."""

    row: JournalRow
    then: Input | None
    life: int


@dataclass
class Proc:
    state: str = "running"  # running -> zombie (exited, not reaped) -> reaped
    stopping: str | None = None  # "term" while the grace runs, "kill" after SIGKILL
    output_closed: bool = False


@dataclass
class Owed:
    """What one connection was promised and what it got (per generation of the agent)."""

    accepted: Counter[str] = field(default_factory=Counter)
    results: Counter[str] = field(default_factory=Counter)
    cancels: int = 0
    cancel_results: int = 0
    interrupts: int = 0
    interrupted: int = 0
    closes: int = 0
    closed: int = 0
    turns: Counter[str] = field(default_factory=Counter)
    turn_results: Counter[str] = field(default_factory=Counter)


class World:
    """The shell's part, done by hand: effects are carried out, what takes time waits."""

    def __init__(self, journal_keeps_results: bool) -> None:
        self.keeps = journal_keeps_results
        self.now = 0.0
        self.wall_ms = 1_000_000
        self.generation = 0
        # The journal: committed rows survive a restart, pending ones do not.
        self.committed: dict[str, JournalRow] = {}
        self.approvals: set[str] = set()
        self.pending_writes: list[Any] = []
        self.refusals = 0  # how many of the next journal writes fail
        self.unsaved: set[tuple[str, int]] = set()  # results answered from memory only
        self.inbox: deque[Input] = deque()
        # Effects of calls, counted per life of a record (a forgotten record's id is new).
        self.life: Counter[str] = Counter()
        # The life each committed row belongs to: a restart brings back that record.
        self.row_life: dict[str, int] = {}
        self.effects_run: Counter[tuple[str, int]] = Counter()
        self.read_only_runs: Counter[tuple[str, int, int]] = Counter()
        self.results_seen: dict[tuple[str, int], Result] = {}
        self.owed: dict[str, Owed] = {}
        self.turn_calls: dict[str, list[str]] = {}
        self.new_state()

    def new_state(self) -> None:
        config = ChatConfig(
            workspace="/ws",
            max_processes_per_chat=3,
            forget_after_s=FORGET_AFTER_S,
            kill_grace_s=2.0,
            approval_timeout_s=GATE_TIMEOUT_S,
            journal_enabled=True,
            journal_keeps_results=self.keeps,
        )
        # A cache of two results: read-backs happen all the time.
        self.state = ChatState("c", config, ResultCache(max_entries=2))
        self.procs: dict[str, Proc] = {}
        self.tasks: dict[str, str] = {}  # call_id -> "search" | "wait": a tool on a task
        self.timers: dict[tuple[str, str], Input] = {}
        self.reads: list[tuple[str, ...]] = []
        self.conns = [f"a{self.generation}", f"b{self.generation}"]
        for conn in self.conns:
            self.owed[conn] = Owed()

    # -- feeding -------------------------------------------------------------------------------

    def request(self, event: Input) -> bool:
        """A request: True if accepted, False if refused (then nothing may have changed)."""
        before = self.fingerprint()
        try:
            effects = self.state.handle(event, self.now, self.wall_ms)
        except ToolwireError:
            assert self.fingerprint() == before, "a refused request changed the chat"
            return False
        self.carry_out(effects)
        self.drain()
        return True

    def feed(self, event: Input) -> None:
        self.inbox.append(event)
        self.drain()

    def drain(self) -> None:
        while self.inbox:
            event = self.inbox.popleft()
            self.carry_out(self.state.handle(event, self.now, self.wall_ms))

    def fingerprint(self) -> Any:
        state = self.state
        return (
            [(r.call_id, r.state, r.requests, r.touched_at, r.pins) for r in state.records],
            sorted(state.turns),
            state.approved_tools,
        )

    # -- effects -------------------------------------------------------------------------------

    def carry_out(self, effects: list[Effect]) -> None:
        for effect in effects:
            if isinstance(effect, Follow):
                for event in effect.events:
                    self.sent(effect.conn, event)
            elif isinstance(effect, Send | SendResult | SendReplay):
                self.sent(effect.conn, effect.event)
            elif isinstance(effect, JournalWrite) and self.refusals:
                self.refusals -= 1  # the disk is full: the journal refuses this row
                self.inbox.append(JournalFailed(effect.row.call_id))
            elif isinstance(effect, JournalWrite):
                self.pending_writes.append(
                    Written(effect.row, effect.then, self.life[effect.row.call_id])
                )
            elif isinstance(
                effect, JournalTouch | JournalDelete | JournalApproveTool | JournalForgetApprovals
            ):
                self.pending_writes.append(effect)
            elif isinstance(effect, RunTool):
                self.run_tool(effect)
            elif isinstance(effect, StopRun):
                if self.tasks.pop(effect.call_id, None) is not None:
                    self.inbox.append(ToolStopped(effect.call_id))
            elif isinstance(effect, Spawn):
                self.started(effect.call_id, read_only=False)
                self.procs[effect.call_id] = Proc()
                self.inbox.append(Spawned(effect.call_id, 4242, self.snapshot(effect.call_id)))
            elif isinstance(effect, StopGroup):
                proc = self.procs[effect.call_id]
                if effect.unless_exited and proc.state != "running":
                    self.inbox.append(AlreadyExited(effect.call_id))
                elif effect.reason == "kill_after" and proc.state == "reaped":
                    self.inbox.append(AlreadyExited(effect.call_id))  # no member left
                else:
                    proc.stopping = "term"
            elif isinstance(effect, KillGroup):
                self.procs[effect.call_id].stopping = "kill"
            elif isinstance(effect, StartTimer):
                self.timers[effect.key] = effect.fire
            elif isinstance(effect, CancelTimer):
                self.timers.pop(effect.key, None)
            elif isinstance(effect, ReadBack):
                self.reads.append(effect.call_ids)
            elif isinstance(effect, Forgotten):
                self.life[effect.call_id] += 1
            elif isinstance(effect, CallEnded | Publish | Detach | MarkTimedOut):
                pass
            else:  # pragma: no cover - a new effect the machine must learn
                raise AssertionError(f"unknown effect {effect!r}")

    def run_tool(self, effect: RunTool) -> None:
        read_only = TOOLS[effect.tool].read_only
        self.started(effect.call_id, read_only=read_only)
        if effect.on_loop:
            report = ToolReport(outcome=Outcome.COMPLETED, text=f"{effect.tool} done")
            self.inbox.append(ToolEnded(effect.call_id, report))
        else:
            self.tasks[effect.call_id] = effect.tool

    def started(self, call_id: str, *, read_only: bool) -> None:
        """An effect happens: at most once per record, and only once its start is durable."""
        key = (call_id, self.life[call_id])
        if read_only:
            # Changes nothing: it may run again after a restart (no start row is kept).
            self.read_only_runs[(call_id, self.life[call_id], self.generation)] += 1
            assert self.read_only_runs[(call_id, self.life[call_id], self.generation)] == 1
            return
        self.effects_run[key] += 1
        assert self.effects_run[key] == 1, f"{call_id} ran twice"
        row = self.committed.get(call_id)
        assert row is not None and row.state == "running", f"{call_id} ran before its start row"

    def sent(self, conn: Any, event: Any) -> None:
        owed = self.owed[conn]
        if isinstance(event, AcceptedEvent):
            owed.accepted[event.call_id] += 1
        elif isinstance(event, ResultEvent):
            owed.results[event.call_id] += 1
            assert owed.results[event.call_id] <= owed.accepted[event.call_id], (
                f"{event.call_id}: more results than requests"
            )
            self.check_result(event.call_id, event.result)
        elif isinstance(event, CancelResultEvent):
            owed.cancel_results += 1
            assert owed.cancel_results <= owed.cancels
            self.check_result(event.call_id, event.result)
        elif isinstance(event, InterruptedEvent):
            owed.interrupted += 1
            assert owed.interrupted <= owed.interrupts
        elif isinstance(event, ChatClosedEvent):
            owed.closed += 1
            assert owed.closed <= owed.closes
            # Nothing of what it stopped is left.
            assert not any(call_id in self.state.groups for call_id in event.process_ids)
        elif isinstance(event, TurnResultEvent):
            owed.turn_results[event.turn_id] += 1
            assert owed.turn_results[event.turn_id] <= owed.turns[event.turn_id]
            calls = self.turn_calls[event.turn_id]
            # In request order, each the call's one result.
            assert len(event.results) == len(calls)
            for call_id, result in zip(calls, event.results, strict=True):
                self.check_result(call_id, result)
        elif isinstance(event, TurnPlanEvent):
            pass

    def check_result(self, call_id: str, result: Result) -> None:
        """Results never contradict each other, and none goes out before it is durable."""
        key = (call_id, self.life[call_id])
        seen = self.results_seen.setdefault(key, result)
        assert seen == result, f"{call_id}: two different results {seen} / {result}"
        row = self.committed.get(call_id)
        if result.text in (TEXT_AGENT_FAILURE, TEXT_AGENT_FAILURE_BEFORE_RUN) and (
            row is None or row.result != result
        ):
            # The journal refused its rows: the failure is answered from memory, and a restart
            # finds the row before it (or none): PROTOCOL.md 9.9 says so.
            self.unsaved.add(key)
        else:
            assert row is not None and row.result == result, f"{call_id}: sent before durable"
        ran = self.effects_run[key] > 0
        if result.outcome in (Outcome.NOT_RUN, Outcome.DENIED):
            assert not ran, f"{call_id} says {result.outcome} but its effect happened"
        # A cancel of a forgotten call whose command still runs stops that command: it ran.
        ran = ran or (result.tool == "execute" and call_id in self.procs)
        if result.outcome in (Outcome.COMPLETED, Outcome.CANCELED, Outcome.TIMED_OUT):
            tool = result.tool
            if tool and not TOOLS[tool].read_only:
                assert ran, f"{call_id} says {result.outcome} but never ran"

    def snapshot(self, call_id: str) -> ProcessSnapshot:
        proc = self.procs[call_id]
        reaped = proc.state == "reaped"
        return ProcessSnapshot(call_id, 0 if reaped else None, None, reaped, "out", 3, 0)

    # -- what takes time -----------------------------------------------------------------------

    def commit(self, n: int) -> None:
        done, self.pending_writes = self.pending_writes[:n], self.pending_writes[n:]
        for effect in done:
            if isinstance(effect, Written):
                self.committed[effect.row.call_id] = effect.row
                self.row_life[effect.row.call_id] = effect.life
                if effect.then is not None:
                    self.inbox.append(effect.then)
            elif isinstance(effect, JournalDelete):
                self.committed.pop(effect.call_id, None)
            elif isinstance(effect, JournalApproveTool):
                self.approvals.add(effect.tool)
            elif isinstance(effect, JournalForgetApprovals):
                self.approvals.clear()
        self.drain()

    def restart(self) -> None:
        """The agent dies: what was not committed is lost, and so are the connections."""
        self.pending_writes.clear()
        self.inbox.clear()
        self.generation += 1
        for key in self.unsaved:
            self.results_seen.pop(key, None)
        self.unsaved.clear()
        for call_id in list(self.life):
            # A record whose row survived is the same record; any other id is new next time.
            self.life[call_id] = (
                self.row_life[call_id] if call_id in self.committed else self.life[call_id] + 1
            )
        self.new_state()
        rows = sorted(self.committed.values(), key=lambda row: row.touched_at_ms)
        for row in rows:
            self.request(Restored(row, self.now - 1.0))
        for tool in sorted(self.approvals):
            if self.state.records:
                self.request(ApprovalRestored(tool))
        self.commit(len(self.pending_writes))  # recovery is durable before requests come

    def quiesce(self) -> None:
        """Let everything pending happen, until nothing is left."""
        for _ in range(200):
            if self.pending_writes:
                self.commit(len(self.pending_writes))
            elif self.reads:
                self.read_back()
            elif self.tasks:
                call_id = next(iter(self.tasks))
                del self.tasks[call_id]
                self.feed(ToolEnded(call_id, ToolReport(outcome=Outcome.COMPLETED, text="done")))
            elif any(p.state != "reaped" or p.stopping for p in self.procs.values()):
                call_id = next(
                    c for c, p in self.procs.items() if p.state != "reaped" or p.stopping
                )
                self.advance_process(call_id)
            elif self.timers:
                self.fire(next(iter(self.timers)))
            else:
                return
        raise AssertionError("the chat never became quiet")

    def advance_process(self, call_id: str) -> None:
        proc = self.procs[call_id]
        if proc.stopping == "term":
            proc.state = "zombie" if proc.state == "running" else proc.state
            proc.stopping = "waiting"
            self.feed(GroupEmpty(call_id))
        elif proc.stopping == "kill":
            self.reap(call_id)
            proc.stopping = None
            proc.output_closed = True
            self.feed(GroupStopped(call_id, self.snapshot(call_id)))
        elif proc.state == "running":
            proc.state = "zombie"
        else:
            self.reap(call_id)

    def reap(self, call_id: str) -> None:
        proc = self.procs[call_id]
        if proc.state == "reaped":
            return
        proc.state = "reaped"
        self.feed(ProcessExited(call_id, self.snapshot(call_id)))
        if not proc.output_closed:
            proc.output_closed = True
            self.feed(OutputClosed(call_id))

    def fire(self, key: tuple[str, str]) -> None:
        fire = self.timers.pop(key)
        if isinstance(fire, Deadline):
            proc = self.procs.get(fire.call_id)
            fire = Deadline(fire.call_id, self.snapshot(fire.call_id) if proc else None)
        self.feed(fire)

    def read_back(self) -> None:
        call_ids = self.reads.pop(0)
        found = {}
        for call_id in call_ids:
            row = self.committed.get(call_id)
            assert row is not None and row.result is not None, f"read-back of {call_id} failed"
            found[call_id] = row.result
        self.feed(ResultsRead(found))

    def check_all_answered(self) -> None:
        for conn, owed in self.owed.items():
            if conn not in self.conns:
                continue  # a connection of an agent that died: its replies died with it
            assert owed.results == owed.accepted, f"{conn}: one result per request"
            assert owed.cancel_results == owed.cancels
            assert owed.interrupted == owed.interrupts
            assert owed.closed == owed.closes
            assert owed.turn_results == owed.turns


class ChatStateMachine(RuleBasedStateMachine):
    world: World

    @initialize(keeps=st.booleans())
    def start(self, keeps: bool) -> None:
        self.world = World(journal_keeps_results=keeps)

    conns = st.integers(0, 1)
    call_ids = st.sampled_from(CALL_IDS)

    def conn(self, index: int) -> str:
        return self.world.conns[index]

    # -- requests ------------------------------------------------------------------------------

    @rule(conn=conns, call_id=call_ids, kind=st.sampled_from(sorted(CALLS)),
          approval=st.booleans(), stream=st.booleans(), timeout=st.booleans())  # fmt: skip
    def call(
        self, conn: int, call_id: str, kind: str, approval: bool, stream: bool, timeout: bool
    ) -> None:
        tool, args = CALLS[kind]
        spec = CallSpec(
            call_id,
            tool,
            args,
            timeout_ms=5000 if timeout and kind == "cmd" else None,
            background=kind == "bg",
            approval=approval,
        )
        self.world.request(CallRequest(self.conn(conn), spec, stream, None))

    @rule(conn=conns, call_id=call_ids, offset=st.integers(0, 5))
    def attach(self, conn: int, call_id: str, offset: int) -> None:
        self.world.request(AttachRequest(self.conn(conn), call_id, offset, None))

    @rule(conn=conns, call_id=call_ids)
    def detach(self, conn: int, call_id: str) -> None:
        self.world.request(DetachRequest(self.conn(conn), call_id))

    @rule(conn=conns, call_id=call_ids, approved=st.booleans(), chat_scope=st.booleans())
    def approve(self, conn: int, call_id: str, approved: bool, chat_scope: bool) -> None:
        scope = "chat" if chat_scope else "call"
        self.world.request(ApproveRequest(self.conn(conn), call_id, approved, None, None, scope))

    @rule(conn=conns, call_ids=st.lists(st.sampled_from(CALL_IDS), min_size=1, max_size=2))
    def cancel(self, conn: int, call_ids: list[str]) -> None:
        owed = self.world.owed[self.conn(conn)]
        owed.cancels += len(call_ids)  # before: the reply may come at once
        if not self.world.request(CancelRequest(self.conn(conn), tuple(call_ids), None)):
            owed.cancels -= len(call_ids)

    @rule(conn=conns, turn_id=st.sampled_from(["t1", "t2"]),
          calls=st.lists(st.tuples(st.sampled_from(CALL_IDS), st.sampled_from(sorted(CALLS))),
                         min_size=1, max_size=3, unique_by=lambda c: c[0]),
          stream=st.booleans(), approval=st.booleans())  # fmt: skip
    def turn(
        self,
        conn: int,
        turn_id: str,
        calls: list[tuple[str, str]],
        stream: bool,
        approval: bool,
    ) -> None:
        specs = tuple(
            CallSpec(call_id, CALLS[kind][0], CALLS[kind][1], background=kind == "bg",
                     approval=approval and i == 0)
            for i, (call_id, kind) in enumerate(calls)
        )  # fmt: skip
        owed = self.world.owed[self.conn(conn)]
        owed.turns[turn_id] += 1
        before = self.world.turn_calls.get(turn_id)
        self.world.turn_calls[turn_id] = [s.call_id for s in specs]
        if not self.world.request(TurnRequest(self.conn(conn), turn_id, specs, stream, None)):
            owed.turns[turn_id] -= 1
            if before is not None:
                self.world.turn_calls[turn_id] = before

    @rule(conn=conns, turn_id=st.none() | st.sampled_from(["t1", "t2"]))
    def interrupt(self, conn: int, turn_id: str | None) -> None:
        owed = self.world.owed[self.conn(conn)]
        owed.interrupts += 1
        if not self.world.request(InterruptRequest(self.conn(conn), turn_id, None)):
            owed.interrupts -= 1

    @rule(conn=conns)
    def close_chat(self, conn: int) -> None:
        owed = self.world.owed[self.conn(conn)]
        owed.closes += 1
        self.world.request(CloseChatRequest(self.conn(conn), None))

    # -- what happens meanwhile ----------------------------------------------------------------

    @precondition(lambda self: self.world.pending_writes)
    @rule(n=st.integers(1, 4))
    def commit(self, n: int) -> None:
        self.world.commit(n)

    @precondition(lambda self: self.world.tasks)
    @rule(data=st.data())
    def tool_ends(self, data: st.DataObject) -> None:
        call_id = data.draw(st.sampled_from(sorted(self.world.tasks)))
        del self.world.tasks[call_id]
        report = ToolReport(outcome=Outcome.COMPLETED, text="done")
        self.world.feed(ToolEnded(call_id, report))

    @precondition(lambda self: self.world.procs)
    @rule(data=st.data())
    def process_moves(self, data: st.DataObject) -> None:
        """The command exits, is reaped, or its stop moves on (the grace ends, it is gone)."""
        call_id = data.draw(st.sampled_from(sorted(self.world.procs)))
        self.world.advance_process(call_id)

    @precondition(lambda self: self.world.timers)
    @rule(data=st.data())
    def timer_fires(self, data: st.DataObject) -> None:
        key = data.draw(st.sampled_from(sorted(self.world.timers)))
        self.world.fire(key)

    @precondition(lambda self: self.world.reads)
    @rule()
    def read_back(self) -> None:
        self.world.read_back()

    @rule(seconds=st.sampled_from([1.0, 15.0, 40.0]))
    def time_passes(self, seconds: float) -> None:
        self.world.now += seconds
        self.world.wall_ms += int(seconds * 1000)
        self.world.request(Sweep())

    @rule(n=st.integers(1, 2))
    def journal_refuses(self, n: int) -> None:
        self.world.refusals = n

    @rule()
    def restart(self) -> None:
        self.world.restart()

    # -- invariants ----------------------------------------------------------------------------

    @invariant()
    def records_are_consistent(self) -> None:
        if not hasattr(self, "world"):
            return
        state = self.world.state
        for record in state.records:
            if record.published:
                assert record.done
            if record.done:
                assert record.outcome is not None
            assert record.pins >= 0
        # A grace still running on a group means the group is known.
        for call_id, proc in self.world.procs.items():
            if proc.stopping in ("term", "kill"):
                assert call_id in state.groups

    def teardown(self) -> None:
        if hasattr(self, "world"):
            self.world.quiesce()
            self.world.check_all_answered()
            assert not self.world.state._replies, "a reply still waits in a quiet chat"


# The suite's share; TOOLWIRE_STATE_EXAMPLES=20000 for a long search.
ChatStateMachine.TestCase.settings = settings(
    max_examples=int(os.environ.get("TOOLWIRE_STATE_EXAMPLES", "400")),
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestChatStateMachine = ChatStateMachine.TestCase


def test_a_refused_request_changes_nothing() -> None:
    world = World(journal_keeps_results=False)
    assert not world.request(CallRequest("a0", CallSpec("k1", "nope", {}), False, None))
    assert not world.request(AttachRequest("a0", "k1", 0, None))
    assert not world.state.records


@pytest.mark.parametrize("keeps", [False, True])
def test_a_cancel_racing_the_durable_start_ends_not_run_and_nothing_runs(keeps: bool) -> None:
    world = World(journal_keeps_results=keeps)
    world.request(CallRequest("a0", CallSpec("k1", "write_file", CALLS["write"][1]), True, None))
    world.request(CancelRequest("a0", ("k1",), None))
    world.owed["a0"].cancels += 1
    world.quiesce()
    world.check_all_answered()
    assert world.effects_run[("k1", 0)] == 0
    assert world.committed["k1"].result is not None
    assert world.committed["k1"].result.outcome is Outcome.NOT_RUN


def test_a_command_that_ends_while_its_cancel_is_on_the_way_keeps_its_real_result() -> None:
    world = World(journal_keeps_results=False)
    world.request(CallRequest("a0", CallSpec("k1", "execute", CALLS["cmd"][1]), True, None))
    world.commit(len(world.pending_writes))  # the start is durable: the command spawns
    world.advance_process("k1")  # it exits (not reaped yet) ...
    world.request(CancelRequest("a0", ("k1",), None))  # ... as the cancel arrives
    world.owed["a0"].cancels += 1
    world.quiesce()
    world.check_all_answered()
    result = world.committed["k1"].result
    assert result is not None and result.outcome is Outcome.COMPLETED and not result.canceled


def test_the_group_gets_its_grace_after_the_shell_exits() -> None:
    """5.3: the shell exiting during the grace does not end the stop; SIGKILL comes only
    when the grace is over (or the group empty), and the result only when the group is gone."""
    world = World(journal_keeps_results=False)
    world.request(CallRequest("a0", CallSpec("k1", "execute", CALLS["cmd"][1]), True, None))
    world.commit(len(world.pending_writes))
    world.request(CancelRequest("a0", ("k1",), None))
    world.owed["a0"].cancels += 1
    assert world.procs["k1"].stopping == "term"
    world.procs["k1"].state = "zombie"
    world.reap("k1")  # the shell is gone; its children still clean up
    assert world.procs["k1"].stopping == "term", "the grace was cut short"
    assert world.state.records.get("k1") is not None
    assert not world.state.records.get("k1").done  # type: ignore[union-attr]
    world.quiesce()
    world.check_all_answered()
    result = world.committed["k1"].result
    assert result is not None and result.outcome is Outcome.CANCELED and result.canceled
