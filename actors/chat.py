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
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from toolwire.actors import observe, processes, runners
from toolwire.actors.calls import CallSpec, shared_tool_name
from toolwire.actors.chat_state import ChatConfig, ChatState, TurnState
from toolwire.actors.context import AgentContext
from toolwire.actors.effects import (
    AlreadyExited,
    ApprovalRestored,
    ApproveRequest,
    AttachRequest,
    CallEnded,
    CallRequest,
    CancelRequest,
    CancelTimer,
    Deadline,
    Detach,
    DetachRequest,
    Effect,
    Follow,
    FollowMode,
    Forgotten,
    GraceOver,
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
    SpawnFailed,
    StartTimer,
    StopGroup,
    StopRun,
    Sweep,
    ToolEnded,
    ToolFailed,
    ToolStopped,
    TurnRequest,
)
from toolwire.actors.journal import JournalError
from toolwire.actors.journal_rows import JournalRow
from toolwire.actors.outbox import Outbox, Subscription
from toolwire.actors.records import RecordTable
from toolwire.actors.result_cache import ResultCache
from toolwire.actors.tools import execute as execute_tool
from toolwire.actors.tools import process_tools

log = logging.getLogger("toolwire.chat")

# Kept importable from here: transport, simulation, benchmarks and tests name them so.
__all__ = ["CallSpec", "ChatActor", "TurnState", "shared_tool_name"]


class _CallIO:
    """What the shell keeps for one call: its followers' subscriptions (their output cursors
    live in the outbox layer) and whether its result went out."""

    __slots__ = ("published", "subs")

    def __init__(self) -> None:
        self.subs: dict[Outbox, Subscription] = {}
        self.published = False


class ChatActor:
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
        self._io: dict[str, _CallIO] = {}
        self._timers: dict[tuple[str, str], trio.CancelScope] = {}
        self._stoppable: dict[str, trio.CancelScope] = {}
        self._inbox: deque[Input] = deque()
        self._draining = False
        # How this chat's task is started (the agent's nursery): on demand, when it has work.
        self._start_task = start
        self._nursery: trio.Nursery | None = None
        self._running = False  # run() is started or running
        self._pending: list[tuple[Callable[..., Awaitable[None]], tuple[Any, ...]]] = []

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
        self._carry_out(effects)
        self._drain()

    def feed(self, event: Input) -> None:
        """A report of what happened: applied after whatever is being applied now."""
        self._inbox.append(event)
        self._drain()

    def _drain(self) -> None:
        if self._draining:
            return
        self._draining = True
        try:
            inbox = self._inbox
            while inbox:
                event = inbox.popleft()
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
            call_id = getattr(effect, "call_id", None)
            try:
                self._EFFECTS[type(effect)](self, effect)
            except Exception:
                if not isinstance(call_id, str) or isinstance(effect, CallEnded):
                    raise
                log.exception(
                    "carrying out %s failed",
                    type(effect).__name__,
                    extra={"chat_id": self.chat_id, "call_id": call_id},
                )
                self._inbox.append(ToolFailed(call_id))

    # -----------------------------------------------------------------------------------------
    # Effects: sending

    def _io_for(self, call_id: str) -> _CallIO:
        io = self._io.get(call_id)
        if io is None:
            io = self._io[call_id] = _CallIO()
        return io

    def _subscribe(self, outbox: Outbox, call_id: str, io: _CallIO, stream: bool) -> Subscription:
        sub = io.subs.get(outbox)
        if sub is None or not sub.active:
            sub = Subscription(outbox, self.chat_id, call_id)
            sub.on_caught_up = lambda: self._maybe_close_output(call_id)
            io.subs[outbox] = sub
            proc = self.processes.get(call_id)
            if proc is not None:
                sub.buffer = proc.output
        sub.detached = False  # a new request on this connection follows the call again
        sub.stream = sub.stream or stream
        return sub

    def _follow(self, effect: Follow) -> None:
        outbox = effect.conn
        assert isinstance(outbox, Outbox)
        io = self._io_for(effect.call_id)
        before = io.subs.get(outbox)
        # Already streaming output to this connection for an earlier request: that request's
        # output must not be skipped, so the cursor only ever moves back (PROTOCOL.md 9.9).
        was_following = before is not None and before.following
        sub = self._subscribe(outbox, effect.call_id, io, effect.stream)
        if effect.resolved_events:
            sub.resolved_events = True
        for event in effect.events:
            outbox.put(event, sub)
        if effect.mode is FollowMode.LIVE:
            wanted = effect.from_offset or 0
            sub.cursor = min(sub.cursor, wanted) if was_following else wanted
            sub.finished = False
            if effect.started is not None:
                outbox.put(effect.started, sub)
            sub.output_ready()
        elif effect.mode is FollowMode.REPLAY:
            io.published = True
            if not was_following:
                # No live output for this connection: a process that outlived its call (a
                # timeout) goes on printing, but no output follows a result.
                sub.finished = True
            # Counted as queued while it is read back from the journal.
            sub.results_queued += 1
            if effect.from_offset is not None:
                sub.replays_pending += 1

    def _send(self, effect: Send) -> None:
        outbox = effect.conn
        assert isinstance(outbox, Outbox)
        outbox.put(effect.event)

    def _publish(self, effect: Publish) -> None:
        io = self._io.get(effect.call_id)
        if io is None:
            return
        for sub in io.subs.values():
            if sub.active and not sub.detached:
                sub.outbox.put(effect.event, sub)

    def _send_result(self, effect: SendResult) -> None:
        outbox = effect.conn
        assert isinstance(outbox, Outbox)
        sub = self._io_for(effect.call_id).subs.get(outbox)
        if sub is None:
            outbox.put(effect.event)  # its follow was dropped (a closed connection)
        else:
            outbox.put_result(sub, effect.event)

    def _send_replay(self, effect: SendReplay) -> None:
        outbox = effect.conn
        assert isinstance(outbox, Outbox)
        io = self._io_for(effect.call_id)
        sub = io.subs.get(outbox)
        if sub is None:
            sub = self._subscribe(outbox, effect.call_id, io, False)
        else:
            sub.results_queued -= 1
        outbox.put_replay(sub, effect.event, effect.from_offset)

    def _detach(self, effect: Detach) -> None:
        io = self._io.get(effect.call_id)
        outbox = effect.conn
        assert isinstance(outbox, Outbox)
        sub = io.subs.get(outbox) if io is not None else None
        if io is None or sub is None:
            return
        if effect.keep or sub.results_queued:
            # Its events stop now, but each request already made still gets its `accepted`
            # (queued) and its one `result` (PROTOCOL.md 9.9): the subscription stays for them.
            sub.detached = True
        else:
            del io.subs[sub.outbox]
            sub.active = False
        self._maybe_close_output(effect.call_id)

    def _forgotten(self, effect: Forgotten) -> None:
        io = self._io.pop(effect.call_id, None)
        if io is not None:
            for sub in io.subs.values():
                sub.active = False

    def _call_ended(self, effect: CallEnded) -> None:
        observe.call_ended(self.ctx, self.chat_id, effect.call_id, effect.result)
        io = self._io.get(effect.call_id)
        if io is not None:
            io.published = True
            self._maybe_close_output(effect.call_id)
            self._maybe_release(effect.call_id)

    def _output_arrived(self, call_id: str) -> None:
        io = self._io.get(call_id)
        if io is not None:
            for sub in io.subs.values():
                sub.output_ready()

    def _maybe_close_output(self, call_id: str) -> None:
        """Shrink a finished process's output to the result's size once no follower lags:
        while its call is followed the full retention stays (PROTOCOL.md 5.2)."""
        io = self._io.get(call_id)
        if io is None:
            return
        proc = self.processes.get(call_id)
        if proc is not None and not proc.output.closed:
            if not proc.output_closed.is_set():
                return  # the command may still print
            subs = io.subs
            for outbox, sub in list(subs.items()):
                if not sub.active or outbox.closed:
                    del subs[outbox]
            if any(sub.lagging for sub in subs.values()):
                return
            proc.output.close()
        self._maybe_release(call_id)

    def _maybe_release(self, call_id: str) -> None:
        """A published call keeps nothing here once no follower needs its output any more:
        idle records stay small (10,000 chats of records)."""
        io = self._io.get(call_id)
        if io is None or not io.published:
            return
        proc = self.processes.get(call_id)
        if proc is not None and not proc.output.closed:
            return
        if any(sub.results_queued or sub.replays_pending for sub in io.subs.values()):
            return  # a replay still to be sent reads the retained output through its follow
        del self._io[call_id]

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
            self._inbox.append(JournalFailed(effect.row.call_id))
            return
        then = effect.then
        if then is None:
            return
        if journal.is_durable(seq):
            self._inbox.append(then)
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

    # -----------------------------------------------------------------------------------------
    # Effects: running tools

    def _run_tool(self, effect: RunTool) -> None:
        if effect.on_loop:
            # Short operations run right here: no task, no context switch (the path of the
            # "trivial call" benchmark).
            try:
                report = runners.run_tool(effect.args, self.ctx.workspace, self.processes)
            except Exception:
                log.exception(
                    "tool %s failed",
                    effect.tool,
                    extra={"chat_id": self.chat_id, "call_id": effect.call_id},
                )
                self._inbox.append(ToolFailed(effect.call_id))
                return
            self._inbox.append(ToolEnded(effect.call_id, report))
            return
        scope = trio.CancelScope()
        if isinstance(effect.args, process_tools.ProcessOutputArgs):
            self._stoppable[effect.call_id] = scope
        self._spawn(self._run_tool_task, effect, scope)

    async def _run_tool_task(self, effect: RunTool, scope: trio.CancelScope) -> None:
        try:
            with scope:
                if isinstance(effect.args, process_tools.ProcessOutputArgs):
                    report = await runners.wait_for_process(
                        self.processes, effect.args, self.ctx.limits.max_wait_ms
                    )
                else:
                    report = await runners.run_tool_in_thread(
                        effect.args, self.ctx.workspace, self.processes
                    )
        except Exception:
            log.exception(
                "tool %s failed",
                effect.tool,
                extra={"chat_id": self.chat_id, "call_id": effect.call_id},
            )
            self.feed(ToolFailed(effect.call_id))
            return
        finally:
            self._stoppable.pop(effect.call_id, None)
        if scope.cancelled_caught:
            self.feed(ToolStopped(effect.call_id))
        else:
            self.feed(ToolEnded(effect.call_id, report))

    def _stop_run(self, effect: StopRun) -> None:
        scope = self._stoppable.get(effect.call_id)
        if scope is not None:
            scope.cancel()

    # -----------------------------------------------------------------------------------------
    # Effects: processes

    def _spawn_process(self, effect: Spawn) -> None:
        args = effect.args
        assert isinstance(args, execute_tool.ExecuteArgs)
        call_id = effect.call_id
        try:
            proc = self.processes.spawn(
                call_id,
                args.command,
                execute_tool.argv_for(args),
                execute_tool.cwd_for(args, self.ctx.workspace),
                execute_tool.env_for(args, self.ctx.base_env),
                effect.started_at_ms,
            )
        except OSError as exc:
            self._inbox.append(SpawnFailed(call_id, exc.strerror or str(exc)))
            return
        io = self._io.get(call_id)
        if io is not None:
            for sub in io.subs.values():
                sub.buffer = proc.output
        counter = observe.OutputCounter(self.ctx)

        def on_output(proc: processes.ProcessRecord) -> None:
            counter.update(proc.output.total)
            self._output_arrived(call_id)

        self._spawn(self._pump, proc, on_output)
        self._spawn(self._reap, proc, on_output)
        assert proc.handle.pid is not None
        self._inbox.append(Spawned(call_id, proc.handle.pid, runners.snapshot(proc)))

    async def _pump(
        self,
        proc: processes.ProcessRecord,
        on_output: Callable[[processes.ProcessRecord], None],
    ) -> None:
        try:
            await processes.pump(proc, on_output)
        except Exception:
            log.exception(
                "output pump failed", extra={"chat_id": self.chat_id, "call_id": proc.process_id}
            )
        self._maybe_close_output(proc.process_id)
        self.feed(OutputClosed(proc.process_id))

    async def _reap(
        self,
        proc: processes.ProcessRecord,
        on_output: Callable[[processes.ProcessRecord], None],
    ) -> None:
        await processes.reap(proc, self.ctx.wall_ms, self.processes.exited)
        # What the command wrote before it exited, without waiting for EOF (a background child
        # may hold the pipe for long).
        processes.drain_available(proc, on_output)
        self.feed(ProcessExited(proc.process_id, runners.snapshot(proc)))

    def _stop_group(self, effect: StopGroup) -> None:
        proc = self.processes.get(effect.call_id)
        if proc is None:
            self._inbox.append(GroupStopped(effect.call_id, _gone(effect.call_id)))
            return
        if effect.unless_exited and processes.has_exited(proc):
            self._inbox.append(AlreadyExited(effect.call_id))
            return
        proc.canceled = True
        self._spawn(self._term_task, proc, effect.grace_s)

    async def _term_task(self, proc: processes.ProcessRecord, grace_s: float) -> None:
        emptied = await runners.term_group(proc, grace_s)
        self.feed(GroupEmpty(proc.process_id) if emptied else GraceOver(proc.process_id))

    def _kill_group(self, effect: KillGroup) -> None:
        proc = self.processes.get(effect.call_id)
        if proc is None:
            self._inbox.append(GroupStopped(effect.call_id, _gone(effect.call_id)))
            return
        self._spawn(self._kill_task, proc)

    async def _kill_task(self, proc: processes.ProcessRecord) -> None:
        await runners.kill_group(proc)
        processes.drain_available(proc, lambda p: self._output_arrived(p.process_id))
        self.feed(GroupStopped(proc.process_id, runners.snapshot(proc)))

    def _mark_timed_out(self, effect: MarkTimedOut) -> None:
        proc = self.processes.get(effect.call_id)
        if proc is not None:
            proc.timed_out = True

    # -----------------------------------------------------------------------------------------
    # Effects: timers

    def _start_timer(self, effect: StartTimer) -> None:
        old = self._timers.pop(effect.key, None)
        if old is not None:
            old.cancel()
        scope = trio.CancelScope(deadline=effect.at)
        self._timers[effect.key] = scope
        self._spawn(self._timer_task, effect, scope)

    async def _timer_task(self, effect: StartTimer, scope: trio.CancelScope) -> None:
        with scope:
            await trio.sleep_forever()
        if self._timers.get(effect.key) is not scope:
            return  # canceled, or replaced by a newer timer of the same key
        del self._timers[effect.key]
        fire = effect.fire
        if isinstance(fire, Deadline):
            proc = self.processes.get(fire.call_id)
            fire = Deadline(fire.call_id, runners.snapshot(proc) if proc is not None else None)
        self.feed(fire)

    def _cancel_timer(self, effect: CancelTimer) -> None:
        scope = self._timers.pop(effect.key, None)
        if scope is not None:
            scope.cancel()

    _EFFECTS: dict[type, Callable[[ChatActor, Any], None]] = {
        Follow: _follow,
        Send: _send,
        Publish: _publish,
        SendResult: _send_result,
        SendReplay: _send_replay,
        Detach: _detach,
        Forgotten: _forgotten,
        CallEnded: _call_ended,
        JournalWrite: _journal_write,
        JournalTouch: _journal_touch,
        JournalDelete: _journal_delete,
        JournalApproveTool: _journal_approve_tool,
        JournalForgetApprovals: _journal_forget_approvals,
        ReadBack: _read_back,
        RunTool: _run_tool,
        StopRun: _stop_run,
        Spawn: _spawn_process,
        StopGroup: _stop_group,
        KillGroup: _kill_group,
        MarkTimedOut: _mark_timed_out,
        StartTimer: _start_timer,
        CancelTimer: _cancel_timer,
    }


def _gone(call_id: str) -> ProcessSnapshot:
    """A command the table no longer lists (swept after it exited): nothing left to tell."""
    return ProcessSnapshot(call_id, None, None, True, "", 0, 0)
