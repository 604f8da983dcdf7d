"""An agent in which every look at a process group fails, run by tests/test_group_lost.py in a
process of its own: `python -m tests.refused_group_probe WORKSPACE` prints one JSON line.

The look is `kill(-pgid, 0)` (`killpg(pgid, 0)`: is any member of the group left?), which the
shell takes before it watches a spent group or stops what lingers of one. Here the kernel
refuses it: a seccomp filter, installed before the agent starts, makes exactly that call fail
with ENOSYS, as a sandbox that does not implement it would (gVisor answers ENOSYS for the calls
it lacks). Signals that are sent for real (SIGTERM, SIGKILL) go through. No product code is
replaced: the shell meets the failure where it would meet it in such a sandbox, on the loop,
while carrying out the effect, which is what `GroupLost` is for.

A filter is for good and is inherited by every thread and process started after it, which is
why this runs in a process of its own and never in the test process.
"""

from __future__ import annotations

import ctypes
import errno
import json
import logging
import os
import platform
import struct
import sys
from pathlib import Path
from typing import Any

import trio
import trio.testing

from tests import wsclient
from toolwire.actors.agent import Agent, AgentContext
from toolwire.transport.server import Server, ServerConfig

TOKEN = "refused-group-probe"
CHAT = "c"
# A shutdown that waits for a report that never comes waits forever: this bounds the wait, so
# the test fails (the child exits 1 naming it) instead of hanging.
SHUTDOWN_LIMIT_S = 20.0

# <linux/seccomp.h>, <linux/filter.h>, <linux/audit.h>: the filter's few instructions.
_PR_SET_NO_NEW_PRIVS = 38
_PR_SET_SECCOMP = 22
_SECCOMP_MODE_FILTER = 2
_RET_ALLOW = 0x7FFF0000
_RET_ERRNO = 0x00050000
_LD_W_ABS, _JEQ_K, _RET_K = 0x20, 0x15, 0x06
# struct seccomp_data: nr at 0, arch at 4, args[i] at 16 + 8 i (low word first).
_NR, _ARCH, _ARG1 = 0, 4, 24
_KILL = {"x86_64": (0xC000003E, 62), "aarch64": (0xC00000B7, 129)}


def refuse_group_probes() -> None:
    """From now on, in this process, `kill(pid, 0)` fails with ENOSYS; other signals go."""
    arch, kill_nr = _KILL[platform.machine()]
    program = [
        (_LD_W_ABS, 0, 0, _ARCH),
        (_JEQ_K, 0, 4, arch),  # another architecture: allowed
        (_LD_W_ABS, 0, 0, _NR),
        (_JEQ_K, 0, 2, kill_nr),  # not kill(2): allowed
        (_LD_W_ABS, 0, 0, _ARG1),
        (_JEQ_K, 1, 0, 0),  # signal 0: refused
        (_RET_K, 0, 0, _RET_ALLOW),
        (_RET_K, 0, 0, _RET_ERRNO | errno.ENOSYS),
    ]
    code = b"".join(struct.pack("=HBBI", *line) for line in program)
    buffer = ctypes.create_string_buffer(code, len(code))

    class Fprog(ctypes.Structure):
        _fields_ = (("len", ctypes.c_ushort), ("filter", ctypes.c_void_p))

    prctl = ctypes.CDLL(None, use_errno=True).prctl
    fprog = Fprog(len(program), ctypes.cast(buffer, ctypes.c_void_p))
    if prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) or prctl(
        _PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0
    ):
        raise OSError(ctypes.get_errno(), "installing the seccomp filter")


class _Failures(logging.Handler):
    """The shell's log lines of effects it could not carry out."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage().startswith("carrying out"):
            self.lines.append(record.getMessage())


async def _gone(pid: int) -> None:
    """Wait until `pid` has exited (a pidfd is readable then), however long that takes."""
    pidfd = os.pidfd_open(pid)
    try:
        await trio.lowlevel.wait_readable(pidfd)
    finally:
        os.close(pidfd)


def _leave_child(pidfile: str) -> str:
    """A command that starts `sleep 300` in its group, writes its pid to `pidfile`, and exits
    only once the child has let go of the output pipe: the child's redirection runs after its
    fork, and a shell that exited first would leave the output open for a moment after the
    call's result, when the probe looks whether the group is spent."""
    return (
        f"sleep 300 >/dev/null 2>&1 & echo $! > {pidfile}; "
        'while [ "$(readlink /proc/$!/fd/2)" != /dev/null ]; do :; done'
    )


async def probe(workspace: Path) -> dict[str, Any]:
    failures = _Failures()
    logging.getLogger("toolwire.chat").addHandler(failures)
    # Each command leaves a child that holds none of its output: its group is spent (shell
    # exited, output ended) while the child lives on. `watched` is watched at once; `deadline`
    # is not (its hard deadline, far ahead, keeps it) and is stopped by the shutdown.
    commands = {
        "watched": {"command": _leave_child("watched.pid")},
        "deadline": {"command": _leave_child("deadline.pid"), "kill_after_ms": 3_600_000},
    }
    report: dict[str, Any] = {}
    async with trio.open_nursery() as nursery:
        agent = await nursery.start(Agent(AgentContext(workspace=str(workspace))).run)
        server = Server(agent, ServerConfig(host="127.0.0.1", port=0, token=TOKEN))
        port = await nursery.start(server.serve)
        async with wsclient.connect(f"ws://127.0.0.1:{port}/v1", TOKEN) as conn:
            for call_id, args in commands.items():
                result = await conn.call(CHAT, call_id, "execute", args)
                report[call_id] = {
                    "outcome": result["outcome"],
                    "exit_code": result["data"]["exit_code"],
                    "child": int((workspace / f"{call_id}.pid").read_text()),
                }
            # The watch failed at once and the group got its SIGKILL: the child is gone (or,
            # if nothing kills it, this fails naming the wait).
            with trio.fail_after(SHUTDOWN_LIMIT_S):
                await _gone(report["watched"]["child"])
            await trio.testing.wait_all_tasks_blocked()
            groups = agent.chats[CHAT].state.groups
            report["deadline_group_spent"] = "deadline" in groups and groups["deadline"].spent
        report["failures_before_shutdown"] = list(failures.lines)
        with trio.fail_after(SHUTDOWN_LIMIT_S):
            await server.shutdown()
        report["failures"] = failures.lines
        report["chat_groups_left"] = sorted(agent.chats[CHAT].state.groups)
        nursery.cancel_scope.cancel()
    return report


def main() -> None:
    refuse_group_probes()
    try:
        os.killpg(os.getpgrp(), 0)
    except OSError as exc:
        assert exc.errno == errno.ENOSYS, exc
    else:
        raise AssertionError("the filter let kill(pgid, 0) through")
    report = trio.run(probe, Path(sys.argv[1]))
    print(json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
