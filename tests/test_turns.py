"""PROTOCOL.md 5.0, 5.1 and 5.6 for `turn`, and the file tools of section 8 inside turns, through
a real server with the independent client of tests/wsclient.py, real files and real processes.

Waiting is always on a protocol message. The one exception is the "at most 8 at once" test, which
reads the turn's CapacityLimiter to establish a precondition the protocol cannot show (a
`process_output` call sends no `started`); its conclusion is then checked on the wire.
Helpers here are shared with tests/test_interrupt.py.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from tests.conftest import LiveServer
from tests.wsclient import Message, RawConn, is_result, messages, of, streamed, wait_for
from toolwire.actors.tools import files as file_tools

# Every test ends well within this; a hang fails instead of blocking the suite.
TEST_DEADLINE_S = 10.0

CHAT = "c"
NOT_RUN_TEXT = "tool call was canceled before it ran; no changes were made"
CANCELED_TEXT = "tool call was canceled while running"

# --- helpers --------------------------------------------------------------------------------------


def spec(call_id: str, tool: str, args: Any, **extra: Any) -> Message:
    return {"call_id": call_id, "tool": tool, "args": args} | extra


def read(call_id: str, path: str) -> Message:
    return spec(call_id, "read_file", {"path": path})


def write(call_id: str, path: str, content: str) -> Message:
    return spec(call_id, "write_file", {"path": path, "content": content})


def execute(call_id: str, command: str, **extra: Any) -> Message:
    return spec(call_id, "execute", {"command": command}, **extra)


def turn_msg(turn_id: str, calls: list[Message], chat_id: str = CHAT, **extra: Any) -> Message:
    return {"type": "turn", "chat_id": chat_id, "turn_id": turn_id, "calls": calls} | extra


def call_msg(call: Message, chat_id: str = CHAT, **extra: Any) -> Message:
    """A plain `call` of the same call spec a turn would carry."""
    return {"type": "call", "chat_id": chat_id} | call | extra


def fields(message: Message) -> dict[str, Any]:
    """A result message's Result fields (what is saved and replayed)."""
    return {k: v for k, v in message.items() if k not in ("type", "chat_id", "call_id")}


def same_bytes(a: Any, b: Any) -> bool:
    return json.dumps(a) == json.dumps(b)


def of_turn(kind: str, turn_id: str) -> Callable[[Message], bool]:
    return lambda m: m["type"] == kind and m.get("turn_id") == turn_id


def is_error(m: Message) -> bool:
    return bool(m["type"] == "error")


async def wait_count(conn: RawConn, predicate: Callable[[Message], bool], n: int) -> list[Message]:
    """Wait until `n` received messages match; return them."""
    while sum(1 for m in conn.seen if predicate(m)) < n:
        await conn.recv()
    return [m for m in conn.seen if predicate(m)]


async def output_containing(conn: RawConn, call_id: str, text: str) -> None:
    """Wait until the call's streamed output so far contains `text`."""
    while text not in streamed(conn, call_id):
        await conn.recv()


async def run_turn(conn: RawConn, turn_id: str, calls: list[Message], **extra: Any) -> Message:
    """Send a turn and return its turn_result (or the error that refused it)."""
    start = len(conn.seen)
    await conn.send(turn_msg(turn_id, calls, **extra))
    return await wait_for(
        conn, lambda m: of_turn("turn_result", turn_id)(m) or is_error(m), start=start
    )


async def plan_of(conn: RawConn, turn_id: str, calls: list[Message]) -> list[list[str]]:
    """Run a turn to its end; return the segments of its turn_plan."""
    result = await run_turn(conn, turn_id, calls, stream=False)
    assert result["type"] == "turn_result", result
    plans = [m for m in conn.seen if of_turn("turn_plan", turn_id)(m)]
    assert len(plans) == 1
    segments: list[list[str]] = plans[0]["segments"]
    return segments


def by_call(turn_result: Message, calls: list[Message]) -> dict[str, dict[str, Any]]:
    assert len(turn_result["results"]) == len(calls)
    return {c["call_id"]: r for c, r in zip(calls, turn_result["results"], strict=True)}


def check_turn_stream(
    conn: RawConn, turn_id: str, calls: list[Message], start: int = 0, end: int | None = None
) -> None:
    """PROTOCOL.md 5.0 and 5.6 for one streamed turn request, received in conn.seen[start:end]:
    turn_plan first, every call's events as for a `call` (accepted first, result last, output in
    offset order), turn_result last with one Result per call in request order, each equal to that
    call's `result`."""
    ids = [c["call_id"] for c in calls]
    mine = [
        m
        for m in conn.seen[start:end]
        if m.get("turn_id") == turn_id or (m.get("call_id") in ids and m["type"] != "error")
    ]
    assert mine[0]["type"] == "turn_plan", mine[0]
    assert [c for s in mine[0]["segments"] for c in s] == ids  # flattening: request order
    ends = [i for i, m in enumerate(mine) if of_turn("turn_result", turn_id)(m)]
    assert ends == [len(mine) - 1], [m["type"] for m in mine]
    results = mine[-1]["results"]
    assert [r["tool"] for r in results] == [c["tool"] for c in calls]
    for call, saved in zip(calls, results, strict=True):
        events = [m for m in mine if m.get("call_id") == call["call_id"]]
        kinds = [m["type"] for m in events]
        assert kinds[0] == "accepted" and kinds[-1] == "result", (call["call_id"], kinds)
        assert kinds.count("accepted") == 1 and kinds.count("result") == 1, kinds
        assert set(kinds) <= {
            "accepted",
            "approval",
            "approval_resolved",
            "started",
            "output",
            "result",
        }
        offsets = [m["offset"] for m in events if m["type"] == "output"]
        assert offsets == sorted(offsets)
        assert same_bytes(fields(events[-1]), saved), call["call_id"]


# --- 5.0 / 5.6: what a turn sends -----------------------------------------------------------------


async def test_a_streamed_turn_sends_plan_then_every_calls_events_then_turn_result(
    live: LiveServer,
) -> None:
    (live.workspace / "a.txt").write_text("alpha\n")
    (live.workspace / "b.txt").write_text("beta\n")
    calls = [
        read("r1", "a.txt"),
        execute("e1", "printf 'one\\n'; printf 'two\\n'"),
        read("r2", "b.txt"),
        write("w1", "c.txt", "gamma\n"),
    ]
    with trio.fail_after(TEST_DEADLINE_S):
        async with live.connect() as conn:
            done = await run_turn(conn, "t1", calls, rid=11)
    plan = conn.seen[1]
    assert plan == {
        "type": "turn_plan",
        "rid": 11,
        "chat_id": CHAT,
        "turn_id": "t1",
        "segments": [["r1"], ["e1"], ["r2", "w1"]],
    }
    check_turn_stream(conn, "t1", calls)
    for call in calls:
        [accepted] = messages(conn, call["call_id"], "accepted")
        assert accepted["requests"] == 1 and accepted["state"] == "running", accepted
    [started] = messages(conn, "e1", "started")
    assert streamed(conn, "e1") == "one\ntwo\n"
    results = by_call(done, calls)
    assert results["r1"]["outcome"] == "completed" and results["r1"]["data"]["content"] == "alpha\n"
    assert results["e1"]["data"]["exit_code"] == 0 and results["e1"]["output"] == "one\ntwo\n"
    assert results["e1"]["started_at"] == started["started_at"]
    assert results["r2"]["data"]["content"] == "beta\n"
    assert results["w1"]["data"] == {"bytes": 6, "sha256": hashlib.sha256(b"gamma\n").hexdigest()}
    assert (live.workspace / "c.txt").read_text() == "gamma\n"


async def test_an_unstreamed_turn_sends_only_plan_approvals_and_turn_result(
    live: LiveServer,
) -> None:
    calls = [
        execute("e1", "echo hi"),
        write("w1", "gated.txt", "ok\n") | {"approval": True},
        read("r1", "gated.txt"),
    ]
    with trio.fail_after(TEST_DEADLINE_S):
        async with live.connect() as conn:
            await conn.send(turn_msg("t1", calls, stream=False))
            approval = await wait_for(conn, of("approval", "w1"))
            await conn.send({"type": "approve", "chat_id": CHAT, "call_id": "w1", "approved": True})
            done = await wait_for(conn, of_turn("turn_result", "t1"))
    assert [m["type"] for m in conn.seen[1:]] == [
        "turn_plan",
        "approval",
        "approval_resolved",
        "turn_result",
    ]
    assert approval["turn_id"] == "t1" and approval["tool"] == "write_file"
    assert conn.seen[3]["decision"] == "approved"
    results = by_call(done, calls)
    assert results["e1"]["output"] == "hi\n"
    assert results["w1"]["outcome"] == "completed"
    assert results["r1"]["data"]["content"] == "ok\n"  # the next segment waited for the gate


async def test_the_calls_a_turn_creates_are_accepted_with_replay_false(live: LiveServer) -> None:
    # PROTOCOL.md 4: `replay` is "true when the call already existed"; 5.0: in a turn each call
    # behaves as if it had been sent as a `call` on that connection.
    with trio.fail_after(TEST_DEADLINE_S):
        async with live.connect() as conn:
            await conn.call(CHAT, "old", "process_list", {})
            calls = [
                read("new1", "a.txt"),
                spec("old", "process_list", {}),
                execute("new2", "true"),
            ]
            await run_turn(conn, "t", calls)
    accepted = {
        m["call_id"]: (m["replay"], m["requests"]) for m in conn.seen[3:] if m["type"] == "accepted"
    }
    assert accepted == {"new1": (False, 1), "old": (True, 2), "new2": (False, 1)}


# --- 5.6: the segment plan through the server -----------------------------------------------------

PLAN_CASES: dict[str, tuple[list[Message], list[list[str]]]] = {
    "readers share a segment": (
        [
            read("r1", "src/app.py"),
            read("r2", "src/app.py"),
            spec("s1", "search_files", {"pattern": "x", "path": "src"}),
            spec("s2", "search_files", {"pattern": "x"}),
            spec("p1", "process_list", {}),
        ],
        [["r1", "r2", "s1", "s2", "p1"]],
    ),
    "read then write of one file splits": (
        [read("r1", "src/app.py"), write("w1", "./src/../src/app.py", "x")],
        [["r1"], ["w1"]],
    ),
    "write into a searched subtree splits": (
        [
            spec("s1", "search_files", {"pattern": "x", "path": "src"}),
            write("w1", "src/deep/new.py", "x"),
        ],
        [["s1"], ["w1"]],
    ),
    "default-root search conflicts with any write": (
        [
            write("w1", "notes.md", "x"),
            spec("s1", "search_files", {"pattern": "x"}),
            write("w2", "lib/net/deep/x.py", "x"),
        ],
        [["w1"], ["s1"], ["w2"]],
    ),
    "disjoint search and write stay parallel": (
        [spec("s1", "search_files", {"pattern": "x", "path": "src"}), write("w1", "docs/a", "x")],
        [["s1", "w1"]],
    ),
    "a/b does not contain a/bc": (
        [
            spec("s1", "search_files", {"pattern": "x", "path": "lib/net"}),
            write("w1", "lib/network.py", "x"),
        ],
        [["s1", "w1"]],
    ),
    "writers of one path split, edit_files reserves every file": (
        [
            write("w1", "notes.md", "x"),
            write("w2", "other.md", "x"),
            write("w3", "notes.md", "y"),
            spec(
                "e1",
                "edit_files",
                {"files": [{"path": "third.md", "edits": []}, {"path": "notes.md", "edits": []}]},
            ),
        ],
        [["w1", "w2"], ["w3"], ["e1"]],
    ),
    "a symlink is the file it points to": (
        [read("r1", "src/app.py"), write("w1", "link/app.py", "x")],
        [["r1"], ["w1"]],
    ),
    "execute runs alone": (
        [
            read("r1", "src/app.py"),
            execute("x1", "true"),
            read("r2", "notes.md"),
            spec("p1", "process_list", {}),
        ],
        [["r1"], ["x1"], ["r2", "p1"]],
    ),
    "malformed args and unknown tools are barriers": (
        [
            read("r1", "notes.md"),
            spec("m1", "read_file", {"file": "notes.md"}),
            read("r2", "notes.md"),
            spec("u1", "frobnicate", {"path": "notes.md"}),
            spec("m2", "write_file", ["notes.md"]),
            read("r3", "notes.md"),
        ],
        [["r1"], ["m1"], ["r2"], ["u1"], ["m2"], ["r3"]],
    ),
}


@pytest.mark.parametrize("case", list(PLAN_CASES))
async def test_the_segment_plan_of_mixed_batches(live: LiveServer, case: str) -> None:
    calls, expected = PLAN_CASES[case]
    ws = live.workspace
    (ws / "src").mkdir()
    (ws / "src/app.py").write_text("x = 1\n")
    (ws / "notes.md").write_text("notes\n")
    (ws / "link").symlink_to("src")
    with trio.fail_after(TEST_DEADLINE_S):
        async with live.connect() as conn:
            assert await plan_of(conn, "t", calls) == expected


async def test_malformed_args_and_unknown_tools_end_failed_and_name_the_problem(
    live: LiveServer,
) -> None:
    (live.workspace / "notes.md").write_text("notes\n")
    calls = [
        spec("m1", "read_file", {"file": "notes.md"}),
        spec("u1", "frobnicate", {"path": "notes.md"}),
        spec("m2", "write_file", ["notes.md"]),
        spec("m3", "execute", {"command": "echo hi", "cwd": 7}),
        spec("m4", "execute", {"command": "sleep 1"}, background=True, timeout_ms=5),
        read("ok", "notes.md"),
    ]
    with trio.fail_after(TEST_DEADLINE_S):
        async with live.connect() as conn:
            done = await run_turn(conn, "t", calls)
    check_turn_stream(conn, "t", calls)
    results = by_call(done, calls)
    for call_id, words in {
        "m1": ["path"],
        "u1": ["frobnicate", "unknown tool"],
        "m2": ["object"],
        "m3": ["cwd"],
        "m4": ["background", "timeout_ms"],
    }.items():
        result = results[call_id]
        assert result["outcome"] == "failed", result
        assert result["tool"] == next(c["tool"] for c in calls if c["call_id"] == call_id)
        for word in words:
            assert word in result["text"], (call_id, result["text"])
    assert results["ok"]["data"]["content"] == "notes\n"
    assert not any(m["type"] == "started" for m in conn.seen)  # nothing was spawned


async def test_a_later_segment_runs_after_the_earlier_one(live: LiveServer) -> None:
    ws = live.workspace
    (ws / "a.txt").write_text("old\n")
    calls = [
        read("r1", "a.txt"),
        spec("s1", "search_files", {"pattern": "old|new"}),
        write("w1", "a.txt", "new\n"),
        read("r2", "a.txt"),
        execute("x1", "cat a.txt; echo made > b.txt"),
        read("r3", "b.txt"),
        spec(
            "e1",
            "edit_files",
            {"files": [{"path": "a.txt", "edits": [{"old": "new", "new": "newer"}]}]},
        ),
        read("r4", "a.txt"),
    ]
    with trio.fail_after(TEST_DEADLINE_S):
        async with live.connect() as conn:
            done = await run_turn(conn, "t", calls)
    check_turn_stream(conn, "t", calls)
    assert conn.seen[1]["segments"] == [
        ["r1", "s1"],
        ["w1"],
        ["r2"],
        ["x1"],
        ["r3", "e1"],
        ["r4"],
    ]
    results = by_call(done, calls)
    assert results["r1"]["data"]["content"] == "old\n"  # read before the write of segment 2
    assert [m["text"] for m in results["s1"]["data"]["matches"]] == ["old"]
    assert results["r2"]["data"]["content"] == "new\n"
    assert results["x1"]["output"] == "new\n"
    assert results["r3"]["data"]["content"] == "made\n"
    assert results["r4"]["data"]["content"] == "newer\n"
    # The segments ran one after another: each started after the previous one had finished.
    order = [results[c] for c in ("r1", "w1", "r2", "x1", "r3", "r4")]
    for before, after in itertools.pairwise(order):
        assert before["finished_at"] <= after["started_at"]
    assert results["e1"]["finished_at"] <= results["r4"]["started_at"]


# --- 5.1 inside turns: at most once by call_id ----------------------------------------------------


async def test_a_call_already_done_by_a_plain_call_is_replayed_not_run(live: LiveServer) -> None:
    once = execute("m1", "echo x >> marker; echo ran")
    with trio.fail_after(TEST_DEADLINE_S):
        async with live.connect() as conn:
            first = await conn.call(CHAT, "m1", "execute", once["args"])
            start = len(conn.seen)
            calls = [read("r1", "marker"), once]
            done = await run_turn(conn, "t", calls)
    assert (live.workspace / "marker").read_text() == "x\n"
    check_turn_stream(conn, "t", calls, start=start)
    [_, accepted] = messages(conn, "m1", "accepted")
    assert accepted["replay"] is True and accepted["state"] == "done" and accepted["requests"] == 2
    # The saved result, byte for byte; no `started` or `output` again.
    assert same_bytes(done["results"][1], fields(first))
    assert [m["type"] for m in conn.seen[start:] if m.get("call_id") == "m1"] == [
        "accepted",
        "result",
    ]


async def test_two_turns_naming_one_call_run_it_once(live: LiveServer) -> None:
    shared = execute("s1", "echo x >> marker; sleep 0.1; echo ran")
    with trio.fail_after(TEST_DEADLINE_S):
        async with live.connect() as a, live.connect() as b:
            await a.send(turn_msg("t1", [shared, read("r1", "marker")]))
            await b.send(turn_msg("t2", [spec("p1", "process_list", {}), shared]))
            done1 = await wait_for(a, of_turn("turn_result", "t1"))
            done2 = await wait_for(b, of_turn("turn_result", "t2"))
            async with live.connect() as late:
                repeat = await late.call(CHAT, "s1", "execute", shared["args"])
    assert (live.workspace / "marker").read_text() == "x\n"
    assert done1["results"][0]["output"] == "ran\n"
    assert same_bytes(done1["results"][0], done2["results"][1])
    assert same_bytes(done1["results"][0], fields(repeat))
    assert done1["results"][1]["data"]["content"] == "x\n"  # segment 2 saw the command's effect
    accepted = sorted(m["requests"] for c in (a, b) for m in messages(c, "s1", "accepted"))
    assert accepted == [1, 2]


async def test_one_call_id_with_other_args_refuses_the_whole_turn(live: LiveServer) -> None:
    with trio.fail_after(TEST_DEADLINE_S):
        async with live.connect() as conn:
            first = await conn.call(CHAT, "c1", "execute", {"command": "echo x >> marker"})
            start = len(conn.seen)
            calls = [
                execute("n1", "echo n1 >> marker"),
                execute("c1", "echo other >> marker"),
                write("n2", "new.txt", "x"),
            ]
            error = await run_turn(conn, "t", calls, rid="r")
            attach = []
            for call_id in ("n1", "n2"):
                await conn.send({"type": "attach", "chat_id": CHAT, "call_id": call_id})
                attach.append(await wait_for(conn, is_error, start=len(conn.seen)))
            repeat = await conn.call(CHAT, "c1", "execute", {"command": "echo x >> marker"})
            # The refused turn_id was not kept: the same id with valid calls is a new turn.
            ok = await run_turn(conn, "t", [read("r1", "marker")])
    assert error["type"] == "error" and error["code"] == "conflict" and error["rid"] == "r"
    assert "c1" in error["message"]
    assert [m["type"] for m in conn.seen[start:]].count("turn_plan") == 1  # only the later turn
    assert [m["code"] for m in attach] == ["unknown_call", "unknown_call"]
    assert same_bytes(fields(repeat), fields(first))  # the record was not touched
    assert (live.workspace / "marker").read_text() == "x\n"
    assert not (live.workspace / "new.txt").exists()
    assert ok["results"][0]["data"]["content"] == "x\n"


async def test_duplicate_call_ids_and_empty_turns_are_bad_args(live: LiveServer) -> None:
    with trio.fail_after(TEST_DEADLINE_S):
        async with live.connect() as conn:
            dup = await run_turn(
                conn,
                "t1",
                [execute("d1", "echo x >> marker"), read("r1", "a"), execute("d1", "echo y")],
                rid=1,
            )
            same = await run_turn(
                conn, "t2", [execute("d2", "echo x >> marker"), execute("d2", "echo x >> marker")]
            )
            empty = await run_turn(conn, "t3", [], rid=3)
            await conn.send({"type": "attach", "chat_id": CHAT, "call_id": "d1"})
            attach = await wait_for(conn, is_error, start=len(conn.seen))
    assert (dup["code"], dup["rid"]) == ("bad_args", 1) and "d1" in dup["message"]
    assert same["code"] == "bad_args" and "d2" in same["message"]
    assert (empty["code"], empty["rid"]) == ("bad_args", 3)
    assert attach["code"] == "unknown_call"
    assert not any(m["type"] == "turn_plan" for m in conn.seen)
    assert not (live.workspace / "marker").exists()


# --- 5.6: a repeated turn_id attaches -------------------------------------------------------------

# A command that runs until the test creates the file `go`: a rendezvous without timing.
WAIT_FOR_GO = "echo waiting; while [ ! -e go ]; do sleep 0.01; done; echo finished"


async def test_a_repeated_turn_attaches_while_running_and_replays_after_the_end(
    live: LiveServer,
) -> None:
    calls = [execute("x1", WAIT_FOR_GO), read("r1", "go")]
    with trio.fail_after(TEST_DEADLINE_S):
        async with live.connect() as a, live.connect() as b, live.connect() as c:
            await a.send(turn_msg("t", calls))
            await output_containing(a, "x1", "waiting")
            await b.send(turn_msg("t", calls, rid="again"))
            await output_containing(b, "x1", "waiting")  # b follows the running call
            (live.workspace / "go").write_text("now\n")
            done_a = await wait_for(a, of_turn("turn_result", "t"))
            done_b = await wait_for(b, of_turn("turn_result", "t"))
            # After the end: turn_plan and turn_result at once, each call's saved result between.
            await c.send(turn_msg("t", calls))
            done_c = await wait_for(c, of_turn("turn_result", "t"))
            start = len(c.seen)
            check_turn_stream(c, "t", calls, end=start)
            await c.send(turn_msg("t", calls, stream=False))
            done_d = await wait_for(c, of_turn("turn_result", "t"), start=start)
    check_turn_stream(a, "t", calls)
    check_turn_stream(b, "t", calls)
    assert b.seen[1]["type"] == "turn_plan" and b.seen[1]["rid"] == "again"
    assert b.seen[1]["segments"] == a.seen[1]["segments"] == [["x1"], ["r1"]]
    assert [(m["replay"], m["state"]) for m in messages(b, "x1", "accepted")] == [(True, "running")]
    assert streamed(b, "x1") == "waiting\nfinished\n"
    for other in (done_b, done_c, done_d):
        assert same_bytes(other["results"], done_a["results"])
    assert [m["type"] for m in c.seen if m.get("call_id") == "x1"] == ["accepted", "result"]
    assert [m["type"] for m in c.seen[start:]] == ["turn_plan", "turn_result"]
    assert done_a["results"][1]["data"]["content"] == "now\n"


async def test_a_repeated_turn_on_the_same_connection_gets_its_own_turn_result(
    live: LiveServer,
) -> None:
    # Per request, like `call` (docs/protocol.md: "this holds per request"): each of the two
    # turn requests gets one turn_result, as each of their calls gets one result per request.
    calls = [execute("x1", WAIT_FOR_GO)]
    with trio.fail_after(TEST_DEADLINE_S):
        async with live.connect() as conn:
            await conn.send(turn_msg("t", calls))
            await output_containing(conn, "x1", "waiting")
            await conn.send(turn_msg("t", calls))
            await wait_count(conn, of_turn("turn_plan", "t"), 2)
            (live.workspace / "go").write_text("")
            await wait_for(conn, of_turn("turn_result", "t"))
            # Any turn_result owed for this turn was queued at its end, before this call's result.
            await conn.call(CHAT, "sync1", "process_list", {})
            while_running = [m for m in conn.seen if of_turn("turn_result", "t")(m)]
            # A third request after the end gets its turn_result at once.
            start = len(conn.seen)
            await conn.send(turn_msg("t", calls))
            await wait_for(conn, of_turn("turn_result", "t"), start=start)
            await conn.call(CHAT, "sync2", "process_list", {})
    assert len(messages(conn, "x1", "result")) == 3  # one result of the call per request
    after_end = [m for m in conn.seen[start:] if of_turn("turn_result", "t")(m)]
    assert len(after_end) == 1
    assert len(while_running) == 2, [m["type"] for m in conn.seen]


async def test_the_same_turn_id_with_other_calls_is_a_conflict(live: LiveServer) -> None:
    calls = [execute("x1", WAIT_FOR_GO), read("r1", "go")]
    with trio.fail_after(TEST_DEADLINE_S):
        async with live.connect() as conn:
            await conn.send(turn_msg("t", calls))
            await output_containing(conn, "x1", "waiting")
            running = await run_turn(conn, "t", [*calls, read("r2", "go")], rid=1)
            other_args = await run_turn(conn, "t", [calls[0], read("r1", "other")], rid=2)
            (live.workspace / "go").write_text("now\n")
            done = await wait_for(conn, of_turn("turn_result", "t"))
            after = await run_turn(conn, "t", [calls[1], calls[0]], rid=3)
            await conn.send({"type": "attach", "chat_id": CHAT, "call_id": "r2"})
            attach = await wait_for(conn, is_error, start=len(conn.seen))
    assert [(e["code"], e["rid"]) for e in (running, other_args, after)] == [
        ("conflict", 1),
        ("conflict", 2),
        ("conflict", 3),
    ]
    assert attach["code"] == "unknown_call"
    check_turn_stream(conn, "t", calls)  # the first turn went on untouched
    assert done["results"][1]["data"]["content"] == "now\n"


# --- 5.6: at most 8 calls of a segment at once ----------------------------------------------------


def process_waits(n: int, process_id: str = "bg") -> list[Message]:
    """n `process_output{wait: true}` calls on one process: one segment (they reserve nothing),
    each holding its slot until the process exits."""
    args = {"process_id": process_id, "wait": True, "wait_ms": 60_000}
    return [spec(f"w{i:02}", "process_output", args) for i in range(n)]


async def limiter_holds(
    live: LiveServer, call_ids: list[str], *, running: int, waiting: int
) -> None:
    """Wait until `running` of these calls of one turn have started (their record's effect began)
    holding a token of the turn's "at most 8 at once" limiter, and `waiting` calls wait for one.
    Read from the agent: no message shows it (a `process_output` call sends no `started`), and
    neither has an event to await: polled."""
    state = live.agent.chats[CHAT].state
    records = [state.records.get(call_id) for call_id in call_ids]
    assert all(r is not None for r in records)
    turn_id = records[0].turn_id if records[0] is not None else None
    assert turn_id is not None
    run = state.turns[turn_id]

    def holds() -> bool:
        started = sum(1 for r in records if r is not None and r.effect_started)
        return started == running and run.running == running and len(run.waiting) == waiting

    while not holds():  # noqa: ASYNC110
        await trio.sleep(0.005)


async def test_at_most_eight_calls_of_a_segment_run_at_once(live: LiveServer) -> None:
    """12 `process_output{wait: true}` calls on one long-running process form one segment (the
    process tools reserve nothing). Each holds its slot until the process exits, so:

    1. precondition, read from the agent (no message shows it): the turn's limiter has lent all
       8 tokens and 4 calls wait for one (polled: there is no event to await);
    2. the test records the wall clock K, then kills the process with a plain `process_signal`;
    3. on the wire: exactly 8 results have `started_at <= K` (they were waiting when it died)
       and the other 4 started at or after K (they could only start once a slot was freed, which
       needs the process to have exited). Timing-free: nothing ends before the kill.
    """
    waits = process_waits(12)
    with trio.fail_after(TEST_DEADLINE_S):
        async with live.connect() as conn:
            bg = await conn.call(CHAT, "bg", "execute", {"command": "sleep 30"}, background=True)
            assert bg["outcome"] == "completed"
            await conn.send(turn_msg("t", waits))
            plan = await wait_for(conn, of_turn("turn_plan", "t"))
            await limiter_holds(live, [w["call_id"] for w in waits], running=8, waiting=4)
            kill_ms = time.time_ns() // 1_000_000
            killed = await conn.call(
                CHAT, "kill", "process_signal", {"process_id": "bg", "signal": "SIGKILL"}
            )
            assert killed["data"] == {"delivered": True}
            done = await wait_for(conn, of_turn("turn_result", "t"))
    assert plan["segments"] == [[w["call_id"] for w in waits]]
    check_turn_stream(conn, "t", waits)
    results = done["results"]
    assert all(r["outcome"] == "completed" for r in results)
    assert all(r["data"]["running"] is False and r["data"]["signal"] == "SIGKILL" for r in results)
    # Eight started no later than the kill, the other four no earlier (a start in the very
    # millisecond of the kill may tie on either side, hence <= and >=).
    starts = sorted(r["started_at"] for r in results)
    assert starts[7] <= kill_ms <= starts[8], (kill_ms, starts)


# --- section 8 file tools through turns -----------------------------------------------------------


def snapshot(root: Path) -> dict[str, bytes | None]:
    """Every path under root with its bytes (None for directories)."""
    out: dict[str, bytes | None] = {}
    for path in sorted(root.rglob("*")):
        rel = str(path.relative_to(root))
        out[rel] = None if path.is_dir() else path.read_bytes()
    return out


async def test_failed_writes_in_a_turn_leave_no_half_written_file(
    live: LiveServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    ws = live.workspace
    (ws / "dir").mkdir()
    (ws / "plain").write_text("a file\n")
    (ws / "kept.txt").write_text("old content\n")
    before = snapshot(ws)
    real_replace = os.replace
    kept = str((ws / "kept.txt").resolve())

    def replace(src: Any, dst: Any) -> None:
        # The disk fills up at the last step of the write of kept.txt (the rename).
        if os.fspath(dst) == kept:
            raise OSError(28, os.strerror(28), os.fspath(dst))
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    calls = [
        write("w1", "dir", "onto a directory"),
        write("w2", "plain/under/a/file.txt", "under a file"),
        write("w3", "kept.txt", "new content\n" * 1000),
        write("w4", "fresh/x/y.txt", "ok\n"),
    ]
    with trio.fail_after(TEST_DEADLINE_S):
        async with live.connect() as conn:
            done = await run_turn(conn, "t", calls)
    monkeypatch.undo()
    results = by_call(done, calls)
    assert results["w1"]["outcome"] == "failed" and "directory" in results["w1"]["text"]
    assert results["w2"]["outcome"] == "failed" and "parent" in results["w2"]["text"]
    assert results["w3"]["outcome"] == "failed" and "no space left" in results["w3"]["text"]
    assert results["w4"]["outcome"] == "completed"
    after = snapshot(ws)
    assert after.pop("fresh") is None and after.pop("fresh/x") is None
    assert after.pop("fresh/x/y.txt") == b"ok\n"
    assert after == before  # no temp file, no half file, no stray directory
    assert not [p for p in ws.rglob("*") if p.name.startswith(file_tools.TEMP_PREFIX)]


async def test_a_failed_multi_file_edit_changes_no_file(
    live: LiveServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    ws = live.workspace
    (ws / "a.py").write_text("alpha = 1\n")
    (ws / "b.py").write_text("beta = 2\nbeta = 2\n")
    (ws / "c.py").write_text("gamma = 3\n")
    before = snapshot(ws)

    def edit(call_id: str, *entries: tuple[str, str, str]) -> Message:
        return spec(
            call_id,
            "edit_files",
            {"files": [{"path": p, "edits": [{"old": o, "new": n}]} for p, o, n in entries]},
        )

    calls = [
        # The second file's edit is ambiguous: nothing may change, a.py included.
        edit("e1", ("a.py", "alpha", "A"), ("b.py", "beta", "B")),
        # The third file's edit does not match.
        edit("e2", ("a.py", "alpha", "A"), ("c.py", "gamma", "G"), ("b.py", "nope", "N")),
        # A missing file.
        edit("e3", ("c.py", "gamma", "G"), ("missing.py", "x", "y")),
    ]
    with trio.fail_after(TEST_DEADLINE_S):
        async with live.connect() as conn:
            done = await run_turn(conn, "t", calls)
            assert snapshot(ws) == before
            # The rename of the second file fails after the first was replaced: it is restored.
            real_replace = os.replace
            target_b = str((ws / "b.py").resolve())

            def replace(src: Any, dst: Any) -> None:
                if os.fspath(dst) == target_b:
                    raise OSError(28, os.strerror(28), os.fspath(dst))
                real_replace(src, dst)

            monkeypatch.setattr(os, "replace", replace)
            io = await run_turn(
                conn,
                "t2",
                [edit("e4", ("a.py", "alpha", "A"), ("b.py", "beta = 2\nbeta", "B"))],
            )
            monkeypatch.undo()
    results = by_call(done, calls)
    assert "edit 1 of b.py" in results["e1"]["text"] and "2 times" in results["e1"]["text"]
    assert "edit 1 of b.py" in results["e2"]["text"] and "not found" in results["e2"]["text"]
    assert "missing.py" in results["e3"]["text"]
    assert all(r["outcome"] == "failed" for r in done["results"])
    [e4] = io["results"]
    assert e4["outcome"] == "failed" and "restored" in e4["text"], e4
    assert snapshot(ws) == before


async def test_a_repeated_write_never_rewrites_the_file(live: LiveServer) -> None:
    ws = live.workspace
    w1 = write("w1", "a.txt", "from the model\n")
    with trio.fail_after(TEST_DEADLINE_S):
        async with live.connect() as conn:
            first = await run_turn(conn, "t1", [w1])
            (ws / "a.txt").write_text("changed by the user\n")
            again = await run_turn(conn, "t1", [w1])  # the same turn repeated
            other = await run_turn(conn, "t2", [read("r1", "a.txt"), w1])  # another turn
            plain = await conn.call(CHAT, "w1", "write_file", w1["args"])  # a plain retry
    assert first["results"][0]["outcome"] == "completed"
    assert same_bytes(again["results"], first["results"])
    assert same_bytes(other["results"][1], first["results"][0])
    assert same_bytes(fields(plain), first["results"][0])
    assert other["results"][0]["data"]["content"] == "changed by the user\n"
    assert (ws / "a.txt").read_text() == "changed by the user\n"


# --- a turn's paths are resolved off the event loop (issue 28) ------------------------------------


@asynccontextmanager
async def every_worker_thread_taken() -> AsyncIterator[None]:
    """While open, every token of trio's default thread limiter is held here: work handed to a
    worker thread (`trio.to_thread.run_sync`) waits for one, deterministically, while whatever
    runs on the event loop goes on. So a test can hold a turn's path resolution at its start."""
    limiter = trio.to_thread.current_default_thread_limiter()
    holders = [object() for _ in range(int(limiter.total_tokens))]
    for holder in holders:
        await limiter.acquire_on_behalf_of(holder)
    try:
        yield
    finally:
        for holder in holders:
            limiter.release_on_behalf_of(holder)


async def test_a_turn_whose_paths_are_being_resolved_holds_up_no_other_chat(
    live: LiveServer,
) -> None:
    """Resolving a turn's paths reads the filesystem (symlinks, `~`, `..`): on a slow or a
    network workspace that takes long, so it happens on a worker thread, never on the loop
    every chat shares. While it waits, another chat's call is answered; the turn itself
    sends nothing before its plan is known, and runs once it is."""
    (live.workspace / "f.txt").write_text("x\n")
    with trio.fail_after(TEST_DEADLINE_S):
        async with live.connect() as conn:
            async with every_worker_thread_taken():
                await conn.send(turn_msg("t", [read("r1", "f.txt")], chat_id="a", stream=True))
                other = await conn.call("b", "r2", "read_file", {"path": "f.txt"})
                assert other["type"] == "result" and other["outcome"] == "completed", other
                assert [m for m in conn.seen if m.get("chat_id") == "a"] == []
            done = await wait_for(conn, of_turn("turn_result", "t"))
    assert [r["outcome"] for r in done["results"]] == ["completed"]
    check_turn_stream(conn, "t", [read("r1", "f.txt")])


async def test_requests_behind_a_turn_whose_paths_are_being_resolved_find_its_calls(
    live: LiveServer,
) -> None:
    """The turn is taken when it arrives; only its start waits for its paths. So what comes
    after it on the chat finds its calls: a `call` of one of them is a repeat (replay true,
    run once), and a cancel of another is a cancel of a call the agent has (`received: true`)
    that then never runs (`not_run`, the file keeps the first write)."""
    (live.workspace / "f.txt").write_text("old\n")
    calls = [write("w1", "f.txt", "first\n"), write("w2", "f.txt", "second\n")]
    with trio.fail_after(TEST_DEADLINE_S):
        async with live.connect() as conn:
            async with every_worker_thread_taken():
                await conn.send(turn_msg("t", calls, stream=True, rid="turn"))
                await conn.send(call_msg(calls[0], rid="again"))
                await conn.send({"type": "cancel", "chat_id": CHAT, "call_ids": ["w2"]})
                again = await wait_for(conn, lambda m: m.get("rid") == "again")
                assert again["type"] == "accepted" and again["replay"] is True, again
                assert not [m for m in conn.seen if m.get("turn_id") == "t"]
            done = await wait_for(conn, of_turn("turn_result", "t"))
            canceled = await wait_for(conn, of("cancel_result", "w2"))
            # One result for the turn's stream, one for the repeat: the same, of one run.
            first, second = await wait_count(conn, is_result("w1"), 2)
    plan = next(m for m in conn.seen if of_turn("turn_plan", "t")(m))
    assert plan["segments"] == [["w1"], ["w2"]]
    assert [r["outcome"] for r in done["results"]] == ["completed", "not_run"]
    assert canceled["received"] is True and canceled["result"]["text"] == NOT_RUN_TEXT
    assert first["outcome"] == "completed" and fields(first) == fields(second)
    assert (live.workspace / "f.txt").read_text() == "first\n"
