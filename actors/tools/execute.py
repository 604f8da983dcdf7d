"""The `execute` tool's arguments and how they become a process (PROTOCOL.md 5.2, 8)."""

from __future__ import annotations

import os
from typing import Annotated, Literal

import msgspec


class ExecuteArgs(msgspec.Struct, kw_only=True):
    command: Annotated[str, msgspec.Meta(min_length=1)]
    cwd: str | None = None
    env: dict[str, str] | None = None
    shell: Literal["sh", "bash"] | None = None


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
    if args.env:
        env.update(args.env)
    return env
