"""The row a chat keeps in the journal for one record: pure data (no trio, no I/O), shared by
the chat's state machine that builds it and the journal that stores it."""

from __future__ import annotations

from typing import Any

import msgspec

from toolwire.actors.results import Result


class JournalRow(msgspec.Struct, kw_only=True):
    """Everything needed to rebuild one record after a restart."""

    chat_id: str
    call_id: str
    state: str  # "awaiting_approval" / "running" / "done" (queued calls are not journaled)
    tool: str | None
    fingerprint: bytes | None
    args: Any = None  # only while the record awaits approval (ChatState._row)
    # The call's own sandbox (SandboxPolicy.to_wire), so a gate approved after a restart runs
    # its command as confined as it was asked to be; None: none was asked.
    sandbox: Any = None
    timeout_ms: int | None = None
    background: bool = False
    approval: bool = False
    turn_id: str | None = None
    result: Result | None = None
    started_at_ms: int | None = None
    touched_at_ms: int = 0
