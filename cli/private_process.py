"""Keep the agent's token out of reach of the commands it runs, beyond their environment.

A command runs as the agent's user, and a process may read much of another process of its own
user: `/proc/<pid>/environ` (the environment the agent was started with, TOOLWIRE_TOKEN
included, whatever the agent later removed from `os.environ`), `/proc/<pid>/mem` (the token in
the agent's heap, where ptrace is allowed), `/proc/<pid>/fd/*`. A command's parent is the agent
(`cat /proc/$PPID/environ`), so this is one command away. `prctl(PR_SET_DUMPABLE, 0)`, what
ssh-agent and gpg-agent do for the same reason, makes all of these root's only; the kernel
resets the flag on `execve`, so the commands themselves stay debuggable. What it costs: no core
dump of the agent, and attaching a debugger or `py-spy` to it needs root.

It does not hide the token file itself: a command can read any file the agent's user can (see
docs/operations.md, "Security"); the sandbox of PROTOCOL.md 10.4 is what confines commands.
"""

from __future__ import annotations

import ctypes
import os
import sys

from toolwire.actors.command_env import AGENT_SECRET_VARIABLES

_PR_SET_DUMPABLE = 4  # <linux/prctl.h>
_PR_GET_DUMPABLE = 3


def forget_secrets(token: str | None) -> list[str]:
    """Remove AGENT_SECRET_VARIABLES and every variable whose value holds `token` from this
    process's environment: from `os.environ` (so nothing the agent, or a library it uses,
    starts later inherits them) and from the memory `/proc/<pid>/environ` shows, where their
    values are overwritten with `*` (an undumpable process still shows that file to root with
    CAP_SYS_PTRACE, and removing a variable does not erase its original bytes). Returns the
    names removed."""
    names = [
        name
        for name, value in os.environ.items()
        if name in AGENT_SECRET_VARIABLES or (token and token in value)
    ]
    if names and sys.platform.startswith("linux"):
        _blank_values(frozenset(os.fsencode(name) for name in names))
    for name in names:
        os.environ.pop(name, None)
    return names


def _blank_values(names: frozenset[bytes]) -> None:
    """Overwrite, in place, the values of the C environment's entries named `names`."""
    libc = ctypes.CDLL(None)
    entries = ctypes.cast(
        ctypes.c_void_p.in_dll(libc, "environ").value, ctypes.POINTER(ctypes.c_void_p)
    )
    i = 0
    while entries and (address := entries[i]) is not None:
        entry = ctypes.string_at(address)
        name, sep, value = entry.partition(b"=")
        if sep and name in names:
            ctypes.memset(address + len(name) + 1, ord("*"), len(value))
        i += 1


def make_undumpable() -> bool | None:
    """Make this process's memory, environment and descriptors unreadable to other processes
    of its user. Returns whether it is now so on Linux; None elsewhere (nothing changes)."""
    if not sys.platform.startswith("linux"):
        return None
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        return False
    return bool(libc.prctl(_PR_GET_DUMPABLE, 0, 0, 0, 0) == 0)
