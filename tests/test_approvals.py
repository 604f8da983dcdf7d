"""Approval gates (PROTOCOL.md 5.5, issue 4) through the real server, real sockets and processes.

Every gated call in here writes a marker file in the workspace when (and only when) it really
runs: `echo ran >> m_<call>` for `execute`, the file itself for `write_file`. A marker that is
missing while the gate is parked, or after a deny / cancel / expiry, proves the call did not run;
a marker holding exactly one "ran" line proves it ran once.

Waiting is always on a protocol message, never on a sleep. To prove that something did NOT
arrive, `barrier()` sends a request the server rejects at once (`attach` with a negative offset):
its `error` comes back through the same queue as every event, so whatever the agent had queued
for that connection before has arrived when it does. The one MockClock test drives the `Agent`
in memory with a tool that starts no process.
"""

from __future__ import annotations

import itertools
import json
import math
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conftest import TOKEN, LiveServer, MakeServer, start_server
from tests.wsclient import Message, RawConn, of, wait_for
from toolwire.actors.agent import Agent, AgentContext, Limits
from toolwire.actors.chat import CallSpec
from toolwire.actors.events import (
    AcceptedEvent,
    ApprovalEvent,
    ApprovalResolvedEvent,
    Event,
    ResultEvent,
    TurnPlanEvent,
)
from toolwire.actors.outbox import Outbox
from toolwire.actors.results import TEXT_APPROVAL_EXPIRED, TEXT_CANCELED_BEFORE_RUN, TEXT_DENIED

DENIED_TEXT = "tool call was denied; no changes were made"
NOT_RUN_TEXT = "tool call was canceled before it ran; no changes were made"
EXPIRED_TEXT = "tool call was not approved in time; no changes were made"

# Every test ends well within this; a hang fails instead of blocking the suite.
DEADLINE_S = 10.0
CHAT = "chat-a"
# `toolwire serve` takes no token under 128 bits (cli/agent_token.py): 26 base64 characters.
APPROVE_TOKEN = "approvals-serve-token-0123"

_rids = itertools.count(1)


def test_section_7_texts_are_exact() -> None:
    assert TEXT_DENIED == DENIED_TEXT
    assert TEXT_CANCELED_BEFORE_RUN == NOT_RUN_TEXT
    assert TEXT_APPROVAL_EXPIRED == EXPIRED_TEXT


# --- helpers --------------------------------------------------------------------------------------


def rid() -> str:
    return f"r{next(_rids)}"


def call_msg(chat_id: str, call_id: str, tool: str, args: Any, **extra: Any) -> Message:
    return {
        "type": "call",
        "chat_id": chat_id,
        "call_id": call_id,
        "tool": tool,
        "args": args,
    } | extra


def marker(call_id: str, chat_id: str = CHAT) -> str:
    return f"m_{chat_id}_{call_id}"


def marked_execute(chat_id: str, call_id: str, **extra: Any) -> Message:
    """An execute call that appends one line to its own marker file when it runs."""
    return call_msg(
        chat_id, call_id, "execute", {"command": f"echo ran >> {marker(call_id, chat_id)}"}, **extra
    )


def marked_write(chat_id: str, call_id: str, **extra: Any) -> Message:
    """A write_file call whose target is its own marker file."""
    path = marker(call_id, chat_id)
    return call_msg(chat_id, call_id, "write_file", {"path": path, "content": "ran\n"}, **extra)


def approve_msg(chat_id: str, call_id: str, approved: bool, **extra: Any) -> Message:
    return {
        "type": "approve",
        "chat_id": chat_id,
        "call_id": call_id,
        "approved": approved,
    } | extra


def with_rid(value: str) -> Callable[[Message], bool]:
    return lambda m: m.get("rid") == value


async def barrier(conn: RawConn) -> list[Message]:
    """Everything the agent had queued for this connection so far (see the module doc)."""
    tag = rid()
    await conn.send(
        {"type": "attach", "rid": tag, "chat_id": CHAT, "call_id": "x", "from_offset": -1}
    )
    got = await conn.recv_until(with_rid(tag))
    assert got[-1]["type"] == "error" and got[-1]["code"] == "bad_message", got[-1]
    return got[:-1]


def seen(
    conn: RawConn, call_id: str, kind: str | None = None, chat_id: str = CHAT
) -> list[Message]:
    return [
        m
        for m in conn.seen
        if m.get("call_id") == call_id
        and m.get("chat_id") == chat_id
        and (kind is None or m["type"] == kind)
    ]


def index(conn: RawConn, predicate: Callable[[Message], bool]) -> int:
    for i, message in enumerate(conn.seen):
        if predicate(message):
            return i
    raise AssertionError("no such message")


async def error_for(conn: RawConn, tag: str) -> Message:
    message = await wait_for(conn, with_rid(tag))
    assert message["type"] == "error", message
    return message


async def approve_expecting_error(
    conn: RawConn, chat_id: str, call_id: str, approved: bool = True
) -> str:
    tag = rid()
    await conn.send(approve_msg(chat_id, call_id, approved, rid=tag))
    return str((await error_for(conn, tag))["code"])


async def state_seen_by_new_request(live: LiveServer, chat_id: str, call_id: str) -> str:
    """`accepted.state` as a fresh connection's attach sees it (the attach changes nothing)."""
    async with live.connect() as probe:
        await probe.send(
            {"type": "attach", "chat_id": chat_id, "call_id": call_id, "from_offset": 0}
        )
        accepted = await wait_for(probe, of("accepted", call_id))
        return str(accepted["state"])


def ran(live: LiveServer, call_id: str, chat_id: str = CHAT) -> bool:
    return (live.workspace / marker(call_id, chat_id)).exists()


def ran_once(live: LiveServer, call_id: str, chat_id: str = CHAT) -> bool:
    return (live.workspace / marker(call_id, chat_id)).read_text() == "ran\n"


def result_fields(message: Message) -> dict[str, Any]:
    return {k: v for k, v in message.items() if k not in ("type", "chat_id", "call_id")}


def turn_result_of(turn_id: str) -> Callable[[Message], bool]:
    return lambda m: m["type"] == "turn_result" and m["turn_id"] == turn_id


def decisions(conn: RawConn, call_id: str, chat_id: str = CHAT) -> list[str]:
    return [m["decision"] for m in seen(conn, call_id, "approval_resolved", chat_id)]


# --- gating ---------------------------------------------------------------------------------------


async def test_a_gated_call_parks_announces_and_runs_only_after_its_approval(
    live: LiveServer,
) -> None:
    with trio.fail_after(DEADLINE_S):
        async with live.connect() as caller, live.connect() as watcher, live.connect() as judge:
            await caller.send(marked_execute(CHAT, "g", approval=True, rid="c1"))
            accepted = await wait_for(caller, of("accepted", "g"))
            assert (accepted["state"], accepted["replay"], accepted["rid"]) == (
                "awaiting_approval",
                False,
                "c1",
            )
            approval = await wait_for(caller, of("approval", "g"))
            assert approval == {
                "type": "approval",
                "chat_id": CHAT,
                "call_id": "g",
                "tool": "execute",
                "args": {"command": f"echo ran >> {marker('g')}"},
            }  # no turn_id outside a turn
            await watcher.send({"type": "attach", "chat_id": CHAT, "call_id": "g"})
            assert (await wait_for(watcher, of("accepted", "g")))["state"] == "awaiting_approval"
            assert (await wait_for(watcher, of("approval", "g"))) == approval
            await barrier(caller)
            assert not ran(live, "g")
            assert [m["type"] for m in seen(caller, "g")] == ["accepted", "approval"]

            # The judge does not follow the call: it still learns that its answer took effect,
            # and a successful approve gets no other reply.
            await judge.send(approve_msg(CHAT, "g", True, rid="yes"))
            for conn in (caller, watcher, judge):
                resolved = await wait_for(conn, of("approval_resolved", "g"))
                assert resolved == {
                    "type": "approval_resolved",
                    "chat_id": CHAT,
                    "call_id": "g",
                    "decision": "approved",
                }
            result = await wait_for(caller, of("result", "g"))
            assert result["outcome"] == "completed" and result["data"]["exit_code"] == 0
            assert ran_once(live, "g")
            await wait_for(watcher, of("result", "g"))
            for conn in (caller, watcher, judge):
                await barrier(conn)
                assert decisions(conn, "g") == ["approved"]
            assert not [m for m in judge.seen if m.get("rid") == "yes"]
            assert [m["type"] for m in seen(judge, "g")] == ["approval_resolved"]
            for conn in (caller, watcher):
                kinds = [m["type"] for m in seen(conn, "g")]
                assert kinds == ["accepted", "approval", "approval_resolved", "started", "result"]


async def test_the_policy_gates_the_tools_it_names(make_server: MakeServer) -> None:
    live = await make_server(approve_tools=frozenset({"execute", "write_file"}))
    (live.workspace / "notes.txt").write_text("hello\n")
    with trio.fail_after(DEADLINE_S):
        async with live.connect() as conn:
            await conn.send(marked_execute(CHAT, "e"))  # no approval flag: the policy gates it
            await conn.send(marked_execute(CHAT, "e2", approval=False))  # cannot opt out
            await conn.send(marked_write(CHAT, "w"))
            await conn.send(call_msg(CHAT, "r", "read_file", {"path": "notes.txt"}))
            read = await wait_for(conn, of("result", "r"))
            assert read["outcome"] == "completed" and read["data"]["content"] == "hello\n"
            assert (await wait_for(conn, of("accepted", "r")))["state"] == "running"
            assert not seen(conn, "r", "approval")
            for call_id, tool in (("e", "execute"), ("e2", "execute"), ("w", "write_file")):
                accepted = await wait_for(conn, of("accepted", call_id))
                assert accepted["state"] == "awaiting_approval"
                approval = await wait_for(conn, of("approval", call_id))
                assert approval["tool"] == tool and "turn_id" not in approval
            await barrier(conn)
            assert not ran(live, "e") and not ran(live, "e2") and not ran(live, "w")

            await conn.send(approve_msg(CHAT, "w", False))
            denied = await wait_for(conn, of("result", "w"))
            assert (denied["outcome"], denied["text"]) == ("denied", DENIED_TEXT)
            assert (denied["tool"], denied["started_at"], denied["wall_ms"]) == (
                "write_file",
                None,
                None,
            )
            assert not ran(live, "w")
            await conn.send(approve_msg(CHAT, "e", True))
            assert (await wait_for(conn, of("result", "e")))["outcome"] == "completed"
            assert ran_once(live, "e")
            assert await state_seen_by_new_request(live, CHAT, "e2") == "awaiting_approval"
            assert not ran(live, "e2")
            await conn.send({"type": "cancel", "chat_id": CHAT, "call_ids": ["e2"]})
            await wait_for(conn, of("cancel_result", "e2"))


async def test_approval_goes_to_each_connection_once_per_gate(live: LiveServer) -> None:
    """docs/protocol.md: a repeated call on the same connection does not re-send `approval`;
    a new connection that calls or attaches a parked call gets it (the gate is re-announced)."""
    message = marked_execute(CHAT, "g", approval=True)
    with trio.fail_after(DEADLINE_S):
        async with live.connect() as first:
            await first.send(message)
            await first.send(message)
            await first.send({"type": "attach", "chat_id": CHAT, "call_id": "g"})
            got = await barrier(first)
            assert [m["type"] for m in got] == ["accepted", "approval", "accepted", "accepted"]
            assert [m["state"] for m in got if m["type"] == "accepted"] == ["awaiting_approval"] * 3
            assert [m["replay"] for m in got if m["type"] == "accepted"] == [False, True, True]
        async with live.connect() as second:
            await second.send(message)  # a repeat call from a new connection
            got = await barrier(second)
            assert [m["type"] for m in got] == ["accepted", "approval"]
            assert got[0]["replay"] is True and got[0]["requests"] == 4
            await second.send(approve_msg(CHAT, "g", False))
            await wait_for(second, of("result", "g"))
            assert decisions(second, "g") == ["denied"]
        assert not ran(live, "g")


async def test_a_call_without_streaming_gets_accepted_approval_and_result(
    live: LiveServer,
) -> None:
    """PROTOCOL.md 4: with `stream: false` a call sends only accepted, approval and result. The
    connection that answers the gate still gets its one approval_resolved (docs/protocol.md)."""
    with trio.fail_after(DEADLINE_S):
        async with live.connect() as conn, live.connect() as judge:
            await conn.send(marked_execute(CHAT, "q1", approval=True, stream=False))
            await conn.send(marked_execute(CHAT, "q2", approval=True, stream=False))
            await wait_for(conn, of("approval", "q2"))
            await judge.send(approve_msg(CHAT, "q1", True))
            await wait_for(conn, of("result", "q1"))
            await conn.send(approve_msg(CHAT, "q2", False))  # answers its own gate
            await wait_for(conn, of("result", "q2"))
            await barrier(conn)
            await barrier(judge)
            assert [m["type"] for m in seen(conn, "q1")] == ["accepted", "approval", "result"]
            kinds = ["accepted", "approval", "approval_resolved", "result"]
            assert [m["type"] for m in seen(conn, "q2")] == kinds
            assert decisions(conn, "q2") == ["denied"] and decisions(judge, "q1") == ["approved"]
            assert ran_once(live, "q1") and not ran(live, "q2")


# --- two gates, answered one by one ---------------------------------------------------------------


@pytest.mark.parametrize(
    "first_answer", [False, True], ids=["deny-then-approve", "approve-then-deny"]
)
async def test_two_gates_are_answered_each_on_its_own(live: LiveServer, first_answer: bool) -> None:
    with trio.fail_after(DEADLINE_S):
        async with live.connect() as caller, live.connect() as judge:
            await caller.send(marked_execute(CHAT, "one", approval=True))
            await caller.send(marked_execute(CHAT, "two", approval=True))
            await wait_for(caller, of("approval", "one"))
            await wait_for(caller, of("approval", "two"))

            for call_id, other, answer in (
                ("one", "two", first_answer),
                ("two", None, not first_answer),
            ):
                await judge.send(approve_msg(CHAT, call_id, answer))
                # The answered call ends the moment its own gate is answered ...
                result = await wait_for(caller, of("result", call_id))
                if answer:
                    assert result["outcome"] == "completed"
                    assert ran_once(live, call_id)
                else:
                    assert (result["outcome"], result["text"]) == ("denied", DENIED_TEXT)
                    assert not ran(live, call_id)
                assert decisions(caller, call_id) == ["approved" if answer else "denied"]
                # ... while the other one stays parked, untouched.
                if other is not None:
                    assert await state_seen_by_new_request(live, CHAT, other) == "awaiting_approval"
                    assert not ran(live, other)
                    assert not seen(caller, other, "approval_resolved")
            await barrier(caller)
            for call_id in ("one", "two"):
                assert len(seen(caller, call_id, "approval")) == 1
                assert len(seen(caller, call_id, "approval_resolved")) == 1
                assert len(seen(caller, call_id, "result")) == 1
                assert await approve_expecting_error(judge, CHAT, call_id) == "not_parked"


# --- a denial that says why (PROTOCOL.md 9.5) -----------------------------------------------------


def denied_because(reason: str) -> str:
    """PROTOCOL.md 9.10's text, built from its definition rather than from the code's."""
    return f"tool call was denied: {reason}; no changes were made"


async def test_a_denial_with_a_reason_tells_the_model_why(live: LiveServer) -> None:
    reason = "do not touch the production database; use the staging one"
    with trio.fail_after(DEADLINE_S):
        async with live.connect() as caller, live.connect(encoding="msgpack") as judge:
            await caller.send(marked_execute(CHAT, "why", approval=True))
            await wait_for(caller, of("approval", "why"))
            await judge.send(approve_msg(CHAT, "why", False, reason=reason))
            result = await wait_for(caller, of("result", "why"))
            assert (result["outcome"], result["text"]) == ("denied", denied_because(reason))
            assert decisions(caller, "why") == ["denied"]
            # The saved result carries the reason: a repeat gets it byte for byte.
            await caller.send(marked_execute(CHAT, "why", approval=True))
            await caller.recv_until(
                lambda m: m["type"] == "result" and len(seen(caller, "why", "result")) == 2
            )
            first, again = seen(caller, "why", "result")
            assert result_fields(first) == result_fields(again)
    assert not ran(live, "why")


@pytest.mark.parametrize("reason", [None, "", "   "])
async def test_a_denial_without_a_reason_keeps_the_section_7_text(
    live: LiveServer, reason: str | None
) -> None:
    with trio.fail_after(DEADLINE_S):
        async with live.connect() as conn:
            await conn.send(marked_write(CHAT, "plain", approval=True))
            await wait_for(conn, of("approval", "plain"))
            extra = {} if reason is None else {"reason": reason}
            await conn.send(approve_msg(CHAT, "plain", False, **extra))
            result = await wait_for(conn, of("result", "plain"))
            assert (result["outcome"], result["text"]) == ("denied", DENIED_TEXT)
    assert not ran(live, "plain")


async def test_a_reason_on_an_approval_changes_nothing(live: LiveServer) -> None:
    with trio.fail_after(DEADLINE_S):
        async with live.connect() as conn:
            await conn.send(marked_execute(CHAT, "yes", approval=True))
            await wait_for(conn, of("approval", "yes"))
            await conn.send(approve_msg(CHAT, "yes", True, reason="looks fine"))
            result = await wait_for(conn, of("result", "yes"))
            assert result["outcome"] == "completed"
            assert "looks fine" not in result["text"]
    assert ran_once(live, "yes")


# --- ten gates, three chats, two connections (hypothesis) -----------------------------------------

CHATS = ("c0", "c1", "c2")
GATES = 10


@settings(max_examples=10, deadline=None)
@given(
    callers=st.lists(st.integers(0, 1), min_size=GATES, max_size=GATES),
    judges=st.lists(st.integers(0, 1), min_size=GATES, max_size=GATES),
    answers=st.lists(st.booleans(), min_size=GATES, max_size=GATES),
    tools=st.lists(st.sampled_from(["execute", "write_file"]), min_size=GATES, max_size=GATES),
    order=st.permutations(range(GATES)),
    one_by_one=st.booleans(),
)
async def test_ten_gates_across_three_chats_answered_in_any_order(
    callers: list[int],
    judges: list[int],
    answers: list[bool],
    tools: list[str],
    order: list[int],
    one_by_one: bool,
) -> None:
    """Each gate is raised by one connection and answered by either (drawn), in a drawn order,
    either waiting for each call's result before the next answer or all answers at once."""
    gates = [(CHATS[i % 3], f"g{i}") for i in range(GATES)]
    with tempfile.TemporaryDirectory() as tmp, trio.fail_after(DEADLINE_S):
        async with trio.open_nursery() as nursery:
            # A server per example: hypothesis runs each example in its own trio.run.
            live = await start_server(nursery, Path(tmp), approve_tools=frozenset({"write_file"}))
            try:
                async with live.connect() as a, live.connect() as b:
                    conns = (a, b)
                    for i, (chat_id, call_id) in enumerate(gates):
                        if tools[i] == "execute":
                            message = marked_execute(chat_id, call_id, approval=True)
                        else:
                            message = marked_write(chat_id, call_id)  # gated by the policy
                        await conns[callers[i]].send(message)
                    for i, (chat_id, call_id) in enumerate(gates):
                        caller = conns[callers[i]]
                        accepted = await wait_for(caller, of("accepted", call_id, chat_id))
                        assert accepted["state"] == "awaiting_approval"
                        approval = await wait_for(caller, of("approval", call_id, chat_id))
                        assert approval["tool"] == tools[i]
                    assert not any(ran(live, c, chat) for chat, c in gates)

                    for step, i in enumerate(order):
                        chat_id, call_id = gates[i]
                        await conns[judges[i]].send(approve_msg(chat_id, call_id, answers[i]))
                        if not one_by_one:
                            continue
                        await wait_for(conns[callers[i]], of("result", call_id, chat_id))
                        # Every gate not answered yet is still parked and has not run.
                        for j in order[step + 1 :]:
                            assert not ran(live, gates[j][1], gates[j][0])
                    for i, (chat_id, call_id) in enumerate(gates):
                        result = await wait_for(conns[callers[i]], of("result", call_id, chat_id))
                        expected = "completed" if answers[i] else "denied"
                        assert result["outcome"] == expected, (call_id, result)
                        assert result["tool"] == tools[i]
                        if not answers[i]:
                            assert result["text"] == DENIED_TEXT
                        await wait_for(conns[judges[i]], of("approval_resolved", call_id, chat_id))

                    # No gate can be answered twice, whatever the second answer says.
                    for i, (chat_id, call_id) in enumerate(gates):
                        judge = conns[1 - judges[i]]
                        code = await approve_expecting_error(
                            judge, chat_id, call_id, not answers[i]
                        )
                        assert code == "not_parked"
                    for conn in conns:
                        await barrier(conn)
                    for i, (chat_id, call_id) in enumerate(gates):
                        decision = "approved" if answers[i] else "denied"
                        caller, judge = conns[callers[i]], conns[judges[i]]
                        assert len(seen(caller, call_id, "approval", chat_id)) == 1
                        assert len(seen(caller, call_id, "result", chat_id)) == 1
                        # Exactly one approval_resolved each, on the caller and on the judge.
                        assert decisions(caller, call_id, chat_id) == [decision]
                        assert decisions(judge, call_id, chat_id) == [decision]
                        if answers[i]:
                            assert ran_once(live, call_id, chat_id)
                        else:
                            assert not ran(live, call_id, chat_id)
                        # An approval_resolved comes before the call's result.
                        assert index(caller, of("approval_resolved", call_id, chat_id)) < index(
                            caller, of("result", call_id, chat_id)
                        )
            finally:
                await live.server.shutdown()
                nursery.cancel_scope.cancel()


# --- gates belong to the chat, not to the connection ----------------------------------------------


async def test_a_gate_survives_the_connection_that_raised_it(live: LiveServer) -> None:
    message = call_msg(
        CHAT, "g", "execute", {"command": f"echo ran >> {marker('g')}; echo out"}, approval=True
    )
    with trio.fail_after(DEADLINE_S):
        async with live.connect() as raiser:
            await raiser.send(message)
            await wait_for(raiser, of("approval", "g"))
        # The raiser is gone; the gate is not.
        async with live.connect() as rescuer:
            await rescuer.send({"type": "attach", "chat_id": CHAT, "call_id": "g"})
            accepted = await wait_for(rescuer, of("accepted", "g"))
            assert (accepted["replay"], accepted["state"]) == (True, "awaiting_approval")
            approval = await wait_for(rescuer, of("approval", "g"))
            assert approval["args"] == message["args"]
            assert not ran(live, "g")
            await rescuer.send(approve_msg(CHAT, "g", True))
            result = await wait_for(rescuer, of("result", "g"))
            assert (result["outcome"], result["output"]) == ("completed", "out\n")
            assert decisions(rescuer, "g") == ["approved"]
            assert [m["type"] for m in seen(rescuer, "g")] == [
                "accepted",
                "approval",
                "approval_resolved",
                "started",
                "output",
                "result",
            ]
        async with live.connect() as late:
            await late.send(message)
            got = await late.recv_until(of("result", "g"))
            assert [m["type"] for m in got] == ["accepted", "result"]
            assert (got[0]["replay"], got[0]["state"]) == (True, "done")
            assert json.dumps(result_fields(got[1])) == json.dumps(result_fields(result))
        assert ran_once(live, "g")


# --- cancel, interrupt and expiry of parked gates -------------------------------------------------


async def test_cancel_closes_a_parked_gate(live: LiveServer) -> None:
    with trio.fail_after(DEADLINE_S):
        async with live.connect() as caller, live.connect() as watcher:
            await caller.send(marked_execute(CHAT, "g", approval=True))
            await wait_for(caller, of("approval", "g"))
            await watcher.send({"type": "attach", "chat_id": CHAT, "call_id": "g"})
            await wait_for(watcher, of("approval", "g"))
            await caller.send({"type": "cancel", "rid": "k", "chat_id": CHAT, "call_ids": ["g"]})
            reply = await wait_for(caller, of("cancel_result", "g"))
            assert (reply["received"], reply["rid"]) == (True, "k")
            assert (reply["result"]["outcome"], reply["result"]["text"]) == (
                "not_run",
                NOT_RUN_TEXT,
            )
            assert reply["result"]["canceled"] is True and reply["result"]["started_at"] is None
            for conn in (caller, watcher):
                result = await wait_for(conn, of("result", "g"))
                assert (result["outcome"], result["text"]) == ("not_run", NOT_RUN_TEXT)
                await barrier(conn)
                assert decisions(conn, "g") == ["canceled"]
                assert index(conn, of("approval_resolved", "g")) < index(conn, of("result", "g"))
            assert await approve_expecting_error(watcher, CHAT, "g") == "not_parked"
            assert not ran(live, "g")
            # A retry gets the saved not_run result; nothing runs.
            await caller.send(marked_execute(CHAT, "g", approval=True))
            got = await caller.recv_until(of("result", "g"))
            assert [m["type"] for m in got] == ["accepted", "result"]
            assert got[1]["outcome"] == "not_run"
            assert not ran(live, "g")


async def test_interrupt_resolves_every_parked_gate_truthfully(live: LiveServer) -> None:
    other = "chat-b"
    with trio.fail_after(DEADLINE_S):
        async with live.connect() as conn, live.connect() as judge:
            await conn.send(marked_execute(CHAT, "p1", approval=True))
            await conn.send(marked_write(CHAT, "p2", approval=True))
            await conn.send(marked_execute(other, "q", approval=True))
            calls = [
                {"call_id": "t1", "tool": "execute", "approval": True,
                 "args": {"command": f"echo ran >> {marker('t1')}"}},
                {"call_id": "t2", "tool": "write_file", "approval": True,
                 "args": {"path": marker("t2"), "content": "ran\n"}},
                {"call_id": "t3", "tool": "execute",
                 "args": {"command": f"echo ran >> {marker('t3')}"}},
            ]  # fmt: skip
            await conn.send({"type": "turn", "chat_id": CHAT, "turn_id": "T", "calls": calls})
            plan = await wait_for(conn, lambda m: m["type"] == "turn_plan")
            assert plan["segments"] == [["t1"], ["t2"], ["t3"]]
            # A second turn with two gates parked in one segment and a call queued after them.
            calls2 = [
                {"call_id": "u1", "tool": "write_file", "approval": True,
                 "args": {"path": marker("u1"), "content": "ran\n"}},
                {"call_id": "u2", "tool": "write_file", "approval": True,
                 "args": {"path": marker("u2"), "content": "ran\n"}},
                {"call_id": "u3", "tool": "execute",
                 "args": {"command": f"echo ran >> {marker('u3')}"}},
            ]  # fmt: skip
            await conn.send({"type": "turn", "chat_id": CHAT, "turn_id": "U", "calls": calls2})
            for call_id in ("p1", "p2", "t1", "u1", "u2"):
                await wait_for(conn, of("approval", call_id))
            await wait_for(conn, of("approval", "q", other))
            assert (await wait_for(conn, of("approval", "t1")))["turn_id"] == "T"

            # Interrupting the turn ends only its calls: its gate, its queued calls.
            await conn.send({"type": "interrupt", "rid": "i1", "chat_id": CHAT, "turn_id": "T"})
            interrupted = await wait_for(conn, with_rid("i1"))
            assert interrupted["type"] == "interrupted" and interrupted["turn_id"] == "T"
            assert sorted(interrupted["call_ids"]) == ["t1", "t2", "t3"]
            turn_result = await wait_for(conn, turn_result_of("T"))
            assert [(r["tool"], r["outcome"], r["text"]) for r in turn_result["results"]] == [
                ("execute", "not_run", NOT_RUN_TEXT),
                ("write_file", "not_run", NOT_RUN_TEXT),
                ("execute", "not_run", NOT_RUN_TEXT),
            ]
            assert index(conn, turn_result_of("T")) < index(conn, with_rid("i1"))
            assert decisions(conn, "t1") == ["canceled"]
            assert not seen(conn, "t2", "approval")  # its segment never came: no gate was raised
            for call_id in ("t1", "t2", "t3"):
                assert index(conn, of("result", call_id)) < index(conn, with_rid("i1"))
            assert await state_seen_by_new_request(live, CHAT, "p1") == "awaiting_approval"

            # Interrupting the chat ends every gate left in it, and nothing of the other chat.
            await conn.send({"type": "interrupt", "rid": "i2", "chat_id": CHAT})
            interrupted = await wait_for(conn, with_rid("i2"))
            assert sorted(interrupted["call_ids"]) == ["p1", "p2", "u1", "u2", "u3"]
            for call_id in ("p1", "p2", "u1", "u2", "u3"):
                result = await wait_for(conn, of("result", call_id))
                assert (result["outcome"], result["text"]) == ("not_run", NOT_RUN_TEXT)
                assert index(conn, of("result", call_id)) < index(conn, with_rid("i2"))
            for call_id in ("p1", "p2", "u1", "u2"):
                assert decisions(conn, call_id) == ["canceled"]
            turn_result = await wait_for(conn, turn_result_of("U"))
            assert [r["outcome"] for r in turn_result["results"]] == ["not_run"] * 3
            assert index(conn, turn_result_of("U")) < index(conn, with_rid("i2"))
            gone = ("p1", "p2", "t1", "t2", "t3", "u1", "u2", "u3")
            assert not any(ran(live, c) for c in gone)
            assert not seen(conn, "q", "approval_resolved", other)
            assert await state_seen_by_new_request(live, other, "q") == "awaiting_approval"
            await judge.send(approve_msg(other, "q", True))
            assert (await wait_for(conn, of("result", "q", other)))["outcome"] == "completed"
            assert ran_once(live, "q", other)


async def test_an_unanswered_gate_expires(make_server: MakeServer) -> None:
    # Long enough that the approval of "quick" arrives in time on a busy machine (at 0.5 s a
    # loaded CI run once expired it first), short enough for two expiries in DEADLINE_S.
    live = await make_server(approval_timeout_s=2.0)
    with trio.fail_after(DEADLINE_S):
        async with live.connect() as caller, live.connect() as watcher:
            await caller.send(marked_execute(CHAT, "quick", approval=True))
            await caller.send(marked_execute(CHAT, "late", approval=True))
            await wait_for(caller, of("approval", "quick"))
            await caller.send(approve_msg(CHAT, "quick", True))  # in time
            await watcher.send({"type": "attach", "chat_id": CHAT, "call_id": "late"})
            await wait_for(watcher, of("approval", "late"))
            assert (await wait_for(caller, of("result", "quick")))["outcome"] == "completed"
            for conn in (caller, watcher):
                result = await wait_for(conn, of("result", "late"))
                assert (result["outcome"], result["text"]) == ("not_run", EXPIRED_TEXT)
                assert result["canceled"] is False and result["started_at"] is None
                await barrier(conn)
                assert decisions(conn, "late") == ["expired"]
            assert decisions(caller, "quick") == ["approved"]
            assert ran_once(live, "quick") and not ran(live, "late")
            assert await approve_expecting_error(watcher, CHAT, "late") == "not_parked"
            # A gate in a turn expires the same way, and the next segment then runs.
            calls = [
                {"call_id": "tg", "tool": "write_file", "approval": True,
                 "args": {"path": marker("tg"), "content": "ran\n"}},
                {"call_id": "te", "tool": "execute",
                 "args": {"command": f"echo ran >> {marker('te')}"}},
            ]  # fmt: skip
            await caller.send({"type": "turn", "chat_id": CHAT, "turn_id": "T", "calls": calls})
            turn_result = await wait_for(caller, lambda m: m["type"] == "turn_result")
            assert [(r["outcome"], r["text"]) for r in turn_result["results"]] == [
                ("not_run", EXPIRED_TEXT),
                ("completed", "command exited with code 0"),
            ]
            assert decisions(caller, "tg") == ["expired"]
            assert not ran(live, "tg") and ran_once(live, "te")


async def until_seen(
    clock: trio.testing.MockClock, outbox: Outbox, seen: Callable[[list[Event]], bool]
) -> list[Event]:
    """Take events until `seen` says they hold what is waited for, then until the agent is
    idle. The writes, and a turn's paths (issue 28), run on worker threads, whose real time
    must not move the virtual clock: no autojump meanwhile (it would jump to the next deadline
    while a thread works)."""
    clock.autojump_threshold = math.inf
    try:
        events: list[Event] = []
        while not seen(events):
            await outbox.wait()
            events += outbox.take(10_000)
        await trio.testing.wait_all_tasks_blocked()
        return events + outbox.take(10_000)
    finally:
        clock.autojump_threshold = 0


async def until_written(
    clock: trio.testing.MockClock, outbox: Outbox, call_ids: set[str]
) -> list[Event]:
    """Events until each of `call_ids` has its result (`until_seen`)."""
    return await until_seen(
        clock,
        outbox,
        lambda events: call_ids <= {e.call_id for e in events if isinstance(e, ResultEvent)},
    )


async def until_planned(clock: trio.testing.MockClock, outbox: Outbox, turn_id: str) -> list[Event]:
    """Events until the turn's `turn_plan` (`until_seen`)."""
    return await until_seen(
        clock,
        outbox,
        lambda events: any(isinstance(e, TurnPlanEvent) and e.turn_id == turn_id for e in events),
    )


async def test_expiry_counts_from_the_gate_in_virtual_time(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, tmp_path: Path
) -> None:
    """In memory (no socket, no process): a gate answered just before the timeout runs, one
    left alone ends exactly at the timeout, and a turn's later gate gets its own full timeout."""
    ctx = AgentContext(workspace=str(tmp_path), approval_timeout_s=600.0)
    agent = await nursery.start(Agent(ctx).run)
    outbox = Outbox()

    def write(call_id: str) -> CallSpec:
        return CallSpec(call_id, "write_file", {"path": call_id, "content": "ran\n"}, approval=True)

    def take() -> list[Event]:
        return outbox.take(10_000)

    def resolved(events: list[Event]) -> dict[str, str]:
        return {e.call_id: e.decision for e in events if isinstance(e, ApprovalResolvedEvent)}

    def results(events: list[Event]) -> dict[str, str]:
        return {e.call_id: e.result.outcome for e in events if isinstance(e, ResultEvent)}

    start = trio.current_time()
    agent.call(outbox, "c", write("kept"), stream=True, rid=None)
    agent.call(outbox, "c", write("left"), stream=True, rid=None)
    agent.turn(
        outbox,
        "c",
        "T",
        [write("t-first"), CallSpec("t-second", "write_file", {"path": "t-first", "content": "2"},
                                    approval=True)],
        stream=True,
        rid=None,
    )  # fmt: skip
    events = await until_planned(autojump_clock, outbox, "T")
    assert [e.state for e in events if isinstance(e, AcceptedEvent)][:2] == [
        "awaiting_approval"
    ] * 2
    assert {e.call_id for e in events if isinstance(e, ApprovalEvent)} == {
        "kept",
        "left",
        "t-first",
    }

    await trio.sleep(599.0)
    await trio.testing.wait_all_tasks_blocked()
    assert take() == []  # nothing expired early
    agent.approve(outbox, "c", "kept", True, None)
    agent.approve(outbox, "c", "t-first", True, None)
    events = await until_written(autojump_clock, outbox, {"kept", "t-first"})
    assert resolved(events) == {"kept": "approved", "t-first": "approved"}
    assert results(events) == {"kept": "completed", "t-first": "completed"}
    assert [e.call_id for e in events if isinstance(e, ApprovalEvent)] == ["t-second"]
    second_parked_at = trio.current_time()

    await trio.sleep(start + 600.0 - trio.current_time() + 0.001)
    await trio.testing.wait_all_tasks_blocked()
    events = take()
    assert resolved(events) == {"left": "expired"}
    assert results(events) == {"left": "not_run"}
    assert (tmp_path / "kept").exists() and not (tmp_path / "left").exists()

    # t-second was parked only when its segment came, at 599 s: it has its own 600 s.
    await trio.sleep(second_parked_at + 599.0 - trio.current_time())
    await trio.testing.wait_all_tasks_blocked()
    assert take() == []
    await trio.sleep(1.001)
    await trio.testing.wait_all_tasks_blocked()
    events = take()
    assert resolved(events) == {"t-second": "expired"}
    assert results(events) == {"t-second": "not_run"}
    assert (tmp_path / "t-first").read_text() == "ran\n"


async def test_a_parked_gate_is_never_forgotten(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, tmp_path: Path
) -> None:
    """PROTOCOL.md 5.4 forgets only ended records: a gate left parked for hours (no
    approval_timeout_s) is still there, and answerable, after ended calls were forgotten."""
    ctx = AgentContext(workspace=str(tmp_path), limits=Limits(forget_after_s=10))
    agent = await nursery.start(Agent(ctx).run)
    outbox = Outbox()
    spec = CallSpec("g", "write_file", {"path": "g", "content": "ran\n"}, approval=True)
    agent.call(outbox, "c", spec, stream=True, rid=None)
    agent.call(outbox, "c", CallSpec("r", "read_file", {"path": "g"}), stream=True, rid=None)
    await trio.sleep(7200.0)
    agent.call(outbox, "c", CallSpec("s", "read_file", {"path": "g"}), stream=True, rid=None)
    agent.sweep()
    chat = agent.chats["c"]
    assert chat.records.get("r") is None  # ended and untouched: forgotten
    assert chat.records.get("g") is not None
    await trio.testing.wait_all_tasks_blocked()
    outbox.take(10_000)
    agent.approve(outbox, "c", "g", True, None)
    events = await until_written(autojump_clock, outbox, {"g"})
    assert [e.decision for e in events if isinstance(e, ApprovalResolvedEvent)] == ["approved"]
    assert [e.result.outcome for e in events if isinstance(e, ResultEvent)] == ["completed"]
    assert (tmp_path / "g").read_text() == "ran\n"


# --- errors ---------------------------------------------------------------------------------------


async def test_approve_of_a_call_that_is_not_parked(live: LiveServer) -> None:
    with trio.fail_after(DEADLINE_S):
        async with live.connect() as conn:
            tag = rid()
            await conn.send(approve_msg(CHAT, "never-seen", True, rid=tag))
            error = await error_for(conn, tag)
            assert error["code"] == "unknown_call"
            assert await approve_expecting_error(conn, "no-such-chat", "x") == "unknown_call"
            # Running (not gated): not_parked, and the call goes on undisturbed.
            await conn.send(call_msg(CHAT, "long", "execute", {"command": "echo up; sleep 30"}))
            await wait_for(conn, lambda m: m["type"] == "output" and "up" in m["data"])
            assert await approve_expecting_error(conn, CHAT, "long") == "not_parked"
            assert await approve_expecting_error(conn, CHAT, "long", False) == "not_parked"
            # Done: not_parked, and the saved result stays as it is.
            await conn.send(call_msg(CHAT, "done", "execute", {"command": "echo hi"}))
            done = await wait_for(conn, of("result", "done"))
            assert await approve_expecting_error(conn, CHAT, "done", False) == "not_parked"
            await conn.send(call_msg(CHAT, "done", "execute", {"command": "echo hi"}))
            again = (await conn.recv_until(of("result", "done")))[-1]
            assert json.dumps(result_fields(again)) == json.dumps(result_fields(done))
            # A cancel tombstone is a record that is done: not_parked too.
            await conn.send({"type": "cancel", "chat_id": CHAT, "call_ids": ["tomb"]})
            await wait_for(conn, of("cancel_result", "tomb"))
            assert await approve_expecting_error(conn, CHAT, "tomb") == "not_parked"
            await barrier(conn)
            assert not [m for m in conn.seen if m["type"] == "approval_resolved"]
            await conn.send({"type": "cancel", "chat_id": CHAT, "call_ids": ["long"]})
            await wait_for(conn, of("cancel_result", "long"))


async def test_a_gate_answered_but_not_started_yet_cannot_be_answered_again(
    live: LiveServer,
) -> None:
    """A turn runs at most 8 calls of a segment at once: 8 blocking process_output waits hold
    every slot, so the approved 9th call waits for a slot (deterministically) after its gate
    was answered."""
    (live.workspace / "notes.txt").write_text("n\n")
    with trio.fail_after(DEADLINE_S):
        async with live.connect() as conn:
            await conn.send(
                call_msg(CHAT, "bg", "execute", {"command": "sleep 30"}, background=True)
            )
            await wait_for(conn, of("result", "bg"))
            calls: list[Message] = [
                {
                    "call_id": f"w{i}",
                    "tool": "process_output",
                    "args": {"process_id": "bg", "wait": True, "wait_ms": 20_000},
                }
                for i in range(8)
            ]
            calls.append(
                {
                    "call_id": "g",
                    "tool": "read_file",
                    "args": {"path": "notes.txt"},
                    "approval": True,
                }
            )
            await conn.send({"type": "turn", "chat_id": CHAT, "turn_id": "T", "calls": calls})
            await wait_for(conn, of("approval", "g"))
            try:
                await conn.send(approve_msg(CHAT, "g", True))
                await wait_for(conn, of("approval_resolved", "g"))
                tag = rid()
                await conn.send(approve_msg(CHAT, "g", False, rid=tag))
                answer = await conn.recv_until(
                    lambda m: m.get("rid") == tag or of("result", "g")(m)
                )
                assert answer[-1]["type"] == "error" and answer[-1]["code"] == "not_parked"
                # The call is approved and waits for its slot; a new request says so.
                assert await state_seen_by_new_request(live, CHAT, "g") == "running"
            finally:
                await conn.send({"type": "interrupt", "rid": "stop", "chat_id": CHAT})
                await wait_for(conn, with_rid("stop"))
            result = await wait_for(conn, of("result", "g"))
            assert result["outcome"] != "denied"


# --- turns ----------------------------------------------------------------------------------------


async def test_a_gate_in_a_turn_holds_only_its_own_call(live: LiveServer) -> None:
    (live.workspace / "b.txt").write_text("bee\n")
    calls: list[Message] = [
        {"call_id": "g1", "tool": "write_file", "approval": True,
         "args": {"path": "a.txt", "content": "from g1\n"}},
        {"call_id": "r", "tool": "read_file", "args": {"path": "b.txt"}},
        {"call_id": "w", "tool": "write_file", "args": {"path": "c.txt", "content": "c\n"}},
        {"call_id": "e", "tool": "execute",
         "args": {"command": f"echo ran >> {marker('e')}; cat a.txt"}},
        {"call_id": "g2", "tool": "write_file", "approval": True,
         "args": {"path": "a.txt", "content": "from g2\n"}},
    ]  # fmt: skip
    turn = {"type": "turn", "chat_id": CHAT, "turn_id": "T", "calls": calls}
    with trio.fail_after(DEADLINE_S):
        async with live.connect() as conn, live.connect() as quiet:
            await conn.send(turn | {"rid": "t"})
            plan = await wait_for(conn, lambda m: m["type"] == "turn_plan")
            assert plan["segments"] == [["g1", "r", "w"], ["e"], ["g2"]]
            approval = await wait_for(conn, of("approval", "g1"))
            assert approval["turn_id"] == "T" and approval["tool"] == "write_file"
            assert approval["args"] == calls[0]["args"]
            # The rest of g1's segment runs while g1 is parked ...
            assert (await wait_for(conn, of("result", "r")))["data"]["content"] == "bee\n"
            assert (await wait_for(conn, of("result", "w")))["outcome"] == "completed"
            assert (live.workspace / "c.txt").read_text() == "c\n"
            # ... and the next segment waits for it.
            await barrier(conn)
            assert not (live.workspace / "a.txt").exists() and not ran(live, "e")
            assert [m["type"] for m in seen(conn, "e")] == ["accepted"]
            assert [m["type"] for m in seen(conn, "g2")] == ["accepted"]
            assert (await wait_for(conn, of("accepted", "g2")))["state"] == "running"
            # g2's segment has not come: its gate is not raised, so it cannot be answered yet.
            assert await approve_expecting_error(conn, CHAT, "g2", False) == "not_parked"

            # A follower of the turn without streaming gets only the plan, the gates and the
            # turn_result (PROTOCOL.md 5.0).
            await quiet.send(turn | {"stream": False})
            assert (await wait_for(quiet, of("approval", "g1")))["turn_id"] == "T"

            await quiet.send(approve_msg(CHAT, "g1", True))
            e_result = await wait_for(conn, of("result", "e"))
            assert e_result["output"] == "from g1\n"
            assert index(conn, of("approval_resolved", "g1")) < index(conn, of("started", "e"))
            assert index(conn, of("result", "g1")) < index(conn, of("started", "e"))
            approval2 = await wait_for(conn, of("approval", "g2"))
            assert approval2["turn_id"] == "T"
            assert index(conn, of("result", "e")) < index(conn, of("approval", "g2"))
            await wait_for(quiet, of("approval", "g2"))
            await conn.send(approve_msg(CHAT, "g2", False))
            turn_result = await wait_for(conn, lambda m: m["type"] == "turn_result")
            assert [(r["tool"], r["outcome"]) for r in turn_result["results"]] == [
                ("write_file", "completed"),
                ("read_file", "completed"),
                ("write_file", "completed"),
                ("execute", "completed"),
                ("write_file", "denied"),
            ]
            assert turn_result["results"][4]["text"] == DENIED_TEXT
            assert (live.workspace / "a.txt").read_text() == "from g1\n"
            assert ran_once(live, "e")
            results = [m for m in conn.seen if m["type"] == "result"]
            ended = [m["call_id"] for m in results]  # r and w run concurrently: either first
            assert sorted(ended[:2]) == ["r", "w"] and ended[2:] == ["g1", "e", "g2"]
            assert index(conn, lambda m: m["type"] == "turn_result") == len(conn.seen) - 1

            quiet_turn = await wait_for(quiet, lambda m: m["type"] == "turn_result")
            assert quiet_turn["results"] == turn_result["results"]
            assert [(m["type"], m.get("call_id")) for m in quiet.seen[1:]] == [
                ("turn_plan", None),
                ("approval", "g1"),
                ("approval_resolved", "g1"),
                ("approval", "g2"),
                ("approval_resolved", "g2"),
                ("turn_result", None),
            ]
            assert [m["decision"] for m in quiet.seen if m["type"] == "approval_resolved"] == [
                "approved",
                "denied",
            ]


# --- the typed client -----------------------------------------------------------------------------


async def test_the_client_streams_approvals_and_answers_them(live: LiveServer) -> None:
    from toolwire.transport.client import RequestError, connect

    with trio.fail_after(DEADLINE_S):
        async with connect(live.url, TOKEN) as caller, connect(live.url, TOKEN) as judge:
            approvals = caller.approvals()
            first = await caller.call(
                CHAT, "c1", "execute", {"command": f"echo ran >> {marker('c1')}"}, approval=True
            )
            second = await caller.call(
                CHAT, "c2", "execute", {"command": f"echo ran >> {marker('c2')}"}, approval=True
            )
            assert first.accepted.state == second.accepted.state == "awaiting_approval"
            gates = [await approvals.__anext__(), await approvals.__anext__()]
            assert [(g.chat_id, g.call_id, g.tool) for g in gates] == [
                (CHAT, "c1", "execute"),
                (CHAT, "c2", "execute"),
            ]
            # Answered out of order, from a client that does not follow the calls.
            assert (await judge.approve(CHAT, "c2", True)).decision == "approved"
            assert (await second.result()).outcome == "completed"
            assert ran_once(live, "c2") and not ran(live, "c1")
            assert (await caller.approve(CHAT, "c1", False, reason="no")).decision == "denied"
            denied = await first.result()
            assert (denied.outcome, denied.text) == ("denied", denied_because("no"))
            assert not ran(live, "c1")
            with pytest.raises(RequestError) as again:
                await judge.approve(CHAT, "c1", True)
            assert again.value.code == "not_parked"


# --- the CLI --------------------------------------------------------------------------------------


def _capture_serve(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Make `toolwire serve` record its options instead of serving."""
    from toolwire.cli import logs, serve

    captured: list[Any] = []

    async def fake_serve(options: Any) -> None:
        captured.append(options)

    monkeypatch.setattr(serve, "serve", fake_serve)
    monkeypatch.setattr(logs, "setup_logging", lambda *_args: None)
    return captured


def test_serve_reads_the_policy_from_the_command_line(monkeypatch: pytest.MonkeyPatch) -> None:
    from toolwire.cli.main import main

    captured = _capture_serve(monkeypatch)
    argv = ["serve", "--approve", "execute, write_file,", "--approval-timeout-s", "2.5"]
    assert main(argv) == 0
    (options,) = captured
    assert options.approve == frozenset({"execute", "write_file"})
    assert options.approval_timeout_s == 2.5
    assert main(["serve"]) == 0
    assert captured[1].approve == frozenset() and captured[1].approval_timeout_s is None


def test_serve_rejects_unknown_tools_in_the_policy(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from toolwire.cli.main import main

    captured = _capture_serve(monkeypatch)
    assert main(["serve", "--approve", "execute,rm_rf"]) == 2
    assert "rm_rf" in capsys.readouterr().err
    assert captured == []


def test_serve_rejects_a_negative_approval_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    from toolwire.cli.main import main

    captured = _capture_serve(monkeypatch)
    assert main(["serve", "--approval-timeout-s", "-1"]) == 2
    assert captured == []


async def test_toolwire_serve_gates_the_tools_named_by_approve(tmp_path: Path) -> None:
    """The real `toolwire serve --approve execute` process."""
    from tests.test_serve import serve
    from tests.wsclient import connect

    env = {"TOOLWIRE_TOKEN": APPROVE_TOKEN}
    async with serve(tmp_path, "--approve", "execute", env=env) as server:
        with trio.fail_after(DEADLINE_S):
            async with connect(server.url, APPROVE_TOKEN) as conn:
                await conn.send(marked_execute(CHAT, "e"))
                assert (await wait_for(conn, of("accepted", "e")))["state"] == "awaiting_approval"
                assert (await wait_for(conn, of("approval", "e")))["tool"] == "execute"
                await conn.send(marked_write(CHAT, "w"))
                assert (await wait_for(conn, of("result", "w")))["outcome"] == "completed"
                assert not seen(conn, "w", "approval")
                await conn.send(approve_msg(CHAT, "e", False))
                assert (await wait_for(conn, of("result", "e")))["outcome"] == "denied"
        assert not (tmp_path / "ws" / marker("e")).exists()
        assert (tmp_path / "ws" / marker("w")).exists()
        server.process.terminate()
        assert await server.process.wait() == 0
