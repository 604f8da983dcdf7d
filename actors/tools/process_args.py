"""The arguments of the process tools (PROTOCOL.md 8): pure types, so that the registry and
the chat's state machine can parse a call without importing the runners (which need trio)."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from toolwire.actors.tools.execute import TerminalSide

SignalName = Literal["SIGINT", "SIGTERM", "SIGKILL", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2"]
ProcessId = Annotated[str, msgspec.Meta(min_length=1)]


class ProcessOutputArgs(msgspec.Struct, kw_only=True):
    process_id: ProcessId
    wait: bool = False
    wait_ms: Annotated[int, msgspec.Meta(ge=0)] | None = None


class ProcessSignalArgs(msgspec.Struct, kw_only=True):
    process_id: ProcessId
    signal: SignalName


class ProcessListArgs(msgspec.Struct, kw_only=True):
    pass


class ProcessInputArgs(msgspec.Struct, kw_only=True):
    process_id: ProcessId
    data: str  # written as UTF-8; may be empty (an `eof` alone)
    eof: bool = False
    # Capped at limits.max_wait_ms, as process_output's wait is.
    wait_ms: Annotated[int, msgspec.Meta(ge=0)] = 0


class ProcessResizeArgs(msgspec.Struct, kw_only=True):
    process_id: ProcessId
    rows: TerminalSide
    cols: TerminalSide
