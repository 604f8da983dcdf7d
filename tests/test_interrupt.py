"""PROTOCOL.md 5.7 (interrupt) with the cancel rules of 5.3, through a real server with the
independent client of tests/wsclient.py and real processes.

Waiting is always on a protocol message (a call's output, `started`, `result`, `turn_result`,
`interrupted`); the only polls are of the OS process table, which sends no messages.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import pytest
import trio

from tests.conftest import LiveServer
from tests.oswatch import alive, proc_state
from tests.test_turns import (
    CANCELED_TEXT,
    CHAT,
    NOT_RUN_TEXT,
    TEST_DEADLINE_S,
    by_call,
    call_msg,
    check_turn_stream,
    execute,
    fields,
    limiter_holds,
    messages,
    of,
    of_turn,
    output_containing,
    process_waits,
    read,
    same_bytes,
    spec,
    streamed,
    turn_msg,
    wait_for,
    write,
)
from tests.wsclient import Message, RawConn
from toolwire.actors.outbox import Outbox


def interrupt_msg(turn_id: str | None = None, chat_id: str = CHAT, **extra: Any) -> Message:
    message: Message = {"type": "interrupt", "chat_id": chat_id} | extra
    if turn_id is not None:
        message["turn_id"] = turn_id
    return message


def is_interrupted(m: Message) -> bool:
    return bool(m["type"] == "interrupted")


async def interrupt(conn: RawConn, turn_id: str | None = None, **extra: Any) -> Message:
    start = len(conn.seen)
    await conn.send(interrupt_msg(turn_id, **extra))
    return await wait_for(conn, is_interrupted, start=start)


async def gone(pid: int, timeout_s: float = 5.0) -> bool:
    """Poll the OS process table (which sends no message to await) until `pid` has ended."""
    with trio.move_on_after(timeout_s):
        while alive(pid):  # noqa: ASYNC110 (the process table has no event to await)
            await trio.sleep(0.01)
        return True
    return False


def assert_canceled_while_running(result: dict[str, Any], output: str) -> None:
    assert result["outcome"] == "canceled", result
    assert result["text"] == CANCELED_TEXT
    assert result["canceled"] is True and result["timed_out"] is False
    assert result["output"] == output
    assert result["started_at"] is not None and result["finished_at"] is not None
    # Really stopped by the cancel: killed by a signal (or a shell reporting it as 128+n).
    data = result["data"]
    assert data["signal"] in ("SIGTERM", "SIGKILL") or data["exit_code"] in (143, 137), data


def assert_not_run(result: dict[str, Any], tool: str) -> None:
    assert result["tool"] == tool
    assert result["outcome"] == "not_run", result
    assert result["text"] == NOT_RUN_TEXT
    assert result["started_at"] is None and result["wall_ms"] is None
    assert result["output"] == "" and result["output_bytes"] == 0


# --- 5.7: every call gets exactly one result ------------------------------------------------------


async def test_interrupt_ends_every_call_and_keeps_real_results(live: LiveServer) -> None:
    ws = live.workspace
    (ws / "a.txt").write_text("alpha\n")
    calls = [
        read("d1", "a.txt"),
        execute("x1", "printf 'so far\\n'; sleep 30; echo never"),
        read("n1", "a.txt"),
        write("n2", "b.txt", "never written\n"),
        execute("n3", "echo never > c.txt"),
    ]
    with trio.fail_after(TEST_DEADLINE_S):
        async with live.connect() as conn:
            await conn.send(call_msg(execute("p1", "printf 'plain\\n'; sleep 30")))
            await conn.send(turn_msg("t", calls))
            await output_containing(conn, "x1", "so far")
            await output_containing(conn, "p1", "plain")
            start = len(conn.seen)
            done = await interrupt(conn, rid=7)
            # Nothing more of these calls after `interrupted`: send a probe and await its reply.
            after = len(conn.seen)
            await conn.call(CHAT, "probe", "process_list", {})
    assert done == {"type": "interrupted", "rid": 7, "chat_id": CHAT, "call_ids": done["call_ids"]}
    assert sorted(done["call_ids"]) == ["n1", "n2", "n3", "p1", "x1"]  # not d1: it had ended
    check_turn_stream(conn, "t", calls)
    [turn_result] = [m for m in conn.seen if of_turn("turn_result", "t")(m)]
    results = by_call(turn_result, calls)
    assert results["d1"]["outcome"] == "completed" and results["d1"]["canceled"] is False
    assert results["d1"]["data"]["content"] == "alpha\n"
    assert_canceled_while_running(results["x1"], "so far\n")
    assert_not_run(results["n1"], "read_file")
    assert_not_run(results["n2"], "write_file")
    assert_not_run(results["n3"], "execute")
    [plain] = messages(conn, "p1", "result")
    assert_canceled_while_running(fields(plain), "plain\n")
    # The requester learns the chat is quiet after every result it is owed.
    tail = conn.seen[start:after]
    assert tail[-1] is done
    kinds = [(m["type"], m.get("call_id") or m.get("turn_id")) for m in tail]
    assert kinds.index(("turn_result", "t")) > max(
        kinds.index(("result", c)) for c in ("x1", "n1", "n2", "n3")
    )
    assert [m for m in conn.seen[after:] if m.get("call_id") in {"p1", *results}] == []
    assert not (ws / "b.txt").exists() and not (ws / "c.txt").exists()
    assert "never" not in streamed(conn, "x1")
    for call_id in ("x1", "p1"):
        [started] = messages(conn, call_id, "started")
        assert await gone(started["pid"])


async def test_interrupt_of_one_turn_leaves_other_turns_and_plain_calls_running(
    live: LiveServer,
) -> None:
    with trio.fail_after(TEST_DEADLINE_S):
        async with live.connect() as a, live.connect() as b:
            await a.send(
                turn_msg("tx", [execute("x1", "printf 'x\\n'; sleep 30"), read("x2", "a.txt")])
            )
            await a.send(
                turn_msg(
                    "ty",
                    [execute("y1", "printf 'y\\n'; sleep 30"), read("y2", "a.txt")],
                    stream=False,
                )
            )
            await a.send(call_msg(execute("p1", "printf 'p\\n'; sleep 30")))
            await output_containing(a, "x1", "x")
            await output_containing(a, "p1", "p")
            # ty streams nothing to a: b follows y1 to see that it has printed.
            await b.send({"type": "attach", "chat_id": CHAT, "call_id": "y1"})
            await output_containing(b, "y1", "y")
            # Another connection interrupts turn tx only.
            done_x = await interrupt(b, "tx", rid="i1")
            result_x = await wait_for(a, of_turn("turn_result", "tx"))
            listing = await b.call(CHAT, "list", "process_list", {})
            # The turn ty and the plain call are still running; then interrupt the whole chat.
            done_all = await interrupt(a)
            result_y = await wait_for(a, of_turn("turn_result", "ty"))
            plain = await wait_for(a, of("result", "p1"))
    assert done_x == {
        "type": "interrupted",
        "rid": "i1",
        "chat_id": CHAT,
        "turn_id": "tx",
        "call_ids": done_x["call_ids"],
    }
    assert sorted(done_x["call_ids"]) == ["x1", "x2"]
    assert not any(m["type"] == "interrupted" for m in a.seen[: a.seen.index(result_y)])
    assert_canceled_while_running(result_x["results"][0], "x\n")
    assert_not_run(result_x["results"][1], "read_file")
    running = {p["process_id"]: p["running"] for p in listing["data"]["processes"]}
    assert running == {"x1": False, "y1": True, "p1": True}
    assert sorted(done_all["call_ids"]) == ["p1", "y1", "y2"]
    assert "turn_id" not in done_all
    assert_canceled_while_running(result_y["results"][0], "y\n")
    assert_not_run(result_y["results"][1], "read_file")
    assert_canceled_while_running(fields(plain), "p\n")
    # Every call of a turn got exactly one turn_result entry, every plain call one result.
    assert [m["type"] for m in a.seen if m.get("turn_id") == "ty"] == ["turn_plan", "turn_result"]
    assert len(messages(a, "p1", "result")) == 1
    assert len([m for m in a.seen if m["type"] == "turn_result"]) == 2


async def test_interrupt_with_nothing_to_interrupt_still_answers(live: LiveServer) -> None:
    with trio.fail_after(TEST_DEADLINE_S):
        async with live.connect() as conn:
            empty_chat = await interrupt(conn, rid=1)
            unknown_turn = await interrupt(conn, "nope", rid=2)
            await conn.send(turn_msg("t", [execute("e1", "echo hi")]))
            done = await wait_for(conn, of_turn("turn_result", "t"))
            start = len(conn.seen)
            ended_turn = await interrupt(conn, "t", rid=3)
            ended_chat = await interrupt(conn, rid=4)
            repeat = await conn.call(CHAT, "e1", "execute", {"command": "echo hi"})
            other_chat = await interrupt(conn, chat_id="elsewhere")
    assert empty_chat == {"type": "interrupted", "rid": 1, "chat_id": CHAT, "call_ids": []}
    assert unknown_turn == {
        "type": "interrupted",
        "rid": 2,
        "chat_id": CHAT,
        "turn_id": "nope",
        "call_ids": [],
    }
    assert ended_turn["call_ids"] == [] and ended_chat["call_ids"] == []
    assert other_chat == {"type": "interrupted", "chat_id": "elsewhere", "call_ids": []}
    # A finished turn is not reported again, and its saved result stands.
    assert [m["type"] for m in conn.seen[start : start + 2]] == ["interrupted", "interrupted"]
    assert done["results"][0]["outcome"] == "completed"
    assert same_bytes(fields(repeat), done["results"][0])


async def test_interrupt_closes_gates_and_ends_blocking_waits(live: LiveServer) -> None:
    calls = [
        spec("g1", "write_file", {"path": "gated.txt", "content": "x"}, approval=True),
        spec("w1", "process_output", {"process_id": "bg", "wait": True}),
        spec("s1", "search_files", {"pattern": "nothing-matches-this"}),
    ]
    with trio.fail_after(TEST_DEADLINE_S):
        async with live.connect() as conn:
            await conn.call(
                CHAT, "bg", "execute", {"command": "printf 'bg\\n'; sleep 30"}, background=True
            )
            await conn.send(turn_msg("t", calls))
            await wait_for(conn, of("approval", "g1"))
            # The wait has begun (no message shows it): g1 parks without a slot, w1 holds one.
            await limiter_holds(live, ["g1", "w1", "s1"], running=1, waiting=0)
            done = await interrupt(conn, "t")
            listing = await conn.call(CHAT, "list", "process_list", {})
    [turn_result] = [m for m in conn.seen if of_turn("turn_result", "t")(m)]
    results = by_call(turn_result, calls)
    assert_not_run(results["g1"], "write_file")
    assert [m["decision"] for m in messages(conn, "g1", "approval_resolved")] == ["canceled"]
    assert results["w1"]["outcome"] == "canceled" and results["w1"]["text"] == CANCELED_TEXT
    assert results["w1"]["started_at"] is not None
    assert_not_run(results["s1"], "search_files")  # its segment never started
    assert sorted(done["call_ids"]) == ["g1", "s1", "w1"]
    assert not (live.workspace / "gated.txt").exists()
    # The background process is not a call of the turn: it was done, and it keeps running.
    assert {p["process_id"]: p["running"] for p in listing["data"]["processes"]} == {"bg": True}


async def test_calls_waiting_for_one_of_the_8_slots_end_not_run(live: LiveServer) -> None:
    # 12 calls in one segment: 8 run (blocking waits), 4 wait for a slot and never start.
    waits = process_waits(12)
    with trio.fail_after(TEST_DEADLINE_S):
        async with live.connect() as conn:
            await conn.call(CHAT, "bg", "execute", {"command": "sleep 30"}, background=True)
            await conn.send(turn_msg("t", waits))
            await wait_for(conn, of_turn("turn_plan", "t"))
            await limiter_holds(live, [w["call_id"] for w in waits], running=8, waiting=4)
            done = await interrupt(conn)
    check_turn_stream(conn, "t", waits)
    [turn_result] = [m for m in conn.seen if of_turn("turn_result", "t")(m)]
    outcomes = Counter(r["outcome"] for r in turn_result["results"])
    assert outcomes == {"canceled": 8, "not_run": 4}
    for result in turn_result["results"]:
        if result["outcome"] == "canceled":
            assert result["text"] == CANCELED_TEXT and result["started_at"] is not None
        else:
            assert_not_run(result, "process_output")
    assert sorted(done["call_ids"]) == [w["call_id"] for w in waits]


# --- 5.7: the race between an interrupt and a call's natural end ----------------------------------


async def race_once(conn: RawConn, i: int) -> tuple[dict[str, Any], Message]:
    """`echo done` in a turn (even i) or as a plain call (odd i), interrupted right after its
    `started`. Checks that it got exactly one result, the same in `result`, `turn_result` and a
    later repeat `call`; returns (saved result, interrupted)."""
    call_id, turn_id = f"e{i}", f"t{i}"
    in_turn = i % 2 == 0
    command = execute(call_id, "echo done")
    start = len(conn.seen)
    await conn.send(turn_msg(turn_id, [command]) if in_turn else call_msg(command))
    await wait_for(conn, of("started", call_id), start=start)
    await conn.send(interrupt_msg(turn_id if in_turn else None))
    done = await wait_for(conn, is_interrupted, start=start)
    [result] = [m for m in conn.seen[start:] if of("result", call_id)(m)]
    saved = fields(result)
    if in_turn:
        [tr] = [m for m in conn.seen[start:] if of_turn("turn_result", turn_id)(m)]
        assert conn.seen.index(result) < conn.seen.index(tr) < conn.seen.index(done)
        assert same_bytes(tr["results"], [saved])
    repeat = await conn.call(CHAT, call_id, "execute", {"command": "echo done"})
    assert same_bytes(fields(repeat), saved)
    assert len([m for m in conn.seen[start:] if of("result", call_id)(m)]) == 2
    assert set(done["call_ids"]) <= {call_id}
    return saved, done


async def test_an_interrupt_racing_a_natural_end_leaves_exactly_one_result(
    live: LiveServer,
) -> None:
    """30 races; whichever of the end and the interrupt comes first, the call has one result."""
    outcomes: Counter[str] = Counter()
    with trio.fail_after(TEST_DEADLINE_S):
        async with live.connect() as conn:
            for i in range(30):
                saved, done = await race_once(conn, i)
                outcomes[saved["outcome"]] += 1
                assert saved["outcome"] in ("completed", "canceled"), saved
                if saved["outcome"] == "completed":
                    assert saved["data"]["exit_code"] == 0 and saved["output"] == "done\n"
                    assert saved["canceled"] is False
                else:
                    assert saved["text"] == CANCELED_TEXT and saved["canceled"] is True
                    assert done["call_ids"] == [f"e{i}"]
    print(f"race outcomes: {dict(outcomes)}")


@pytest.mark.parametrize("in_turn", [False, True], ids=["call", "turn"])
async def test_a_command_that_ended_before_the_interrupt_keeps_its_real_result(
    live: LiveServer, in_turn: bool
) -> None:
    """The race above, made deterministic. The command waits for the file `go`. After `started`
    the test creates it and blocks the event loop (plain `time.sleep`, no await) until the shell
    is a zombie: it has exited by itself, with its output in the pipe, and the agent (whose loop
    is blocked) has not reaped it yet. Then the test applies the interrupt synchronously, exactly
    as the server's dispatch does. The natural end came first, so the call keeps its real
    result: completed, exit code 0, "done\n"."""
    command = execute("e1", "while [ ! -e go ]; do sleep 0.005; done; echo done")
    with trio.fail_after(TEST_DEADLINE_S):
        async with live.connect() as conn:
            await conn.send(turn_msg("t", [command]) if in_turn else call_msg(command))
            started = await wait_for(conn, of("started", "e1"))
            # From here to the interrupt: no await, so the agent cannot see the exit.
            (live.workspace / "go").touch()
            deadline = time.monotonic() + 5
            while proc_state(started["pid"]) != "Z":
                assert time.monotonic() < deadline, proc_state(started["pid"])
                time.sleep(0.001)  # noqa: ASYNC251 (blocking on purpose: nothing may reap it)
            requester = Outbox("test")
            live.agent.interrupt(requester, CHAT, "t" if in_turn else None, None)
            result = await wait_for(conn, of("result", "e1"))
            while not requester.take():  # the `interrupted` reply: the chat is quiet
                await requester.wait()
    saved = fields(result)
    assert saved["outcome"] == "completed", saved
    assert saved["data"]["exit_code"] == 0 and saved["output"] == "done\n"
    assert saved["canceled"] is False


# --- late events never leak into the next turn ----------------------------------------------------


async def test_late_events_of_an_interrupted_turn_never_reach_the_next_turn(
    live: LiveServer,
) -> None:
    old = [
        execute("o1", "while :; do echo tick; sleep 0.002; done"),
        spec("o2", "write_file", {"path": "g.txt", "content": "x"}, approval=True),
        execute("o3", "echo never"),
    ]
    new = [
        execute("n1", "for i in 1 2 3 4 5; do echo new $i; sleep 0.01; done"),
        read("n2", "n.txt"),
        spec("n3", "process_output", {"process_id": "o1"}),
    ]
    with trio.fail_after(TEST_DEADLINE_S):
        async with live.connect() as conn:
            (live.workspace / "n.txt").write_text("n\n")
            await conn.send(turn_msg("old", old))
            await output_containing(conn, "o1", "tick\ntick\ntick\n")
            done = await interrupt(conn)
            start = len(conn.seen)
            await conn.send(turn_msg("new", new))
            result = await wait_for(conn, of_turn("turn_result", "new"), start=start)
            await conn.call(CHAT, "probe", "process_list", {})
    # o2 and o3 were still queued behind the running o1 (o2's gate never opened): not_run.
    assert sorted(done["call_ids"]) == ["o1", "o2", "o3"]
    later = conn.seen[start:]
    old_ids = {c["call_id"] for c in old}
    assert not [m for m in later if m.get("call_id") in old_ids or m.get("turn_id") == "old"]
    check_turn_stream(conn, "new", new, start=start)
    assert by_call(result, new)["n1"]["output"] == "".join(f"new {i}\n" for i in range(1, 6))
    state = by_call(result, new)["n3"]["data"]
    assert state["running"] is False and state["canceled"] is True


# --- an interrupt of one turn ends the calls it names, whoever created them -----------------------


async def test_interrupt_of_a_turn_ends_the_calls_it_shares(live: LiveServer) -> None:
    shared = execute("s1", "printf 's\\n'; sleep 30")
    plain = execute("p1", "printf 'p\\n'; sleep 30")
    done: Message | None = None
    with trio.fail_after(TEST_DEADLINE_S):
        async with live.connect() as conn:
            await conn.send(turn_msg("t1", [shared]))
            await conn.send(call_msg(plain))
            await output_containing(conn, "s1", "s")
            await output_containing(conn, "p1", "p")
            await conn.send(turn_msg("t2", [shared, plain, read("r1", "a.txt")]))
            await wait_for(conn, of_turn("turn_plan", "t2"))
            await conn.send(interrupt_msg("t2"))
            # A cancel of these commands ends them within milliseconds (SIGTERM, no trap).
            with trio.move_on_after(1.5):
                done = await wait_for(conn, is_interrupted)
    assert done is not None, "no `interrupted` within 1.5 s"
    [result] = [m for m in conn.seen if of_turn("turn_result", "t2")(m)]
    assert sorted(done["call_ids"]) == ["p1", "r1", "s1"]
    assert_canceled_while_running(result["results"][0], "s\n")
    assert_canceled_while_running(result["results"][1], "p\n")
    assert_not_run(result["results"][2], "read_file")
