"""The tools of protocol version 1 (and 1.1), how their args are checked, and how each runs."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

import msgspec

from toolwire.actors.results import ToolwireError
from toolwire.actors.tools import execute, files
from toolwire.actors.tools.execute import ExecuteArgs
from toolwire.actors.tools.process_args import (
    ProcessInputArgs,
    ProcessListArgs,
    ProcessOutputArgs,
    ProcessResizeArgs,
    ProcessSignalArgs,
)


class ToolKind(enum.Enum):
    EXECUTE = "execute"  # spawns a process the chat owns
    PROCESS = "process"  # works on the chat's process table
    INLINE = "inline"  # a short synchronous file operation, run on the event loop
    THREAD = "thread"  # a file operation that may take long (a tree walk): a worker thread


@dataclass(frozen=True, slots=True)
class ToolDef:
    name: str
    args_type: type[msgspec.Struct]
    kind: ToolKind
    # Changes nothing outside the agent: no start row is journaled before it runs (there is
    # no effect a crash could forget); its result is journaled before its reply like any other.
    read_only: bool = False


TOOLS: dict[str, ToolDef] = {
    tool.name: tool
    for tool in (
        ToolDef("execute", ExecuteArgs, ToolKind.EXECUTE),
        ToolDef("process_output", ProcessOutputArgs, ToolKind.PROCESS, read_only=True),
        ToolDef("process_signal", ProcessSignalArgs, ToolKind.PROCESS),
        ToolDef("process_list", ProcessListArgs, ToolKind.PROCESS, read_only=True),
        # PROTOCOL.md 9.1. Not read-only: a start row is journaled before the input is written,
        # so a retry after a restart finds it and never types twice.
        ToolDef("process_input", ProcessInputArgs, ToolKind.PROCESS),
        ToolDef("process_resize", ProcessResizeArgs, ToolKind.PROCESS),
        ToolDef("read_file", files.ReadFileArgs, ToolKind.INLINE, read_only=True),
        ToolDef("write_file", files.WriteFileArgs, ToolKind.INLINE),
        ToolDef("edit_files", files.EditFilesArgs, ToolKind.INLINE),
        ToolDef("search_files", files.SearchFilesArgs, ToolKind.THREAD, read_only=True),
    )
}

TOOL_NAMES: list[str] = list(TOOLS)


def lookup(name: str) -> ToolDef:
    tool = TOOLS.get(name)
    if tool is None:
        raise ToolwireError(
            "unknown_tool", f"unknown tool {name!r}; this agent has: {', '.join(TOOL_NAMES)}"
        )
    return tool


def parse_args(tool: ToolDef, args: Any) -> msgspec.Struct:
    """Check args against the tool's schema; ToolwireError(bad_args) names the field."""
    if not isinstance(args, dict):
        raise ToolwireError("bad_args", f"{tool.name}: args must be an object")
    try:
        parsed = msgspec.convert(args, tool.args_type)
    except msgspec.ValidationError as exc:
        raise ToolwireError("bad_args", f"{tool.name}: {_args_path(str(exc))}") from None
    process_id = getattr(parsed, "process_id", None)
    if isinstance(process_id, str) and not process_id.isprintable():
        # An id like the protocol's own (PROTOCOL.md 9.9): printable characters only.
        raise ToolwireError(
            "bad_args",
            f"{tool.name}: `args.process_id` must hold printable characters only "
            "(no control, format or line separator characters, a trailing newline included)",
        )
    if isinstance(parsed, ExecuteArgs):
        try:
            execute.check_args(parsed)
        except ValueError as exc:
            raise ToolwireError("bad_args", f"{tool.name}: {exc}") from None
    if tool.kind in (ToolKind.INLINE, ToolKind.THREAD):
        try:
            files.check_args(parsed)  # type: ignore[arg-type]
        except ValueError as exc:
            raise ToolwireError("bad_args", f"{tool.name}: {exc}") from None
    return parsed


def _args_path(message: str) -> str:
    # msgspec names the path from the root of what it converted: `$.cwd`; say `args.cwd`.
    return message.replace("`$.", "`args.").replace("`$`", "`args`")
