"""One executor for model tool calls, on either client shell: the glue no chat server should
write again (issue 30).

    executor = ToolExecutor(client)                       # client: toolwire or toolwire.aio
    call = ModelToolCall(chat_id, message_id, provider_call_id, "execute", {"command": "ls"})
    result = await executor.execute(call, on_output=show, from_offset=saved_offset)
    text_for_the_model = render_result(result)

    async with executor.run_batch(calls_of_one_response) as batch:   # one `turn`
        async for item in batch:                          # each as it ends
            ...
    items = await batch.results()                         # all, in request order

What it does so that every chat server does it right:
- the stable call id (`ModelToolCall.call_id`), so a retry after any crash is the same call;
- `bad_args`, `unknown_tool` and `conflict` raise BadArgs, UnknownTool and CallConflict,
  which a framework turns into a retry by the model (nothing ran);
- output goes to `on_output` as it streams, each byte once, with its offset; pass the last
  chunk's `end` as `from_offset` after a restart and nothing is shown twice (PROTOCOL.md 10.2);
- an approval gate goes to `on_approval`, run as a task of its own beside the call's events:
  when the gate closes by other means (an interrupt, another replica, an expiry) the callback
  is cancelled at once instead of holding the call; a `not_parked` answer is not an error;
- what a cancellation of the awaiting task means is chosen once, `on_cancel`: "cancel" stops
  the call on the agent (the user interrupted), "detach" leaves it running for the retry (the
  server shuts down); either is sent also when the cancellation lands before `accepted`,
  shielded and bounded by `cancel_timeout_s`, and the cancellation then goes on as it came.
"""

from __future__ import annotations

import functools
import inspect
import logging
import uuid
from collections.abc import AsyncIterator, Callable, Collection, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import msgspec

from toolwire.transport import protocol
from toolwire.transport.client.api import ClientAPI
from toolwire.transport.client.arg_check import schema_error
from toolwire.transport.client.errors import (
    BadArgs,
    RequestError,
    ToolwireClientError,
    UnknownTool,
)
from toolwire.transport.client.handles import CallHandle, Mailbox, TurnHandle
from toolwire.transport.client.runtime import Helpers
from toolwire.transport.client.tool_calls import (
    ApprovalCallback,
    ApprovalDecision,
    ModelToolCall,
    OnCancel,
    OutputCallback,
    OutputChunk,
)
from toolwire.transport.ids import TOOL_CALL_NAMESPACE

__all__ = ["Batch", "BatchItem", "ToolExecutor", "batch_turn_id"]

log = logging.getLogger("toolwire.executor")

NeedsApproval = bool | Collection[str] | Callable[[ModelToolCall], bool]


def batch_turn_id(call_ids: Sequence[str]) -> str:
    """The turn id of a batch: derived from its calls' ids, so a resumed batch of the same
    calls names the same turn (a repeated turn attaches to it, PROTOCOL.md 5.6)."""
    return str(uuid.uuid5(TOOL_CALL_NAMESPACE, "turn\n" + "\n".join(call_ids)))


@dataclass(frozen=True, slots=True)
class BatchItem:
    """One call of a batch when it ended: its Result, or the error that stopped it before it
    ran (BadArgs, UnknownTool, CallConflict, or another RequestError of the whole turn) or while
    it was followed (ConnectionLost)."""

    index: int  # in the batch's request order
    call: ModelToolCall
    result: protocol.Result | None
    error: ToolwireClientError | None = None

    def unwrap(self) -> protocol.Result:
        """The Result, or raise the error."""
        if self.result is None:
            assert self.error is not None
            raise self.error
        return self.result


class Batch:
    """The calls of one model response as one `turn` (see `ToolExecutor.run_batch`).
    `async for item in batch` yields each BatchItem as its call ends (consume it from one
    task); `await batch.results()` gives them all in request order."""

    def __init__(self, calls: Sequence[ModelToolCall], client: ClientAPI) -> None:
        self.calls = list(calls)
        self.turn_id: str | None = None  # None when no call of it was sent
        self.sent: list[ModelToolCall] = []  # the calls handed to the turn (in request order)
        self.turn: TurnHandle | None = None  # its plan and handles, once the agent took it
        self._items: dict[int, BatchItem] = {}
        self._arrivals: Mailbox[BatchItem] = Mailbox(client.runtime.flag)
        self._all = client.runtime.flag()
        if not self.calls:
            self._all.set()
            self._arrivals.close()

    def __aiter__(self) -> AsyncIterator[BatchItem]:
        return self._arrivals

    @property
    def done(self) -> bool:
        return self._all.is_set()

    async def results(self) -> list[BatchItem]:
        """Every call's item, in request order, once all have ended."""
        await self._all.wait()
        return [self._items[index] for index in range(len(self.calls))]

    def settle(self, item: BatchItem) -> None:
        """One call ended (the executor's side; each call settles once)."""
        if item.index in self._items:
            return
        self._items[item.index] = item
        self._arrivals.put(item)
        if len(self._items) == len(self.calls):
            self._arrivals.close()
            self._all.set()


class ToolExecutor:
    """Runs model tool calls through one client (trio's `toolwire.connect` or
    `toolwire.aio.connect`) and returns each one's one truthful Result (module docstring).

    Defaults for every call: `on_output`, `on_approval`, `approval` (True, a collection of
    tool names, or a predicate of the call: which calls wait for an approval gate),
    `timeout_ms` and `sandbox` for each call; `on_cancel` and `cancel_timeout_s` as above."""

    def __init__(
        self,
        client: ClientAPI,
        *,
        on_cancel: OnCancel = "cancel",
        cancel_timeout_s: float = 30.0,
        on_output: OutputCallback | None = None,
        on_approval: ApprovalCallback | None = None,
        approval: NeedsApproval = False,
        timeout_ms: int | None = None,
        sandbox: protocol.Sandbox | dict[str, Any] | None = None,
    ) -> None:
        if on_cancel not in ("cancel", "detach"):
            raise ValueError(f"on_cancel must be 'cancel' or 'detach', not {on_cancel!r}")
        self.client = client
        self.on_cancel: OnCancel = on_cancel
        self.cancel_timeout_s = cancel_timeout_s
        self.on_output = on_output
        self.on_approval = on_approval
        self.approval = approval
        self.timeout_ms = timeout_ms
        self.sandbox = sandbox
        self._schemas: dict[str, dict[str, Any]] | None = None

    # -- one call ------------------------------------------------------------------------------

    async def execute(
        self,
        call: ModelToolCall,
        *,
        from_offset: int = 0,
        on_output: OutputCallback | None = None,
        on_approval: ApprovalCallback | None = None,
    ) -> protocol.Result:
        """Run one model tool call at most once and return its Result (a repeat after a crash
        returns the saved one). Raises BadArgs, UnknownTool, CallConflict (nothing ran), another
        RequestError (e.g. `chat_closed`), or ConnectionLost; a cancellation of the awaiting
        task is handled by `on_cancel` and then re-raised."""
        args = call.arguments()
        client = self.client
        try:
            handle = await client.call(
                call.chat_id,
                call.call_id,
                call.tool,
                args,
                timeout_ms=self.timeout_ms,
                approval=self.needs_approval(call),
                sandbox=self.sandbox,
                from_offset=from_offset,
            )
            on_output = on_output or self.on_output
            if handle.accepted.state == "done" and on_output is not None:
                handle = await self._replay(call, handle, from_offset)
            return await self._follow(call, handle, on_output, on_approval or self.on_approval)
        except BaseException as exc:
            if client.runtime.is_cancellation(exc):
                await self._after_cancellation([call])
            raise

    # -- one model response: one turn ----------------------------------------------------------

    @asynccontextmanager
    async def run_batch(
        self,
        calls: Sequence[ModelToolCall],
        *,
        from_offsets: Mapping[str, int] | None = None,
        on_output: OutputCallback | None = None,
        on_approval: ApprovalCallback | None = None,
    ) -> AsyncIterator[Batch]:
        """Send all the calls of one model response as one `turn`, so the agent's planner
        orders their reads and writes (PROTOCOL.md 5.6), and follow each as `execute` does.

        A call that cannot run is settled at once with its error and not sent: args that are
        not an object or do not fit the tool's input schema (BadArgs: a call inside a turn would
        only get a `failed` result, which a model cannot tell from a failing tool) or a tool
        the agent does not have (UnknownTool). `from_offsets` maps call ids to the output
        already shown (see `execute`). The block waits, before it ends, until every call has
        its item; a cancellation meanwhile is handled by `on_cancel` for all of them."""
        chat_ids = {call.chat_id for call in calls}
        if len(chat_ids) > 1:
            raise ValueError(f"a batch is one chat's, not {sorted(chat_ids)}")
        ids = [call.call_id for call in calls]
        if len(set(ids)) != len(ids):
            raise ValueError("a batch names one call twice (the same provider call id)")
        batch = Batch(calls, self.client)
        runtime = self.client.runtime
        try:
            specs = await self._specs(batch)
            async with runtime.helpers() as helpers:
                if specs:
                    await self._send_turn(
                        batch, specs, helpers, from_offsets or {}, on_output, on_approval
                    )
                yield batch
                await batch.results()
        except BaseException as exc:
            if runtime.is_cancellation(exc):
                await self._after_cancellation(batch.sent)
            raise

    async def execute_batch(
        self,
        calls: Sequence[ModelToolCall],
        *,
        from_offsets: Mapping[str, int] | None = None,
        on_output: OutputCallback | None = None,
        on_approval: ApprovalCallback | None = None,
    ) -> list[BatchItem]:
        """`run_batch`, awaited to its end: every call's item in request order."""
        async with self.run_batch(
            calls, from_offsets=from_offsets, on_output=on_output, on_approval=on_approval
        ) as batch:
            return await batch.results()

    # -- plumbing ------------------------------------------------------------------------------

    def needs_approval(self, call: ModelToolCall) -> bool:
        """Whether `call` waits at an approval gate (the `approval` given to the executor): an
        integration that answers gates its own way (deferred tool requests) asks this."""
        approval = self.approval
        if isinstance(approval, bool):
            return approval
        if callable(approval):
            return bool(approval(call))
        return call.tool in approval

    async def _tool_schemas(self) -> dict[str, dict[str, Any]]:
        """The agent's input schemas, asked once (none from an agent without describe_tools:
        then the agent alone checks args)."""
        if self._schemas is None:
            if "describe_tools" in self.client.welcome.features:
                tools = await self.client.describe_tools()
                self._schemas = {tool.name: tool.input_schema for tool in tools}
            else:
                self._schemas = {}
        return self._schemas

    async def _specs(self, batch: Batch) -> list[tuple[int, protocol.CallSpec]]:
        """The calls to send, by index; the others are settled with their error now."""
        schemas = await self._tool_schemas()
        tools = set(self.client.welcome.tools)
        specs: list[tuple[int, protocol.CallSpec]] = []
        for index, call in enumerate(batch.calls):
            try:
                args = call.arguments()
                if call.tool not in tools:
                    raise UnknownTool(
                        "unknown_tool",
                        f"unknown tool {call.tool!r}; this agent has: {', '.join(sorted(tools))}",
                    )
                schema = schemas.get(call.tool)
                reason = None if schema is None else schema_error(schema, args)
                if reason is not None:
                    raise BadArgs("bad_args", f"{call.tool}: {reason}")
            except RequestError as exc:
                batch.settle(BatchItem(index, call, None, exc))
                continue
            sandbox = self.sandbox
            specs.append(
                (
                    index,
                    protocol.CallSpec(
                        call_id=call.call_id,
                        tool=call.tool,
                        args=args,
                        timeout_ms=self.timeout_ms,
                        approval=self.needs_approval(call),
                        sandbox=None if sandbox is None else _sandbox(sandbox),
                    ),
                )
            )
        return specs

    async def _send_turn(
        self,
        batch: Batch,
        specs: list[tuple[int, protocol.CallSpec]],
        helpers: Helpers,
        from_offsets: Mapping[str, int],
        on_output: OutputCallback | None,
        on_approval: ApprovalCallback | None,
    ) -> None:
        call_ids = [spec.call_id for _, spec in specs]
        batch.turn_id = batch_turn_id(call_ids)
        # Before the turn goes out: a cancellation from here on must reach these calls.
        batch.sent = [batch.calls[index] for index, _ in specs]
        chat_id = batch.calls[0].chat_id
        try:
            turn = await self.client.turn(
                chat_id, batch.turn_id, [spec for _, spec in specs], from_offsets=from_offsets
            )
        except RequestError as exc:
            # A refusal of the whole turn (a `conflict` of one call refuses all: nothing ran).
            for index, _ in specs:
                batch.settle(BatchItem(index, batch.calls[index], None, exc))
            return
        batch.turn = turn
        for index, spec in specs:
            handle = turn.calls[spec.call_id]
            helpers.start(
                functools.partial(
                    self._follow_into,
                    batch,
                    index,
                    handle,
                    on_output or self.on_output,
                    on_approval or self.on_approval,
                )
            )

    async def _follow_into(
        self,
        batch: Batch,
        index: int,
        handle: CallHandle,
        on_output: OutputCallback | None,
        on_approval: ApprovalCallback | None,
    ) -> None:
        call = batch.calls[index]
        try:
            if handle.accepted.state == "done" and on_output is not None:
                handle = await self._replay(call, handle, handle.offset)
            result = await self._follow(call, handle, on_output, on_approval)
        except ToolwireClientError as exc:
            batch.settle(BatchItem(index, call, None, exc))
            return
        batch.settle(BatchItem(index, call, result))

    async def _replay(self, call: ModelToolCall, ended: CallHandle, from_offset: int) -> CallHandle:
        """A `call` of an ended call brings its result only (PROTOCOL.md 9.9), so a caller
        resuming after a crash would miss the output it had not shown yet: an `attach` from its
        offset replays what the agent retains of it, then the same result."""
        result = await ended.result()
        if result.output_bytes <= from_offset:
            return ended
        try:
            return await self.client.attach(call.chat_id, call.call_id, from_offset)
        except RequestError as exc:
            if exc.code != "unknown_call":  # forgotten meanwhile: the result is all there is
                raise
            return ended

    async def _follow(
        self,
        call: ModelToolCall,
        handle: CallHandle,
        on_output: OutputCallback | None,
        on_approval: ApprovalCallback | None,
    ) -> protocol.Result:
        """The call's events until its result: output to the callback; an approval to its
        callback as a helper task, cancelled when the gate closes (or the call ends)."""
        async with self.client.runtime.helpers() as helpers:
            gate = None
            async for event in handle:
                if isinstance(event, protocol.Output):
                    if on_output is not None:
                        outcome = on_output(OutputChunk(call, event.offset, event.data))
                        if inspect.isawaitable(outcome):
                            await outcome
                elif isinstance(event, protocol.Approval):
                    if on_approval is not None and gate is None:
                        gate = helpers.start(
                            functools.partial(self._answer, call, event, on_approval)
                        )
                elif isinstance(event, protocol.ApprovalResolved) and gate is not None:
                    gate.cancel()
            return await handle.result()

    async def _answer(
        self, call: ModelToolCall, approval: protocol.Approval, on_approval: ApprovalCallback
    ) -> None:
        try:
            decision = await on_approval(call, approval)
        except Exception:
            # Fail closed: a gate nobody can answer would hold the call for ever.
            log.exception("the approval callback failed; denying %s", call.call_id)
            decision = ApprovalDecision(False, "the approval callback failed")
        if decision is None:
            return  # left parked: someone else answers it
        if isinstance(decision, bool):
            decision = ApprovalDecision(decision)
        try:
            await self.client.approve(
                call.chat_id, call.call_id, decision.approved, decision.reason, decision.scope
            )
        except RequestError as exc:
            # `not_parked`: the gate closed meanwhile (an interrupt, another replica); the
            # call's events say how, and nothing of ours was lost.
            if exc.code != "not_parked":
                log.warning("approve of %s failed: %s", call.call_id, exc)
        except ToolwireClientError as exc:
            log.warning("approve of %s failed: %s", call.call_id, exc)

    async def _after_cancellation(self, calls: Sequence[ModelToolCall]) -> None:
        """The awaiting task is being cancelled: tell the agent what that means, shielded."""
        if not calls:
            return
        client = self.client
        chat_id = calls[0].chat_id
        ids = [call.call_id for call in calls]

        async def cancel() -> None:
            try:
                await client.cancel(chat_id, ids)
            except ToolwireClientError as exc:
                log.warning("cancel of %s after a cancellation failed: %s", ids, exc)

        async def detach() -> None:
            for call_id in ids:
                try:
                    await client.detach(chat_id, call_id)
                except ToolwireClientError as exc:
                    log.warning("detach of %s after a cancellation failed: %s", call_id, exc)

        action = cancel if self.on_cancel == "cancel" else detach
        if await client.runtime.shielded(_done_after(action), self.cancel_timeout_s) is None:
            log.warning("%s of %s took over %.0f s", self.on_cancel, ids, self.cancel_timeout_s)


def _done_after(action: Callable[[], Any]) -> Callable[[], Any]:
    async def run() -> bool:
        await action()
        return True

    return run


def _sandbox(value: protocol.Sandbox | dict[str, Any]) -> protocol.Sandbox:
    if isinstance(value, protocol.Sandbox):
        return value
    return msgspec.convert(value, protocol.Sandbox)
