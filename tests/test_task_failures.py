"""A failure inside one of a command's tasks (its reaper, the SIGTERM or SIGKILL step of its
stop) ends at most that call, and is logged with its chat and call (issue 26): before, the
exception reached the agent's nursery and ended every chat and connection.

The failure is planted in the one step, for one call, around the real function: every other
call's step runs for real, as does everything around it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import pytest
import trio

from tests.conftest import MakeServer
from tests.oswatch import alive
from tests.wsclient import RawConn, is_result, wait_for
from toolwire.actors import chat_work, processes, runners
from toolwire.actors.results import TEXT_AGENT_FAILURE

WAITING = "echo $$; while [ ! -e go ]; do sleep 0.02; done; echo finished"


def failing_for(call_id: str, real: Callable[..., Any]) -> Callable[..., Any]:
    async def step(proc: processes.ProcessRecord, *args: Any) -> Any:
        if proc.process_id == call_id:
            raise OSError(5, "Input/output error")
        return await real(proc, *args)

    return step


async def start(conn: RawConn, chat_id: str, call_id: str, command: str = WAITING) -> int:
    await conn.send({"type": "call", "chat_id": chat_id, "call_id": call_id, "tool": "execute",
                     "args": {"command": command}})  # fmt: skip
    output = await wait_for(conn, lambda m: m["type"] == "output" and m["call_id"] == call_id)
    return int(output["data"].split()[0])


def logged_for(caplog: pytest.LogCaptureFixture, chat_id: str, call_id: str) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno >= logging.ERROR
        and getattr(r, "chat_id", None) == chat_id
        and getattr(r, "call_id", None) == call_id
    ]


async def test_a_reaper_that_fails_ends_its_call_unknown_and_nothing_else(
    make_server: MakeServer, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(processes, "reap", failing_for("x", processes.reap))
    server = await make_server()
    async with server.connect() as conn:
        await start(conn, "c2", "long")
        await conn.send({"type": "call", "chat_id": "c1", "call_id": "x", "tool": "execute",
                         "args": {"command": "exit 3"}})  # fmt: skip
        with trio.fail_after(10):
            result = await wait_for(conn, is_result("x"))
        assert (result["outcome"], result["text"]) == ("unknown", TEXT_AGENT_FAILURE)
        assert any(
            "waiting for the command's exit failed" in m for m in logged_for(caplog, "c1", "x")
        )
        (server.workspace / "go").touch()
        with trio.fail_after(10):
            other = await wait_for(conn, is_result("long"))
        assert other["outcome"] == "completed" and other["output"].endswith("finished\n")
        assert server.agent.failure is None


@pytest.mark.parametrize("step", ["term", "kill"])
async def test_a_stop_step_that_fails_ends_the_canceled_call_and_nothing_else(
    make_server: MakeServer,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    step: str,
) -> None:
    """A cancel's SIGTERM step fails: the stop goes on to SIGKILL and the call is canceled as
    always. Its SIGKILL step fails: the call ends `unknown` (whether its group is gone can no
    longer be known) and the cancel is answered. Either way another chat's command goes on."""
    if step == "term":
        monkeypatch.setattr(runners, "term_group", failing_for("x", runners.term_group))
    else:
        monkeypatch.setattr(runners, "kill_group", failing_for("x", runners.kill_group))
    server = await make_server(kill_grace_s=0.2)
    async with server.connect() as conn:
        await start(conn, "c2", "long")
        pid = await start(conn, "c1", "x", "trap '' TERM; echo $$; while true; do sleep 0.02; done")
        await conn.send({"type": "cancel", "chat_id": "c1", "call_ids": ["x"], "rid": 1})
        with trio.fail_after(10):
            reply = await wait_for(conn, lambda m: m["type"] == "cancel_result")
        what = "SIGTERM" if step == "term" else "killing"
        assert any(what in m for m in logged_for(caplog, "c1", "x"))
        if step == "term":
            assert reply["result"]["outcome"] == "canceled"
            assert not alive(pid), "the SIGKILL step did not follow"
        else:
            assert reply["result"]["outcome"] == "unknown"
            assert reply["result"]["text"] == TEXT_AGENT_FAILURE
        (server.workspace / "go").touch()
        with trio.fail_after(10):
            other = await wait_for(conn, is_result("long"))
        assert other["outcome"] == "completed"
        assert server.agent.failure is None
    if step == "kill" and alive(pid):
        processes.os.kill(pid, 9)  # the planted failure left it: not the agent's any more


# Imported for what the planted failures wrap: a rename there must fail this file loudly.
assert chat_work.processes is processes and chat_work.runners is runners
