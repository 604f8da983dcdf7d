"""The `execute` tool's arguments and how they become a process (PROTOCOL.md 5.2, 8, 9.1-2)."""

from __future__ import annotations

import os
from typing import Annotated, Literal

import msgspec

from toolwire.actors.terminal import (
    DEFAULT_TERM,
    MAX_TERMINAL_SIDE,
    MIN_TERMINAL_SIDE,
    TerminalSize,
)

TerminalSide = Annotated[int, msgspec.Meta(ge=MIN_TERMINAL_SIDE, le=MAX_TERMINAL_SIDE)]


def _described(description: str) -> msgspec.Meta:
    return msgspec.Meta(description=description)


class TerminalArgs(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """`execute`'s `pty`: the size of the command's new terminal (PROTOCOL.md 9.1)."""

    rows: Annotated[TerminalSide, _described("The terminal's height in lines.")]
    cols: Annotated[TerminalSide, _described("The terminal's width in columns.")]


class ExecuteArgs(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    command: Annotated[
        str, msgspec.Meta(min_length=1, description="The shell command line to run.")
    ]
    cwd: Annotated[
        str | None,
        _described("The directory to run in, relative to the workspace; default the workspace."),
    ] = None
    env: Annotated[
        dict[str, str] | None,
        _described("Environment variables to add to the agent's own for this command."),
    ] = None
    shell: Annotated[
        Literal["sh", "bash"] | None, _described('The shell: "sh" (/bin/sh, default) or "bash".')
    ] = None
    # 9.1: stdin is a pipe `process_input` writes to, instead of closed.
    stdin: Annotated[
        bool,
        _described("Give the command an input that process_input writes to (default closed)."),
    ] = False
    # 9.1: run on a new pseudo-terminal of this size (stdin, stdout and stderr). It implies
    # stdin: with it, `stdin` is true whatever it says (false is also what a client that sends
    # every default sends, and cannot be told from an omitted one).
    pty: Annotated[
        TerminalArgs | None,
        _described(
            "Run on a new terminal of this size (for programs that need one); implies stdin."
        ),
    ] = None
    # 9.2: the hard deadline from the first start: the whole group is stopped when it passes.
    # 0 (like `timeout_ms` 0) means none.
    kill_after_ms: Annotated[
        Annotated[int, msgspec.Meta(ge=0)] | None,
        _described(
            "Stop the command's whole process group this many ms after it started; 0 or"
            " absent: never."
        ),
    ] = None


SHELLS = {"sh": "/bin/sh", "bash": "/bin/bash"}


def check_args(args: ExecuteArgs) -> None:
    """Refuse what no process can be started with (the kernel takes C strings): a NUL
    character in the command, cwd or env, and an env name that is empty or holds `=`. Raises
    ValueError naming the field, so the call is `bad_args` before it is accepted, instead of
    failing inside the agent after it was."""
    if "\0" in args.command:
        raise ValueError("`args.command` must not contain a NUL character")
    if args.cwd is not None and "\0" in args.cwd:
        raise ValueError("`args.cwd` must not contain a NUL character")
    for name, value in (args.env or {}).items():
        if not name or "=" in name or "\0" in name:
            raise ValueError(f"`args.env` name {name!r} must be non-empty, without `=` or NUL")
        if "\0" in value:
            raise ValueError(f"`args.env.{name}` must not contain a NUL character")


def argv_for(args: ExecuteArgs) -> list[str]:
    return [SHELLS[args.shell or "sh"], "-c", args.command]


def cwd_for(args: ExecuteArgs, workspace: str) -> str:
    if not args.cwd:
        return workspace
    return os.path.join(workspace, os.path.expanduser(args.cwd))


def env_for(args: ExecuteArgs, base: dict[str, str]) -> dict[str, str]:
    env = dict(base)
    if args.pty is not None:
        # The terminal's own type, not whatever the agent was started under (PROTOCOL.md 9.1):
        # only the call's `env` names another.
        env["TERM"] = DEFAULT_TERM
    if args.env:
        env.update(args.env)
    return env


def stdin_for(args: ExecuteArgs) -> bool:
    """Whether the command gets an input `process_input` can write to."""
    return args.stdin or args.pty is not None


def terminal_for(args: ExecuteArgs) -> TerminalSize | None:
    """The size of the command's terminal, or None without `pty`."""
    return None if args.pty is None else TerminalSize(args.pty.rows, args.pty.cols)
