"""At most once across agent restarts (issue 5): the journal, recovery, and kill -9 of a real
`toolwire serve` in the middle of each state."""

from __future__ import annotations

import contextlib
import os
import signal
import sqlite3
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import msgspec
import pytest
import trio

from tests.test_serve import ROOT, serve
from tests.wsclient import connect, is_result
from toolwire.actors.agent import Agent, AgentContext, Limits
from toolwire.actors.chat import CallSpec
from toolwire.actors.events import ResultEvent
from toolwire.actors.journal import (
    SCHEMA_VERSION,
    JournalError,
    JournalRow,
    MemoryJournal,
    SqliteJournal,
)
from toolwire.actors.outbox import Outbox
from toolwire.actors.results import TEXT_AGENT_RESTARTED, TEXT_CANCELED_BEFORE_RUN

# ---------------------------------------------------------------------------------------------
# The store itself


def _row(call_id: str, state: str = "done", touched: int = 1) -> JournalRow:
    return JournalRow(
        chat_id="c", call_id=call_id, state=state, tool="read_file", fingerprint=b"f",
        args={"path": "x"}, touched_at_ms=touched,
    )  # fmt: skip


async def test_writes_are_grouped_into_commits_and_survive_reopening(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    path = tmp_path / "state" / "journal.sqlite3"
    journal = SqliteJournal(path)
    await nursery.start(journal.run)
    seqs = [journal.write(_row(f"call-{i}")) for i in range(500)]
    assert not journal.is_durable(seqs[-1])
    await journal.wait_durable(seqs[-1])
    assert all(journal.is_durable(seq) for seq in seqs)
    journal.touch("c", "call-1", 99)
    journal.delete("c", "call-2")
    await journal.wait_durable(journal.write(_row("last")))
    reopened = SqliteJournal(path)
    rows = {row.call_id: row for row in reopened.load()}
    assert len(rows) == 500  # 500 - call-2 + last
    assert "call-2" not in rows and rows["call-1"].args == {"path": "x"}
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700


def test_a_corrupt_or_foreign_journal_is_refused_with_its_name(tmp_path: Path) -> None:
    garbage = tmp_path / "garbage.sqlite3"
    garbage.write_bytes(b"this is not a database" * 100)
    with pytest.raises(JournalError, match=str(garbage)):
        SqliteJournal(garbage)
    newer = tmp_path / "newer.sqlite3"
    SqliteJournal(newer).close()
    db = sqlite3.connect(newer)
    db.execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'")
    db.commit()
    db.close()
    with pytest.raises(JournalError, match="schema version 99"):
        SqliteJournal(newer)


def test_the_sync_level_is_what_sqlite_runs_with_and_a_wrong_one_is_named(
    tmp_path: Path,
) -> None:
    # SQLite's numbering of `PRAGMA synchronous`: 1 NORMAL, 2 FULL.
    for sync, level in (("full", 2), ("normal", 1)):
        journal = SqliteJournal(tmp_path / f"{sync}.sqlite3", sync)
        assert journal._db.execute("PRAGMA synchronous").fetchone()[0] == level
        assert journal._db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        journal.close()
    with pytest.raises(ValueError, match="'off'"):
        SqliteJournal(tmp_path / "off.sqlite3", "off")
    assert not (tmp_path / "off.sqlite3").exists()


def test_the_memory_journal_keeps_nothing() -> None:
    journal = MemoryJournal()
    assert journal.write(_row("x")) == 0 and journal.is_durable(0) and journal.load() == []
    journal.mark_closed("c", 1)
    assert journal.load_closed() == []


def test_a_version_2_journal_is_upgraded_in_place_and_keeps_what_it_held(tmp_path: Path) -> None:
    """Version 3 added `closed_chats` (close_chat, PROTOCOL.md 9.6): a version 2 file (as the
    agent before it wrote them) opens with its records and approvals, and no chat closed."""
    path = tmp_path / "journal.sqlite3"
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT)")
    db.execute(
        "CREATE TABLE calls (chat_id TEXT NOT NULL, call_id TEXT NOT NULL, row BLOB NOT NULL, "
        "touched_at_ms INTEGER NOT NULL, PRIMARY KEY (chat_id, call_id)) WITHOUT ROWID"
    )
    db.execute(
        "CREATE TABLE chat_approvals (chat_id TEXT NOT NULL, tool TEXT NOT NULL, "
        "PRIMARY KEY (chat_id, tool)) WITHOUT ROWID"
    )
    db.execute("INSERT INTO meta VALUES ('schema_version', '2')")
    db.execute(
        "INSERT INTO calls VALUES ('c', 'kept', ?, 1)", (msgspec.msgpack.encode(_row("kept")),)
    )
    db.execute("INSERT INTO chat_approvals VALUES ('c', 'execute')")
    db.commit()
    db.close()
    journal = SqliteJournal(path)
    assert [row.call_id for row in journal.load()] == ["kept"]
    assert journal.load_approvals() == [("c", "execute")] and journal.load_closed() == []
    journal.close()
    db = sqlite3.connect(path)
    version = db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    db.close()
    assert version == (str(SCHEMA_VERSION),) == ("3",)


# ---------------------------------------------------------------------------------------------
# Recovery in process: stop an agent, start another on the same journal file


async def _collect(outbox: Outbox, call_id: str) -> ResultEvent:
    while True:
        await outbox.wait()
        for event in outbox.take():
            if isinstance(event, ResultEvent) and event.call_id == call_id:
                return event


async def test_forgetting_deletes_from_the_journal(tmp_path: Path) -> None:
    path = tmp_path / "journal.sqlite3"
    (tmp_path / "f.txt").write_text("hi\n")
    async with trio.open_nursery() as nursery:
        ctx = AgentContext(
            workspace=str(tmp_path), journal=SqliteJournal(path), limits=Limits(forget_after_s=0)
        )
        agent = await nursery.start(Agent(ctx).run)
        outbox = Outbox()
        agent.call(
            outbox, "c", CallSpec("r", "read_file", {"path": "f.txt"}), stream=True, rid=None
        )
        await _collect(outbox, "r")
        assert [row.call_id for row in SqliteJournal(path).load()] == ["r"]
        agent.sweep()
        await trio.sleep(0.05)
        await ctx.journal.wait_durable(ctx.journal.write(_row("marker")))
        assert [row.call_id for row in SqliteJournal(path).load()] == ["marker"]
        nursery.cancel_scope.cancel()


# ---------------------------------------------------------------------------------------------
# kill -9 of a real `toolwire serve`, restart on the same state dir


def state_token(tmp_path: Path) -> str:
    return (tmp_path / "state" / "token").read_text().strip()


async def kill9(process: trio.Process) -> None:
    process.send_signal(signal.SIGKILL)
    await process.wait()


async def test_kill9_while_running_the_call_is_re_adopted_and_never_runs_again(
    tmp_path: Path,
) -> None:
    """PROTOCOL.md 10.1: the command outlives the agent; after the restart the call is still
    running (a repeat subscribes to it), a cancel stops it and saves `canceled`, and it never
    ran twice. (A command whose keeper is gone too ends `unknown`: tests/test_keeper.py.)"""
    marker = "runs.txt"
    command = f"echo ran >> {marker}; echo $$ > shell.pid; echo started; sleep 300"
    args = {"command": command}
    async with serve(tmp_path) as server:
        async with connect(server.url, state_token(tmp_path)) as conn:
            await conn.send({"type": "call", "chat_id": "c", "call_id": "long", "tool": "execute",
                             "args": args})  # fmt: skip
            await conn.recv_until(lambda m: m["type"] == "output" and "started" in m["data"])
        await kill9(server.process)
    shell = int((tmp_path / "ws" / "shell.pid").read_text())
    try:
        async with serve(tmp_path) as server, connect(server.url, state_token(tmp_path)) as conn:
            assert "1 records recovered" in server.stderr_path.read_text()
            await conn.send({"type": "call", "chat_id": "c", "call_id": "long", "tool": "execute",
                             "args": args})  # fmt: skip
            got = await conn.recv_until(lambda m: m["type"] == "output")
            accepted = [m for m in got if m["type"] == "accepted"][-1]
            assert accepted["replay"] is True and accepted["state"] == "running"
            assert got[-1]["offset"] == 0 and got[-1]["data"] == "started\n"
            await conn.send({"type": "cancel", "chat_id": "c", "call_ids": ["long"], "rid": 1})
            cancel = await conn.recv_until(lambda m: m["type"] == "cancel_result")
            result = cancel[-1]["result"]
            assert cancel[-1]["received"] is True
            assert result["outcome"] == "canceled" and result["output"] == "started\n"
        assert (tmp_path / "ws" / marker).read_text() == "ran\n"  # it never ran again
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(shell, signal.SIGKILL)


@pytest.mark.parametrize("sync", ["full", "normal"])
async def test_kill9_after_the_result_serves_it_again_byte_for_byte(
    tmp_path: Path, sync: str
) -> None:
    # Both sync levels keep every commit across a crash of the agent (docs/durability.md).
    args = {"command": "echo ran >> runs.txt; echo done"}
    async with serve(tmp_path, "--sync", sync) as server:
        assert f"(sync {sync})" in server.stderr_path.read_text()
        async with connect(server.url, state_token(tmp_path)) as conn:
            first = await conn.call("c", "x", "execute", args)
        await kill9(server.process)
    async with serve(tmp_path) as server, connect(server.url, state_token(tmp_path)) as conn:
        again = await conn.call("c", "x", "execute", args)
        assert again == first
        conflict = await conn.call("c", "x", "execute", {"command": "echo other"})
        assert conflict["type"] == "error" and conflict["code"] == "conflict"
    assert (tmp_path / "ws" / "runs.txt").read_text() == "ran\n"


async def test_kill9_after_a_cancel_tombstone_still_refuses(tmp_path: Path) -> None:
    async with serve(tmp_path) as server:
        async with connect(server.url, state_token(tmp_path)) as conn:
            await conn.send({"type": "cancel", "chat_id": "c", "call_ids": ["late"], "rid": 1})
            reply = await conn.recv_until(lambda m: m["type"] == "cancel_result")
            assert reply[-1]["received"] is False
        await kill9(server.process)
    async with serve(tmp_path) as server, connect(server.url, state_token(tmp_path)) as conn:
        result = await conn.call("c", "late", "execute", {"command": "touch ran.txt"})
        assert result["outcome"] == "not_run" and result["text"] == TEXT_CANCELED_BEFORE_RUN
    assert not (tmp_path / "ws" / "ran.txt").exists()


async def test_kill9_with_a_parked_gate_parks_it_again(tmp_path: Path) -> None:
    args = {"command": "echo ran >> runs.txt"}
    async with serve(tmp_path) as server:
        async with connect(server.url, state_token(tmp_path)) as conn:
            await conn.send({"type": "call", "chat_id": "c", "call_id": "g", "tool": "execute",
                             "args": args, "approval": True})  # fmt: skip
            await conn.recv_until(lambda m: m["type"] == "approval")
            # The gate is journaled without waiting for the disk. A cancel tombstone is durable
            # before its reply, and commits are in order: its reply proves the gate landed.
            await conn.send({"type": "cancel", "chat_id": "c", "call_ids": ["other"]})
            await conn.recv_until(lambda m: m["type"] == "cancel_result")
        await kill9(server.process)
    async with serve(tmp_path) as server, connect(server.url, state_token(tmp_path)) as conn:
        await conn.send({"type": "attach", "chat_id": "c", "call_id": "g"})
        got = await conn.recv_until(lambda m: m["type"] == "approval")
        assert got[0]["type"] == "accepted" and got[0]["state"] == "awaiting_approval"
        assert got[-1]["tool"] == "execute" and got[-1]["args"] == args
        assert not (tmp_path / "ws" / "runs.txt").exists()
        await conn.send({"type": "approve", "chat_id": "c", "call_id": "g", "approved": True})
        result = (await conn.recv_until(is_result("g")))[-1]
        assert result["outcome"] == "completed"
    assert (tmp_path / "ws" / "runs.txt").read_text() == "ran\n"


async def test_only_a_parked_gate_keeps_its_args_on_disk(tmp_path: Path) -> None:
    """Args are journaled to announce a parked gate again after a restart, and for nothing
    else: a call that ran keeps its fingerprint (a repeat with other args is still refused),
    so a large `write_file` is not written into the journal at all."""
    journal = tmp_path / "state" / "journal.sqlite3"
    content = "x" * 300_000
    command = {"command": "echo gated"}
    async with serve(tmp_path) as server:
        async with connect(server.url, state_token(tmp_path)) as conn:
            wrote = await conn.call("c", "w", "write_file", {"path": "f.txt", "content": content})
            assert wrote["outcome"] == "completed"
            ran = await conn.call("c", "e", "execute", {"command": "true"})
            assert ran["outcome"] == "completed"
            await conn.send({"type": "call", "chat_id": "c", "call_id": "g", "tool": "execute",
                             "args": command, "approval": True})  # fmt: skip
            await conn.recv_until(lambda m: m["type"] == "approval")
            # Commits are in order and a cancel tombstone is durable before its reply.
            await conn.send({"type": "cancel", "chat_id": "c", "call_ids": ["barrier"]})
            await conn.recv_until(lambda m: m["type"] == "cancel_result")
            db = sqlite3.connect(f"file:{journal}?mode=ro", uri=True)
            rows = {
                call_id: msgspec.msgpack.decode(blob, type=JournalRow)
                for call_id, blob in db.execute("SELECT call_id, row FROM calls")
            }
            size = sum(len(blob) for (blob,) in db.execute("SELECT row FROM calls"))
            db.close()
            assert (rows["w"].state, rows["w"].args) == ("done", None)
            assert (rows["e"].state, rows["e"].args) == ("done", None)
            assert rows["w"].fingerprint and rows["e"].fingerprint
            assert (rows["g"].state, rows["g"].args) == ("awaiting_approval", command)
            assert size < 10_000  # not the 300 KB the write carried
            other = await conn.call("c", "w", "write_file", {"path": "f.txt", "content": "y"})
            assert other["type"] == "error" and other["code"] == "conflict"
            same = await conn.call("c", "w", "write_file", {"path": "f.txt", "content": content})
            assert same["type"] == "result" and same["outcome"] == "completed"
        await kill9(server.process)
    async with serve(tmp_path) as server, connect(server.url, state_token(tmp_path)) as conn:
        # After a restart: the fingerprint still tells a repeat from a conflict.
        other = await conn.call("c", "w", "write_file", {"path": "f.txt", "content": "y"})
        assert other["type"] == "error" and other["code"] == "conflict"
        same = await conn.call("c", "w", "write_file", {"path": "f.txt", "content": content})
        assert same["type"] == "result" and same["outcome"] == "completed"
    assert (tmp_path / "ws" / "f.txt").read_text() == content


async def test_kill9_while_a_read_only_call_runs_a_repeat_runs_it_anew(tmp_path: Path) -> None:
    """A read-only call journals no start (it has no effect a crash could forget): cut short by
    a crash, it left no trace, so a repeat runs it again instead of ending `unknown`."""
    journal = tmp_path / "state" / "journal.sqlite3"
    wait = {"process_id": "bg", "wait": True, "wait_ms": 60_000}
    async with serve(tmp_path) as server:
        async with connect(server.url, state_token(tmp_path)) as conn:
            started = await conn.call("c", "bg", "execute", {"command": "sleep 300"},
                                      background=True)  # fmt: skip
            assert started["type"] == "result"  # returned at once; the process runs on
            # The group's leader, from `started` (a pid file the shell writes may not be there
            # yet when the agent is killed: the call returns as the process starts).
            orphan = next(m["pid"] for m in conn.seen if m["type"] == "started")
            await conn.send({"type": "call", "chat_id": "c", "call_id": "w",
                             "tool": "process_output", "args": wait})  # fmt: skip
            accepted = await conn.recv_until(lambda m: m["type"] == "accepted")
            assert accepted[-1]["call_id"] == "w" and accepted[-1]["state"] == "running"
            # Commits are in order and a cancel tombstone is durable before its reply: after
            # it, anything the waiting call journaled would be on disk.
            await conn.send({"type": "cancel", "chat_id": "c", "call_ids": ["barrier"]})
            await conn.recv_until(lambda m: m["type"] == "cancel_result")
            db = sqlite3.connect(f"file:{journal}?mode=ro", uri=True)
            rows = {call_id for (call_id,) in db.execute("SELECT call_id FROM calls")}
            db.close()
            assert rows == {"bg", "barrier"}  # no row for the waiting read
        await kill9(server.process)
    try:
        async with serve(tmp_path) as server, connect(server.url, state_token(tmp_path)) as conn:
            # The background process was re-adopted (PROTOCOL.md 10.1): stopped here, so the
            # read that runs anew ends at once with its exit.
            stop = {"process_id": "bg", "signal": "SIGKILL"}
            assert (await conn.call("c", "kill", "process_signal", stop))["outcome"] == "completed"
            repeat = await conn.call("c", "w", "process_output", wait)
            accepted = [m for m in conn.seen if m["type"] == "accepted"][-1]
            assert accepted["replay"] is False  # a new call: nothing of it survived
            # It is not told `unknown` as a call that may have had an effect would be.
            assert repeat["type"] == "result" and repeat["outcome"] == "completed"
            assert repeat["data"]["running"] is False
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(orphan, signal.SIGKILL)


def test_a_corrupt_journal_stops_serve_with_the_file_named(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    (state / "journal.sqlite3").write_bytes(b"\x00garbage" * 512)
    done = subprocess.run(
        [sys.executable, "-m", "toolwire.cli.main", "serve", "--port", "0",
         "--state-dir", str(state), "--workspace", str(tmp_path)],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
        timeout=30,
    )  # fmt: skip
    assert done.returncode == 1
    assert str(state / "journal.sqlite3") in done.stderr
    assert "listening" not in done.stdout


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_kill9_at_a_random_moment_nothing_runs_twice(tmp_path: Path, seed: int) -> None:
    import random

    rng = random.Random(seed)
    naps = [rng.choice([0, 0, 0.05, 0.2, 5]) for _ in range(16)]
    calls = {
        f"k{i}": {"command": f"echo $$ > p{i}; echo x >> m{i}; sleep {nap}; echo ok"}
        for i, nap in enumerate(naps)
    }
    seen_before: dict[str, dict[str, Any]] = {}
    async with serve(tmp_path) as server:
        async with connect(server.url, state_token(tmp_path)) as conn:
            for call_id, args in calls.items():
                await conn.send({"type": "call", "chat_id": "c", "call_id": call_id,
                                 "tool": "execute", "args": args})  # fmt: skip
            # Crash after a seeded number of messages: somewhere between accepts and results.
            for _ in range(rng.randrange(5, 60)):
                message = await conn.recv()
                if message["type"] == "result":
                    seen_before[message["call_id"]] = message
        await kill9(server.process)
    ws = tmp_path / "ws"
    try:
        async with serve(tmp_path) as server, connect(server.url, state_token(tmp_path)) as conn:
            for call_id, args in calls.items():
                result = await conn.call("c", call_id, "execute", args)
                assert result["type"] == "result"
                i = call_id[1:]
                runs = (ws / f"m{i}").read_text().count("x") if (ws / f"m{i}").exists() else 0
                assert runs <= 1, f"{call_id} ran {runs} times"
                if call_id in seen_before:
                    assert result == seen_before[call_id]  # served again, byte for byte
                if result["outcome"] == "completed":
                    assert runs == 1
                else:
                    # Started before the crash and cut short by it: said so, never guessed.
                    assert result["outcome"] == "unknown" and result["text"] == TEXT_AGENT_RESTARTED
    finally:
        for pidfile in ws.glob("p*"):  # the crashed agent's process groups are not ours
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.killpg(int(pidfile.read_text()), signal.SIGKILL)
