"""PROTOCOL.md 9.9 through a real server and the independent raw client: ids hold printable
characters only, one reply per request whatever follows it, replays in request order, output
cursors that never skip what is owed, truthful ends for failures inside the agent, and the
last incomplete UTF-8 character of a command's output."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio

from tests import wsclient
from tests.conftest import LiveServer, MakeServer
from tests.wsclient import FrameConn
from toolwire.actors.calls import CallSpec
from toolwire.actors.events import (
    AcceptedEvent,
    ErrorEvent,
    Event,
    ResultEvent,
    TurnResultEvent,
)
from toolwire.actors.journal import SqliteJournal
from toolwire.actors.outbox import Outbox

Message = dict[str, Any]

# Every test ends well within this; a hang fails instead of blocking the suite.
TEST_DEADLINE_S = 10.0

# Each is refused by str.isprintable(): a trailing newline (a regex `$` let it through), a line
# separator, a zero-width space (a format character), a carriage return, a NEL.
UNPRINTABLE_IDS = ["x\n", "x\u2028", "x\u200b", "\rx", "x\x85y"]


@pytest.mark.parametrize("encoding", ["json", "msgpack"])
async def test_ids_that_are_not_printable_are_refused_and_change_nothing(
    live: LiveServer, encoding: str
) -> None:
    with trio.fail_after(TEST_DEADLINE_S):
        marker = live.workspace / "marker"
        touch = {"command": f"echo ran >> {marker}"}
        async with live.connect(encoding=encoding) as conn:
            rid = 0
            for bad in UNPRINTABLE_IDS:
                cases: list[tuple[Message, str, str]] = [
                    ({"type": "call", "chat_id": "c", "call_id": bad, "tool": "execute",
                      "args": touch}, "bad_message", "$.call_id"),
                    ({"type": "call", "chat_id": bad, "call_id": "k", "tool": "execute",
                      "args": touch}, "bad_message", "$.chat_id"),
                    ({"type": "turn", "chat_id": "c", "turn_id": bad,
                      "calls": [{"call_id": "k", "tool": "execute", "args": touch}]},
                     "bad_message", "$.turn_id"),
                    ({"type": "turn", "chat_id": "c", "turn_id": "t",
                      "calls": [{"call_id": bad, "tool": "execute", "args": touch}]},
                     "bad_message", "$.calls[0].call_id"),
                    ({"type": "attach", "chat_id": "c", "call_id": bad},
                     "bad_message", "$.call_id"),
                    ({"type": "cancel", "chat_id": "c", "call_ids": ["k", bad]},
                     "bad_message", "$.call_ids[1]"),
                    ({"type": "interrupt", "chat_id": "c", "turn_id": bad},
                     "bad_message", "$.turn_id"),
                    ({"type": "call", "chat_id": "c", "call_id": "p", "tool": "process_output",
                      "args": {"process_id": bad}}, "bad_args", "args.process_id"),
                    ({"type": "call", "chat_id": "c", "call_id": "p", "tool": "process_signal",
                      "args": {"process_id": bad, "signal": "SIGTERM"}}, "bad_args",
                     "args.process_id"),
                ]  # fmt: skip
                for message, code, where in cases:
                    rid += 1
                    await conn.send(message | {"rid": rid})
                    reply = await conn.recv()
                    assert reply["type"] == "error" and reply["code"] == code, (bad, reply)
                    assert where in reply["message"] and reply.get("rid") == rid, (bad, reply)
            # Nothing was recorded or run: the same ids without the bad character are all free.
            await conn.send({"type": "attach", "chat_id": "c", "call_id": "k", "rid": "a"})
            assert (await conn.recv())["code"] == "unknown_call"
            result = await conn.call("c", "x", "execute", touch)
            assert result["outcome"] == "completed", result
        assert marker.read_text() == "ran\n"


def _port(live: LiveServer) -> int:
    return int(live.url.rsplit(":", 1)[1].split("/", 1)[0])


async def _burst(live: LiveServer, *messages: Message) -> FrameConn:
    """A raw connection that sends `messages` in one TCP write: the agent applies them back to
    back, before it sends anything (the tightest race a client can make)."""
    conn = await FrameConn.open(_port(live), live.token)
    await conn.stream.send_all(conn.frames(*(json.dumps(m) for m in messages)))
    return conn


async def _receive_until(conn: FrameConn, done: Callable[[list[Message]], bool]) -> list[Message]:
    while True:
        got = [json.loads(m) for m in conn.messages]
        if done(got):
            return got
        await conn.receive_messages(len(conn.messages) + 1)


def _about(got: list[Message], call_id: str) -> list[tuple[str, Any]]:
    """(type, rid or offset) of each message about `call_id`, in order."""
    return [
        (m["type"], m.get("offset", m.get("rid")))
        for m in got
        if m.get("call_id") == call_id and m["type"] != "welcome"
    ]


async def test_a_call_then_detach_at_once_still_gets_accepted_and_its_result(
    live: LiveServer,
) -> None:
    """PROTOCOL.md 9.9: `detach` stops the call's events, never a reply. (A `call` followed at
    once by a `detach` used to get no `accepted` and no `result`, though the command ran.)"""
    with trio.fail_after(TEST_DEADLINE_S):
        marker = live.workspace / "marker"
        call = {"type": "call", "chat_id": "c", "call_id": "k", "tool": "execute",
                "args": {"command": f"echo ran >> {marker}; echo out"}, "rid": 1}  # fmt: skip
        detach = {"type": "detach", "chat_id": "c", "call_id": "k", "rid": 2}
        conn = await _burst(live, call, detach)
        try:
            got = await _receive_until(conn, lambda got: ("result", None) in _about(got, "k"))
        finally:
            await conn.aclose()
        # Nothing of the call's events after the detach: only the two replies.
        assert _about(got, "k") == [("accepted", 1), ("result", None)]
        assert marker.read_text() == "ran\n"
        # The connection that detached can follow it again: accepted, the replay, the result.
        async with live.connect() as again:
            await again.send({"type": "attach", "chat_id": "c", "call_id": "k", "rid": 3})
            await again.recv_until(wsclient.is_result("k"))
            assert [m["type"] for m in wsclient.messages(again, "k")] == [
                "accepted",
                "output",
                "result",
            ]


async def test_on_an_ended_call_a_repeat_gets_its_result_only_an_attach_replays_after_accepted(
    live: LiveServer,
) -> None:
    """PROTOCOL.md 9.9: on an ended call a repeated `call` gets `accepted` and the saved
    `result` only; an `attach` gets its `accepted` before anything it replays. (Back to back
    they used to give accepted, output, result, accepted, result: the repeat got the attach's
    replay, before the attach's own `accepted`.)"""
    with trio.fail_after(TEST_DEADLINE_S):
        async with live.connect() as first:
            await first.call("c", "k", "execute", {"command": "echo hello"})
        call = {"type": "call", "chat_id": "c", "call_id": "k", "tool": "execute",
                "args": {"command": "echo hello"}, "rid": 2}  # fmt: skip
        attach = {"type": "attach", "chat_id": "c", "call_id": "k", "rid": 3}
        repeat = call | {"rid": 4}
        conn = await _burst(live, call, attach, repeat)
        try:
            got = await _receive_until(
                conn, lambda got: [t for t, _ in _about(got, "k")].count("result") == 3
            )
        finally:
            await conn.aclose()
        about = _about(got, "k")
        # Results carry no rid, and on the SQLite journal they are read back while the next
        # requests are accepted, so replies may interleave; what each request is owed may not.
        assert [rid for kind, rid in about if kind == "accepted"] == [2, 3, 4]
        assert [kind for kind, _ in about].count("result") == 3
        outputs = [i for i, (kind, _) in enumerate(about) if kind == "output"]
        assert len(outputs) == 1 and about[outputs[0]] == ("output", 0), about
        # The one replay is the attach's: after its accepted, before a result.
        assert about.index(("accepted", 3)) < outputs[0] < len(about) - 1, about
        assert ("result", None) in about[outputs[0] :], about


async def test_an_attach_from_far_ahead_never_skips_output_an_earlier_call_still_owes(
    live: LiveServer,
) -> None:
    """PROTOCOL.md 9.9: a repeated `call` or `attach` on a connection that follows the call
    moves its cursor only back. (An `attach` with `from_offset: 1000000` used to move it ahead,
    and the rest of the output the `call` owed was never sent on that connection.)"""
    with trio.fail_after(TEST_DEADLINE_S):
        go = live.workspace / "go"
        command = f"echo cccc; while [ ! -e {go} ]; do sleep 0.01; done; echo dddd"
        async with live.connect() as conn:
            await conn.send({"type": "call", "chat_id": "c", "call_id": "k", "tool": "execute",
                             "args": {"command": command}, "rid": 1})  # fmt: skip
            await wsclient.wait_for(conn, wsclient.of("output", "k"))
            await conn.send(
                {"type": "attach", "chat_id": "c", "call_id": "k", "from_offset": 1000000, "rid": 2}
            )
            await wsclient.wait_for(conn, lambda m: m["type"] == "accepted" and m.get("rid") == 2)
            go.touch()
            await conn.recv_until(wsclient.is_result("k"))
            await conn.recv_until(wsclient.is_result("k"))  # one result per request
            assert wsclient.streamed(conn, "k") == "cccc\ndddd\n"
            types = [m["type"] for m in wsclient.messages(conn, "k")]
            assert types.count("accepted") == 2 and types[-2:] == ["result", "result"]


@pytest.mark.parametrize("end", ["exit", "cancel", "timeout"])
async def test_an_incomplete_character_at_the_end_reaches_followers_as_a_replacement(
    live: LiveServer, end: str
) -> None:
    """PROTOCOL.md 9.9: when a command ends, an incomplete UTF-8 sequence at the end of its
    output goes to followers as U+FFFD at its offset, so output stitched by offset reaches
    `output_bytes`; an attach from that offset gets it too. (Followers used to get offsets up
    to 13 of 14 only, and an attach from 13 got nothing.)"""
    # 13 ASCII bytes, then the first byte of a three-byte character (U+20AC is E2 82 AC).
    command = r"printf 'hello world!!\342'"
    extra: dict[str, Any] = {}
    if end != "exit":
        command += "; sleep 30"
    if end == "timeout":
        extra["timeout_ms"] = 300
    with trio.fail_after(TEST_DEADLINE_S):
        async with live.connect() as conn:
            await conn.send({"type": "call", "chat_id": "c", "call_id": "k", "tool": "execute",
                             "args": {"command": command}} | extra)  # fmt: skip
            if end == "cancel":
                await wsclient.wait_for(conn, wsclient.of("output", "k"))
                await conn.send({"type": "cancel", "chat_id": "c", "call_ids": ["k"]})
            result = await wsclient.wait_for(conn, wsclient.is_result("k"))
            assert result["output_bytes"] == 14, result
            outputs = wsclient.messages(conn, "k", "output")
            assert "".join(m["data"] for m in outputs) == "hello world!!\ufffd"
            last = outputs[-1]  # the U+FFFD stands for the byte at offset 13
            assert last["data"].endswith("\ufffd")
            assert last["offset"] + len(last["data"][:-1].encode()) == 13, outputs
        async with live.connect() as late:
            await late.send({"type": "attach", "chat_id": "c", "call_id": "k", "from_offset": 13})
            await late.recv_until(wsclient.is_result("k"))
            assert [(m["offset"], m["data"]) for m in wsclient.messages(late, "k", "output")] == [
                (13, "\ufffd")
            ]


AGENT_FAILURE_BEFORE_RUN = "tool call failed inside the agent before it ran; no changes were made"


async def _events_until(outbox: Outbox, done: Callable[[list[Event]], bool]) -> list[Event]:
    got: list[Event] = []
    while not done(got):
        await outbox.wait()
        got += outbox.take()
    return got


@pytest.mark.parametrize("how", ["call", "gated", "turn"])
async def test_a_call_the_journal_cannot_store_ends_not_run_and_nothing_waits_on_it(
    make_server: MakeServer, tmp_path: Path, how: str
) -> None:
    """PROTOCOL.md 9.9: a failure while admitting or journaling a call ends it `not_run` with
    the agent-failure text of 9.10 when its effect cannot have started; the request that got
    `accepted` gets no `error`, and repeats, attaches, cancels and interrupts all get replies.

    The wire refuses the values that reach the SQLite journal's encoder and fail there (an
    integer of 2**70, here as the `timeout_ms` every row of a call holds: a row keeps the args
    only while the call awaits approval), so the request is applied through the agent's own
    API, behind the decoder, on a real server whose other requests come over the wire. (It used
    to raise out of the request after `accepted`, the server answered `error{internal}` too,
    the record stayed running forever, and later attaches, cancels and interrupts hung.)"""
    server = await make_server(journal=SqliteJournal(tmp_path / "state" / "journal.sqlite3"))
    marker = server.workspace / "marker"
    args = {"command": f"echo ran >> {marker}"}
    unstorable = 2**70
    outbox = Outbox("in-process")
    with trio.fail_after(TEST_DEADLINE_S):
        if how == "turn":
            spec = CallSpec("k", "execute", args, timeout_ms=unstorable)
            server.agent.turn(outbox, "c", "t", [spec], stream=True, rid=1)
            got = await _events_until(
                outbox, lambda got: any(isinstance(e, TurnResultEvent) for e in got)
            )
        else:
            spec = CallSpec("k", "execute", args, timeout_ms=unstorable, approval=how == "gated")
            server.agent.call(outbox, "c", spec, stream=True, rid=1)
            got = await _events_until(
                outbox, lambda got: any(isinstance(e, ResultEvent) for e in got)
            )
        accepted = [e for e in got if isinstance(e, AcceptedEvent)]
        results = [e.result for e in got if isinstance(e, ResultEvent)]
        assert len(accepted) == 1 and len(results) == 1, got
        assert not any(isinstance(e, ErrorEvent) for e in got), got
        assert (results[0].outcome, results[0].text) == ("not_run", AGENT_FAILURE_BEFORE_RUN)
        async with server.connect() as conn:
            await conn.send({"type": "attach", "chat_id": "c", "call_id": "k", "rid": 2})
            attached = await wsclient.wait_for(conn, wsclient.is_result("k"))
            assert attached["text"] == AGENT_FAILURE_BEFORE_RUN
            await conn.send({"type": "cancel", "chat_id": "c", "call_ids": ["k"], "rid": 3})
            canceled = await wsclient.wait_for(conn, wsclient.of("cancel_result", "k"))
            assert canceled["result"]["text"] == AGENT_FAILURE_BEFORE_RUN
            await conn.send({"type": "interrupt", "chat_id": "c", "rid": 4})
            await wsclient.wait_for(conn, lambda m: m["type"] == "interrupted")
            # The chat goes on: a new call in it runs.
            result = await conn.call("c", "next", "execute", {"command": "echo next"})
            assert result["outcome"] == "completed", result
    assert not marker.exists()


async def test_execute_args_no_process_can_take_are_bad_args_up_front(live: LiveServer) -> None:
    """A NUL character (or an env name with `=`) cannot reach a process: refused as bad_args
    before `accepted`, rather than failing inside the agent after it (PROTOCOL.md 9.9)."""
    cases = [
        ({"command": "echo a\0b"}, "args.command"),
        ({"command": "true", "cwd": "a\0"}, "args.cwd"),
        ({"command": "true", "env": {"A=B": "x"}}, "args.env"),
        ({"command": "true", "env": {"": "x"}}, "args.env"),
        ({"command": "true", "env": {"A": "x\0"}}, "args.env.A"),
    ]
    with trio.fail_after(TEST_DEADLINE_S):
        async with live.connect() as conn:
            for i, (args, where) in enumerate(cases):
                await conn.send({"type": "call", "chat_id": "c", "call_id": f"k{i}",
                                 "tool": "execute", "args": args, "rid": i})  # fmt: skip
                reply = await conn.recv()
                assert reply["type"] == "error" and reply["code"] == "bad_args", reply
                assert where in reply["message"] and reply["rid"] == i, reply
            await conn.send({"type": "attach", "chat_id": "c", "call_id": "k0"})
            assert (await conn.recv())["code"] == "unknown_call"


@pytest.mark.parametrize("gated", [False, True])
async def test_no_event_reaches_a_connection_before_the_accepted_that_brings_it(
    live: LiveServer, gated: bool
) -> None:
    """Issue 26, defect 6 (PROTOCOL.md 9.9, 5.0): on one connection a `stream: false` call of a
    call another connection made, then at once an `attach` of it. The `started` came after the
    first `accepted` and before the attach's: while the only answered request on the connection
    was one that brings no `started`. Gated, the connection answers the gate in between: it gets
    its `approve`'s one reply, not also the `approval_resolved` its `stream: false` call does not
    bring. Every streamed event of the call comes after the attach's `accepted`."""
    with trio.fail_after(TEST_DEADLINE_S):
        gate = live.workspace / "go"
        command = f"while [ ! -e {gate} ]; do sleep 0.01; done; echo out"
        spec = {"type": "call", "chat_id": "c", "call_id": "k", "tool": "execute",
                "args": {"command": command}, "approval": gated}  # fmt: skip
        async with live.connect() as first:
            await first.send(spec | {"rid": 1})
            await first.recv_until(wsclient.of("approval" if gated else "started", "k"))
            requests: list[Message] = [spec | {"stream": False, "rid": "r173"}]
            if gated:
                requests.append({"type": "approve", "chat_id": "c", "call_id": "k",
                                 "approved": True, "rid": 174})  # fmt: skip
            requests.append({"type": "attach", "chat_id": "c", "call_id": "k", "rid": 175})
            conn = await _burst(live, *requests)
            try:
                got = await _receive_until(conn, lambda got: ("accepted", 175) in _about(got, "k"))
                gate.touch()
                got = await _receive_until(
                    conn, lambda got: [t for t, _ in _about(got, "k")].count("result") == 2
                )
            finally:
                await conn.aclose()
        about = _about(got, "k")
        attached = about.index(("accepted", 175))
        before = [kind for kind, _ in about[:attached]]
        after = [kind for kind, _ in about[attached + 1 :]]
        assert before == (
            ["accepted", "approval", "approval_resolved"] if gated else ["accepted"]
        ), about
        assert after[0] == "started" and after.count("started") == 1 and "output" in after, about
        assert after[-2:] == ["result", "result"], about
