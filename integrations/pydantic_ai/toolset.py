"""`ToolwireToolset`: the agent's tools as a pydantic-ai toolset, run through `ToolExecutor`.

What pydantic-ai does on its own, and what the toolset does about it:
- it dispatches each call of a model response as a task of its own, so the agent's planner
  would never see them together: the first call of a response to reach the toolset sends all
  of the response's toolwire calls as one `turn` (in a task of the toolset's), and each call's
  `call_tool` waits for its own result from it;
- it names calls by the provider's id alone: the toolset names each toolwire call by chat, the
  id of its model response in the history (`message_id`) and that provider id, so a run resumed
  from a saved history after a crash finds the same calls (at most once, output resumed from
  `shown`);
- it knows four outcomes: a toolwire Result maps onto them as `framework_outcome` says; a call
  that ended `canceled` or `not_run` means toolwire was told to stop (an interrupt, a cancel, an
  expired gate, a shutdown), so the run stops there, as `interrupt` stops it;
- after a stopped run it would fill each call without a return with "The tool call was
  interrupted before a result was produced": `repair` gives each its real result instead.

One run at a time per toolset (a toolset is one chat's), on asyncio (pydantic-ai's loop) with a
`toolwire.aio` client.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NoReturn

from pydantic_ai.exceptions import ApprovalRequired, ModelRetry, ToolFailed
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    RetryPromptPart,
    ToolCallPart,
    ToolReturn,
    ToolReturnPart,
    repair_messages,
)
from pydantic_ai.tools import DeferredToolRequests, DeferredToolResults, RunContext, ToolDenied
from pydantic_ai.tools import ToolDefinition as FrameworkToolDefinition
from pydantic_ai.toolsets import AbstractToolset, ToolsetTool
from pydantic_core import SchemaValidator, ValidationError, core_schema

from toolwire.integrations.pydantic_ai.events import ToolwireOutput
from toolwire.integrations.pydantic_ai.history import (
    RESULT_KEY,
    message_id,
    response_of,
    returns_to_repair,
    rewritten,
)
from toolwire.transport import protocol
from toolwire.transport.client.api import ClientAPI
from toolwire.transport.client.errors import (
    BadArgs,
    CallConflict,
    RequestError,
    UnknownTool,
)
from toolwire.transport.client.executor import BatchItem, NeedsApproval, ToolExecutor
from toolwire.transport.client.rendering import render_result
from toolwire.transport.client.tool_calls import ModelToolCall, OnCancel, OutputChunk

__all__ = ["ToolwireToolset"]

log = logging.getLogger("toolwire.integrations.pydantic_ai")

# pydantic-ai checks only that args are an object, as the executor does (`ModelToolCall`): the
# agent's input schemas are exact, and args that do not fit one are refused by toolwire with a
# message naming the argument, which goes back to the model as a retry prompt.
_ARGS = SchemaValidator(core_schema.dict_schema(keys_schema=core_schema.str_schema()))
# What `ApprovalRequired.metadata` carries, so `decide` names the same toolwire call.
_CALL_ID = "toolwire_call_id"
_MESSAGE_ID = "toolwire_message_id"


@dataclass
class _ResponseBatch:
    """The toolwire calls of one model response, sent as one turn by `task`."""

    calls: dict[str, ModelToolCall]  # by call id
    items: dict[str, BatchItem | None] = field(default_factory=dict)  # None: the batch stopped
    ended: dict[str, asyncio.Event] = field(default_factory=dict)
    task: asyncio.Task[None] | None = None

    def settle(self, call_id: str, item: BatchItem | None) -> None:
        if call_id not in self.items:
            self.items[call_id] = item
            self.ended[call_id].set()


class ToolwireToolset(AbstractToolset[Any]):
    """The tools of a toolwire agent (`describe_tools`: its descriptions and exact input
    schemas) for a pydantic-ai Agent, every call of chat `chat_id` run through `client` (a
    `toolwire.aio` client) at most once, with one truthful result (module docstring).

    `approval`: which calls wait for a person (True, tool names, or a predicate of the
    ModelToolCall): each parks at a toolwire gate and the run ends with `DeferredToolRequests`;
    answer with `decide`. `shown`: the output already shown of each call, by toolwire call id,
    kept up to date as output is emitted (save it with the history and pass it back after a
    crash). `on_cancel`: what a cancellation of the run means for its calls, as for
    ToolExecutor; "detach" by default, since stopping is `interrupt`'s: any other cancellation
    (a server shutting down) leaves the calls running for the resumed run. `timeout_ms`,
    `sandbox`: for every call. `max_retries`: of a call whose args toolwire refused."""

    def __init__(
        self,
        client: ClientAPI,
        chat_id: str,
        *,
        approval: NeedsApproval = False,
        shown: MutableMapping[str, int] | None = None,
        on_cancel: OnCancel = "detach",
        timeout_ms: int | None = None,
        sandbox: protocol.Sandbox | dict[str, Any] | None = None,
        max_retries: int = 2,
        id: str | None = "toolwire",
    ) -> None:
        self.client = client
        self.chat_id = chat_id
        self.executor = ToolExecutor(
            client, on_cancel=on_cancel, approval=approval, timeout_ms=timeout_ms, sandbox=sandbox
        )
        self.shown: MutableMapping[str, int] = shown if shown is not None else {}
        self.results: dict[str, protocol.Result] = {}  # by toolwire call id, as they end
        self.max_retries = max_retries
        self._id = id
        self._definitions: list[protocol.ToolDefinition] | None = None
        self._batches: dict[str, _ResponseBatch] = {}  # by message id, for the current run
        self._entered = 0
        self._stopping = False
        self._run: RunContext[Any] | None = None  # the current run, to cancel it

    @property
    def id(self) -> str | None:
        return self._id

    # -- the toolset ---------------------------------------------------------------------------

    async def __aenter__(self) -> ToolwireToolset:
        if self._entered == 0:
            self._stopping = False
            self._batches.clear()
        self._entered += 1
        return self

    async def __aexit__(self, *args: Any) -> bool | None:
        self._entered -= 1
        if self._entered == 0:
            # Batches whose calls the run never asked for again (it ended first): their calls
            # are cancelled or detached as `on_cancel` says, before the run's end is reported.
            tasks = [b.task for b in self._batches.values() if b.task is not None]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            self._batches.clear()
            self._run = None
        return None

    async def get_tools(self, ctx: RunContext[Any]) -> dict[str, ToolsetTool[Any]]:
        self._run = ctx
        return {
            tool.name: ToolsetTool(
                toolset=self,
                tool_def=FrameworkToolDefinition(
                    name=tool.name,
                    description=tool.description,
                    parameters_json_schema=tool.input_schema,
                    metadata={"toolwire_effect": tool.effect},
                ),
                max_retries=self.max_retries,
                args_validator=_ARGS,
            )
            for tool in await self.definitions()
        }

    async def definitions(self) -> list[protocol.ToolDefinition]:
        """The agent's tool definitions, asked once."""
        if self._definitions is None:
            self._definitions = await self.client.describe_tools()
        return self._definitions

    async def call_tool(
        self, name: str, tool_args: dict[str, Any], ctx: RunContext[Any], tool: ToolsetTool[Any]
    ) -> Any:
        self._run = ctx
        provider_id = ctx.tool_call_id
        response = None if provider_id is None else response_of(ctx.messages, provider_id)
        if provider_id is None or response is None:
            raise ToolFailed("toolwire: this call is in no model response of the history")
        call = ModelToolCall(self.chat_id, message_id(response), provider_id, name, tool_args)
        if self._stopping:
            await self._hold(ctx)  # nothing starts once the run is being stopped
        if self.executor.needs_approval(call):
            item = await self._gated(call, ctx)
        else:
            item = await self._batched(call, response, ctx)
        return await self._answer(item, ctx)

    # -- one response, one turn ----------------------------------------------------------------

    async def _batched(
        self, call: ModelToolCall, response: ModelResponse, ctx: RunContext[Any]
    ) -> BatchItem:
        batch = self._batches.get(call.message_id)
        if batch is None:
            batch = self._new_batch(call, response, ctx)
            self._batches[call.message_id] = batch
        if call.call_id not in batch.calls:
            return await self._single(call, ctx)
        try:
            await batch.ended[call.call_id].wait()
        except asyncio.CancelledError:
            # The run is being cancelled: the batch's calls are cancelled or detached
            # (`on_cancel`) by its task, awaited when the run's toolsets exit.
            if batch.task is not None:
                batch.task.cancel()
            raise
        item = batch.items[call.call_id]
        if item is None:  # the batch was stopped while this call still waited: follow it alone
            return await self._single(call, ctx)
        return item

    def _new_batch(
        self, call: ModelToolCall, response: ModelResponse, ctx: RunContext[Any]
    ) -> _ResponseBatch:
        """The response's calls that pydantic-ai will hand to this toolset now, as one turn:
        its tools, not gated, args an object, not answered already (a resumed run); pydantic-ai
        refuses a response that repeats an id itself. A response that also calls an output
        tool keeps each call on its own (an `end_strategy` may skip the function calls, which
        must then not run)."""
        calls: list[ModelToolCall] = []
        parts = [p for p in response.parts if isinstance(p, ToolCallPart)]
        manager = ctx.tool_manager
        if manager is not None and any(
            (tool_def := manager.get_tool_def(p.tool_name)) is not None
            and tool_def.kind == "output"
            for p in parts
        ):
            parts = []
        answered = _answered(ctx.messages, response)
        names = {tool.name for tool in self._definitions or ()}
        for part in parts:
            if part.tool_name not in names or part.tool_call_id in answered:
                continue
            try:
                args = (
                    _ARGS.validate_python(part.args or {})
                    if not isinstance(part.args, str)
                    else _ARGS.validate_json(part.args or "{}")
                )
            except ValidationError:
                continue  # pydantic-ai asks the model again itself
            each = ModelToolCall(
                self.chat_id, call.message_id, part.tool_call_id, part.tool_name, args
            )
            if not self.executor.needs_approval(each):
                calls.append(each)
        batch = _ResponseBatch({each.call_id: each for each in calls})
        for each in calls:
            batch.ended[each.call_id] = asyncio.Event()
        if calls:
            batch.task = asyncio.create_task(
                self._run_batch(batch, ctx), name=f"toolwire turn of {call.message_id}"
            )
        return batch

    async def _run_batch(self, batch: _ResponseBatch, ctx: RunContext[Any]) -> None:
        calls = list(batch.calls.values())
        offsets = {c.call_id: self.shown[c.call_id] for c in calls if c.call_id in self.shown}
        try:
            async with self.executor.run_batch(
                calls, from_offsets=offsets, on_output=lambda chunk: self._emit(ctx, chunk)
            ) as running:
                async for item in running:
                    if item.result is not None:
                        self.results[item.call.call_id] = item.result
                    batch.settle(item.call.call_id, item)
        finally:
            for each in calls:  # stopped (cancelled, the connection lost): follow them alone
                batch.settle(each.call_id, None)

    async def _single(self, call: ModelToolCall, ctx: RunContext[Any]) -> BatchItem:
        try:
            result = await self.executor.execute(
                call,
                from_offset=self.shown.get(call.call_id, 0),
                on_output=lambda chunk: self._emit(ctx, chunk),
            )
        except RequestError as exc:
            return BatchItem(0, call, None, exc)
        self.results[call.call_id] = result
        return BatchItem(0, call, result)

    async def _emit(self, ctx: RunContext[Any], chunk: OutputChunk) -> None:
        call = chunk.call
        await ctx.emit(
            ToolwireOutput(
                tool_call_id=call.provider_call_id,
                tool_name=call.tool,
                call_id=call.call_id,
                offset=chunk.offset,
                text=chunk.data,
                end=chunk.end,
            )
        )
        self.shown[call.call_id] = chunk.end

    # -- outcomes ------------------------------------------------------------------------------

    async def _answer(self, item: BatchItem, ctx: RunContext[Any]) -> Any:
        error = item.error
        if isinstance(error, BadArgs | UnknownTool | CallConflict):
            raise ModelRetry(error.message)  # nothing ran: the model fixes its call
        if isinstance(error, RequestError):
            raise ToolFailed(f"{error.code}: {error.message}")
        if error is not None:
            raise error  # the connection is gone: the run fails, its history resumes
        result = item.unwrap()
        if self._stopping:
            await self._hold(ctx)
        text = render_result(result)
        if result.outcome in ("canceled", "not_run"):
            await self._stop(ctx)
        if result.outcome == "denied":
            return ToolDenied(text)
        if result.outcome in ("failed", "unknown"):
            raise ToolFailed(text)
        return ToolReturn(return_value=text, metadata={RESULT_KEY: result.to_dict()})

    # -- approvals as deferred tool requests ---------------------------------------------------

    async def _gated(self, call: ModelToolCall, ctx: RunContext[Any]) -> BatchItem:
        """A call that waits for a person: parked at its toolwire gate, the run defers it
        (`DeferredToolRequests.approvals`); when the next run brings the approval, the gate
        opens and the call is followed to its result. A gate decided meanwhile (another
        replica, a tool approved for the chat) is simply followed."""
        if ctx.tool_call_approved:
            await self._approve(call, True, None)
        else:
            try:
                handle = await self.client.call(
                    call.chat_id,
                    call.call_id,
                    call.tool,
                    call.arguments(),
                    timeout_ms=self.executor.timeout_ms,
                    approval=True,
                    sandbox=self.executor.sandbox,
                )
            except RequestError as exc:
                return BatchItem(0, call, None, exc)
            if handle.accepted.state == "awaiting_approval":
                await self.client.detach(call.chat_id, call.call_id)  # it stays parked
                raise ApprovalRequired(
                    metadata={_CALL_ID: call.call_id, _MESSAGE_ID: call.message_id}
                )
        return await self._single(call, ctx)

    async def _approve(self, call: ModelToolCall, approved: bool, reason: str | None) -> None:
        try:
            await self.client.approve(call.chat_id, call.call_id, approved, reason)
        except RequestError as exc:
            if exc.code != "not_parked":  # decided already: the call's result tells how
                raise

    async def decide(
        self, requests: DeferredToolRequests, answers: Mapping[str, bool | str]
    ) -> DeferredToolResults:
        """Answer the gates of `requests` (a run's output), by the model's tool call id: True
        approves; False or a reason (str) denies. A denial is made on the agent now: its record
        says `denied` (a retry of the call gets that, from any replica), and the history gets
        toolwire's text for it. Pass what this returns as the next run's
        `deferred_tool_results`; the approved calls then run in that run."""
        missing = [p.tool_call_id for p in requests.approvals if p.tool_call_id not in answers]
        if missing:
            raise ValueError(f"no answer for the gated calls {missing}")
        approvals: dict[str, bool | ToolDenied] = {}
        for part in requests.approvals:
            answer = answers[part.tool_call_id]
            if answer is True:
                approvals[part.tool_call_id] = True
                continue
            metadata = requests.metadata.get(part.tool_call_id) or {}
            if _MESSAGE_ID not in metadata:
                raise ValueError(f"{part.tool_call_id!r} is not a gated toolwire call")
            call = ModelToolCall(
                self.chat_id,
                str(metadata[_MESSAGE_ID]),
                part.tool_call_id,
                part.tool_name,
                part.args or {},
            )
            await self._approve(call, False, answer if isinstance(answer, str) else None)
            result = await self.executor.execute(call)  # a repeat: the call's final result
            self.results[call.call_id] = result
            # Approved elsewhere meanwhile: it ran, and the next run follows it to its result.
            denied = result.outcome == "denied"
            approvals[part.tool_call_id] = ToolDenied(render_result(result)) if denied else True
        return DeferredToolResults(approvals=dict(approvals))

    # -- stopping ------------------------------------------------------------------------------

    async def interrupt(self) -> list[str]:
        """The user pressed stop: every unresolved call of the chat ends on the agent (never
        started: `not_run`; running: `canceled` with its output so far; finished: its result),
        and the current run is cancelled: `agent.run` raises RunCancelled. Pass its
        `all_messages()` to `repair`. Returns the ids of the calls the agent ended."""
        self._stopping = True
        ended = await self.client.interrupt(self.chat_id)
        if self._run is not None:
            with contextlib.suppress(Exception):  # the run ended meanwhile
                self._run.cancel()
        return ended

    async def _stop(self, ctx: RunContext[Any]) -> NoReturn:
        if not self._stopping:
            await self.interrupt()
        await self._hold(ctx)

    async def _hold(self, ctx: RunContext[Any]) -> NoReturn:
        """Give the run nothing more: it is being cancelled (its calls' results are in
        `results`, and `repair` puts them in the history)."""
        self._stopping = True
        ctx.cancel()
        await asyncio.Event().wait()
        raise AssertionError("unreachable: the run's cancellation ends the wait")

    async def repair(self, messages: Sequence[ModelMessage]) -> list[ModelMessage]:
        """The history of a stopped run (`RunCancelled.all_messages()`) with every call of
        this toolset answered exactly once, truthfully: where pydantic-ai would put "The tool
        call was interrupted before a result was produced", the call's real result in
        toolwire's text, `outcome="interrupted"` for `canceled` and `not_run`. A call the
        toolset has no result of is ended on the agent now (`cancel_and_collect`: `not_run` if
        it never started, `canceled` with its output if it was running, else its result)."""
        history = repair_messages(messages)  # a return for every call, where pydantic-ai puts it
        names = {tool.name for tool in await self.definitions()}
        rewrites = returns_to_repair(history, self.chat_id, names)
        missing = [r.call.call_id for r in rewrites if r.call.call_id not in self.results]
        if missing:
            self.results.update(await self.client.cancel_and_collect(self.chat_id, missing))
        return rewritten(history, rewrites, lambda call: self.results[call.call_id])


def _answered(messages: Sequence[ModelMessage], response: ModelResponse) -> set[str]:
    """Provider ids of the calls answered after `response` (a resumed run's earlier steps)."""
    after = False
    answered: set[str] = set()
    for message in messages:
        if message is response:
            after = True
        elif after and isinstance(message, ModelRequest):
            answered.update(
                part.tool_call_id
                for part in message.parts
                if isinstance(part, ToolReturnPart | RetryPromptPart)
            )
    return answered
