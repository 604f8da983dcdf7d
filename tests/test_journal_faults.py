"""A journal failure ends at most the calls it concerns, and is logged (issue 26).

Every journal path a running agent takes (read back, write, touch, delete, close, reopen,
approve) fails here through the journal test double (tests/faulty_journal.py: the real SQLite
journal, failing on demand), on a real server with real processes; each test checks that the
calls it concerns end truthfully, that another chat's command goes on, that the agent stays up
(or, where the journal can no longer write at all, stops in order), and that the log names the
calls and why.
"""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
from trio_websocket import ConnectionClosed

from tests.conftest import LiveServer, start_server
from tests.faulty_journal import FaultyJournal
from tests.oswatch import alive
from tests.wsclient import RawConn, is_result, of, wait_for
from toolwire.actors import journal_effects
from toolwire.actors.agent import Limits
from toolwire.actors.journal import SqliteJournal
from toolwire.actors.results import TEXT_AGENT_FAILURE, TEXT_AGENT_FAILURE_BEFORE_RUN
from toolwire.transport.server import CLOSE_INTERNAL_ERROR, JOURNAL_FAILED_REASON

# A command of chat c2 that runs until the test lets it end (a file appears), then says so.
WAITING = "echo up; while [ ! -e go ]; do sleep 0.02; done; echo finished"


@pytest.fixture
def quick_read_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    # The same retries, without their real pauses (they are for real disks).
    monkeypatch.setattr(journal_effects, "READ_RETRY_DELAYS_S", (0.0, 0.0, 0.0))


@pytest.fixture
async def faulty(nursery: trio.Nursery, tmp_path: Path) -> AsyncIterator[LiveServer]:
    """A server on the faulty SQLite journal with no recent-results cache: every repeat of a
    finished call reads its result back from the journal."""
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "f.txt").write_text("one\ntwo\n")
    journal = FaultyJournal(tmp_path / "state" / "journal.sqlite3")
    server = await start_server(nursery, workspace, journal=journal, result_cache_entries=0)
    yield server
    await server.server.shutdown()


def journal_of(server: LiveServer) -> FaultyJournal:
    journal = server.agent.ctx.journal
    assert isinstance(journal, FaultyJournal)
    return journal


async def start_waiting_command(conn: RawConn, chat_id: str = "c2", call_id: str = "long") -> None:
    await conn.send({"type": "call", "chat_id": chat_id, "call_id": call_id, "tool": "execute",
                     "args": {"command": WAITING}})  # fmt: skip
    await wait_for(conn, lambda m: m["type"] == "output" and m["call_id"] == call_id)


async def finish_waiting_command(
    server: LiveServer, conn: RawConn, call_id: str = "long"
) -> dict[str, Any]:
    """Let chat c2's command end; it must end on its own, completed, with all its output."""
    (server.workspace / "go").touch()
    with trio.fail_after(10):
        result = await wait_for(conn, is_result(call_id))
    assert result["outcome"] == "completed", result
    assert result["data"]["exit_code"] == 0
    assert result["output"] == "up\nfinished\n"
    return result


def agent_is_up(server: LiveServer) -> None:
    assert server.agent.failure is None
    assert server.server.readiness() is None


def logged(caplog: pytest.LogCaptureFixture, *words: str) -> list[logging.LogRecord]:
    return [
        r
        for r in caplog.records
        if r.levelno >= logging.WARNING and all(w in r.getMessage() for w in words)
    ]


class LogLine(logging.Handler):
    """Sets `seen` when a warning or worse naming all `words` is logged (on the loop, where
    the agent logs): a test awaits the line instead of polling for it."""

    def __init__(self, *words: str) -> None:
        super().__init__(logging.WARNING)
        self.words = words
        self.seen = trio.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if all(word in record.getMessage() for word in self.words):
            self.seen.set()


@contextmanager
def watching(*words: str) -> Iterator[LogLine]:
    handler = LogLine(*words)
    logger = logging.getLogger("toolwire")
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)


async def read_file(conn: RawConn, chat_id: str, call_id: str) -> dict[str, Any]:
    with trio.fail_after(10):
        return await conn.call(chat_id, call_id, "read_file", {"path": "f.txt"})


# ---------------------------------------------------------------------------------------------
# Read back


async def test_a_failed_read_back_answers_its_call_unknown_and_ends_nothing_else(
    faulty: LiveServer, caplog: pytest.LogCaptureFixture
) -> None:
    """The issue's reproduction: c1 finished a read_file, c2 runs a command, the journal's
    read fails (every retry too) when c1's call is repeated. c1's repeat is answered `unknown`
    (the agent cannot say what it was now); c2's command completes; the connection stays; the
    log names c1's call. Once reads work again, a repeat gets the saved result unchanged."""
    async with faulty.connect() as conn:
        first = await read_file(conn, "c1", "r1")
        assert first["outcome"] == "completed"
        await start_waiting_command(conn)
        journal_of(faulty).fail_reads(times=len(journal_effects.READ_RETRY_DELAYS_S) + 1)
        repeat = await read_file(conn, "c1", "r1")
        assert repeat["outcome"] == "unknown"
        assert repeat["text"] == TEXT_AGENT_FAILURE
        assert journal_of(faulty).reads_failed == len(journal_effects.READ_RETRY_DELAYS_S) + 1
        failed = logged(caplog, "reading back saved results of chat 'c1' failed", "r1")
        assert failed and failed[-1].levelno == logging.ERROR
        assert "disk I/O error" in failed[-1].getMessage()
        agent_is_up(faulty)
        await finish_waiting_command(faulty, conn)
        # The same connection goes on: a new call runs, and the saved result was never touched.
        assert (await read_file(conn, "c1", "r2"))["outcome"] == "completed"
        again = await read_file(conn, "c1", "r1")
        assert {k: v for k, v in again.items() if k != "rid"} == first


async def test_a_read_back_that_fails_once_is_retried_and_answered_with_the_saved_result(
    faulty: LiveServer, caplog: pytest.LogCaptureFixture
) -> None:
    async with faulty.connect() as conn:
        first = await read_file(conn, "c1", "r1")
        journal_of(faulty).fail_reads(times=2)
        repeat = await read_file(conn, "c1", "r1")
        assert repeat == first
        assert journal_of(faulty).reads_failed == 2
        assert logged(caplog, "trying again", "'c1'")
        assert not logged(caplog, "answered unknown")


async def test_a_failed_read_back_of_a_turn_answers_its_calls_and_the_turn(
    faulty: LiveServer, quick_read_retries: None
) -> None:
    """A repeated turn of finished calls reads them back in one go: a failed read answers
    each call once and the turn_result after them, the rest of the chat goes on."""
    turn = {"type": "turn", "chat_id": "c1", "turn_id": "t", "calls": [
        {"call_id": "a", "tool": "read_file", "args": {"path": "f.txt"}},
        {"call_id": "b", "tool": "read_file", "args": {"path": "f.txt"}}]}  # fmt: skip
    async with faulty.connect() as conn:
        await conn.send(turn)
        first = (await conn.recv_until(lambda m: m["type"] == "turn_result"))[-1]
        assert [r["outcome"] for r in first["results"]] == ["completed", "completed"]
        journal_of(faulty).fail_reads(times=100)  # every read, of each call and of the turn
        await conn.send(turn)
        got = await conn.recv_until(lambda m: m["type"] == "turn_result")
        assert [r["outcome"] for r in got[-1]["results"]] == ["unknown", "unknown"]
        assert sorted(m["call_id"] for m in got if m["type"] == "result") == ["a", "b"]
        agent_is_up(faulty)
        assert (await read_file(conn, "c1", "c"))["outcome"] == "completed"


# ---------------------------------------------------------------------------------------------
# Writes: one change refused while the journal writes others


async def test_a_refused_start_row_ends_that_call_not_run_and_nothing_else(
    faulty: LiveServer, caplog: pytest.LogCaptureFixture
) -> None:
    """The start row of c1's write_file is refused (its commit fails, and again alone): the
    write never happens and the call says so; c2's command, whose rows shared the commit,
    goes on; the agent stays up and the log names c1's call."""
    async with faulty.connect() as conn:
        await start_waiting_command(conn)
        journal_of(faulty).fail("write", chat_id="c1", call_id="w")
        with trio.fail_after(10):
            result = await conn.call("c1", "w", "write_file", {"path": "never.txt", "content": "x"})
        assert result["outcome"] == "not_run"
        assert result["text"] == TEXT_AGENT_FAILURE_BEFORE_RUN
        assert not (faulty.workspace / "never.txt").exists()
        assert logged(caplog, "the journal refused the row of c1/w", "disk I/O error")
        agent_is_up(faulty)
        await finish_waiting_command(faulty, conn)
        assert (await read_file(conn, "c1", "r"))["outcome"] == "completed"


async def test_a_refused_result_row_ends_that_call_unknown_and_nothing_else(
    faulty: LiveServer, caplog: pytest.LogCaptureFixture
) -> None:
    """c1's command ran (its start row is on disk) but its result row is refused: the call
    ends `unknown`, answered from memory (PROTOCOL.md 9.9), and a repeat gets the same."""
    async with faulty.connect() as conn:
        await start_waiting_command(conn)
        await start_waiting_command(conn, "c1", "x")
        journal_of(faulty).fail("write", chat_id="c1", call_id="x")
        (faulty.workspace / "go").touch()
        with trio.fail_after(10):
            result = await wait_for(conn, of("result", "x", "c1"))
            await wait_for(conn, of("result", "long", "c2"))
        assert result["outcome"] == "unknown"
        assert result["text"] == TEXT_AGENT_FAILURE
        other = [m for m in conn.seen if m["type"] == "result" and m["call_id"] == "long"]
        assert other[0]["outcome"] == "completed"
        assert logged(caplog, "the journal refused the row of c1/x")
        agent_is_up(faulty)
        with trio.fail_after(10):
            repeat = await conn.call("c1", "x", "execute", {"command": WAITING})
        assert repeat["outcome"] == "unknown"


async def test_a_refused_touch_is_logged_and_the_repeat_is_answered(
    faulty: LiveServer, caplog: pytest.LogCaptureFixture
) -> None:
    async with faulty.connect() as conn:
        first = await read_file(conn, "c1", "r1")
        await start_waiting_command(conn)
        journal_of(faulty).fail("touch", chat_id="c1")
        with watching("the journal refused the touch of c1/r1") as line:
            assert await read_file(conn, "c1", "r1") == first
            # The touch rides in a commit after the repeat's reply: wait for its line.
            with trio.fail_after(10):
                await line.seen.wait()
        assert logged(caplog, "touch of c1/r1", "its age counts from its previous touch")
        agent_is_up(faulty)
        await finish_waiting_command(faulty, conn)


async def test_refused_deletes_and_reopen_are_logged_and_nothing_runs_again(
    nursery: trio.Nursery, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Forgetting a closed chat's records deletes their rows and then its close row (its id is
    free again): both refused. The agent stays up; the rows stay on disk, so a restart finds
    the saved results again (at most once is never at risk from a refused delete)."""
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "f.txt").write_text("x\n")
    path = tmp_path / "state" / "journal.sqlite3"
    journal = FaultyJournal(path)
    server = await start_server(
        nursery, workspace, journal=journal, result_cache_entries=0,
        limits=Limits(forget_after_s=0),
    )  # fmt: skip
    async with server.connect() as conn:
        await start_waiting_command(conn)
        assert (await read_file(conn, "c1", "r1"))["outcome"] == "completed"
        await conn.send({"type": "close_chat", "chat_id": "c1"})
        await wait_for(conn, lambda m: m["type"] == "chat_closed")
        journal.fail("delete", chat_id="c1")
        journal.fail("forget_closed", chat_id="c1")
        with watching("the journal refused the reopening of chat 'c1'") as line:
            server.agent.sweep()
            with trio.fail_after(10):
                await line.seen.wait()
        assert logged(caplog, "the journal refused the delete of c1/r1", "comes back")
        agent_is_up(server)
        await finish_waiting_command(server, conn)
    assert [row.call_id for row in SqliteJournal(path).load() if row.chat_id == "c1"] == ["r1"]


async def test_a_refused_close_row_still_answers_the_close_and_logs_it(
    faulty: LiveServer, caplog: pytest.LogCaptureFixture
) -> None:
    async with faulty.connect() as conn:
        await start_waiting_command(conn)
        await start_waiting_command(conn, "c1", "x")
        journal_of(faulty).fail("mark_closed", chat_id="c1")
        await conn.send({"type": "close_chat", "chat_id": "c1", "rid": 7})
        with trio.fail_after(10):
            closed = await wait_for(conn, lambda m: m["type"] == "chat_closed")
        assert closed["call_ids"] == ["x"] and closed["rid"] == 7
        assert logged(caplog, "the journal refused the close of chat 'c1'", "open again")
        agent_is_up(faulty)
        await finish_waiting_command(faulty, conn)


async def test_a_refused_chat_wide_approval_is_logged_and_the_approved_call_runs(
    faulty: LiveServer, caplog: pytest.LogCaptureFixture
) -> None:
    async with faulty.connect() as conn:
        await start_waiting_command(conn)
        journal_of(faulty).fail("approve_tool", chat_id="c1")
        await conn.send({"type": "call", "chat_id": "c1", "call_id": "g", "tool": "write_file",
                         "args": {"path": "g.txt", "content": "y"}, "approval": True})  # fmt: skip
        await wait_for(conn, of("approval", "g"))
        with watching("the journal refused the chat-wide approval of write_file") as line:
            await conn.send({"type": "approve", "chat_id": "c1", "call_id": "g",
                             "approved": True, "scope": "chat"})  # fmt: skip
            with trio.fail_after(10):
                result = await wait_for(conn, is_result("g"))
                await line.seen.wait()
        assert result["outcome"] == "completed"
        assert (faulty.workspace / "g.txt").read_text() == "y"
        agent_is_up(faulty)
        await finish_waiting_command(faulty, conn)


# ---------------------------------------------------------------------------------------------
# The journal can no longer write at all: the agent stops in order


async def expect_orderly_stop(server: LiveServer, conn: RawConn, pid: int) -> None:
    with trio.fail_after(10), pytest.raises(ConnectionClosed) as closed:
        while True:
            await conn.recv()
    assert closed.value.reason.code == CLOSE_INTERNAL_ERROR
    assert closed.value.reason.reason == JOURNAL_FAILED_REASON
    assert server.server.readiness() is not None
    with trio.fail_after(5):
        await server.server.stopped_by_failure.wait()
    assert not alive(pid)


async def test_a_disk_that_takes_nothing_stops_the_agent_in_order(
    faulty: LiveServer, caplog: pytest.LogCaptureFixture
) -> None:
    """Every commit fails, the probe too: readiness goes false, one line says why, the running
    command is stopped as by a shutdown (it never becomes an orphan), every connection is
    closed with 1011 and the reason."""
    async with faulty.connect() as conn:
        await conn.send({"type": "call", "chat_id": "c2", "call_id": "long", "tool": "execute",
                         "args": {"command": "echo $$; exec sleep 300"}})  # fmt: skip
        output = await wait_for(conn, lambda m: m["type"] == "output")
        pid = int(output["data"].split()[0])
        journal_of(faulty).fail_every_write()
        await conn.send({"type": "call", "chat_id": "c1", "call_id": "r", "tool": "read_file",
                         "args": {"path": "f.txt"}})  # fmt: skip
        await expect_orderly_stop(faulty, conn, pid)
    stops = [r for r in caplog.records if r.levelno == logging.CRITICAL]
    assert len(stops) == 1
    assert "cannot be written: database or disk is full; the agent stops" in stops[0].getMessage()
    # Its commands' results went out before the close (from memory: nothing can be saved).
    results = {m["call_id"]: m for m in conn.seen if m["type"] == "result"}
    assert results["long"]["outcome"] in ("unknown", "canceled")


async def test_a_journal_deleted_under_the_agent_stops_it_at_the_next_commit(
    nursery: trio.Nursery, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """SQLite would write on into the unlinked file and the next start would find an empty
    journal (and run old call ids again): the commit that finds the path no longer names its
    file counts as failed, and the agent stops before any effect follows that commit."""
    workspace = tmp_path / "ws"
    workspace.mkdir()
    path = tmp_path / "state" / "journal.sqlite3"
    journal = SqliteJournal(path, identity_check_min_gap_s=0.0)  # every commit checks, as at rest
    server = await start_server(nursery, workspace, journal=journal)
    async with server.connect() as conn:
        await conn.send({"type": "call", "chat_id": "c2", "call_id": "long", "tool": "execute",
                         "args": {"command": "echo $$; exec sleep 300"}})  # fmt: skip
        pid = int((await wait_for(conn, lambda m: m["type"] == "output"))["data"].split()[0])
        path.unlink()
        await conn.send({"type": "call", "chat_id": "c1", "call_id": "w", "tool": "write_file",
                         "args": {"path": "never.txt", "content": "x"}})  # fmt: skip
        await expect_orderly_stop(server, conn, pid)
    assert not (workspace / "never.txt").exists()  # its start row went into the lost file
    assert logged(caplog, "was deleted under the running agent; the agent stops")


async def test_a_journal_replaced_under_an_idle_agent_is_found_without_a_commit(
    nursery: trio.Nursery, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    path = tmp_path / "state" / "journal.sqlite3"
    journal = SqliteJournal(path, identity_check_interval_s=0.05)
    server = await start_server(nursery, workspace, journal=journal)
    async with server.connect() as conn:
        replacement = path.with_name("other")
        replacement.write_bytes(path.read_bytes())
        os.replace(replacement, path)
        with trio.fail_after(10), pytest.raises(ConnectionClosed) as closed:
            while True:
                await conn.recv()
        assert closed.value.reason.code == CLOSE_INTERNAL_ERROR
    assert logged(caplog, "was replaced under the running agent; the agent stops")
