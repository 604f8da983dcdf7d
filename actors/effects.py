"""The language `ChatState` speaks: the inputs it is handed and the effects it asks for.

Pure data (no trio, no I/O). An input is a request from a connection or a report of something
that happened in the world (a journal commit, a tool's end, a process's exit, a timer). An
effect is something only the shell can do (send an event, write the journal, spawn, signal,
start a timer, read a result back). The shell carries out the effects of one input in order and
feeds what they report back in as new inputs, one at a time, in the order they happened.

A connection is an opaque, hashable `Conn` here: the shell's outbox. `ChatState` only uses it
as a key and hands it back in effects.

Each is a frozen msgspec Struct, not a frozen dataclass: a trivial call makes half a dozen of
them, and msgspec builds one in C, where a frozen dataclass's `__init__` runs Python bytecode
and an `object.__setattr__` per field (docs/benchmarks.md, issue 29).
"""

from __future__ import annotations

from collections.abc import Hashable

import msgspec

from toolwire.actors.calls import CallSpec
from toolwire.actors.events import Event, Rid, StartedEvent
from toolwire.actors.journal_rows import JournalRow
from toolwire.actors.planner import Reservation
from toolwire.actors.results import Result, ToolReport
from toolwire.actors.sandbox_policy import SandboxPolicy

Conn = Hashable


class ProcessSnapshot(msgspec.Struct, frozen=True):
    """What a command has done so far, as its result tells it (PROTOCOL.md 5.2)."""

    process_id: str
    exit_code: int | None
    signal: str | None
    exited: bool
    output: str
    output_bytes: int
    truncated_bytes: int


# ---------------------------------------------------------------------------------------------
# Inputs: requests (each raises ToolwireError and changes nothing when it is refused)


class CallRequest(msgspec.Struct, frozen=True):
    conn: Conn
    spec: CallSpec
    stream: bool
    rid: Rid
    # Where this request's output starts (PROTOCOL.md 10.2); an ended call sends none.
    from_offset: int = 0


class AttachRequest(msgspec.Struct, frozen=True):
    conn: Conn
    call_id: str
    from_offset: int
    rid: Rid


class DetachRequest(msgspec.Struct, frozen=True):
    conn: Conn
    call_id: str


class ApproveRequest(msgspec.Struct, frozen=True):
    conn: Conn
    call_id: str
    approved: bool
    rid: Rid
    reason: str | None = None
    scope: str = "call"


class CancelRequest(msgspec.Struct, frozen=True):
    conn: Conn
    call_ids: tuple[str, ...]
    rid: Rid


class TurnRequest(msgspec.Struct, frozen=True):
    """A new turn is admitted at once, but planned only once the shell has resolved what its
    calls reserve (`ResolveTurn`, then `TurnPlanned`): resolving paths reads the filesystem."""

    conn: Conn
    turn_id: str
    specs: tuple[CallSpec, ...]
    stream: bool
    rid: Rid


class InterruptRequest(msgspec.Struct, frozen=True):
    conn: Conn
    turn_id: str | None
    rid: Rid


class CloseChatRequest(msgspec.Struct, frozen=True):
    conn: Conn
    rid: Rid


# ---------------------------------------------------------------------------------------------
# Inputs: what happened


class StartDurable(msgspec.Struct, frozen=True):
    """The journal holds the call's "started" row: its effect may happen now."""

    call_id: str


class ResultDurable(msgspec.Struct, frozen=True):
    """The journal holds the call's result: it may be sent."""

    call_id: str


class JournalFailed(msgspec.Struct, frozen=True):
    """The journal refused a row of this call (the shell logged why)."""

    call_id: str


class ToolEnded(msgspec.Struct, frozen=True):
    call_id: str
    report: ToolReport


class ToolStopped(msgspec.Struct, frozen=True):
    """A wait that `StopRun` ended (process_output): the call was canceled while running."""

    call_id: str


class ToolFailed(msgspec.Struct, frozen=True):
    """An exception inside the agent while running or carrying out this call (logged)."""

    call_id: str


class Spawned(msgspec.Struct, frozen=True):
    call_id: str
    pid: int
    snapshot: ProcessSnapshot


class SpawnFailed(msgspec.Struct, frozen=True):
    call_id: str
    reason: str


class ProcessExited(msgspec.Struct, frozen=True):
    """The command's shell (the group's leader) exited and was reaped."""

    call_id: str
    snapshot: ProcessSnapshot


class HolderGone(msgspec.Struct, frozen=True):
    """The keeper holding the command (PROTOCOL.md 10.1) is gone while this agent runs: its
    exit can no longer be learnt. The shell killed what was left of its group; `snapshot` has
    the output read up to then."""

    call_id: str
    snapshot: ProcessSnapshot


class OutputClosed(msgspec.Struct, frozen=True):
    """Nothing holds the command's output pipe any more (no member of its group is left
    that could still print)."""

    call_id: str


class AlreadyExited(msgspec.Struct, frozen=True):
    """A `StopGroup` found nothing to stop (the command already exited, or for a hard
    deadline no member of its group alive): nothing was signaled."""

    call_id: str


class GroupEmpty(msgspec.Struct, frozen=True):
    """The process group of a command being stopped has no member left."""

    call_id: str


class GraceOver(msgspec.Struct, frozen=True):
    """The kill grace of a stop ended with members still in the group."""

    call_id: str


class GroupStopped(msgspec.Struct, frozen=True):
    """After the SIGKILL: the group is gone (or never will be: an unkillable member)."""

    call_id: str
    snapshot: ProcessSnapshot


class GroupLost(msgspec.Struct, frozen=True):
    """A step on the command's process group (a stop, a kill, a watch) failed in the shell at
    once (logged): what that step would have reported will never come."""

    call_id: str


class GroupGone(msgspec.Struct, frozen=True):
    """A watched group (`WatchGroup`) has no member left."""

    call_id: str


class TurnPlanned(msgspec.Struct, frozen=True):
    """What each call of the turn reserves, in request order, its paths canonical (the answer
    to `ResolveTurn`). `failure`: the shell could not resolve them (it logged why), and says
    what went wrong; `reservations` is then empty."""

    turn_id: str
    reservations: tuple[Reservation, ...]
    failure: str | None = None


class Deadline(msgspec.Struct, frozen=True):
    """A call's `timeout_ms` passed; the snapshot is its command's at that moment."""

    call_id: str
    snapshot: ProcessSnapshot | None


class GateExpired(msgspec.Struct, frozen=True):
    call_id: str


class KillAfter(msgspec.Struct, frozen=True):
    """A command's hard deadline (`kill_after_ms`, PROTOCOL.md 9.2) passed."""

    call_id: str


class ResultsRead(msgspec.Struct, frozen=True):
    """Results read back from the journal for the deliveries waiting on them."""

    results: dict[str, Result]


class ResultsReadFailed(msgspec.Struct, frozen=True):
    """The journal could not give back the saved results of `call_ids` (the read failed
    after its retries, or their rows are gone; the shell logged why); `results` holds what it
    did read of the same read-back."""

    call_ids: tuple[str, ...]
    results: dict[str, Result] = msgspec.field(default_factory=dict)


class KeptCall(msgspec.Struct, frozen=True):
    """What the keeper recorded of a record's command while no agent ran (PROTOCOL.md 10.1):
    the `execute` args it was started with, and whether its process is still there to re-adopt
    (`held`: running, or exited with its status recorded). One not held is gone unrecorded,
    and `snapshot` is the output recorded up to then."""

    args: object
    held: bool
    snapshot: ProcessSnapshot
    # The keeper stopped its group when its kill_after_ms passed while no agent ran (9.2).
    killed_after: bool = False


class Restored(msgspec.Struct, frozen=True):
    """One record rebuilt from the journal after a restart; `kept` when the keeper recorded
    its command."""

    row: JournalRow
    touched_at: float
    kept: KeptCall | None = None


class Adopted(msgspec.Struct, frozen=True):
    """The shell re-adopted a restored call's process (after `Adopt`)."""

    call_id: str
    pid: int
    snapshot: ProcessSnapshot


class Recovered(msgspec.Struct, frozen=True):
    """Every record of this chat is rebuilt (`Restored`); what else the journal held for it:
    the tools it approved with scope "chat" (9.5) and whether its close row (9.6) was durable.
    ChatState decides what of it still holds."""

    approved_tools: tuple[str, ...] = ()
    closed: bool = False


class CloseDurable(msgspec.Struct, frozen=True):
    """The journal holds the chat's close row: its `chat_closed` may be sent."""


class CloseFailed(msgspec.Struct, frozen=True):
    """The journal refused the chat's close row (the shell logged why)."""


class Shutdown(msgspec.Struct, frozen=True):
    """The agent stops (PROTOCOL.md 9.3): every running call is stopped and saved, every
    process group stopped; nothing new starts. `ShutdownDone` says when it is over."""


class Sweep(msgspec.Struct, frozen=True):
    """Periodic housekeeping: forget what expired."""


Input = (
    CallRequest
    | AttachRequest
    | DetachRequest
    | ApproveRequest
    | CancelRequest
    | TurnRequest
    | InterruptRequest
    | CloseChatRequest
    | StartDurable
    | ResultDurable
    | JournalFailed
    | ToolEnded
    | ToolStopped
    | ToolFailed
    | Spawned
    | SpawnFailed
    | ProcessExited
    | OutputClosed
    | AlreadyExited
    | GroupEmpty
    | GraceOver
    | GroupStopped
    | GroupGone
    | GroupLost
    | TurnPlanned
    | Deadline
    | GateExpired
    | KillAfter
    | ResultsRead
    | ResultsReadFailed
    | Restored
    | Recovered
    | Adopted
    | HolderGone
    | CloseDurable
    | CloseFailed
    | Shutdown
    | Sweep
)


# ---------------------------------------------------------------------------------------------
# Effects: sending


class FollowMode:
    """How `Follow` places a connection on a call (see `Follow`)."""

    SUBSCRIBE = "subscribe"  # follow its events; the cursor stays (a new call, a turn's call)
    LIVE = "live"  # a request that waits for the result: stream the output it owes
    REPLAY = "replay"  # the call ended: its result (and retained output) comes as a replay
    # A new call that sends nothing but its `accepted` and its result (a tool run on the loop,
    # no gate, no turn): no output, no `started`, no approval events. The shell queues the
    # events and keeps no subscription; the result comes as a `Send`, not a `SendResult`.
    ANSWER = "answer"


class Follow(msgspec.Struct, frozen=True):
    """`conn` follows the call from now on (a detached follower follows again), `events` go
    to it first, in order; then, by `mode`: SUBSCRIBE leaves the cursor where it is (a new
    follow of a new call starts at `from_offset`, if given: PROTOCOL.md 10.2); LIVE places the
    output cursor at `from_offset` (with `rewind_only`: only if that is earlier than where it
    is, since an earlier request on this connection still owes the output in between, PROTOCOL.md
    9.9) and sends `started`; ANSWER only queues the events (the call will send nothing but
    its result, which comes as a `Send`: no subscription is kept); REPLAY marks a replay as
    queued (its `SendReplay` follows) and leaves the live follow as it is. `stream` and
    `resolved_events` (LIVE and SUBSCRIBE) are how the connection follows from now on, as
    ChatState decided them: the shell stores them as they are."""

    conn: Conn
    call_id: str
    stream: bool
    resolved_events: bool
    events: tuple[Event, ...]
    mode: str
    from_offset: int | None = None
    started: StartedEvent | None = None
    rewind_only: bool = False


class Send(msgspec.Struct, frozen=True):
    """One event to one connection, in order after what was sent before. `call_id`: the
    call whose follow it belongs to (the shell drops it for a detached follower unless it is
    a reply), or None for a reply of its own."""

    conn: Conn
    event: Event
    call_id: str | None = None


class Publish(msgspec.Struct, frozen=True):
    """An event of a call to the connections following it: those in `to`, or all of them
    (None). ChatState names them for a streamed event (`started`, `approval_resolved`): only a
    connection whose `accepted` of a request that brings the event was sent before, so nothing
    a connection has not asked for yet comes ahead of that `accepted` (PROTOCOL.md 9.9)."""

    call_id: str
    event: Event
    to: tuple[Conn, ...] | None = None


class SendResult(msgspec.Struct, frozen=True):
    """The result one request on `conn` waits for, after the output it owes."""

    conn: Conn
    call_id: str
    event: Event


class SendReplay(msgspec.Struct, frozen=True):
    """The saved result of an ended call for one more request: the retained output from
    `from_offset` first (an attach), or none (a repeated call)."""

    conn: Conn
    call_id: str
    event: Event
    from_offset: int | None


class Detach(msgspec.Struct, frozen=True):
    """`conn` stops receiving the call's events. `keep`: requests on it still wait for the
    call's result (each gets it: PROTOCOL.md 9.9), so the follow stays for them; without it
    the follow goes (a reply already queued for it still goes out)."""

    conn: Conn
    call_id: str
    keep: bool


class Forgotten(msgspec.Struct, frozen=True):
    """The record is gone (5.4): whatever the shell keeps for the call goes too."""

    call_id: str


class ShrinkOutput(msgspec.Struct, frozen=True):
    """The command's output ended (nothing can print to it any more): its retained output
    shrinks to the result's head and tail (PROTOCOL.md 5.2) once no connection still reads the
    full retention from its cursor."""

    call_id: str


class CallEnded(msgspec.Struct, frozen=True):
    """The call's result is durable and sent: count it and log it (operators)."""

    call_id: str
    result: Result


# ---------------------------------------------------------------------------------------------
# Effects: the journal


class JournalWrite(msgspec.Struct, frozen=True):
    """Write the row; feed `then` once it is durable (at once if it already is), or
    `JournalFailed(call_id)` if the journal refuses it."""

    row: JournalRow
    then: StartDurable | ResultDurable | None = None


class JournalTouch(msgspec.Struct, frozen=True):
    call_id: str
    wall_ms: int


class JournalDelete(msgspec.Struct, frozen=True):
    call_id: str


class JournalApproveTool(msgspec.Struct, frozen=True):
    tool: str


class JournalForgetApprovals(msgspec.Struct, frozen=True):
    pass


class JournalClose(msgspec.Struct, frozen=True):
    """Write the chat's close row (9.6: it outlives a restart until the records are all
    forgotten); feed `then` once it is durable."""

    closed_at_ms: int
    then: CloseDurable


class JournalReopen(msgspec.Struct, frozen=True):
    """Delete the chat's close row: its records are all forgotten, its id is free again."""


class ReadBack(msgspec.Struct, frozen=True):
    """Read these calls' saved results back from the journal; feed `ResultsRead`."""

    call_ids: tuple[str, ...]


# ---------------------------------------------------------------------------------------------
# Effects: running


class ResolveTurn(msgspec.Struct, frozen=True):
    """Find what each of the turn's calls reserves (PROTOCOL.md 5.6: paths canonicalised
    against the filesystem, actors/reservations.py), off the event loop when a path must be
    looked at; feed `TurnPlanned`."""

    turn_id: str
    specs: tuple[CallSpec, ...]


class RunTool(msgspec.Struct, frozen=True):
    """Run a non-execute tool with its parsed args; feed `ToolEnded` (or `ToolFailed`).
    `on_loop`: run it right now on the loop (a short file operation); otherwise as a task."""

    call_id: str
    tool: str
    args: msgspec.Struct
    on_loop: bool
    sandbox: SandboxPolicy | None = None  # the call's own (PROTOCOL.md 10.4), before the floor


class StopRun(msgspec.Struct, frozen=True):
    """End a cancelable wait (process_output) now; it feeds `ToolStopped`."""

    call_id: str


class Spawn(msgspec.Struct, frozen=True):
    """Start the command in a process group of its own; feed `Spawned` or `SpawnFailed`
    (with a keeper, once it answered: other inputs may come first, and `ToolFailed` if it never
    does); then `ProcessExited` when its shell exits and `OutputClosed` when its output ends."""

    call_id: str
    args: msgspec.Struct
    started_at_ms: int
    sandbox: SandboxPolicy | None = None  # the call's own (PROTOCOL.md 10.4), before the floor


class Adopt(msgspec.Struct, frozen=True):
    """Re-adopt the restored call's process from the keeper as if it had just been spawned:
    feed `Adopted`, then `ProcessExited` and `OutputClosed` as for any spawn."""

    call_id: str


class ReleaseKept(msgspec.Struct, frozen=True):
    """A restored call's process is not re-adopted (gone without a recorded exit, or its record
    cannot take it back): the shell kills what is left of its group, if anything, and drops
    what the keeper recorded of it."""

    call_id: str


class StopGroup(msgspec.Struct, frozen=True):
    """SIGTERM to the whole group, then feed `GroupEmpty` once it has no member or
    `GraceOver` after `grace_s` (PROTOCOL.md 5.3). With `unless_exited`, a command whose shell
    already exited is left alone and `AlreadyExited` is fed instead; with `only_if_alive`, so
    is a group with no member alive (a hard deadline's stop, 9.2, or what lingers of a spent
    group at a close or a shutdown). What the command's listing (`process_output`) says from
    now on: `timed_out` (its hard deadline stopped it), `canceled` (a stop a client asked for,
    5.3); neither: it keeps the shell's own exit."""

    call_id: str
    grace_s: float
    unless_exited: bool
    only_if_alive: bool = False
    timed_out: bool = False
    canceled: bool = True


class WatchGroup(msgspec.Struct, frozen=True):
    """The command's shell exited and its output pipe closed, but a member may live on that
    writes elsewhere (`nohup server >log 2>&1 &`): feed `GroupGone` once the group has no
    member. Until then closing the chat or stopping the agent stops it (PROTOCOL.md 9.3, 9.6)."""

    call_id: str


class KillGroup(msgspec.Struct, frozen=True):
    """SIGKILL to the whole group, then feed `GroupStopped` once it is gone."""

    call_id: str


class DropProcess(msgspec.Struct, frozen=True):
    """The command exited and its output ended `exited_retention_s` ago: it leaves the
    chat's process listing (PROTOCOL.md 5.2), and `process_output` no longer knows it."""

    call_id: str


class MarkTimedOut(msgspec.Struct, frozen=True):
    """The command outlived its call's deadline: its listing says so from now on."""

    call_id: str


class StartTimer(msgspec.Struct, frozen=True):
    """Feed `fire` at trio time `at` unless `CancelTimer(key)` comes first."""

    key: tuple[str, str]
    at: float
    fire: Deadline | GateExpired | KillAfter


class CancelTimer(msgspec.Struct, frozen=True):
    key: tuple[str, str]


class ShutdownDone(msgspec.Struct, frozen=True):
    """Every call the shutdown stopped has its result saved (durable) and every process group
    of the chat is gone."""


Effect = (
    Follow
    | Send
    | Publish
    | SendResult
    | SendReplay
    | Detach
    | Forgotten
    | ShrinkOutput
    | CallEnded
    | JournalWrite
    | JournalTouch
    | JournalDelete
    | JournalApproveTool
    | JournalForgetApprovals
    | JournalClose
    | JournalReopen
    | ReadBack
    | ResolveTurn
    | RunTool
    | StopRun
    | Spawn
    | Adopt
    | ReleaseKept
    | StopGroup
    | WatchGroup
    | KillGroup
    | DropProcess
    | MarkTimedOut
    | StartTimer
    | CancelTimer
    | ShutdownDone
)
