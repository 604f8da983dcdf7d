"""Finished results live in the journal, not on the heap (issue 6, scale).

With a journal that keeps results (SQLite, the default of `toolwire serve`), a record drops its
result once the journal holds it; the agent keeps the newest few in an LRU and reads the others
back. These tests check that what is read back is the very result first sent, byte for byte on
both encodings, on every path that replays it (repeat call, attach, cancel, turn), across a
restart, after forgetting, and that a result not yet durable is served from memory meanwhile.
The same paths also run in every live-server test of the suite (`live` runs on SQLite without
a cache too: tests/conftest.py).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import random
import sqlite3
from pathlib import Path
from typing import Any

import msgspec
import pytest
import trio
import trio.testing

from tests.conftest import LiveServer, MakeServer
from tests.wsclient import of, wait_for
from toolwire.actors.agent import Agent, AgentContext, Limits
from toolwire.actors.chat import CallSpec, ChatActor
from toolwire.actors.events import (
    AcceptedEvent,
    CancelResultEvent,
    Event,
    ResultEvent,
    TurnResultEvent,
)
from toolwire.actors.journal import Journal, JournalRow, SqliteJournal
from toolwire.actors.outbox import Outbox
from toolwire.actors.records import ToolCallRecord
from toolwire.actors.results import Outcome, ToolwireError
from toolwire.simulation.journal import SimJournal
from toolwire.transport.codec import Codec
from toolwire.transport.server import to_wire

CHAT = "c"

# One call of each kind of result: file content, a long output, matches, a write, an edit, a
# tool failure, a command that fails.
CALLS: list[tuple[str, str, dict[str, Any]]] = [
    ("read", "read_file", {"path": "notes.txt"}),
    ("exec", "execute", {"command": "yes é | head -n 30000; echo err >&2; exit 3"}),
    ("search", "search_files", {"pattern": "line [0-9]+"}),
    ("write", "write_file", {"path": "out.txt", "content": "written\n"}),
    ("edit", "edit_files", {"files": [{"path": "out.txt", "edits": [{"old": "w", "new": "W"}]}]}),
    ("missing", "read_file", {"path": "no-such-file"}),
]


def prepare(workspace: Path) -> None:
    workspace.mkdir(exist_ok=True)
    (workspace / "notes.txt").write_text("".join(f"line {i}\n" for i in range(40)))


def encoded(event: Event) -> tuple[str | bytes, str | bytes]:
    """The event as the server sends it, on both encodings."""
    wire = to_wire(event)
    return Codec("json").encode(wire), Codec("msgpack").encode(wire)


def record(agent: Agent, call_id: str) -> ToolCallRecord:
    found = agent.chats[CHAT].records.get(call_id)
    assert found is not None
    return found


async def events_until(outbox: Outbox, done: Any) -> list[Event]:
    got: list[Event] = []
    while not any(done(event) for event in got):
        await outbox.wait()
        got.extend(outbox.take())
    return got


async def result_of(outbox: Outbox, call_id: str) -> ResultEvent:
    got = await events_until(outbox, lambda e: isinstance(e, ResultEvent) and e.call_id == call_id)
    [event] = [e for e in got if isinstance(e, ResultEvent) and e.call_id == call_id]
    return event


async def run_calls(agent: Agent) -> dict[str, ResultEvent]:
    """Each call of CALLS once, one after the other; their first results."""
    first: dict[str, ResultEvent] = {}
    for call_id, tool, args in CALLS:
        outbox = Outbox()
        agent.call(outbox, CHAT, CallSpec(call_id, tool, args), stream=True, rid=None)
        first[call_id] = await result_of(outbox, call_id)
    return first


# ---------------------------------------------------------------------------------------------
# Over the wire: every replay of a result read back from SQLite is the first result


def fields(message: dict[str, Any]) -> str:
    """A result's fields as JSON text, in the order received: equal text, equal frames."""
    return json.dumps({k: v for k, v in message.items() if k not in ("type", "rid")})


@pytest.mark.parametrize("encoding", ["json", "msgpack"])
async def test_every_replay_read_back_from_sqlite_is_the_first_result(
    make_server: MakeServer, tmp_path: Path, encoding: str
) -> None:
    journal = SqliteJournal(tmp_path / f"journal-{encoding}.sqlite3")
    server: LiveServer = await make_server(journal=journal, result_cache_entries=0)
    prepare(server.workspace)
    async with server.connect(encoding=encoding) as conn:
        first = {}
        for call_id, tool, args in CALLS:
            first[call_id] = await conn.call(CHAT, call_id, tool, args)
            assert first[call_id]["type"] == "result"
        assert first["exec"]["data"]["exit_code"] == 3 and first["exec"]["truncated_bytes"] > 0
        assert first["missing"]["outcome"] == "failed"
        for call_id, _, _ in CALLS:
            # Nothing of it is left on the heap: the record has its outcome, the cache is off.
            rec = record(server.agent, call_id)
            assert rec.result is None and rec.outcome == first[call_id]["outcome"]
        assert len(server.agent.results) == 0
        for call_id, tool, args in CALLS:
            start = len(conn.seen)
            again = await conn.call(CHAT, call_id, tool, args)
            assert fields(again) == fields(first[call_id])
            [accepted] = [m for m in conn.seen[start:] if of("accepted", call_id)(m)]
            assert accepted["replay"] is True and accepted["state"] == "done"
            await conn.send({"type": "attach", "chat_id": CHAT, "call_id": call_id})
            attached = await wait_for(conn, of("result", call_id), start=len(conn.seen))
            assert fields(attached) == fields(first[call_id])
            await conn.send({"type": "cancel", "chat_id": CHAT, "call_ids": [call_id]})
            reply = await wait_for(conn, of("cancel_result", call_id), start=len(conn.seen))
            assert reply["received"] is True
            assert json.dumps(reply["result"]) == json.dumps(
                {k: v for k, v in first[call_id].items() if k not in ("type", "chat_id", "call_id")}
            )
        # A turn naming every finished call replays each result, then the turn_result.
        calls = [{"call_id": c, "tool": t, "args": a} for c, t, a in CALLS]
        start = len(conn.seen)
        await conn.send({"type": "turn", "chat_id": CHAT, "turn_id": "t", "calls": calls})
        done = await wait_for(conn, lambda m: m["type"] == "turn_result", start=start)
        replayed = {m["call_id"]: m for m in conn.seen[start:] if m["type"] == "result"}
        assert conn.seen.index(done) == len(conn.seen) - 1  # after every call's result
        for (call_id, _, _), result in zip(CALLS, done["results"], strict=True):
            assert fields(replayed[call_id]) == fields(first[call_id])
            expected = {k: v for k, v in first[call_id].items() if k not in ("type", "chat_id")}
            assert json.dumps({"call_id": call_id, **result}) == json.dumps(expected)
        # The repeat of the finished turn reads them all back again (one batch).
        start = len(conn.seen)
        await conn.send({"type": "turn", "chat_id": CHAT, "turn_id": "t", "calls": calls})
        again_done = await wait_for(conn, lambda m: m["type"] == "turn_result", start=start)
        assert json.dumps(again_done["results"]) == json.dumps(done["results"])
        assert [m["type"] for m in conn.seen[start:]][-1] == "turn_result"
    assert (server.workspace / "out.txt").read_text() == "Written\n"  # nothing ran twice


# ---------------------------------------------------------------------------------------------
# In process: the recent-results cache, eviction, restart, forgetting


async def test_an_evicted_result_is_read_back_identical_and_cached_again(tmp_path: Path) -> None:
    prepare(tmp_path / "ws")
    ctx = AgentContext(
        workspace=str(tmp_path / "ws"),
        journal=SqliteJournal(tmp_path / "journal.sqlite3"),
        result_cache_entries=2,
    )
    async with trio.open_nursery() as nursery:
        agent: Agent = await nursery.start(Agent(ctx).run)
        first = await run_calls(agent)
        newest = [c for c, _, _ in CALLS[-2:]]
        assert [(CHAT, c) in agent.results for c, _, _ in CALLS] == [
            c in newest for c, _, _ in CALLS
        ]
        for call_id, tool, args in CALLS:
            outbox = Outbox()
            agent.call(outbox, CHAT, CallSpec(call_id, tool, args), stream=False, rid=None)
            again = await result_of(outbox, call_id)
            assert again.result == first[call_id].result
            assert encoded(again) == encoded(first[call_id])
            assert (CHAT, call_id) in agent.results  # the retry after it is a hit
            assert record(agent, call_id).result is None
        nursery.cancel_scope.cancel()


async def test_a_restart_keeps_results_in_the_journal_and_serves_them_unchanged(
    tmp_path: Path,
) -> None:
    prepare(tmp_path / "ws")
    path = tmp_path / "journal.sqlite3"

    async def boot(nursery: trio.Nursery) -> Agent:
        ctx = AgentContext(workspace=str(tmp_path / "ws"), journal=SqliteJournal(path))
        agent: Agent = await nursery.start(Agent(ctx).run)
        return agent

    async with trio.open_nursery() as nursery:
        before = await boot(nursery)
        first = await run_calls(before)
        nursery.cancel_scope.cancel()
    before.ctx.journal.close()
    async with trio.open_nursery() as nursery:
        agent = await boot(nursery)
        assert agent.recovered == len(CALLS)
        assert len(agent.results) == 0
        for call_id, _, _ in CALLS:
            # Recovered records hold neither their result nor a runtime: only what at most
            # once needs (state, tool, fingerprint, outcome, age).
            rec = record(agent, call_id)
            assert rec.done and rec.published and rec.result is None and rec.runtime is None
            assert rec.outcome is first[call_id].result.outcome
        for call_id, tool, args in CALLS:
            outbox = Outbox()
            agent.call(outbox, CHAT, CallSpec(call_id, tool, args), stream=False, rid=None)
            assert encoded(await result_of(outbox, call_id)) == encoded(first[call_id])
            agent.results.discard((CHAT, call_id))  # so the attach reads the journal again
            agent.attach(outbox, CHAT, call_id, 0, None)
            assert encoded(await result_of(outbox, call_id)) == encoded(first[call_id])
            agent.results.discard((CHAT, call_id))
            agent.cancel(outbox, CHAT, [call_id], None)
            got = await events_until(outbox, lambda e: isinstance(e, CancelResultEvent))
            [reply] = [e for e in got if isinstance(e, CancelResultEvent)]
            assert reply.received and reply.result == first[call_id].result
        # A conflicting reuse of an id is still refused without its result on the heap.
        outbox = Outbox()
        with pytest.raises(ToolwireError) as refused:
            agent.call(outbox, CHAT, CallSpec("read", "read_file", {"path": "x"}), stream=False,
                       rid=None)  # fmt: skip
        assert refused.value.code == "conflict" and len(outbox) == 0
        nursery.cancel_scope.cancel()
    assert (tmp_path / "ws" / "out.txt").read_text() == "Written\n"  # nothing ran twice


async def test_forgetting_drops_the_cached_result_and_the_row_and_the_id_runs_anew(
    tmp_path: Path,
) -> None:
    prepare(tmp_path / "ws")
    path = tmp_path / "journal.sqlite3"
    ctx = AgentContext(
        workspace=str(tmp_path / "ws"), journal=SqliteJournal(path), limits=Limits(forget_after_s=0)
    )
    async with trio.open_nursery() as nursery:
        agent: Agent = await nursery.start(Agent(ctx).run)
        outbox = Outbox()
        agent.call(outbox, CHAT, CallSpec("r", "read_file", {"path": "notes.txt"}), stream=False,
                   rid=None)  # fmt: skip
        old = await result_of(outbox, "r")
        assert (CHAT, "r") in agent.results
        agent.sweep()
        assert agent.chat(CHAT).records.get("r") is None and (CHAT, "r") not in agent.results
        await ctx.journal.wait_durable(
            ctx.journal.write(
                JournalRow(
                    chat_id="m",
                    call_id="marker",
                    state="done",
                    tool=None,
                    fingerprint=None,
                )
            )
        )  # fmt: skip: orders after the delete
        assert [row.call_id for row in SqliteJournal(path).load()] == ["marker"]
        # Forgotten (5.4): the id is new again, even with other args; never the old result.
        (tmp_path / "ws" / "other.txt").write_text("other\n")
        agent.call(outbox, CHAT, CallSpec("r", "read_file", {"path": "other.txt"}), stream=False,
                   rid=None)  # fmt: skip
        got = await events_until(outbox, lambda e: isinstance(e, ResultEvent))
        [accepted] = [e for e in got if isinstance(e, AcceptedEvent)]
        [new] = [e for e in got if isinstance(e, ResultEvent)]
        assert accepted.replay is False
        assert new.result.data == {
            "content": "other\n",
            "lines": 1,
            "total_lines": 1,
            "sha256": hashlib.sha256(b"other\n").hexdigest(),
        }
        assert new.result != old.result
        nursery.cancel_scope.cancel()


async def test_the_memory_journal_keeps_results_on_the_records(tmp_path: Path) -> None:
    prepare(tmp_path / "ws")
    async with trio.open_nursery() as nursery:
        agent: Agent = await nursery.start(Agent(AgentContext(workspace=str(tmp_path / "ws"))).run)
        first = await run_calls(agent)
        assert len(agent.results) == 0  # nothing else holds them: the records must
        for call_id, _, _ in CALLS:
            assert record(agent, call_id).result is first[call_id].result
        nursery.cancel_scope.cancel()


# ---------------------------------------------------------------------------------------------
# A result that is done but not durable yet is served from memory (virtual time)


def released(rec: ToolCallRecord) -> bool:
    """Published (durable, sent) and off the heap."""
    return rec.published and rec.result is None


def test_a_result_not_yet_durable_stays_on_the_record_until_its_commit(tmp_path: Path) -> None:
    prepare(tmp_path / "ws")
    clock = trio.testing.MockClock()
    journal = SimJournal(random.Random(0), delay_s=(1.0, 1.0), read_delay_s=(0.5, 0.5))
    ctx = AgentContext(workspace=str(tmp_path / "ws"), journal=journal, result_cache_entries=0)
    spec = CallSpec("r", "read_file", {"path": "notes.txt"})

    async def step() -> None:
        """Let every task reach its next sleep, then one second of virtual time passes."""
        await trio.testing.wait_all_tasks_blocked()
        clock.jump(1.0)
        await trio.testing.wait_all_tasks_blocked()

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            agent: Agent = await nursery.start(Agent(ctx).run)
            chat: ChatActor = agent.chat(CHAT)
            first, repeat = Outbox(), Outbox()
            agent.call(first, CHAT, spec, stream=False, rid=None)
            # A read has no start to journal: it runs at once, its result waits for the disk.
            await trio.testing.wait_all_tasks_blocked()
            rec = chat.records.get("r")
            assert rec is not None and rec.done and not released(rec)
            saved = rec.result
            assert saved is not None and saved.outcome is Outcome.COMPLETED
            # Done but not durable: accepted as running, the result follows its commit.
            agent.call(repeat, CHAT, spec, stream=False, rid=None)
            [accepted] = repeat.take()
            assert isinstance(accepted, AcceptedEvent) and accepted.state == "running"
            assert len(repeat) == 0
            await step()  # committed: published to both, then off the heap
            assert released(rec) and journal.rows[(CHAT, "r")].result == saved
            assert [e.result for e in repeat.take() if isinstance(e, ResultEvent)] == [saved]
            assert [e.result for e in first.take() if isinstance(e, ResultEvent)] == [saved]
            # Now a repeat reads it back from the journal (no cache), after the read's delay.
            agent.call(repeat, CHAT, spec, stream=False, rid=None)
            [accepted] = repeat.take()
            assert isinstance(accepted, AcceptedEvent) and accepted.state == "done"
            assert len(repeat) == 0 and journal.reads == 0
            await step()
            [again] = repeat.take()
            assert isinstance(again, ResultEvent) and again.result == saved
            assert journal.reads == 1
            nursery.cancel_scope.cancel()

    trio.run(main, clock=clock)


def test_a_turn_result_read_back_keeps_request_order_and_comes_last(tmp_path: Path) -> None:
    """A finished turn repeated with no result on the heap: each call's result, then the
    turn_result, all read in one journal batch, in request order."""
    prepare(tmp_path / "ws")
    clock = trio.testing.MockClock(autojump_threshold=0)
    journal = SimJournal(random.Random(1))
    ctx = AgentContext(workspace=str(tmp_path / "ws"), journal=journal, result_cache_entries=0)
    specs = [
        CallSpec("a", "read_file", {"path": "notes.txt"}),
        CallSpec("b", "search_files", {"pattern": "line 3"}),
        CallSpec("c", "read_file", {"path": "no-such-file"}),
    ]

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            agent: Agent = await nursery.start(Agent(ctx).run)
            outbox = Outbox()
            agent.turn(outbox, CHAT, "t", specs, stream=True, rid=None)
            got = await events_until(outbox, lambda e: isinstance(e, TurnResultEvent))
            [first] = [e for e in got if isinstance(e, TurnResultEvent)]
            assert all(record(agent, s.call_id).result is None for s in specs)
            reads = journal.reads
            agent.turn(outbox, CHAT, "t", specs, stream=True, rid="again")
            again = await events_until(outbox, lambda e: isinstance(e, TurnResultEvent))
            kinds = [type(e).__name__ for e in again if not isinstance(e, AcceptedEvent)]
            assert kinds == ["TurnPlanEvent", "ResultEvent", "ResultEvent", "ResultEvent",
                             "TurnResultEvent"]  # fmt: skip
            results = [e.result for e in again if isinstance(e, ResultEvent)]
            assert isinstance(again[-1], TurnResultEvent)
            assert again[-1].results == first.results == results
            assert msgspec.msgpack.encode(again[-1].results) == msgspec.msgpack.encode(
                first.results
            )
            # One batch: the calls' results and the turn's, queued behind them, read together.
            assert journal.reads - reads == len(specs)
            nursery.cancel_scope.cancel()

    trio.run(main, clock=clock)


def test_sqlite_recovers_rows_one_at_a_time_in_touch_order(tmp_path: Path) -> None:
    """The order recovery rebuilds records in (forgetting relies on it): by touch time, then by
    key, as the sorted list of every row that recovery used to load at once."""
    path = tmp_path / "journal.sqlite3"
    journal = SqliteJournal(path)
    touches = random.Random(7).sample(range(1, 400), 60)
    rows = [
        JournalRow(
            chat_id=f"chat-{i % 3}",
            call_id=f"call-{i}",
            state="done",
            tool="read_file",
            fingerprint=b"f",
            touched_at_ms=touches[i] // 2,
        )
        for i in range(60)
    ]
    # The rows as an earlier agent left them on disk, in no particular order: written here
    # through a connection of the test's own.
    with contextlib.closing(sqlite3.connect(path)) as db, db:
        db.executemany("INSERT INTO calls VALUES (?, ?, ?, ?)", [(
            row.chat_id, row.call_id, msgspec.msgpack.encode(row), row.touched_at_ms,
        ) for row in rows])  # fmt: skip
    recovered = journal.recover()
    first = next(recovered)  # a generator: rows come off the cursor as they are asked for
    order = [(r.touched_at_ms, r.chat_id, r.call_id) for r in [first, *recovered]]
    assert order == sorted((r.touched_at_ms, r.chat_id, r.call_id) for r in rows)
    # The other journals recover in the same order from what they load.
    loaded = [r.call_id for r in Journal.recover(journal)]
    assert loaded == [call_id for _, _, call_id in order]
    journal.close()
