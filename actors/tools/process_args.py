"""The arguments of the process tools (PROTOCOL.md 8): pure types, so that the registry and
the chat's state machine can parse a call without importing the runners (which need trio)."""

from __future__ import annotations

from typing import Annotated, Literal, Protocol

import msgspec

from toolwire.actors.tools.execute import TerminalSide

SignalName = Literal["SIGINT", "SIGTERM", "SIGKILL", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2"]
ProcessId = Annotated[
    str,
    msgspec.Meta(
        min_length=1,
        description="The process_id of a command this chat started (its execute call's id).",
    ),
]
WaitMs = Annotated[int, msgspec.Meta(ge=0)]


def _described(description: str) -> msgspec.Meta:
    return msgspec.Meta(description=description)


class ProcessOutputArgs(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    process_id: ProcessId
    wait: Annotated[bool, _described("Wait for the process to exit first (up to wait_ms).")] = False
    wait_ms: Annotated[
        WaitMs | None,
        _described("How long to wait with `wait`, in ms; default and at most max_wait_ms."),
    ] = None


class ProcessSignalArgs(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    process_id: ProcessId
    signal: Annotated[SignalName, _described("The signal to send to the process's group.")]


class ProcessListArgs(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    pass


class ProcessInputArgs(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    process_id: ProcessId
    data: Annotated[str, _described("The text to write, as UTF-8; may be empty (with eof alone).")]
    eof: Annotated[bool, _described("Close the process's input after data.")] = False
    # Capped at limits.max_wait_ms, as process_output's wait is.
    wait_ms: Annotated[
        WaitMs,
        _described("How long to wait for output or exit after the write, in ms; default 0."),
    ] = 0


class ProcessResizeArgs(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    process_id: ProcessId
    rows: Annotated[TerminalSide, _described("The terminal's new height in lines.")]
    cols: Annotated[TerminalSide, _described("The terminal's new width in columns.")]


class _WithProcessId(Protocol):
    @property
    def process_id(self) -> str: ...


def check_process_id(args: _WithProcessId) -> None:
    """An id like the protocol's own (PROTOCOL.md 9.9): printable characters only."""
    if not args.process_id.isprintable():
        raise ValueError(
            "`args.process_id` must hold printable characters only "
            "(no control, format or line separator characters, a trailing newline included)"
        )
