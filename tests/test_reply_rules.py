"""PROTOCOL.md 9.9 through a real server and the independent raw client: ids hold printable
characters only, one reply per request whatever follows it, replays in request order, output
cursors that never skip what is owed, truthful ends for failures inside the agent, and the
last incomplete UTF-8 character of a command's output."""

from __future__ import annotations

from typing import Any

import pytest

from tests.conftest import LiveServer

Message = dict[str, Any]

# Each is refused by str.isprintable(): a trailing newline (a regex `$` let it through), a line
# separator, a zero-width space (a format character), a carriage return, a NEL.
UNPRINTABLE_IDS = ["x\n", "x\u2028", "x\u200b", "\rx", "x\x85y"]


@pytest.mark.parametrize("encoding", ["json", "msgpack"])
async def test_ids_that_are_not_printable_are_refused_and_change_nothing(
    live: LiveServer, encoding: str
) -> None:
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
                ({"type": "attach", "chat_id": "c", "call_id": bad}, "bad_message", "$.call_id"),
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
