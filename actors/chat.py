"""ChatActor: the trio shell of one chat. `ChatState` (actors/chat_state.py) decides; this
carries out its effects (send, journal, spawn, signal, timers, read-backs) and feeds what
they report back in as inputs, one at a time, in the order they happened.

The chat's tasks (a thread-run tool, a process's pump and reaper, a stop, a timer, a
read-back) run in one nursery, open while the chat has work (actors/task_host.py): ten
thousand idle chats hold records but no tasks. Output does not pass through the state machine:
a process's pump wakes the followers' cursors directly (actors/outbox.py), so output costs no
decision.

Failure containment: an exception while carrying out a call's effect becomes that call's
`ToolFailed` input (its result says so), never the chat's, another chat's or the connection's.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import trio

from toolwire.actors import effects as fx
from toolwire.actors import kept, observe, processes, reservations
from toolwire.actors.calls import CallSpec, shared_tool_name
from toolwire.actors.chat_state import ChatConfig, ChatState, TurnState
from toolwire.actors.chat_work import ChatWork, failure_text, run_on_loop
from toolwire.actors.context import AgentContext
from toolwire.actors.followers import Followers
from toolwire.actors.journal_effects import JournalEffects
from toolwire.actors.journal_rows import JournalRow
from toolwire.actors.outbox import Outbox
from toolwire.actors.records import RecordTable
from toolwire.actors.result_cache import ResultCache
from toolwire.actors.task_host import TaskFn, TaskHost

log = logging.getLogger("toolwire.chat")

# Kept importable from here: transport, simulation, benchmarks and tests name them so.
__all__ = ["CallSpec", "ChatActor", "TurnState", "shared_tool_name"]


class ChatActor:
    __slots__ = (
        "_draining",
        "_inbox",
        "_shutdown_done",
        "_tasks",
        "_work",
        "chat_id",
        "ctx",
        "followers",
        "journal_effects",
        "processes",
        "state",
    )

    def __init__(
        self,
        ctx: AgentContext,
        chat_id: str,
        start: Callable[[TaskFn], None] | None = None,
        *,
        results: ResultCache | None = None,
        config: ChatConfig | None = None,
        state_class: type[ChatState] = ChatState,
    ) -> None:
        self.chat_id = chat_id
        self.ctx = ctx
        self.state = state_class(
            chat_id,
            config if config is not None else ctx.chat_config(),
            results if results is not None else ResultCache(),
            ctx.budget,
        )
        self.processes = processes.ProcessTable(
            ctx.backend,
            retention_bytes=ctx.limits.output_retention_bytes,
            result_bytes=ctx.limits.result_output_bytes,
        )
        self.followers = Followers(chat_id, self.processes)
        self._work: ChatWork | None = None  # made when the chat first has work
        # (A list, not a deque: an empty deque costs 600 bytes per idle chat; it stays short.)
        self._inbox: list[fx.Input] = []
        self._draining = False
        # Started in the agent's nursery (`start`) when the chat has work.
        self._tasks = TaskHost(chat_id, start)
        self.journal_effects = JournalEffects(chat_id, ctx, self, self._tasks)
        self._shutdown_done: trio.Event | None = None

    @property
    def work(self) -> ChatWork:
        work = self._work
        if work is None:
            work = ChatWork(
                self.chat_id,
                self.ctx,
                self.processes,
                self.followers,
                self.feed,
                self._tasks.start_soon,
            )
            self._work = work
        return work

    @property
    def records(self) -> RecordTable:
        return self.state.records

    @property
    def approved_tools(self) -> tuple[str, ...]:
        return self.state.approved_tools

    @property
    def idle(self) -> bool:
        work = self._work
        return (
            self.state.idle
            and not self.processes
            and not self._tasks.busy
            and (work is None or not work.spawning)
        )

    # -----------------------------------------------------------------------------------------
    # Requests: each raises ToolwireError and changes nothing when refused

    def call(
        self, outbox: Outbox, spec: CallSpec, *, stream: bool, rid: Any, from_offset: int = 0
    ) -> None:
        self._request(fx.CallRequest(outbox, spec, stream, rid, from_offset))

    def attach(self, outbox: Outbox, call_id: str, from_offset: int, rid: Any) -> None:
        self._request(fx.AttachRequest(outbox, call_id, from_offset, rid))

    def detach(self, outbox: Outbox, call_id: str) -> None:
        self._request(fx.DetachRequest(outbox, call_id))

    def approve(
        self,
        outbox: Outbox,
        call_id: str,
        approved: bool,
        rid: Any,
        reason: str | None = None,
        scope: str = "call",
    ) -> None:
        self._request(fx.ApproveRequest(outbox, call_id, approved, rid, reason, scope))

    def cancel(self, outbox: Outbox, call_ids: list[str], rid: Any) -> None:
        self._request(fx.CancelRequest(outbox, tuple(call_ids), rid))

    def turn(
        self, outbox: Outbox, turn_id: str, specs: list[CallSpec], *, stream: bool, rid: Any
    ) -> None:
        self._request(fx.TurnRequest(outbox, turn_id, tuple(specs), stream, rid))

    def _resolve_turn(self, effect: fx.ResolveTurn) -> None:
        """What the turn's calls reserve (5.6). A turn none of whose calls names a path is
        planned right here, in this input's drain (no thread hop on the hot path); one that
        names paths has them resolved on a worker thread: symlinks, `~` and `..` are looked up
        on the filesystem, which may be slow or remote, and the loop serves every chat."""
        try:
            at_once = reservations.reserve_at_once(effect.specs)
            if at_once is None:
                self.work.resolve_turn(effect)
                return
        except Exception as exc:
            log.exception(
                "resolving the paths of turn %r failed",
                effect.turn_id,
                extra={"chat_id": self.chat_id},
            )
            self._inbox.append(fx.TurnPlanned(effect.turn_id, (), failure=failure_text(exc)))
            return
        self._inbox.append(fx.TurnPlanned(effect.turn_id, at_once))

    def interrupt(self, outbox: Outbox, turn_id: str | None, rid: Any) -> None:
        self._request(fx.InterruptRequest(outbox, turn_id, rid))

    def close_chat(self, outbox: Outbox, rid: Any) -> None:
        self._request(fx.CloseChatRequest(outbox, rid))

    async def shutdown(self) -> None:
        """The agent stops (PROTOCOL.md 9.3): returns once every call this stopped has its
        saved result and every process group of the chat is gone."""
        done = self._shutdown_done = trio.Event()
        self._request(fx.Shutdown())
        await done.wait()

    def _on_shutdown_done(self, effect: fx.ShutdownDone) -> None:
        if self._shutdown_done is not None:
            self._shutdown_done.set()

    def restore(
        self, row: JournalRow, touched_at: float, readopted: kept.Readopted | None = None
    ) -> None:
        """Rebuild one record from the journal after a restart, with its command's process
        when the keeper recorded one (PROTOCOL.md 10.1)."""
        kept_call = None
        if readopted is not None:
            held = readopted.handle is not None or readopted.status is not None
            # Until ChatState says `Adopt` or `ReleaseKept`.
            self.work.hold_for_adoption(readopted)
            output, truncated = readopted.output.result_output()
            snapshot = fx.ProcessSnapshot(
                process_id=row.call_id,
                exit_code=None,
                signal=None,
                exited=False,
                output=output,
                output_bytes=readopted.output.total,
                truncated_bytes=truncated,
            )
            kept_call = fx.KeptCall(
                readopted.meta.args, held, snapshot, killed_after=readopted.killed_after
            )
        self._request(fx.Restored(row, touched_at, kept_call))

    def recovered(self, approved_tools: tuple[str, ...], closed: bool) -> None:
        """After its records: what else the journal kept of the chat (ChatState decides what
        of it still holds)."""
        self._request(fx.Recovered(approved_tools, closed))

    def sweep(self) -> None:
        """Periodic housekeeping: forget old records and exited processes (5.2, 5.4)."""
        self._request(fx.Sweep())

    def forgotten(self) -> None:
        """The agent drops this chat, idle: break the one cycle among its objects (its journal
        effects feed it back), so that reference counting frees them at once. Left to the
        cyclic collector, they would wait for the next walk of the frozen heap, where every
        long-lived chat ends up (actors/loop_priority.py)."""
        self.journal_effects.forget_chat()

    # -----------------------------------------------------------------------------------------
    # The interpreter

    def _request(self, event: fx.Input) -> None:
        """Apply a request (a refusal raises out of here, having changed nothing), then
        carry out its effects and everything they report back."""
        effects = self.state.handle(event, trio.current_time(), self.ctx.wall_ms())
        self._drain(effects)

    def feed(self, event: fx.Input) -> None:
        """A report of what happened: applied after whatever is being applied now."""
        self._inbox.append(event)
        if not self._draining:
            self._drain([])

    def feed_all(self, events: list[fx.Input]) -> None:
        """Several reports at once (what one journal commit made durable): applied in order,
        in one pass of the interpreter."""
        self._inbox.extend(events)
        if not self._draining:
            self._drain([])

    def _drain(self, effects: list[fx.Effect]) -> None:
        self._draining = True
        inbox = self._inbox
        # Read by index, dropped at the end: `pop(0)` would move the whole list each time,
        # quadratic when one commit makes thousands of rows durable (issue 27).
        applied = 0
        try:
            self._carry_out(effects)
            while applied < len(inbox):
                event = inbox[applied]
                applied += 1
                try:
                    effects = self.state.handle(event, trio.current_time(), self.ctx.wall_ms())
                except Exception:
                    log.exception("the chat could not apply %s", type(event).__name__)
                    call_id = getattr(event, "call_id", None)
                    if isinstance(call_id, str) and not isinstance(event, fx.ToolFailed):
                        inbox.append(fx.ToolFailed(call_id))
                    continue
                self._carry_out(effects)
        finally:
            del inbox[:applied]
            self._draining = False
        work = self._work
        if work is not None and work.idle and not self._tasks.busy:
            # Nothing of it runs or waits (no tool, no timer, no task that could hold it): an
            # idle chat keeps no ChatWork (352 bytes each for 10,000 idle chats).
            self._work = None

    def _carry_out(self, effects: list[fx.Effect]) -> None:
        for effect in effects:
            try:
                _EFFECTS[type(effect)](self, effect)
            except Exception:
                call_id = getattr(effect, "call_id", None)
                if not isinstance(call_id, str) or isinstance(effect, fx.CallEnded):
                    raise
                log.exception(
                    "carrying out %s failed",
                    type(effect).__name__,
                    extra={"chat_id": self.chat_id, "call_id": call_id},
                )
                if isinstance(effect, fx.StopGroup | fx.KillGroup | fx.WatchGroup):
                    # Its report will never come: ChatState decides what now (GroupLost).
                    self._inbox.append(fx.GroupLost(call_id))
                else:
                    self._inbox.append(fx.ToolFailed(call_id))

    def _run_tool(self, effect: fx.RunTool) -> None:
        if effect.on_loop:  # ends within this call: no ChatWork made for it
            run_on_loop(effect, self.chat_id, self.ctx, self.processes, self.feed)
        else:
            self.work.run_tool(effect)

    def _call_ended(self, effect: fx.CallEnded) -> None:
        observe.call_ended(self.ctx, self.chat_id, effect.call_id, effect.result)
        self.followers.call_ended(effect.call_id)


# How the shell carries out each effect: the sending ones through its followers, the ones that
# take time through its work, the journal's through its journal effects.
_EFFECTS: dict[type, Callable[[ChatActor, Any], None]] = {
    fx.Follow: lambda chat, e: chat.followers.follow(e),
    fx.Send: lambda chat, e: chat.followers.send(e),
    fx.Publish: lambda chat, e: chat.followers.publish(e),
    fx.SendResult: lambda chat, e: chat.followers.send_result(e),
    fx.SendReplay: lambda chat, e: chat.followers.send_replay(e),
    fx.Detach: lambda chat, e: chat.followers.detach(e),
    fx.Forgotten: lambda chat, e: chat.followers.forgotten(e),
    fx.ShrinkOutput: lambda chat, e: chat.followers.shrink_output(e),
    fx.CallEnded: ChatActor._call_ended,
    fx.JournalWrite: lambda chat, e: chat.journal_effects.write(e),
    fx.JournalTouch: lambda chat, e: chat.journal_effects.touch(e),
    fx.JournalDelete: lambda chat, e: chat.journal_effects.delete(e),
    fx.JournalApproveTool: lambda chat, e: chat.journal_effects.approve_tool(e),
    fx.JournalForgetApprovals: lambda chat, e: chat.journal_effects.forget_approvals(e),
    fx.JournalClose: lambda chat, e: chat.journal_effects.close(e),
    fx.JournalReopen: lambda chat, e: chat.journal_effects.reopen(e),
    fx.ReadBack: lambda chat, e: chat.journal_effects.read_back(e),
    fx.ResolveTurn: ChatActor._resolve_turn,
    fx.RunTool: ChatActor._run_tool,
    fx.StopRun: lambda chat, e: chat.work.stop_run(e),
    fx.Spawn: lambda chat, e: chat.work.spawn_process(e),
    fx.Adopt: lambda chat, e: chat.work.adopt_process(e),
    fx.ReleaseKept: lambda chat, e: chat.work.release_kept(e),
    fx.StopGroup: lambda chat, e: chat.work.stop_group(e),
    fx.WatchGroup: lambda chat, e: chat.work.watch_group(e),
    fx.KillGroup: lambda chat, e: chat.work.kill_group(e),
    fx.MarkTimedOut: lambda chat, e: chat.work.mark_timed_out(e),
    fx.DropProcess: lambda chat, e: chat.processes.drop(e.call_id),
    fx.StartTimer: lambda chat, e: chat.work.start_timer(e),
    fx.CancelTimer: lambda chat, e: chat.work.cancel_timer(e),
    fx.ShutdownDone: ChatActor._on_shutdown_done,
}
