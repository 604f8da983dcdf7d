"""ChatActor: the trio shell of one chat. `ChatState` (actors/chat_state.py) decides; this
carries out its effects (send, journal, spawn, signal, timers, read-backs) and feeds what
they report back in as inputs, one at a time, in the order they happened.

The chat's tasks (a thread-run tool, a process's pump and reaper, a stop, a timer, a
read-back) run in one nursery, open while the chat has work: ten thousand idle chats hold
records but no tasks. Output does not pass through the state machine: a process's pump wakes
the followers' cursors directly (actors/outbox.py), so output costs no decision.

Failure containment: an exception while carrying out a call's effect becomes that call's
`ToolFailed` input (its result says so), never the chat's, another chat's or the connection's.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from toolwire.actors import observe, processes
from toolwire.actors.calls import CallSpec, shared_tool_name
from toolwire.actors.chat_state import ChatConfig, ChatState, TurnState
from toolwire.actors.chat_work import ChatWork
from toolwire.actors.context import AgentContext
from toolwire.actors.effects import (
    ApprovalRestored,
    ApproveRequest,
    AttachRequest,
    CallEnded,
    CallRequest,
    CancelRequest,
    CancelTimer,
    CloseChatRequest,
    Detach,
    DetachRequest,
    Effect,
    Follow,
    Forgotten,
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
    Publish,
    ReadBack,
    Restored,
    ResultsRead,
    RunTool,
    Send,
    SendReplay,
    SendResult,
    Shutdown,
    ShutdownDone,
    Spawn,
    StartTimer,
    StopGroup,
    StopRun,
    Sweep,
    ToolFailed,
    TurnRequest,
)
from toolwire.actors.followers import Followers
from toolwire.actors.journal import JournalError
from toolwire.actors.journal_rows import JournalRow
from toolwire.actors.outbox import Outbox
from toolwire.actors.records import RecordTable
from toolwire.actors.result_cache import ResultCache

log = logging.getLogger("toolwire.chat")

# Kept importable from here: transport, simulation, benchmarks and tests name them so.
__all__ = ["CallSpec", "ChatActor", "TurnState", "shared_tool_name"]


class ChatActor:
    __slots__ = (
        "_draining",
        "_inbox",
        "_nursery",
        "_pending",
        "_running",
        "_shutdown_done",
        "_start_task",
        "_work",
        "chat_id",
        "ctx",
        "followers",
        "processes",
        "state",
    )

    def __init__(
        self,
        ctx: AgentContext,
        chat_id: str,
        start: Callable[[Callable[[], Awaitable[None]]], None] | None = None,
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
        )
        self.processes = processes.ProcessTable(
            ctx.backend,
            exited_retention_s=ctx.limits.exited_retention_s,
            retention_bytes=ctx.limits.output_retention_bytes,
            result_bytes=ctx.limits.result_output_bytes,
        )
        self.followers = Followers(chat_id, self.processes)
        self._work: ChatWork | None = None  # made when the chat first has work
        # (A list, not a deque: an empty deque costs 600 bytes per idle chat; it stays short.)
        self._inbox: list[Input] = []
        self._draining = False
        # How this chat's task is started (the agent's nursery): on demand, when it has work.
        self._start_task = start
        self._nursery: trio.Nursery | None = None
        self._running = False  # run() is started or running
        self._pending: list[tuple[Callable[..., Awaitable[None]], tuple[Any, ...]]] = []
        self._shutdown_done: trio.Event | None = None

    @property
    def work(self) -> ChatWork:
        work = self._work
        if work is None:
            work = ChatWork(
                self.chat_id, self.ctx, self.processes, self.followers, self.feed, self._spawn
            )
            self._work = work
        return work

    @property
    def records(self) -> RecordTable:
        return self.state.records

    @property
    def approved_tools(self) -> tuple[str, ...]:
        return self.state.approved_tools

    # -----------------------------------------------------------------------------------------
    # Lifecycle

    async def run(self) -> None:
        """The chat's nursery, open while the chat has work: it closes once its last task
        ended. `_spawn` opens it again."""
        self._running = True
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                pending, self._pending = self._pending, []
                for fn, args in pending:
                    nursery.start_soon(fn, *args)
        finally:
            self._nursery = None
            self._running = False
            if self._pending:
                self._ensure_running()

    def _ensure_running(self) -> None:
        if self._running:
            return
        if self._start_task is None:
            raise RuntimeError(f"chat {self.chat_id!r} has no nursery to run its tasks in")
        self._running = True
        self._start_task(self.run)

    def _spawn(self, fn: Callable[..., Awaitable[None]], *args: Any) -> None:
        """Start a task in this chat's nursery, opening it if the chat was idle."""
        if self._nursery is not None:
            try:
                self._nursery.start_soon(fn, *args)
                return
            except RuntimeError:
                pass  # closing: its last task just ended; queue it for the next opening
        self._pending.append((fn, args))
        self._ensure_running()

    @property
    def idle(self) -> bool:
        tasks = self._nursery.child_tasks if self._nursery is not None else ()
        return (
            self.state.idle
            and not self.processes
            and not self._pending
            and not tasks
            and not self._running
        )

    # -----------------------------------------------------------------------------------------
    # Requests: each raises ToolwireError and changes nothing when refused

    def call(self, outbox: Outbox, spec: CallSpec, *, stream: bool, rid: Any) -> None:
        self._request(CallRequest(outbox, spec, stream, rid))

    def attach(self, outbox: Outbox, call_id: str, from_offset: int, rid: Any) -> None:
        self._request(AttachRequest(outbox, call_id, from_offset, rid))

    def detach(self, outbox: Outbox, call_id: str) -> None:
        self._request(DetachRequest(outbox, call_id))

    def approve(
        self,
        outbox: Outbox,
        call_id: str,
        approved: bool,
        rid: Any,
        reason: str | None = None,
        scope: str = "call",
    ) -> None:
        self._request(ApproveRequest(outbox, call_id, approved, rid, reason, scope))

    def cancel(self, outbox: Outbox, call_ids: list[str], rid: Any) -> None:
        self._request(CancelRequest(outbox, tuple(call_ids), rid))

    def turn(
        self, outbox: Outbox, turn_id: str, specs: list[CallSpec], *, stream: bool, rid: Any
    ) -> None:
        self._request(TurnRequest(outbox, turn_id, tuple(specs), stream, rid))

    def interrupt(self, outbox: Outbox, turn_id: str | None, rid: Any) -> None:
        self._request(InterruptRequest(outbox, turn_id, rid))

    def close_chat(self, outbox: Outbox, rid: Any) -> None:
        self._request(CloseChatRequest(outbox, rid))

    async def shutdown(self) -> None:
        """The agent stops (PROTOCOL.md 9.3): returns once every call this stopped has its
        saved result and every process group of the chat is gone."""
        done = self._shutdown_done = trio.Event()
        self._request(Shutdown())
        await done.wait()

    def _on_shutdown_done(self, effect: ShutdownDone) -> None:
        if self._shutdown_done is not None:
            self._shutdown_done.set()

    def restore(self, row: JournalRow, touched_at: float) -> None:
        """Rebuild one record from the journal after a restart."""
        self._request(Restored(row, touched_at))

    def restore_approval(self, tool: str) -> None:
        self._request(ApprovalRestored(tool))

    def sweep(self) -> None:
        """Periodic housekeeping: forget old records and exited processes (5.2, 5.4)."""
        self._request(Sweep())
        self.processes.sweep(trio.current_time())

    def running_processes(self) -> list[processes.ProcessRecord]:
        return self.processes.running()

    # -----------------------------------------------------------------------------------------
    # The interpreter

    def _request(self, event: Input) -> None:
        """Apply a request (a refusal raises out of here, having changed nothing), then
        carry out its effects and everything they report back."""
        effects = self.state.handle(event, trio.current_time(), self.ctx.wall_ms())
        self._drain(effects)

    def feed(self, event: Input) -> None:
        """A report of what happened: applied after whatever is being applied now."""
        self._inbox.append(event)
        if not self._draining:
            self._drain([])

    def _drain(self, effects: list[Effect]) -> None:
        self._draining = True
        try:
            self._carry_out(effects)
            inbox = self._inbox
            while inbox:
                event = inbox.pop(0)
                try:
                    effects = self.state.handle(event, trio.current_time(), self.ctx.wall_ms())
                except Exception:
                    log.exception("the chat could not apply %s", type(event).__name__)
                    call_id = getattr(event, "call_id", None)
                    if isinstance(call_id, str) and not isinstance(event, ToolFailed):
                        inbox.append(ToolFailed(call_id))
                    continue
                self._carry_out(effects)
        finally:
            self._draining = False

    def _carry_out(self, effects: list[Effect]) -> None:
        for effect in effects:
            try:
                _EFFECTS[type(effect)](self, effect)
            except Exception:
                call_id = getattr(effect, "call_id", None)
                if not isinstance(call_id, str) or isinstance(effect, CallEnded):
                    raise
                log.exception(
                    "carrying out %s failed",
                    type(effect).__name__,
                    extra={"chat_id": self.chat_id, "call_id": call_id},
                )
                self._inbox.append(ToolFailed(call_id))

    def _call_ended(self, effect: CallEnded) -> None:
        observe.call_ended(self.ctx, self.chat_id, effect.call_id, effect.result)
        self.followers.call_ended(effect.call_id)

    # -----------------------------------------------------------------------------------------
    # Effects: the journal

    def _journal_write(self, effect: JournalWrite) -> None:
        journal = self.ctx.journal
        try:
            seq = journal.write(effect.row)
        except Exception:
            log.exception(
                "journaling %s failed",
                effect.row.call_id,
                extra={"chat_id": self.chat_id, "call_id": effect.row.call_id},
            )
            self.feed(JournalFailed(effect.row.call_id))
            return
        then = effect.then
        if then is None:
            return
        if journal.is_durable(seq):
            self.feed(then)
        else:
            # Fed by the commit that makes it durable, with every other row that commit
            # covers: no task per call.
            journal.when_durable(seq, lambda: self.feed(then))

    def _journal_touch(self, effect: JournalTouch) -> None:
        self.ctx.journal.touch(self.chat_id, effect.call_id, effect.wall_ms)

    def _journal_delete(self, effect: JournalDelete) -> None:
        self.ctx.journal.delete(self.chat_id, effect.call_id)

    def _journal_approve_tool(self, effect: JournalApproveTool) -> None:
        self.ctx.journal.approve_tool(self.chat_id, effect.tool)

    def _journal_forget_approvals(self, effect: JournalForgetApprovals) -> None:
        self.ctx.journal.forget_approvals(self.chat_id)

    def _read_back(self, effect: ReadBack) -> None:
        self._spawn(self._read_back_task, effect.call_ids)

    async def _read_back_task(self, call_ids: tuple[str, ...]) -> None:
        keys = [(self.chat_id, call_id) for call_id in call_ids]
        found = await self.ctx.journal.read_results(keys)
        results = {}
        for (chat_id, call_id), result in zip(keys, found, strict=True):
            if result is None:
                # A pinned record is never forgotten, so its row cannot be gone: the journal
                # lost a durable result. Stop rather than answer anything else.
                raise JournalError(f"the journal has no saved result for {chat_id!r}/{call_id!r}")
            results[call_id] = result
        self.feed(ResultsRead(results))


# How the shell carries out each effect: the sending ones through its followers, the ones that
# take time through its work, the journal's itself.
_EFFECTS: dict[type, Callable[[ChatActor, Any], None]] = {
    Follow: lambda chat, e: chat.followers.follow(e),
    Send: lambda chat, e: chat.followers.send(e),
    Publish: lambda chat, e: chat.followers.publish(e),
    SendResult: lambda chat, e: chat.followers.send_result(e),
    SendReplay: lambda chat, e: chat.followers.send_replay(e),
    Detach: lambda chat, e: chat.followers.detach(e),
    Forgotten: lambda chat, e: chat.followers.forgotten(e),
    CallEnded: ChatActor._call_ended,
    JournalWrite: ChatActor._journal_write,
    JournalTouch: ChatActor._journal_touch,
    JournalDelete: ChatActor._journal_delete,
    JournalApproveTool: ChatActor._journal_approve_tool,
    JournalForgetApprovals: ChatActor._journal_forget_approvals,
    ReadBack: ChatActor._read_back,
    RunTool: lambda chat, e: chat.work.run_tool(e),
    StopRun: lambda chat, e: chat.work.stop_run(e),
    Spawn: lambda chat, e: chat.work.spawn_process(e),
    StopGroup: lambda chat, e: chat.work.stop_group(e),
    KillGroup: lambda chat, e: chat.work.kill_group(e),
    MarkTimedOut: lambda chat, e: chat.work.mark_timed_out(e),
    StartTimer: lambda chat, e: chat.work.start_timer(e),
    CancelTimer: lambda chat, e: chat.work.cancel_timer(e),
    ShutdownDone: ChatActor._on_shutdown_done,
}
