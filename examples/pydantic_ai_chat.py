"""A pydantic-ai chat server's tool calls on toolwire, runnable (docs/integrations.md):

    TOOLWIRE_TOKEN=... python examples/pydantic_ai_chat.py ws://127.0.0.1:7411/v1 chat.json

`chat` below is the chat server: an Agent with toolwire's tools, output streamed as it comes,
the history saved as the run goes (to `chat.json`, with the output offsets it showed). Kill it
while the command runs and start it again: it resumes the saved history, the command is not
run again, and only the output not shown yet is shown. The model is scripted (pydantic-ai's
FunctionModel, no network): one response of three calls, then a summary.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import AsyncIterable, AsyncIterator, Sequence
from pathlib import Path

from pydantic_ai import Agent, AgentStreamEvent, RunCancelled, RunContext
from pydantic_ai.messages import (
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelResponse,
    TextPart,
    ToolCallPart,
)
from pydantic_ai.models.function import AgentInfo, DeltaToolCall, DeltaToolCalls, FunctionModel

from toolwire.aio import connect
from toolwire.integrations.pydantic_ai import ToolwireOutput, ToolwireToolset

CHAT_ID = "pydantic-ai-example"
# The command waits for the file `go` in the workspace, so a test can kill the chat server
# while it runs; it counts its runs in runs.log.
COMMAND = "echo ran >> runs.log; echo step 1; until [ -e go ]; do sleep 0.05; done; echo step 2"


async def chat(url: str, token: str, path: Path) -> None:
    history, shown = load(path)  # shown: output offsets this server showed, by call id
    async with connect(url, token) as client:
        toolset = ToolwireToolset(client, CHAT_ID, shown=dict(shown))
        agent = Agent(scripted_model(), toolsets=[toolset])

        async def show(ctx: RunContext[None], events: AsyncIterable[AgentStreamEvent]) -> None:
            async for event in events:
                if isinstance(event, ToolwireOutput):
                    shown[event.call_id] = event.end
                save(path, ctx.messages, shown)  # before showing: nothing is shown twice
                if isinstance(event, ToolwireOutput):
                    print(event.text, end="", flush=True)

        # A saved response whose calls have no returns yet: the last server died running them.
        resuming = bool(history) and any(isinstance(p, ToolCallPart) for p in history[-1].parts)
        prompt = None if resuming else "Write notes.txt, read it back, then run the checks."
        try:
            result = await agent.run(prompt, message_history=history, event_stream_handler=show)
            history, answer = result.all_messages(), result.output
        except RunCancelled as stopped:  # `await toolset.interrupt()`, from a stop button
            history, answer = await toolset.repair(stopped.all_messages()), "(stopped)"
        save(path, history, shown)
        print(answer)


def load(path: Path) -> tuple[list[ModelMessage], dict[str, int]]:
    if not path.exists():
        return [], {}
    saved = json.loads(path.read_text())
    return ModelMessagesTypeAdapter.validate_python(saved["messages"]), saved["shown"]


def save(path: Path, messages: Sequence[ModelMessage], shown: dict[str, int]) -> None:
    messages_json = ModelMessagesTypeAdapter.dump_python(list(messages), mode="json")
    # Written whole, then renamed over the old file: a server killed mid-save leaves the last
    # saved history, never half of it.
    temp = path.with_name(path.name + ".tmp")
    temp.write_text(json.dumps({"messages": messages_json, "shown": shown}))
    os.replace(temp, path)


# -- the scripted model (stands in for an LLM) ------------------------------------------------

CALLS = [
    ("call_1", "write_file", {"path": "notes.txt", "content": "tools run once\n"}),
    ("call_2", "read_file", {"path": "notes.txt"}),
    ("call_3", "execute", {"command": COMMAND}),
]


def scripted_model() -> FunctionModel:
    def answered(messages: list[ModelMessage]) -> bool:
        return any(isinstance(m, ModelResponse) for m in messages)

    async def reply(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if answered(messages):
            return ModelResponse(parts=[TextPart("checks done")])
        return ModelResponse(parts=[ToolCallPart(n, a, tool_call_id=i) for i, n, a in CALLS])

    async def stream(
        messages: list[ModelMessage], info: AgentInfo
    ) -> AsyncIterator[str | DeltaToolCalls]:
        if answered(messages):
            yield "checks done"
            return
        for index, (pid, name, args) in enumerate(CALLS):
            yield {index: DeltaToolCall(name, json.dumps(args), tool_call_id=pid)}

    return FunctionModel(reply, stream_function=stream)


if __name__ == "__main__":
    asyncio.run(chat(sys.argv[1], os.environ["TOOLWIRE_TOKEN"], Path(sys.argv[2])))
