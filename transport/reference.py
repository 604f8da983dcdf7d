"""Generates the message reference of docs/protocol.md from the Structs in protocol.py.

The hand-written parts of docs/protocol.md explain; the generated part (between the markers)
lists every message and field exactly as the code defines them, with a JSON example of each that
is decoded by the real decoders, so neither can drift from the code. `toolwire schema --doc`
rewrites it; tests/test_protocol_doc.py fails when it is stale.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
import msgspec.inspect as mi

from toolwire.actors import planner
from toolwire.actors.tools import registry
from toolwire.transport import protocol
from toolwire.transport.tool_definitions import definition

BEGIN = "<!-- BEGIN GENERATED MESSAGE REFERENCE: edit transport/reference.py, not this part -->"
END = "<!-- END GENERATED MESSAGE REFERENCE -->"

_RESULT = {
    "tool": "execute",
    "outcome": "completed",
    "text": "command exited with code 0",
    "data": {"exit_code": 0, "signal": None, "process_id": "call-1"},
    "output": "hello\n",
    "output_bytes": 6,
    "truncated_bytes": 0,
    "timed_out": False,
    "canceled": False,
    "started_at": 1764460800000,
    "finished_at": 1764460800012,
    "wall_ms": 12,
}
_NOT_RUN = _RESULT | {
    "outcome": "not_run",
    "text": "tool call was canceled before it ran; no changes were made",
    "data": None,
    "output": "",
    "output_bytes": 0,
    "canceled": True,
    "started_at": None,
    "wall_ms": None,
}

EXAMPLES: dict[str, dict[str, Any]] = {
    "call": {
        "type": "call",
        "rid": 1,
        "chat_id": "chat-7",
        "call_id": "call-1",
        "tool": "execute",
        "args": {"command": "echo hello", "cwd": "src"},
        "timeout_ms": 60000,
        "sandbox": {"filesystem": "workspace_write", "writable": ["/srv/cache"], "network": False},
    },
    "attach": {"type": "attach", "chat_id": "chat-7", "call_id": "call-1", "from_offset": 6},
    "detach": {"type": "detach", "chat_id": "chat-7", "call_id": "call-1"},
    "cancel": {"type": "cancel", "rid": 2, "chat_id": "chat-7", "call_ids": ["call-1", "call-2"]},
    "approve": {
        "type": "approve",
        "chat_id": "chat-7",
        "call_id": "call-3",
        "approved": False,
        "reason": "not on main",
    },
    "turn": {
        "type": "turn",
        "chat_id": "chat-7",
        "turn_id": "turn-1",
        "calls": [
            {"call_id": "r1", "tool": "read_file", "args": {"path": "a.py"}},
            {"call_id": "w1", "tool": "write_file", "args": {"path": "a.py", "content": "x = 1\n"}},
        ],
    },
    "interrupt": {"type": "interrupt", "rid": 3, "chat_id": "chat-7", "turn_id": "turn-1"},
    "close_chat": {"type": "close_chat", "rid": 4, "chat_id": "chat-7"},
    "describe_tools": {"type": "describe_tools", "rid": 5},
    "tool_definitions": {
        "type": "tool_definitions",
        "rid": 5,
        "tools": [
            msgspec.to_builtins(definition("process_list")),
            msgspec.to_builtins(definition("read_file")),
        ],
    },
    "welcome": {
        "type": "welcome",
        "protocol": 1,
        "agent_id": "toolwire-host1",
        "boot_id": "0b7c3f0e-2c1d-4f57-9d2f-0f6c4f1b9a10",
        "encoding": "json",
        # The registry's tools, in its order (tests/test_protocol_doc.py checks it against a
        # live agent's welcome).
        "tools": list(registry.TOOL_NAMES),
        "limits": {
            "max_message_bytes": 16777216,
            "output_retention_bytes": 1048576,
            "result_output_bytes": 65536,
            "max_wait_ms": 300000,
            "forget_after_s": 3600,
            "exited_retention_s": 3600,
            "max_processes_per_chat": 64,
            "kill_grace_ms": 2000,
            "max_ids_per_request": 1000,
            "max_records": 100000,
            "max_processes": 256,
            "max_message_bytes_in_flight": 67108864,
            "sandbox": {"filesystem": True, "network": True},
        },
        "features": [*protocol.FEATURES, "sandbox"],
    },
    "chat_closed": {
        "type": "chat_closed",
        "rid": 4,
        "chat_id": "chat-7",
        "call_ids": ["call-1"],
        "process_ids": ["call-1", "server"],
    },
    "accepted": {
        "type": "accepted",
        "rid": 1,
        "chat_id": "chat-7",
        "call_id": "call-1",
        "replay": False,
        "state": "running",
        "requests": 1,
    },
    "approval": {
        "type": "approval",
        "chat_id": "chat-7",
        "call_id": "call-3",
        "tool": "write_file",
        "args": {"path": "a.py", "content": "x = 2\n"},
        "turn_id": "turn-1",
    },
    "approval_resolved": {
        "type": "approval_resolved",
        "chat_id": "chat-7",
        "call_id": "call-3",
        "decision": "denied",
    },
    "started": {
        "type": "started",
        "chat_id": "chat-7",
        "call_id": "call-1",
        "started_at": 1764460800000,
        "pid": 4242,
    },
    "output": {
        "type": "output",
        "chat_id": "chat-7",
        "call_id": "call-1",
        "offset": 0,
        "data": "hello\n",
    },
    "result": {"type": "result", "chat_id": "chat-7", "call_id": "call-1"} | _RESULT,
    "cancel_result": {
        "type": "cancel_result",
        "rid": 2,
        "chat_id": "chat-7",
        "call_id": "call-2",
        "received": False,
        "result": _NOT_RUN | {"tool": ""},
    },
    "turn_plan": {
        "type": "turn_plan",
        "chat_id": "chat-7",
        "turn_id": "turn-1",
        "segments": [["r1"], ["w1"]],
    },
    "turn_result": {
        "type": "turn_result",
        "chat_id": "chat-7",
        "turn_id": "turn-1",
        "results": [
            _RESULT | {"tool": "read_file", "text": "read 1 of 1 line of a.py"},
            _RESULT | {"tool": "write_file", "text": "wrote 6 bytes to a.py"},
        ],
    },
    "interrupted": {
        "type": "interrupted",
        "rid": 3,
        "chat_id": "chat-7",
        "turn_id": "turn-1",
        "call_ids": ["w1"],
    },
    "error": {
        "type": "error",
        "code": "bad_message",
        "message": "Expected `str`, got `int` - at `$.call_id`",
        "rid": 4,
        "chat_id": "chat-7",
    },
}


def _render_type(t: mi.Type) -> str:
    match t:
        case mi.Metadata():
            rendered = _render_type(t.type)
            if (t.extra or {}).get("printable"):
                rendered = (
                    rendered[:-1] + ", printable)"
                    if rendered.endswith(")")
                    else (rendered + " (printable)")
                )
            return rendered
        case mi.StrType():
            bits = []
            if t.min_length is not None or t.max_length is not None:
                bits.append(f"{t.min_length or 0}..{t.max_length if t.max_length else ''} chars")
            if t.pattern is not None:
                bits.append(f"matching {t.pattern}")
            return "string" + (f" ({', '.join(bits)})" if bits else "")
        case mi.IntType():
            bounds = [f">= {t.ge}"] if t.ge is not None else []
            bounds += [f"<= {t.le}"] if t.le is not None else []
            return " ".join(["integer", *bounds])
        case mi.BoolType():
            return "boolean"
        case mi.NoneType():
            return "null"
        case mi.AnyType():
            return "any"
        case mi.LiteralType():
            return " / ".join(json.dumps(v) for v in t.values)
        case mi.ListType():
            return f"list of {_render_type(t.item_type)}"
        case mi.DictType():
            return "object"
        case mi.StructType():
            return f"`{t.cls.__name__}` object"
        case mi.UnionType():
            return " or ".join(_render_type(x) for x in t.types)
    return type(t).__name__


def _default(f: mi.Field) -> Any:
    return f.default_factory() if f.default is msgspec.NODEFAULT else f.default


def _table(cls: type[msgspec.Struct]) -> list[str]:
    info = mi.type_info(cls)
    assert isinstance(info, mi.StructType)
    lines = ["| field | type | required |", "|---|---|---|"]
    if info.tag_field is not None:
        lines.append(f"| `{info.tag_field}` | {json.dumps(info.tag)} | yes |")
    for f in info.fields:
        required = "yes" if f.required else f"no (default `{json.dumps(_default(f))}`)"
        lines.append(f"| `{f.encode_name}` | {_render_type(f.type)} | {required} |")
    return lines


def _example(tag: str, cls: type[msgspec.Struct], union: Any) -> list[str]:
    example = EXAMPLES[tag]
    # Decoding proves the example is valid for the real decoder of its direction.
    decoded = msgspec.json.decode(json.dumps(example), type=union)
    assert isinstance(decoded, cls), (tag, decoded)
    return ["```json", json.dumps(example), "```"]


def render() -> str:
    out = [BEGIN, ""]
    sections = [
        ("Client -> agent messages", protocol.CLIENT_MESSAGE_TYPES, protocol.ClientMessage),
        ("Agent -> client messages", protocol.AGENT_MESSAGE_TYPES, protocol.AgentMessage),
    ]
    for title, classes, union in sections:
        out += [f"### {title}", ""]
        for cls in classes:
            info = mi.type_info(cls)
            assert isinstance(info, mi.StructType)
            tag = str(info.tag)
            out += [f"#### `{tag}`", "", *_table(cls), "", *_example(tag, cls, union), ""]
    out += ["### Nested objects", ""]
    for cls in (
        protocol.CallSpec,
        protocol.Result,
        protocol.Limits,
        protocol.Sandbox,
        protocol.SandboxLimits,
        protocol.ToolDefinition,
    ):
        out += [f"#### `{cls.__name__}`", "", *_table(cls), ""]
    out += _tools()
    out.append(END)
    return "\n".join(out)


_ROLES = {
    planner.Access.READ: "a reader of",
    planner.Access.WRITE: "a writer of",
}


def _role(reserves: planner.Reserves) -> str:
    """A tool's role in a turn (PROTOCOL.md 5.6) in words."""
    if reserves.access is planner.Access.BARRIER:
        return "a barrier (runs alone)"
    if reserves.access is planner.Access.NONE:
        return "reserves nothing"
    what = f"`{reserves.path_arg}`"
    if reserves.each_in is not None:
        what = f"every `{reserves.each_in}[].{reserves.path_arg}`"
    if reserves.default_path is not None:
        what += " (default the workspace)"
    return f"{_ROLES[reserves.access]} {what}"


def _tools() -> list[str]:
    """Every tool of the registry: its effect, role, description and args (the
    `input_schema` that `describe_tools` sends, PROTOCOL.md 10.3)."""
    out = ["### Tools", "", "Generated from the tool registry (actors/tools/registry.py).", ""]
    for tool in registry.TOOLS.values():
        out += [
            f"#### `{tool.name}`",
            "",
            f"Effect `{tool.effect}`; in a turn {_role(tool.reserves)}.",
            "",
            f"> {tool.description}",
            "",
            "| argument | type | required | description |",
            "|---|---|---|---|",
        ]
        info = mi.type_info(tool.args_type)
        assert isinstance(info, mi.StructType)
        properties = registry.input_schema(tool)["properties"]
        for f in info.fields:
            required = "yes" if f.required else f"no (default `{json.dumps(_default(f))}`)"
            described = str(properties[f.encode_name]["description"]).replace("|", "\\|")
            out.append(f"| `{f.encode_name}` | {_render_type(f.type)} | {required} | {described} |")
        if not info.fields:
            out.append("| (none) | | | |")
        out.append("")
    return out


def update(path: Path) -> bool:
    """Rewrite the generated part of `path`; True if it changed."""
    text = path.read_text()
    start, end = text.index(BEGIN), text.index(END) + len(END)
    new = text[:start] + render() + text[end:]
    if new != text:
        path.write_text(new)
        return True
    return False
