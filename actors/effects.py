"""The language `ChatState` speaks: the inputs it is handed and the effects it asks for.

Pure data (no trio, no I/O). An input is a request from a connection or a report of something
that happened in the world (a journal commit, a tool's end, a process's exit, a timer). An
effect is something only the shell can do (send an event, write the journal, spawn, signal,
start a timer, read a result back). The shell carries out the effects of one input in order and
feeds what they report back in as new inputs, one at a time, in the order they happened.

A connection is an opaque, hashable `Conn` here: the shell's outbox. `ChatState` only uses it
as a key and hands it back in effects.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field

import msgspec

from toolwire.actors.calls import CallSpec
from toolwire.actors.events import Event, Rid, StartedEvent
from toolwire.actors.journal_rows import JournalRow
from toolwire.actors.planner import Reservation
from toolwire.actors.results import Result, ToolReport
from toolwire.actors.sandbox_policy import SandboxPolicy

Conn = Hashable


@dataclass(frozen=True, slots=True)
class ProcessSnapshot:
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


@dataclass(frozen=True, slots=True)
class CallRequest:
    conn: Conn
    spec: CallSpec
    stream: bool
    rid: Rid
    # Where this request's output starts (PROTOCOL.md 10.2); an ended call sends none.
    from_offset: int = 0


@dataclass(frozen=True, slots=True)
class AttachRequest:
    conn: Conn
    call_id: str
    from_offset: int
    rid: Rid


@dataclass(frozen=True, slots=True)
class DetachRequest:
    conn: Conn
    call_id: str


@dataclass(frozen=True, slots=True)
class ApproveRequest:
    conn: Conn
    call_id: str
    approved: bool
    rid: Rid
    reason: str | None = None
    scope: str = "call"


@dataclass(frozen=True, slots=True)
class CancelRequest:
    conn: Conn
    call_ids: tuple[str, ...]
    rid: Rid


@dataclass(frozen=True, slots=True)
class TurnRequest:
    """A new turn is admitted at once, but planned only once the shell has resolved what its
    calls reserve (`ResolveTurn`, then `TurnPlanned`): resolving paths reads the filesystem."""

    conn: Conn
    turn_id: str
    specs: tuple[CallSpec, ...]
    stream: bool
    rid: Rid


@dataclass(frozen=True, slots=True)
class InterruptRequest:
    conn: Conn
    turn_id: str | None
    rid: Rid


@dataclass(frozen=True, slots=True)
class CloseChatRequest:
    conn: Conn
    rid: Rid


# ---------------------------------------------------------------------------------------------
# Inputs: what happened


@dataclass(frozen=True, slots=True)
class StartDurable:
    """The journal holds the call's "started" row: its effect may happen now."""

    call_id: str


@dataclass(frozen=True, slots=True)
class ResultDurable:
    """The journal holds the call's result: it may be sent."""

    call_id: str


@dataclass(frozen=True, slots=True)
class JournalFailed:
    """The journal refused a row of this call (the shell logged why)."""

    call_id: str


@dataclass(frozen=True, slots=True)
class ToolEnded:
    call_id: str
    report: ToolReport


@dataclass(frozen=True, slots=True)
class ToolStopped:
    """A wait that `StopRun` ended (process_output): the call was canceled while running."""

    call_id: str


@dataclass(frozen=True, slots=True)
class ToolFailed:
    """An exception inside the agent while running or carrying out this call (logged)."""

    call_id: str


@dataclass(frozen=True, slots=True)
class Spawned:
    call_id: str
    pid: int
    snapshot: ProcessSnapshot


@dataclass(frozen=True, slots=True)
class SpawnFailed:
    call_id: str
    reason: str


@dataclass(frozen=True, slots=True)
class ProcessExited:
    """The command's shell (the group's leader) exited and was reaped."""

    call_id: str
    snapshot: ProcessSnapshot


@dataclass(frozen=True, slots=True)
class HolderGone:
    """The keeper holding the command (PROTOCOL.md 10.1) is gone while this agent runs: its
    exit can no longer be learnt. The shell killed what was left of its group; `snapshot` has
    the output read up to then."""

    call_id: str
    snapshot: ProcessSnapshot


@dataclass(frozen=True, slots=True)
class OutputClosed:
    """Nothing holds the command's output pipe any more (no member of its group is left
    that could still print)."""

    call_id: str


@dataclass(frozen=True, slots=True)
class AlreadyExited:
    """A `StopGroup` found nothing to stop (the command already exited, or for a hard
    deadline no member of its group alive): nothing was signaled."""

    call_id: str


@dataclass(frozen=True, slots=True)
class GroupEmpty:
    """The process group of a command being stopped has no member left."""

    call_id: str


@dataclass(frozen=True, slots=True)
class GraceOver:
    """The kill grace of a stop ended with members still in the group."""

    call_id: str


@dataclass(frozen=True, slots=True)
class GroupStopped:
    """After the SIGKILL: the group is gone (or never will be: an unkillable member)."""

    call_id: str
    snapshot: ProcessSnapshot


@dataclass(frozen=True, slots=True)
class GroupLost:
    """A step on the command's process group (a stop, a kill, a watch) failed in the shell at
    once (logged): what that step would have reported will never come."""

    call_id: str


@dataclass(frozen=True, slots=True)
class GroupGone:
    """A watched group (`WatchGroup`) has no member left."""

    call_id: str


@dataclass(frozen=True, slots=True)
class TurnPlanned:
    """What each call of the turn reserves, in request order, its paths canonical (the answer
    to `ResolveTurn`). `failure`: the shell could not resolve them (it logged why), and says
    what went wrong; `reservations` is then empty."""

    turn_id: str
    reservations: tuple[Reservation, ...]
    failure: str | None = None


@dataclass(frozen=True, slots=True)
class Deadline:
    """A call's `timeout_ms` passed; the snapshot is its command's at that moment."""

    call_id: str
    snapshot: ProcessSnapshot | None


@dataclass(frozen=True, slots=True)
class GateExpired:
    call_id: str


@dataclass(frozen=True, slots=True)
class KillAfter:
    """A command's hard deadline (`kill_after_ms`, PROTOCOL.md 9.2) passed."""

    call_id: str


@dataclass(frozen=True, slots=True)
class ResultsRead:
    """Results read back from the journal for the deliveries waiting on them."""

    results: dict[str, Result]


@dataclass(frozen=True, slots=True)
class ResultsReadFailed:
    """The journal could not give back the saved results of `call_ids` (the read failed
    after its retries, or their rows are gone; the shell logged why); `results` holds what it
    did read of the same read-back."""

    call_ids: tuple[str, ...]
    results: dict[str, Result] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class KeptCall:
    """What the keeper recorded of a record's command while no agent ran (PROTOCOL.md 10.1):
    the `execute` args it was started with, and whether its process is still there to re-adopt
    (`held`: running, or exited with its status recorded). One not held is gone unrecorded,
    and `snapshot` is the output recorded up to then."""

    args: object
    held: bool
    snapshot: ProcessSnapshot
    # The keeper stopped its group when its kill_after_ms passed while no agent ran (9.2).
    killed_after: bool = False


@dataclass(frozen=True, slots=True)
class Restored:
    """One record rebuilt from the journal after a restart; `kept` when the keeper recorded
    its command."""

    row: JournalRow
    touched_at: float
    kept: KeptCall | None = None


@dataclass(frozen=True, slots=True)
class Adopted:
    """The shell re-adopted a restored call's process (after `Adopt`)."""

    call_id: str
    pid: int
    snapshot: ProcessSnapshot


@dataclass(frozen=True, slots=True)
class Recovered:
    """Every record of this chat is rebuilt (`Restored`); what else the journal held for it:
    the tools it approved with scope "chat" (9.5) and whether its close row (9.6) was durable.
    ChatState decides what of it still holds."""

    approved_tools: tuple[str, ...] = ()
    closed: bool = False


@dataclass(frozen=True, slots=True)
class CloseDurable:
    """The journal holds the chat's close row: its `chat_closed` may be sent."""


@dataclass(frozen=True, slots=True)
class CloseFailed:
    """The journal refused the chat's close row (the shell logged why)."""


@dataclass(frozen=True, slots=True)
class Shutdown:
    """The agent stops (PROTOCOL.md 9.3): every running call is stopped and saved, every
    process group stopped; nothing new starts. `ShutdownDone` says when it is over."""


@dataclass(frozen=True, slots=True)
class Sweep:
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


@dataclass(frozen=True, slots=True)
class Follow:
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


@dataclass(frozen=True, slots=True)
class Send:
    """One event to one connection, in order after what was sent before. `call_id`: the
    call whose follow it belongs to (the shell drops it for a detached follower unless it is
    a reply), or None for a reply of its own."""

    conn: Conn
    event: Event
    call_id: str | None = None


@dataclass(frozen=True, slots=True)
class Publish:
    """An event of a call to the connections following it: those in `to`, or all of them
    (None). ChatState names them for a streamed event (`started`, `approval_resolved`): only a
    connection whose `accepted` of a request that brings the event was sent before, so nothing
    a connection has not asked for yet comes ahead of that `accepted` (PROTOCOL.md 9.9)."""

    call_id: str
    event: Event
    to: tuple[Conn, ...] | None = None


@dataclass(frozen=True, slots=True)
class SendResult:
    """The result one request on `conn` waits for, after the output it owes."""

    conn: Conn
    call_id: str
    event: Event


@dataclass(frozen=True, slots=True)
class SendReplay:
    """The saved result of an ended call for one more request: the retained output from
    `from_offset` first (an attach), or none (a repeated call)."""

    conn: Conn
    call_id: str
    event: Event
    from_offset: int | None


@dataclass(frozen=True, slots=True)
class Detach:
    """`conn` stops receiving the call's events. `keep`: requests on it still wait for the
    call's result (each gets it: PROTOCOL.md 9.9), so the follow stays for them; without it
    the follow goes (a reply already queued for it still goes out)."""

    conn: Conn
    call_id: str
    keep: bool


@dataclass(frozen=True, slots=True)
class Forgotten:
    """The record is gone (5.4): whatever the shell keeps for the call goes too."""

    call_id: str


@dataclass(frozen=True, slots=True)
class ShrinkOutput:
    """The command's output ended (nothing can print to it any more): its retained output
    shrinks to the result's head and tail (PROTOCOL.md 5.2) once no connection still reads the
    full retention from its cursor."""

    call_id: str


@dataclass(frozen=True, slots=True)
class CallEnded:
    """The call's result is durable and sent: count it and log it (operators)."""

    call_id: str
    result: Result


# ---------------------------------------------------------------------------------------------
# Effects: the journal


@dataclass(frozen=True, slots=True)
class JournalWrite:
    """Write the row; feed `then` once it is durable (at once if it already is), or
    `JournalFailed(call_id)` if the journal refuses it."""

    row: JournalRow
    then: StartDurable | ResultDurable | None = None


@dataclass(frozen=True, slots=True)
class JournalTouch:
    call_id: str
    wall_ms: int


@dataclass(frozen=True, slots=True)
class JournalDelete:
    call_id: str


@dataclass(frozen=True, slots=True)
class JournalApproveTool:
    tool: str


@dataclass(frozen=True, slots=True)
class JournalForgetApprovals:
    pass


@dataclass(frozen=True, slots=True)
class JournalClose:
    """Write the chat's close row (9.6: it outlives a restart until the records are all
    forgotten); feed `then` once it is durable."""

    closed_at_ms: int
    then: CloseDurable


@dataclass(frozen=True, slots=True)
class JournalReopen:
    """Delete the chat's close row: its records are all forgotten, its id is free again."""


@dataclass(frozen=True, slots=True)
class ReadBack:
    """Read these calls' saved results back from the journal; feed `ResultsRead`."""

    call_ids: tuple[str, ...]


# ---------------------------------------------------------------------------------------------
# Effects: running


@dataclass(frozen=True, slots=True)
class ResolveTurn:
    """Find what each of the turn's calls reserves (PROTOCOL.md 5.6: paths canonicalised
    against the filesystem, actors/reservations.py), off the event loop when a path must be
    looked at; feed `TurnPlanned`."""

    turn_id: str
    specs: tuple[CallSpec, ...]


@dataclass(frozen=True, slots=True)
class RunTool:
    """Run a non-execute tool with its parsed args; feed `ToolEnded` (or `ToolFailed`).
    `on_loop`: run it right now on the loop (a short file operation); otherwise as a task."""

    call_id: str
    tool: str
    args: msgspec.Struct
    on_loop: bool
    sandbox: SandboxPolicy | None = None  # the call's own (PROTOCOL.md 10.4), before the floor


@dataclass(frozen=True, slots=True)
class StopRun:
    """End a cancelable wait (process_output) now; it feeds `ToolStopped`."""

    call_id: str


@dataclass(frozen=True, slots=True)
class Spawn:
    """Start the command in a process group of its own; feed `Spawned` or `SpawnFailed`
    (with a keeper, once it answered: other inputs may come first, and `ToolFailed` if it never
    does); then `ProcessExited` when its shell exits and `OutputClosed` when its output ends."""

    call_id: str
    args: msgspec.Struct
    started_at_ms: int
    sandbox: SandboxPolicy | None = None  # the call's own (PROTOCOL.md 10.4), before the floor


@dataclass(frozen=True, slots=True)
class Adopt:
    """Re-adopt the restored call's process from the keeper as if it had just been spawned:
    feed `Adopted`, then `ProcessExited` and `OutputClosed` as for any spawn."""

    call_id: str


@dataclass(frozen=True, slots=True)
class ReleaseKept:
    """A restored call's process is not re-adopted (gone without a recorded exit, or its record
    cannot take it back): the shell kills what is left of its group, if anything, and drops
    what the keeper recorded of it."""

    call_id: str


@dataclass(frozen=True, slots=True)
class StopGroup:
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


@dataclass(frozen=True, slots=True)
class WatchGroup:
    """The command's shell exited and its output pipe closed, but a member may live on that
    writes elsewhere (`nohup server >log 2>&1 &`): feed `GroupGone` once the group has no
    member. Until then closing the chat or stopping the agent stops it (PROTOCOL.md 9.3, 9.6)."""

    call_id: str


@dataclass(frozen=True, slots=True)
class KillGroup:
    """SIGKILL to the whole group, then feed `GroupStopped` once it is gone."""

    call_id: str


@dataclass(frozen=True, slots=True)
class DropProcess:
    """The command exited and its output ended `exited_retention_s` ago: it leaves the
    chat's process listing (PROTOCOL.md 5.2), and `process_output` no longer knows it."""

    call_id: str


@dataclass(frozen=True, slots=True)
class MarkTimedOut:
    """The command outlived its call's deadline: its listing says so from now on."""

    call_id: str


@dataclass(frozen=True, slots=True)
class StartTimer:
    """Feed `fire` at trio time `at` unless `CancelTimer(key)` comes first."""

    key: tuple[str, str]
    at: float
    fire: Deadline | GateExpired | KillAfter


@dataclass(frozen=True, slots=True)
class CancelTimer:
    key: tuple[str, str]


@dataclass(frozen=True, slots=True)
class ShutdownDone:
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
