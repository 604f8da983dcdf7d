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
