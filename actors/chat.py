"""ChatActor: one trio nursery per chat that owns its tool-call records, processes and gates.

Every request is applied to the record table synchronously (no `await` between reading and
writing a record), so trio's cooperative scheduling makes each transition atomic without locks.
Work that takes time (a process, a thread-run search, a parked gate, a turn) runs as a task in
this chat's nursery and reports back through the same synchronous methods.

Failure containment: an exception inside one call, while admitting, journaling or running it,
ends that call with a result (`not_run` with the agent-failure text of PROTOCOL.md 9.10 when its
effect cannot have started, else `unknown`); it never takes down the chat, another chat or the
connection, and a request that got `accepted` never gets an `error` too (`_fail`).

This module is the coordinator: requests, following, launching and publishing results. Tool
runs, execute runs, turns, gates, cancels, the result lane and the journal hooks live in modules
of their own (see docs/architecture.md). `_cancel_one` and `_run_turn` stay methods here because
the simulation plants known bugs in subclasses that override them (simulation/planted.py).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import msgspec
import trio

from toolwire.actors import (
    call_results,
    cancellation,
    chat_journal,
    gates,
    observe,
    planner,
    processes,
    tool_runs,
)
from toolwire.actors.calls import CallRuntime, CallSpec, conflict_error, shared_tool_name
from toolwire.actors.events import (
    AcceptedEvent,
    Event,
    ResultEvent,
    TurnPlanEvent,
    TurnResultEvent,
)
from toolwire.actors.journal import JournalRow
from toolwire.actors.outbox import Outbox, Subscription
from toolwire.actors.records import (
    Admission,
    RecordState,
    RecordTable,
    ToolCallRecord,
    args_fingerprint,
)
from toolwire.actors.result_cache import ResultCache
from toolwire.actors.result_lane import ResultLane, saved_result
from toolwire.actors.results import (
    TEXT_AGENT_FAILURE,
    TEXT_AGENT_FAILURE_BEFORE_RUN,
    TEXT_CANCELED_BEFORE_RUN,
    Outcome,
    Result,
    ToolReport,
    ToolwireError,
)
from toolwire.actors.tools.registry import TOOLS, ToolDef, ToolKind, lookup, parse_args
from toolwire.actors.turns import TurnRun, check_new_turn, run_turn, turn_fingerprint, turn_records

if TYPE_CHECKING:
    from toolwire.actors.agent import AgentContext

log = logging.getLogger("toolwire.chat")

# Kept importable from here: transport, simulation, benchmarks and tests name them so.
__all__ = ["CallRuntime", "CallSpec", "ChatActor", "TurnRun", "shared_tool_name"]


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
        # None while nothing waits (the common case, and no lane per idle chat).
        self._lane: ResultLane | None = None
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
        # Tools approved for the whole chat (`approve` with scope "chat", PROTOCOL.md 9.5): their
        # calls pass every gate for as long as the chat has records. A tuple: the empty one is
        # shared, so the ten thousand chats that never approve so pay nothing for it.
        self.approved_tools: tuple[str, ...] = ()

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
            raise conflict_error(record)
        if admission is Admission.NEW:
            runtime = CallRuntime(spec=spec, parsed=parsed)
            record.runtime = runtime
            sub = self._subscribe(outbox, record, stream=stream)
            gated = self._gated(spec)
            state = "awaiting_approval" if gated else "running"
            outbox.put(
                AcceptedEvent(self.chat_id, spec.call_id, False, state, record.requests, rid), sub
            )
            sub.results_owed += 1
            # From here on the request has its reply: nothing may raise out of it any more.
            try:
                self._forget_some()
            except Exception:
                log.exception("forgetting old records failed", extra=self._log_extra(record))
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
        sub = runtime.subs.get(outbox)
        if sub is None:
            return
        if sub.results_owed or sub.results_queued:
            # Its events stop now, but each request already made still gets its `accepted`
            # (queued) and its one `result` (PROTOCOL.md 9.9): the subscription stays for them.
            sub.detached = True
        else:
            del runtime.subs[outbox]
            sub.active = False
        self._maybe_close_output(record)

    def approve(
        self,
        outbox: Outbox,
        call_id: str,
        approved: bool,
        rid: Any,
        reason: str | None = None,
        scope: str = "call",
    ) -> None:
        record = self.records.get(call_id)
        if record is None:
            raise ToolwireError("unknown_call", f"no call {call_id!r} in chat {self.chat_id!r}")
        if record.state is not RecordState.AWAITING_APPROVAL:
            raise ToolwireError(
                "not_parked",
                f"call {call_id!r} is not waiting for approval (it is {record.state.wire_state})",
            )
        if approved and scope == "chat":
            # Queued before any gate it opens starts its effect: every effect waits for its own
            # later "started" row, so none runs on an approval a crash could lose.
            tool = self._runtime(record).spec.tool
            self._approve_tool(tool)
            gates.answer(self, record, True, None, approver=outbox)
            gates.open_approved(self, tool)
            return
        gates.answer(self, record, approved, reason, approver=outbox)

    def _approve_tool(self, tool: str) -> None:
        if tool in self.approved_tools:
            return
        self.approved_tools += (tool,)
        if self.ctx.journal.enabled:
            self.ctx.journal.approve_tool(self.chat_id, tool)

    def restore_approval(self, tool: str) -> None:
        """A tool this chat approved with scope "chat" before a restart: approved again, and a
        gate of it that was parked when the agent died (its opening not yet durable) opens."""
        if tool not in self.approved_tools:
            self.approved_tools += (tool,)
        gates.open_approved(self, tool)

    def cancel(self, outbox: Outbox, call_ids: list[str], rid: Any) -> None:
        for call_id in call_ids:
            received, record = self._cancel_one(call_id)
            record.pin()  # its result is owed: not forgotten before the reply
            self._spawn(cancellation.reply_cancel, self, outbox, record, received, rid)

    def turn(
        self, outbox: Outbox, turn_id: str, specs: list[CallSpec], *, stream: bool, rid: Any
    ) -> None:
        """A `turn` request (PROTOCOL.md 5.6): validate everything first, then admit."""
        fingerprint = turn_fingerprint(specs)
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
        fingerprints = check_new_turn(self.records, specs)
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
            record.pin()  # until the turn has its turn_result (`_run_turn`)
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
        self._spawn(
            cancellation.reply_interrupted, self, outbox, turn_id, targets, ending, turns, rid
        )

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
        sub.detached = False  # a new request on this connection follows the call again
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
        before = runtime.subs.get(outbox)
        # Already streaming output to this connection for an earlier request: that request's
        # output must not be skipped, so the cursor only ever moves back (PROTOCOL.md 9.9).
        was_following = before is not None and before.following
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
            gates.announce(self, record, only=sub)
        if runtime.done.is_set():
            # Published means durable: a result is never sent before the journal holds it.
            # A repeated `call` of an ended call gets its result only; an `attach` replays the
            # retained output from its offset first. Either comes after this `accepted` and
            # leaves the live cursor alone: a result still queued for an earlier request on
            # this connection keeps the output it owes (PROTOCOL.md 9.9).
            if not was_following:
                # No live output for this connection: a process that outlived its call (a
                # timeout) goes on printing, but no output follows a result.
                sub.finished = True
            # Counted as queued while it is read back from the journal.
            sub.results_queued += 1
            if from_offset is not None:
                sub.replays_pending += 1

            def send(results: list[Result]) -> None:
                sub.results_queued -= 1
                event = ResultEvent(self.chat_id, record.call_id, results[0])
                outbox.put_replay(sub, event, from_offset)

            self._deliver([record], send)
            return
        wanted = from_offset or 0
        sub.cursor = min(sub.cursor, wanted) if was_following else wanted
        sub.finished = False
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
                    gates.announce(self, record, only=sub)
        if run.finished:
            # After each call's result above: deliveries keep their order.
            self._deliver(
                turn_records(self.records, run),
                lambda results: outbox.put(TurnResultEvent(self.chat_id, run.turn_id, results)),
            )

    def _publish(self, record: ToolCallRecord, event: Event) -> None:
        for sub in self._runtime(record).subs.values():
            if sub.active and not sub.detached:
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
        if spec.tool in self.approved_tools:
            return False  # approved for the whole chat (9.5): no gate, no `approval` event
        return spec.approval or spec.tool in self.ctx.approve_tools

    def _start(self, record: ToolCallRecord, *, gated: bool) -> None:
        """A queued record's turn has come: park it at its gate or run it. Never raises: a
        failure ends the call (`_fail`)."""
        if record.state is not RecordState.QUEUED:
            return
        try:
            if gated:
                self.records.park(record)
                runtime = self._runtime(record)
                self._journal_write(record)
                runtime.gate = trio.Event()
                gates.announce(self, record)
                if self.ctx.approval_timeout_s is not None:
                    self._spawn(gates.expire, self, record, runtime.gate)
                return
            self._launch(record)
        except Exception:
            self._fail(record)

    def _fail(self, record: ToolCallRecord) -> None:
        """An exception inside the agent while admitting, journaling or running this call
        (call from an `except` block): end the call truthfully, so that no request, repeat,
        attach, cancel or interrupt waits on it forever (PROTOCOL.md 9.9)."""
        log.exception(
            "tool call %s failed inside the agent", record.call_id, extra=self._log_extra(record)
        )
        gates.resolve(self, record, "canceled")  # a gate already announced is closed
        self._finish(record, self._failure_result(record))

    def _failure_result(self, record: ToolCallRecord) -> Result:
        runtime = self._runtime(record)
        if record.effect_started and not runtime.start_pending:
            return self._plain_result(record, Outcome.UNKNOWN, TEXT_AGENT_FAILURE)
        return self._plain_result(record, Outcome.NOT_RUN, TEXT_AGENT_FAILURE_BEFORE_RUN)

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
                runtime.start_pending = False
                tool_runs.finish_guarded(
                    self, record, lambda: tool_runs.run_inline(self, tool, runtime)
                )
            else:
                # Run by the commit that makes the start durable, with every other call that
                # commit covers: no task per call.
                self.ctx.journal.when_durable(
                    seq, lambda: tool_runs.run_inline_once_started(self, record, tool, runtime)
                )
            return
        if tool.kind is ToolKind.EXECUTE:
            self._launching[record.call_id] = None
        self._spawn(tool_runs.run_task, self, record, tool)

    def _begin(self, record: ToolCallRecord) -> int:
        """Mark the effect started and journal it; returns the journal sequence number that
        must be durable before the effect may actually happen (see `_durable_start`). A
        read-only tool has no effect to protect: nothing is journaled (0, durable already);
        a crash before its result is durable leaves no trace, and a repeat runs it anew."""
        self.records.begin(record)
        record.started_at_ms = self.ctx.wall_ms()
        runtime = self._runtime(record)
        runtime.start_pending = True
        if runtime.spec.timeout_ms:
            # The deadline is fixed at the FIRST start; no retry ever moves it (5.2).
            record.deadline = self._now() + runtime.spec.timeout_ms / 1000
        if TOOLS[runtime.spec.tool].read_only:
            return 0
        return self._journal_write(record)

    async def _durable_start(self, record: ToolCallRecord, seq: int) -> bool:
        """Wait until the journal holds "started" before the effect happens, so a crash can
        never forget a call that ran (it comes back `unknown`, never runs twice). A cancel that
        arrived meanwhile wins: nothing happened, so the call ends not_run. False if so."""
        if not self.ctx.journal.is_durable(seq):
            await self.ctx.journal.wait_durable(seq)
        return self._may_start(record)

    def _may_start(self, record: ToolCallRecord) -> bool:
        """The start is durable: False (and the call ends not_run) if a cancel came first."""
        if record.cancel_requested:
            self._finish(
                record, self._plain_result(record, Outcome.NOT_RUN, TEXT_CANCELED_BEFORE_RUN)
            )
            return False
        self._runtime(record).start_pending = False  # the effect may happen from here on
        return True

    # -----------------------------------------------------------------------------------------
    # Cancel (actors/cancellation.py)

    def _cancel_one(self, call_id: str) -> tuple[bool, ToolCallRecord]:
        """Apply one cancel now; a method so that a test-only subclass can plant a bug here."""
        return cancellation.cancel_one(self, call_id)

    # -----------------------------------------------------------------------------------------
    # Turns (actors/turns.py)

    async def _run_turn(self, run: TurnRun) -> None:
        """A method so that a test-only subclass can plant a bug here."""
        await run_turn(self, run)

    # -----------------------------------------------------------------------------------------
    # Results

    def _finish(self, record: ToolCallRecord, result: Result) -> None:
        """Save the one result and publish it. The first finish wins; later ones are no-ops."""
        if not self.records.finish(record, result):
            return
        # The age of a record counts from its end too: a call that ran longer than forget_after_s
        # must not be forgotten (and run again on a retry) the moment it ends.
        self.records.touch(record, self._now())
        try:
            seq = self._journal_write(record)
        except Exception:
            seq = self._result_not_journaled(record)
        if self.ctx.journal.is_durable(seq):
            self._publish_result(record)
        else:
            # Published by the commit that makes it durable, with every other result that
            # commit covers: no task per call.
            self.ctx.journal.when_durable(seq, lambda: self._publish_result(record))

    def _result_not_journaled(self, record: ToolCallRecord) -> int:
        """The journal refused the row of a finished record (call from an `except` block).
        The call ends as an agent failure (PROTOCOL.md 9.9), saved if the journal takes that
        row; if not, it is answered from memory (a restart then finds the row before it, or
        none: nothing ran, or `unknown`). Returns the sequence number to wait for."""
        log.exception(
            "journaling the result of %s failed", record.call_id, extra=self._log_extra(record)
        )
        self.records.amend(record, self._failure_result(record))
        try:
            return self._journal_write(record)
        except Exception:
            log.exception(
                "journaling the agent failure of %s failed too",
                record.call_id,
                extra=self._log_extra(record),
            )
        self._runtime(record).unsaved = True
        return 0  # durable in every journal: nothing more will be

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
        if self.ctx.journal.keeps_results and not runtime.unsaved:
            # Durable now, so the journal holds it: off the heap, but kept among the recent
            # results for the retry that often follows.
            self._results.put((self.chat_id, record.call_id), self.records.release_result(record))
        observe.call_ended(self.ctx, self.chat_id, record.call_id, result)

    def _deliver(self, records: list[ToolCallRecord], send: Callable[[list[Result]], None]) -> None:
        """Call `send` with the saved results of `records` (each published): at once when they
        are on the heap and no earlier delivery of this chat is still waiting, else once read
        back from the journal. Deliveries keep their order, so a turn_result never overtakes a
        call's result, nor `interrupted` a turn_result. The records stay pinned until sent."""
        if self._lane is None:
            results: list[Result] = []
            for record in records:
                result = saved_result(self._results, self.chat_id, record)
                if result is None:
                    break
                results.append(result)
            else:
                send(results)
                return
            self._lane = ResultLane(self.chat_id, self.ctx, self._results)
            self._spawn(self._run_lane, self._lane)
        for record in records:
            record.pin()
        self._lane.deliveries.append((records, send))

    async def _run_lane(self, lane: ResultLane) -> None:
        try:
            await lane.run()
        finally:
            self._lane = None

    def _plain_result(self, record: ToolCallRecord, outcome: Outcome, text: str) -> Result:
        runtime = record.runtime
        tool = runtime.spec.tool if isinstance(runtime, CallRuntime) else (record.tool or "")
        return call_results.plain_result(record, tool, outcome, text, self.ctx.wall_ms())

    def _report_result(self, record: ToolCallRecord, report: ToolReport) -> Result:
        return call_results.report_result(record, report, self.ctx.wall_ms())

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
        if self.approved_tools and not self.records:
            # "For as long as the chat has records" (9.5): the approval goes with the last one.
            self.approved_tools = ()
            if self.ctx.journal.enabled:
                self.ctx.journal.forget_approvals(self.chat_id)

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
            chat_journal.journal_row(self.chat_id, record, spec, self.ctx.wall_ms())
        )

    def _journal_touch(self, record: ToolCallRecord) -> None:
        if self.ctx.journal.enabled and record.state is not RecordState.QUEUED:
            self.ctx.journal.touch(self.chat_id, record.call_id, self.ctx.wall_ms())

    def restore(self, row: JournalRow, touched_at: float) -> None:
        """Rebuild one record from the journal after a restart (see `chat_journal.restore`)."""
        chat_journal.restore(self, row, touched_at)
