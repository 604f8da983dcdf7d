"""The pure seed mode of `toolwire sim`: one seed's plan played against one `ChatState` per
chat, with no trio, no agent, no shell and no file system.

The plan is the one the agent mode plays (`scenario.make_plan`: the same chats, messages,
Coder-style call ids, gated calls with their answers and scopes, timeouts, commands with their
process groups and TERM handling, read-modify-write cycles, drops, stalls, crashes and the
orchestrators' moves). Here it becomes a schedule of inputs in virtual time: a heap of events
ordered by (time, sequence), every delay drawn from a stream of the seed. Each chat's effects
are carried out by `SeedWorld`, the pure interpreter of simulation/pure_world.py with a model
of the world behind it: journal commits land as a group after a seeded delay (a crash loses the
rest), read-backs after another, tools on "threads" end after a seeded hop, commands play their
`Script` (the shell and each member of its group with its own reaction to SIGTERM, as
simulation/processes.py's `MemberRun` computes it), timers fire at their instant, and events
reach their connection after a seeded, per-connection delay (stalls included). So a cancel
races a natural end or a durable start, an approval its expiry, an interrupt a finish, a
repeat a read-back, and a crash anything.

Promises are checked after every step, where they can break: pure_world.World's checks of
PROTOCOL.md 5.0-5.7 plus the ones only a model of the world can judge (truthful outcomes
against the script, the grace of a group, attach offsets, lost writes on shared files). The
first broken one ends the seed with its code (the checker's letters, simulation/checker.py).
"""

from __future__ import annotations

import hashlib
import heapq
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from toolwire.actors.chat_state import ChatConfig, ChatState
from toolwire.actors.context import Limits
from toolwire.actors.effects import (
    Adopt,
    Adopted,
    AlreadyExited,
    ApproveRequest,
    AttachRequest,
    CallRequest,
    CancelRequest,
    CloseChatRequest,
    Deadline,
    Detach,
    DetachRequest,
    DropProcess,
    Follow,
    FollowMode,
    GraceOver,
    GroupEmpty,
    GroupGone,
    GroupStopped,
    Input,
    InterruptRequest,
    KeptCall,
    KillGroup,
    OutputClosed,
    ProcessExited,
    ProcessSnapshot,
    Publish,
    ReleaseKept,
    ResolveTurn,
    RunTool,
    SendReplay,
    ShrinkOutput,
    Shutdown,
    Spawn,
    Spawned,
    SpawnFailed,
    StartTimer,
    StopGroup,
    ToolEnded,
    ToolFailed,
    TurnRequest,
    WatchGroup,
)
from toolwire.actors.events import (
    AcceptedEvent,
    ApprovalEvent,
    CancelResultEvent,
    ChatClosedEvent,
    ErrorEvent,
    Event,
    InterruptedEvent,
    ResultEvent,
    TurnResultEvent,
)
from toolwire.actors.journal_rows import JournalRow
from toolwire.actors.results import (
    TEXT_AGENT_FAILURE,
    TEXT_AGENT_FAILURE_BEFORE_RUN,
    TEXT_AGENT_RESTARTED,
    TEXT_SHUTDOWN,
    Outcome,
    Result,
    ToolReport,
    text_killed_after,
)
from toolwire.actors.tools.files import Edit, EditFilesArgs, ReadFileArgs, WriteFileArgs
from toolwire.actors.tools.process_args import ProcessOutputArgs, ProcessSignalArgs
from toolwire.actors.tools.registry import TOOLS
from toolwire.simulation.processes import SPAWN_OSERROR, SPAWN_RAISES, MemberRun, Script
from toolwire.simulation.pure_lifecycle import (
    CLOSED_REFUSALS,
    SHUTTING_DOWN_CODE,
    SHUTTING_DOWN_TEXT,
    ChatLifecycle,
    Shutdowns,
    check_shutdown_result,
)
from toolwire.simulation.pure_world import Broken, Owed, World, require
from toolwire.simulation.scenario import (
    EPOCH_MS,
    SHARED_FILES,
    CallPlan,
    ChatPlan,
    MessagePlan,
    Plan,
    rmw_call,
    rmw_token,
)
from toolwire.simulation.trace import (
    BOOT,
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

RUN_DEADLINE_S = 900.0
RESULT_CACHE_SIZES = (0, 1, 3, 1024)
_EPS = 1e-9
# How often a crash takes the keeper with it (a reboot, the keeper killed too): its commands
# are gone without a recorded exit (PROTOCOL.md 10.1).
KEEPER_LOST = 0.2

# Where the seed's chats say their files are (in memory: nothing on disk there).
WORKSPACE = "/ws"


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# ---------------------------------------------------------------------------------------------
# The event queue of one seed


class Clock:
    """Virtual time: callbacks at instants, in (time, sequence) order."""

    def __init__(self) -> None:
        self.now = 0.0
        self._queue: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = 0

    def at(self, when: float, fn: Callable[[], None]) -> None:
        heapq.heappush(self._queue, (max(when, self.now), self._seq, fn))
        self._seq += 1

    def after(self, delay: float, fn: Callable[[], None]) -> None:
        self.at(self.now + delay, fn)

    def step(self) -> bool:
        if not self._queue:
            return False
        when, _, fn = heapq.heappop(self._queue)
        self.now = when
        fn()
        return True

    def next_at(self) -> float | None:
        return self._queue[0][0] if self._queue else None


# ---------------------------------------------------------------------------------------------
# A command's process group in virtual time


class Group:
    """One command: its shell and the members of its group, a pure function of the start time
    and the signals they got (the model of simulation/processes.py, without trio)."""

    def __init__(self, script: Script, started: float) -> None:
        self.script = script
        self.started = started
        self.shell_killed_at: float | None = None
        self.shell_signal: str | None = None
        self.members = [MemberRun(m, started) for m in script.members]
        self.first_term: float | None = None  # the first SIGTERM a stop (not a tool) sent
        self.manual = False  # a process_signal call signaled it: its stops prove nothing
        self.crashed = False
        self.exited_fed = False
        self.closed_fed = False
        # The keeper (PROTOCOL.md 10.1): the agent forgot it (DropProcess, ReleaseKept), so
        # no keeper holds it any more; the keeper stopped it at its kill_after_ms.
        self.released = False
        self.keeper_killed = False

    @property
    def shell_death(self) -> float:
        natural = self.started + self.script.duration
        if self.shell_killed_at is not None and self.shell_killed_at < natural:
            return self.shell_killed_at
        return natural

    def status(self) -> tuple[int | None, str | None]:
        natural = self.started + self.script.duration
        if self.shell_killed_at is not None and self.shell_killed_at < natural:
            return None, self.shell_signal
        return self.script.exit_code, None

    def _started(self, m: MemberRun) -> bool:
        return m.start_at < self.shell_death  # forked only while the shell runs

    def alive(self, t: float) -> bool:
        return self.shell_death > t or any(
            self._started(m) and m.start_at <= t < m.death for m in self.members
        )

    def empty_at(self) -> float:
        return max([self.shell_death, *(m.death for m in self.members if self._started(m))])

    def pipe_closed_at(self) -> float:
        return max(
            [
                self.shell_death,
                *(m.death for m in self.members if self._started(m) and m.spec.holds_pipe),
            ]
        )

    def signal(self, t: float, name: str) -> None:
        shell_alive = self.shell_death > t
        if name == "SIGKILL":
            if shell_alive:
                self.shell_killed_at, self.shell_signal = t, name
            for m in self.members:
                if self._started(m) and m.start_at <= t < m.death:
                    m.killed_at = t
            return
        if shell_alive and not self.script.ignores_term:
            self.shell_killed_at, self.shell_signal = t, name
        for m in self.members:
            if self._started(m) and m.start_at <= t < m.death and m.term_at is None:
                m.term_at = t

    def snapshot(self, call_id: str, t: float) -> ProcessSnapshot:
        exited = self.shell_death <= t
        code, sig = self.status() if exited else (None, None)
        return ProcessSnapshot(call_id, code, sig, exited, "", 0, 0)


# ---------------------------------------------------------------------------------------------
# One chat's world


@dataclass
class Conn:
    id: int
    world: SeedWorld
    alive: bool = True
    delay: float = 0.0
    stall_until: float = 0.0
    last: float = 0.0  # when its last event arrives: a connection delivers in order


class SeedWorld(World):
    """`World` with a model behind it: what takes time is scheduled on the seed's clock."""

    def __init__(self, sim: PureSim, chat: ChatPlan, config: ChatConfig, cache: int) -> None:
        self.sim = sim
        self.epoch = 0  # bumped by a crash and a boot: what was scheduled before is void
        self.groups_model: dict[str, Group] = {}
        self.followers: dict[str, set[Any]] = {}
        self.commit_due = False
        self.read_due = False
        self.attach_asked: tuple[Any, str, int] | None = None
        self.cancel_named: set[str] = set()
        self.interrupted = False
        self.denied: set[str] = set()
        self.lc = ChatLifecycle()  # its closes and shutdowns, for (s) and (x)
        # The keeper (10.1): what it holds while no agent runs (call -> group), the calls whose
        # command died with it (a reboot: gone unrecorded), those handed back as held this
        # generation, and when the agent crashed.
        self.kept: dict[str, Group] = {}
        self.lost: set[str] = set()
        self.held_calls: set[str] = set()
        self.owed_at_boot: set[str] = set()  # held, and its call still running at the boot
        self.crashed_at = 0.0
        super().__init__(
            config.journal_keeps_results,
            chat_id=chat.chat_id,
            config=config,
            state_class=sim.state_class,
            cache_entries=cache,
            spawn_replies_later=True,
        )

    def conn_names(self) -> list[Any]:
        return []  # the drivers open them

    def new_state(self) -> None:
        super().new_state()
        self.groups_model = {}
        # Commands the keeper started whose reply the shell has not read yet: running, but
        # not the shell's to signal or list until their `Spawned` (`spawn_answered`).
        self.unannounced: dict[str, Group] = {}
        self.followers = {}
        self.commit_due = self.read_due = False
        self.lc.restarted()

    # -- scheduling on the seed's clock ------------------------------------------------------

    def later(self, delay: float, fn: Callable[[], None]) -> None:
        epoch = self.epoch

        def run() -> None:
            if epoch == self.epoch:
                self.sim.step(self, fn)

        self.sim.clock.after(delay, run)

    def after_step(self) -> None:
        """Let what the step left pending happen later: a group commit, a read-back."""
        if self.pending_writes and not self.commit_due:
            self.commit_due = True
            self.later(self.sim.rng.uniform(0.0002, 0.005), self._commit)
        if self.reads and not self.read_due:
            self.read_due = True
            self.later(self.sim.rng.uniform(0.0001, 0.003), self._read)

    def _commit(self) -> None:
        self.commit_due = False
        self.commit(len(self.pending_writes))

    def _read(self) -> None:
        self.read_due = False
        while self.reads:
            self.read_back()

    # -- requests ----------------------------------------------------------------------------

    def request(self, event: Input) -> bool:
        if isinstance(event, AttachRequest):
            self.attach_asked = (event.conn, event.call_id, event.from_offset)
        try:
            return super().request(event)
        finally:
            self.attach_asked = None

    def _check_offset(self, conn: Any, call_id: str, offset: int | None) -> None:
        asked = self.attach_asked
        if asked is None or offset is None or asked[0] != conn or asked[1] != call_id:
            return
        # 9.9: the cursor goes to the offset asked for, or back (output still owed), never on.
        require(
            offset <= asked[2],
            "e.output_gap",
            f"attach of {call_id} from {asked[2]} places the cursor at {offset}: bytes lost",
        )

    # -- sending -----------------------------------------------------------------------------

    def follow(self, effect: Follow) -> None:
        if effect.mode == FollowMode.LIVE:
            self._check_offset(effect.conn, effect.call_id, effect.from_offset)
        self.followers.setdefault(effect.call_id, set()).add(effect.conn)
        super().follow(effect)

    def replay(self, effect: SendReplay) -> None:
        self._check_offset(effect.conn, effect.call_id, effect.from_offset)
        super().replay(effect)

    def publish(self, effect: Publish) -> None:
        super().publish(effect)
        to = effect.to
        for conn in sorted(self.followers.get(effect.call_id, ())):
            if to is None or conn in to:
                self.sim.deliver(conn, effect.event)

    def detach(self, effect: Detach) -> None:
        super().detach(effect)
        if not effect.keep:
            self.followers.get(effect.call_id, set()).discard(effect.conn)

    def sent(self, conn: Any, event: Any) -> None:
        if isinstance(event, ChatClosedEvent):
            self.check_chat_closed(conn)
        super().sent(conn, event)
        if isinstance(event, ResultEvent | CancelResultEvent):
            self.truthful(event.call_id, event.result)
        elif isinstance(event, TurnResultEvent):
            for call_id, result in zip(self.turn_calls[event.turn_id], event.results, strict=True):
                self.truthful(call_id, result)
        self.sim.deliver(conn, event)

    def check_chat_closed(self, conn: Any) -> None:
        """(x): one `chat_closed` per request, and none while a group of the chat that
        started before the close (this agent generation's) is alive."""
        owed = self.owed[conn]
        require(
            owed.closed < owed.closes,
            "x.reply_count",
            f"c{conn} got a chat_closed no close_chat asked for",
        )
        closed_at = self.lc.closed_at
        for call_id, group in sorted(self.groups_model.items()):
            require(
                closed_at is None or group.started > closed_at or not group.alive(self.now),
                "x.group_alive",
                f"{self.chat_id[:8]}/{call_id[:8]}: chat_closed was sent at {self.now:.4f}s "
                "while a member of its group was alive",
            )

    def started(self, call_id: str, *, read_only: bool) -> None:
        """(x): nothing of a closed chat takes effect after the close (in that generation)."""
        closed_at = self.lc.closed_at
        require(
            read_only or closed_at is None,
            "x.effect_after_close",
            f"{self.chat_id[:8]}/{call_id[:8]} took effect at {self.now:.4f}s, after the chat "
            f"was closed at {closed_at}s",
        )
        super().started(call_id, read_only=read_only)

    def shutdown_begins(self) -> None:
        """Before `Shutdown` is fed: the foreground commands whose shell runs now must end
        `canceled` with 9.3's text (s)."""
        self.lc.shut_done = False
        for call_id, group in [*self.groups_model.items(), *self.unannounced.items()]:
            plan = self.sim.calls.get((self.chat_id, call_id))
            if plan is None or plan.tool != "execute" or plan.background or group.crashed:
                continue
            if group.shell_death > self.now:
                self.lc.shut_running.setdefault(call_id, self.now)

    def shutdown_done(self) -> None:
        """`ShutdownDone` (s): every group of the chat is gone by now."""
        for call_id, group in sorted(self.groups_model.items()):
            require(
                group.crashed or not group.alive(self.now),
                "s.group_survived",
                f"{self.chat_id[:8]}/{call_id[:8]}: ShutdownDone while a member of its group "
                "is alive",
            )
        self.lc.shut_done = True
        self.sim.clock.after(0.0, self.sim.maybe_stopped)

    def flush(self) -> None:
        """The agent's last act of a shutdown: every queued journal write made durable."""
        for _ in range(16):
            if not self.pending_writes:
                return
            self.commit(len(self.pending_writes))

    def truthful(self, call_id: str, result: Result) -> None:
        """(c), (p) and (s): what a result says matches what the model of the world did."""
        plan = self.sim.calls.get((self.chat_id, call_id))
        if plan is None:
            return
        outcome = result.outcome
        label = f"{self.chat_id[:8]}/{call_id[:8]}"
        check_shutdown_result(
            label,
            call_id,
            result,
            self.lc,
            self.sim.shutdowns,
            plan.args.get("kill_after_ms"),
            EPOCH_MS,
        )
        kept_group = self.groups_model.get(call_id)
        if call_id in self.owed_at_boot and kept_group is not None and kept_group.keeper_killed:
            # 9.2 while no agent ran: the keeper stopped it at its hard deadline, and the
            # result still owed says so.
            require(
                outcome is Outcome.TIMED_OUT,
                "r.kill_after_untold",
                f"{label} was stopped by its keeper at its kill_after_ms, and ended {outcome}",
            )
        if outcome is Outcome.CANCELED:
            # A cancel, an interrupt, a close (9.6) or a shutdown (9.3, its text checked above).
            require(
                call_id in self.cancel_named
                or self.interrupted
                or self.lc.ever_closed
                or result.text == TEXT_SHUTDOWN,
                "c.canceled_without_cancel",
                f"{label} canceled but nobody canceled it",
            )
            group = self.groups_model.get(call_id)
            if group is not None and not group.manual:
                require(
                    not group.alive(self.now),
                    "p.member_alive",
                    f"{label} canceled while a member of its group is alive",
                )
        elif outcome is Outcome.TIMED_OUT:
            kill_after_ms = plan.args.get("kill_after_ms")
            # A hard deadline's stop (PROTOCOL.md 9.2) says so in its text; any other
            # `timed_out` needs the call's timeout_ms.
            require(
                plan.timeout_ms is not None
                or (
                    isinstance(kill_after_ms, int)
                    and result.text == text_killed_after(kill_after_ms)
                ),
                "c.timed_out_without_timeout",
                f"{label} timed out without timeout_ms",
            )
        elif outcome is Outcome.DENIED:
            require(
                call_id in self.denied,
                "f.denied_without_answer",
                f"{label} denied but nobody denied it",
            )
        elif outcome is Outcome.UNKNOWN:
            if result.text == TEXT_AGENT_RESTARTED:
                require(self.sim.crashes > 0, "c.unknown_without_crash", f"{label} restarted?")
                # 10.1: only a command gone without a recorded exit ends `unknown`.
                require(
                    call_id not in self.held_calls,
                    "r.unknown_while_held",
                    f"{label} ended unknown while its keeper held its process",
                )
            elif result.text in (TEXT_AGENT_FAILURE, TEXT_AGENT_FAILURE_BEFORE_RUN):
                injected = plan.fail is not None or (
                    plan.script is not None and plan.script.spawn_error == SPAWN_RAISES
                )
                require(injected, "c.unknown_without_failure", f"{label} failed inside")
        elif outcome is Outcome.COMPLETED and plan.tool == "execute" and not plan.background:
            group = self.groups_model.get(call_id)
            if group is not None and not group.manual and not group.crashed:
                data = result.data or {}
                code, sig = group.status()
                require(
                    data.get("exit_code") == code and data.get("signal") == sig,
                    "c.exit_status",
                    f"{label} reports exit {data.get('exit_code')}/{data.get('signal')}, "
                    f"the process ended {code}/{sig}",
                )
        elif outcome is Outcome.FAILED and plan.tool == "execute":
            spawn_failed = plan.script is not None and plan.script.spawn_error == SPAWN_OSERROR
            require(
                spawn_failed or (plan.background and plan.timeout_ms is not None),
                "c.failed_untrue",
                f"{label} failed: {result.text!r}",
            )

    # -- tools ---------------------------------------------------------------------------------

    def resolve_turn(self, effect: ResolveTurn) -> None:
        super().resolve_turn(effect)
        turn_id = effect.turn_id
        if turn_id in self.resolving:
            # On a worker thread: its paths come back a seeded hop later, and a cancel, an
            # interrupt, a repeat or a close of the turn may come first.
            def resolved() -> None:
                if turn_id in self.resolving:
                    self.paths_resolved(turn_id)

            self.later(self.sim.rng.uniform(0.0, 0.02), resolved)

    def run_tool(self, effect: RunTool) -> None:
        plan = self.sim.calls.get((self.chat_id, effect.call_id))
        args = effect.args
        if isinstance(args, WriteFileArgs | EditFilesArgs):
            if plan is not None and plan.fail == "before":
                self.inbox.append(ToolFailed(effect.call_id))
                return
            self.started(effect.call_id, read_only=False)
            report = self.sim.files.write(args, plan)
            if report.outcome is Outcome.COMPLETED:
                self.sim.trace.add(
                    EFFECT, self.now, self.generation, self.chat_id, effect.call_id, "write"
                )
            if plan is not None and plan.fail == "after":
                self.inbox.append(ToolFailed(effect.call_id))
                return
            self.end_tool(effect, report)
            return
        self.started(effect.call_id, read_only=TOOLS[effect.tool].read_only)
        if isinstance(args, ReadFileArgs):
            self.end_tool(effect, self.sim.files.read(args))
        elif isinstance(args, ProcessSignalArgs):
            group = self.groups_model.get(args.process_id)
            if group is not None:
                group.manual = True
                group.signal(self.now, args.signal)
                self._track(args.process_id, group)
            self.end_tool(effect, ToolReport(outcome=Outcome.COMPLETED, text="signaled"))
        elif isinstance(args, ProcessOutputArgs) and args.wait:
            # A wait a cancel can end (StopRun): a task, until its wait is over.
            self.tasks[effect.call_id] = effect.tool
            wait = min(args.wait_ms if args.wait_ms is not None else 4000, 4000) / 1000

            def end() -> None:
                if self.tasks.pop(effect.call_id, None) is not None:
                    self.feed(ToolEnded(effect.call_id, _done(effect.tool)))

            self.later(self.sim.rng.uniform(0, wait), end)
        else:
            self.end_tool(effect, _done(effect.tool))

    def end_tool(self, effect: RunTool, report: ToolReport) -> None:
        if effect.on_loop:
            self.inbox.append(ToolEnded(effect.call_id, report))
        else:  # on a worker thread: its end comes a seeded hop later
            self.later(
                self.sim.rng.uniform(0.0, 0.02),
                lambda: self.feed(ToolEnded(effect.call_id, report)),
            )

    # -- processes -----------------------------------------------------------------------------

    def spawn(self, effect: Spawn) -> None:
        plan = self.sim.calls.get((self.chat_id, effect.call_id))
        script = plan.script if plan is not None else None
        if script is None:
            script = Script(chunks=(), duration=0.01)
        if script.spawn_error == SPAWN_OSERROR:
            self.inbox.append(SpawnFailed(effect.call_id, "simulated: no such file"))
            return
        if script.spawn_error == SPAWN_RAISES:
            self.inbox.append(ToolFailed(effect.call_id))
            return
        self.started(effect.call_id, read_only=False)
        self.sim.trace.add(EFFECT, self.now, self.generation, self.chat_id, effect.call_id, "spawn")
        # The keeper starts it now; its reply reaches the shell a seeded hop later (the keeper
        # client's reader), and a cancel, an interrupt, a close or the shutdown may come first.
        call_id = effect.call_id
        self.unannounced[call_id] = Group(script, self.now)
        self.spawning[call_id] = effect

        def answered() -> None:
            if call_id in self.spawning:
                self.spawn_answered(call_id)

        self.later(self.sim.rng.uniform(0.0, 0.002), answered)

    def spawn_answered(self, call_id: str, how: str = "spawned") -> None:
        del self.spawning[call_id]
        group = self.unannounced.pop(call_id)
        self.groups_model[call_id] = group
        self.feed(Spawned(call_id, 4242, group.snapshot(call_id, self.now)))
        self._track(call_id, group)

    def _track(self, call_id: str, group: Group) -> None:
        """Feed the shell's exit and the pipe's end when they happen (again after a signal
        moved them)."""
        jitter = self.sim.rng.uniform(0, 0.002)
        for when in (group.shell_death, group.pipe_closed_at()):
            self.later(max(0.0, when - self.now) + jitter, lambda: self._poll(call_id, group))

    def _poll(self, call_id: str, group: Group) -> None:
        if self.groups_model.get(call_id) is not group:
            return
        if not group.exited_fed and group.shell_death <= self.now + _EPS:
            group.exited_fed = True
            self.feed(ProcessExited(call_id, group.snapshot(call_id, self.now)))
        if not group.closed_fed and group.exited_fed and group.pipe_closed_at() <= self.now + _EPS:
            group.closed_fed = True
            self.feed(OutputClosed(call_id))

    def spent(self, call_id: str) -> bool:
        group = self.groups_model.get(call_id)
        return group is not None and group.exited_fed and group.closed_fed

    def shrink_output(self, effect: ShrinkOutput) -> None:
        group = self.groups_model.get(effect.call_id)
        require(
            group is None or group.closed_fed,
            "p.shrunk_early",
            f"{effect.call_id[:8]}: its output shrinks while the command may still print",
        )

    def drop_process(self, effect: DropProcess) -> None:
        group = self.groups_model.get(effect.call_id)
        if group is not None:
            group.released = True  # the keeper drops it too
        require(
            group is None
            or (
                group.closed_fed
                and group.shell_death + self.config.exited_retention_s <= self.now + _EPS
            ),
            "p.dropped_early",
            f"{effect.call_id[:8]}: dropped from the listing before its retention ran out",
        )

    def signal(self, call_id: str, group: Group, name: str) -> None:
        self.sim.trace.add(SIGNAL, self.now, self.generation, self.chat_id, call_id, name)
        group.signal(self.now, name)
        self._track(call_id, group)

    def stop_group(self, effect: StopGroup) -> None:
        call_id = effect.call_id
        group = self.groups_model.get(call_id)
        if group is None:
            self.inbox.append(GroupStopped(call_id, _gone(call_id)))
            return
        if effect.unless_exited and group.shell_death <= self.now:
            self.inbox.append(AlreadyExited(call_id))
            return
        if effect.only_if_alive and not group.alive(self.now):
            self.inbox.append(AlreadyExited(call_id))
            return
        if group.first_term is None:
            group.first_term = self.now
        self.signal(call_id, group, "SIGTERM")
        grace_end = self.now + effect.grace_s
        empty = group.empty_at()

        def over() -> None:
            if self.groups_model.get(call_id) is group:
                empty_now = not group.alive(self.now)
                self.feed(GroupEmpty(call_id) if empty_now else GraceOver(call_id))

        if empty <= grace_end:
            # The stop polls the group on a short backoff: it sees it empty a little later.
            when = min(grace_end, empty + self.sim.rng.uniform(0, 0.01))
            self.later(max(0.0, when - self.now), over)
        else:
            self.later(effect.grace_s, over)

    def watch_group(self, effect: WatchGroup) -> None:
        """The shell looks at the group on a backoff of up to a second until it is empty."""
        call_id = effect.call_id
        group = self.groups_model.get(call_id)
        if group is None or not group.alive(self.now):
            self.inbox.append(GroupGone(call_id))
            return

        def look() -> None:
            if self.groups_model.get(call_id) is not group:
                return
            if group.alive(self.now):
                self.later(self.sim.rng.uniform(0.01, 1.0), look)
            else:
                self.feed(GroupGone(call_id))

        self.later(max(0.0, group.empty_at() - self.now) + self.sim.rng.uniform(0, 1.0), look)

    def kill_group(self, effect: KillGroup) -> None:
        call_id = effect.call_id
        group = self.groups_model.get(call_id)
        if group is None:
            self.inbox.append(GroupStopped(call_id, _gone(call_id)))
            return
        if group.first_term is not None and not group.manual and group.alive(self.now):
            grace = self.config.kill_grace_s
            for m in group.members:
                done = m.cleanup_done_at
                cut = (
                    m.term_at is not None
                    and m.spec.term_cleanup is not None
                    and m.spec.term_cleanup < grace
                    and done is not None
                    and done > self.now + _EPS
                    and m.death > self.now
                )
                if cut:
                    raise Broken(
                        "p.cleanup_cut",
                        f"{call_id[:8]}: SIGKILL {self.now - group.first_term:.3f}s after "
                        f"SIGTERM cut a {m.spec.term_cleanup}s cleanup short (grace {grace}s)",
                    )
            require(
                self.now >= group.first_term + grace - 1e-6,
                "p.grace_cut",
                f"{call_id[:8]}: SIGKILL {self.now - group.first_term:.3f}s after SIGTERM, "
                f"grace {grace}s",
            )
        self.signal(call_id, group, "SIGKILL")

        def gone() -> None:
            if self.groups_model.get(call_id) is group:
                self.feed(GroupStopped(call_id, group.snapshot(call_id, self.now)))

        self.later(self.sim.rng.uniform(0, 0.005), gone)

    def snapshot(self, call_id: str) -> ProcessSnapshot:
        group = self.groups_model.get(call_id)
        if group is None:
            return _gone(call_id)
        return group.snapshot(call_id, self.now)

    # -- timers --------------------------------------------------------------------------------

    def start_timer(self, effect: StartTimer) -> None:
        self.timers[effect.key] = effect.fire
        fire = effect.fire

        def ring() -> None:
            if self.timers.get(effect.key) is fire:
                self.fire(effect.key)

        self.later(max(0.0, effect.at - self.now), ring)

    def fire(self, key: tuple[str, str]) -> None:
        fire = self.timers.pop(key)
        if isinstance(fire, Deadline):
            # The command's snapshot at that instant (the shell's `runners.snapshot`).
            group = self.groups_model.get(fire.call_id)
            snapshot = group.snapshot(fire.call_id, self.now) if group is not None else None
            fire = Deadline(fire.call_id, snapshot)
        self.feed(fire)

    # -- the agent dies ------------------------------------------------------------------------

    def crash(self) -> None:
        """The agent dies. Its keeper holds its commands on (10.1), unless it dies with it (a
        reboot, one crash in five): then they are gone without a recorded exit."""
        self.epoch += 1
        self.pending_writes.clear()
        self.inbox.clear()
        self.crashed_at = self.now
        held = {c: g for c, g in self.groups_model.items() if not g.released}
        held.update(self.unannounced)  # started by the keeper, their reply unread: held too
        if self.sim.keeper_rng.random() < KEEPER_LOST:
            self.lost = set(held)
            self.kept = {}
            for group in [*self.groups_model.values(), *self.unannounced.values()]:
                group.crashed = True
                group.signal(self.now, "SIGKILL")
        else:
            self.lost = set()
            self.kept = held

    def boot(self) -> None:
        self.epoch += 1
        for call_id, group in self.kept.items():
            self._keeper_deadline(call_id, group)
        self.held_calls = set()
        self.owed_at_boot = set()
        self.restart()
        # What no record claimed (its row never durable, or forgotten) is killed (agent.py's
        # `_drop_unclaimed`): nothing runs on that no call answers for.
        for group in self.kept.values():
            if not group.released:
                group.released = True
                group.signal(self.now, "SIGKILL")
        self.kept = {}
        self.lost = set()
        if self.state.closed:
            self.lc.closed(self.now)  # its close survived the restart (9.6): still closed

    def _keeper_deadline(self, call_id: str, group: Group) -> None:
        """The keeper enforces a `kill_after_ms` that passes while no agent is connected (9.2,
        10.1): SIGTERM to the group then, SIGKILL after the grace (a kill under way goes on
        after the next agent connected)."""
        plan = self.sim.calls.get((self.chat_id, call_id))
        kill_after_ms = plan.args.get("kill_after_ms") if plan is not None else None
        if not isinstance(kill_after_ms, int) or not kill_after_ms:
            return
        at = max(group.started + kill_after_ms / 1000, self.crashed_at)
        if at >= self.now or not group.alive(at):
            return
        group.signal(at, "SIGTERM")
        group.keeper_killed = True
        kill_at = at + self.config.kill_grace_s
        if kill_at <= self.now:
            group.signal(kill_at, "SIGKILL")
        else:
            self.later(kill_at - self.now, lambda: self.signal(call_id, group, "SIGKILL"))

    def kept_for(self, row: JournalRow) -> KeptCall | None:
        # The keeper recorded the `execute` args with the process (the row may not hold them).
        plan = self.sim.calls.get((self.chat_id, row.call_id))
        args = plan.args if plan is not None else row.args
        group = self.kept.get(row.call_id)
        if group is not None and row.tool == "execute":
            self.held_calls.add(row.call_id)
            if row.state == "running":
                self.owed_at_boot.add(row.call_id)
            snapshot = group.snapshot(row.call_id, self.now)
            return KeptCall(args, True, snapshot, killed_after=group.keeper_killed)
        if row.call_id in self.lost and row.tool == "execute":
            return KeptCall(args, False, _gone(row.call_id))
        return None

    def adopt(self, effect: Adopt) -> None:
        """The keeper hands the process back: the same process (it never runs twice), its
        exit and its output's end told to this generation when they come."""
        group = self.kept.pop(effect.call_id)
        group.exited_fed = group.closed_fed = False
        self.groups_model[effect.call_id] = group
        self.sim.trace.add(EFFECT, self.now, self.generation, self.chat_id, effect.call_id, "adopt")
        self.inbox.append(Adopted(effect.call_id, 4242, group.snapshot(effect.call_id, self.now)))
        self._track(effect.call_id, group)

    def release_kept(self, effect: ReleaseKept) -> None:
        group = self.kept.pop(effect.call_id, None)
        if group is not None:
            group.released = True
            group.signal(self.now, "SIGKILL")


def _gone(call_id: str) -> ProcessSnapshot:
    """A command the shell no longer lists: nothing left to tell (actors/chat_work.py)."""
    return ProcessSnapshot(call_id, None, None, True, "", 0, 0)


def _done(tool: str) -> ToolReport:
    return ToolReport(outcome=Outcome.COMPLETED, text=f"{tool} done")


# ---------------------------------------------------------------------------------------------
# Files, in memory: the chats' own and the shared ones of the read-modify-write cycles


class Files:
    def __init__(self, initial: dict[str, bytes]) -> None:
        self.data = dict(initial)

    def read(self, args: ReadFileArgs) -> ToolReport:
        content = self.data.get(args.path)
        if content is None:
            return ToolReport(outcome=Outcome.FAILED, text=f"no such file: {args.path}")
        return ToolReport(
            outcome=Outcome.COMPLETED,
            text=f"read {len(content)} bytes",
            data={"sha256": _sha(content), "content": content.decode()},
        )

    def write(self, args: WriteFileArgs | EditFilesArgs, plan: CallPlan | None) -> ToolReport:
        entries: list[tuple[str, str | None, list[Edit] | None, str | None]]
        if isinstance(args, WriteFileArgs):
            entries = [(args.path, args.expected_sha256, None, args.content)]
        else:
            entries = [(f.path, f.expected_sha256, f.edits, None) for f in args.files]
        new: dict[str, bytes] = {}
        for path, expected, edits, content in entries:
            before = self.data.get(path, b"")
            if expected is not None and _sha(before) != expected:
                return ToolReport(
                    outcome=Outcome.FAILED,
                    text=f"{path} changed since it was read",
                    data={"actual_sha256": _sha(before)},
                )
            if edits is not None:
                text = before.decode()
                for edit in edits:
                    if edit.old not in text:
                        return ToolReport(outcome=Outcome.FAILED, text=f"{path}: old not found")
                    text = text.replace(edit.old, edit.new, 1)
                new[path] = text.encode()
            else:
                new[path] = (content or "").encode()
        for path, data in new.items():
            if path in SHARED_FILES and plan is not None and plan.shared_path == path:
                # (w): a write that takes place expected exactly what the file held.
                asked = _asked_sha256(plan)
                require(
                    asked == _sha(self.data.get(path, b"")),
                    "w.lost_write",
                    f"a write of {path} expected {asked[:8]}, the file held "
                    f"{_sha(self.data.get(path, b''))[:8]}: a write was lost",
                )
            self.data[path] = data
        return ToolReport(
            outcome=Outcome.COMPLETED,
            text=f"wrote {sum(len(d) for d in new.values())} bytes",
            data={"sha256": _sha(next(iter(new.values()), b""))},
        )


def _asked_sha256(plan: CallPlan) -> str:
    if plan.tool == "write_file":
        return str(plan.args["expected_sha256"])
    entries: list[dict[str, Any]] = plan.args["files"]  # type: ignore[assignment]
    return str(entries[0]["expected_sha256"])


# ---------------------------------------------------------------------------------------------
# The orchestrator of one chat (the pure twin of simulation/orchestrator.py's ChatDriver)


@dataclass
class Msg:
    plan: MessagePlan
    calls: list[CallPlan]
    ids: dict[str, CallPlan]
    on_done: Callable[[], None]
    sent: int = 0
    results: dict[str, Result] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    turn_done: bool = False
    interrupt_rid: int | None = None
    interrupt_turn: str | None = None
    interrupted: bool = False
    skipped: bool = False
    kinds: dict[int, tuple[str, str | None]] = field(default_factory=dict)
    answering: set[str] = field(default_factory=set)
    finished: bool = False

    def complete(self) -> bool:
        if self.interrupt_rid is not None and not self.interrupted:
            return False
        if self.plan.mode == "turn":
            return self.turn_done
        ended = all(c in self.results or c in self.errors for c in self.ids_sent())
        return ended and (self.sent >= len(self.calls) or self.skipped)

    def ids_sent(self) -> list[str]:
        return [c.call_id for c in self.calls[: self.sent] if c.call_id is not None]


class Driver:
    def __init__(self, sim: PureSim, world: SeedWorld, chat: ChatPlan) -> None:
        self.sim = sim
        self.world = world
        self.chat = chat
        self.rng = random.Random(f"{sim.plan.seed}/pure-driver/{chat.index}")
        self.conn: Conn | None = None
        self.other: Conn | None = None  # another replica's connection (approvals)
        self.st: Msg | None = None
        self.index = 0
        self.done = False
        self.recovering = False

    def describe(self) -> str:
        st = self.st
        state = "-"
        if st is not None:
            missing = [c[:8] for c in st.ids_sent() if c not in st.results and c not in st.errors]
            state = (
                f"{st.plan.message_id} {st.plan.mode} sent={st.sent} waits for {missing} "
                f"turn_done={st.turn_done} interrupt={st.interrupt_rid}/{st.interrupted} "
                f"conn={self.conn.id if self.conn else None}"
            )
        return f"chat {self.chat.index}: message {self.index} {state}"

    # -- connections ---------------------------------------------------------------------------

    def start(self) -> None:
        self.conn = self.sim.open(self.world)
        self.next_message()

    def deliver(self, conn: Conn, event: Event) -> None:
        if conn is self.conn and self.st is not None and not self.st.finished:
            self.handle(self.st, event)

    def lost(self, conn: Conn) -> None:
        """A connection of this chat died (a drop, a crash): recover on a new one."""
        if conn is self.other:
            self.other = None
        if conn is not self.conn or self.recovering:
            return
        self.conn = None
        self.recovering = True
        self.sim.clock.after(self.rng.uniform(0.005, 0.5), self.reconnect)

    def reconnect(self) -> None:
        if self.sim.down:
            self.sim.waiting.append(self)
            return
        self.recovering = False
        self.conn = self.sim.open(self.world)
        if self.st is not None and not self.st.finished:
            self.recover(self.st)

    # -- requests ------------------------------------------------------------------------------

    def send(self, st: Msg | None, req: Request, conn: Conn | None = None) -> bool:
        conn = conn or self.conn
        if conn is None or not conn.alive or self.sim.down:
            self.sim.trace.add(LOST, self.sim.clock.now, self.world.generation, -1, req)
            return False
        if st is not None:
            kind = type(req).__name__
            st.kinds[req.rid] = (kind, _call_id_of(req))
        ok = self.sim.request(self.world, conn, req)
        duplicable = isinstance(req, CallReq | AttachReq | TurnReq)
        if ok and duplicable and self.rng.random() < self.sim.plan.scenario.duplicate_share:
            self.sim.trace.fault(self.sim.clock.now, "duplicate", f"#{req.rid}")
            self.sim.request(self.world, conn, req)
        return ok

    # -- messages ------------------------------------------------------------------------------

    def next_message(self) -> None:
        if self.index >= len(self.chat.messages):
            self.done = True
            self.st = None
            return
        plan = self.chat.messages[self.index]
        self.index += 1
        if plan.rmw is not None:
            self.rmw(plan, 0, list(plan.moves))
        else:
            self.run_message(plan, self.next_message)

    def run_message(self, plan: MessagePlan, on_done: Callable[[], None]) -> None:
        calls = plan.sendable
        st = Msg(plan, calls, {c.call_id: c for c in calls if c.call_id is not None}, on_done)
        self.st = st
        if not calls:
            self.finish(st)
            return
        if plan.mode == "turn":
            st.sent = len(calls)
            self.send_turn(st)
        elif plan.mode == "parallel":
            st.sent = len(calls)
            for call in calls:
                self.send_call(st, call)
        else:
            self.send_next(st)
        for delay, move in plan.moves:
            self.sim.clock.after(delay, lambda move=move: self.move(st, move))  # type: ignore[misc]
        self.check_done(st)

    def finish(self, st: Msg) -> None:
        if st.finished:
            return
        st.finished = True
        # The next message after a short think (a model writing its next answer).
        self.sim.clock.after(self.rng.uniform(0.0, 0.05), st.on_done)

    def check_done(self, st: Msg) -> None:
        if not st.finished and st.complete():
            self.finish(st)

    def rid(self) -> int:
        return self.sim.next_rid()

    def send_call(self, st: Msg, call: CallPlan) -> None:
        self.send(st, CallReq(self.chat.chat_id, self.rid(), call.spec, st.plan.stream))

    def send_turn(self, st: Msg) -> None:
        specs = tuple(c.spec for c in st.calls)
        self.send(
            st, TurnReq(self.chat.chat_id, self.rid(), st.plan.turn_id, specs, st.plan.stream)
        )

    def send_next(self, st: Msg) -> None:
        if st.sent >= len(st.calls) or st.skipped:
            return
        if st.interrupt_rid is not None:
            st.skipped = True  # the model's turn was interrupted: the rest is never asked for
            return
        call = st.calls[st.sent]
        st.sent += 1
        self.send_call(st, call)

    # -- read-modify-write cycles --------------------------------------------------------------

    def rmw(self, plan: MessagePlan, attempt: int, moves: list[tuple[float, str]]) -> None:
        assert plan.rmw is not None
        rmw = plan.rmw
        if attempt >= rmw.attempts:
            self.next_message()
            return
        read = self.rmw_call(plan, attempt, "r", "read_file", {"path": rmw.path})

        def after_read() -> None:
            result = self.last_result(read)
            if result is None or result.outcome is not Outcome.COMPLETED or not result.data:
                self.rmw(plan, attempt + 1, moves)
                return
            digest, content = str(result.data["sha256"]), str(result.data["content"])
            token = rmw_token(self.chat.index, plan.message_id, attempt, "w")
            args: dict[str, object]
            if rmw.tool == "write_file":
                args = {
                    "path": rmw.path,
                    "content": f"{token}\n{content}",
                    "expected_sha256": digest,
                }
            else:
                first = content.split("\n", 1)[0]
                edit = {"old": first, "new": f"{token}\n{first}"}
                args = {"files": [{"path": rmw.path, "edits": [edit], "expected_sha256": digest}]}
            write = self.rmw_call(plan, attempt, "w", rmw.tool, args)

            def after_write() -> None:
                result = self.last_result(write)
                changed = (
                    result is not None
                    and result.outcome is Outcome.FAILED
                    and result.data is not None
                    and "actual_sha256" in result.data
                )
                if changed:
                    self.rmw(plan, attempt + 1, [])
                else:
                    self.next_message()

            step = MessagePlan(plan.message_id, "sequential", plan.stream, [write], moves=moves)
            self.run_message(step, after_write)

        self.run_message(
            MessagePlan(plan.message_id, "sequential", plan.stream, [read]), after_read
        )

    def last_result(self, call: CallPlan) -> Result | None:
        assert self.st is not None and call.call_id is not None
        return self.st.results.get(call.call_id)

    def rmw_call(
        self, plan: MessagePlan, attempt: int, step: str, tool: str, args: dict[str, object]
    ) -> CallPlan:
        call = rmw_call(self.sim.plan, self.chat, plan, attempt, step, tool, args)
        assert call.call_id is not None
        self.sim.calls[(self.chat.chat_id, call.call_id)] = call
        return call

    # -- events --------------------------------------------------------------------------------

    def handle(self, st: Msg, event: Event) -> None:
        if isinstance(event, ResultEvent):
            if event.call_id in st.ids and event.call_id not in st.results:
                st.results[event.call_id] = event.result
                if st.plan.mode == "sequential":
                    self.send_next(st)
        elif isinstance(event, TurnResultEvent):
            if event.turn_id == st.plan.turn_id:
                st.turn_done = True
                for call, result in zip(st.calls, event.results, strict=False):
                    if call.call_id is not None:
                        st.results.setdefault(call.call_id, result)
        elif isinstance(event, ApprovalEvent):
            self.gate(st, event.call_id)
        elif isinstance(event, AcceptedEvent):
            if event.state == "awaiting_approval":
                self.gate(st, event.call_id)
        elif isinstance(event, InterruptedEvent):
            if st.interrupt_rid is not None and event.rid == st.interrupt_rid:
                st.interrupted = True
                if st.plan.mode == "sequential":
                    self.send_next(st)
        elif isinstance(event, ErrorEvent):
            self.on_error(st, event)
        self.check_done(st)

    def on_error(self, st: Msg, event: ErrorEvent) -> None:
        if not isinstance(event.rid, int):
            return
        if event.code == SHUTTING_DOWN_CODE and event.message == SHUTTING_DOWN_TEXT:
            # Refused while the agent stops: its connections close next, and the recovery
            # after the restart sends again whatever has no answer.
            return
        kind, call_id = st.kinds.get(event.rid, ("", None))
        if kind == "AttachReq" and call_id is not None and event.code == "unknown_call":
            if call_id not in st.results:  # the agent restarted before it was journaled
                self.send_call(st, st.ids[call_id])
        elif kind == "CallReq":
            call_id = event.call_id
            if call_id is not None and call_id not in st.results and call_id not in st.errors:
                st.errors[call_id] = event.code
                if st.plan.mode == "sequential":
                    self.send_next(st)
        elif kind == "TurnReq":
            st.turn_done = True

    def gate(self, st: Msg, call_id: str) -> None:
        call = st.ids.get(call_id)
        if call is None or call_id in st.answering:
            return
        st.answering.add(call_id)

        def answer() -> None:
            st.answering.discard(call_id)
            if call.decision == "ignore" or st.finished:
                return  # left to expire (the agent has an approval timeout)
            approved = call.decision == "approve"
            if not approved:
                self.world.denied.add(call_id)
            req = ApproveReq(self.chat.chat_id, self.rid(), call_id, approved, call.scope)
            conn = self.conn
            if self.sim.plan.replicas > 1 and self.rng.random() < 0.3:
                # Another replica answers (the user clicked in another browser tab).
                if self.other is None or not self.other.alive:
                    self.other = None if self.sim.down else self.sim.open(self.world)
                conn = self.other
            self.send(st, req, conn)

        self.sim.clock.after(call.decision_delay, answer)

    # -- moves ---------------------------------------------------------------------------------

    def move(self, st: Msg, move: str) -> None:
        if st.finished or self.conn is None or st is not self.st:
            return
        now = self.sim.clock.now
        chat = self.chat.chat_id
        if move == "interrupt":
            turn_id = (
                st.plan.turn_id if st.plan.mode == "turn" and self.rng.random() < 0.5 else None
            )
            req = InterruptReq(chat, self.rid(), turn_id)
            st.interrupt_rid, st.interrupt_turn = req.rid, turn_id
            self.sim.trace.fault(now, "interrupt", f"chat {self.chat.index}")
            self.send(st, req)
        elif move == "cancel":
            targets = st.ids_sent()
            if not targets:
                return
            chosen = self.rng.sample(targets, self.rng.randint(1, min(3, len(targets))))
            self.sim.trace.fault(now, "cancel", f"chat {self.chat.index} x{len(chosen)}")
            self.send(st, CancelReq(chat, self.rid(), tuple(chosen)))
        elif move == "takeover":
            self.sim.trace.fault(now, "takeover", f"chat {self.chat.index}")
            old = self.conn
            if old.alive and self.rng.random() < 0.4:
                for call_id in st.ids_sent():
                    if call_id not in st.results:
                        self.send(None, DetachReq(chat, self.rid(), call_id))
            self.conn = self.sim.open(self.world)
            self.recover(st)
        elif move in ("detach-after-call", "repeat-during-replay", "attach-ahead"):
            sent = [c for c in st.calls[: st.sent] if c.call_id is not None]
            if st.plan.mode == "turn" or not sent:
                return
            call = self.rng.choice(sent)
            assert call.call_id is not None
            self.sim.trace.fault(now, move, f"chat {self.chat.index}")
            if move == "detach-after-call":
                self.send_call(st, call)
                self.send(None, DetachReq(chat, self.rid(), call.call_id))
            elif move == "repeat-during-replay":
                self.send(st, AttachReq(chat, self.rid(), call.call_id, 0))
                self.send_call(st, call)
            else:
                self.send(st, AttachReq(chat, self.rid(), call.call_id, 1_000_000))
        elif move.startswith("early-cancel:"):
            target = move.split(":", 1)[1]
            self.sim.trace.fault(now, "early_cancel", f"chat {self.chat.index}")
            self.send(None, CancelReq(chat, self.rid(), (target,)))
        elif move == "close":
            # As the agent mode's driver: on its connection, no answer awaited; what it then
            # asks for that is new gets `chat_closed`.
            self.sim.trace.fault(now, "close_chat", f"chat {self.chat.index}")
            self.send(None, CloseChatReq(chat, self.rid()))

    def recover(self, st: Msg) -> None:
        """On a new connection: the same ids again (a repeated call, an attach, the turn)."""
        interrupt_first = self.rng.random() < 0.5
        if interrupt_first:
            self.resend_interrupt(st)
        if st.plan.mode == "turn":
            if not st.turn_done:
                self.send_turn(st)
        else:
            for call in st.calls[: st.sent]:
                assert call.call_id is not None
                if call.call_id in st.results or call.call_id in st.errors:
                    continue
                if self.rng.random() < 0.5:
                    self.send(st, AttachReq(self.chat.chat_id, self.rid(), call.call_id, 0))
                else:
                    self.send_call(st, call)
        if not interrupt_first:
            self.resend_interrupt(st)
        self.check_done(st)

    def resend_interrupt(self, st: Msg) -> None:
        if st.interrupt_rid is None or st.interrupted:
            return
        req = InterruptReq(self.chat.chat_id, self.rid(), st.interrupt_turn)
        st.interrupt_rid = req.rid
        self.send(st, req)


# ---------------------------------------------------------------------------------------------
# One seed


class PureSim:
    def __init__(self, plan: Plan, state_class: type[ChatState]) -> None:
        self.plan = plan
        self.state_class = state_class
        self.clock = Clock()
        self.rng = random.Random(f"{plan.seed}/pure")
        self.trace = Trace()
        self.files = Files(plan.files)
        self.crashes = 0
        self.keeper_rng = random.Random(f"{plan.seed}/keeper")
        self.down = False
        self.shutdowns = Shutdowns()
        self.deferred: list[str] = []  # faults that came while the agent stopped
        self.waiting: list[Driver] = []
        self._rid = 0
        self._conn_ids = 0
        self.conns: dict[int, Conn] = {}
        self.calls: dict[tuple[str, str], CallPlan] = {
            (c.chat_id, k.call_id): k for c, _, k in plan.calls() if k.call_id is not None
        }
        keeps = random.Random(f"{plan.seed}/pure-journal").random() < 0.5
        cache = random.Random(f"{plan.seed}/cache").choice(RESULT_CACHE_SIZES)
        limits = Limits()
        config = ChatConfig(
            max_processes_per_chat=limits.max_processes_per_chat,
            forget_after_s=limits.forget_after_s,
            kill_grace_s=plan.kill_grace_s,
            approve_tools=plan.approve_tools,
            approval_timeout_s=plan.approval_timeout_s,
            journal_enabled=True,
            journal_keeps_results=keeps,
        )
        self.worlds = [SeedWorld(self, chat, config, cache) for chat in plan.chats]
        self.drivers = {
            w.chat_id: Driver(self, w, c) for w, c in zip(self.worlds, plan.chats, strict=True)
        }
        self.broken: Broken | None = None
        self.failed_at: int | None = None

    def next_rid(self) -> int:
        self._rid += 1
        return self._rid

    # -- stepping a world --------------------------------------------------------------------

    def step(self, world: SeedWorld, fn: Callable[[], None]) -> None:
        if self.broken is not None:
            return
        world.now = self.clock.now
        world.wall_ms = EPOCH_MS + int(self.clock.now * 1000)
        try:
            fn()
        except Broken as broken:
            self.broken = broken
            self.failed_at = len(self.trace.entries)
            return
        world.after_step()

    # -- connections ---------------------------------------------------------------------------

    def open(self, world: SeedWorld) -> Conn:
        self._conn_ids += 1
        conn = Conn(self._conn_ids, world, delay=self.rng.choice((0.0, 0.0, 0.0005, 0.01)))
        self.conns[conn.id] = conn
        world.conns.append(conn.id)
        world.owed[conn.id] = Owed()
        self.trace.add(OPEN, self.clock.now, conn.id, 0)
        return conn

    def drop(self, conn: Conn, reason: str, *, fault: bool = True) -> None:
        if not conn.alive:
            return
        conn.alive = False
        world = conn.world
        if conn.id in world.conns:
            world.conns.remove(conn.id)
        self.trace.add(DROP, self.clock.now, conn.id, reason)
        if fault:
            self.trace.fault(self.clock.now, "drop", f"c{conn.id}")
        self.drivers[world.chat_id].lost(conn)

    def deliver(self, conn_id: int, event: Event) -> None:
        conn = self.conns.get(conn_id)
        if conn is None or not conn.alive:
            return
        at = max(conn.last, conn.stall_until, self.clock.now + conn.delay)
        conn.last = at

        def arrive() -> None:
            if conn.alive:
                self.trace.add(EV, self.clock.now, conn.id, event)
                self.drivers[conn.world.chat_id].deliver(conn, event)

        self.clock.at(at, arrive)

    def request(self, world: SeedWorld, conn: Conn, req: Request) -> bool:
        """Apply one request as the Session does: a refusal is an `error` on its connection."""
        entry = self.trace.add(REQ, self.clock.now, world.generation, conn.id, req)
        if self.shutdowns.stopping:
            # The Agent refuses every request while it stops (`Agent.chat`): no ChatState
            # sees it.
            code, message = SHUTTING_DOWN_CODE, SHUTTING_DOWN_TEXT
            self.trace.add(REJECT, self.clock.now, world.generation, entry, code)
            self.deliver(conn.id, ErrorEvent(code, message, req.rid, req.chat, _call_id_of(req)))
            return False
        event, count = _as_input(conn.id, req)
        owed = world.owed[conn.id]
        new_in_closed = world.lc.closed_at is not None and _starts_new(world, req)
        if isinstance(req, CancelReq):
            owed.cancels += len(req.call_ids)
            world.cancel_named.update(req.call_ids)
        elif isinstance(req, InterruptReq):
            owed.interrupts += 1
            world.interrupted = True
        elif isinstance(req, TurnReq):
            owed.turns[req.turn_id] += 1
            world.turn_calls[req.turn_id] = [s.call_id for s in req.specs]
        elif isinstance(req, CloseChatReq):
            owed.closes += 1
            world.lc.closed(self.clock.now)  # before: its reply may go out at once
        ok = [False]
        world.refusal = None

        def apply() -> None:
            ok[0] = world.request(event)

        self.step(world, apply)
        if not ok[0] and self.broken is None:
            if isinstance(req, CancelReq):
                owed.cancels -= count
            elif isinstance(req, InterruptReq):
                owed.interrupts -= 1
            elif isinstance(req, TurnReq):
                owed.turns[req.turn_id] -= 1
            elif isinstance(req, CloseChatReq):
                owed.closes -= 1
            code = world.refusal.code if world.refusal is not None else "refused"
            message = world.refusal.message if world.refusal is not None else ""
            self.trace.add(REJECT, self.clock.now, world.generation, entry, code)
            self.deliver(conn.id, ErrorEvent(code, message, req.rid, req.chat, _call_id_of(req)))
        if self.broken is None and new_in_closed:
            # (x): nothing new starts in a closed chat.
            refusal = world.refusal.code if world.refusal is not None else None
            if ok[0] or refusal not in CLOSED_REFUSALS:
                self.fail(
                    "x.new_call_taken",
                    f"{world.chat_id[:8]}: a new call in the closed chat was not refused with "
                    f"chat_closed (entry {entry})",
                )
        return ok[0]

    def fail(self, code: str, message: str) -> None:
        if self.broken is None:
            self.broken = Broken(code, message)
            self.failed_at = len(self.trace.entries)

    # -- faults --------------------------------------------------------------------------------

    def fault(self, kind: str) -> None:
        if self.shutdowns.stopping:
            # The agent mode plays its faults one after the other: what comes while a
            # shutdown runs waits until the agent is back.
            self.deferred.append(kind)
            return
        live = [c for c in self.conns.values() if c.alive]
        now = self.clock.now
        if kind == "drop" and live:
            self.drop(self.rng.choice(live), "injected")
        elif kind == "stall" and live:
            conn = self.rng.choice(live)
            stall = self.rng.choice((self.rng.uniform(0.05, 1.0), self.rng.uniform(1.0, 12.0)))
            conn.stall_until = max(conn.stall_until, now + stall)
            self.trace.fault(now, "stall", f"c{conn.id} {stall:.3f}s")
        elif kind == "crash" and not self.down:
            self.crash()
        elif kind == "shutdown" and not self.down:
            self.shutdown()

    def shutdown(self) -> None:
        """A graceful stop (PROTOCOL.md 9.3): `Shutdown` to every chat; requests are refused
        until the restart; once every chat said `ShutdownDone`, the journal is made durable
        and the agent restarts on it (`maybe_stopped`)."""
        now = self.clock.now
        gen = self.worlds[0].generation if self.worlds else 0
        self.trace.add(SHUTDOWN, now, gen)
        self.trace.fault(now, "shutdown", f"g{gen}")
        self.shutdowns.begin(now)
        which = len(self.shutdowns.spans)
        for world in self.worlds:
            world.shutdown_begins()
            self.step(world, lambda world=world: world.feed(Shutdown()))  # type: ignore[misc]

        def overdue() -> None:
            if self.shutdowns.stopping and len(self.shutdowns.spans) == which:
                self.fail("l.stuck", f"the shutdown of g{gen} did not end in time")

        # As the agent mode allows: the kill grace plus 5 s.
        self.clock.after(self.plan.kill_grace_s + 5.0, overdue)

    def failed(self) -> bool:
        return self.broken is not None

    def maybe_stopped(self) -> None:
        """Every chat's part is over: the agent makes every queued journal write durable,
        closes every connection (1001) and a new agent starts on the journal. Nothing is
        lost, unlike a crash."""
        if not self.shutdowns.stopping or not all(w.lc.shut_done for w in self.worlds):
            return
        if self.broken is not None:
            return
        now = self.clock.now
        gen = self.worlds[0].generation if self.worlds else 0
        for world in self.worlds:
            self.step(world, world.flush)
        if self.failed():  # a flush can break a promise (step records it)
            return
        lost = sum(len(w.pending_writes) for w in self.worlds)
        survivors = tuple(
            (w.chat_id, call_id)
            for w in self.worlds
            for call_id, group in sorted(w.groups_model.items())
            if not group.crashed and group.alive(now)
        )
        self.trace.add(STOPPED, now, gen, lost, survivors)
        if lost:
            self.fail("s.journal_lost", f"g{gen}: the shutdown left {lost} journal writes unsaved")
            return
        if survivors:
            chat, call_id = survivors[0]
            self.fail(
                "s.group_survived",
                f"g{gen}: the group of {chat[:8]}/{call_id[:8]} was alive when the shutdown ended",
            )
            return
        self.shutdowns.end(now)
        self.down = True
        for world in self.worlds:
            world.crash()  # the host reaps what is left (nothing) and every timer is void
        for conn in list(self.conns.values()):
            self.drop(conn, "agent shut down (1001)", fault=False)
        self.clock.after(self.rng.uniform(0.01, 1.5), self.boot)

    def crash(self) -> None:
        now = self.clock.now
        gen = self.worlds[0].generation if self.worlds else 0
        self.trace.add(CRASH, now, gen)
        self.trace.fault(now, "crash", f"g{gen}")
        self.crashes += 1
        self.down = True
        lost = sum(len(w.pending_writes) for w in self.worlds)
        if lost:
            self.trace.fault(now, "journal_writes_lost", str(lost))
        for world in self.worlds:
            world.crash()
        for conn in list(self.conns.values()):
            self.drop(conn, "agent crashed", fault=False)
        self.clock.after(self.rng.uniform(0.01, 1.5), self.boot)

    def boot(self) -> None:
        for world in self.worlds:
            self.step(world, world.boot)
        gen = self.worlds[0].generation if self.worlds else 0
        restored = tuple(
            (w.chat_id, row.call_id, row.turn_id, row.state)
            for w in self.worlds
            for row in w.committed.values()
        )
        self.trace.add(BOOT, self.clock.now, gen, restored, ())
        self.down = False
        waiting, self.waiting = self.waiting, []
        for driver in waiting:
            driver.reconnect()
        deferred, self.deferred = self.deferred, []
        for kind in deferred:
            self.fault(kind)

    # -- the run -------------------------------------------------------------------------------

    def run(self) -> list[str]:
        self.trace.add(BOOT, 0.0, 0, (), ())
        for when, kind in self.plan.faults:
            self.clock.at(when, lambda kind=kind: self.fault(kind))  # type: ignore[misc]
        for driver in self.drivers.values():
            driver.start()
        while self.broken is None:
            if all(d.done for d in self.drivers.values()) and not self.down:
                break
            at = self.clock.next_at()
            if at is None or at > RUN_DEADLINE_S:
                break
            self.clock.step()
        stuck = [d.describe() for d in self.drivers.values() if not d.done]
        # Settle: let cancels, kills, commits and timers in flight finish.
        settle_until = self.clock.now + self.plan.kill_grace_s + 60.0
        while self.broken is None:
            at = self.clock.next_at()
            if at is None or at > settle_until:
                break
            self.clock.step()
        if self.broken is not None:
            where = f" (trace entry {self.failed_at})" if self.failed_at is not None else ""
            return [f"{self.broken}{where}"]
        violations = [f"[l.stuck] {text}" for text in stuck]
        for world in self.worlds:
            try:
                for conn in world.conns:
                    owed = world.owed[conn]
                    require(
                        owed.closed == owed.closes,
                        "x.reply_count",
                        f"c{conn}: {owed.closed} chat_closed for {owed.closes} close_chat",
                    )
                world.check_all_answered()
                require(
                    not world.state.replies_waiting,
                    "l.reply_stuck",
                    f"chat {world.chat_id[:8]}: a reply still waits in a quiet chat",
                )
            except Broken as broken:
                violations.append(str(broken))
        return violations


def _starts_new(world: SeedWorld, req: Request) -> bool:
    """A `call` or `turn` that would create a record (9.6: refused in a closed chat)."""
    records = world.state.records
    if isinstance(req, CallReq):
        return records.get(req.spec.call_id) is None
    if isinstance(req, TurnReq):
        return req.turn_id not in world.state.turns and any(
            records.get(s.call_id) is None for s in req.specs
        )
    return False


def _call_id_of(req: Request) -> str | None:
    if isinstance(req, CallReq):
        return req.spec.call_id
    return getattr(req, "call_id", None)


def _as_input(conn: int, req: Request) -> tuple[Input, int]:
    match req:
        case CallReq():
            return CallRequest(conn, req.spec, req.stream, req.rid), 1
        case AttachReq():
            return AttachRequest(conn, req.call_id, req.from_offset, req.rid), 1
        case DetachReq():
            return DetachRequest(conn, req.call_id), 1
        case CancelReq():
            return CancelRequest(conn, req.call_ids, req.rid), len(req.call_ids)
        case ApproveReq():
            return ApproveRequest(conn, req.call_id, req.approved, req.rid, None, req.scope), 1
        case TurnReq():
            return TurnRequest(conn, req.turn_id, req.specs, req.stream, req.rid), 1
        case InterruptReq():
            return InterruptRequest(conn, req.turn_id, req.rid), 1
        case CloseChatReq():
            return CloseChatRequest(conn, req.rid), 1
    raise TypeError(req)


@dataclass
class PureOutcome:
    violations: list[str]
    trace: Trace
    calls: int
    virtual_s: float


def play(plan: Plan, state_class: type[ChatState] = ChatState) -> PureOutcome:
    """Play one plan against pure `ChatState`s; return what broke, and the trace."""
    sim = PureSim(plan, state_class)
    violations = sim.run()
    return PureOutcome(violations, sim.trace, len(sim.calls), sim.clock.now)
