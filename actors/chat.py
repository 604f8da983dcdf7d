"""ChatActor: one trio nursery per chat that owns its tool-call records, processes and gates.

Every request is applied to the record table synchronously (no `await` between reading and
writing a record), so trio's cooperative scheduling makes each transition atomic without locks.
Work that takes time (a process, a thread-run search, a parked gate, a turn) runs as a task in
this chat's nursery and reports back through the same synchronous methods.

Failure containment: an exception inside one call saves that call's `unknown` result
(PROTOCOL.md 7); it never takes down the chat, another chat or the connection.
"""

from __future__ import annotations

import logging
import math
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import msgspec
import trio

from actors import call_results, planner, processes
from actors.events import (
    AcceptedEvent,
    ApprovalEvent,
    ApprovalResolvedEvent,
    CancelResultEvent,
    Event,
    InterruptedEvent,
    ResultEvent,
    StartedEvent,
    TurnPlanEvent,
    TurnResultEvent,
)
from actors.journal import JournalError, JournalRow
from actors.outbox import Outbox, Subscription
from actors.records import (
    Admission,
    CancelAction,
    RecordState,
    RecordTable,
    ToolCallRecord,
    args_fingerprint,
)
from actors.result_cache import ResultCache
from actors.results import (
    TEXT_AGENT_FAILURE,
    TEXT_AGENT_RESTARTED,
    TEXT_APPROVAL_EXPIRED,
    TEXT_CANCELED_BEFORE_RUN,
    TEXT_CANCELED_WHILE_RUNNING,
    TEXT_DENIED,
    Outcome,
    Result,
    ToolReport,
    ToolwireError,
)
from actors.tools import execute as execute_tool
from actors.tools import files as file_tools
from actors.tools import process_tools
from actors.tools.registry import TOOLS, ToolDef, ToolKind, lookup, parse_args

if TYPE_CHECKING:
    from actors.agent import AgentContext

log = logging.getLogger("toolwire.chat")


def shared_tool_name(name: str) -> str:
    """The registry's own string for a known tool name: a record keeps it for as long as it
    lives, and a name decoded from a request or a journal row is a new string each time (about
    60 bytes per record, 100,000 records)."""
    tool = TOOLS.get(name)
    return tool.name if tool is not None else name


@dataclass(frozen=True, slots=True)
class CallSpec:
    """A tool call as requested (a `call` message, or one call of a `turn`)."""

    call_id: str
    tool: str
    args: Any
    timeout_ms: int | None = None
    background: bool = False
    approval: bool = False


@dataclass(eq=False)
class CallRuntime:
    """What the chat holds for one record besides the pure record state."""

    spec: CallSpec
    parsed: msgspec.Struct | None = None
    invalid: str | None = None  # why the args are unusable (turn calls only: fails when run)
    done: trio.Event = field(default_factory=trio.Event)
    subs: dict[Outbox, Subscription] = field(default_factory=dict)
    process: processes.ProcessRecord | None = None
    started: StartedEvent | None = None
    gate: trio.Event | None = None  # set when a parked gate is answered
    approved: bool = False
    limiter: trio.CapacityLimiter | None = None  # a turn's "at most 8 at once"
    # A blocking wait (process_output) has no process of its own to stop: a cancel ends it here.
    wait_scope: trio.CancelScope | None = None


@dataclass(eq=False)
class TurnRun:
    turn_id: str
    call_ids: list[str]
    fingerprint: bytes
    segments: list[list[str]]
    # One entry per `turn` request made while the turn runs: each gets its own turn_result.
    followers: list[Outbox] = field(default_factory=list)
    # Set once its turn_result went to the followers (and anything queued before it).
    done: trio.Event = field(default_factory=trio.Event)
    # Every call has its published result. The results themselves stay with the records (and
    # the journal): a repeated turn reads them from there, so a finished turn holds none.
    finished: bool = False


# A delivery: results some requests are owed, and what sends them once they are at hand.
_Delivery = tuple[list[ToolCallRecord], Callable[[list[Result]], None]]


class ChatActor:
    def __init__(
        self,
        ctx: AgentContext,
        chat_id: str,
        start: Callable[[Callable[[], Awaitable[None]]], None] | None = None,
        *,
        results: ResultCache | None = None,
    ) -> None:
        self.chat_id = chat_id
        self.ctx = ctx
        # The agent's recent results (shared by its chats): with a journal that keeps results,
        # a finished record's result lives there or in the journal, not in the record.
        self._results = results if results is not None else ResultCache()
        # Deliveries waiting for a result to be read back from the journal, in request order;
        # None while nothing waits (the common case, and no deque per idle chat).
        self._lane: deque[_Delivery] | None = None
        # How this chat's task is started (the agent's nursery): on demand, when it has work.
        self._start_task = start
        self.records = RecordTable()
        self.processes = processes.ProcessTable(
            ctx.backend,
            exited_retention_s=ctx.limits.exited_retention_s,
            retention_bytes=ctx.limits.output_retention_bytes,
            result_bytes=ctx.limits.result_output_bytes,
        )
        self.turns: dict[str, TurnRun] = {}
        # execute calls accepted but not spawned yet: each holds a process slot, so a burst of
        # calls within one scheduling tick cannot get past max_processes_per_chat.
        # (A dict used as a set: an empty set costs 216 bytes, an empty dict 64; per idle chat.)
        self._launching: dict[str, None] = {}
        self._nursery: trio.Nursery | None = None
        self._running = False  # run() is started or running
        self._pending: list[tuple[Callable[..., Awaitable[None]], tuple[Any, ...]]] = []

    # -----------------------------------------------------------------------------------------
    # Lifecycle

    async def run(self) -> None:
        """The chat's nursery, open while the chat has work: it closes once its last task
        ended, so ten thousand idle chats hold records but no tasks. `_spawn` opens it again."""
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
            not self.records
            and not self.processes
            and not self.turns
            and not self._pending
            and not tasks
            and not self._running
        )

    def _now(self) -> float:
        return trio.current_time()

    # -----------------------------------------------------------------------------------------
    # Requests (all synchronous: each is one atomic transition)

    def call(self, outbox: Outbox, spec: CallSpec, *, stream: bool, rid: Any) -> None:
        """A `call` request (PROTOCOL.md 5.1). Raises ToolwireError and changes nothing."""
        record = self.records.get(spec.call_id)
        parsed: msgspec.Struct | None = None
        if record is None or record.tool is None:
            tool = lookup(spec.tool)
            parsed = parse_args(tool, spec.args)
            self._check_options(tool, spec)
        fingerprint = args_fingerprint(spec.tool, spec.args)
        admission, record = self.records.admit(
            spec.call_id,
            shared_tool_name(spec.tool),
            fingerprint,
            self._now(),
            initial_state=RecordState.QUEUED,
        )
        assert record is not None
        if admission is Admission.CONFLICT:
            raise self._conflict(record)
        if admission is Admission.NEW:
            self._forget_some()
            runtime = CallRuntime(spec=spec, parsed=parsed)
            record.runtime = runtime
            sub = self._subscribe(outbox, record, stream=stream)
            gated = self._gated(spec)
            state = "awaiting_approval" if gated else "running"
            outbox.put(
                AcceptedEvent(self.chat_id, spec.call_id, False, state, record.requests, rid), sub
            )
            sub.results_owed += 1
            self._start(record, gated=gated)
            return
        self._journal_touch(record)
        self._follow(outbox, record, stream=stream, rid=rid, from_offset=None)

    def attach(self, outbox: Outbox, call_id: str, from_offset: int, rid: Any) -> None:
        record = self.records.attach(call_id, self._now())
        if record is None:
            raise ToolwireError("unknown_call", f"no call {call_id!r} in chat {self.chat_id!r}")
        self._journal_touch(record)
        self._follow(outbox, record, stream=True, rid=rid, from_offset=from_offset)

    def detach(self, outbox: Outbox, call_id: str) -> None:
        record = self.records.get(call_id)
        if record is None:
            raise ToolwireError("unknown_call", f"no call {call_id!r} in chat {self.chat_id!r}")
        runtime = self._runtime(record)
        sub = runtime.subs.pop(outbox, None)
        if sub is not None:
            sub.active = False
            self._maybe_close_output(record)

    def approve(self, outbox: Outbox, call_id: str, approved: bool, rid: Any) -> None:
        record = self.records.get(call_id)
        if record is None:
            raise ToolwireError("unknown_call", f"no call {call_id!r} in chat {self.chat_id!r}")
        if record.state is not RecordState.AWAITING_APPROVAL:
            raise ToolwireError(
                "not_parked",
                f"call {call_id!r} is not waiting for approval (it is {record.state.wire_state})",
            )
        self.records.touch(record, self._now())
        decision = "approved" if approved else "denied"
        self._resolve_gate(record, decision)
        sub = self._runtime(record).subs.get(outbox)
        if sub is None or not sub.active or not (sub.stream or sub.resolved_events):
            # The approver learns that its answer took effect even when it does not follow the
            # call (another replica raised the gate): the one reply an `approve` gets.
            outbox.put(ApprovalResolvedEvent(self.chat_id, call_id, decision))
        if approved:
            self.records.unpark(record)
            self._launch(record)
        else:
            self._finish(record, self._plain_result(record, Outcome.DENIED, TEXT_DENIED))

    def cancel(self, outbox: Outbox, call_ids: list[str], rid: Any) -> None:
        for call_id in call_ids:
            received, record = self._cancel_one(call_id)
            record.pins += 1  # its result is owed: not forgotten before the reply
            self._spawn(self._reply_cancel, outbox, record, received, rid)

    def turn(
        self, outbox: Outbox, turn_id: str, specs: list[CallSpec], *, stream: bool, rid: Any
    ) -> None:
        """A `turn` request (PROTOCOL.md 5.6): validate everything first, then admit."""
        fingerprint = args_fingerprint(
            "turn",
            [[s.call_id, s.tool, s.args, s.timeout_ms, s.background, s.approval] for s in specs],
        )
        existing = self.turns.get(turn_id)
        if (
            existing is not None
            and existing.finished
            and any(self.records.get(call_id) is None for call_id in existing.call_ids)
        ):
            # One of its calls (created by an earlier call or turn) was forgotten (5.4): the
            # finished turn goes with it, and this request is a new turn.
            del self.turns[turn_id]
            existing = None
        if existing is not None:
            if existing.fingerprint != fingerprint:
                raise ToolwireError(
                    "conflict",
                    f"turn {turn_id!r} was first sent with different calls; "
                    "a repeated turn must repeat the same calls",
                )
            for call_id in existing.call_ids:
                # The repeat names each of its calls again: it counts and touches like a call.
                record = self.records.attach(call_id, self._now())
                if record is not None:
                    self._journal_touch(record)
            self._follow_turn(outbox, existing, stream=stream, rid=rid, created=frozenset())
            return
        if not specs:
            raise ToolwireError("bad_args", "turn: calls must not be empty")
        seen: set[str] = set()
        fingerprints = [args_fingerprint(spec.tool, spec.args) for spec in specs]
        for spec, fp in zip(specs, fingerprints, strict=True):
            if spec.call_id in seen:
                raise ToolwireError(
                    "bad_args", f"turn: call_id {spec.call_id!r} appears twice in one turn"
                )
            seen.add(spec.call_id)
            record = self.records.get(spec.call_id)
            if (
                record is not None
                and record.tool is not None
                and (record.tool != spec.tool or record.fingerprint != fp)
            ):
                raise self._conflict(record)
        segments = planner.plan_segments(
            [planner.PlannedCall(s.call_id, s.tool, s.args) for s in specs], self.ctx.workspace
        )
        run = TurnRun(turn_id, [s.call_id for s in specs], fingerprint, segments)
        self.turns[turn_id] = run
        limiter = trio.CapacityLimiter(planner.MAX_PARALLEL_CALLS)
        created: set[str] = set()
        for spec, fp in zip(specs, fingerprints, strict=True):
            admission, record = self.records.admit(
                spec.call_id,
                shared_tool_name(spec.tool),
                fp,
                self._now(),
                initial_state=RecordState.QUEUED,
                turn_id=turn_id,
            )
            assert record is not None and admission is not Admission.CONFLICT
            record.pins += 1  # until the turn has its turn_result (`_run_turn`)
            if admission is Admission.NEW:
                created.add(spec.call_id)
                runtime = CallRuntime(spec=spec, limiter=limiter)
                try:
                    tool = lookup(spec.tool)
                    runtime.parsed = parse_args(tool, spec.args)
                    self._check_options(tool, spec)
                except ToolwireError as exc:
                    runtime.invalid = exc.message
                record.runtime = runtime
            else:
                self._runtime(record)  # an existing record: its own runtime, done if published
        self._follow_turn(outbox, run, stream=stream, rid=rid, created=frozenset(created))
        self._spawn(self._run_turn, run)

    def interrupt(self, outbox: Outbox, turn_id: str | None, rid: Any) -> None:
        """Cancel every unresolved call (of the chat, or of one turn) and report when quiet."""
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
            if not t.done.is_set() and (turn_id is None or t.turn_id == turn_id)
        ]
        for record in targets:
            self._cancel_one(record.call_id)
        self._spawn(self._reply_interrupted, outbox, turn_id, targets, ending, turns, rid)

    # -----------------------------------------------------------------------------------------
    # Following

    def _subscribe(self, outbox: Outbox, record: ToolCallRecord, *, stream: bool) -> Subscription:
        runtime = self._runtime(record)
        sub = runtime.subs.get(outbox)
        if sub is None or not sub.active:
            sub = Subscription(outbox, self.chat_id, record.call_id)
            sub.on_caught_up = lambda: self._maybe_close_output(record)
            runtime.subs[outbox] = sub
            if runtime.process is not None:
                sub.buffer = runtime.process.output
        sub.stream = sub.stream or stream
        return sub

    def _follow(
        self,
        outbox: Outbox,
        record: ToolCallRecord,
        *,
        stream: bool,
        rid: Any,
        from_offset: int | None,
        replay: bool = True,
    ) -> None:
        """A repeat `call` (from_offset None) or an `attach` of an existing record (or a call a
        turn just created: `replay` False)."""
        runtime = self._runtime(record)
        sub = self._subscribe(outbox, record, stream=stream)
        outbox.put(
            AcceptedEvent(
                self.chat_id,
                record.call_id,
                replay,
                # Ended but not yet durable: it is answered like a running call (output, then
                # the result once saved), so say so.
                "running" if record.done and not runtime.done.is_set() else record.state.wire_state,
                record.requests,
                rid,
            ),
            sub,
        )
        if record.state is RecordState.AWAITING_APPROVAL:
            self._announce_gate(record, only=sub)
        if runtime.done.is_set():
            # Published means durable: a result is never sent before the journal holds it.
            if from_offset is None:
                # A repeat of an ended call gets its result only; but a result still queued for
                # an earlier request on this connection keeps the output it owes (no gaps).
                if sub.results_queued == 0:
                    sub.finished = True
            else:
                sub.finished = False
                sub.cursor = from_offset
            # Counted as queued while it is read back from the journal, so that a repeat
            # meanwhile still leaves the output this request owes (see just above).
            sub.results_queued += 1

            def send(results: list[Result]) -> None:
                sub.results_queued -= 1
                outbox.put_result(sub, ResultEvent(self.chat_id, record.call_id, results[0]))

            self._deliver([record], send)
            return
        sub.finished = False
        sub.cursor = from_offset or 0
        if runtime.started is not None:
            outbox.put(runtime.started, sub)
        sub.output_ready()
        sub.results_owed += 1

    def _follow_turn(
        self,
        outbox: Outbox,
        run: TurnRun,
        *,
        stream: bool,
        rid: Any,
        created: frozenset[str],
    ) -> None:
        """`created`: the calls this very request admitted as new (accepted with replay false)."""
        if not run.finished:
            run.followers.append(outbox)
        outbox.put(TurnPlanEvent(self.chat_id, run.turn_id, run.segments, rid))
        for call_id in run.call_ids:
            record = self.records.get(call_id)
            if record is None:
                continue
            if stream:
                self._follow(
                    outbox,
                    record,
                    stream=True,
                    rid=None,
                    from_offset=None,
                    replay=call_id not in created,
                )
            else:
                sub = self._subscribe(outbox, record, stream=False)
                sub.resolved_events = True
                if record.state is RecordState.AWAITING_APPROVAL:
                    self._announce_gate(record, only=sub)
        if run.finished:
            # After each call's result above: deliveries keep their order.
            self._deliver(
                self._turn_records(run),
                lambda results: outbox.put(TurnResultEvent(self.chat_id, run.turn_id, results)),
            )

    def _publish(self, record: ToolCallRecord, event: Event) -> None:
        for sub in self._runtime(record).subs.values():
            if sub.active:
                sub.outbox.put(event, sub)

    def _output_arrived(self, record: ToolCallRecord) -> None:
        for sub in self._runtime(record).subs.values():
            sub.output_ready()

    def _maybe_close_output(self, record: ToolCallRecord) -> None:
        """Shrink a finished process's output to the result's size once no follower lags:
        while its call is followed the full retention stays (PROTOCOL.md 5.2)."""
        runtime = record.runtime
        if not isinstance(runtime, CallRuntime):
            return  # released: its output was closed already
        proc = runtime.process
        if proc is None or proc.output.closed or not proc.output_closed.is_set():
            return
        subs = runtime.subs
        for outbox, sub in list(subs.items()):
            if not sub.active or outbox.closed:
                del subs[outbox]
        if not any(sub.lagging for sub in subs.values()):
            proc.output.close()
            self._maybe_release(record)

    # -----------------------------------------------------------------------------------------
    # Running

    def _gated(self, spec: CallSpec) -> bool:
        return spec.approval or spec.tool in self.ctx.approve_tools

    def _start(self, record: ToolCallRecord, *, gated: bool) -> None:
        """A queued record's turn has come: park it at its gate or run it."""
        if record.state is not RecordState.QUEUED:
            return
        if gated:
            self.records.park(record)
            runtime = self._runtime(record)
            runtime.gate = trio.Event()
            self._journal_write(record)
            self._announce_gate(record)
            if self.ctx.approval_timeout_s is not None:
                self._spawn(self._expire_gate, record, runtime.gate)
            return
        self._launch(record)

    def _launch(self, record: ToolCallRecord) -> None:
        runtime = self._runtime(record)
        if runtime.invalid is not None or runtime.parsed is None:
            self.records.begin(record)
            record.started_at_ms = self.ctx.wall_ms()
            why = runtime.invalid or "the call's arguments could not be read"
            self._finish(record, self._plain_result(record, Outcome.FAILED, why))
            return
        tool = TOOLS[runtime.spec.tool]
        if tool.kind is ToolKind.INLINE and runtime.limiter is None:
            # Short file operations run right here: no task, no context switch. This is the
            # path of the "trivial call" benchmark.
            seq = self._begin(record)
            if self.ctx.journal.is_durable(seq):
                self._finish_guarded(record, lambda: self._run_inline(tool, runtime))
            else:
                self._spawn(self._run_inline_when_durable, record, tool, runtime, seq)
            return
        if tool.kind is ToolKind.EXECUTE:
            self._launching[record.call_id] = None
        self._spawn(self._run_task, record, tool)

    def _begin(self, record: ToolCallRecord) -> int:
        """Mark the effect started and journal it; returns the journal sequence number that
        must be durable before the effect may actually happen (see `_durable_start`)."""
        self.records.begin(record)
        record.started_at_ms = self.ctx.wall_ms()
        runtime = self._runtime(record)
        if runtime.spec.timeout_ms:
            # The deadline is fixed at the FIRST start; no retry ever moves it (5.2).
            record.deadline = self._now() + runtime.spec.timeout_ms / 1000
        return self._journal_write(record)

    async def _durable_start(self, record: ToolCallRecord, seq: int) -> bool:
        """Wait until the journal holds "started" before the effect happens, so a crash can
        never forget a call that ran (it comes back `unknown`, never runs twice). A cancel that
        arrived meanwhile wins: nothing happened, so the call ends not_run. False if so."""
        if not self.ctx.journal.is_durable(seq):
            await self.ctx.journal.wait_durable(seq)
        if record.cancel_requested:
            self._finish(
                record, self._plain_result(record, Outcome.NOT_RUN, TEXT_CANCELED_BEFORE_RUN)
            )
            return False
        return True

    async def _run_inline_when_durable(
        self, record: ToolCallRecord, tool: ToolDef, runtime: CallRuntime, seq: int
    ) -> None:
        if await self._durable_start(record, seq):
            self._finish_guarded(record, lambda: self._run_inline(tool, runtime))

    def _run_inline(self, tool: ToolDef, runtime: CallRuntime) -> ToolReport:
        parsed = runtime.parsed
        workspace = self.ctx.workspace
        if isinstance(parsed, file_tools.ReadFileArgs):
            return file_tools.read_file(workspace, parsed)
        if isinstance(parsed, file_tools.WriteFileArgs):
            return file_tools.write_file(workspace, parsed)
        if isinstance(parsed, file_tools.EditFilesArgs):
            return file_tools.edit_files(workspace, parsed)
        if isinstance(parsed, file_tools.SearchFilesArgs):
            return file_tools.search_files(workspace, parsed)
        if isinstance(parsed, process_tools.ProcessSignalArgs):
            return process_tools.process_signal(self.processes, parsed)
        if isinstance(parsed, process_tools.ProcessListArgs):
            return process_tools.process_list(self.processes)
        raise AssertionError(f"no inline runner for {tool.name}")

    def _finish_guarded(self, record: ToolCallRecord, run: Callable[[], ToolReport]) -> None:
        try:
            report = run()
        except Exception:
            log.exception("tool %s failed", record.tool, extra=self._log_extra(record))
            self._finish(record, self._plain_result(record, Outcome.UNKNOWN, TEXT_AGENT_FAILURE))
            return
        self._finish(record, self._report_result(record, report))

    async def _run_task(self, record: ToolCallRecord, tool: ToolDef) -> None:
        runtime = self._runtime(record)
        try:
            if runtime.limiter is not None:
                async with runtime.limiter:
                    await self._run_tool(record, tool, runtime)
            else:
                await self._run_tool(record, tool, runtime)
        except Exception:
            log.exception("tool %s failed", record.tool, extra=self._log_extra(record))
            if record.effect_started:
                result = self._plain_result(record, Outcome.UNKNOWN, TEXT_AGENT_FAILURE)
            else:
                result = self._plain_result(record, Outcome.NOT_RUN, TEXT_CANCELED_BEFORE_RUN)
            self._finish(record, result)
        finally:
            self._launching.pop(record.call_id, None)

    async def _run_tool(self, record: ToolCallRecord, tool: ToolDef, runtime: CallRuntime) -> None:
        if record.state is not RecordState.QUEUED and record.state is not (
            RecordState.AWAITING_APPROVAL
        ):
            return  # canceled (or denied) while waiting for a worker slot
        if tool.kind is ToolKind.EXECUTE:
            await self._run_execute(record, runtime)
            return
        seq = self._begin(record)
        if not await self._durable_start(record, seq):
            return
        parsed = runtime.parsed
        if isinstance(parsed, process_tools.ProcessOutputArgs):
            with trio.CancelScope() as scope:
                runtime.wait_scope = scope
                report = await process_tools.process_output(
                    self.processes, parsed, self.ctx.limits.max_wait_ms
                )
            if scope.cancelled_caught:
                self._finish(
                    record,
                    self._plain_result(record, Outcome.CANCELED, TEXT_CANCELED_WHILE_RUNNING),
                )
                return
        elif tool.kind is ToolKind.THREAD:
            report = await trio.to_thread.run_sync(self._run_inline, tool, runtime)
        else:
            report = self._run_inline(tool, runtime)
        self._finish(record, self._report_result(record, report))

    async def _run_execute(self, record: ToolCallRecord, runtime: CallRuntime) -> None:
        args = runtime.parsed
        assert isinstance(args, execute_tool.ExecuteArgs)
        seq = self._begin(record)
        if not await self._durable_start(record, seq):
            return
        self._launching.pop(record.call_id, None)
        if self._at_process_limit():
            limit = self.ctx.limits.max_processes_per_chat
            self._finish(
                record,
                self._plain_result(
                    record,
                    Outcome.FAILED,
                    f"the command did not start: this chat already runs {limit} processes "
                    "(max_processes_per_chat); wait for one to exit or stop one",
                ),
            )
            return
        try:
            proc = self.processes.spawn(
                record.call_id,
                args.command,
                execute_tool.argv_for(args),
                execute_tool.cwd_for(args, self.ctx.workspace),
                execute_tool.env_for(args, self.ctx.base_env),
                record.started_at_ms or self.ctx.wall_ms(),
            )
        except OSError as exc:
            self._finish(
                record,
                self._plain_result(
                    record, Outcome.FAILED, f"the command did not start: {exc.strerror or exc}"
                ),
            )
            return
        runtime.process = proc
        for sub in runtime.subs.values():
            sub.buffer = proc.output
        runtime.started = StartedEvent(
            self.chat_id, record.call_id, record.started_at_ms or 0, proc.handle.pid
        )
        for sub in runtime.subs.values():
            # Only a streaming follower is sent `started` (the outbox drops it for the others,
            # and one that starts streaming later gets it from _follow): queuing it for the
            # rest would only wake their senders for nothing.
            if sub.active and sub.stream:
                sub.outbox.put(runtime.started, sub)

        def on_output(_proc: processes.ProcessRecord) -> None:
            self._output_arrived(record)

        self._spawn(self._pump, proc, on_output, record)
        wall_ms, on_exit = self.ctx.wall_ms, self.processes.exited
        if runtime.spec.background:
            self._spawn(processes.reap, proc, wall_ms, on_exit)
            self._finish(record, self._execute_result(record, proc, Outcome.COMPLETED))
            return
        # A foreground call reaps its process itself: one task and one wake-up fewer per call
        # than a reaper task that this one waits for.
        with trio.move_on_at(record.deadline if record.deadline is not None else math.inf):
            await processes.reap(proc, wall_ms, on_exit)
        if proc.status is None:
            # The deadline came first; the process runs on, and a reaper of its own records
            # its exit whenever it comes.
            self._spawn(processes.reap, proc, wall_ms, on_exit)
            proc.timed_out = True
            self._finish(record, self._execute_result(record, proc, Outcome.TIMED_OUT))
            return
        processes.drain_available(proc, on_output)
        outcome = Outcome.CANCELED if record.cancel_requested else Outcome.COMPLETED
        self._finish(record, self._execute_result(record, proc, outcome))

    async def _pump(
        self,
        proc: processes.ProcessRecord,
        on_output: Callable[[processes.ProcessRecord], None],
        record: ToolCallRecord,
    ) -> None:
        try:
            await processes.pump(proc, on_output)
        except Exception:
            log.exception("output pump failed", extra=self._log_extra(record))
        self._maybe_close_output(record)

    # -----------------------------------------------------------------------------------------
    # Gates

    def _announce_gate(self, record: ToolCallRecord, only: Subscription | None = None) -> None:
        runtime = self._runtime(record)
        event = ApprovalEvent(
            self.chat_id, record.call_id, runtime.spec.tool, runtime.spec.args, record.turn_id
        )
        if only is not None:
            only.outbox.put(event, only)
        else:
            self._publish(record, event)

    def _resolve_gate(self, record: ToolCallRecord, decision: str) -> None:
        runtime = self._runtime(record)
        if runtime.gate is not None and not runtime.gate.is_set():
            runtime.gate.set()
            runtime.approved = decision == "approved"
            self._publish(record, ApprovalResolvedEvent(self.chat_id, record.call_id, decision))

    async def _expire_gate(self, record: ToolCallRecord, gate: trio.Event) -> None:
        assert self.ctx.approval_timeout_s is not None
        with trio.move_on_after(self.ctx.approval_timeout_s):
            await gate.wait()
            return
        if record.state is RecordState.AWAITING_APPROVAL and not gate.is_set():
            self._resolve_gate(record, "expired")
            self._finish(record, self._plain_result(record, Outcome.NOT_RUN, TEXT_APPROVAL_EXPIRED))

    # -----------------------------------------------------------------------------------------
    # Cancel and interrupt

    def _cancel_one(self, call_id: str) -> tuple[bool, ToolCallRecord]:
        """Apply one cancel now (PROTOCOL.md 5.3). Returns (received, record); the record is
        DONE at once, or becomes DONE when the stopped run ends."""
        action, record = self.records.cancel(call_id, self._now())
        if action is CancelAction.TOMBSTONED:
            record.runtime = CallRuntime(spec=CallSpec(call_id, "", {}))
            proc = self.processes.get(call_id)
            if proc is not None and (proc.running or not proc.output_closed.is_set()):
                # A process outlives its (forgotten) record: the cancel still stops it, also
                # when only a background child of its exited shell is left (it holds the pipe).
                self.records.begin(record)
                record.started_at_ms = proc.started_at_ms
                self._runtime(record).process = proc
                self._spawn(self._kill_then_finish, record, proc)
            else:
                self._finish(
                    record, self._plain_result(record, Outcome.NOT_RUN, TEXT_CANCELED_BEFORE_RUN)
                )
            return False, record
        runtime = self._runtime(record)  # a finished record may have released its runtime
        if action is CancelAction.CLOSED_BEFORE_RUN:
            self._resolve_gate(record, "canceled")
            self._finish(
                record, self._plain_result(record, Outcome.NOT_RUN, TEXT_CANCELED_BEFORE_RUN)
            )
        elif action is CancelAction.STOP_RUNNING:
            proc = runtime.process
            if proc is not None and processes.has_exited(proc):
                # The command had already exited: the call finished first, so its real result
                # stands (only a run that was still going is "canceled").
                record.cancel_requested = False
            elif proc is not None:
                proc.canceled = True
                self._spawn(self._terminate, proc)
            elif runtime.wait_scope is not None:
                runtime.wait_scope.cancel()
            # A file tool in a worker thread cannot be interrupted: the cancel waits for it
            # and reports its real result, which is the truth.
        else:
            proc = runtime.process if runtime.process is not None else self.processes.get(call_id)
            if proc is not None and (proc.running or not proc.output_closed.is_set()):
                proc.canceled = True
                self._spawn(self._terminate, proc)
        return True, record

    async def _terminate(self, proc: processes.ProcessRecord) -> None:
        await processes.terminate(proc, self.ctx.kill_grace_s)

    async def _kill_then_finish(
        self, record: ToolCallRecord, proc: processes.ProcessRecord
    ) -> None:
        proc.canceled = True
        await processes.terminate(proc, self.ctx.kill_grace_s)
        self._finish(record, self._execute_result(record, proc, Outcome.CANCELED))

    async def _reply_cancel(
        self, outbox: Outbox, record: ToolCallRecord, received: bool, rid: Any
    ) -> None:
        try:
            runtime = self._runtime(record)
            await runtime.done.wait()
            proc = runtime.process or self.processes.get(record.call_id)
            if received and proc is not None and proc.canceled:
                # A process the ended call left running is killed "like a running one" (5.3):
                # the reply waits for it, so a client never sees it alive after the
                # cancel_result.
                await proc.exited.wait()
            self._deliver(
                [record],
                lambda results: outbox.put(
                    CancelResultEvent(self.chat_id, record.call_id, received, results[0], rid)
                ),
            )
        finally:
            record.pins -= 1

    async def _reply_interrupted(
        self,
        outbox: Outbox,
        turn_id: str | None,
        targets: list[ToolCallRecord],
        ending: list[ToolCallRecord],
        turns: list[TurnRun],
        rid: Any,
    ) -> None:
        for record in (*targets, *ending):
            await self._runtime(record).done.wait()
        for run in turns:
            await run.done.wait()
        # The calls this interrupt ended; one that finished on its own first kept its real
        # result and was not ended by the interrupt.
        ended = [r.call_id for r in targets if r.outcome in (Outcome.CANCELED, Outcome.NOT_RUN)]
        # Behind any result still being read back for this chat: `interrupted` comes last.
        self._deliver([], lambda _: outbox.put(InterruptedEvent(self.chat_id, turn_id, ended, rid)))

    # -----------------------------------------------------------------------------------------
    # Turns

    async def _run_turn(self, run: TurnRun) -> None:
        try:
            for segment in run.segments:
                async with trio.open_nursery() as nursery:
                    for call_id in segment:
                        nursery.start_soon(self._run_turn_call, call_id)
            # Every segment ran to its end, so every call has its one published result. From
            # here a repeated turn is answered from the records (`_follow_turn`).
            run.finished = True
            followers, run.followers = run.followers, []

            def send(results: list[Result]) -> None:
                for outbox in followers:
                    outbox.put(TurnResultEvent(self.chat_id, run.turn_id, results))
                run.done.set()

            self._deliver(self._turn_records(run), send)  # pins them until sent
        finally:
            # Also when cancelled (the agent is stopping or crashed): this turn pins them no
            # longer.
            for call_id in run.call_ids:
                record = self.records.get(call_id)
                if record is not None:
                    record.pins -= 1

    def _turn_records(self, run: TurnRun) -> list[ToolCallRecord]:
        """The records of a finished turn's calls: pinned while it ran, and a repeat of it
        after one was forgotten is a new turn (see `turn`), so none is missing."""
        records: list[ToolCallRecord] = []
        for call_id in run.call_ids:
            record = self.records.get(call_id)
            assert record is not None, f"turn {run.turn_id} lost its call {call_id}"
            records.append(record)
        return records

    async def _run_turn_call(self, call_id: str) -> None:
        record = self.records.get(call_id)
        assert record is not None
        runtime = self._runtime(record)
        if record.state is RecordState.QUEUED:
            self._start(record, gated=self._gated(runtime.spec))
        await runtime.done.wait()

    # -----------------------------------------------------------------------------------------
    # Results

    def _finish(self, record: ToolCallRecord, result: Result) -> None:
        """Save the one result and publish it. The first finish wins; later ones are no-ops."""
        if not self.records.finish(record, result):
            return
        # The age of a record counts from its end too: a call that ran longer than forget_after_s
        # must not be forgotten (and run again on a retry) the moment it ends.
        self.records.touch(record, self._now())
        seq = self._journal_write(record)
        if self.ctx.journal.is_durable(seq):
            self._publish_result(record)
        else:
            self._spawn(self._publish_when_durable, record, seq)

    async def _publish_when_durable(self, record: ToolCallRecord, seq: int) -> None:
        await self.ctx.journal.wait_durable(seq)
        self._publish_result(record)

    def _publish_result(self, record: ToolCallRecord) -> None:
        """The saved result is durable: answer every request waiting for it."""
        result = record.result
        assert result is not None
        runtime = self._runtime(record)
        record.published = True
        runtime.done.set()
        event = ResultEvent(self.chat_id, record.call_id, result)
        for sub in runtime.subs.values():
            while sub.results_owed > 0:
                sub.results_owed -= 1
                sub.outbox.put_result(sub, event)
        self._maybe_close_output(record)
        self._maybe_release(record)
        if self.ctx.journal.keeps_results:
            # Durable now, so the journal holds it: off the heap, but kept among the recent
            # results for the retry that often follows.
            self._results.put((self.chat_id, record.call_id), self.records.release_result(record))
        if log.isEnabledFor(logging.DEBUG):  # the hot path: no extra dict unless it is shown
            log.debug(
                "call %s ended %s", record.call_id, result.outcome, extra=self._log_extra(record)
            )

    def _saved_result(self, record: ToolCallRecord) -> Result | None:
        """A published record's result if it is on the heap; None if it must be read back."""
        if record.result is not None:
            return record.result
        return self._results.get((self.chat_id, record.call_id))

    def _deliver(self, records: list[ToolCallRecord], send: Callable[[list[Result]], None]) -> None:
        """Call `send` with the saved results of `records` (each published): at once when they
        are on the heap and no earlier delivery of this chat is still waiting, else once read
        back from the journal. Deliveries keep their order, so a turn_result never overtakes a
        call's result, nor `interrupted` a turn_result. The records stay pinned until sent."""
        if self._lane is None:
            results: list[Result] = []
            for record in records:
                result = self._saved_result(record)
                if result is None:
                    break
                results.append(result)
            else:
                send(results)
                return
            self._lane = deque()
            self._spawn(self._run_lane, self._lane)
        for record in records:
            record.pins += 1
        self._lane.append((records, send))

    async def _run_lane(self, lane: deque[_Delivery]) -> None:
        """Send the waiting deliveries in order, reading their results back in batches."""
        try:
            while lane:
                batch = list(lane)
                # What is on the heap now is taken now (the cache may evict it while we wait),
                # the rest comes in one journal read for every delivery waiting (a turn, a
                # burst of retries). A saved result never changes, so either is the same.
                held: dict[str, Result] = {}
                wanted: dict[str, ToolCallRecord] = {}
                for records, _ in batch:
                    for record in records:
                        result = self._saved_result(record)
                        if result is None:
                            wanted[record.call_id] = record
                        else:
                            held[record.call_id] = result
                held.update(await self._read_results(list(wanted.values())))
                for records, send in batch:
                    lane.popleft()
                    for record in records:
                        record.pins -= 1
                    send([held[record.call_id] for record in records])
        finally:
            self._lane = None

    async def _read_results(self, records: list[ToolCallRecord]) -> dict[str, Result]:
        """Read released results back from the journal (and keep them among the recent)."""
        if not records:
            return {}
        keys = [(self.chat_id, record.call_id) for record in records]
        found = await self.ctx.journal.read_results(keys)
        loaded: dict[str, Result] = {}
        for key, result in zip(keys, found, strict=True):
            if result is None:
                # A pinned record is never forgotten, so its row cannot be gone: the journal
                # lost a durable result. Stop rather than answer anything else.
                raise JournalError(f"the journal has no saved result for {key[0]!r}/{key[1]!r}")
            self._results.put(key, result)
            loaded[key[1]] = result
        return loaded

    def _plain_result(self, record: ToolCallRecord, outcome: Outcome, text: str) -> Result:
        runtime = record.runtime
        tool = runtime.spec.tool if isinstance(runtime, CallRuntime) else (record.tool or "")
        return call_results.plain_result(record, tool, outcome, text, self.ctx.wall_ms())

    def _report_result(self, record: ToolCallRecord, report: ToolReport) -> Result:
        return call_results.report_result(record, report, self.ctx.wall_ms())

    def _execute_result(
        self, record: ToolCallRecord, proc: processes.ProcessRecord, outcome: Outcome
    ) -> Result:
        return call_results.execute_result(
            record,
            outcome=outcome,
            process_id=proc.process_id,
            output=proc.output,
            status=proc.status,
            timeout_ms=self._runtime(record).spec.timeout_ms,
            timed_out=proc.timed_out,
            canceled=proc.canceled,
            finished_ms=self.ctx.wall_ms(),
        )

    # -----------------------------------------------------------------------------------------
    # Housekeeping

    def _runtime(self, record: ToolCallRecord) -> CallRuntime:
        runtime = record.runtime
        if runtime is None:
            # A finished record released its runtime (see `_maybe_release`); a new follower
            # gets a fresh one, already done.
            runtime = CallRuntime(spec=CallSpec(record.call_id, record.tool or "", {}))
            if record.published:
                runtime.done.set()
            if record.tool == "execute":
                # Its output (head and tail) stays readable while the process is listed.
                runtime.process = self.processes.get(record.call_id)
            record.runtime = runtime
        assert isinstance(runtime, CallRuntime)
        return runtime

    def _maybe_release(self, record: ToolCallRecord) -> None:
        """A finished record keeps only what a replay needs (its result): the runtime with its
        events, subscriptions and parsed args goes, so idle records stay small (scale: 10,000
        chats of records). Not while a process's output still waits for lagging followers."""
        runtime = record.runtime
        if runtime is None or not record.published:
            return
        if runtime.process is not None and not runtime.process.output.closed:
            return
        record.runtime = None

    def _conflict(self, record: ToolCallRecord) -> ToolwireError:
        return ToolwireError(
            "conflict",
            f"call_id {record.call_id!r} was first used with tool {record.tool!r} and other "
            "args; a retry must repeat the same tool and args, a new call needs a new id",
        )

    def _check_options(self, tool: ToolDef, spec: CallSpec) -> None:
        if spec.background and spec.timeout_ms:
            raise ToolwireError(
                "bad_args", "background and a non-zero timeout_ms cannot be combined"
            )
        if spec.background and tool.kind is not ToolKind.EXECUTE:
            raise ToolwireError("bad_args", f"background applies to execute only, not {tool.name}")
        if tool.kind is ToolKind.EXECUTE and self._at_process_limit():
            raise ToolwireError(
                "over_limit",
                f"chat {self.chat_id!r} already runs "
                f"{self.ctx.limits.max_processes_per_chat} processes (max_processes_per_chat)",
            )

    def _at_process_limit(self) -> bool:
        running = self.processes.running_count() + len(self._launching)
        return running >= self.ctx.limits.max_processes_per_chat

    def _forget_some(self) -> None:
        """Forgetting is checked on insert too (like the anchor's agent), in O(forgotten)."""
        for record in self.records.forget_expired(self._now(), self.ctx.limits.forget_after_s):
            self._forgotten(record)

    def _forgotten(self, record: ToolCallRecord) -> None:
        if self.ctx.journal.enabled:
            self.ctx.journal.delete(self.chat_id, record.call_id)
        # A new call with this id is a new record: it must never be answered with this result.
        self._results.discard((self.chat_id, record.call_id))
        runtime = record.runtime
        if isinstance(runtime, CallRuntime):
            for sub in runtime.subs.values():
                sub.active = False
        if record.turn_id is not None:
            run = self.turns.get(record.turn_id)
            if run is not None and run.done.is_set():
                del self.turns[record.turn_id]

    def sweep(self) -> None:
        """Periodic housekeeping: forget old records and exited processes (5.2, 5.4). The agent
        then drops an idle chat; a later request creates a fresh one."""
        self._forget_some()
        self.processes.sweep(self._now())

    def running_processes(self) -> list[processes.ProcessRecord]:
        return self.processes.running()

    def _log_extra(self, record: ToolCallRecord) -> dict[str, Any]:
        return {"chat_id": self.chat_id, "call_id": record.call_id}

    # -----------------------------------------------------------------------------------------
    # Journal

    def _journal_write(self, record: ToolCallRecord) -> int:
        journal = self.ctx.journal
        if not journal.enabled or record.state is RecordState.QUEUED:
            return 0  # queued turn calls have done nothing yet: nothing to remember
        spec = self._runtime(record).spec
        return journal.write(
            JournalRow(
                chat_id=self.chat_id,
                call_id=record.call_id,
                state=record.state.value,
                tool=record.tool,
                fingerprint=record.fingerprint,
                args=spec.args,
                timeout_ms=spec.timeout_ms,
                background=spec.background,
                approval=spec.approval,
                turn_id=record.turn_id,
                result=record.result,
                started_at_ms=record.started_at_ms,
                touched_at_ms=self.ctx.wall_ms(),
            )
        )

    def _journal_touch(self, record: ToolCallRecord) -> None:
        if self.ctx.journal.enabled and record.state is not RecordState.QUEUED:
            self.ctx.journal.touch(self.chat_id, record.call_id, self.ctx.wall_ms())

    def restore(self, row: JournalRow, touched_at: float) -> None:
        """Rebuild one record from the journal after a restart (PROTOCOL.md promise 1):
        a saved result is served again as it was; a call that was running when the agent died
        ends `unknown` and never runs again; a parked gate is parked again."""
        spec = CallSpec(
            row.call_id, row.tool or "", row.args, row.timeout_ms, row.background, row.approval
        )
        runtime = CallRuntime(spec=spec)
        record = ToolCallRecord(
            call_id=row.call_id,
            tool=None if row.tool is None else shared_tool_name(row.tool),
            fingerprint=row.fingerprint,
            state=RecordState(row.state),
            touched_at=touched_at,
            effect_started=row.started_at_ms is not None or row.state == "running",
            started_at_ms=row.started_at_ms,
            result=row.result,
            outcome=row.result.outcome if row.result is not None else None,
            turn_id=row.turn_id,
        )
        self.records.restore(record)
        if record.state is RecordState.DONE:
            if record.result is None:
                raise ValueError(
                    f"journal row {row.chat_id!r}/{row.call_id!r} is done without a result"
                )
            # Durable and published as it was before the restart: it needs no runtime (a
            # follower gets a fresh one, already done) and, when the journal keeps results,
            # not its result on the heap either.
            record.published = True
            if self.ctx.journal.keeps_results:
                self.records.release_result(record)
            return
        record.runtime = runtime
        if record.state is RecordState.RUNNING:
            self._finish(record, self._plain_result(record, Outcome.UNKNOWN, TEXT_AGENT_RESTARTED))
        elif record.state is RecordState.AWAITING_APPROVAL:
            try:
                tool = lookup(spec.tool)
                runtime.parsed = parse_args(tool, spec.args)
            except ToolwireError as exc:
                runtime.invalid = exc.message
            runtime.gate = trio.Event()
            if self.ctx.approval_timeout_s is not None:
                self._spawn(self._expire_gate, record, runtime.gate)
