"""The shell's part for one `ChatState`, played by hand: a pure interpreter of its effects that
checks PROTOCOL.md 5.0-5.7 after every step (no trio, no I/O, no clock: time is a number).

`World` carries out the effects of one chat the way actors/chat.py does, with everything that
takes time left pending until someone lets it happen: journal commits, tools on threads,
process exits and reaps, the grace of a stop, timers, read-backs, the resolution of a turn's
paths. Two drivers use it:
tests/test_chat_state.py's hypothesis `RuleBasedStateMachine` (its rules pick what happens
next) and the pure seed mode of `toolwire sim` (simulation/pure_seed.py, where a seeded
schedule does), which subclasses it with a process model and file tools.

Every broken promise raises `Broken`, an `AssertionError` (hypothesis shrinks on it) that
carries a code in the checker's letters (simulation/checker.py): the same promise has the same
code in both modes of the simulation.
"""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any

from toolwire.actors.budget import AgentBudget
from toolwire.actors.chat_state import ChatConfig, ChatState
from toolwire.actors.effects import (
    Adopt,
    AlreadyExited,
    AttachRequest,
    CallEnded,
    CallRequest,
    CancelRequest,
    CancelTimer,
    CloseChatRequest,
    CloseFailed,
    Deadline,
    Detach,
    DropProcess,
    Effect,
    Follow,
    FollowMode,
    Forgotten,
    GroupEmpty,
    GroupGone,
    GroupLost,
    GroupStopped,
    Input,
    InterruptRequest,
    JournalApproveTool,
    JournalClose,
    JournalDelete,
    JournalFailed,
    JournalForgetApprovals,
    JournalReopen,
    JournalTouch,
    JournalWrite,
    KeptCall,
    KillAfter,
    KillGroup,
    MarkTimedOut,
    OutputClosed,
    ProcessExited,
    ProcessSnapshot,
    Publish,
    ReadBack,
    Recovered,
    ReleaseKept,
    ResolveTurn,
    Restored,
    ResultsRead,
    ResultsReadFailed,
    RunTool,
    Send,
    SendReplay,
    SendResult,
    ShrinkOutput,
    Shutdown,
    ShutdownDone,
    Spawn,
    Spawned,
    SpawnFailed,
    StartTimer,
    StopGroup,
    StopRun,
    ToolEnded,
    ToolFailed,
    ToolStopped,
    TurnPlanned,
    TurnRequest,
    WatchGroup,
)
from toolwire.actors.events import (
    AcceptedEvent,
    ApprovalEvent,
    ApprovalResolvedEvent,
    CancelResultEvent,
    ChatClosedEvent,
    InterruptedEvent,
    ResultEvent,
    StartedEvent,
    TurnPlanEvent,
    TurnResultEvent,
)
from toolwire.actors.journal_rows import JournalRow
from toolwire.actors.planner import BARRIER_RESERVATION, plan_segments
from toolwire.actors.reservations import reserve, reserve_at_once
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

FORGET_AFTER_S = 30.0
GATE_TIMEOUT_S = 20.0
EXITED_RETENTION_S = 60.0


class Broken(AssertionError):
    """A promise of PROTOCOL.md 5.0-5.7 is broken; `code` names it as the checker does."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"[{code}] {message}")
        self.code = code


def require(holds: bool, code: str, message: str) -> None:
    if not holds:
        raise Broken(code, message)


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
    shrunk: bool = False  # its retained output shrank to the result's size (5.2)
    exited_at: float | None = None  # when its shell was reaped
    dropped: bool = False  # it left the chat's process listing (5.2)


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
    turn_plans: Counter[str] = field(default_factory=Counter)
    turn_results: Counter[str] = field(default_factory=Counter)


def default_config(keeps: bool) -> ChatConfig:
    return ChatConfig(
        max_processes_per_chat=3,
        forget_after_s=FORGET_AFTER_S,
        kill_grace_s=2.0,
        approval_timeout_s=GATE_TIMEOUT_S,
        exited_retention_s=EXITED_RETENTION_S,
        journal_enabled=True,
        journal_keeps_results=keeps,
    )


class World:
    """The shell's part, done by hand: effects are carried out, what takes time waits."""

    def __init__(
        self,
        journal_keeps_results: bool,
        *,
        chat_id: str = "c",
        config: ChatConfig | None = None,
        state_class: type[ChatState] = ChatState,
        cache_entries: int = 2,
        spawn_replies_later: bool = False,
    ) -> None:
        self.keeps = journal_keeps_results
        # The keeper's reply to a spawn comes when the driver says (`spawn_answered`), not in
        # the drain of the `Spawn` itself.
        self.spawn_replies_later = spawn_replies_later
        self.chat_id = chat_id
        self.config = config if config is not None else default_config(journal_keeps_results)
        self.state_class = state_class
        # A small cache by default: read-backs happen all the time.
        self.cache_entries = cache_entries
        self.now = 0.0
        self.wall_ms = 1_000_000
        self.generation = 0
        # The journal: committed rows survive a restart, pending ones do not.
        self.committed: dict[str, JournalRow] = {}
        self.approvals: set[str] = set()
        self.closed_row = False  # the chat's close (9.6) is committed
        self.pending_writes: list[Any] = []
        self.refusals = 0  # how many of the next journal writes fail
        self.close_refusals = 0  # how many of the next close rows the journal refuses
        self.close_refused = False  # a close row was refused: its chat_closed is not durable
        # A close row of this generation was durable: dropped since only because every record
        # was forgotten while the close still stopped a group, which 9.6 allows.
        self.close_was_durable = False
        # Calls a failed read-back answered `unknown` for, by life: that answer is not their
        # saved result (which stays on disk, untouched), so it does not count as one.
        self.unreadable: set[tuple[str, int]] = set()
        self.unsaved: set[tuple[str, int]] = set()  # results answered from memory only
        # Calls whose spawn the shell gave up on (by life): each must end `unknown`. Calls a
        # cancel, an interrupt, a close or the shutdown named while they were being spawned
        # (by life): their `Spawned` must stop them at once.
        self.spawns_given_up: set[tuple[str, int]] = set()
        self.stops_owed: set[tuple[str, int]] = set()
        self.inbox: deque[Input] = deque()
        # Effects of calls, counted per life of a record (a forgotten record's id is new).
        self.life: Counter[str] = Counter()
        # The life each committed row belongs to: a restart brings back that record.
        self.row_life: dict[str, int] = {}
        self.effects_run: Counter[tuple[str, int]] = Counter()
        self.read_only_runs: Counter[tuple[str, int, int]] = Counter()
        self.results_seen: dict[tuple[str, int], Result] = {}
        self.owed: dict[Any, Owed] = {}
        self.turn_calls: dict[str, list[str]] = {}
        self.refusal: ToolwireError | None = None
        # Where a turn's paths resolve: it does not exist, so nothing on disk is followed.
        self.workspace = "/ws"
        self.new_state()

    def conn_names(self) -> list[Any]:
        """The connections of a new generation of the agent."""
        return [f"a{self.generation}", f"b{self.generation}"]

    def new_state(self) -> None:
        # Limits no program reaches: the chat counts what it holds in the agent's budget as it
        # would in an agent, so that the count can be checked against what it holds.
        self.budget = AgentBudget(max_records=10**9, max_processes=10**9)
        self.state = self.state_class(
            self.chat_id, self.config, ResultCache(max_entries=self.cache_entries), self.budget
        )
        self.procs: dict[str, Proc] = {}
        self.tasks: dict[str, str] = {}  # call_id -> "search" | "wait": a tool on a task
        self.timers: dict[tuple[str, str], Input] = {}
        self.reads: list[tuple[str, ...]] = []
        self.conns = self.conn_names()
        for conn in self.conns:
            self.owed[conn] = Owed()
        # What the shell's follows hold, from the effects alone: who follows each call, and
        # which (connection, call) has had the `accepted` of a request that streams (or that
        # brings `approval_resolved`: a turn's calls) sent, so may get those events.
        self.follows: dict[str, set[Any]] = {}
        self.streams: set[tuple[Any, str]] = set()
        self.resolved: set[tuple[Any, str]] = set()
        # Per (connection, call): the requests made that each wait for one result or replay
        # (a call, an attach, a streamed turn's calls), the replays queued and not sent yet,
        # and where the shell's output cursor is.
        self.asked: Counter[tuple[Any, str]] = Counter()
        self.replays_owed: Counter[tuple[Any, str]] = Counter()
        self.cursors: dict[tuple[Any, str], int] = {}
        self.asking: Input | None = None  # the request being handled
        self.handling: Input | None = None  # the input being handled (a request or a report)
        self.group_failures = 0  # how many of the next steps on a process group fail at once
        # Groups every step on which fails (the kernel refuses every look at them, as under a
        # seccomp filter: tests/test_group_lost.py), the SIGKILL after the failure too.
        self.broken_groups: set[str] = set()
        # The step that failed on each group the shell reported lost (`GroupLost`), until the
        # chat has handled the report.
        self.lost_steps: dict[str, type] = {}
        # Turns whose paths the shell is resolving (`ResolveTurn`), until it feeds `TurnPlanned`;
        # the plan each turn must get from what was fed; and the `turn` requests of each turn
        # not planned yet, in order: they are answered once it is.
        self.resolving: dict[str, ResolveTurn] = {}
        self.plans: dict[str, list[list[str]]] = {}
        self.unplanned_asks: dict[str, deque[TurnRequest]] = {}
        # Commands the keeper was asked to spawn (`Spawn`) whose reply has not been fed yet
        # (`spawn_answered`).
        self.spawning: dict[str, Spawn] = {}

    # -- feeding -------------------------------------------------------------------------------

    def request(self, event: Input) -> bool:
        """A request: True if accepted, False if refused (then nothing may have changed)."""
        before = self.fingerprint()
        self.asking = self.handling = event
        try:
            effects = self.state.handle(event, self.now, self.wall_ms)
        except ToolwireError as refusal:
            self.asking = None
            self.refusal = refusal  # what the Session would answer with (an `error`)
            require(
                self.fingerprint() == before,
                "b.refusal_changed",
                "a refused request changed the chat",
            )
            return False
        self.carry_out(effects)
        self.asking = None
        self.stops_while_spawning(event)
        if isinstance(event, CallRequest | AttachRequest):
            call_id = event.spec.call_id if isinstance(event, CallRequest) else event.call_id
            self.asked[(event.conn, call_id)] += 1
        elif isinstance(event, TurnRequest):
            run = self.state.turns.get(event.turn_id)
            if run is not None and run.segments is None:
                # Answered once its plan is known (PROTOCOL.md 5.6: `turn_plan` first).
                self.unplanned_asks.setdefault(event.turn_id, deque()).append(event)
        self.drain()
        return True

    def stops_while_spawning(self, event: Input) -> None:
        """A request that stops a command (5.3, 5.7, 9.6, 9.3), taken while the command is
        still being spawned: owed a stop once its `Spawned` comes."""
        if isinstance(event, CancelRequest):
            named = set(event.call_ids)
        elif isinstance(event, CloseChatRequest | Shutdown):
            named = set(self.spawning)
        elif isinstance(event, InterruptRequest):
            run = self.state.turns.get(event.turn_id) if event.turn_id else None
            turn_calls = set(run.call_ids) if run is not None else set()
            named = set()
            for call_id in self.spawning:
                record = self.state.records.get(call_id)
                if (
                    event.turn_id is None
                    or call_id in turn_calls
                    or (record is not None and record.turn_id == event.turn_id)
                ):
                    named.add(call_id)
        else:
            return
        for call_id in named & set(self.spawning):
            self.stops_owed.add((call_id, self.life[call_id]))

    def asked_for(self, key: tuple[Any, str]) -> int:
        """Requests on the connection still waiting for the call's live result (not for a
        replay): what a detach must keep the follow for (PROTOCOL.md 9.9)."""
        owed = self.owed[key[0]]
        return self.asked[key] - owed.results[key[1]] - self.replays_owed[key]

    def streams_asked(self) -> tuple[bool, bool]:
        """Whether the request being handled streams, and whether it brings
        `approval_resolved` without streaming (a `stream: false` turn)."""
        asking = self.asking
        if isinstance(asking, AttachRequest):
            return True, False
        if isinstance(asking, CallRequest):
            return asking.stream, False
        if isinstance(asking, TurnRequest):
            return asking.stream, not asking.stream
        return False, False

    def feed(self, event: Input) -> None:
        self.inbox.append(event)
        self.drain()

    def drain(self) -> None:
        while self.inbox:
            event = self.inbox.popleft()
            self.handling = event
            held = isinstance(event, GroupLost) and event.call_id in self.state.groups
            effects = self.state.handle(event, self.now, self.wall_ms)
            if isinstance(event, GroupLost):
                self.check_group_lost(event.call_id, held, effects)
            if isinstance(event, Spawned):
                self.check_spawned(event.call_id, effects)
            elif isinstance(event, Shutdown):
                self.stops_while_spawning(event)  # fed, not requested
            self.carry_out(effects)
            self.asking = None  # a turn request answered with its plan (`sent`)

    def check_group_lost(self, call_id: str, held: bool, effects: list[Effect]) -> None:
        """A step on a group failed in the shell, and nothing more will be reported of it
        unless the chat acts: the call is over (`unknown` if it still ran), the group gets
        SIGKILL, and a group whose SIGKILL is what failed is given up, so that nothing (a
        cancel, a close, the shutdown) waits for it forever."""
        step = self.lost_steps.pop(call_id)
        record = self.state.records.get(call_id)
        require(
            record is None or record.done,
            "k.lost_call_running",
            f"{call_id}: its group was lost and the call still runs",
        )
        if not held:
            return
        if step is KillGroup:
            require(
                call_id not in self.state.groups,
                "k.lost_group_held",
                f"{call_id}: its SIGKILL failed and the chat still holds the group",
            )
            return
        require(
            any(isinstance(e, KillGroup) and e.call_id == call_id for e in effects)
            or call_id not in self.state.groups,
            "k.lost_group_not_killed",
            f"{call_id}: a step on its group failed and the group got no SIGKILL",
        )

    def check_spawned(self, call_id: str, effects: list[Effect]) -> None:
        """A stop asked while the command was being spawned is never lost: the `Spawned`
        stops its group at once, as a cancel of a running command does (5.3)."""
        if (call_id, self.life[call_id]) not in self.stops_owed:
            return
        require(
            any(isinstance(e, StopGroup) and e.call_id == call_id and e.canceled for e in effects),
            "s.stop_while_spawning_lost",
            f"{call_id}: stopped while it was being spawned, and its Spawned did not stop it",
        )

    def check_not_spawning(self, effect: Effect) -> None:
        """Nothing is done to a command before its `Spawned`: no signal, no watch, no timer,
        no `started` (its process is not the shell's yet: the keeper has not answered)."""
        call_id: str | None = None
        if isinstance(effect, StopGroup | KillGroup | WatchGroup | MarkTimedOut | DropProcess):
            call_id = effect.call_id
        elif isinstance(effect, StartTimer) and effect.key[1] in ("deadline", "kill_after"):
            call_id = effect.key[0]
        elif isinstance(effect, Publish) and isinstance(effect.event, StartedEvent):
            call_id = effect.call_id
        require(
            call_id is None or call_id not in self.spawning,
            "s.acted_before_spawned",
            f"{call_id}: {type(effect).__name__} before the keeper answered its spawn",
        )

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
            self.check_not_spawning(effect)
            if isinstance(effect, Follow):
                self.follow(effect)
            elif isinstance(effect, Send | SendResult | SendReplay):
                if isinstance(effect, SendReplay):
                    self.replay(effect)
                self.sent(effect.conn, effect.event)
            elif isinstance(effect, Publish):
                self.publish(effect)
            elif isinstance(effect, Detach):
                self.detach(effect)
            elif isinstance(effect, JournalWrite) and self.refusals:
                self.refusals -= 1  # the disk is full: the journal refuses this row
                self.inbox.append(JournalFailed(effect.row.call_id))
            elif isinstance(effect, JournalClose) and self.close_refusals:
                self.close_refusals -= 1
                self.close_refused = True
                self.inbox.append(CloseFailed())
            elif isinstance(effect, JournalWrite):
                self.pending_writes.append(
                    Written(effect.row, effect.then, self.life[effect.row.call_id])
                )
            elif isinstance(
                effect,
                JournalTouch
                | JournalDelete
                | JournalApproveTool
                | JournalForgetApprovals
                | JournalClose
                | JournalReopen,
            ):
                self.pending_writes.append(effect)
            elif isinstance(effect, RunTool):
                self.run_tool(effect)
            elif isinstance(effect, StopRun):
                self.stop_run(effect)
            elif isinstance(effect, Spawn):
                self.spawn(effect)
            elif isinstance(effect, StopGroup | KillGroup | WatchGroup) and (
                self.group_failures or effect.call_id in self.broken_groups
            ):
                # The shell could not carry the step out (it logged why): ChatState is told.
                if effect.call_id not in self.broken_groups:
                    self.group_failures -= 1
                proc = self.procs.get(effect.call_id)
                if proc is not None and proc.stopping == "waiting":
                    proc.stopping = None  # its SIGKILL never went: it lives on its own
                self.lost_steps[effect.call_id] = type(effect)
                self.inbox.append(GroupLost(effect.call_id))
            elif isinstance(effect, StopGroup):
                self.check_stop(effect)
                self.stop_group(effect)
            elif isinstance(effect, KillGroup):
                self.kill_group(effect)
            elif isinstance(effect, WatchGroup):
                self.watch_group(effect)
            elif isinstance(effect, StartTimer):
                self.start_timer(effect)
            elif isinstance(effect, CancelTimer):
                self.timers.pop(effect.key, None)
            elif isinstance(effect, ReadBack):
                self.reads.append(effect.call_ids)
            elif isinstance(effect, ResolveTurn):
                self.resolve_turn(effect)
            elif isinstance(effect, Forgotten):
                self.life[effect.call_id] += 1
                self.unfollow(effect.call_id)
            elif isinstance(effect, ShutdownDone):
                self.shutdown_done()
            elif isinstance(effect, ShrinkOutput):
                self.shrink_output(effect)
            elif isinstance(effect, DropProcess):
                self.drop_process(effect)
            elif isinstance(effect, Adopt):
                self.adopt(effect)
            elif isinstance(effect, ReleaseKept):
                self.release_kept(effect)
            elif isinstance(effect, CallEnded | MarkTimedOut):
                pass
            else:  # pragma: no cover - a new effect the machine must learn
                raise AssertionError(f"unknown effect {effect!r}")

    # The hooks a driver with a model of the world overrides (pure_seed.SeedWorld).

    def follow(self, effect: Follow) -> None:
        key = (effect.conn, effect.call_id)
        # Before this request: does an earlier one on the connection still owe the output
        # it streams?
        owes_output = key in self.streams and self.asked_for(key) > 0
        for event in effect.events:
            self.sent(effect.conn, event)
        self.follows.setdefault(effect.call_id, set()).add(effect.conn)
        stream, resolved = self.streams_asked()
        if stream:
            self.streams.add(key)
        if resolved:
            self.resolved.add(key)
        if isinstance(self.asking, TurnRequest) and self.asking.stream:
            # A streamed turn's call waits for its one result like a `call` (5.0), from the
            # moment its request follows it (once the turn is planned).
            self.asked[key] += 1
        if effect.mode == FollowMode.REPLAY:
            self.replays_owed[key] += 1
            return
        # How the connection follows from now on: streaming since any request asked for it
        # (until a detach), `approval_resolved` too after a `stream: false` turn.
        require(
            effect.stream == (key in self.streams),
            "b.stream_decided",
            f"{effect.call_id}: follow says stream={effect.stream} to {effect.conn}",
        )
        require(
            effect.resolved_events == (key in self.resolved),
            "b.stream_decided",
            f"{effect.call_id}: follow says resolved_events={effect.resolved_events}",
        )
        if effect.mode == FollowMode.LIVE:
            # PROTOCOL.md 9.9: the cursor goes to the requested offset, but only back while an
            # earlier request on the connection still owes output (the shell's rule applied to
            # what ChatState decided, checked against what the requests asked).
            wanted = effect.from_offset or 0
            old = self.cursors.get(key, 0)
            cursor = min(old, wanted) if effect.rewind_only else wanted
            expected = min(old, wanted) if owes_output else wanted
            require(
                cursor == expected,
                "b.cursor_skips",
                f"{effect.call_id}: cursor of {effect.conn} at {cursor}, not {expected} "
                f"(was {old}, asked {wanted})",
            )
            self.cursors[key] = cursor
        if effect.started is not None:
            self.streamed(effect.conn, effect.call_id, effect.started)

    def replay(self, effect: SendReplay) -> None:
        self.replays_owed[(effect.conn, effect.call_id)] -= 1

    def publish(self, effect: Publish) -> None:
        if isinstance(effect.event, ApprovalEvent):
            self.check_turn_start(effect.call_id)  # a gate parks as its call's turn starts it
        for conn in self.published_to(effect):
            self.streamed(conn, effect.call_id, effect.event)

    def published_to(self, effect: Publish) -> list[Any]:
        """The connections the shell puts a published event to."""
        if effect.to is not None:
            return list(effect.to)
        return sorted(self.follows.get(effect.call_id, ()))

    def detach(self, effect: Detach) -> None:
        key = (effect.conn, effect.call_id)
        # The follow stays exactly while a request on the connection waits for the call's
        # live result (a queued replay goes out without it).
        require(
            effect.keep == (self.asked_for(key) > 0),
            "b.detach_keep",
            f"{effect.call_id}: detach keep={effect.keep} with {self.asked_for(key)} owed",
        )
        self.streams.discard(key)
        self.resolved.discard(key)
        if not effect.keep:
            self.follows.get(effect.call_id, set()).discard(effect.conn)

    def unfollow(self, call_id: str) -> None:
        """The record is gone: its follows stop."""
        for conn in self.follows.pop(call_id, ()):
            self.streams.discard((conn, call_id))
            self.resolved.discard((conn, call_id))

    def streamed(self, conn: Any, call_id: str, event: Any) -> None:
        """PROTOCOL.md 9.9: no event of a call reaches a connection before the `accepted` of a
        request that makes the connection receive it; a `stream: false` request (of a call)
        never brings `started` (nor `output`, which follows the same streams)."""
        if isinstance(event, StartedEvent):
            require(
                (conn, call_id) in self.streams,
                "b.event_before_accepted",
                f"{call_id}: started to {conn}, which no request asked to stream it",
            )
        elif isinstance(event, ApprovalResolvedEvent):
            require(
                (conn, call_id) in self.streams or (conn, call_id) in self.resolved,
                "b.event_before_accepted",
                f"{call_id}: approval_resolved to {conn}, which no request asked for it",
            )

    def drop_process(self, effect: DropProcess) -> None:
        """5.2: exited processes stay listed for `exited_retention_s` after their exit."""
        proc = self.procs.get(effect.call_id)
        require(
            proc is not None
            and proc.exited_at is not None
            and proc.output_closed
            and proc.exited_at + self.config.exited_retention_s <= self.now,
            "p.dropped_early",
            f"{effect.call_id}: dropped from the listing before its retention ran out",
        )
        assert proc is not None
        proc.dropped = True

    def check_listing(self) -> None:
        """After a sweep: every process past its retention has left the listing (5.2)."""
        for call_id, proc in self.procs.items():
            require(
                proc.dropped
                or proc.exited_at is None
                or not proc.output_closed
                or proc.exited_at + self.config.exited_retention_s > self.now,
                "p.listed_too_long",
                f"{call_id}: still listed {self.now - (proc.exited_at or 0):.0f}s after its exit",
            )

    def shrink_output(self, effect: ShrinkOutput) -> None:
        """5.2: an exited command's retained output shrinks to the result's size, but never
        while something could still print to it."""
        proc = self.procs.get(effect.call_id)
        require(
            proc is not None and proc.output_closed,
            "p.shrunk_early",
            f"{effect.call_id}: its output shrinks while the command may still print",
        )
        assert proc is not None
        proc.shrunk = True

    def kept_for(self, row: JournalRow) -> KeptCall | None:
        """What the keeper held of a row's command at a restart (PROTOCOL.md 10.1): nothing in
        this World (its commands die with the agent); pure_seed.SeedWorld models the keeper."""
        return None

    def adopt(self, effect: Adopt) -> None:
        raise AssertionError(f"nothing was kept to adopt: {effect!r}")  # pragma: no cover

    def release_kept(self, effect: ReleaseKept) -> None:
        raise AssertionError(f"nothing was kept to release: {effect!r}")  # pragma: no cover

    def shutdown_done(self) -> None:
        """The chat's part of a shutdown is over (the agent then makes the journal durable)."""

    def resolve_turn(self, effect: ResolveTurn) -> None:
        """As actors/chat.py does: a turn none of whose calls names a path is planned at once,
        in the same drain; any other waits for its paths (`paths_resolved`), on a worker
        thread in the shell, while other inputs may come."""
        require(
            effect.turn_id not in self.resolving,
            "d.resolved_twice",
            f"turn {effect.turn_id}: resolved again while its paths are being resolved",
        )
        at_once = reserve_at_once(effect.specs)
        if at_once is None:
            self.resolving[effect.turn_id] = effect
            return
        self.planned(effect, TurnPlanned(effect.turn_id, at_once))
        self.inbox.append(TurnPlanned(effect.turn_id, at_once))

    def paths_resolved(self, turn_id: str, *, fails: bool = False) -> None:
        """The worker thread resolving the turn's paths is done (or it raised)."""
        effect = self.resolving.pop(turn_id)
        if fails:
            planned = TurnPlanned(turn_id, (), failure="OSError: simulated")
        else:
            planned = TurnPlanned(turn_id, reserve(effect.specs, self.workspace))
        self.planned(effect, planned)
        self.feed(planned)

    def planned(self, effect: ResolveTurn, planned: TurnPlanned) -> None:
        """The plan the turn must get from what the shell feeds (each call alone if nothing is
        known of what they touch)."""
        ids = [spec.call_id for spec in effect.specs]
        held = planned.reservations
        if planned.failure is not None:
            held = (BARRIER_RESERVATION,) * len(ids)
        self.plans[effect.turn_id] = plan_segments(ids, held)

    def stop_run(self, effect: StopRun) -> None:
        if self.tasks.pop(effect.call_id, None) is not None:
            self.inbox.append(ToolStopped(effect.call_id))

    def spawn(self, effect: Spawn) -> None:
        """As actors/chat_work.py does with a keeper: the request goes to the keeper, which
        may start the command at once; its reply (`spawn_answered`) comes later, while other
        inputs may come (`spawn_replies_later`; else at once, as without a keeper)."""
        require(
            effect.call_id not in self.spawning,
            "s.spawned_twice",
            f"{effect.call_id}: spawned again while its first spawn is unanswered",
        )
        self.started(effect.call_id, read_only=False)
        if not self.spawn_replies_later:
            self.procs[effect.call_id] = Proc()
            self.inbox.append(Spawned(effect.call_id, 4242, self.snapshot(effect.call_id)))
            return
        self.spawning[effect.call_id] = effect

    def spawn_answered(self, call_id: str, how: str = "spawned") -> None:
        """The keeper's reply to a spawn: "spawned" (the command runs), "failed" (it could not
        spawn it), or "unanswered" (it went or said nothing in time: the shell gives up, and the
        call must end `unknown`)."""
        del self.spawning[call_id]
        if how == "spawned":
            self.procs[call_id] = Proc()
            self.feed(Spawned(call_id, 4242, self.snapshot(call_id)))
        elif how == "failed":
            self.feed(SpawnFailed(call_id, "simulated: no such file"))
        else:
            self.spawns_given_up.add((call_id, self.life[call_id]))
            self.feed(ToolFailed(call_id))

    def check_stop(self, effect: StopGroup) -> None:
        """What a stop tells the command's listing, from why it happens (5.3, 9.2, 9.3, 9.6):
        its hard deadline: `timed_out`, and only a group with a member alive is stopped; what
        lingers of a spent group at a close or a shutdown: neither flag, only if alive; any
        other stop a client asked for: `canceled`."""
        why = self.handling
        if isinstance(why, KillAfter):
            expected = (True, True, False)
        elif isinstance(why, AlreadyExited):
            expected = (False, False, True)  # what the call left holding its pipe
        else:
            lingers = self.spent(effect.call_id) and isinstance(why, CloseChatRequest | Shutdown)
            expected = (True, False, False) if lingers else (False, False, True)
        got = (effect.only_if_alive, effect.timed_out, effect.canceled)
        require(
            got == expected,
            "p.stop_flags",
            f"{effect.call_id}: a stop for {type(why).__name__} says (only_if_alive, timed_out, "
            f"canceled) {got}, not {expected}",
        )

    def spent(self, call_id: str) -> bool:
        """The command's shell was reaped and its output ended (as ChatState was told)."""
        proc = self.procs.get(call_id)
        return proc is not None and proc.state == "reaped" and proc.output_closed

    def stop_group(self, effect: StopGroup) -> None:
        proc = self.procs[effect.call_id]
        if effect.unless_exited and proc.state != "running":
            self.inbox.append(AlreadyExited(effect.call_id))
        elif effect.only_if_alive and proc.state == "reaped":
            self.inbox.append(AlreadyExited(effect.call_id))  # no member left
        else:
            proc.stopping = "term"

    def kill_group(self, effect: KillGroup) -> None:
        self.procs[effect.call_id].stopping = "kill"

    def watch_group(self, effect: WatchGroup) -> None:
        # This model has no member beyond the shell: a spent group is empty.
        self.inbox.append(GroupGone(effect.call_id))

    def start_timer(self, effect: StartTimer) -> None:
        self.timers[effect.key] = effect.fire

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
        self.check_turn_start(call_id)
        key = (call_id, self.life[call_id])
        if read_only:
            # Changes nothing: it may run again after a restart (no start row is kept).
            self.read_only_runs[(call_id, self.life[call_id], self.generation)] += 1
            require(
                self.read_only_runs[(call_id, self.life[call_id], self.generation)] == 1,
                "a.read_twice",
                f"{call_id}: a read ran twice in one generation",
            )
            return
        self.effects_run[key] += 1
        require(self.effects_run[key] == 1, "a.effect_twice", f"{call_id} ran twice")
        row = self.committed.get(call_id)
        require(
            row is not None and row.state == "running",
            "a.effect_not_durable",
            f"{call_id} ran before its start row",
        )

    def sent(self, conn: Any, event: Any) -> None:
        owed = self.owed[conn]
        if isinstance(event, AcceptedEvent):
            owed.accepted[event.call_id] += 1
        elif isinstance(event, ResultEvent):
            owed.results[event.call_id] += 1
            require(
                owed.results[event.call_id] <= owed.accepted[event.call_id],
                "b.result_unasked",
                f"{event.call_id}: more results than requests",
            )
            self.check_result(event.call_id, event.result)
        elif isinstance(event, CancelResultEvent):
            owed.cancel_results += 1
            require(
                owed.cancel_results <= owed.cancels,
                "k.cancel_result_unasked",
                f"{event.call_id}: a cancel_result no cancel asked for",
            )
            self.check_result(event.call_id, event.result)
        elif isinstance(event, InterruptedEvent):
            owed.interrupted += 1
            require(
                owed.interrupted <= owed.interrupts,
                "i.interrupted_unasked",
                "an interrupted no interrupt asked for",
            )
        elif isinstance(event, ChatClosedEvent):
            owed.closed += 1
            require(owed.closed <= owed.closes, "b.closed_unasked", "a chat_closed unasked")
            # A close a client was told of survives a restart (until the records are gone).
            require(
                self.closed_row
                or self.close_was_durable
                or self.close_refused
                or not self.config.journal_enabled,
                "x.close_not_durable",
                "chat_closed before the close was durable",
            )
            # Nothing of what it stopped is left.
            require(
                not any(call_id in self.state.groups for call_id in event.process_ids),
                "p.close_left_group",
                "chat_closed while a group it stopped is still there",
            )
        elif isinstance(event, TurnResultEvent):
            owed.turn_results[event.turn_id] += 1
            require(
                owed.turn_results[event.turn_id] <= owed.turns[event.turn_id],
                "d.turn_result_unasked",
                f"turn {event.turn_id}: more turn_results than turn requests",
            )
            require(
                owed.turn_results[event.turn_id] <= owed.turn_plans[event.turn_id],
                "d.sent_before_plan",
                f"turn {event.turn_id}: a turn_result before its turn_plan",
            )
            calls = self.turn_calls[event.turn_id]
            # In request order, each the call's one result.
            require(
                len(event.results) == len(calls),
                "d.turn_result_count",
                f"turn {event.turn_id}: {len(event.results)} results for {len(calls)} calls",
            )
            for call_id, result in zip(calls, event.results, strict=True):
                self.check_result(call_id, result)
        elif isinstance(event, TurnPlanEvent):
            self.turn_plan_sent(conn, event)

    def turn_plan_sent(self, conn: Any, event: TurnPlanEvent) -> None:
        """5.6: a turn is planned with what its calls reserve, resolved by the shell (which
        reads the filesystem, so never inside ChatState); nothing of the turn goes out before
        its `turn_plan`. A request answered now, after its turn's plan came, follows the turn's
        calls from here (`asking`)."""
        self.owed[conn].turn_plans[event.turn_id] += 1
        require(
            event.turn_id not in self.resolving and self.plans.get(event.turn_id) == event.segments,
            "d.plan_before_resolved",
            f"turn {event.turn_id}: turn_plan {event.segments} to {conn}, while the plan its "
            f"resolved paths give is {self.plans.get(event.turn_id, 'not known yet')}",
        )
        if isinstance(self.handling, TurnPlanned):
            asks = self.unplanned_asks.get(event.turn_id)
            ask = asks.popleft() if asks else None
            require(
                ask is not None and ask.conn == conn and ask.rid == event.rid,
                "d.plan_unasked",
                f"turn {event.turn_id}: a turn_plan to {conn} for no request waiting for it",
            )
            self.asking = ask

    def check_turn_start(self, call_id: str) -> None:
        """A call a turn created starts (or parks at its gate) only under a turn that is
        planned: never while what the calls reserve is still being resolved. (A record the turn
        found, such as a gate restored after a restart, is not the turn's to hold back.)"""
        turns = self.state.turns.values()
        held_back = any(
            run.segments is None and run.asks and call_id in run.asks[0].created for run in turns
        )
        require(
            not held_back
            or any(run.segments is not None and call_id in run.members for run in turns),
            "d.started_unplanned",
            f"{call_id} starts before the turn that created it is planned",
        )

    def check_result(self, call_id: str, result: Result) -> None:
        """Results never contradict each other, and none goes out before it is durable."""
        key = (call_id, self.life[call_id])
        row = self.committed.get(call_id)
        saved = row.result if row is not None else None
        if key in self.unreadable and result.outcome is Outcome.UNKNOWN and result != saved:
            # Its read-back failed: answered `unknown` (the agent cannot say now), while the
            # saved result stays on disk as it was, for a later repeat. (A saved result that is
            # itself `unknown`, read back later, is checked as any other below.)
            require(
                result.text == TEXT_AGENT_FAILURE and row is not None and row.result is not None,
                "b.unreadable_answer",
                f"{call_id}: a failed read-back answered {result} (row {row})",
            )
            return
        seen = self.results_seen.setdefault(key, result)
        require(
            seen == result,
            "b.results_differ",
            f"{call_id}: two different results {seen} / {result}",
        )
        row = self.committed.get(call_id)
        if result.text in (TEXT_AGENT_FAILURE, TEXT_AGENT_FAILURE_BEFORE_RUN) and (
            row is None or row.result != result
        ):
            # The journal refused its rows: the failure is answered from memory, and a restart
            # finds the row before it (or none): PROTOCOL.md 9.9 says so.
            self.unsaved.add(key)
        else:
            require(
                row is not None and row.result == result,
                "b.not_durable",
                f"{call_id}: sent before durable",
            )
        if key in self.spawns_given_up:
            require(
                result.outcome is Outcome.UNKNOWN,
                "s.unanswered_spawn_not_unknown",
                f"{call_id}: its spawn went unanswered (it may run) and it says {result.outcome}",
            )
        if key in self.stops_owed and result.tool == "execute":
            require(
                result.outcome in (Outcome.CANCELED, Outcome.FAILED, Outcome.UNKNOWN),
                "s.stop_while_spawning_lost",
                f"{call_id}: stopped while it was being spawned, and it says {result.outcome}",
            )
        ran = self.effects_run[key] > 0
        if result.outcome in (Outcome.NOT_RUN, Outcome.DENIED):
            require(
                not ran,
                "c.not_run_with_effect",
                f"{call_id} says {result.outcome} but its effect happened",
            )
        # A cancel of a forgotten call whose command still runs stops that command: it ran.
        ran = ran or (result.tool == "execute" and call_id in self.procs)
        if result.outcome in (Outcome.COMPLETED, Outcome.CANCELED, Outcome.TIMED_OUT):
            tool = result.tool
            if tool and not TOOLS[tool].read_only:
                require(ran, "c.no_effect", f"{call_id} says {result.outcome} but never ran")

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
            elif isinstance(effect, JournalClose):
                self.closed_row = self.close_was_durable = True
                self.inbox.append(effect.then)
            elif isinstance(effect, JournalReopen):
                self.closed_row = False
        self.drain()

    def restart(self) -> None:
        """The agent dies: what was not committed is lost, and so are the connections."""
        self.pending_writes.clear()
        self.inbox.clear()
        self.close_was_durable = False
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
            self.request(Restored(row, self.now - 1.0, self.kept_for(row)))
        approvals = set(self.approvals)
        if approvals or self.closed_row:
            self.request(Recovered(tuple(sorted(approvals)), self.closed_row))
        # 9.6: still closed while it has records, else gone (its row dropped); 9.5: the same
        # for the approvals.
        require(
            self.state.closed == (self.closed_row and bool(self.state.records)),
            "x.close_not_restored",
            "after a restart the chat is closed exactly when its close survived with records",
        )
        require(
            set(self.state.approved_tools) == (approvals if self.state.records else set()),
            "x.approvals_not_restored",
            "after a restart the chat's approvals hold exactly while it has records",
        )
        self.commit(len(self.pending_writes))
        require(
            bool(self.state.records) or not (self.closed_row or self.approvals),
            "x.stale_rows",
            "a chat with no record kept its close or approval rows",
        )
        self.commit(len(self.pending_writes))  # recovery is durable before requests come

    def quiesce(self) -> None:
        """Let everything pending happen, until nothing is left."""
        for _ in range(200):
            if self.spawning:
                self.spawn_answered(next(iter(self.spawning)))
            elif self.resolving:
                self.paths_resolved(next(iter(self.resolving)))
            elif self.pending_writes:
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
        raise Broken("l.never_quiet", "the chat never became quiet")

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
        proc.exited_at = self.now
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

    def read_back(self, *, fails: bool = False) -> None:
        call_ids = self.reads.pop(0)
        if fails:
            # The journal's read failed, every retry too (the shell's part).
            for call_id in call_ids:
                self.unreadable.add((call_id, self.life[call_id]))
            self.feed(ResultsReadFailed(call_ids))
            return
        found = {}
        for call_id in call_ids:
            row = self.committed.get(call_id)
            require(
                row is not None and row.result is not None,
                "b.read_back_missing",
                f"read-back of {call_id} failed",
            )
            assert row is not None and row.result is not None
            found[call_id] = row.result
        self.feed(ResultsRead(found))

    def check_all_answered(self) -> None:
        for call_id, proc in self.procs.items():
            # 5.2: an idle agent holds at most the result's size of an exited process.
            require(
                proc.shrunk or not proc.output_closed,
                "p.output_kept",
                f"{call_id}: its output ended but keeps the full retention",
            )
        for conn, owed in self.owed.items():
            if conn not in self.conns:
                continue  # a connection of an agent that died: its replies died with it
            require(
                owed.results == owed.accepted, "b.result_missing", f"{conn}: one result per request"
            )
            require(
                owed.cancel_results == owed.cancels,
                "k.cancel_result_missing",
                f"{conn}: one cancel_result per call id of each cancel",
            )
            require(
                owed.interrupted == owed.interrupts,
                "i.interrupted_missing",
                f"{conn}: one interrupted per interrupt",
            )
            require(owed.closed == owed.closes, "b.closed_missing", f"{conn}: one chat_closed")
            require(
                owed.turn_results == owed.turns,
                "d.turn_result_missing",
                f"{conn}: one turn_result per turn request",
            )
