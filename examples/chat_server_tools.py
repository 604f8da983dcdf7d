"""A chat server's tool loop on toolwire, runnable (docs/integrations.md):

    TOOLWIRE_TOKEN=... python examples/chat_server_tools.py ws://127.0.0.1:7411/v1

It plays one model response holding three tool calls (a scripted model, no network), runs them
as one turn through `ToolExecutor`, streams the command's output as it comes, and prints what
the model would be given back for each call. Run it twice: the second run gets the same saved
results (the call ids are derived from chat, message and provider call id), nothing runs again.
"""

from __future__ import annotations

import asyncio
import os
import sys

from toolwire.aio import (
    BadArgs,
    CallConflict,
    ModelToolCall,
    OutputChunk,
    ToolExecutor,
    UnknownTool,
    connect,
    render_result,
)

CHAT_ID = "example-chat"
# What a model answered: its message id and its tool calls (provider id, tool, JSON args).
MESSAGE_ID = "assistant-1"
TOOL_CALLS = [
    ("call_1", "write_file", '{"path": "hello.txt", "content": "hello from toolwire\\n"}'),
    ("call_2", "read_file", '{"path": "hello.txt"}'),
    ("call_3", "execute", '{"command": "echo ran >> runs.log; wc -c < hello.txt"}'),
    ("call_4", "read_file", '{"path": 7}'),
]


def show(chunk: OutputChunk) -> None:
    # A real server forwards this to the browser and saves `chunk.end` to resume from.
    print(f"[{chunk.call.provider_call_id} @{chunk.offset}] {chunk.data}", end="")


async def main(url: str, token: str) -> None:
    async with connect(url, token) as client:
        tools = await client.describe_tools()  # name, description, input_schema: for the model
        print("tools:", ", ".join(tool.name for tool in tools))
        executor = ToolExecutor(client, on_cancel="cancel")  # a cancelled run stops its calls
        calls = [ModelToolCall(CHAT_ID, MESSAGE_ID, *call) for call in TOOL_CALLS]
        items = await executor.execute_batch(calls, on_output=show)  # one response, one turn
        for item in items:  # in request order, as the model's history needs them
            try:
                text = render_result(item.unwrap())
            except (BadArgs, UnknownTool, CallConflict) as exc:
                text = f"error (the model may retry): {exc.message}"
            print(f"--- {item.call.provider_call_id} {item.call.tool}\n{text}")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], os.environ["TOOLWIRE_TOKEN"]))
