"""ChatState: every rule of PROTOCOL.md sections 5 and 9 that concerns one chat, in one place.

Everything that decides what a chat does lives in this file: admitting calls (run once per
call id), gates and approvals, starts that wait for the journal, cancels and interrupts,
results (one per call, durable before sent), who is owed which reply and in what order, turns,
forgetting and pins, and rebuilding after a restart. It is pure: no trio, no I/O and no clock
reads. `handle(input, now, wall_ms)` applies one input (a request, or a report of what happened:
see actors/effects.py) synchronously and returns the effects the shell must carry out, in
order. The shell (actors/chat.py) feeds what those effects report back in as new inputs.

A request that is refused raises `ToolwireError` before anything changes. Any other input
never raises for a reason a user caused.

The record table itself (one record per call id, its states and transitions) is the smaller
pure machine of actors/records.py; this module decides when each transition happens.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec

from toolwire.actors import call_results, planner
from toolwire.actors.budget import AgentBudget
from toolwire.actors.calls import CallSpec, conflict_error, shared_tool_name
from toolwire.actors.effects import (
    Adopt,
    Adopted,
    AlreadyExited,
    ApproveRequest,
    AttachRequest,
    CallEnded,
    CallRequest,
    CancelRequest,
    CancelTimer,
    CloseChatRequest,
    CloseDurable,
    CloseFailed,
    Conn,
    Deadline,
    Detach,
    DetachRequest,
    DropProcess,
    Effect,
    Follow,
    FollowMode,
    Forgotten,
    GateExpired,
    GraceOver,
    GroupEmpty,
    GroupGone,
    GroupLost,
    GroupStopped,
    HolderGone,
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
    ResultDurable,
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
    StartDurable,
    StartTimer,
    StopGroup,
    StopRun,
    Sweep,
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
    Event,
    InterruptedEvent,
    ResultEvent,
    Rid,
    StartedEvent,
    TurnPlanEvent,
    TurnResultEvent,
)
from toolwire.actors.journal_rows import JournalRow
from toolwire.actors.records import (
    Admission,
    CancelAction,
    RecordState,
    RecordTable,
    ToolCallRecord,
    args_fingerprint,
)
from toolwire.actors.result_cache import ResultCache
from toolwire.actors.results import (
    TEXT_AGENT_FAILURE,
    TEXT_AGENT_FAILURE_BEFORE_RUN,
    TEXT_AGENT_RESTARTED,
    TEXT_APPROVAL_EXPIRED,
    TEXT_CANCELED_BEFORE_RUN,
    TEXT_CANCELED_WHILE_RUNNING,
    TEXT_KEEPER_GONE,
    TEXT_SHUTDOWN,
    Outcome,
    Result,
    ToolwireError,
    text_denied,
    text_killed_after,
    text_unresolved,
)
from toolwire.actors.sandbox_policy import policy_from_row
from toolwire.actors.tools.execute import ExecuteArgs
from toolwire.actors.tools.registry import (
    TOOLS,
    ToolDef,
    ToolKind,
    lookup,
    parse_args,
)

# What `_out` and `_to_advance` hold between inputs (and `_to_advance` while an input queued
# no turn: `_advance_after` makes its list): one shared empty list instead of two per chat (ten
# thousand idle chats), and none made per input. Nothing is ever added to it.
_IDLE: list[Any] = []

# Where a closed chat's close row is (9.6): none (open, or no journal), queued (its
# `chat_closed` waits for it), durable (it survives a restart until the records are forgotten).
_NO_CLOSE_ROW = 0
_CLOSE_QUEUED = 1
_CLOSE_DURABLE = 2


# Ids one request may name: a `cancel`'s call_ids, a `turn`'s calls. Every path of this module
# is linear in what a request names (issue 27: a 20,000-id cancel once froze every chat for
# 28 s), and this bounds the line itself: at about 30 us an id, inside the agent and out,
# 1,000 ids hold the loop some 30 ms, well under the 100 ms a trivial call in another chat may
# wait. A model's turn holds a handful of calls, a cancel names what one turn started, and
# `interrupt`/`close_chat` end everything without naming it. Precedent: S3's DeleteObjects
# takes at most 1,000 keys a request, and Redis's MSET docs warn off unbounded argument lists
# for the same reason (one command holds the only thread). Reported in `welcome.limits`.
MAX_IDS_PER_REQUEST = 1_000


@dataclass(frozen=True)
class ChatConfig:
    """What every chat of one agent shares: policy and limits, no clocks and no I/O."""

    max_processes_per_chat: int
    forget_after_s: float
    kill_grace_s: float
    approve_tools: frozenset[str] = frozenset()
    approval_timeout_s: float | None = None
    # Rows are written at all (a MemoryJournal writes none: every row is "durable" at once).
    journal_enabled: bool = False
    # The journal holds results: a published result leaves the heap (see `ResultCache`).
    journal_keeps_results: bool = False
    max_ids_per_request: int = MAX_IDS_PER_REQUEST
    # How long an exited command stays listed for `process_output` (5.2).
    exited_retention_s: float = 3600.0


class Follower(msgspec.Struct, eq=False):
    """One connection following one call: how it follows and how many results it is owed.
    (Like `CallState`, a Struct: made per call, built in C.)"""

    stream: bool = False
    resolved_events: bool = False  # approval_resolved even without stream (a turn's calls)
    detached: bool = False
    owed: int = 0  # requests on this connection waiting for the call's result
    # Followed by `FollowMode.ANSWER` and by nothing since: the shell keeps no subscription,
    # so the results owed go out as `Send`.
    answer_only: bool = False


class CallState(msgspec.Struct, eq=False):
    """What the chat keeps for a call until its result is published (the record keeps the
    rest: state, outcome, result; a published call needs nothing else). A Struct, not a
    dataclass: one is made per call, and msgspec builds it in C (a dataclass's `__init__` runs
    three bytecodes a field, and it has thirteen)."""

    spec: CallSpec
    parsed: msgspec.Struct | None = None
    invalid: str | None = None  # why the args are unusable (turn calls only: fails when run)
    followers: dict[Conn, Follower] = msgspec.field(default_factory=dict)
    started: StartedEvent | None = None
    gate_open: bool = False
    # Between the start (the record says RUNNING) and the durable start that lets the effect
    # happen: a failure in between ends the call `not_run`, since nothing can have started.
    start_pending: bool = False
    # A wait (process_output, process_input) or a search that a cancel can end.
    stoppable: bool = False
    # The command's hard deadline (trio time), fixed at the first start (PROTOCOL.md 9.2).
    kill_at: float | None = None
    # Launched under its turn's "at most 8 at once": the turn gets the slot back at its end.
    turn: TurnState | None = None
    # Its result's row was refused and replaced by the agent-failure result (9.9).
    amended: bool = False
    # The `accepted` of a call that ends before anything else is sent for it, held to go out
    # with its result once that is durable (_answers_at_once).
    held_accepted: tuple[Conn, AcceptedEvent] | None = None
    # `Spawn` went out and neither `Spawned` nor `SpawnFailed` came back yet: the keeper may
    # be starting the command right now. A cancel, an interrupt, a close or the shutdown
    # meanwhile only marks the record (`cancel_requested`); `Spawned` then stops the group at
    # once (docs/durability.md, "While a command is spawned").
    spawning: bool = False


@dataclass(eq=False, slots=True)
class GroupState:
    """A command's process group, from its spawn until nothing of it is left to stop."""

    started_at_ms: int
    leader_exited: bool = False
    output_closed: bool = False
    # None, "term" (SIGTERM sent, the grace runs) or "kill" (SIGKILL sent, waiting for gone).
    stopping: str | None = None
    # A stop ever began: the call's result and the cancel replies say `canceled`.
    canceled: bool = False
    # Its hard deadline (ms) while it has not passed: the group is watched until then, also
    # after its shell exited (a member may live on without the output pipe).
    kill_after_ms: int | None = None
    # Its hard deadline passed with members alive: the stop is the deadline's, not a cancel's.
    killed_after: bool = False
    # Spent, but a member that writes elsewhere may live on: the shell watches the group until
    # it is empty (`WatchGroup`), and a close or a shutdown stops it meanwhile.
    watched: bool = False
    # A close or a shutdown is stopping what is left of this spent group ("linger"): if the
    # shell finds it empty, nothing of it is left to wait for, not even its hard deadline.
    lingering: bool = False

    @property
    def spent(self) -> bool:
        """Its shell exited and nothing holds its output pipe: no member that could still
        print is left to stop."""
        return self.leader_exited and self.output_closed


@dataclass(eq=False, slots=True)
class ListedProcess:
    """A command the chat's process listing shows (`process_list`, `process_output`), from its
    spawn until `exited_retention_s` after it exited and its output ended (5.2)."""

    exited_at: float | None = None  # trio time its shell exited
    output_closed: bool = False


@dataclass(eq=False, slots=True)
class TurnAsk:
    """A `turn` request for a turn whose plan is not known yet (its paths are being resolved):
    it is answered (`turn_plan`, then each call's events) once the plan is."""

    conn: Conn
    stream: bool
    rid: Rid
    created: frozenset[str]  # the calls this very request admitted as new
    # Each call's `requests` count with this request (its `accepted` says so, sent later).
    requests: tuple[int, ...]
    # The turn's calls this connection detached from after this request (9.9): detached again
    # once the request follows them.
    detached: list[str] = field(default_factory=list)


@dataclass(eq=False, slots=True)
class TurnState:
    """One turn of a chat: its calls in request order and the plan that runs them."""

    turn_id: str
    call_ids: list[str]
    fingerprint: bytes
    # None until the shell has resolved what the calls reserve (`ResolveTurn`, `TurnPlanned`):
    # meanwhile none of its calls starts and nothing of it is sent; its requests wait in `asks`.
    segments: list[list[str]] | None
    # One entry per `turn` request made while the turn runs: each gets its own turn_result.
    followers: list[Conn] = field(default_factory=list)
    segment: int = -1  # the segment running now
    # How many calls of the running segment, from its first, are known to be published (a
    # published call stays so while the turn pins it): each is checked once, not on every
    # result of the segment.
    segment_published: int = 0
    advancing: bool = False  # `_next_segment` is starting a segment
    to_advance: bool = False  # queued in the chat's `_to_advance` for this input
    running: int = 0  # calls holding one of its MAX_PARALLEL_CALLS slots
    waiting: deque[str] = field(default_factory=deque)  # launched, waiting for a slot
    # Which of `waiting` still wait: a call that ended while it waited (canceled) leaves this
    # at once and is skipped when its turn in `waiting` comes (no O(n) deque.remove).
    still_waiting: set[str] = field(default_factory=set)
    # `call_ids` as a set: "is this call one of the turn's" in O(1), not a scan per call.
    members: frozenset[str] = frozenset()
    # Every call has its published result. The results stay with the records (and the
    # journal): a repeated turn reads them from there, so a finished turn holds none.
    finished: bool = False
    done: bool = False  # its turn_result went to the followers
    asks: list[TurnAsk] = field(default_factory=list)  # while unplanned: its requests, in order


@dataclass(eq=False, slots=True)
class _Delivery:
    """Results owed to one reply, sent in request order with every other delivery."""

    call_ids: list[str]
    send: Callable[[list[Result]], list[Effect]]


# What a pending reply can wait on besides a call: a turn (the `TurnState` itself) or the
# chat's close row (this key).
_CLOSE_ROW_KEY = ("close row",)

# What a pending reply is blocked on now (a call id, a turn, `_CLOSE_ROW_KEY`), or None: it
# may go out.
_Blocker = str | TurnState | tuple[str] | None


@dataclass(eq=False, slots=True)
class _PendingReply:
    """A cancel_result, interrupted, chat_closed or the shutdown's end that waits until what it
    reports on is over. `blocker` says what it waits on now, or None once it may go out; it is
    asked again only when that thing changes (`_ReplyBook`), so a reply costs what it waits on,
    never the number of other replies pending."""

    seq: int
    blocker: Callable[[], _Blocker]
    fire: Callable[[], None]


class _ReplyBook:
    """The pending replies of one chat, filed by what each is blocked on.

    Issue 27: a 20,000-id cancel used to rescan every pending reply after every input (and
    `list.remove` each one sent), quadratic in the ids; every chat of the agent froze for 28 s.
    Here an input wakes only the replies filed under what it changed (its call, a turn that
    ended, the close row), so the work is linear in what the requests named."""

    __slots__ = ("by_blocker", "count", "next_seq", "woken")

    def __init__(self) -> None:
        self.by_blocker: dict[object, list[_PendingReply]] = {}
        # Replies to ask again at the end of this input, by request order.
        self.woken: dict[int, _PendingReply] = {}
        self.next_seq = 0
        self.count = 0  # pending: filed or woken

    def add(self, blocker: Callable[[], _Blocker], fire: Callable[[], None]) -> None:
        reply = _PendingReply(self.next_seq, blocker, fire)
        self.next_seq += 1
        self.count += 1
        self.woken[reply.seq] = reply  # asked at once, at the end of the input

    def wake(self, key: object) -> None:
        filed = self.by_blocker.pop(key, None)
        if filed is not None:
            for reply in filed:
                self.woken[reply.seq] = reply


class ChatState:
    """The state of one chat and the one place its decisions are made (module docstring)."""

    # Ten thousand chats: an instance dict would cost each about 500 bytes more.
    __slots__ = (
        "_active_turns",
        "_adopting",
        "_close_row",
        "_lane",
        "_lane_held",
        "_launching",
        "_listed",
        "_now",
        "_out",
        "_reading",
        "_replies",
        "_running_processes",
        "_segment_turns",
        "_to_advance",
        "_wall_ms",
        "approved_tools",
        "budget",
        "calls",
        "chat_id",
        "closed",
        "config",
        "groups",
        "records",
        "results",
        "shutting_down",
        "turns",
    )

    def __init__(
        self,
        chat_id: str,
        config: ChatConfig,
        results: ResultCache,
        budget: AgentBudget | None = None,
    ) -> None:
        self.chat_id = chat_id
        self.config = config
        # The agent-wide bounds (records, processes) this chat shares with every other, kept
        # up to date as records and process slots come and go (the record table counts the
        # records, `_hold_slot` and `_free_slot` the processes); None: this chat counts
        # against nothing (pure tests, sims).
        self.budget = budget
        # The agent's recent results (shared by its chats): with a journal that keeps results,
        # a published record's result lives there or in the journal, not in the record.
        self.results = results
        self.records = RecordTable(budget)
        self.calls: dict[str, CallState] = {}
        self.turns: dict[str, TurnState] = {}
        self.groups: dict[str, GroupState] = {}
        # Tools approved for the whole chat (9.5). A tuple: the empty one is shared, so the
        # chats that never approve so pay nothing for it.
        self.approved_tools: tuple[str, ...] = ()
        # `close_chat` (9.6): nothing new starts until its records are all forgotten.
        self.closed = False
        self._close_row = _NO_CLOSE_ROW
        # The agent is stopping (9.3): calls it stops end with the shutdown's text.
        self.shutting_down = False
        # Executes launched but not spawned yet: each holds a process slot (a burst of calls
        # cannot get past max_processes_per_chat before the first ones spawn).
        # (Dicts used as sets: an empty set costs 216 bytes, an empty dict 64; per idle chat.)
        self._launching: dict[str, None] = {}
        self._running_processes: dict[str, None] = {}
        # The commands the shell lists, until they are dropped (None while there are none).
        self._listed: dict[str, ListedProcess] | None = None
        # Restored calls whose process the shell is re-adopting from the keeper (10.1): the
        # hard deadline each keeps from its first start (ms, and on this clock), if any, and
        # whether the keeper already stopped its group at that deadline while no agent ran.
        self._adopting: dict[str, tuple[int | None, float | None, bool]] = {}
        # Deliveries waiting for results read back from the journal, in request order, and
        # what was at hand for them when the read began (the cache may evict it meanwhile).
        # (A list, not a deque: an empty deque costs 600 bytes per idle chat; it stays short.)
        self._lane: list[_Delivery] = []
        self._lane_held: dict[str, Result] = {}
        self._reading = False
        # None while no reply waits (most chats, most of the time).
        self._replies: _ReplyBook | None = None
        # Insertion-ordered (a dict used as a set): a turn leaves it in O(1).
        self._active_turns: dict[TurnState, None] = {}
        # The active turns whose running segment holds a call, by call id: a published result
        # finds the turns it may advance without scanning every turn's segment.
        # (None while no turn runs: most chats.)
        self._segment_turns: dict[str, list[TurnState]] | None = None
        self._to_advance: list[TurnState] = _IDLE
        self._now = 0.0
        self._wall_ms = 0
        # The effects of the input being applied, appended to directly (an `_emit` method
        # cost a Python call per effect, four per trivial call).
        self._out: list[Effect] = _IDLE

    # -----------------------------------------------------------------------------------------
    # The one entry point

    def handle(self, event: Input, now: float, wall_ms: int) -> list[Effect]:
        """Apply one input at trio time `now` and wall clock `wall_ms`; return the effects."""
        self._now = now
        self._wall_ms = wall_ms
        out: list[Effect] = []
        self._out = out
        if self._to_advance is not _IDLE:
            self._to_advance = _IDLE  # left over by an input that raised
        # (What follows is in this one method, not a second one it calls: it runs twice per
        # trivial call.)
        self._handlers[type(event)](self, event)
        if self._to_advance is not _IDLE:  # a turn's segment ended (most inputs end none)
            advanced = 0
            while advanced < len(self._to_advance):
                run = self._to_advance[advanced]
                advanced += 1
                run.to_advance = False
                self._next_segment(run)
            self._to_advance = _IDLE
        replies = self._replies
        if replies is not None:
            # Whatever an input reports on a call (its group stopped, gone, its process
            # exited...) may end a reply's wait: those filed under it are asked again.
            call_id = getattr(event, "call_id", None)
            if call_id is not None:
                replies.wake(call_id)
            self._settle()
        self._out = _IDLE
        return out

    @property
    def idle(self) -> bool:
        """Nothing left: no record, no turn, no process group, nothing waiting."""
        return not (
            self.records
            or self.turns
            or self.groups
            or self._lane
            or self._replies is not None
            or self._launching
            or self._running_processes
            or self._listed
        )

    def _hold_slot(self, slots: dict[str, None], call_id: str) -> None:
        """`call_id` holds a process slot (`slots`: `_launching` or `_running_processes`),
        counted in the agent's budget at once. (Counted where slots come and go, not by
        counting both before and after every input, which cost every input four `len` calls
        and a `try`, twice per trivial call.)"""
        if call_id not in slots:
            slots[call_id] = None
            if self.budget is not None:
                self.budget.processes += 1

    def _free_slot(self, slots: dict[str, None], call_id: str) -> None:
        if call_id in slots:
            del slots[call_id]
            if self.budget is not None:
                self.budget.processes -= 1

    @property
    def running_process_count(self) -> int:
        return len(self._running_processes) + len(self._launching)

    @property
    def replies_waiting(self) -> int:
        """Replies decided but held until what they report on is over (a cancel_result, an
        interrupted, a chat_closed, the shutdown's end): a quiet chat holds none."""
        return 0 if self._replies is None else self._replies.count

    def _advance_after(self, run: TurnState) -> None:
        """Start the turn's next segment at the end of this input (once: `run.to_advance`)."""
        if self._to_advance is _IDLE:
            self._to_advance = [run]
        else:
            self._to_advance.append(run)

    # -----------------------------------------------------------------------------------------
    # Requests

    def _on_call(self, req: CallRequest) -> None:
        """A `call` request (PROTOCOL.md 5.1)."""
        spec = req.spec
        record = self.records.get(spec.call_id)
        if record is None and self.closed:
            raise self._closed_error()
        if record is None:
            self._check_room_for_records(1)
        parsed: msgspec.Struct | None = None
        tool: ToolDef | None = None
        if record is None or record.tool is None:
            tool = lookup(spec.tool)
            parsed = parse_args(tool, spec.args)
            self._check_options(tool, spec)
        fingerprint = spec.fingerprint()
        admission, record = self.records.admit(
            spec.call_id,
            # The registry's own string (what `shared_tool_name` returns), at hand for a new call.
            tool.name if tool is not None else shared_tool_name(spec.tool),
            fingerprint,
            self._now,
            initial_state=RecordState.QUEUED,
        )
        assert record is not None
        if admission is Admission.CONFLICT:
            raise conflict_error(record)
        if admission is Admission.NEW:
            call = CallState(spec=spec, parsed=parsed)
            self.calls[spec.call_id] = call
            gated = self._gated(spec)
            state = "awaiting_approval" if gated else "running"
            accepted = AcceptedEvent(
                self.chat_id, spec.call_id, False, state, record.requests, req.rid
            )
            follower = self._follower(call, req.conn, stream=req.stream)
            follower.owed += 1
            first: tuple[Event, ...] = (accepted,)
            mode = FollowMode.SUBSCRIBE
            if not gated and self._answer_only(tool):
                # Nothing of it but its result follows: the pair is decided here, and the shell
                # keeps no subscription for it (`_publish` sends the result as `Send`).
                follower.answer_only = True
                mode = FollowMode.ANSWER
            if not gated and self._answers_at_once(tool):
                call.held_accepted = (req.conn, accepted)
                first = ()
            self._out.append(
                Follow(
                    req.conn,
                    spec.call_id,
                    follower.stream,
                    False,
                    first,
                    mode,
                    req.from_offset or None,
                )
            )
            self._forget_some()
            self._start(record, gated=gated)
            return
        self._journal_touch(record)
        self._refollowed(req.conn, spec.call_id)
        self._follow(
            req.conn,
            record,
            stream=req.stream,
            rid=req.rid,
            from_offset=None,
            live_from=req.from_offset,
        )

    def _answers_at_once(self, tool: ToolDef | None) -> bool:
        """A call of `tool` ends on the loop within this request, sends nothing before its
        result, and waits only for its result's commit (a read-only tool journals no start):
        its `accepted` goes out with the result, in one write and one read for the client,
        instead of a commit ahead of it. Without a journal the result is there at once anyway."""
        return (
            self.config.journal_enabled
            and tool is not None
            and tool.read_only
            and tool.runs_on_loop
        )

    def _answer_only(self, tool: ToolDef | None) -> bool:
        """A new call of `tool` (not gated, not a turn's) sends nothing but its `accepted` and
        its result: it runs on the loop, so it has no output and no `started`, and it has no
        gate to announce. Its follow needs no subscription in the shell, whose only work is
        to send those two (whatever waits between them: a start row, a result's commit)."""
        return tool is not None and tool.runs_on_loop

    def _send_held_accepted(self, call: CallState) -> None:
        """The held `accepted` goes out now: with the result, or before the reply to a later
        request naming the call (replies keep the order of their requests)."""
        held = call.held_accepted
        if held is not None:
            call.held_accepted = None
            conn, accepted = held
            self._out.append(Send(conn, accepted))  # a reply: sent even to a detached follower

    def _on_attach(self, req: AttachRequest) -> None:
        record = self.records.attach(req.call_id, self._now)
        if record is None:
            raise self._unknown_call(req.call_id)
        self._journal_touch(record)
        self._refollowed(req.conn, req.call_id)
        self._follow(req.conn, record, stream=True, rid=req.rid, from_offset=req.from_offset)

    def _on_detach(self, req: DetachRequest) -> None:
        record = self.records.get(req.call_id)
        if record is None:
            raise self._unknown_call(req.call_id)
        for run in self._active_turns:
            if run.segments is None and req.call_id in run.members:
                # The turn's requests on this connection follow the call once it is planned:
                # this detach, sent after them, then applies to what they follow.
                for ask in run.asks:
                    if ask.conn == req.conn:
                        ask.detached.append(req.call_id)
        self._detach(req.conn, req.call_id)

    def _refollowed(self, conn: Conn, call_id: str) -> None:
        """A request on `conn` follows the call again now, after any detach it sent: an
        unplanned turn's request before them follows it too, once planned, and stays so."""
        for run in self._active_turns:
            if run.segments is None and call_id in run.members:
                for ask in run.asks:
                    if ask.conn == conn and call_id in ask.detached:
                        ask.detached = [c for c in ask.detached if c != call_id]

    def _detach(self, conn: Conn, call_id: str) -> None:
        call = self.calls.get(call_id)
        keep = False
        if call is not None:
            follower = call.followers.get(conn)
            if follower is not None:
                if follower.owed:
                    # Its events stop now, but each request already made still gets its one
                    # `result` (PROTOCOL.md 9.9). What it streamed is over: a later request
                    # follows as it asks, a `stream: false` one without `started` or output.
                    follower.detached = keep = True
                    follower.stream = follower.resolved_events = False
                else:
                    del call.followers[conn]
        self._out.append(Detach(conn, call_id, keep))

    def _on_approve(self, req: ApproveRequest) -> None:
        record = self.records.get(req.call_id)
        if record is None:
            raise self._unknown_call(req.call_id)
        if record.state is not RecordState.AWAITING_APPROVAL:
            raise ToolwireError(
                "not_parked",
                f"call {req.call_id!r} is not waiting for approval "
                f"(it is {record.state.wire_state})",
            )
        if req.approved and req.scope == "chat":
            # Journaled before any gate it opens starts its effect: every effect waits for its
            # own later "started" row, so none runs on an approval a crash could lose.
            tool = self.calls[req.call_id].spec.tool
            self._approve_tool(tool)
            self._answer(record, True, None, approver=req.conn)
            self._open_approved(tool)
            return
        self._answer(record, req.approved, req.reason, approver=req.conn)

    def _check_room_for_records(self, new: int) -> None:
        """Refuse a request that would make the agent hold more than `max_records` records
        (issue 27). A record is never dropped to make room: one whose call could be repeated
        must stay, or the repeat would run again (docs/semantics.md, "Bounds")."""
        budget = self.budget
        if budget is None or new == 0:
            return
        held = budget.records
        if held + new > budget.max_records:
            raise ToolwireError(
                "over_limit",
                f"the agent holds {held} tool call records and its limit is "
                f"{budget.max_records} (max_records): nothing new is admitted until older "
                "records are forgotten (forget_after_s); a repeat of a call it holds still "
                "gets its saved result",
            )

    def _agent_processes_full(self) -> bool:
        budget = self.budget
        if budget is None:
            return False
        return budget.processes >= budget.max_processes

    def _check_ids(self, what: str, count: int) -> None:
        limit = self.config.max_ids_per_request
        if count > limit:
            raise ToolwireError(
                "over_limit",
                f"{what} names {count} calls, more than the {limit} one request may name "
                "(max_ids_per_request); send them in several requests",
            )

    def _on_cancel(self, req: CancelRequest) -> None:
        self._check_ids("cancel", len(req.call_ids))
        if self.budget is not None:
            # Each unknown id is stored as a tombstone (5.3): a record like any other.
            unknown = {c for c in req.call_ids if self.records.get(c) is None}
            self._check_room_for_records(len(unknown))
        for call_id in req.call_ids:
            received, record = self._cancel_one(call_id)
            record.pin()  # its result is owed: not forgotten before the reply
            self._reply_cancel(req.conn, record, received, req.rid)

    def _on_turn(self, req: TurnRequest) -> None:
        """A `turn` request (PROTOCOL.md 5.6): validate everything first, then admit."""
        self._check_ids("turn", len(req.specs))
        specs = list(req.specs)
        fingerprint = turn_fingerprint(specs)
        existing = self.turns.get(req.turn_id)
        if (
            existing is not None
            and existing.finished
            and any(self.records.get(call_id) is None for call_id in existing.call_ids)
        ):
            # One of its calls (created by an earlier call or turn) was forgotten (5.4): the
            # finished turn goes with it, and this request is a new turn (which replaces it
            # below, once it is found valid: a refused request changes nothing).
            existing = None
        if existing is not None:
            if existing.fingerprint != fingerprint:
                raise ToolwireError(
                    "conflict",
                    f"turn {req.turn_id!r} was first sent with different calls; "
                    "a repeated turn must repeat the same calls",
                )
            for call_id in existing.call_ids:
                # The repeat names each of its calls again: it counts and touches like a call.
                record = self.records.attach(call_id, self._now)
                if record is not None:
                    self._journal_touch(record)
            if existing.segments is None:
                # Its plan is not known yet: answered with the first request, once it is.
                counts = self._request_counts(existing.call_ids)
                existing.asks.append(TurnAsk(req.conn, req.stream, req.rid, frozenset(), counts))
                return
            self._follow_turn(
                req.conn, existing, stream=req.stream, rid=req.rid, created=frozenset()
            )
            return
        if self.closed and any(self.records.get(s.call_id) is None for s in specs):
            raise self._closed_error()
        fingerprints = check_new_turn(self.records, specs)
        self._check_room_for_records(sum(1 for s in specs if self.records.get(s.call_id) is None))
        call_ids = [s.call_id for s in specs]
        # Unplanned: what its calls reserve is resolved by the shell (it reads the filesystem,
        # off the loop when a path must be looked at), and the plan made with that.
        run = TurnState(req.turn_id, call_ids, fingerprint, None, members=frozenset(call_ids))
        self.turns[req.turn_id] = run
        created: list[str] = []
        for spec, fp in zip(specs, fingerprints, strict=True):
            admission, record = self.records.admit(
                spec.call_id,
                shared_tool_name(spec.tool),
                fp,
                self._now,
                initial_state=RecordState.QUEUED,
                turn_id=req.turn_id,
            )
            assert record is not None and admission is not Admission.CONFLICT
            record.pin()  # until the turn has its turn_result
            if admission is Admission.NEW:
                created.append(spec.call_id)
                call = CallState(spec=spec)
                try:
                    tool = lookup(spec.tool)
                    call.parsed = parse_args(tool, spec.args)
                    self._check_options(tool, spec)
                except ToolwireError as exc:
                    call.invalid = exc.message
                self.calls[spec.call_id] = call
        self._active_turns[run] = None
        # Nothing of the turn is sent before its plan: this request is answered with it.
        counts = self._request_counts(call_ids)
        run.asks.append(TurnAsk(req.conn, req.stream, req.rid, frozenset(created), counts))
        self._out.append(ResolveTurn(req.turn_id, req.specs))

    def _request_counts(self, call_ids: list[str]) -> tuple[int, ...]:
        record = self.records.get
        return tuple(
            r.requests if (r := record(call_id)) is not None else 0 for call_id in call_ids
        )

    def _on_turn_planned(self, event: TurnPlanned) -> None:
        """What the turn's calls reserve is known: plan it, answer each of its requests
        (`turn_plan` first), and start it. Calls that ended meanwhile (a cancel, an interrupt, a
        close) are not started again: a segment starts only calls still queued."""
        run = self.turns.get(event.turn_id)
        if run is None or run.segments is not None:
            return  # ended meanwhile, or planned already: nothing waits for this
        reservations = event.reservations
        failure = event.failure
        if failure is None and len(reservations) != len(run.call_ids):
            failure = f"{len(reservations)} reservations for {len(run.call_ids)} calls"
        if failure is not None:
            # Nothing is known of what the calls touch: each the turn admitted that is still
            # queued fails now, saying why (nothing of it runs, no gate parks for it), and the
            # plan is the one that is always safe (each call alone).
            why = text_unresolved(failure)
            for call_id in run.call_ids:
                record = self.records.get(call_id)
                if (
                    record is not None
                    and record.turn_id == run.turn_id
                    and record.state is RecordState.QUEUED
                ):
                    self.records.begin(record)
                    record.started_at_ms = self._wall_ms
                    self._finish(record, self._plain_result(record, Outcome.FAILED, why))
            reservations = (planner.BARRIER_RESERVATION,) * len(run.call_ids)
        # Canonical paths already: no filesystem call here.
        run.segments = planner.plan_segments(run.call_ids, reservations)
        asks, run.asks = run.asks, []
        for ask in asks:
            self._follow_turn(
                ask.conn,
                run,
                stream=ask.stream,
                rid=ask.rid,
                created=ask.created,
                requests=ask.requests,
            )
            for call_id in ask.detached:
                self._detach(ask.conn, call_id)
        run.to_advance = True
        self._advance_after(run)

    def _on_interrupt(self, req: InterruptRequest) -> None:
        """Cancel every unresolved call (of the chat, or of one turn); report when quiet."""
        turn_id = req.turn_id
        if turn_id is None:
            candidates = [r for r in self.records if r.tool is not None]
        else:
            # The calls the turn names, also those another turn or a plain call created.
            run = self.turns.get(turn_id)
            names = set(run.call_ids) if run is not None else set()
            candidates = [r for r in self.records if r.turn_id == turn_id or r.call_id in names]
        targets = [r for r in candidates if not r.done]
        # Ended on their own, their results still on the way to disk: not canceled, but the
        # chat is not quiet until they are published.
        ending = [r for r in candidates if r.done and not r.published]
        turns = [
            t
            for t in self.turns.values()
            if not t.done and (turn_id is None or t.turn_id == turn_id)
        ]
        for record in targets:
            self._cancel_one(record.call_id)

        def interrupted(ended: list[str]) -> Event:
            return InterruptedEvent(self.chat_id, turn_id, ended, req.rid)

        self._reply_when_quiet(req.conn, targets, ending, turns, [], interrupted)

    def _on_close_chat(self, req: CloseChatRequest) -> None:
        """Close the chat (9.6): every unresolved call ends as by `interrupt`, every process
        group with a member left (background and timed-out ones too) is stopped as by a
        cancel, and `chat_closed` says which once all of it is over, and once the close is
        durable: a close a client was told of survives a restart (until the records are all
        forgotten); a crash before that leaves the chat open, and the client's repeat closes
        it again."""
        self.closed = True
        targets = [r for r in self.records if r.tool is not None and not r.done]
        ending = [r for r in self.records if r.done and not r.published]
        turns = [t for t in self.turns.values() if not t.done]
        # The groups first, unconditionally: a command whose shell already exited may have
        # left members, and they go too.
        stopped = self._stop_every_group()
        # Commands still being spawned: stopped once the keeper answered (`_process_started`).
        spawning = [r.call_id for r in targets if self._spawning(r.call_id)]
        for record in targets:
            self._cancel_one(record.call_id)
        if self.config.journal_enabled and self._close_row == _NO_CLOSE_ROW:
            # After the rows of the gates it closed (commits keep their order): a close that
            # survives a crash never finds a gate parked again that could still be approved.
            self._close_row = _CLOSE_QUEUED
            self._out.append(JournalClose(self._wall_ms, CloseDurable()))

        def chat_closed(ended: list[str]) -> Event:
            # Of those, the ones whose process came and was stopped (`canceled`): a spawn that
            # failed, or that the shell gave up on, stopped nothing.
            came = [c for c in spawning if self._outcome(c) is Outcome.CANCELED]
            return ChatClosedEvent(self.chat_id, ended, [*stopped, *came], req.rid)

        self._reply_when_quiet(req.conn, targets, ending, turns, stopped, chat_closed, closing=True)

    def _spawning(self, call_id: str) -> bool:
        call = self.calls.get(call_id)
        return call is not None and call.spawning

    def _outcome(self, call_id: str) -> Outcome | None:
        record = self.records.get(call_id)
        return record.outcome if record is not None else None

    def _on_close_durable(self, event: CloseDurable) -> None:
        if self._close_row == _CLOSE_QUEUED:
            self._close_row = _CLOSE_DURABLE  # the replies waiting for it go out (_settle)
            self._wake_replies(_CLOSE_ROW_KEY)

    def _on_close_failed(self, event: CloseFailed) -> None:
        """The journal refused the close row. The close itself is over (its calls ended, its
        groups stopped, their results saved as any other): `chat_closed` goes out saying so,
        and the chat stays closed in memory. Only a restart would find it open again (the
        shell logged that); a later close_chat queues the row anew."""
        if self._close_row == _CLOSE_QUEUED:
            self._close_row = _NO_CLOSE_ROW
            self._wake_replies(_CLOSE_ROW_KEY)  # the chat_closed waiting for the row goes out

    def _reply_when_quiet(
        self,
        conn: Conn,
        targets: list[ToolCallRecord],
        ending: list[ToolCallRecord],
        turns: list[TurnState],
        stopped: list[str],
        reply: Callable[[list[str]], Event],
        *,
        closing: bool = False,
    ) -> None:
        """The reply of an interrupt or a close, once what it ended is over: every target and
        every call ending on its own published, every turn's turn_result sent, every stopped
        group gone; for a close, its row durable too. It names the targets the request ended;
        one that finished on its own first kept its real result and was not ended by it."""
        watched = [*targets, *ending]
        for record in watched:
            record.pin()
        # How far each list is known to be over: a published record stays published (it is
        # pinned), a done turn stays done, a stopped group does not come back (nothing new
        # starts in a closed or stopping chat). So each item is checked until it is over, once
        # per change of it, never again: the wait costs what it names.
        seen = [0, 0, 0]

        def blocker() -> _Blocker:
            while seen[0] < len(watched):
                record = watched[seen[0]]
                if not record.published:
                    return record.call_id
                seen[0] += 1
            while seen[1] < len(turns):
                run = turns[seen[1]]
                if not run.done:
                    return run
                seen[1] += 1
            while seen[2] < len(stopped):
                call_id = stopped[seen[2]]
                if call_id in self.groups:
                    return call_id
                seen[2] += 1
            if closing and self._close_row == _CLOSE_QUEUED:
                return _CLOSE_ROW_KEY
            return None

        def fire() -> None:
            for record in watched:
                record.unpin()
            ended = [r.call_id for r in targets if r.outcome in (Outcome.CANCELED, Outcome.NOT_RUN)]
            event = reply(ended)
            # Behind any result still being read back for this chat: the reply comes last.
            self._deliver([], lambda _: [Send(conn, event)])

        self._pending_reply(blocker, fire)

    def _pending_reply(self, blocker: Callable[[], _Blocker], fire: Callable[[], None]) -> None:
        """`fire` once `blocker` says nothing is left to wait for (asked at the end of this
        input, then whenever what it names changes)."""
        if self._replies is None:
            self._replies = _ReplyBook()
        self._replies.add(blocker, fire)

    def _wake_replies(self, key: object) -> None:
        if self._replies is not None:
            self._replies.wake(key)

    # -----------------------------------------------------------------------------------------
    # Following

    def _follower(self, call: CallState, conn: Conn, *, stream: bool) -> Follower:
        follower = call.followers.get(conn)
        if follower is None:
            follower = call.followers[conn] = Follower()
        follower.detached = False  # a new request on this connection follows the call again
        follower.answer_only = False  # its Follow subscribes (the caller sets it if not)
        follower.stream = follower.stream or stream
        return follower

    @staticmethod
    def _streaming(call: CallState, *, resolved: bool = False) -> tuple[Conn, ...]:
        """The connections a streamed event of `call` goes to: each follower that streams
        (with `resolved`: or gets `approval_resolved` without streaming, a turn's calls) and has
        not detached. A follower streams from the Follow of the request that asked for it, whose
        `accepted` that Follow sends first: so the event never comes ahead of that `accepted`."""
        return tuple(
            conn
            for conn, follower in call.followers.items()
            if not follower.detached
            and (follower.stream or (resolved and follower.resolved_events))
        )

    def _follow(
        self,
        conn: Conn,
        record: ToolCallRecord,
        *,
        stream: bool,
        rid: Rid,
        from_offset: int | None,
        replay: bool = True,
        live_from: int = 0,
        requests: int | None = None,
    ) -> None:
        """A repeat `call` (from_offset None) or an `attach` of an existing record (or a call a
        turn just created: `replay` False). `live_from`: where a repeated `call`'s output starts
        while the call runs (its `from_offset`, PROTOCOL.md 10.2); once the call has ended a
        `call` gets its saved result only, whatever its offset (9.9). `requests`: the record's
        count with this request, when the request was taken earlier (a turn answered once
        planned)."""
        call = self.calls.get(record.call_id)
        if call is not None:
            self._send_held_accepted(call)
        accepted = AcceptedEvent(
            self.chat_id,
            record.call_id,
            replay,
            # Ended but not yet durable: it is answered like a running call (output, then the
            # result once saved), so say so.
            "running" if record.done and not record.published else record.state.wire_state,
            record.requests if requests is None else requests,
            rid,
        )
        events: tuple[Event, ...] = (accepted,)
        if record.state is RecordState.AWAITING_APPROVAL and call is not None:
            events = (accepted, self._approval_event(record, call))
        if record.published or call is None:
            # Published means durable: a result is never sent before the journal holds it.
            # A repeated `call` of an ended call gets its result only; an `attach` replays the
            # retained output from its offset first (PROTOCOL.md 9.9).
            self._out.append(
                Follow(conn, record.call_id, stream, False, events, FollowMode.REPLAY, from_offset)
            )
            self._deliver(
                [record.call_id],
                lambda results: [
                    SendReplay(
                        conn,
                        record.call_id,
                        ResultEvent(self.chat_id, record.call_id, results[0]),
                        from_offset,
                    )
                ],
            )
            return
        before = call.followers.get(conn)
        # An earlier request on this connection still owes the output it streams: the cursor
        # may only move back, never skip any of it (PROTOCOL.md 9.9).
        rewind_only = (
            before is not None and before.stream and not before.detached and before.owed > 0
        )
        follower = self._follower(call, conn, stream=stream)
        follower.owed += 1
        self._out.append(
            Follow(
                conn,
                record.call_id,
                follower.stream,
                follower.resolved_events,
                events,
                FollowMode.LIVE,
                live_from if from_offset is None else from_offset,
                # After this request's `accepted`, and only to a connection that streams: a
                # `stream: false` request never brings `started` (PROTOCOL.md 9.9).
                call.started if follower.stream else None,
                rewind_only,
            )
        )

    def _follow_turn(
        self,
        conn: Conn,
        run: TurnState,
        *,
        stream: bool,
        rid: Rid,
        created: frozenset[str],
        requests: tuple[int, ...] | None = None,
    ) -> None:
        """`created`: the calls this very request admitted as new (accepted, replay false);
        `requests`: each call's count as of this request, if it was taken before now. Only for
        a planned turn: its `turn_plan` comes first."""
        assert run.segments is not None, f"turn {run.turn_id} followed before its plan"
        if not run.finished:
            run.followers.append(conn)
        self._out.append(Send(conn, TurnPlanEvent(self.chat_id, run.turn_id, run.segments, rid)))
        for i, call_id in enumerate(run.call_ids):
            record = self.records.get(call_id)
            if record is None:
                continue
            if stream:
                self._follow(
                    conn,
                    record,
                    stream=True,
                    rid=None,
                    from_offset=None,
                    replay=call_id not in created,
                    requests=None if requests is None else requests[i],
                )
                continue
            call = self.calls.get(call_id)
            if call is None:
                continue
            follower = self._follower(call, conn, stream=False)
            follower.resolved_events = True
            events: tuple[Event, ...] = ()
            if record.state is RecordState.AWAITING_APPROVAL:
                events = (self._approval_event(record, call),)
            self._out.append(
                Follow(conn, call_id, follower.stream, True, events, FollowMode.SUBSCRIBE)
            )
        if run.finished:
            # After each call's result above: deliveries keep their order.
            self._deliver(
                list(run.call_ids),
                lambda results: [Send(conn, TurnResultEvent(self.chat_id, run.turn_id, results))],
            )

    def _approval_event(self, record: ToolCallRecord, call: CallState) -> ApprovalEvent:
        return ApprovalEvent(
            self.chat_id, record.call_id, call.spec.tool, call.spec.args, record.turn_id
        )

    # -----------------------------------------------------------------------------------------
    # Gates (PROTOCOL.md 5.0, 9.5)

    def _gated(self, spec: CallSpec) -> bool:
        if spec.tool in self.approved_tools:
            return False  # approved for the whole chat (9.5): no gate, no `approval` event
        return spec.approval or spec.tool in self.config.approve_tools

    def _resolve_gate(self, record: ToolCallRecord, decision: str) -> None:
        call = self.calls.get(record.call_id)
        if call is None or not call.gate_open:
            return
        call.gate_open = False
        if self.config.approval_timeout_s is not None:
            self._out.append(CancelTimer((record.call_id, "gate")))
        resolved = ApprovalResolvedEvent(self.chat_id, record.call_id, decision)
        self._out.append(Publish(record.call_id, resolved, self._streaming(call, resolved=True)))

    def _answer(
        self, record: ToolCallRecord, approved: bool, reason: str | None, *, approver: Conn | None
    ) -> None:
        """Answer a parked gate: run the call, or end it `denied` (with the reason's text)."""
        self.records.touch(record, self._now)
        decision = "approved" if approved else "denied"
        self._resolve_gate(record, decision)
        if approver is not None:
            call = self.calls[record.call_id]
            follower = call.followers.get(approver)
            if (
                follower is None
                or follower.detached
                or not (follower.stream or follower.resolved_events)
            ):
                # The approver learns that its answer took effect even when it does not follow
                # the call (another replica raised the gate): the one reply an `approve` gets.
                self._out.append(
                    Send(approver, ApprovalResolvedEvent(self.chat_id, record.call_id, decision))
                )
        if approved:
            self.records.unpark(record)
            self._start(record, gated=False)
        else:
            self._finish(record, self._plain_result(record, Outcome.DENIED, text_denied(reason)))

    def _approve_tool(self, tool: str) -> None:
        if tool in self.approved_tools:
            return
        self.approved_tools += (tool,)
        if self.config.journal_enabled:
            self._out.append(JournalApproveTool(tool))

    def _open_approved(self, tool: str) -> None:
        """Approve every gate of `tool` parked in the chat (scope "chat"), in arrival order."""
        parked = [
            record
            for record in self.records
            if record.state is RecordState.AWAITING_APPROVAL
            and self.calls[record.call_id].spec.tool == tool
        ]
        for record in parked:
            self._answer(record, True, None, approver=None)

    def _on_gate_expired(self, event: GateExpired) -> None:
        record = self.records.get(event.call_id)
        call = self.calls.get(event.call_id)
        if record is None or call is None or record.state is not RecordState.AWAITING_APPROVAL:
            return
        if not call.gate_open:
            return
        self._resolve_gate(record, "expired")
        self._finish(record, self._plain_result(record, Outcome.NOT_RUN, TEXT_APPROVAL_EXPIRED))

    # -----------------------------------------------------------------------------------------
    # Starting

    def _start(self, record: ToolCallRecord, *, gated: bool) -> None:
        """A queued record's turn has come: park it at its gate or launch it."""
        if record.state is not RecordState.QUEUED or self.shutting_down:
            return
        call = self.calls[record.call_id]
        if gated:
            self.records.park(record)
            self._journal_write(record)
            call.gate_open = True
            self._out.append(Publish(record.call_id, self._approval_event(record, call)))
            if self.config.approval_timeout_s is not None:
                self._out.append(
                    StartTimer(
                        (record.call_id, "gate"),
                        self._now + self.config.approval_timeout_s,
                        GateExpired(record.call_id),
                    )
                )
            return
        if record.turn_id is not None:
            run = self.turns.get(record.turn_id)
            if run is not None and not run.finished and record.call_id in run.members:
                if run.running >= planner.MAX_PARALLEL_CALLS:
                    run.waiting.append(record.call_id)  # launched when a slot frees
                    run.still_waiting.add(record.call_id)
                    return
                run.running += 1
                call.turn = run
        self._launch(record, call)

    def _launch(self, record: ToolCallRecord, call: CallState) -> None:
        if call.invalid is not None or call.parsed is None:
            self.records.begin(record)
            record.started_at_ms = self._wall_ms
            why = call.invalid or "the call's arguments could not be read"
            self._finish(record, self._plain_result(record, Outcome.FAILED, why))
            return
        tool = TOOLS[call.spec.tool]
        if tool.kind is ToolKind.EXECUTE:
            self._hold_slot(self._launching, record.call_id)
        self.records.begin(record)
        record.started_at_ms = self._wall_ms
        call.start_pending = True
        if call.spec.timeout_ms:
            # The deadline is fixed at the FIRST start; no retry ever moves it (5.2).
            record.deadline = self._now + call.spec.timeout_ms / 1000
        if isinstance(call.parsed, ExecuteArgs) and call.parsed.kill_after_ms:
            call.kill_at = self._now + call.parsed.kill_after_ms / 1000
        if tool.read_only or not self.config.journal_enabled:
            # A read-only tool has no effect to protect: no start row (a crash before its
            # result is durable leaves no trace, and a repeat runs it anew). Started right here,
            # as a durable start would (no `StartDurable` input made and looked up again).
            self._effect_may_start(record, call)
            return
        # The effect waits until the journal holds "started", so a crash can never forget a
        # call that ran (it comes back `unknown`, never runs twice).
        self._out.append(JournalWrite(self._row(record, call), StartDurable(record.call_id)))

    def _on_start_durable(self, event: StartDurable) -> None:
        record = self.records.get(event.call_id)
        call = self.calls.get(event.call_id)
        if record is None or call is None or record.state is not RecordState.RUNNING:
            return
        if not call.start_pending:
            return
        self._effect_may_start(record, call)

    def _effect_may_start(self, record: ToolCallRecord, call: CallState) -> None:
        """The start is durable (or needs no row): the effect happens now, unless a cancel or
        the shutdown came first."""
        if record.cancel_requested or self.shutting_down:
            # A cancel (or the agent's shutdown) came while the start was on its way to disk:
            # nothing happened.
            self._free_slot(self._launching, record.call_id)
            self._finish(
                record, self._plain_result(record, Outcome.NOT_RUN, TEXT_CANCELED_BEFORE_RUN)
            )
            return
        call.start_pending = False  # the effect may happen from here on
        tool = TOOLS[call.spec.tool]
        assert call.parsed is not None
        if tool.kind is ToolKind.EXECUTE:
            self._free_slot(self._launching, record.call_id)
            why = None
            if self.running_process_count >= self.config.max_processes_per_chat:
                limit = self.config.max_processes_per_chat
                why = (
                    f"the command did not start: this chat already runs {limit} processes "
                    "(max_processes_per_chat); wait for one to exit or stop one"
                )
            elif self._agent_processes_full():
                assert self.budget is not None
                why = (
                    "the command did not start: the agent already runs "
                    f"{self.budget.max_processes} processes over all chats (max_processes); "
                    "wait for one to exit or stop one"
                )
            if why is not None:
                self._finish(record, self._plain_result(record, Outcome.FAILED, why))
                return
            started_at_ms = record.started_at_ms or self._wall_ms
            # It holds its process slot until the shell says whether it started.
            self._hold_slot(self._launching, record.call_id)
            call.spawning = True
            self._out.append(Spawn(record.call_id, call.parsed, started_at_ms, call.spec.sandbox))
            return
        call.stoppable = tool.stoppable
        self._out.append(
            RunTool(record.call_id, tool.name, call.parsed, tool.runs_on_loop, call.spec.sandbox)
        )

    def _check_options(self, tool: ToolDef, spec: CallSpec) -> None:
        if spec.background and spec.timeout_ms:
            raise ToolwireError(
                "bad_args", "background and a non-zero timeout_ms cannot be combined"
            )
        if spec.background and tool.kind is not ToolKind.EXECUTE:
            raise ToolwireError("bad_args", f"background applies to execute only, not {tool.name}")
        if (
            tool.kind is ToolKind.EXECUTE
            and self.running_process_count >= self.config.max_processes_per_chat
        ):
            raise ToolwireError(
                "over_limit",
                f"chat {self.chat_id!r} already runs "
                f"{self.config.max_processes_per_chat} processes (max_processes_per_chat)",
            )
        if tool.kind is ToolKind.EXECUTE and self._agent_processes_full():
            assert self.budget is not None
            raise ToolwireError(
                "over_limit",
                f"the agent already runs {self.budget.max_processes} processes over all "
                "chats (max_processes); wait for one to exit or stop one",
            )

    # -----------------------------------------------------------------------------------------
    # Running: tools and processes

    def _on_tool_ended(self, event: ToolEnded) -> None:
        record = self.records.get(event.call_id)
        if record is None or record.state is not RecordState.RUNNING:
            return
        self._finish(record, call_results.report_result(record, event.report, self._wall_ms))

    def _on_tool_stopped(self, event: ToolStopped) -> None:
        record = self.records.get(event.call_id)
        if record is None or record.state is not RecordState.RUNNING:
            return
        text = TEXT_SHUTDOWN if self.shutting_down else TEXT_CANCELED_WHILE_RUNNING
        self._finish(record, self._plain_result(record, Outcome.CANCELED, text))

    def _on_tool_failed(self, event: ToolFailed) -> None:
        """An exception inside the agent while running or carrying out this call: end the
        call truthfully, so no request, repeat, attach, cancel or interrupt waits on it forever
        (PROTOCOL.md 9.9, 9.10)."""
        self._free_slot(self._launching, event.call_id)
        call = self.calls.get(event.call_id)
        if call is not None:
            # The shell gave up on a spawn it asked for (the keeper is gone): the command may
            # have started, so the call ends `unknown`; a `Spawned` after this is an orphan.
            call.spawning = False
        record = self.records.get(event.call_id)
        if record is None or record.done:
            return
        self._resolve_gate(record, "canceled")  # a gate already announced is closed
        self._finish(record, self._failure_result(record))

    def _failure_result(self, record: ToolCallRecord) -> Result:
        call = self.calls.get(record.call_id)
        start_pending = call is not None and call.start_pending
        if record.effect_started and not start_pending:
            return self._plain_result(record, Outcome.UNKNOWN, TEXT_AGENT_FAILURE)
        return self._plain_result(record, Outcome.NOT_RUN, TEXT_AGENT_FAILURE_BEFORE_RUN)

    def _on_spawned(self, event: Spawned) -> None:
        """The command `Spawn` asked for runs. Whatever came while it was being spawned was
        kept for this moment: a cancel (also an interrupt's, a close's or the shutdown's) stops
        its group now (`_process_started`). A command no call waits for any more (the shell
        gave up on its spawn, `ToolFailed`) is held only to be stopped."""
        self._free_slot(self._launching, event.call_id)
        record = self.records.get(event.call_id)
        call = self.calls.get(event.call_id)
        if (
            record is None
            or call is None
            or not call.spawning
            or record.state is not RecordState.RUNNING
        ):
            self._stop_orphan(event, record)
            return
        call.spawning = False
        self._process_started(record, call, event)

    def _stop_orphan(self, event: Spawned, record: ToolCallRecord | None) -> None:
        """A process no call answers for: listed and stopped at once, as a cancel of an ended
        call stops what it left running, so nothing of it runs on unseen (5.3)."""
        call_id = event.call_id
        if call_id in self.groups:
            return  # not a second group under one id: the first one's stop stands
        self._hold_slot(self._running_processes, call_id)
        if self._listed is None:
            self._listed = {}
        self._listed[call_id] = ListedProcess()
        started_at_ms = record.started_at_ms if record is not None else None
        self.groups[call_id] = GroupState(started_at_ms=started_at_ms or self._wall_ms)
        self._stop_group(call_id, unless_exited=False)

    def _process_started(self, record: ToolCallRecord, call: CallState, event: Spawned) -> None:
        """A call's command runs (spawned, or re-adopted after a restart): its group, its
        listing, its `started` and its timers."""
        self._hold_slot(self._running_processes, event.call_id)
        if self._listed is None:
            self._listed = {}
        self._listed[event.call_id] = ListedProcess()
        group = GroupState(started_at_ms=record.started_at_ms or 0)
        self.groups[event.call_id] = group
        if call.kill_at is not None and isinstance(call.parsed, ExecuteArgs):
            group.kill_after_ms = call.parsed.kill_after_ms
            self._out.append(
                StartTimer((record.call_id, "kill_after"), call.kill_at, KillAfter(record.call_id))
            )
        call.started = StartedEvent(
            self.chat_id, record.call_id, record.started_at_ms or 0, event.pid
        )
        self._out.append(Publish(record.call_id, call.started, self._streaming(call)))
        if record.cancel_requested:
            # Canceled while it was being spawned (5.3; an interrupt, a close or the shutdown
            # likewise): stopped now, as a running command is; it ends `canceled` unless it
            # exited first.
            # A close or the shutdown stops the group whatever its shell did meanwhile, as it
            # stops every other group (`_stop_every_group`).
            stop_all = self.closed or self.shutting_down
            self._stop_group(record.call_id, unless_exited=not stop_all)
            return
        if call.spec.background:
            self._finish(record, self._execute_result(record, event.snapshot, Outcome.COMPLETED))
            return
        if record.deadline is not None:
            self._out.append(
                StartTimer(
                    (record.call_id, "deadline"), record.deadline, Deadline(record.call_id, None)
                )
            )

    def _on_spawn_failed(self, event: SpawnFailed) -> None:
        self._free_slot(self._launching, event.call_id)
        call = self.calls.get(event.call_id)
        if call is not None:
            call.spawning = False
        record = self.records.get(event.call_id)
        if record is None or record.done:
            return
        self._finish(
            record,
            self._plain_result(
                record, Outcome.FAILED, f"the command did not start: {event.reason}"
            ),
        )

    def _on_process_exited(self, event: ProcessExited) -> None:
        self._free_slot(self._running_processes, event.call_id)
        listed = self._listed_process(event.call_id)
        if listed is not None and listed.exited_at is None:
            listed.exited_at = self._now
        group = self.groups.get(event.call_id)
        if group is not None:
            group.leader_exited = True
            self._maybe_drop_group(event.call_id, group)
        record = self.records.get(event.call_id)
        if record is None or record.state is not RecordState.RUNNING:
            return  # it ended before (a timeout, a background start): only the process is over
        if group is not None and group.stopping is not None:
            # The shell is gone, but the cancel's grace belongs to the whole group (5.3): the
            # result, and with it the cancel's reply, waits until every member has exited or
            # been killed, and carries what they printed meanwhile.
            return
        self._out.append(CancelTimer((record.call_id, "deadline")))
        if group is not None and group.killed_after and group.kill_after_ms is not None:
            # Stopped by its keeper at its hard deadline while no agent ran (10.1).
            self._finish_killed_after(record, event.snapshot, group.kill_after_ms)
            return
        outcome = Outcome.CANCELED if record.cancel_requested else Outcome.COMPLETED
        self._finish(record, self._execute_result(record, event.snapshot, outcome))

    def _on_holder_gone(self, event: HolderGone) -> None:
        """What held the command is gone (10.1): a call still owed its result ends `unknown`
        with the output read up to then; for the rest it counts as exited."""
        record = self.records.get(event.call_id)
        if record is not None and record.state is RecordState.RUNNING:
            self._out.append(CancelTimer((record.call_id, "deadline")))
            self._finish(
                record,
                self._execute_result(
                    record, event.snapshot, Outcome.UNKNOWN, text=TEXT_KEEPER_GONE
                ),
            )
        self._on_process_exited(ProcessExited(event.call_id, event.snapshot))

    def _on_output_closed(self, event: OutputClosed) -> None:
        # Nothing can print any more: an exited process keeps at most the result's size (5.2).
        self._out.append(ShrinkOutput(event.call_id))
        listed = self._listed_process(event.call_id)
        if listed is not None:
            listed.output_closed = True
        group = self.groups.get(event.call_id)
        if group is not None:
            group.output_closed = True
            self._maybe_drop_group(event.call_id, group)

    def _maybe_drop_group(self, call_id: str, group: GroupState) -> None:
        """A spent group is kept, watched, until the shell finds it empty (`GroupGone`): a
        member that left the output pipe (`nohup server >log 2>&1 &`) is still the chat's to
        stop at a close or a shutdown (PROTOCOL.md 9.3, 9.6)."""
        if (
            group.spent
            and group.stopping is None
            and group.kill_after_ms is None
            and not group.watched
        ):
            group.watched = True
            self._out.append(WatchGroup(call_id))

    def _on_group_gone(self, event: GroupGone) -> None:
        group = self.groups.get(event.call_id)
        if group is not None and group.watched and group.stopping is None:
            del self.groups[event.call_id]

    def _on_kill_after(self, event: KillAfter) -> None:
        """The hard deadline passed (9.2): the group is stopped as by a cancel; a call whose
        result is still owed ends `timed_out` once it is gone, one that returned keeps its
        result (its process shows `timed_out`)."""
        group = self.groups.get(event.call_id)
        if group is None or group.kill_after_ms is None:
            return
        if group.stopping is not None:
            group.kill_after_ms = None  # a cancel is stopping it already
            return
        group.killed_after = True
        self._stop_group(event.call_id, unless_exited=False, reason="kill_after")

    def _on_deadline(self, event: Deadline) -> None:
        record = self.records.get(event.call_id)
        group = self.groups.get(event.call_id)
        if record is None or record.state is not RecordState.RUNNING or event.snapshot is None:
            return
        if event.snapshot.exited or (group is not None and group.stopping is not None):
            return  # it ended first (its exit is on the way), or a cancel is stopping it
        # The process runs on; its exit is recorded whenever it comes.
        self._out.append(MarkTimedOut(record.call_id))
        result = self._execute_result(record, event.snapshot, Outcome.TIMED_OUT, timed_out=True)
        self._finish(record, result)

    # -----------------------------------------------------------------------------------------
    # Cancel (PROTOCOL.md 5.3)

    def _cancel_one(self, call_id: str) -> tuple[bool, ToolCallRecord]:
        """Apply one cancel now. Returns (received, record); the record is DONE at once, or
        becomes DONE when the stopped run ends."""
        action, record = self.records.cancel(call_id, self._now)
        group = self.groups.get(call_id)
        leftover = group is not None and not group.spent
        if action is CancelAction.TOMBSTONED:
            self.calls[call_id] = CallState(spec=CallSpec(call_id, "", {}))
            if group is not None and leftover:
                # A process outlives its (forgotten) record: the cancel still stops it, also
                # when only a background child of its exited shell is left (it holds the pipe).
                self.records.begin(record)
                record.started_at_ms = group.started_at_ms
                self._stop_group(call_id, unless_exited=False)
            else:
                self._finish(
                    record, self._plain_result(record, Outcome.NOT_RUN, TEXT_CANCELED_BEFORE_RUN)
                )
            return False, record
        if action is CancelAction.CLOSED_BEFORE_RUN:
            self._resolve_gate(record, "canceled")
            self._finish(
                record, self._plain_result(record, Outcome.NOT_RUN, TEXT_CANCELED_BEFORE_RUN)
            )
        elif action is CancelAction.STOP_RUNNING:
            call = self.calls.get(call_id)
            if group is not None:
                self._stop_group(call_id, unless_exited=True)
            elif call is not None and call.stoppable:
                self._out.append(StopRun(call_id))
            # A write in a worker thread is not interrupted half-way: the cancel waits for it
            # and reports its real result, which is the truth. A start still on its way to
            # disk ends `not_run` when it gets there. A command still being spawned
            # (`call.spawning`) is stopped when its `Spawned` comes.
        elif leftover:
            # Ended (a timeout, a background start) with its process still there: a cancel
            # kills it "like a running one" (5.3).
            self._stop_group(call_id, unless_exited=False)
        return True, record

    def _stop_every_group(self) -> list[str]:
        """Stop every group of the chat with something left in it, as a cancel does (also
        those whose calls returned); returns them all, with those already being stopped."""
        stopped: list[str] = []
        for call_id, group in list(self.groups.items()):
            if group.stopping is None:
                # A spent group's command is over: only a member that lives on is stopped (the
                # shell checks, and feeds `AlreadyExited` for an empty group).
                reason = "linger" if group.spent else "cancel"
                self._stop_group(call_id, unless_exited=False, reason=reason)
            stopped.append(call_id)
        return stopped

    def _stop_group(self, call_id: str, *, unless_exited: bool, reason: str = "cancel") -> None:
        """The three steps of a stop (5.3), for a cancel or, by `reason`, a hard deadline
        ("kill_after", 9.2) or what lingers of an ended command ("linger"): only a cancel makes
        the call's result and the cancel replies say `canceled`."""
        group = self.groups[call_id]
        if group.stopping is not None:
            return
        group.stopping = "term"
        if reason == "cancel":
            group.canceled = True
        group.lingering = reason == "linger"
        self._out.append(
            StopGroup(
                call_id,
                self.config.kill_grace_s,
                unless_exited,
                only_if_alive=reason != "cancel",
                timed_out=reason == "kill_after",
                canceled=reason == "cancel",
            )
        )

    def _on_already_exited(self, event: AlreadyExited) -> None:
        """The command had already exited: the call finished first, so its real result stands
        (only a run that was still going is "canceled")."""
        group = self.groups.get(event.call_id)
        if group is not None:
            if group.watched or group.lingering:
                # A close or a shutdown found the spent group empty: nothing to stop, and the
                # group is gone. Also when its hard deadline is still ahead (a spent group is
                # kept unwatched for it): the close's or shutdown's reply waits for the groups
                # it stopped, and must not wait for a deadline that can be hours away and
                # would find the group empty too (9.2, 9.3, 9.6).
                del self.groups[event.call_id]
                if group.kill_after_ms is not None:
                    self._out.append(CancelTimer((event.call_id, "kill_after")))
                return
            if group.killed_after:
                # Its hard deadline found no member alive: nothing was stopped (9.2).
                group.killed_after = False
                group.kill_after_ms = None
                group.stopping = None
                self._maybe_drop_group(event.call_id, group)
                return
            group.stopping = None
            group.canceled = False
        record = self.records.get(event.call_id)
        if record is not None and not record.done:
            record.cancel_requested = False
        if group is not None and not group.output_closed:
            # What the call left running (a background child holding the pipe) is stopped all
            # the same, as a cancel of an ended call stops it (5.3): the reply waits for it.
            # The call itself keeps its real result (not `canceled`: the cancel did not end it).
            group.stopping = "term"
            self._out.append(
                StopGroup(event.call_id, self.config.kill_grace_s, False, canceled=True)
            )

    def _on_group_empty(self, event: GroupEmpty | GraceOver) -> None:
        """The grace is over (or nothing is left to give it to): SIGKILL whatever is left, so
        a member that ignores SIGTERM can never outlive a canceled call."""
        group = self.groups.get(event.call_id)
        if group is None or group.stopping != "term":
            return
        group.stopping = "kill"
        self._out.append(KillGroup(event.call_id))

    def _on_group_lost(self, event: GroupLost) -> None:
        """A step on the group failed in the shell: the call ends `unknown` (its effect may
        have happened; nothing more will tell), and the group gets SIGKILL, so nothing of it
        runs on unseen. If the SIGKILL is what failed, nothing of the group can be known any
        more: it is given up, so what waits for it (a cancel, a close, the shutdown) ends."""
        record = self.records.get(event.call_id)
        if record is not None and not record.done:
            self._finish(record, self._failure_result(record))
        group = self.groups.get(event.call_id)
        if group is None:
            return
        if group.stopping != "kill":
            group.stopping = "kill"
            self._out.append(KillGroup(event.call_id))
            return
        del self.groups[event.call_id]
        self._free_slot(self._running_processes, event.call_id)
        if group.kill_after_ms is not None:
            self._out.append(CancelTimer((event.call_id, "kill_after")))

    def _on_group_stopped(self, event: GroupStopped) -> None:
        group = self.groups.get(event.call_id)
        if group is None:
            return
        group.stopping = None
        group.leader_exited = group.output_closed = True
        del self.groups[event.call_id]
        self._free_slot(self._running_processes, event.call_id)
        if group.kill_after_ms is not None and not group.killed_after:
            self._out.append(CancelTimer((event.call_id, "kill_after")))
        record = self.records.get(event.call_id)
        if record is not None and record.state is RecordState.RUNNING:
            self._out.append(CancelTimer((record.call_id, "deadline")))
            if group.killed_after and group.kill_after_ms is not None:
                self._finish_killed_after(record, event.snapshot, group.kill_after_ms)
                return
            outcome = Outcome.CANCELED if record.cancel_requested else Outcome.COMPLETED
            text = TEXT_SHUTDOWN if self.shutting_down and record.cancel_requested else None
            self._finish(record, self._execute_result(record, event.snapshot, outcome, text=text))

    def _on_shutdown(self, event: Shutdown) -> None:
        """The agent stops (PROTOCOL.md 9.3): every call whose effect is running is stopped
        and saved `canceled` with the shutdown's text, every process group is stopped as by a
        cancel, and nothing new starts. Parked gates stay parked (their rows say so); queued
        turn calls never started. `ShutdownDone` once every stopped call's result is durable
        and every group is gone."""
        self.shutting_down = True
        running = [r for r in self.records if r.state is RecordState.RUNNING]
        stopped = self._stop_every_group()
        for record in running:
            record.cancel_requested = True
            call = self.calls.get(record.call_id)
            if call is not None and call.stoppable and record.call_id not in self.groups:
                self._out.append(StopRun(record.call_id))
            # A write on a worker thread ends on its own with its real result; a start on
            # its way to disk ends `not_run` when it gets there; a command being spawned is
            # stopped when its `Spawned` comes.

        seen = [0, 0]  # as in `_reply_when_quiet`: each item checked until it is over

        def blocker() -> _Blocker:
            while seen[0] < len(running):
                record = running[seen[0]]
                if not record.published:
                    return record.call_id
                seen[0] += 1
            while seen[1] < len(stopped):
                call_id = stopped[seen[1]]
                if call_id in self.groups:
                    return call_id
                seen[1] += 1
            return None

        self._pending_reply(blocker, lambda: self._out.append(ShutdownDone()))

    def _reply_cancel(self, conn: Conn, record: ToolCallRecord, received: bool, rid: Rid) -> None:
        call_id = record.call_id

        def blocker() -> _Blocker:
            if not record.published:
                return call_id
            # A process the ended call left running is killed "like a running one" (5.3): the
            # reply waits until its whole group is gone, so a client never sees any of it alive
            # after the cancel_result.
            group = self.groups.get(call_id)
            if received and group is not None and group.stopping is not None:
                return call_id
            return None

        def fire() -> None:
            self._deliver(
                [call_id],
                lambda results: [
                    Send(conn, CancelResultEvent(self.chat_id, call_id, received, results[0], rid))
                ],
            )
            record.unpin()

        self._pending_reply(blocker, fire)

    # -----------------------------------------------------------------------------------------
    # Turns (PROTOCOL.md 5.6)

    def _next_segment(self, run: TurnState) -> None:
        """Start the turn's next segment (its calls at once, at most 8 running), or end the
        turn once every segment's calls have their published results. Not re-entered: a call
        that ends while its segment is being started is seen by the loop below. An unplanned
        turn starts nothing: its calls wait for what they reserve to be known."""
        segments = run.segments
        if run.advancing or run.finished or segments is None:
            return
        run.advancing = True
        try:
            while True:
                if run.segment >= 0:
                    calls = segments[run.segment]
                    while run.segment_published < len(calls) and self._published(
                        calls[run.segment_published]
                    ):
                        run.segment_published += 1
                    if run.segment_published < len(calls):
                        return
                    self._index_segment(run, add=False)
                run.segment += 1
                run.segment_published = 0
                if run.segment >= len(segments):
                    self._end_turn(run)
                    return
                self._index_segment(run, add=True)
                for call_id in segments[run.segment]:
                    record = self.records.get(call_id)
                    assert record is not None, f"turn {run.turn_id} lost its call {call_id}"
                    if record.state is RecordState.QUEUED:
                        self._start(record, gated=self._gated(self.calls[call_id].spec))
        finally:
            run.advancing = False

    def _index_segment(self, run: TurnState, *, add: bool) -> None:
        """File the turn's running segment under each of its calls (or take it out again), so
        that a call's result advances exactly the turns waiting for it."""
        index = self._segment_turns
        if index is None:
            if not add:
                return
            index = self._segment_turns = {}
        assert run.segments is not None  # only a planned turn runs a segment
        for call_id in run.segments[run.segment]:
            if add:
                index.setdefault(call_id, []).append(run)
                continue
            turns = index.get(call_id)
            if turns is None:
                continue
            if run in turns:
                turns.remove(run)  # short: the turns naming this one call
            if not turns:
                del index[call_id]
        if not index:
            self._segment_turns = None

    def _published(self, call_id: str) -> bool:
        record = self.records.get(call_id)
        return record is not None and record.published

    def _end_turn(self, run: TurnState) -> None:
        # Every segment ran to its end, so every call has its one published result. From here
        # a repeated turn is answered from the records (`_follow_turn`).
        run.finished = True
        self._active_turns.pop(run, None)
        followers, run.followers = run.followers, []

        def send(results: list[Result]) -> list[Effect]:
            run.done = True
            self._wake_replies(run)
            return [
                Send(conn, TurnResultEvent(self.chat_id, run.turn_id, results))
                for conn in followers
            ]

        self._deliver(list(run.call_ids), send)  # pins them until sent
        for call_id in run.call_ids:
            record = self.records.get(call_id)
            if record is not None:
                record.unpin()  # the turn's own pins end here

    def _turn_slot_freed(self, record: ToolCallRecord, call: CallState) -> None:
        """A turn call ended: its slot goes to the next call waiting for one. A call that
        ended while it waited (canceled) leaves the queue."""
        run = call.turn
        if run is None:
            if record.turn_id is not None:
                waiting_in = self.turns.get(record.turn_id)
                if waiting_in is not None:
                    waiting_in.still_waiting.discard(record.call_id)
            return
        call.turn = None
        run.running -= 1
        while run.waiting and run.running < planner.MAX_PARALLEL_CALLS:
            call_id = run.waiting.popleft()
            if call_id not in run.still_waiting:
                continue  # it ended while it waited
            run.still_waiting.discard(call_id)
            next_record = self.records.get(call_id)
            next_call = self.calls.get(call_id)
            if next_record is None or next_call is None:
                continue
            run.running += 1
            next_call.turn = run
            self._launch(next_record, next_call)

    # -----------------------------------------------------------------------------------------
    # Results

    def _finish(self, record: ToolCallRecord, result: Result) -> None:
        """Save the one result and publish it once durable. The first finish wins."""
        if not self.records.finish(record, result):
            return
        if self._launching:
            self._free_slot(self._launching, record.call_id)
        call = self.calls.get(record.call_id)
        if call is not None and (call.turn is not None or record.turn_id is not None):
            self._turn_slot_freed(record, call)  # a turn's call: its slot, or its place waiting
        # The age of a record counts from its end too: a call that ran longer than
        # forget_after_s must not be forgotten (and run again on a retry) the moment it ends.
        self.records.touch(record, self._now)
        if not self.config.journal_enabled:
            self._publish(record)
            return
        self._out.append(JournalWrite(self._row(record, call), ResultDurable(record.call_id)))

    def _on_result_durable(self, event: ResultDurable) -> None:
        record = self.records.get(event.call_id)
        if record is not None and record.done and not record.published:
            self._publish(record)

    def _on_journal_failed(self, event: JournalFailed) -> None:
        """The journal refused a row of this call. Before its effect: the call ends as an
        agent failure (not_run). A result's row: it is amended to the agent failure and saved
        if the journal takes that row; if not, answered from memory (PROTOCOL.md 9.9)."""
        record = self.records.get(event.call_id)
        if record is None or record.published:
            return
        call = self.calls.get(event.call_id)
        if not record.done:
            self._on_tool_failed(ToolFailed(event.call_id))
            return
        if call is None or call.amended:
            # The failure's own row was refused too, or the row of a record with no call to
            # amend (a cancel's tombstone, a record rebuilt at a restart): answered from memory
            # and kept there (a restart then finds the row before it, or none: nothing ran, or
            # `unknown`).
            self._publish(record, unsaved=True)
            return
        call.amended = True
        self.records.amend(record, self._failure_result(record))
        self._out.append(JournalWrite(self._row(record, call), ResultDurable(record.call_id)))

    def _publish(self, record: ToolCallRecord, *, unsaved: bool = False) -> None:
        """The saved result is durable (or, `unsaved`, the journal refused it): answer every
        request waiting for it."""
        result = record.result
        assert result is not None
        self.records.publish(record)
        if record.touched_at < self._now:
            # Its result waited (for its commit): its age counts from now, when it goes out.
            # Else a commit slower than forget_after_s let the next new call forget the record
            # at once, and the shell dropped its result with its follow before the connection's
            # sender took it (tests/test_answer_follow.py found it).
            self.records.touch(record, self._now)
        call = self.calls.pop(record.call_id, None)
        if not self.calls:
            self.calls = {}  # an emptied dict keeps its grown table: 120 bytes per idle chat
        event = ResultEvent(self.chat_id, record.call_id, result)
        if call is not None:
            if call.held_accepted is not None:
                self._send_held_accepted(call)
            for conn, follower in call.followers.items():
                if follower.answer_only:  # no subscription: nothing to send it after
                    for _ in range(follower.owed):
                        self._out.append(Send(conn, event))
                else:
                    for _ in range(follower.owed):
                        self._out.append(SendResult(conn, record.call_id, event))
                follower.owed = 0
        self._out.append(CallEnded(record.call_id, result))
        if self.config.journal_keeps_results and not unsaved:
            # Durable now, so the journal holds it: off the heap, but kept among the recent
            # results for the retry that often follows.
            self.results.put((self.chat_id, record.call_id), self.records.release_result(record))
        segment_turns = self._segment_turns
        if segment_turns is not None:
            for run in segment_turns.get(record.call_id, ()):
                # After this input: a request that ends several calls (an interrupt) ends them
                # all before the turn's next segment could start any of them.
                if not run.to_advance:
                    run.to_advance = True
                    self._advance_after(run)
        if self._replies is not None:
            self._replies.wake(record.call_id)

    def _deliver(self, call_ids: list[str], send: Callable[[list[Result]], list[Effect]]) -> None:
        """Send the saved results of published calls: at once when they are on the heap and
        no earlier delivery of this chat is still waiting, else once read back from the
        journal. Deliveries keep their order, so a turn_result never overtakes a call's result,
        nor `interrupted` a turn_result. The records stay pinned until sent."""
        if not self._lane:
            results: list[Result] = []
            for call_id in call_ids:
                found = self._saved_result(call_id)
                if found is None:
                    break
                results.append(found)
            else:
                self._out.extend(send(results))
                return
        for call_id in call_ids:
            record = self.records.get(call_id)
            assert record is not None, f"a delivery lost its record {call_id}"
            record.pin()
        self._lane.append(_Delivery(call_ids, send))
        if not self._reading:
            self._read_back()

    def _saved_result(self, call_id: str) -> Result | None:
        record = self.records.get(call_id)
        assert record is not None and record.published
        if record.result is not None:
            return record.result
        return self.results.get((self.chat_id, call_id))

    def _read_back(self) -> None:
        """One journal read for every delivery waiting (a turn, a burst of retries). What is
        on the heap now is taken now: a saved result never changes, so either is the same."""
        wanted: list[str] = []
        for delivery in self._lane:
            for call_id in delivery.call_ids:
                if call_id in self._lane_held:
                    continue
                found = self._saved_result(call_id)
                if found is None:
                    wanted.append(call_id)
                else:
                    self._lane_held[call_id] = found
        if wanted:
            self._reading = True
            self._out.append(ReadBack(tuple(dict.fromkeys(wanted))))
        else:
            self._drain_lane()

    def _on_results_read(self, event: ResultsRead) -> None:
        self._reading = False
        for call_id, result in event.results.items():
            self.results.put((self.chat_id, call_id), result)
            self._lane_held[call_id] = result
        self._drain_lane()

    def _on_results_read_failed(self, event: ResultsReadFailed) -> None:
        """The journal could not give these saved results back (the shell retried first).
        Each delivery waiting on one still gets exactly one result for it (PROTOCOL.md 5.0: an
        `accepted` went out, so an `error` may not follow): `unknown` with the agent-failure
        text, which is what the agent can truthfully say of it now. The record and its row are
        untouched: nothing is saved, and a later repeat reads the saved result again."""
        self._reading = False
        for call_id, result in event.results.items():
            self.results.put((self.chat_id, call_id), result)
            self._lane_held[call_id] = result
        for call_id in event.call_ids:
            record = self.records.get(call_id)
            if record is not None and call_id not in self._lane_held:
                self._lane_held[call_id] = self._unreadable_result(record)
        self._drain_lane()

    def _unreadable_result(self, record: ToolCallRecord) -> Result:
        return self._plain_result(record, Outcome.UNKNOWN, TEXT_AGENT_FAILURE)

    def _drain_lane(self) -> None:
        held = self._lane_held
        while self._lane:
            delivery = self._lane[0]
            if any(call_id not in held for call_id in delivery.call_ids):
                self._read_back()
                return
            del self._lane[0]
            for call_id in delivery.call_ids:
                record = self.records.get(call_id)
                if record is not None:
                    record.unpin()
            self._out.extend(delivery.send([held[call_id] for call_id in delivery.call_ids]))
        held.clear()

    def _settle(self) -> None:
        """Send every pending reply whose wait is over (in the order they were asked). Only
        the replies woken by this input are asked (`_ReplyBook`); one still blocked is filed
        under what blocks it now."""
        book = self._replies
        assert book is not None
        while book.woken:
            woken, book.woken = book.woken, {}
            ready: list[_PendingReply] = []
            for reply in woken.values():
                blocked_on = reply.blocker()
                if blocked_on is None:
                    ready.append(reply)
                else:
                    book.by_blocker.setdefault(blocked_on, []).append(reply)
            ready.sort(key=lambda reply: reply.seq)
            book.count -= len(ready)
            for reply in ready:
                reply.fire()  # may wake others (a turn's result sent): the loop goes on
        if book.count == 0:
            self._replies = None

    # -----------------------------------------------------------------------------------------
    # Results: building

    def _plain_result(self, record: ToolCallRecord, outcome: Outcome, text: str) -> Result:
        call = self.calls.get(record.call_id)
        tool = call.spec.tool if call is not None else (record.tool or "")
        return call_results.plain_result(record, tool, outcome, text, self._wall_ms)

    def _finish_killed_after(
        self, record: ToolCallRecord, snapshot: ProcessSnapshot, kill_after_ms: int
    ) -> None:
        """The keeper stopped the command at its hard deadline while no agent ran (10.1):
        `timed_out`, with 9.2's text, as if the agent had stopped it."""
        self._finish(
            record,
            self._execute_result(
                record,
                snapshot,
                Outcome.TIMED_OUT,
                timed_out=True,
                text=text_killed_after(kill_after_ms),
            ),
        )

    def _execute_result(
        self,
        record: ToolCallRecord,
        snapshot: ProcessSnapshot,
        outcome: Outcome,
        *,
        timed_out: bool = False,
        text: str | None = None,
    ) -> Result:
        call = self.calls.get(record.call_id)
        group = self.groups.get(record.call_id)
        return call_results.execute_result(
            record,
            outcome=outcome,
            snapshot=snapshot,
            timeout_ms=call.spec.timeout_ms if call is not None else None,
            timed_out=timed_out,
            canceled=outcome is Outcome.CANCELED or (group is not None and group.canceled),
            finished_ms=self._wall_ms,
            text=text,
        )

    # -----------------------------------------------------------------------------------------
    # Forgetting (PROTOCOL.md 5.4)

    def _forget_some(self) -> None:
        """Forgetting is checked on insert too (like the anchor's agent), in O(forgotten)."""
        forgotten = self.records.forget_expired(self._now, self.config.forget_after_s)
        for record in forgotten:
            if self.config.journal_enabled:
                self._out.append(JournalDelete(record.call_id))
            # A new call with this id is a new record: never answered with this result, not
            # from the cache and not from what the lane took for an earlier delivery (it keeps
            # what it took until its last delivery is out).
            self.results.discard((self.chat_id, record.call_id))
            self._lane_held.pop(record.call_id, None)
            self.calls.pop(record.call_id, None)
            self._out.append(Forgotten(record.call_id))
        if forgotten and self.turns:
            # A finished turn goes with any of its calls (also one another request made): its
            # repeat is a new turn, never answered with a new record's result. (One pass for
            # all that were forgotten, not one per forgotten record.)
            gone = {record.call_id for record in forgotten}
            for turn_id, run in list(self.turns.items()):
                if run.done and not gone.isdisjoint(run.call_ids):
                    del self.turns[turn_id]
        if self.closed and not self.records and self._close_row != _CLOSE_QUEUED:
            # Gone: its id may be used again (9.6), also after a restart. (A close still on
            # its way to disk stays until it lands: its reply waits for it.)
            self.closed = False
            if self._close_row == _CLOSE_DURABLE:
                self._close_row = _NO_CLOSE_ROW
                self._out.append(JournalReopen())
        if self.approved_tools and not self.records:
            # "For as long as the chat has records" (9.5): the approval goes with the last one.
            self.approved_tools = ()
            if self.config.journal_enabled:
                self._out.append(JournalForgetApprovals())

    def _on_sweep(self, event: Sweep) -> None:
        self._forget_some()
        self._drop_exited_processes()

    def _listed_process(self, call_id: str) -> ListedProcess | None:
        return None if self._listed is None else self._listed.get(call_id)

    def _drop_exited_processes(self) -> None:
        """An exited command stays listed for `exited_retention_s` after its exit, and while
        its output has not ended (something may still print to it): then it goes (5.2)."""
        listed = self._listed
        if listed is None:
            return
        keep_until = self._now - self.config.exited_retention_s
        gone = [
            call_id
            for call_id, process in listed.items()
            if process.exited_at is not None
            and process.output_closed
            and process.exited_at <= keep_until
        ]
        for call_id in gone:
            del listed[call_id]
            self._out.append(DropProcess(call_id))
        if not listed:
            self._listed = None

    # -----------------------------------------------------------------------------------------
    # The journal

    def _row(self, record: ToolCallRecord, call: CallState | None) -> JournalRow:
        """The row that remembers `record` as it is now (with the call as it was requested).

        Its args only while the record awaits approval: a parked gate is announced again after
        a restart, args and all, and runs once approved. A call that runs or ran needs only its
        fingerprint (a repeat with other args is a conflict): after a restart it ends `unknown`
        or serves its saved result. Keeping args out of those rows keeps a 16 MiB `write_file`
        out of the journal, where it would be written twice and every other chat's commit would
        wait behind it (docs/benchmarks.md, `bigwrite`)."""
        spec = call.spec if call is not None else CallSpec(record.call_id, record.tool or "", None)
        parked = record.state is RecordState.AWAITING_APPROVAL
        return JournalRow(
            chat_id=self.chat_id,
            call_id=record.call_id,
            state=record.state.value,
            tool=record.tool,
            fingerprint=record.fingerprint,
            args=spec.args if parked else None,
            sandbox=None if spec.sandbox is None else spec.sandbox.to_wire(),
            timeout_ms=spec.timeout_ms,
            background=spec.background,
            approval=spec.approval,
            turn_id=record.turn_id,
            result=record.result,
            started_at_ms=record.started_at_ms,
            touched_at_ms=self._wall_ms,
        )

    def _journal_write(self, record: ToolCallRecord) -> None:
        if self.config.journal_enabled and record.state is not RecordState.QUEUED:
            self._out.append(JournalWrite(self._row(record, self.calls.get(record.call_id))))

    def _journal_touch(self, record: ToolCallRecord) -> None:
        if self.config.journal_enabled and record.state is not RecordState.QUEUED:
            self._out.append(JournalTouch(record.call_id, self._wall_ms))

    def _on_restored(self, event: Restored) -> None:
        """Rebuild one record after a restart (PROTOCOL.md promise 1): a saved result is
        served again as it was; a call that was running when the agent died ends `unknown`
        and never runs again; a parked gate is parked again."""
        row = event.row
        spec = CallSpec(
            row.call_id,
            row.tool or "",
            row.args,
            row.timeout_ms,
            row.background,
            row.approval,
            sandbox=policy_from_row(row.sandbox),
        )
        record = ToolCallRecord(
            call_id=row.call_id,
            tool=None if row.tool is None else shared_tool_name(row.tool),
            fingerprint=row.fingerprint,
            state=RecordState(row.state),
            touched_at=event.touched_at,
            effect_started=row.started_at_ms is not None or row.state == "running",
            started_at_ms=row.started_at_ms,
            result=row.result,
            outcome=row.result.outcome if row.result is not None else None,
            turn_id=row.turn_id,
        )
        self.records.restore(record)
        kept = event.kept
        if record.state is RecordState.DONE:
            if record.result is None:
                raise ValueError(
                    f"journal row {row.chat_id!r}/{row.call_id!r} is done without a result"
                )
            # Durable and published as it was before the restart.
            self.records.publish(record)
            self._wake_replies(record.call_id)
            if self.config.journal_keeps_results:
                self.records.release_result(record)
            if kept is not None and not (kept.held and self._readopt(record, None, kept)):
                self._out.append(ReleaseKept(record.call_id))
            # (A held one: its call returned, background or at its timeout_ms, and its process
            # goes on: listed, readable, stopped by its kill_after_ms as before, 10.1.)
            return
        call = CallState(spec=spec)
        self.calls[row.call_id] = call
        if record.state is RecordState.RUNNING:
            if kept is not None and kept.held and self._readopt(record, call, kept):
                return
            if kept is not None:
                self._out.append(ReleaseKept(record.call_id))
                # Gone without a recorded exit (a reboot, or its keeper killed): `unknown`,
                # with the output recorded up to then (10.1).
                self._finish(
                    record,
                    self._execute_result(
                        record, kept.snapshot, Outcome.UNKNOWN, text=TEXT_AGENT_RESTARTED
                    ),
                )
                return
            self._finish(record, self._plain_result(record, Outcome.UNKNOWN, TEXT_AGENT_RESTARTED))
        elif record.state is RecordState.AWAITING_APPROVAL:
            try:
                call.parsed = parse_args(lookup(spec.tool), spec.args)
            except ToolwireError as exc:
                call.invalid = exc.message
            call.gate_open = True
            if self.config.approval_timeout_s is not None:
                self._out.append(
                    StartTimer(
                        (record.call_id, "gate"),
                        self._now + self.config.approval_timeout_s,
                        GateExpired(record.call_id),
                    )
                )

    def _on_recovered(self, event: Recovered) -> None:
        """After its records, what the journal kept of the chat. An approval lasts while the
        chat has records (9.5), and a closed chat whose records are all forgotten is gone, its
        id free again (9.6): with records, each approved tool is approved again (a gate of it
        parked when the agent died, its opening not yet durable, opens) and a durable close
        keeps the chat closed; without (a crash between forgetting the last record and these
        rows), the rows are dropped."""
        if not self.records:
            if event.approved_tools and self.config.journal_enabled:
                self._out.append(JournalForgetApprovals())
            if event.closed:
                self._out.append(JournalReopen())
            return
        for tool in event.approved_tools:
            if tool not in self.approved_tools:
                self.approved_tools += (tool,)
            self._open_approved(tool)
        if event.closed:
            self.closed = True
            self._close_row = _CLOSE_DURABLE

    def _readopt(self, record: ToolCallRecord, call: CallState | None, kept: KeptCall) -> bool:
        """Ask the shell to re-adopt a restored call's process. Its deadlines count from the
        FIRST start, as before the restart (5.2, 9.2): one that passed meanwhile fires at
        once. False when its recorded args no longer parse (then it is not adopted)."""
        try:
            parsed = parse_args(lookup("execute"), kept.args)
        except ToolwireError:
            return False
        if not isinstance(parsed, ExecuteArgs):
            return False
        started = record.started_at_ms if record.started_at_ms is not None else self._wall_ms
        since_start_s = (self._wall_ms - started) / 1000
        kill_at = None
        if parsed.kill_after_ms:
            kill_at = self._now + parsed.kill_after_ms / 1000 - since_start_s
        # Stopped by its keeper at that deadline already: nothing is stopped again.
        killed = kept.killed_after and bool(parsed.kill_after_ms)
        if call is not None:
            call.parsed = parsed
            call.kill_at = None if killed else kill_at
            if call.spec.timeout_ms:
                record.deadline = self._now + call.spec.timeout_ms / 1000 - since_start_s
        self._adopting[record.call_id] = (parsed.kill_after_ms or None, kill_at, killed)
        self._out.append(Adopt(record.call_id))
        return True

    def _on_adopted(self, event: Adopted) -> None:
        """The re-adopted process is back: a call still owed its result goes on as one just
        spawned; one that returned before the restart only has its process back."""
        kill_after_ms, kill_at, killed = self._adopting.pop(event.call_id, (None, None, False))
        record = self.records.get(event.call_id)
        call = self.calls.get(event.call_id)
        if record is not None and record.state is RecordState.RUNNING and call is not None:
            self._process_started(record, call, Spawned(event.call_id, event.pid, event.snapshot))
        else:
            self._hold_slot(self._running_processes, event.call_id)
            if self._listed is None:
                self._listed = {}
            self._listed[event.call_id] = ListedProcess()
            group = GroupState(started_at_ms=(record.started_at_ms or 0) if record else 0)
            self.groups[event.call_id] = group
            if kill_after_ms is not None and kill_at is not None and not killed:
                group.kill_after_ms = kill_after_ms
                self._out.append(
                    StartTimer((event.call_id, "kill_after"), kill_at, KillAfter(event.call_id))
                )
        adopted = self.groups.get(event.call_id)
        if killed and adopted is not None and kill_after_ms is not None:
            # The keeper stopped it at its hard deadline while no agent ran (9.2 as the agent
            # does it): its listing says `timed_out`, and a result still owed is `timed_out`
            # with the deadline's text once it is gone (`_on_process_exited`).
            adopted.kill_after_ms = kill_after_ms
            adopted.killed_after = True
            self._out.append(MarkTimedOut(event.call_id))

    # -----------------------------------------------------------------------------------------

    def _closed_error(self) -> ToolwireError:
        return ToolwireError(
            "chat_closed",
            f"chat {self.chat_id!r} was closed: a retry of one of its calls gets the saved "
            "result, but nothing new starts in it until its records are forgotten",
        )

    def _unknown_call(self, call_id: str) -> ToolwireError:
        return ToolwireError("unknown_call", f"no call {call_id!r} in chat {self.chat_id!r}")

    # Each input's handler, by the input's type; a subclass (the simulation's planted bugs)
    # overrides a handler by its name and gets its own table.
    _handlers: dict[type, Callable[[ChatState, Any], None]]

    def __init_subclass__(cls) -> None:
        super().__init_subclass__()
        cls._handlers = _handler_table(cls)


_HANDLER_NAMES: dict[type, str] = {
    CallRequest: "_on_call",
    AttachRequest: "_on_attach",
    DetachRequest: "_on_detach",
    ApproveRequest: "_on_approve",
    CancelRequest: "_on_cancel",
    TurnRequest: "_on_turn",
    TurnPlanned: "_on_turn_planned",
    InterruptRequest: "_on_interrupt",
    CloseChatRequest: "_on_close_chat",
    StartDurable: "_on_start_durable",
    ResultDurable: "_on_result_durable",
    JournalFailed: "_on_journal_failed",
    ToolEnded: "_on_tool_ended",
    ToolStopped: "_on_tool_stopped",
    ToolFailed: "_on_tool_failed",
    Spawned: "_on_spawned",
    SpawnFailed: "_on_spawn_failed",
    ProcessExited: "_on_process_exited",
    OutputClosed: "_on_output_closed",
    AlreadyExited: "_on_already_exited",
    GroupEmpty: "_on_group_empty",
    GraceOver: "_on_group_empty",
    GroupStopped: "_on_group_stopped",
    GroupGone: "_on_group_gone",
    GroupLost: "_on_group_lost",
    Deadline: "_on_deadline",
    GateExpired: "_on_gate_expired",
    KillAfter: "_on_kill_after",
    ResultsRead: "_on_results_read",
    ResultsReadFailed: "_on_results_read_failed",
    Restored: "_on_restored",
    Recovered: "_on_recovered",
    Adopted: "_on_adopted",
    HolderGone: "_on_holder_gone",
    CloseDurable: "_on_close_durable",
    CloseFailed: "_on_close_failed",
    Shutdown: "_on_shutdown",
    Sweep: "_on_sweep",
}


def _handler_table(cls: type[ChatState]) -> dict[type, Callable[[ChatState, Any], None]]:
    table: dict[type, Callable[[ChatState, Any], None]] = {
        kind: getattr(cls, name) for kind, name in _HANDLER_NAMES.items()
    }
    return table


ChatState._handlers = _handler_table(ChatState)


# ---------------------------------------------------------------------------------------------
# Turns: pure helpers


def turn_fingerprint(specs: list[CallSpec]) -> bytes:
    """What a repeated turn must match: every call with its id, tool, args and options. The
    args by their fingerprint (`CallSpec.fingerprint`): a turn's big args are then encoded
    once, for the call's own fingerprint, or not at all on the loop where the transport made
    it. Kept in memory only (`TurnState`), never journaled, so its definition may change."""
    return args_fingerprint(
        "turn",
        [
            [s.call_id, s.tool, s.fingerprint(), s.timeout_ms, s.background, s.approval]
            for s in specs
        ],
    )


def check_new_turn(records: RecordTable, specs: list[CallSpec]) -> list[bytes]:
    """Refuse a new turn before anything is admitted: no calls, a call id twice, or a call id
    already used with another tool or other args. Returns each call's args fingerprint."""
    if not specs:
        raise ToolwireError("bad_args", "turn: calls must not be empty")
    seen: set[str] = set()
    fingerprints = [spec.fingerprint() for spec in specs]
    for spec, fp in zip(specs, fingerprints, strict=True):
        if spec.call_id in seen:
            raise ToolwireError(
                "bad_args", f"turn: call_id {spec.call_id!r} appears twice in one turn"
            )
        seen.add(spec.call_id)
        record = records.get(spec.call_id)
        if (
            record is not None
            and record.tool is not None
            and (record.tool != spec.tool or record.fingerprint != fp)
        ):
            raise conflict_error(record)
    return fingerprints


__all__ = [
    "CallState",
    "ChatConfig",
    "ChatState",
    "Follower",
    "GroupState",
    "ListedProcess",
    "TurnAsk",
    "TurnState",
]
