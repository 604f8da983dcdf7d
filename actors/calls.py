"""A tool call as requested (`CallSpec`), and the two small rules about call ids and tool
names that every request path shares. Pure: no trio, no I/O."""

from __future__ import annotations

from typing import Any

import msgspec

from toolwire.actors.records import ToolCallRecord, args_fingerprint
from toolwire.actors.results import ToolwireError
from toolwire.actors.sandbox_policy import SandboxPolicy, combined_fingerprint
from toolwire.actors.tools.registry import TOOLS


def shared_tool_name(name: str) -> str:
    """The registry's own string for a known tool name: a record keeps it for as long as it
    lives, and a name decoded from a request or a journal row is a new string each time (about
    60 bytes per record, 100,000 records)."""
    tool = TOOLS.get(name)
    return tool.name if tool is not None else name


class CallSpec(msgspec.Struct, frozen=True):
    """A tool call as requested (a `call` message, or one call of a `turn`). A Struct, not a
    frozen dataclass: one is made per call, and msgspec builds it in C (a frozen dataclass's
    `__init__` runs Python bytecode and an `object.__setattr__` per field)."""

    call_id: str
    tool: str
    args: Any
    timeout_ms: int | None = None
    background: bool = False
    approval: bool = False
    # `args_fingerprint(tool, args)` where the transport computed it already, off the event
    # loop (a big message: `transport/big_messages.py`); None: ChatState computes it.
    args_fingerprint: bytes | None = None
    # The call's own `sandbox` (PROTOCOL.md 10.4), before the agent's floor; None: none asked.
    sandbox: SandboxPolicy | None = None

    def fingerprint(self) -> bytes:
        """What a repeat of this call must match: its args' fingerprint
        (`records.args_fingerprint`) and its sandbox (a repeat with another is a conflict)."""
        if self.args_fingerprint is not None:
            return combined_fingerprint(self.args_fingerprint, self.sandbox)
        return combined_fingerprint(args_fingerprint(self.tool, self.args), self.sandbox)


def conflict_error(record: ToolCallRecord) -> ToolwireError:
    """A call id reused with another tool or other args: refused, never run as the first."""
    return ToolwireError(
        "conflict",
        f"call_id {record.call_id!r} was first used with tool {record.tool!r} and other "
        "args or another sandbox; a retry must repeat the same tool, args and sandbox, a new "
        "call needs a new id",
    )
