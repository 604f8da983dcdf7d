"""PROTOCOL.md 5.0-5.4 and section 7 through a real server, real sockets and real processes.

Every test speaks the wire protocol with the independent client of tests/wsclient.py (or, for the
stalled connection, a raw socket that never reads). Waiting is always on a protocol message,
never on a sleep; the only polls are of the OS process table, which sends no messages. The last
tests drive the `Agent` directly with in-memory outboxes, where MockClock can make hours pass.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import socket
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
import wsproto
import wsproto.events

from tests.conftest import TOKEN, LiveServer, MakeServer
from tests.oswatch import alive
from tests.wsclient import Message, RawConn, messages, of, streamed, wait_for
from toolwire.actors.agent import Agent, AgentContext, Limits
from toolwire.actors.chat import CallSpec
from toolwire.actors.events import (
    AcceptedEvent,
    CancelResultEvent,
    Event,
    OutputEvent,
    ResultEvent,
    StartedEvent,
)
from toolwire.actors.outbox import Outbox
from toolwire.actors.processes import ExitStatus
from toolwire.actors.results import (
    TEXT_AGENT_FAILURE,
    TEXT_CANCELED_BEFORE_RUN,
    TEXT_CANCELED_WHILE_RUNNING,
    Outcome,
    ToolwireError,
)
from toolwire.actors.tools import registry

# Every test ends well within this; a hang fails instead of blocking the suite.
TEST_DEADLINE_S = 10.0

NOT_RUN_TEXT = "tool call was canceled before it ran; no changes were made"
CANCELED_TEXT = "tool call was canceled while running"
FAILURE_TEXT = "tool call failed inside the agent; its outcome is unknown"


def test_section_7_texts_are_exact() -> None:
    # The literal strings of PROTOCOL.md 7: the tests below compare against these literals.
    assert TEXT_CANCELED_BEFORE_RUN == NOT_RUN_TEXT
    assert TEXT_CANCELED_WHILE_RUNNING == CANCELED_TEXT
    assert TEXT_AGENT_FAILURE == FAILURE_TEXT


# --- helpers --------------------------------------------------------------------------------------


def call_msg(chat_id: str, call_id: str, tool: str, args: Any, **extra: Any) -> Message:
    return {
        "type": "call",
        "chat_id": chat_id,
        "call_id": call_id,
        "tool": tool,
        "args": args,
    } | extra


def execute(chat_id: str, call_id: str, command: str, **extra: Any) -> Message:
    return call_msg(chat_id, call_id, "execute", {"command": command}, **extra)


def fields(message: Message) -> dict[str, Any]:
    """A result message's Result fields (what is saved and replayed)."""
    return {k: v for k, v in message.items() if k not in ("type", "chat_id", "call_id")}


def same_bytes(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return json.dumps(a) == json.dumps(b)


async def output_containing(conn: RawConn, call_id: str, text: str) -> None:
    """Wait until the call's streamed output so far contains `text`."""
    while text not in "".join(m["data"] for m in messages(conn, call_id, "output")):
        await conn.recv()


async def cancel(conn: RawConn, chat_id: str, call_id: str) -> Message:
    await conn.send({"type": "cancel", "chat_id": chat_id, "call_ids": [call_id]})
    return (await conn.recv_until(of("cancel_result", call_id)))[-1]


async def tool(conn: RawConn, chat_id: str, call_id: str, name: str, **args: Any) -> Message:
    result = await conn.call(chat_id, call_id, name, args)
    assert result["type"] == "result", result
    return result


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes of a process group."""
    members = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                rest = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(rest[2]) == pgid and rest[0] != "Z":
            members.append(int(name))
    return members


async def gone(check: Callable[[], bool], timeout_s: float = 5.0) -> bool:
    """Poll the OS process table (which sends no message to await) until `check` holds."""
    with trio.move_on_after(timeout_s):
        while not check():  # noqa: ASYNC110 (the process table has no event to await)
            await trio.sleep(0.02)
        return True
    return False


# --- 5.1: at most once ----------------------------------------------------------------------------


async def test_concurrent_repeats_from_two_connections_run_once(live: LiveServer) -> None:
    command = "echo x >> marker; sleep 0.2; echo ran"
    with trio.fail_after(TEST_DEADLINE_S):
        async with live.connect() as a, live.connect(encoding="msgpack") as b:
            await a.send(execute("c", "once", command))
            await b.send(execute("c", "once", command))
            ra = await wait_for(a, of("result", "once"))
            rb = await wait_for(b, of("result", "once"))
            async with live.connect() as late:
                rc = await late.call("c", "once", "execute", {"command": command})
                late_accepted = messages(late, "once", "accepted")
                late_types = [m["type"] for m in messages(late, "once")]
    assert (live.workspace / "marker").read_text() == "x\n"  # the command ran exactly once
    assert ra["outcome"] == "completed" and ra["output"] == "ran\n"
    assert same_bytes(fields(ra), fields(rb)) and same_bytes(fields(ra), fields(rc))
    accepted = messages(a, "once", "accepted") + messages(b, "once", "accepted")
    assert len(accepted) == 2
    assert sorted((m["replay"], m["requests"]) for m in accepted) == [(False, 1), (True, 2)]
    assert {m["state"] for m in accepted} == {"running"}
    # Both connections follow the one run: each sees it start once and stream all its output.
    for conn in (a, b):
        assert len(messages(conn, "once", "started")) == 1
        assert len(messages(conn, "once", "result")) == 1
        assert streamed(conn, "once") == "ran\n"
    # A repeat after the end gets `accepted` and the saved result only.
    assert late_accepted == [
        {
            "type": "accepted",
            "chat_id": "c",
            "call_id": "once",
            "replay": True,
            "state": "done",
            "requests": 3,
        }
    ]
    assert late_types == ["accepted", "result"]


async def test_conflict_is_refused_and_leaves_the_record_untouched(live: LiveServer) -> None:
    args = {"command": "echo one >> marker"}
    with trio.fail_after(TEST_DEADLINE_S):
        async with live.connect() as conn:
            first = await conn.call("c", "k", "execute", args)
            other_args = await conn.call("c", "k", "execute", {"command": "echo two >> marker"})
            other_tool = await conn.call("c", "k", "read_file", {"path": "marker"})
            again = await conn.call("c", "k", "execute", args)
    for error in (other_args, other_tool):
        assert error["type"] == "error" and error["code"] == "conflict"
        assert error["call_id"] == "k" and error["chat_id"] == "c"
    assert (live.workspace / "marker").read_text() == "one\n"
    accepted = messages(conn, "k", "accepted")
    # The refused requests were not counted: the repeat is the record's second request.
    assert [(m["replay"], m["requests"]) for m in accepted] == [(False, 1), (True, 2)]
    assert same_bytes(fields(first), fields(again))


async def test_errors_change_no_record(live: LiveServer) -> None:
    with trio.fail_after(TEST_DEADLINE_S):
        async with live.connect() as conn:
            bad = await conn.call(
                "c", "bg", "execute", {"command": "echo hi"}, background=True, timeout_ms=100
            )
            attach = {"type": "attach", "chat_id": "c", "call_id": "nope", "rid": 7}
            await conn.send(attach)
            unknown = await conn.recv()
            good = await conn.call("c", "bg", "execute", {"command": "echo hi"})
    assert bad["type"] == "error" and bad["code"] == "bad_args"
    assert unknown["type"] == "error" and unknown["code"] == "unknown_call"
    assert unknown["rid"] == 7 and unknown["call_id"] == "nope"
    # The refused call left nothing behind: the same id now runs as a new call.
    assert good["outcome"] == "completed" and good["output"] == "hi\n"
    assert [m["replay"] for m in messages(conn, "bg", "accepted")] == [False]


async def test_repeated_call_on_one_connection_resends_output_from_zero(live: LiveServer) -> None:
    command = "printf 'first\\n'; sleep 0.3; printf 'second\\n'"
    with trio.fail_after(TEST_DEADLINE_S):
        async with live.connect() as conn:
            await conn.send(execute("c", "rep", command))
            await output_containing(conn, "rep", "first")
            await conn.send(execute("c", "rep", command))
            await conn.recv_until(lambda m: len(messages(conn, "rep", "result")) == 2)
    mine = messages(conn, "rep")
    kinds = [m["type"] for m in mine]
    assert kinds.count("accepted") == 2 and kinds.count("result") == 2
    assert kinds.count("started") == 1
    assert kinds[0] == "accepted" and kinds[-1] == "result"
    offsets = [m["offset"] for m in mine if m["type"] == "output"]
    assert offsets[0] == 0 and 0 in offsets[1:]  # the cursor went back to 0 and resent
    assert streamed(conn, "rep") == "first\nsecond\n"
    results = messages(conn, "rep", "result")
    assert same_bytes(fields(results[0]), fields(results[1]))


async def test_internal_failure_becomes_unknown_and_the_chat_goes_on(
    live: LiveServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    (live.workspace / "f.txt").write_text("hello\n")

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("injected fault")

    with trio.fail_after(TEST_DEADLINE_S):
        async with live.connect() as conn:
            # The tool's own code fails: its registry entry runs the broken function.
            monkeypatch.setitem(
                registry.TOOLS,
                "read_file",
                dataclasses.replace(registry.TOOLS["read_file"], run=registry.OnLoop(broken)),
            )
            failed = await conn.call("c", "boom", "read_file", {"path": "f.txt"})
            monkeypatch.undo()
            ok = await conn.call("c", "fine", "read_file", {"path": "f.txt"})
            repeat = await conn.call("c", "boom", "read_file", {"path": "f.txt"})
            canceled = await cancel(conn, "c", "boom")
    assert failed["outcome"] == "unknown" and failed["text"] == FAILURE_TEXT
    assert failed["started_at"] is not None  # it had started: its outcome really is unknown
    assert ok["outcome"] == "completed" and ok["data"]["content"] == "hello\n"
    # Repeats and cancels get the saved unknown result; they never wait forever.
    assert same_bytes(fields(failed), fields(repeat))
    assert canceled["received"] is True and same_bytes(canceled["result"], fields(failed))


# --- 5.3: cancel ----------------------------------------------------------------------------------


async def test_cancel_before_run_refuses_a_later_call(live: LiveServer) -> None:
    with trio.fail_after(TEST_DEADLINE_S):
        async with live.connect() as conn:
            first = await cancel(conn, "c", "early")
            later = await conn.call("c", "early", "execute", {"command": "echo x >> marker"})
            again = await cancel(conn, "c", "early")
    assert first["received"] is False
    saved = first["result"]
    assert saved["outcome"] == "not_run" and saved["text"] == NOT_RUN_TEXT
    assert saved["started_at"] is None and saved["wall_ms"] is None
    assert saved["output"] == "" and saved["output_bytes"] == 0
    assert later["outcome"] == "not_run" and later["text"] == NOT_RUN_TEXT
    assert same_bytes(fields(later), saved)
    accepted = messages(conn, "early", "accepted")
    assert [(m["replay"], m["state"]) for m in accepted] == [(True, "done")]
    assert not messages(conn, "early", "started")
    assert not (live.workspace / "marker").exists()  # nothing ran
    assert again["received"] is True and same_bytes(again["result"], saved)


async def test_one_cancel_result_per_id(live: LiveServer) -> None:
    with trio.fail_after(TEST_DEADLINE_S):
        async with live.connect() as conn:
            done = await conn.call("c", "d", "execute", {"command": "echo d"})
            await conn.send({"type": "cancel", "chat_id": "c", "call_ids": ["x", "d", "y"]})
            await conn.recv_until(
                lambda m: len([m for m in conn.seen if m["type"] == "cancel_result"]) == 3
            )
    replies = {m["call_id"]: m for m in conn.seen if m["type"] == "cancel_result"}
    assert {k: (m["received"], m["result"]["outcome"]) for k, m in replies.items()} == {
        "x": (False, "not_run"),
        "d": (True, "completed"),
        "y": (False, "not_run"),
    }
    assert same_bytes(replies["d"]["result"], fields(done))


async def test_cancel_while_running_reports_canceled_with_output_so_far(
    live: LiveServer,
) -> None:
    with trio.fail_after(TEST_DEADLINE_S):
        async with live.connect() as caller, live.connect() as other:
            await caller.send(execute("c", "run", "echo before; sleep 30; echo after"))
            await output_containing(caller, "run", "before")
            started = await wait_for(caller, of("started", "run"))
            reply = await cancel(other, "c", "run")  # any connection may cancel any call
            result = await wait_for(caller, of("result", "run"))
    assert reply["received"] is True
    canceled = reply["result"]
    assert canceled["outcome"] == "canceled" and canceled["text"] == CANCELED_TEXT
    assert canceled["canceled"] is True and canceled["timed_out"] is False
    assert canceled["output"] == "before\n"
    assert canceled["data"]["signal"] in ("SIGTERM", "SIGKILL")
    assert canceled["started_at"] == started["started_at"]
    assert same_bytes(fields(result), canceled)
    assert not alive(started["pid"])
    assert await gone(lambda: not group_members(started["pid"]))  # its `sleep 30` too


async def test_cancel_after_done_keeps_the_saved_result(live: LiveServer) -> None:
    with trio.fail_after(TEST_DEADLINE_S):
        async with live.connect() as conn:
            done = await conn.call("c", "d", "execute", {"command": "echo done"})
            reply = await cancel(conn, "c", "d")
            repeat = await conn.call("c", "d", "execute", {"command": "echo done"})
    assert done["outcome"] == "completed"
    assert reply["received"] is True
    assert same_bytes(reply["result"], fields(done))
    assert same_bytes(fields(repeat), fields(done))


async def test_term_ignoring_command_is_killed_after_the_grace(make_server: MakeServer) -> None:
    server = await make_server(kill_grace_s=0.3)
    with trio.fail_after(TEST_DEADLINE_S):
        async with server.connect() as conn:
            await conn.send(execute("c", "stubborn", "trap '' TERM; echo ready; sleep 30"))
            await output_containing(conn, "stubborn", "ready")
            pid = (await wait_for(conn, of("started", "stubborn")))["pid"]
            reply = await cancel(conn, "c", "stubborn")
    result = reply["result"]
    assert result["outcome"] == "canceled" and result["canceled"] is True
    assert result["data"]["signal"] == "SIGKILL"  # TERM was ignored; KILL ended it
    assert result["output"] == "ready\n"
    assert result["wall_ms"] >= 300  # it had its grace
    assert not alive(pid)
    assert await gone(lambda: not group_members(pid))  # the ignoring `sleep` too


async def test_every_member_of_the_group_gets_the_grace_not_only_the_shell(
    live: LiveServer,
) -> None:
    """PROTOCOL.md 5.3: every member of the group has `kill_grace_ms` from the SIGTERM to exit,
    even after the shell itself has exited, and the cancel waits until the group is empty. The
    outer shell dies of the SIGTERM at once; the inner one traps it and cleans up for 0.3 s
    (`cd x && make test` in small). The SIGKILL used to follow the shell's exit at once, so
    the cleanup never ran."""
    marker = live.workspace / "marker"
    command = (
        f'sh -c \'trap "sleep 0.3; echo cleaned > {marker}; exit 0" TERM; echo ready; '
        "while true; do sleep 0.05; done'; echo after"
    )
    with trio.fail_after(TEST_DEADLINE_S):
        async with live.connect() as conn:
            await conn.send(execute("c", "make", command))
            await output_containing(conn, "make", "ready")
            pid = (await wait_for(conn, of("started", "make")))["pid"]
            reply = await cancel(conn, "c", "make")
            members_at_reply = group_members(pid)
    result = reply["result"]
    assert result["outcome"] == "canceled" and result["canceled"] is True
    # The outer shell died of the SIGTERM: it never got to `echo after`.
    assert result["output"].startswith("ready\n") and "after" not in result["output"]
    assert marker.read_text() == "cleaned\n"  # the member had its grace and used it
    assert members_at_reply == []  # the reply came once the group was empty


@pytest.mark.parametrize("second", ["cancel", "interrupt"])
async def test_a_cancel_after_the_shell_died_of_an_earlier_cancel_keeps_it_canceled(
    make_server: MakeServer, second: str
) -> None:
    """PROTOCOL.md 5.3: a running call that a cancel stops ends `canceled`. The first cancel's
    SIGTERM kills the shell at once, while a member of its group (here one that ignores
    SIGTERM, until the test lets it go) still has its grace. A second cancel or an interrupt
    arriving in that window found the shell exited and took the call for one that had
    finished first: the stopped run then ended `completed` (with `canceled: true` and signal
    SIGTERM), and so did every reply, though its command never got to its last line. The
    wire fuzz test saw it as `completed but ran 0 times` (a command killed before its
    marker line)."""
    # The grace never runs out here: the group empties when the test creates GO.
    server = await make_server(kill_grace_s=TEST_DEADLINE_S * 3)
    command = (
        "sh -c \"trap '' TERM; echo ready; while [ ! -e GO ]; do sleep 0.01; done\" & "
        "wait; echo ran > MARKER"
    )
    with trio.fail_after(TEST_DEADLINE_S):
        async with server.connect() as conn:
            await conn.send(execute("c", "k", command))
            await output_containing(conn, "k", "ready")
            await conn.send({"type": "cancel", "chat_id": "c", "call_ids": ["k"], "rid": 1})
            # Returns once the shell is reaped: it died of the SIGTERM; its group lives on.
            shell = await tool(conn, "c", "w", "process_output", process_id="k", wait=True)
            if second == "cancel":
                await conn.send({"type": "cancel", "chat_id": "c", "call_ids": ["k"], "rid": 2})
            else:
                await conn.send({"type": "interrupt", "chat_id": "c", "rid": 2})
            # Messages of a connection are applied in order: once this is accepted, so is the
            # second request, and the call is still being stopped (GO does not exist yet).
            await conn.send({"type": "attach", "chat_id": "c", "call_id": "k", "rid": 3})
            await wait_for(conn, lambda m: m["type"] == "accepted" and m.get("rid") == 3)
            (server.workspace / "GO").touch()
            first = await wait_for(conn, lambda m: m["type"] == "cancel_result" and m["rid"] == 1)
            reply = await wait_for(conn, lambda m: m.get("rid") == 2 and m["type"] != "accepted")
            while len(messages(conn, "k", "result")) < 2:  # the call's and the attach's
                await conn.recv()
    assert shell["data"]["running"] is False and shell["data"]["signal"] == "SIGTERM"
    assert not (server.workspace / "MARKER").exists()  # the shell never got to its last line
    results = [fields(m) for m in messages(conn, "k", "result")]
    assert first["received"] is True
    canceled = first["result"]
    assert canceled["outcome"] == "canceled" and canceled["text"] == CANCELED_TEXT
    assert canceled["canceled"] is True and canceled["data"]["signal"] == "SIGTERM"
    assert canceled["output"] == "ready\n"
    assert all(same_bytes(result, canceled) for result in results)
    if second == "cancel":
        assert reply["type"] == "cancel_result" and reply["received"] is True
        assert same_bytes(reply["result"], canceled)
    else:
        assert reply["type"] == "interrupted" and reply["call_ids"] == ["k"]


async def test_backgrounded_grandchild_dies_with_the_group(live: LiveServer) -> None:
    with trio.fail_after(TEST_DEADLINE_S):
        async with live.connect() as conn:
            await conn.send(execute("c", "gc", "sleep 300 & echo $! > pidfile; echo ok; wait"))
            await output_containing(conn, "gc", "ok")
            grandchild = int((live.workspace / "pidfile").read_text())
            assert alive(grandchild)
            reply = await cancel(conn, "c", "gc")
            assert reply["result"]["outcome"] == "canceled"
            assert await gone(lambda: not alive(grandchild))


async def test_cancel_of_a_gated_call_closes_the_gate(make_server: MakeServer) -> None:
    server = await make_server(approve_tools=frozenset({"execute"}))
    with trio.fail_after(TEST_DEADLINE_S):
        async with server.connect() as a, server.connect() as b:
            await a.send(execute("c", "g", "echo x >> marker"))
            await wait_for(a, of("approval", "g"))
            await b.send(execute("c", "g", "echo x >> marker"))
            await wait_for(b, of("approval", "g"))
            reply = await cancel(b, "c", "g")
            ra = await wait_for(a, of("result", "g"))
            rb = await wait_for(b, of("result", "g"))
    # 5.1: a repeat of a parked call subscribes to it, gate included.
    assert [(m["replay"], m["state"]) for m in messages(b, "g", "accepted")] == [
        (True, "awaiting_approval")
    ]
    assert reply["received"] is True
    assert reply["result"]["outcome"] == "not_run" and reply["result"]["text"] == NOT_RUN_TEXT
    assert same_bytes(fields(ra), reply["result"]) and same_bytes(fields(rb), reply["result"])
    for conn in (a, b):
        resolved = messages(conn, "g", "approval_resolved")
        assert [m["decision"] for m in resolved] == ["canceled"]
    assert not (server.workspace / "marker").exists()


async def test_cancel_of_a_blocking_process_output_ends_it(live: LiveServer) -> None:
    with trio.fail_after(TEST_DEADLINE_S):
        async with live.connect() as conn:
            bg = await conn.call("c", "bg", "execute", {"command": "sleep 30"}, background=True)
            assert bg["outcome"] == "completed"
            await conn.send(
                call_msg("c", "w", "process_output", {"process_id": "bg", "wait": True})
            )
            await wait_for(conn, of("accepted", "w"))
            reply = await cancel(conn, "c", "w")
    # The wait (up to max_wait_ms, 5 minutes) does not hold the cancel back.
    assert reply["received"] is True
    assert reply["result"]["outcome"] == "canceled" and reply["result"]["text"] == CANCELED_TEXT


# --- 5.2: processes and timeouts ------------------------------------------------------------------


async def test_background_child_holding_the_pipe_does_not_hold_the_result(
    live: LiveServer,
) -> None:
    with trio.fail_after(TEST_DEADLINE_S):
        async with live.connect() as conn:
            result = await conn.call("c", "sh", "execute", {"command": "sleep 30 & echo $!"})
            child = int(result["output"])
            try:
                # The result came while the background `sleep 30` still held the pipe. (Had
                # the result waited for the pipe's EOF, it would not have come before the
                # test's deadline.)
                assert alive(child)
                listed = await tool(conn, "c", "l", "process_list")
            finally:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(child, signal.SIGKILL)
    assert result["outcome"] == "completed"
    assert result["data"] == {"exit_code": 0, "signal": None, "process_id": "sh"}
    (row,) = listed["data"]["processes"]
    assert row["process_id"] == "sh" and row["running"] is False and row["exit_code"] == 0


async def test_timeout_returns_timed_out_and_the_process_keeps_running(
    live: LiveServer,
) -> None:
    with trio.fail_after(TEST_DEADLINE_S):
        async with live.connect() as conn:
            result = await conn.call(
                "c", "t", "execute", {"command": "echo begun; sleep 30"}, timeout_ms=200
            )
            listed = await tool(conn, "c", "l", "process_list")
            running = await tool(conn, "c", "o1", "process_output", process_id="t")
            reply = await cancel(conn, "c", "t")
            after = await tool(conn, "c", "o2", "process_output", process_id="t")
            pid = (await wait_for(conn, of("started", "t")))["pid"]
    assert result["outcome"] == "timed_out"
    assert result["text"] == "tool call timed out after 200 ms; the process is still running"
    assert result["timed_out"] is True and result["canceled"] is False
    assert result["output"] == "begun\n"
    assert result["data"] == {"exit_code": None, "signal": None, "process_id": "t"}
    assert result["wall_ms"] >= 200
    assert [(p["process_id"], p["running"]) for p in listed["data"]["processes"]] == [("t", True)]
    assert running["data"]["running"] is True and running["data"]["timed_out"] is True
    assert running["output"] == "begun\n"
    # 5.3, done row: the saved result stays; the process it left running is killed.
    assert reply["received"] is True and same_bytes(reply["result"], fields(result))
    assert after["data"]["canceled"] is True
    assert after["data"]["running"] is False  # the cancel_result came after the kill
    assert not alive(pid)


async def test_cancel_after_a_timeout_replies_once_the_process_is_gone(
    make_server: MakeServer,
) -> None:
    # The leftover process ignores SIGTERM, so it dies only when the 0.3 s grace ends.
    server = await make_server(kill_grace_s=0.3)
    with trio.fail_after(TEST_DEADLINE_S):
        async with server.connect() as conn:
            result = await conn.call(
                "c", "t", "execute", {"command": "trap '' TERM; sleep 30"}, timeout_ms=100
            )
            pid = (await wait_for(conn, of("started", "t")))["pid"]
            reply = await cancel(conn, "c", "t")
            dead = alive(pid) is False
            after = await tool(conn, "c", "o", "process_output", process_id="t")
    assert result["outcome"] == "timed_out"
    assert reply["received"] is True and same_bytes(reply["result"], fields(result))
    assert dead  # the cancel_result came after the kill, not before it
    assert after["data"]["running"] is False and after["data"]["canceled"] is True
    assert after["data"]["signal"] == "SIGKILL"


async def test_timeout_is_fixed_at_the_first_start(live: LiveServer) -> None:
    command = "sleep 30"
    with trio.fail_after(TEST_DEADLINE_S):
        async with live.connect() as a, live.connect() as b:
            await a.send(execute("c", "t", command, timeout_ms=300))
            started = await wait_for(a, of("started", "t"))
            await trio.sleep(0.2)  # the retry really arrives later (not a wait for a condition)
            # A retry, even one naming a longer timeout, never moves the first deadline: moved
            # to the retry's hour, the result would miss this test's deadline.
            await b.send(execute("c", "t", command, timeout_ms=3_600_000))
            ra = await wait_for(a, of("result", "t"))
            rb = await wait_for(b, of("result", "t"))
    assert ra["outcome"] == "timed_out"
    assert ra["text"] == "tool call timed out after 300 ms; the process is still running"
    assert same_bytes(fields(ra), fields(rb))
    assert ra["started_at"] == started["started_at"]
    assert messages(b, "t", "accepted")[0]["replay"] is True
    assert ra["wall_ms"] >= 300  # not before the first start's deadline either


async def test_background_returns_at_once(live: LiveServer) -> None:
    with trio.fail_after(TEST_DEADLINE_S):
        async with live.connect() as conn:
            result = await conn.call(
                "c", "b", "execute", {"command": "echo up; sleep 30"}, background=True
            )
            state = await tool(conn, "c", "o", "process_output", process_id="b")
    assert result["outcome"] == "completed"
    assert result["data"]["process_id"] == "b" and result["data"]["exit_code"] is None
    assert result["timed_out"] is False and result["canceled"] is False
    assert state["data"]["running"] is True  # it returned without waiting for the process


async def test_over_limit_refuses_the_extra_execute(make_server: MakeServer) -> None:
    server = await make_server(limits=Limits(max_processes_per_chat=2))
    with trio.fail_after(TEST_DEADLINE_S):
        async with server.connect() as conn:
            for call_id in ("p1", "p2", "p3"):  # sent together: concurrent
                await conn.send(execute("c", call_id, "sleep 30"))
            error = await wait_for(conn, of("error", "p3"))
            await wait_for(conn, of("started", "p1"))
            await wait_for(conn, of("started", "p2"))
            other_chat = await conn.call("d", "p3", "execute", {"command": "echo free"})
            await cancel(conn, "c", "p1")
            retried = await conn.call("c", "p3", "execute", {"command": "echo now"})
    assert error["code"] == "over_limit" and error["chat_id"] == "c"
    # The refused p3 was never accepted; only the later retry was, as a new call.
    accepted_c = [m for m in messages(conn, "p3", "accepted") if m["chat_id"] == "c"]
    assert [(m["replay"], m["requests"]) for m in accepted_c] == [(False, 1)]
    assert other_chat["outcome"] == "completed"  # the limit is per chat
    # The refusal stored nothing, so once a slot is free the same id runs.
    assert retried["outcome"] == "completed" and retried["output"] == "now\n"


async def test_a_burst_of_executes_cannot_pass_the_limit(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    # Three calls applied in one scheduling tick (no task ran in between, as when a client
    # pipelines them): the third must be refused up front, not accepted and then failed, since
    # a failed result would be saved forever and the id could never run.
    ctx = AgentContext(workspace=str(tmp_path), limits=Limits(max_processes_per_chat=2))
    agent = await nursery.start(Agent(ctx).run)
    outbox = Outbox()
    try:
        with trio.fail_after(TEST_DEADLINE_S):
            for call_id in ("p1", "p2"):
                agent.call(outbox, "c", CallSpec(call_id, "execute", {"command": "sleep 30"}),
                           stream=True, rid=None)  # fmt: skip
            with pytest.raises(ToolwireError) as refused:
                agent.call(outbox, "c", CallSpec("p3", "execute", {"command": "sleep 30"}),
                           stream=True, rid=None)  # fmt: skip
            assert refused.value.code == "over_limit"
            assert agent.chats["c"].records.get("p3") is None
            got = await events_until(
                outbox, lambda got: sum(isinstance(e, StartedEvent) for e in got) == 2
            )
            assert not any(isinstance(e, ResultEvent) for e in got)
            assert len(agent.chats["c"].processes.running()) == 2
    finally:
        await agent.shutdown()


async def test_chats_are_isolated_both_ways(live: LiveServer) -> None:
    with trio.fail_after(TEST_DEADLINE_S):
        async with live.connect() as conn:
            for chat, pid in (("A", "pa"), ("B", "pb"), ("", "pn")):
                r = await conn.call(chat, pid, "execute", {"command": "sleep 30"}, background=True)
                assert r["outcome"] == "completed"
            views: dict[str, list[str]] = {}
            for chat in ("A", "B", ""):
                listed = await tool(conn, chat, "list", "process_list")
                views[chat] = [p["process_id"] for p in listed["data"]["processes"]]
            probes = []
            for chat, foreign in (("A", "pb"), ("B", "pa"), ("", "pa"), ("A", "pn")):
                out = await tool(conn, chat, f"o-{foreign}", "process_output", process_id=foreign)
                sig = await tool(
                    conn,
                    chat,
                    f"s-{foreign}",
                    "process_signal",
                    process_id=foreign,
                    signal="SIGKILL",
                )
                probes.append((out, sig))
            states = [
                await tool(conn, chat, "own", "process_output", process_id=pid)
                for chat, pid in (("A", "pa"), ("B", "pb"), ("", "pn"))
            ]
            # call ids are per chat too: "own" in chat A is not "own" in chat B.
            own = [m for m in conn.seen if m["type"] == "accepted" and m["call_id"] == "own"]
    assert views == {"A": ["pa"], "B": ["pb"], "": ["pn"]}
    for out, sig in probes:
        assert out["outcome"] == "failed" and "no process" in out["text"]
        assert sig["outcome"] == "failed" and sig["data"] is None
    # The foreign SIGKILLs touched nothing: every process still runs.
    assert [s["data"]["running"] for s in states] == [True, True, True]
    assert [m["replay"] for m in own] == [False, False, False]


async def test_head_and_tail_truncation_of_a_3mb_output(live: LiveServer) -> None:
    # 300,000 lines of 10 bytes: exactly 3,000,000 bytes.
    script = "import sys\nfor i in range(300000): sys.stdout.write(f'{i:09d}\\n')"
    command = f'{sys.executable} -c "{script}"'
    everything = b"".join(f"{i:09d}\n".encode() for i in range(300_000))
    with trio.fail_after(TEST_DEADLINE_S):
        async with live.connect() as conn:
            result = await conn.call("c", "big", "execute", {"command": command}, stream=False)
            # 5.2: an attach from an offset no longer retained resumes at the first retained
            # byte after it, and the `output` offset shows the jump.
            await conn.send(
                {"type": "attach", "chat_id": "c", "call_id": "big", "from_offset": 100_000}
            )
            replay = await conn.recv_until(of("result", "big"))
    assert result["outcome"] == "completed"
    outputs = [m for m in replay if m["type"] == "output"]
    resumed = outputs[0]["offset"]
    assert resumed > 100_000
    at = resumed
    for m in outputs:
        assert m["offset"] == at
        at += len(m["data"].encode())
    assert at == 3_000_000
    assert "".join(m["data"] for m in outputs) == everything[resumed:].decode()
    assert same_bytes(fields(replay[-1]), fields(result))
    stream_false = messages(conn, "big")[: messages(conn, "big").index(result) + 1]
    assert [m["type"] for m in stream_false] == ["accepted", "result"]  # stream: false
    n = 3_000_000 - 16 * 1024 - 48 * 1024
    assert result["output_bytes"] == 3_000_000
    assert result["truncated_bytes"] == n
    output = result["output"]
    assert output.startswith("000000000\n000000001\n")
    assert output.endswith("000299998\n000299999\n")
    marker = f"[... {n} bytes omitted ...]"
    assert output.count(marker) == 1
    head, tail = output.split(f"\n{marker}\n")
    assert len(head.encode()) == 16 * 1024 and len(tail.encode()) == 48 * 1024


async def test_utf8_character_split_across_reads_arrives_intact(live: LiveServer) -> None:
    # U+20AC is E2 82 AC; the first byte arrives 0.1 s before the other two.
    command = "printf '\\342'; sleep 0.1; printf '\\202\\254\\n'"
    with trio.fail_after(TEST_DEADLINE_S):
        async with live.connect() as conn:
            result = await conn.call("c", "eur", "execute", {"command": command})
    outputs = messages(conn, "eur", "output")
    assert "".join(m["data"] for m in outputs) == "€\n"
    assert all("\ufffd" not in m["data"] for m in outputs)
    assert outputs[0]["offset"] == 0
    assert result["output"] == "€\n" and result["output_bytes"] == 4


async def test_offsets_are_contiguous_across_chunks(live: LiveServer) -> None:
    script = (
        "import sys, time\n"
        "for i in range(6):\n"
        "    sys.stdout.write(f'chunk {i} ' + 'é' * (i * 7) + '\\n'); sys.stdout.flush()\n"
        "    time.sleep(0.03)"
    )
    expected = "".join(f"chunk {i} " + "é" * (i * 7) + "\n" for i in range(6))
    with trio.fail_after(TEST_DEADLINE_S):
        async with live.connect() as conn:
            result = await conn.call(
                "c", "chunks", "execute", {"command": f'{sys.executable} -c "{script}"'}
            )
    outputs = messages(conn, "chunks", "output")
    assert len(outputs) >= 3  # the stream really came in several pieces
    at = 0
    for m in outputs:
        assert m["offset"] == at
        at += len(m["data"].encode())
    assert at == result["output_bytes"] == len(expected.encode())
    assert "".join(m["data"] for m in outputs) == expected == result["output"]


async def test_reattach_after_disconnect_loses_and_doubles_nothing(live: LiveServer) -> None:
    script = (
        "import sys, time\n"
        "for i in range(15):\n"
        "    print(f'line {i}', flush=True); time.sleep(0.02)"
    )
    expected = "".join(f"line {i}\n" for i in range(15))
    with trio.fail_after(TEST_DEADLINE_S):
        async with live.connect() as first:
            await first.send(execute("c", "ra", f'{sys.executable} -c "{script}"'))
            await output_containing(first, "ra", "line 1\n")
            got = messages(first, "ra", "output")
            head = "".join(m["data"] for m in got)
            resume = got[-1]["offset"] + len(got[-1]["data"].encode())
            assert resume == len(head.encode())
        # The connection is gone; the call goes on. A new one resumes where the first stopped.
        async with live.connect() as second:
            await second.send(
                {"type": "attach", "chat_id": "c", "call_id": "ra", "from_offset": resume}
            )
            result = await wait_for(second, of("result", "ra"))
    accepted = messages(second, "ra", "accepted")
    assert accepted[0]["replay"] is True and accepted[0]["requests"] == 2
    rest = messages(second, "ra", "output")
    assert rest[0]["offset"] == resume
    at = resume
    for m in rest:
        assert m["offset"] == at
        at += len(m["data"].encode())
    assert head + "".join(m["data"] for m in rest) == expected
    assert result["output"] == expected and result["outcome"] == "completed"


async def _stalled_connection(port: int, message: Message) -> trio.SocketStream:
    """A client that sends one call and then never reads again (tiny receive buffer)."""
    sock = trio.socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    await sock.connect(("127.0.0.1", port))
    stream = trio.SocketStream(sock)
    ws = wsproto.WSConnection(wsproto.ConnectionType.CLIENT)
    await stream.send_all(
        ws.send(
            wsproto.events.Request(
                host=f"127.0.0.1:{port}",
                target="/v1",
                extra_headers=[(b"authorization", f"Bearer {TOKEN}".encode())],
                subprotocols=["toolwire.v1.json"],
            )
        )
    )
    accepted = False
    while not accepted:
        ws.receive_data(await stream.receive_some(4096))
        accepted = any(isinstance(e, wsproto.events.AcceptConnection) for e in ws.events())
    await stream.send_all(ws.send(wsproto.events.TextMessage(json.dumps(message))))
    return stream


async def test_a_stalled_client_does_not_slow_another_connection(live: LiveServer) -> None:
    # 20 MB of output for a client that never reads.
    command = "head -c 20000000 /dev/zero | tr '\\0' a; echo; echo END"
    port = int(live.url.rsplit(":", 1)[1].split("/")[0])
    with trio.fail_after(TEST_DEADLINE_S):
        stalled = await _stalled_connection(port, execute("c", "flood", command))
        try:
            async with live.connect() as other:
                hi = await other.call("c", "hi", "execute", {"command": "echo hi"})
                # Follow the flood without streaming: the process finishes at full speed even
                # though one of its followers has read nothing at all.
                flood = await other.call(
                    "c", "flood", "execute", {"command": command}, stream=False
                )
                hi2 = await other.call("d", "hi", "execute", {"command": "echo hi"})
                # The stall is real: the stalled connection's sender is backed up.
                backed_up = [s.stream.buffered_bytes for s in live.server._sessions]
        finally:
            await stalled.aclose()
    assert hi["outcome"] == "completed" and hi["output"] == "hi\n"
    assert hi2["outcome"] == "completed"
    assert flood["outcome"] == "completed"
    assert flood["output_bytes"] == 20_000_005 and flood["output"].endswith("\nEND\n")
    assert max(backed_up) > 0


# --- 5.4: forgetting (in memory, virtual time) ------------------------------------------------


async def drain(outbox: Outbox) -> list[Event]:
    """Everything the outbox holds right now (after letting started tasks run)."""
    await trio.testing.wait_all_tasks_blocked()
    return outbox.take(10_000)


async def events_until(outbox: Outbox, done: Callable[[list[Event]], bool]) -> list[Event]:
    got: list[Event] = []
    while not done(got):
        await outbox.wait()
        got.extend(outbox.take(10_000))
    return got


def read_spec(call_id: str, path: str = "f.txt") -> CallSpec:
    return CallSpec(call_id, "read_file", {"path": path})


async def test_forgetting_after_the_age_and_touches_reset_it(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, tmp_path: Path
) -> None:
    (tmp_path / "f.txt").write_text("v1\n")
    ctx = AgentContext(workspace=str(tmp_path), limits=Limits(forget_after_s=100))
    agent = await nursery.start(Agent(ctx).run)
    outbox = Outbox()
    agent.call(outbox, "c", read_spec("old"), stream=True, rid=None)
    agent.call(outbox, "c", read_spec("kept"), stream=True, rid=None)
    first = [e for e in await drain(outbox) if isinstance(e, ResultEvent)]
    assert [e.result.outcome for e in first] == [Outcome.COMPLETED] * 2
    chat = agent.chats["c"]

    await trio.sleep(70)
    agent.call(outbox, "c", read_spec("kept"), stream=True, rid=None)  # a touch
    await trio.sleep(30)
    agent.sweep()
    assert chat.records.get("old") is None  # 100 s untouched: forgotten
    assert chat.records.get("kept") is not None  # touched 30 s ago

    await trio.sleep(60)
    await drain(outbox)
    # An attach is a touch too, and so is a cancel.
    agent.attach(outbox, "c", "kept", 0, None)
    await trio.sleep(99)
    agent.sweep()
    assert chat.records.get("kept") is not None
    agent.cancel(outbox, "c", ["kept"], None)
    await trio.sleep(99)
    agent.sweep()
    assert chat.records.get("kept") is not None
    await trio.sleep(1)
    agent.sweep()
    assert chat.records.get("kept") is None

    # 5.4's contract: a forgotten id is unknown again, so a call with it runs anew.
    (tmp_path / "f.txt").write_text("v2\n")
    await drain(outbox)
    agent.call(outbox, "c", read_spec("old"), stream=True, rid=None)
    got = await drain(outbox)
    accepted = [e for e in got if isinstance(e, AcceptedEvent)]
    (result,) = [e for e in got if isinstance(e, ResultEvent)]
    assert accepted[0].replay is False and accepted[0].requests == 1
    assert result.result.data is not None and result.result.data["content"] == "v2\n"


def _tasks_under(nursery: trio.Nursery) -> int:
    """Every task `nursery` runs, and every task of theirs, however deep."""
    return sum(
        1 + sum(_tasks_under(child) for child in task.child_nurseries)
        for task in nursery.child_tasks
    )


async def test_idle_chats_are_dropped_with_their_task(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, tmp_path: Path
) -> None:
    (tmp_path / "f.txt").write_text("x\n")
    ctx = AgentContext(workspace=str(tmp_path), limits=Limits(forget_after_s=10))
    agent = await nursery.start(Agent(ctx).run)
    await trio.testing.wait_all_tasks_blocked()
    # The agent's own tasks (its run, the sweeper and the journal writer), seen through trio's
    # task tree from the nursery that runs the agent.
    at_rest = _tasks_under(nursery)
    assert at_rest >= 3
    outbox = Outbox()
    for i in range(20):
        agent.call(outbox, f"chat-{i}", read_spec("r"), stream=True, rid=None)
    await drain(outbox)
    assert len(agent.chats) == 20
    # A chat holds a task only while it has work: twenty chats of finished records hold none.
    await trio.testing.wait_all_tasks_blocked()
    assert _tasks_under(nursery) == at_rest
    await trio.sleep(11)
    agent.sweep()
    await trio.testing.wait_all_tasks_blocked()
    # Memory is bounded by live records: forgotten chats are dropped and leave no task behind.
    assert agent.chats == {}
    assert _tasks_under(nursery) == at_rest
    # And a chat id can come back.
    agent.call(outbox, "chat-0", read_spec("r"), stream=True, rid=None)
    got = await drain(outbox)
    assert [e.result.outcome for e in got if isinstance(e, ResultEvent)] == [Outcome.COMPLETED]


class _ScriptedProcess:
    """A process in virtual time (the backend is injectable for exactly this): it runs
    `run_s` seconds of the trio clock, prints nothing and exits 0."""

    pid: int | None = None

    def __init__(self, run_s: float) -> None:
        self._run_s = run_s
        self._exited = trio.Event()

    async def read_some(self) -> bytes:
        await self._exited.wait()
        return b""

    def read_available(self) -> bytes:
        return b""

    async def wait(self) -> ExitStatus:
        await trio.sleep(self._run_s)
        self._exited.set()
        return ExitStatus(0, None)

    def poll_exited(self) -> bool:
        return self._exited.is_set()

    def group_alive(self) -> bool:
        return not self._exited.is_set()

    def signal_group(self, sig: signal.Signals) -> bool:
        return False

    def close(self) -> None:
        pass


class _ScriptedBackend:
    def __init__(self, run_s: float) -> None:
        self.run_s = run_s
        self.spawned = 0

    def spawn(self, argv: list[str], cwd: str, env: Mapping[str, str]) -> _ScriptedProcess:
        self.spawned += 1
        return _ScriptedProcess(self.run_s)


async def test_a_finished_long_run_is_not_forgotten_at_once(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, tmp_path: Path
) -> None:
    # A command that runs longer than forget_after_s. Its age counts from its end, so a retry
    # right after the result gets that result: it must not run the command a second time.
    backend = _ScriptedBackend(run_s=150)
    ctx = AgentContext(workspace=str(tmp_path), limits=Limits(forget_after_s=100), backend=backend)
    agent = await nursery.start(Agent(ctx).run)
    outbox = Outbox()
    spec = CallSpec("slow", "execute", {"command": "make"})
    agent.call(outbox, "c", spec, stream=False, rid=None)
    await events_until(outbox, lambda got: any(isinstance(e, ResultEvent) for e in got))
    agent.sweep()
    agent.call(outbox, "c", spec, stream=False, rid=None)
    got = await drain(outbox)
    assert [e.replay for e in got if isinstance(e, AcceptedEvent)] == [True]
    assert backend.spawned == 1
    # Untouched for forget_after_s after its end, it may go (5.4).
    await trio.sleep(100)
    agent.sweep()
    assert agent.chats["c"].records.get("slow") is None


async def test_cancel_kills_a_process_that_outlived_its_record(
    make_server: MakeServer,
) -> None:
    server = await make_server(limits=Limits(forget_after_s=0))
    with trio.fail_after(TEST_DEADLINE_S):
        async with server.connect() as conn:
            timed = await conn.call("c", "t", "execute", {"command": "sleep 30"}, timeout_ms=100)
            shell = (await wait_for(conn, of("started", "t")))["pid"]
            bg = await conn.call("c", "bg", "execute", {"command": "sleep 300 & echo $! > pidfile"})
            child = int((server.workspace / "pidfile").read_text())
            server.agent.sweep()
            chat = server.agent.chats["c"]
            assert chat.records.get("t") is None and chat.records.get("bg") is None
            assert alive(shell) and alive(child)
            replies = [await cancel(conn, "c", "t"), await cancel(conn, "c", "bg")]
    assert timed["outcome"] == "timed_out" and bg["outcome"] == "completed"
    for reply in replies:
        # 5.3, none row: the record is gone but its process was found and killed.
        assert reply["received"] is False
        assert reply["result"]["outcome"] == "canceled"
        assert reply["result"]["text"] == CANCELED_TEXT
    assert not alive(shell)
    assert await gone(lambda: not alive(child))


async def test_a_repeat_after_the_end_does_not_cut_undelivered_output(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    # A connection whose sender has not caught up yet repeats a call that has just ended: the
    # first request's output must still arrive in full before its result (5.0: no gaps).
    ctx = AgentContext(workspace=str(tmp_path))
    agent = await nursery.start(Agent(ctx).run)
    outbox = Outbox()
    spec = CallSpec("c1", "execute", {"command": "echo one; echo two"})
    with trio.fail_after(TEST_DEADLINE_S):
        agent.call(outbox, "c", spec, stream=True, rid=None)
        record = agent.chats["c"].records.get("c1")
        assert record is not None
        while not record.published:  # the command ended and its result was put
            await trio.testing.wait_all_tasks_blocked()
        agent.call(outbox, "c", spec, stream=True, rid=None)  # nothing was taken yet
        got = outbox.take(10_000)
    kinds = [type(e).__name__ for e in got]
    assert kinds[0] == "AcceptedEvent" and kinds[-1] == "ResultEvent"
    assert kinds.count("ResultEvent") == 2 and kinds.count("AcceptedEvent") == 2
    text = "".join(e.data for e in got if isinstance(e, OutputEvent))
    assert text == "one\ntwo\n"
    assert sum(isinstance(e, StartedEvent) for e in got) == 1
    assert not any(isinstance(e, CancelResultEvent) for e in got)


async def test_a_follower_that_starts_streaming_later_gets_started_once(live: LiveServer) -> None:
    # `started` goes only to streaming followers; one that asks to stream later still gets it.
    with trio.fail_after(TEST_DEADLINE_S):
        async with live.connect() as quiet, live.connect() as loud:
            await quiet.send(execute("c", "late", "echo ready; sleep 30", stream=False))
            await wait_for(quiet, of("accepted", "late"))
            await loud.send(execute("c", "late", "echo ready; sleep 30", stream=True))
            await output_containing(loud, "late", "ready")  # the process runs
            await quiet.send(execute("c", "late", "echo ready; sleep 30", stream=True))
            await output_containing(quiet, "late", "ready")
            await cancel(quiet, "c", "late")  # its two results come before its cancel_result
    kinds = [m["type"] for m in messages(quiet, "late")]
    assert kinds.count("result") == 2
    assert kinds.count("started") == 1
    assert kinds.index("started") > [i for i, k in enumerate(kinds) if k == "accepted"][1]


async def test_a_large_stream_puts_every_byte_at_its_offset(live: LiveServer) -> None:
    # 3.9 MB as fast as `seq` writes: the pipe grows and reads and messages get large. Whatever
    # a follower receives sits at its exact offset; a forward jump is a declared retention jump.
    expected = "".join(f"{i}\n" for i in range(1, 600_001)).encode()
    with trio.fail_after(TEST_DEADLINE_S):
        async with live.connect() as conn:
            result = await conn.call("c", "seq", "execute", {"command": "seq 1 600000"})
    assert result["outcome"] == "completed"
    assert result["output_bytes"] == len(expected)
    at = 0
    for m in messages(conn, "seq", "output"):
        data = m["data"].encode()
        assert m["offset"] >= at
        assert data == expected[m["offset"] : m["offset"] + len(data)]
        at = m["offset"] + len(data)
    assert at == len(expected)
