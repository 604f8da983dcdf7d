"""`toolwire.integrations.pydantic_ai` against a real agent, with pydantic-ai's FunctionModel in
place of an LLM (no network): the scenarios of issue 30, item 5. Each trap the issue lists has a
test here that fails without the toolset's rule for it (named in the test's docstring)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import AsyncIterable, AsyncIterator, Callable, Sequence
from typing import Any

import pytest
from pydantic_ai import Agent, DeferredToolRequests, RunCancelled, RunContext
from pydantic_ai.messages import (
    INTERRUPTED_TOOL_RETURN_CONTENT,
    AgentStreamEvent,
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelRequest,
    ModelResponse,
    RetryPromptPart,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, DeltaToolCall, DeltaToolCalls, FunctionModel

from tests.clientshells import AsyncioShell
from tests.conftest import LiveServer
from toolwire import ModelToolCall, Result
from toolwire.aio import connect
from toolwire.integrations.pydantic_ai import (
    RESULT_KEY,
    ToolwireOutput,
    ToolwireToolset,
    message_id,
)

CHAT = "44444444-4444-4444-4444-444444444444"
# Counts its runs in `marker`, prints ten bytes, then waits for a line on its stdin: the test
# decides when it ends, and the fixture's shutdown stops it if a test fails.
HELD = {"command": "echo x >> marker; printf 0123456789; read x; printf done", "stdin": True}

Handler = Callable[[RunContext[Any], AsyncIterable[AgentStreamEvent]], Any]


class Script:
    """A model that answers with `responses[n]` (tool calls) when the history holds n model
    responses, then with the text "done"; as a plain and as a streaming model. It keeps the
    messages and tool definitions it was given."""

    def __init__(self, *responses: list[ToolCallPart]) -> None:
        self.responses = list(responses)
        self.seen: list[list[ModelMessage]] = []
        self.tools: list[Any] = []

    def _next(self, messages: list[ModelMessage], info: AgentInfo) -> list[ToolCallPart] | None:
        self.seen.append(list(messages))
        self.tools = list(info.function_tools)
        step = sum(isinstance(m, ModelResponse) for m in messages)
        return self.responses[step] if step < len(self.responses) else None

    async def answer(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        parts = self._next(messages, info)
        return ModelResponse(parts=[TextPart("done")] if parts is None else list(parts))

    async def stream(
        self, messages: list[ModelMessage], info: AgentInfo
    ) -> AsyncIterator[str | DeltaToolCalls]:
        parts = self._next(messages, info)
        if parts is None:
            yield "done"
            return
        for index, part in enumerate(parts):
            args = json.dumps(part.args)
            yield {index: DeltaToolCall(part.tool_name, args, tool_call_id=part.tool_call_id)}

    def model(self) -> FunctionModel:
        return FunctionModel(self.answer, stream_function=self.stream)


def call(pid: str, tool: str, **args: Any) -> ToolCallPart:
    return ToolCallPart(tool, args, tool_call_id=pid)


def returns(messages: Sequence[ModelMessage]) -> dict[str, ToolReturnPart]:
    """Every tool return by provider call id; two returns for one call fail the test."""
    found: dict[str, ToolReturnPart] = {}
    for message in messages:
        if isinstance(message, ModelRequest):
            for part in message.parts:
                if isinstance(part, ToolReturnPart):
                    assert part.tool_call_id not in found, f"two returns for {part.tool_call_id}"
                    found[part.tool_call_id] = part
    return found


def calls_in(messages: Sequence[ModelMessage]) -> list[str]:
    return [
        part.tool_call_id
        for message in messages
        if isinstance(message, ModelResponse)
        for part in message.parts
        if isinstance(part, ToolCallPart)
    ]


def toolwire_call(messages: Sequence[ModelMessage], pid: str, tool: str) -> ModelToolCall:
    """The toolwire call of the model's call `pid`: its response's message id."""
    response = next(
        m
        for m in reversed(messages)
        if isinstance(m, ModelResponse)
        and any(isinstance(p, ToolCallPart) and p.tool_call_id == pid for p in m.parts)
    )
    return ModelToolCall(CHAT, message_id(response), pid, tool, {})


def runs(live: LiveServer) -> int:
    marker = live.workspace / "marker"
    return len(marker.read_text().splitlines()) if marker.exists() else 0


def outputs(into: list[ToolwireOutput], also: Callable[[ToolwireOutput], Any] | None = None) -> Any:
    async def handler(ctx: RunContext[Any], stream: AsyncIterable[AgentStreamEvent]) -> None:
        async for event in stream:
            if isinstance(event, ToolwireOutput):
                into.append(event)
                if also is not None:
                    also(event)

    return handler


async def release(client: Any, process_id: str, name: str) -> None:
    handle = await client.call(
        CHAT, f"release-{name}", "process_input", {"process_id": process_id, "data": "\n"}
    )
    assert (await handle.result()).outcome == "completed"


async def on_asyncio(body: Callable[[], Any]) -> None:
    await AsyncioShell().run(body)


async def test_one_response_is_one_turn_in_request_order(live: LiveServer) -> None:
    """The trap: pydantic-ai dispatches each call on its own, so `read`, `write`, `read` of one
    file gave the second read the stale content. Here the first call is a command that waits
    until the test lets it go (on its first output), then writes the file: a read dispatched
    on its own reads the file before that; in one turn it runs after the command."""
    (live.workspace / "race.txt").write_text("old\n")
    gate = {"command": "printf ready; read x; echo new > race.txt", "stdin": True}
    script = Script(
        [
            call("cmd", "execute", **gate),
            call("r0", "read_file", path="race.txt"),
            call("w", "write_file", path="race.txt", content="newer\n"),
            call("r1", "read_file", path="race.txt"),
            *[call(f"e{i}", "execute", command=f"echo x >> marker; echo {i}") for i in range(3)],
            call("fails", "read_file", path="missing.txt"),
        ]
    )

    async def body() -> None:
        async with connect(live.url, live.token) as client:
            toolset = ToolwireToolset(client, CHAT)
            events: list[ToolwireOutput] = []
            letting_go: list[asyncio.Task[None]] = []

            def on_output(event: ToolwireOutput) -> None:
                if event.text == "ready":
                    letting_go.append(asyncio.create_task(release(client, event.call_id, "cmd")))

            agent = Agent(script.model(), toolsets=[toolset])
            result = await agent.run("go", event_stream_handler=outputs(events, on_output))
            await asyncio.gather(*letting_go)
            definitions = await client.describe_tools()
        got = returns(result.all_messages())
        assert set(got) == set(calls_in(result.all_messages()))
        content = {pid: toolset.results[toolwire_call(result.all_messages(), pid, "").call_id]
                   for pid in ("r0", "r1")}  # fmt: skip
        assert content["r0"].data["content"] == "new\n"  # after the command, as requested
        assert content["r1"].data["content"] == "newer\n"  # after the write
        for i in range(3):  # same-name calls in parallel, each with its own result
            assert got[f"e{i}"].content.endswith(f"code 0\n{i}\n"), got[f"e{i}"]
        # A failing tool is a failed return (pydantic-ai's error channel), in toolwire's text.
        assert got["fails"].outcome == "failed"
        assert got["fails"].content.startswith("outcome: failed\n"), got["fails"]
        assert runs(live) == 3
        # The model was offered the agent's own definitions, schemas and descriptions as served.
        assert [(t.name, t.description, t.parameters_json_schema) for t in script.tools] == [
            (d.name, d.description, d.input_schema) for d in definitions
        ]

    await on_asyncio(body)


async def test_output_streams_live_as_custom_events(live: LiveServer) -> None:
    """Output reaches the run's event stream while the command runs (the command waits for a
    line the test sends only once it saw the first output), with offsets, once."""
    command = {"command": "printf ab; read x; printf cd", "stdin": True}
    script = Script([call("s", "execute", **command)])

    async def body() -> None:
        async with connect(live.url, live.token) as client:
            toolset = ToolwireToolset(client, CHAT)
            agent = Agent(script.model(), toolsets=[toolset])
            events: list[ToolwireOutput] = []
            async with agent.run_stream_events("go") as stream:
                async for event in stream:
                    if isinstance(event, ToolwireOutput):
                        events.append(event)
                        if event.text == "ab":
                            await release(client, event.call_id, "s")
        assert "".join(e.text for e in events) == "abcd"
        at = 0
        for event in events:
            assert (event.tool_call_id, event.tool_name, event.offset) == ("s", "execute", at)
            at = event.end
        assert toolset.shown == {events[0].call_id: 4}

    await on_asyncio(body)


async def test_wrong_argument_types_ask_the_model_again_with_the_reason(
    live: LiveServer,
) -> None:
    script = Script(
        [call("bad", "execute", command=1)],
        [call("good", "execute", command="echo x >> marker; echo fixed")],
    )

    async def body() -> None:
        async with connect(live.url, live.token) as client:
            agent = Agent(script.model(), toolsets=[ToolwireToolset(client, CHAT)])
            result = await agent.run("go")
        # What the model was given on its second request: the failed call answered with
        # toolwire's reason, as a retry (pydantic-ai 2.68 sends a retry as a return part).
        answered = [
            part
            for message in script.seen[1]
            if isinstance(message, ModelRequest)
            for part in message.parts
            if isinstance(part, ToolReturnPart | RetryPromptPart)
        ]
        assert [(p.tool_call_id, p.outcome) for p in answered] == [("bad", "retried")]
        assert answered[0].content == "execute: args.command: expected string, got integer"
        assert returns(result.all_messages())["good"].content.endswith("\nfixed\n")
        assert runs(live) == 1  # the refused call never ran

    await on_asyncio(body)


async def test_approve_and_deny_through_deferred_tool_requests(live: LiveServer) -> None:
    """The trap: `denied` showed in the framework's history as `outcome='success'`, and a
    denial made only in the framework left the agent's gate open (a retry could still run)."""
    yes = {"command": "echo x >> marker; echo yes"}
    no = {"command": "echo x >> marker; echo no"}
    script = Script([call("a", "execute", **yes), call("d", "execute", **no)])

    async def body() -> None:
        async with connect(live.url, live.token) as client:
            toolset = ToolwireToolset(client, CHAT, approval={"execute"})
            agent = Agent(
                script.model(), toolsets=[toolset], output_type=[str, DeferredToolRequests]
            )
            first = await agent.run("go")
            requests = first.output
            assert isinstance(requests, DeferredToolRequests)
            assert sorted(p.tool_call_id for p in requests.approvals) == ["a", "d"]
            assert runs(live) == 0  # both parked at their gates on the agent
            decided = await toolset.decide(requests, {"a": True, "d": "not this one"})
            second = await agent.run(
                message_history=first.all_messages(), deferred_tool_results=decided
            )
            # The denial is the agent's record: a retry of the call, from anyone, gets it.
            denied = toolwire_call(first.all_messages(), "d", "execute")
            again = await client.call(CHAT, denied.call_id, "execute", no)
            assert again.accepted.state == "done"  # not parked any more
            assert (await again.result()).outcome == "denied"
        got = returns(second.all_messages())
        assert got["a"].outcome == "success" and got["a"].content.endswith("\nyes\n")
        assert (got["d"].outcome, got["d"].content) == (
            "denied",
            "outcome: denied\ntool call was denied: not this one; no changes were made",
        )
        assert runs(live) == 1

    await on_asyncio(body)


async def test_an_interrupt_gives_every_call_one_truthful_return(live: LiveServer) -> None:
    """The trap: after an interrupt pydantic-ai gave the calls without a return its own text,
    "The tool call was interrupted before a result was produced", for commands that had run and
    printed; and `canceled` showed as `outcome='success'`."""
    (live.workspace / "f").write_text("f\n")
    script = Script(
        [
            call("read", "read_file", path="f"),
            call("held", "execute", **HELD),
            call("queued", "execute", command="echo x >> marker"),
        ]
    )

    async def body() -> None:
        async with connect(live.url, live.token) as client:
            toolset = ToolwireToolset(client, CHAT)
            stopping: list[asyncio.Task[list[str]]] = []

            def on_output(event: ToolwireOutput) -> None:
                if "9" in event.text and not stopping:  # the user presses stop
                    stopping.append(asyncio.create_task(toolset.interrupt()))

            agent = Agent(script.model(), toolsets=[toolset])
            with pytest.raises(RunCancelled) as cancelled:
                await agent.run("go", event_stream_handler=outputs([], on_output))
            await stopping[0]
            messages = await toolset.repair(cancelled.value.all_messages())
        got = returns(messages)
        assert set(got) == {"read", "held", "queued"} == set(calls_in(messages))
        assert got["read"].outcome == "success", got["read"]
        assert got["read"].content.startswith("outcome: completed\nread 1 of 1 line of f\nf\n")
        assert got["held"].outcome == "interrupted"
        assert got["held"].content.startswith("outcome: canceled")
        assert "0123456789" in str(got["held"].content)
        assert got["queued"].outcome == "interrupted"
        assert got["queued"].content.startswith("outcome: not_run")
        assert all(p.content != INTERRUPTED_TOOL_RETURN_CONTENT for p in got.values())
        assert runs(live) == 1  # `queued` never ran
        # The history serializes, and each Result comes back out of it.
        back = ModelMessagesTypeAdapter.validate_json(ModelMessagesTypeAdapter.dump_json(messages))
        for pid in ("held", "queued"):
            saved = returns(back)[pid].metadata[RESULT_KEY]
            assert Result.from_dict(saved) == toolset.results[toolwire_call(back, pid, "").call_id]

    await on_asyncio(body)


async def test_a_stop_from_elsewhere_stops_the_run_with_the_truth(live: LiveServer) -> None:
    """Another replica interrupts the chat (the user pressed stop in another tab) while a
    command runs: its call ends `canceled`, which stops this run too (not a `success` return
    the model goes on from), and the repaired history says what happened."""
    script = Script([call("held", "execute", **HELD), call("next", "execute", command="echo x")])

    async def body() -> None:
        async with connect(live.url, live.token) as client, connect(live.url, live.token) as other:
            toolset = ToolwireToolset(client, CHAT)
            stopping: list[asyncio.Task[list[str]]] = []

            def on_output(event: ToolwireOutput) -> None:
                if "9" in event.text and not stopping:
                    stopping.append(asyncio.create_task(other.interrupt(CHAT)))

            agent = Agent(script.model(), toolsets=[toolset])
            with pytest.raises(RunCancelled) as cancelled:
                await agent.run("go", event_stream_handler=outputs([], on_output))
            await stopping[0]
            messages = await toolset.repair(cancelled.value.all_messages())
        got = returns(messages)
        assert (got["held"].outcome, got["next"].outcome) == ("interrupted", "interrupted")
        assert got["held"].content.startswith("outcome: canceled")
        assert got["next"].content.startswith("outcome: not_run")
        assert len(script.seen) == 1  # the model was not asked to go on from a stopped call
        assert runs(live) == 1

    await on_asyncio(body)


async def test_a_killed_chat_server_resumes_from_its_saved_history(live: LiveServer) -> None:
    """The trap: after a chat-server crash the resumed run sent its `call` again and showed the
    output again from offset 0. The second chat server here has only what the first saved:
    its history and the offsets it showed."""
    script = Script([call("long", "execute", **HELD)])

    async def body() -> None:
        saved: list[ModelMessage] = []
        shown: dict[str, int] = {}
        first: list[ToolwireOutput] = []
        seen = asyncio.Event()

        async def persist(ctx: RunContext[Any], stream: AsyncIterable[AgentStreamEvent]) -> None:
            async for event in stream:
                if isinstance(event, ToolwireOutput):
                    first.append(event)
                    saved[:] = ctx.messages  # the chat server saves as it shows
                    if "9" in event.text:
                        seen.set()

        async with connect(live.url, live.token) as client:
            toolset = ToolwireToolset(client, CHAT, shown=shown)
            agent = Agent(script.model(), toolsets=[toolset])
            run = asyncio.create_task(agent.run("go", event_stream_handler=persist))
            await seen.wait()
            run.cancel()  # the chat server dies here, its client with it
            with pytest.raises(asyncio.CancelledError):
                await run
        long = toolwire_call(saved, "long", "execute")
        async with connect(live.url, live.token) as other:  # the command goes on, and ends
            await release(other, long.call_id, "long")
        later: list[ToolwireOutput] = []
        async with connect(live.url, live.token) as client:
            toolset = ToolwireToolset(client, CHAT, shown=dict(shown))
            agent = Agent(script.model(), toolsets=[toolset])
            result = await agent.run(message_history=saved, event_stream_handler=outputs(later))
        assert "".join(e.text for e in first) == "0123456789"
        assert [(e.offset, e.text) for e in later] == [(10, "done")]  # nothing shown twice
        assert returns(result.all_messages())["long"].content == (
            "outcome: completed, exit code 0\ncommand exited with code 0\n0123456789done"
        )
        assert runs(live) == 1

    await on_asyncio(body)


def test_without_pydantic_ai_the_import_names_the_extra() -> None:
    script = (
        "import sys; sys.modules['pydantic_ai'] = None; import toolwire.integrations.pydantic_ai"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 1
    assert "pip install 'toolwire[pydantic-ai]'" in done.stderr, done.stderr
