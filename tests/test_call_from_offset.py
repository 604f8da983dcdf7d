"""`call.from_offset` (PROTOCOL.md 10.2) on a real agent: a chat server that restarted re-sends
its `call` with the offset it had shown, and gets the output from there (the trap of issue 30:
without it the resumed run got the output again from 0, and showed it twice)."""

from __future__ import annotations

import pytest
import trio

from tests import wsclient
from tests.clientshells import SHELLS, Shell
from tests.conftest import LiveServer
from tests.wsclient import is_result, messages, of, wait_for
from toolwire.transport.protocol import Output

CHAT = "chat-offset"
TEST_DEADLINE_S = 20.0
# Prints ten bytes, then waits for one line on its stdin (sent with process_input), so the test
# decides when it ends; the fixture's shutdown stops it if a test fails first.
HELD = {"command": "printf 0123456789; read x; printf done", "stdin": True}


async def release(conn: wsclient.RawConn, call_id: str) -> None:
    args = {"process_id": call_id, "data": "\n"}
    reply = await conn.call(CHAT, f"release-{call_id}", "process_input", args)
    assert reply["outcome"] == "completed", reply


async def test_the_welcome_names_the_feature(live: LiveServer) -> None:
    with trio.fail_after(TEST_DEADLINE_S):
        async with live.connect() as conn:
            assert "call_from_offset" in conn.welcome["features"]


@pytest.mark.parametrize("encoding", ["json", "msgpack"])
async def test_a_resumed_call_streams_from_its_offset(live: LiveServer, encoding: str) -> None:
    with trio.fail_after(TEST_DEADLINE_S):
        async with live.connect(encoding=encoding) as first:
            await first.send(
                {
                    "type": "call",
                    "chat_id": CHAT,
                    "call_id": "held",
                    "tool": "execute",
                    "args": HELD,
                }
            )
            await wait_for(first, lambda m: m["type"] == "output" and "9" in m["data"])
        # The chat server "crashed" having shown 4 bytes; its successor re-sends the call.
        async with live.connect(encoding=encoding) as resumed:
            await resumed.send(
                {
                    "type": "call",
                    "chat_id": CHAT,
                    "call_id": "held",
                    "tool": "execute",
                    "args": HELD,
                    "from_offset": 4,
                }
            )
            accepted = await wait_for(resumed, of("accepted", "held"))
            assert (accepted["replay"], accepted["state"]) == (True, "running")
            await wait_for(resumed, lambda m: m["type"] == "output" and "9" in m["data"])
            await release(resumed, "held")
            result = await wait_for(resumed, is_result("held"))
    outputs = messages(resumed, "held", "output")
    assert outputs[0]["offset"] == 4, outputs
    assert "".join(m["data"] for m in outputs) == "456789done"
    # The result is the call's own, whatever offset this request asked for.
    assert (result["output"], result["output_bytes"]) == ("0123456789done", 14)


async def test_an_ended_call_gets_its_result_only_whatever_the_offset(live: LiveServer) -> None:
    with trio.fail_after(TEST_DEADLINE_S):
        async with live.connect() as conn:
            first = await conn.call(CHAT, "ended", "execute", {"command": "printf 0123456789"})
            start = len(conn.seen)
            again = await conn.call(
                CHAT, "ended", "execute", {"command": "printf 0123456789"}, from_offset=3
            )
    assert [m["type"] for m in conn.seen[start:]] == ["accepted", "result"]
    assert again == first


async def test_a_new_call_starts_its_output_at_the_offset(live: LiveServer) -> None:
    """Uniform with a running call (docs/protocol.md): the request's output starts there."""
    with trio.fail_after(TEST_DEADLINE_S):
        async with live.connect() as conn:
            await conn.send(
                {
                    "type": "call",
                    "chat_id": CHAT,
                    "call_id": "fresh",
                    "tool": "execute",
                    "args": HELD,
                    "from_offset": 6,
                }
            )
            await wait_for(conn, of("accepted", "fresh"))
            await release(conn, "fresh")
            result = await wait_for(conn, is_result("fresh"))
    outputs = messages(conn, "fresh", "output")
    assert outputs and outputs[0]["offset"] >= 6, outputs
    assert "".join(m["data"] for m in outputs) == "6789done"
    assert result["output"] == "0123456789done"


async def test_the_offset_is_not_part_of_what_the_call_id_stands_for(live: LiveServer) -> None:
    with trio.fail_after(TEST_DEADLINE_S):
        async with live.connect() as conn:
            await conn.call(CHAT, "same", "execute", {"command": "true"})
            again = await conn.call(CHAT, "same", "execute", {"command": "true"}, from_offset=9)
    assert again["type"] == "result"


@pytest.mark.parametrize("bad", [-1, "4", 4.5, True, 2**64])
async def test_a_bad_offset_is_bad_message_naming_it(live: LiveServer, bad: object) -> None:
    with trio.fail_after(TEST_DEADLINE_S):
        async with live.connect() as conn:
            reply = await conn.call(CHAT, "bad", "execute", {"command": "true"}, from_offset=bad)
            # Nothing was recorded: the id is still free.
            fresh = await conn.call(CHAT, "bad", "execute", {"command": "echo ran"})
    assert (reply["type"], reply["code"]) == ("error", "bad_message"), reply
    assert "$.from_offset" in reply["message"]
    assert (fresh["outcome"], fresh["output"]) == ("completed", "ran\n")


@pytest.fixture(params=sorted(SHELLS))
def shell(request: pytest.FixtureRequest) -> Shell:
    return SHELLS[request.param]()


async def test_both_clients_resume_a_call_from_a_saved_offset(
    shell: Shell, live: LiveServer
) -> None:
    async def body() -> None:
        async with shell.connect(live.url, live.token) as before:
            handle = await before.call(CHAT, "kept", "execute", HELD)
            shown = ""
            async for event in handle:
                shown += getattr(event, "data", "")
                if "9" in shown:
                    break
            saved = handle.offset
        assert saved == 10
        async with shell.connect(live.url, live.token) as after:
            handle = await after.call(CHAT, "kept", "execute", HELD, from_offset=saved)
            await after.call(CHAT, "let-go", "process_input", {"process_id": "kept", "data": "\n"})
            offsets = [event.offset async for event in handle if isinstance(event, Output)]
            result = await handle.result()
        assert offsets and offsets[0] >= saved
        assert shown + handle.output_text() == "0123456789done"
        assert result.output == "0123456789done"

    await shell.run(body)


async def test_a_resumed_turn_shows_each_call_from_its_saved_offset(
    shell: Shell, live: LiveServer
) -> None:
    """A turn's call specs carry no offset on the wire; the client's handle drops the bytes
    before the saved offset (docs/protocol.md)."""

    async def body() -> None:
        spec = {"call_id": "t1", "tool": "execute", "args": {"command": "printf 0123456789"}}
        async with shell.connect(live.url, live.token) as client:
            turn = await client.turn(CHAT, "turn-1", [spec], from_offsets={"t1": 4})
            handle = turn.calls["t1"]
            chunks = [event async for event in handle if isinstance(event, Output)]
            (result,) = await turn.results()
        assert chunks and chunks[0].offset == 4
        assert handle.output_text() == "456789"
        assert result.output == "0123456789"

    await shell.run(body)
