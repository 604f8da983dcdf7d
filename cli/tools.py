"""`toolwire tools`: the agent's tools as a model is given them (PROTOCOL.md 10.3), printed in
the shape a model API takes: toolwire's own (`json`), OpenAI's function tools (`openai`) or
Anthropic's tools (`anthropic`). It asks the agent (`describe_tools`), as `toolwire call` does
for a call, so what it prints is what that agent runs."""

from __future__ import annotations

import json
from typing import Any, Literal

import msgspec

from toolwire.cli.client_failure import CLIENT_FAILURES, report_failure
from toolwire.transport import protocol
from toolwire.transport.client import connect

Format = Literal["json", "openai", "anthropic"]
FORMATS: tuple[Format, ...] = ("json", "openai", "anthropic")


def shaped(tools: list[protocol.ToolDefinition], fmt: Format) -> list[dict[str, Any]]:
    """The definitions as `fmt` takes them: OpenAI's Chat Completions `tools`
    ({type: function, function: {name, description, parameters}}), Anthropic's Messages
    `tools` ({name, description, input_schema}), or toolwire's own entries as sent."""
    if fmt == "openai":
        return [
            {
                "type": "function",
                "function": {
                    "name": tool.name,
                    "description": tool.description,
                    "parameters": tool.input_schema,
                },
            }
            for tool in tools
        ]
    if fmt == "anthropic":
        return [
            {"name": tool.name, "description": tool.description, "input_schema": tool.input_schema}
            for tool in tools
        ]
    builtins: list[dict[str, Any]] = msgspec.to_builtins(tools)
    return builtins


async def run_tools(url: str, token: str | None, fmt: Format) -> int:
    try:
        async with connect(url, token, reconnect=False) as client:
            tools = await client.describe_tools()
    except CLIENT_FAILURES as exc:
        return report_failure("toolwire tools", url, exc)
    print(json.dumps(shaped(tools, fmt), indent=2))
    return 0
