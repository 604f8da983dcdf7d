"""`approve` with `scope: "chat"` (PROTOCOL.md 9.5, issue 16) through the real server.

Like tests/test_approvals.py, every gated call writes its own marker file when (and only when)
it really runs, and waiting is always on a protocol message, never on a sleep; `barrier()`
proves that something did NOT arrive. The restart tests kill -9 a real `toolwire serve` and
start it again on the same state dir, or rebuild an agent from a real SQLite journal.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import msgspec
import trio

from tests.conftest import LiveServer, MakeServer
from tests.test_approvals import (
    CHAT,
    DEADLINE_S,
    approve_msg,
    barrier,
    decisions,
    error_for,
    marked_execute,
    marked_write,
    ran,
    ran_once,
    rid,
    seen,
    state_seen_by_new_request,
)
from tests.test_journal import kill9, state_token
from tests.test_serve import serve
from tests.wsclient import connect, is_result, of, wait_for
from toolwire.actors.agent import Agent, AgentContext, Limits
from toolwire.actors.chat import CallSpec
from toolwire.actors.events import ResultEvent
from toolwire.actors.journal import SCHEMA_VERSION, JournalRow, SqliteJournal
from toolwire.actors.outbox import Outbox
from toolwire.transport.client import connect as client_connect

OTHER_CHAT = "chat-b"


async def test_scope_chat_opens_every_parked_gate_of_the_tool_and_later_calls_run_ungated(
    live: LiveServer,
) -> None:
    with trio.fail_after(DEADLINE_S):
        async with live.connect() as caller, live.connect() as watcher, live.connect() as judge:
            for message in (
                marked_execute(CHAT, "e1", approval=True),
                marked_execute(CHAT, "e2", approval=True),
                marked_write(CHAT, "w", approval=True),
                marked_execute(OTHER_CHAT, "x", approval=True),
            ):
                await caller.send(message)
                await wait_for(caller, of("approval", message["call_id"], message["chat_id"]))
            await watcher.send({"type": "attach", "chat_id": CHAT, "call_id": "e2"})
            await wait_for(watcher, of("approval", "e2"))

            await judge.send(approve_msg(CHAT, "e1", True, scope="chat"))
            # Both execute gates open: every follower of each hears it, and each runs once.
            for call_id in ("e1", "e2"):
                result = await wait_for(caller, is_result(call_id))
                assert result["outcome"] == "completed", result
                assert decisions(caller, call_id) == ["approved"]
                assert ran_once(live, call_id)
            assert (await wait_for(watcher, is_result("e2")))["outcome"] == "completed"
            assert decisions(watcher, "e2") == ["approved"]
            # The approver's one reply is the approval_resolved of the gate it named.
            resolved = await wait_for(judge, of("approval_resolved", "e1"))
            assert resolved["decision"] == "approved"
            await barrier(judge)
            assert seen(judge, "e2") == []

            # Not the write_file gate, and not the other chat's execute.
            assert await state_seen_by_new_request(live, CHAT, "w") == "awaiting_approval"
            assert await state_seen_by_new_request(live, OTHER_CHAT, "x") == "awaiting_approval"
            assert not ran(live, "w") and not ran(live, "x", OTHER_CHAT)

            # A later execute in that chat runs without a gate, even when it asks for one.
            await caller.send(marked_execute(CHAT, "e3", approval=True, rid="later"))
            accepted = await wait_for(caller, of("accepted", "e3"))
            assert accepted["state"] == "running"
            assert (await wait_for(caller, is_result("e3")))["outcome"] == "completed"
            assert seen(caller, "e3", "approval") == [] and ran_once(live, "e3")

            # Another chat still parks, and so does write_file in the approved chat.
            await caller.send(marked_execute(OTHER_CHAT, "y", approval=True))
            parked = await wait_for(caller, of("accepted", "y", OTHER_CHAT))
            assert parked["state"] == "awaiting_approval"
            await caller.send(marked_write(CHAT, "w2", approval=True))
            assert (await wait_for(caller, of("accepted", "w2")))["state"] == "awaiting_approval"


async def test_scope_chat_inside_a_turn_lets_the_turns_later_calls_pass(
    make_server: MakeServer,
) -> None:
    live = await make_server(approve_tools=frozenset({"execute"}))
    with trio.fail_after(DEADLINE_S):
        async with live.connect() as conn:
            await conn.send(marked_execute(CHAT, "first"))
            await wait_for(conn, of("approval", "first"))
            await conn.send(approve_msg(CHAT, "first", True, scope="chat"))
            await wait_for(conn, is_result("first"))
            calls = [
                {
                    "call_id": f"t{i}",
                    "tool": "execute",
                    "args": marked_execute(CHAT, f"t{i}")["args"],
                }
                for i in range(2)
            ]
            await conn.send({"type": "turn", "chat_id": CHAT, "turn_id": "turn", "calls": calls})
            done = await wait_for(conn, lambda m: m["type"] == "turn_result")
            assert [r["outcome"] for r in done["results"]] == ["completed", "completed"]
            assert [m for m in conn.seen if m["type"] == "approval"] == [
                m for m in conn.seen if m["type"] == "approval" and m["call_id"] == "first"
            ]


async def test_scope_chat_with_a_denial_denies_only_that_call_and_remembers_nothing(
    live: LiveServer,
) -> None:
    with trio.fail_after(DEADLINE_S):
        async with live.connect() as conn:
            for call_id in ("d1", "d2"):
                await conn.send(marked_execute(CHAT, call_id, approval=True))
                await wait_for(conn, of("approval", call_id))
            await conn.send(approve_msg(CHAT, "d1", False, scope="chat", reason="not now"))
            result = await wait_for(conn, is_result("d1"))
            assert (result["outcome"], result["text"]) == (
                "denied",
                "tool call was denied: not now; no changes were made",
            )
            assert await state_seen_by_new_request(live, CHAT, "d2") == "awaiting_approval"
            await conn.send(marked_execute(CHAT, "d3", approval=True))
            assert (await wait_for(conn, of("accepted", "d3")))["state"] == "awaiting_approval"
            assert not ran(live, "d1") and not ran(live, "d2") and not ran(live, "d3")


async def test_an_unknown_scope_is_bad_message_and_changes_nothing(live: LiveServer) -> None:
    with trio.fail_after(DEADLINE_S):
        async with live.connect() as conn:
            await conn.send(marked_execute(CHAT, "g", approval=True))
            await wait_for(conn, of("approval", "g"))
            tag = rid()
            await conn.send(approve_msg(CHAT, "g", True, scope="forever", rid=tag))
            error = await error_for(conn, tag)
            assert error["code"] == "bad_message" and "$.scope" in error["message"], error
            assert await state_seen_by_new_request(live, CHAT, "g") == "awaiting_approval"
            assert not ran(live, "g")


async def test_the_approval_ends_when_the_chats_last_record_is_forgotten(
    make_server: MakeServer,
) -> None:
    # forget_after_s=0: every finished record may be forgotten at the next sweep.
    live = await make_server(limits=Limits(forget_after_s=0))
    with trio.fail_after(DEADLINE_S):
        async with live.connect() as conn:
            await conn.send(marked_write(CHAT, "w1", approval=True))
            await wait_for(conn, of("approval", "w1"))
            await conn.send(approve_msg(CHAT, "w1", True, scope="chat"))
            await wait_for(conn, is_result("w1"))
            await conn.send({"type": "detach", "chat_id": CHAT, "call_id": "w1"})
            await barrier(conn)
            live.agent.sweep()
            assert CHAT not in live.agent.chats  # every record forgotten: the chat is gone
            journal = live.agent.ctx.journal
            await journal.wait_durable(journal.queued_seq)
            if isinstance(journal, SqliteJournal):
                assert SqliteJournal(journal.path).load_approvals() == []
            await conn.send(marked_write(CHAT, "w2", approval=True))
            assert (await wait_for(conn, of("accepted", "w2")))["state"] == "awaiting_approval"


async def test_the_typed_client_approves_for_the_chat(live: LiveServer) -> None:
    with trio.fail_after(DEADLINE_S):
        async with client_connect(live.url, live.token) as client:
            first = await client.call(CHAT, "c1", "execute", {"command": "echo one"}, approval=True)
            second = await client.call(
                CHAT, "c2", "execute", {"command": "echo two"}, approval=True
            )
            assert first.accepted.state == second.accepted.state == "awaiting_approval"
            resolved = await client.approve(CHAT, "c1", True, scope="chat")
            assert (resolved.call_id, resolved.decision) == ("c1", "approved")
            assert (await first.result()).output == "one\n"
            assert (await second.result()).output == "two\n"
            later = await client.call(
                CHAT, "c3", "execute", {"command": "echo three"}, approval=True
            )
            assert later.accepted.state == "running"
            assert (await later.result()).output == "three\n"


# --- restarts ------------------------------------------------------------------------------------


async def test_the_scope_survives_kill9_and_restart(tmp_path: Path) -> None:
    async with serve(tmp_path) as server:
        async with connect(server.url, state_token(tmp_path)) as conn:
            await conn.send(marked_execute(CHAT, "e1", approval=True))
            await wait_for(conn, of("approval", "e1"))
            await conn.send(approve_msg(CHAT, "e1", True, scope="chat"))
            # A result is published once durable, and the approval was queued before the
            # call's start: its result proves the approval is on disk.
            assert (await wait_for(conn, is_result("e1")))["outcome"] == "completed"
        await kill9(server.process)
    async with serve(tmp_path) as server, connect(server.url, state_token(tmp_path)) as conn:
        await conn.send(marked_execute(CHAT, "e2", approval=True))
        assert (await wait_for(conn, of("accepted", "e2")))["state"] == "running"
        assert (await wait_for(conn, is_result("e2")))["outcome"] == "completed"
        assert seen(conn, "e2", "approval") == []
        await conn.send(marked_execute(OTHER_CHAT, "x", approval=True))
        assert (await wait_for(conn, of("accepted", "x", OTHER_CHAT)))["state"] == (
            "awaiting_approval"
        )
        await conn.send(marked_write(CHAT, "w", approval=True))
        assert (await wait_for(conn, of("accepted", "w")))["state"] == "awaiting_approval"
    workspace = tmp_path / "ws"
    assert (workspace / f"m_{CHAT}_e2").read_text() == "ran\n"
    assert not (workspace / f"m_{OTHER_CHAT}_x").exists()


async def _result_of(outbox: Outbox, call_id: str) -> ResultEvent:
    while True:
        await outbox.wait()
        for event in outbox.take():
            if isinstance(event, ResultEvent) and event.call_id == call_id:
                return event


async def test_recovery_opens_a_gate_of_an_approved_tool_and_drops_approvals_of_empty_chats(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    """A crash after the approval was committed but before a gate's opening was: the gate is
    parked in the journal, its tool approved. Recovery opens it; an approval of a chat with no
    records left (a crash between forgetting them and forgetting it) is dropped."""
    path = tmp_path / "state" / "journal.sqlite3"
    journal = SqliteJournal(path)
    # The crashed agent's journal: written, then closed; the new agent runs its own writer.
    async with trio.open_nursery() as crashed:
        await crashed.start(journal.run)
        args = {"path": "parked.txt", "content": "ran\n"}
        parked = JournalRow(
            chat_id=CHAT, call_id="p", state="awaiting_approval", tool="write_file",
            fingerprint=b"f", args=args, approval=True, touched_at_ms=1,
        )  # fmt: skip
        journal.write(parked)
        journal.approve_tool(CHAT, "write_file")
        await journal.wait_durable(journal.approve_tool("emptied-chat", "execute"))
        crashed.cancel_scope.cancel()
    journal.close()
    journal = SqliteJournal(path)

    workspace = tmp_path / "ws"
    workspace.mkdir()
    agent = await nursery.start(Agent(AgentContext(workspace=str(workspace), journal=journal)).run)
    outbox = Outbox()
    agent.attach(outbox, CHAT, "p", 0, None)
    with trio.fail_after(DEADLINE_S):
        result = await _result_of(outbox, "p")
    assert result.result.outcome.value == "completed"
    assert (workspace / "parked.txt").read_text() == "ran\n"
    await journal.wait_durable(journal.queued_seq)
    assert SqliteJournal(path).load_approvals() == [(CHAT, "write_file")]
    agent.call(outbox, CHAT, CallSpec("q", "write_file", args | {"path": "q.txt"}, approval=True),
               stream=True, rid=None)  # fmt: skip
    with trio.fail_after(DEADLINE_S):
        assert (await _result_of(outbox, "q")).result.outcome.value == "completed"


def test_a_version_1_journal_is_upgraded_in_place_and_keeps_its_records(tmp_path: Path) -> None:
    path = tmp_path / "journal.sqlite3"
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT)")
    db.execute(
        "CREATE TABLE calls (chat_id TEXT NOT NULL, call_id TEXT NOT NULL, row BLOB NOT NULL, "
        "touched_at_ms INTEGER NOT NULL, PRIMARY KEY (chat_id, call_id)) WITHOUT ROWID"
    )
    db.execute("INSERT INTO meta VALUES ('schema_version', '1')")
    row = JournalRow(chat_id=CHAT, call_id="kept", state="done", tool="read_file",
                     fingerprint=b"f", args={"path": "x"}, touched_at_ms=1)  # fmt: skip
    db.execute("INSERT INTO calls VALUES (?, ?, ?, 1)", (CHAT, "kept", msgspec.msgpack.encode(row)))
    db.commit()
    db.close()
    journal = SqliteJournal(path)
    assert [r.call_id for r in journal.load()] == ["kept"] and journal.load_approvals() == []
    journal.close()
    db = sqlite3.connect(path)
    version = db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    db.close()
    assert version == (str(SCHEMA_VERSION),) == ("3",)
