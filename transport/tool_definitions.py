"""The agent's tools as a model is given them (PROTOCOL.md 10.3), from their registry entries:
what `describe_tools` answers, and what the docs' reference lists."""

from __future__ import annotations

import functools

from toolwire.actors.tools import registry
from toolwire.transport import protocol


def tool_definitions(names: list[str]) -> list[protocol.ToolDefinition]:
    """The named tools (welcome.tools), in that order."""
    return [definition(name) for name in names]


@functools.cache
def definition(name: str) -> protocol.ToolDefinition:
    """Built once per tool: the registry does not change while the agent runs. Only ever
    encoded, never changed, so one instance serves every reply."""
    tool = registry.TOOLS[name]
    return protocol.ToolDefinition(
        name=tool.name,
        description=tool.description,
        input_schema=registry.input_schema(tool),
        effect=tool.effect,
    )
