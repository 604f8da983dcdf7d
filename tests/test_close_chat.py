"""`close_chat` (PROTOCOL.md 9.6) through a real server: every unresolved call ends as by
`interrupt`, every process of the chat is stopped (also background and timed-out ones), the
requester gets `chat_closed`, and the chat takes nothing new until its records are forgotten."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from tests.conftest import LiveServer
from tests.oswatch import alive
from tests.test_journal import kill9, state_token
from tests.test_serve import serve
from tests.wsclient import connect, of, wait_for
from toolwire.actors.agent import Agent, AgentContext, Limits
from toolwire.actors.chat import CallSpec
from toolwire.actors.events import ChatClosedEvent, ResultEvent
from toolwire.actors.journal import SqliteJournal
from toolwire.actors.outbox import Outbox
from toolwire.actors.results import ToolwireError

TEST_DEADLINE_S = 20.0
NOT_RUN_TEXT = "tool call was canceled before it ran; no changes were made"


def call(chat_id: str, call_id: str, tool: str, args: dict[str, object]) -> dict[str, object]:
    return {"type": "call", "chat_id": chat_id, "call_id": call_id, "tool": tool, "args": args}


async def test_close_chat_ends_every_call_and_stops_every_process(live: LiveServer) -> None:
    with trio.fail_after(TEST_DEADLINE_S):
        async with live.connect() as conn:
            bg = await conn.call(
                "c", "bg", "execute", {"command": "exec sleep 100"},
                background=True,
            )  # fmt: skip
            timed = await conn.call(
                "c", "slow", "execute", {"command": "exec sleep 100"},
                timeout_ms=200,
            )  # fmt: skip
            fg_command = "echo up; exec sleep 100"
            await conn.send(call("c", "fg", "execute", {"command": fg_command}))
            await wait_for(conn, lambda m: m["type"] == "output" and m["call_id"] == "fg")
            gated = {"path": "never", "content": "x"}
            await conn.send(call("c", "gate", "write_file", gated) | {"approval": True})
            await wait_for(conn, of("approval", "gate"))
            other = {"command": "exec sleep 100"}
            await conn.send(call("other", "o", "execute", other) | {"background": True})
            await wait_for(conn, of("result", "o"))
            # Each command `exec`s its sleep: the pid `started` gave is the sleep's.
            pids = {
                name: (await wait_for(conn, of("started", call_id)))["pid"]
                for name, call_id in (("bg", "bg"), ("slow", "slow"), ("fg", "fg"), ("other", "o"))
            }

            await conn.send({"type": "close_chat", "chat_id": "c", "rid": "x"})
            closed = await wait_for(conn, lambda m: m["type"] == "chat_closed")
            fg = await wait_for(conn, of("result", "fg"))
            gate = await wait_for(conn, of("result", "gate"))
            refused = await conn.call("c", "new", "read_file", {"path": "never"})
            again = await conn.call(
                "c", "bg", "execute", {"command": "exec sleep 100"},
                background=True,
            )  # fmt: skip
            other_chat = await conn.call("other", "o2", "process_list", {})
    assert closed["rid"] == "x" and closed["chat_id"] == "c"
    assert sorted(closed["call_ids"]) == ["fg", "gate"]
    assert sorted(closed["process_ids"]) == ["bg", "fg", "slow"]
    # Every call has its one result, and each says what happened.
    assert bg["outcome"] == "completed" and timed["outcome"] == "timed_out"
    assert fg["outcome"] == "canceled" and fg["canceled"] is True
    assert (gate["outcome"], gate["text"]) == ("not_run", NOT_RUN_TEXT)
    assert [m["type"] for m in conn.seen if m.get("call_id") == "fg"].count("result") == 1
    # Every process of the chat is gone; the other chat's runs on.
    assert not any(alive(pids[name]) for name in ("bg", "slow", "fg"))
    assert alive(pids["other"])
    assert other_chat["outcome"] == "completed"
    # Nothing new starts in it; a retry of an old call gets its saved result.
    assert refused["type"] == "error" and refused["code"] == "chat_closed"
    assert again == bg


async def test_a_closed_chat_whose_records_are_forgotten_is_gone(live: LiveServer) -> None:
    with trio.fail_after(TEST_DEADLINE_S):
        async with live.connect() as conn:
            await conn.call("c", "r", "read_file", {"path": "missing"})
            await conn.send({"type": "close_chat", "chat_id": "c", "rid": 1})
            closed = await wait_for(conn, lambda m: m["type"] == "chat_closed")
            refused = await conn.call("c", "r2", "read_file", {"path": "missing"})
            chat = live.agent.chats["c"]
            # Its records age past forget_after_s: forgotten by the sweeper, the chat is gone.
            for record in chat.records:
                record.touched_at -= live.agent.ctx.limits.forget_after_s + 1
            live.agent.sweep()
            anew = await conn.call("c", "r3", "read_file", {"path": "missing"})
    assert closed["call_ids"] == [] and closed["process_ids"] == []
    assert refused["code"] == "chat_closed"
    assert anew["type"] == "result"


async def test_close_chat_stops_what_a_command_left_running_with_its_output_elsewhere(
    live: LiveServer,
) -> None:
    """`nohup server >log 2>&1 &`: the command's shell exits at once and nothing holds its
    output pipe, so the call completes and its process is listed as exited; the server it left
    in its process group is still the chat's to stop at a close (9.6), as at a shutdown (9.3)."""
    command = "nohup sleep 100 >/dev/null 2>&1 & echo $!"
    with trio.fail_after(TEST_DEADLINE_S):
        async with live.connect() as conn:
            started = await conn.call("c", "daemon", "execute", {"command": command})
            other = await conn.call("other", "o", "execute", {"command": command})
            daemon_pid, other_pid = int(started["output"]), int(other["output"])
            assert alive(daemon_pid) and alive(other_pid)
            await conn.send({"type": "close_chat", "chat_id": "c", "rid": 1})
            closed = await wait_for(conn, lambda m: m["type"] == "chat_closed")
            listed = await conn.call("other", "l", "process_list", {})
            daemon_alive = alive(daemon_pid)
            other_alive = alive(other_pid)
            await conn.send({"type": "close_chat", "chat_id": "other", "rid": 2})
            await wait_for(conn, lambda m: m["type"] == "chat_closed" and m["rid"] == 2)
    assert started["outcome"] == "completed" and started["data"]["exit_code"] == 0
    assert closed["call_ids"] == [] and closed["process_ids"] == ["daemon"]
    assert not daemon_alive
    # Another chat's is left alone, and its command still shows its own exit.
    assert other_alive
    [listing] = [p for p in listed["data"]["processes"] if p["process_id"] == "o"]
    assert listing["running"] is False and listing["exit_code"] == 0
    assert not alive(other_pid)


# ---------------------------------------------------------------------------------------------
# A close outlives a restart (docs/protocol.md, "Closing a chat"): agents one after the other on
# the same SQLite journal file.


@asynccontextmanager
async def _agent_on(path: Path, workspace: Path) -> AsyncIterator[Agent]:
    """An agent on the journal at `path`; stopped gracefully (9.3) at the end of the block."""
    journal = SqliteJournal(path)
    ctx = AgentContext(workspace=str(workspace), journal=journal, limits=Limits())
    try:
        async with trio.open_nursery() as nursery:
            agent: Agent = await nursery.start(Agent(ctx).run)
            yield agent
            await agent.shutdown()
            nursery.cancel_scope.cancel()
    finally:
        journal.close()


async def _next(outbox: Outbox, wanted: type[Any], call_id: str | None = None) -> Any:
    while True:
        await outbox.wait()
        for event in outbox.take():
            if isinstance(event, wanted) and getattr(event, "call_id", call_id) == call_id:
                return event


def _closed_rows(path: Path) -> list[str]:
    journal = SqliteJournal(path)
    try:
        return journal.load_closed()
    finally:
        journal.close()


async def test_a_close_survives_restarts_until_its_records_are_forgotten(tmp_path: Path) -> None:
    path = tmp_path / "state" / "journal.sqlite3"
    (tmp_path / "f.txt").write_text("hi\n")
    read = CallSpec("r", "read_file", {"path": "f.txt"})
    outbox = Outbox()
    with trio.fail_after(TEST_DEADLINE_S):
        async with _agent_on(path, tmp_path) as agent:
            agent.call(outbox, "c", read, stream=False, rid=None)
            first = await _next(outbox, ResultEvent, "r")
            agent.close_chat(outbox, "c", 1)
            closed = await _next(outbox, ChatClosedEvent)
            # `chat_closed` comes once the close is on disk: another reader sees it.
            journaled = _closed_rows(path)
        async with _agent_on(path, tmp_path) as agent:
            with pytest.raises(ToolwireError) as refused:
                agent.call(outbox, "c", CallSpec("new", "read_file", {"path": "f.txt"}),
                           stream=False, rid=None)  # fmt: skip
            with pytest.raises(ToolwireError) as refused_turn:
                agent.turn(outbox, "c", "t", [CallSpec("t1", "read_file", {"path": "f.txt"})],
                           stream=False, rid=None)  # fmt: skip
            agent.call(outbox, "c", read, stream=False, rid=None)
            retried = await _next(outbox, ResultEvent, "r")
            agent.close_chat(outbox, "c", 2)
            again = await _next(outbox, ChatClosedEvent)
            # Its records age past forget_after_s: forgotten by the sweeper, the chat is gone,
            # and its close row with it.
            chat = agent.chats["c"]
            for record in chat.records:
                record.touched_at -= agent.ctx.limits.forget_after_s + 1
            agent.sweep()
            await agent.ctx.journal.wait_durable(agent.ctx.journal.queued_seq)
            forgotten = _closed_rows(path)
        async with _agent_on(path, tmp_path) as agent:
            agent.call(outbox, "c", CallSpec("new", "read_file", {"path": "f.txt"}),
                       stream=False, rid=None)  # fmt: skip
            anew = await _next(outbox, ResultEvent, "new")
    assert closed.call_ids == [] and journaled == ["c"]
    assert refused.value.code == "chat_closed" and refused_turn.value.code == "chat_closed"
    assert retried.result == first.result
    assert (again.call_ids, again.process_ids, again.rid) == ([], [], 2)
    assert forgotten == []
    assert anew.result.outcome.value == "completed"


async def test_recovery_drops_the_close_of_a_chat_with_no_records_left(tmp_path: Path) -> None:
    """A crash between forgetting a closed chat's last record and its close: the chat's
    records are all forgotten, so it is gone (9.6) and its id takes new calls."""
    path = tmp_path / "state" / "journal.sqlite3"
    (tmp_path / "f.txt").write_text("hi\n")
    journal = SqliteJournal(path)
    async with trio.open_nursery() as crashed:
        await crashed.start(journal.run)
        await journal.wait_durable(journal.mark_closed("emptied", 1))
        crashed.cancel_scope.cancel()
    journal.close()
    outbox = Outbox()
    with trio.fail_after(TEST_DEADLINE_S):
        async with _agent_on(path, tmp_path) as agent:
            await agent.ctx.journal.wait_durable(agent.ctx.journal.queued_seq)
            left = _closed_rows(path)
            agent.call(outbox, "emptied", CallSpec("n", "read_file", {"path": "f.txt"}),
                       stream=False, rid=None)  # fmt: skip
            result = await _next(outbox, ResultEvent, "n")
    assert left == []
    assert result.result.outcome.value == "completed"


async def test_a_close_survives_kill9_and_a_repeat_of_it_answers_at_once(tmp_path: Path) -> None:
    args = {"command": "echo ran >> runs.txt; echo up; exec sleep 100"}
    async with serve(tmp_path) as server:
        async with connect(server.url, state_token(tmp_path)) as conn:
            await conn.send(call("c", "x", "execute", args))
            # Its output says the marker is written: the close stops it after that.
            await wait_for(conn, lambda m: m["type"] == "output" and m["call_id"] == "x")
            await conn.send({"type": "close_chat", "chat_id": "c", "rid": 1})
            closed = await wait_for(conn, lambda m: m["type"] == "chat_closed")
            first = await wait_for(conn, of("result", "x"))
        await kill9(server.process)
    async with serve(tmp_path) as server, connect(server.url, state_token(tmp_path)) as conn:
        refused = await conn.call("c", "y", "execute", {"command": "touch y.txt"})
        again = await conn.call("c", "x", "execute", args)
        await conn.send({"type": "close_chat", "chat_id": "c", "rid": 2})
        repeat = await wait_for(conn, lambda m: m["type"] == "chat_closed")
    assert closed["call_ids"] == ["x"] and closed["process_ids"] == ["x"]
    assert first["outcome"] == "canceled"
    assert refused["type"] == "error" and refused["code"] == "chat_closed"
    assert again == first
    assert (repeat["call_ids"], repeat["process_ids"], repeat["rid"]) == ([], [], 2)
    assert (tmp_path / "ws" / "runs.txt").read_text() == "ran\n"
    assert not (tmp_path / "ws" / "y.txt").exists()
