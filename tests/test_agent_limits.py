"""The bounds of one request and of the whole agent, through a real server (issue 27, defects 2
and 5): ids per request, records held in memory, processes running and bytes of messages being
received, over all chats and connections. Each is reported in `welcome.limits` and `/metrics`,
and enforced by an `over_limit` that names it (or, for message bytes, by back-pressure), never
by the agent dying: every other chat goes on, and so does the agent once room is made.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import trio
from wsproto.events import TextMessage

from tests.conftest import TOKEN, LiveServer, MakeServer
from tests.test_http_status import port_of, scrape, value
from tests.wsclient import FrameConn, RawConn, of, wait_for
from toolwire.actors.agent import Limits

TEST_DEADLINE_S = 30


def _read(chat_id: str, call_id: str, path: str = "f.txt") -> dict[str, Any]:
    return {
        "type": "call",
        "chat_id": chat_id,
        "call_id": call_id,
        "tool": "read_file",
        "args": {"path": path},
    }


async def _error(conn: RawConn, message: dict[str, Any]) -> dict[str, Any]:
    rid = f"rid-{len(conn.seen)}"
    await conn.send(message | {"rid": rid})
    got = await conn.recv_until(lambda m: m.get("rid") == rid)
    assert got[-1]["type"] == "error", got[-1]
    return got[-1]


def _held_records(live: LiveServer) -> int:
    return sum(len(chat.records) for chat in live.agent.chats.values())


async def test_a_request_naming_more_ids_than_max_ids_per_request_is_refused(
    make_server: MakeServer,
) -> None:
    server = await make_server(limits=Limits(max_ids_per_request=50))
    with trio.fail_after(TEST_DEADLINE_S):
        async with server.connect() as conn:
            assert conn.welcome["limits"]["max_ids_per_request"] == 50
            ids = [f"id-{i}" for i in range(51)]
            error = await _error(conn, {"type": "cancel", "chat_id": "t", "call_ids": ids})
            assert error["code"] == "over_limit"
            assert "max_ids_per_request" in error["message"] and "51" in error["message"]
            specs = [{"call_id": i, "tool": "read_file", "args": {"path": "f"}} for i in ids]
            error = await _error(
                conn, {"type": "turn", "chat_id": "t", "turn_id": "big", "calls": specs}
            )
            assert error["code"] == "over_limit" and "max_ids_per_request" in error["message"]
            assert _held_records(server) == 0  # refused: nothing changed
            # At the limit, a cancel is answered id by id, and the chat goes on.
            await conn.send({"type": "cancel", "chat_id": "t", "call_ids": ids[:50]})
            await wait_for(conn, of("cancel_result", "id-49"))
            results = [m for m in conn.seen if m["type"] == "cancel_result"]
            assert [m["call_id"] for m in results] == ids[:50]
            (server.workspace / "f.txt").write_text("x\n")
            read = await conn.call("t", "after", "read_file", {"path": "f.txt"})
            assert read["outcome"] == "completed"


async def test_max_records_refuses_new_records_keeps_old_ones_and_recovers(
    make_server: MakeServer,
) -> None:
    server = await make_server(limits=Limits(max_records=4, forget_after_s=0))
    (server.workspace / "f.txt").write_text("hello\n")
    with trio.fail_after(TEST_DEADLINE_S):
        async with server.connect() as conn:
            assert conn.welcome["limits"]["max_records"] == 4
            # Four records in four chats (each alone in its chat: with forget_after_s=0 a new
            # call in a chat forgets the chat's older records): the limit is the agent's.
            for chat_id, call_id in (("a", "a1"), ("b", "b1"), ("c", "c1"), ("e", "e1")):
                assert (await conn.call(chat_id, call_id, "read_file", {"path": "f.txt"}))[
                    "outcome"
                ] == "completed"
            samples = await scrape(port_of(server.url))
            assert value(samples, "toolwire_records") == 4
            assert value(samples, "toolwire_records_limit") == 4
            # A new call in a new chat, a cancel of an unknown id (it would store a tombstone)
            # and a turn of a new call: each refused, naming the limit, and nothing is stored.
            for message in (
                _read("d", "d1"),
                {"type": "cancel", "chat_id": "a", "call_ids": ["never-seen"]},
                {
                    "type": "turn",
                    "chat_id": "b",
                    "turn_id": "t1",
                    "calls": [{"call_id": "t1-1", "tool": "read_file", "args": {"path": "f"}}],
                },
            ):
                error = await _error(conn, message)
                assert error["code"] == "over_limit", error
                assert "max_records" in error["message"] and "4" in error["message"]
            assert _held_records(server) == 4
            assert server.agent.ctx.budget.records == 4
            # What is held stays answerable: a repeat gets its saved result (at most once), an
            # attach and a cancel of a held call too.
            repeat = await conn.call("a", "a1", "read_file", {"path": "f.txt"})
            assert repeat["outcome"] == "completed" and repeat["data"]["content"] == "hello\n"
            replays = [m for m in conn.seen if m["type"] == "accepted" and m["call_id"] == "a1"]
            assert replays[-1]["replay"] is True
            await conn.send({"type": "cancel", "chat_id": "b", "call_ids": ["b1"]})
            cancel = await wait_for(conn, of("cancel_result", "b1"))
            assert cancel["received"] is True and cancel["result"]["outcome"] == "completed"
            # Once old records are forgotten (5.4), new calls are taken again.
            await trio.sleep(0.01)  # forget_after_s=0: anything older than now goes
            server.agent.sweep()
            assert server.agent.ctx.budget.records == _held_records(server) == 0
            again = await conn.call("d", "d1", "read_file", {"path": "f.txt"})
            assert again["outcome"] == "completed"
            assert server.agent.ctx.budget.records == 1


async def test_max_processes_bounds_processes_over_all_chats(make_server: MakeServer) -> None:
    server = await make_server(limits=Limits(max_processes=2))
    (server.workspace / "f.txt").write_text("x\n")
    with trio.fail_after(TEST_DEADLINE_S):
        async with server.connect() as conn:
            assert conn.welcome["limits"]["max_processes"] == 2
            assert conn.welcome["limits"]["max_processes_per_chat"] == 64
            for chat_id in ("a", "b"):
                await conn.send(
                    {
                        "type": "call",
                        "chat_id": chat_id,
                        "call_id": f"{chat_id}-sleep",
                        "tool": "execute",
                        "args": {"command": "sleep 30"},
                    }
                )
                await wait_for(conn, of("started", f"{chat_id}-sleep", chat_id))
            error = await _error(
                conn,
                {
                    "type": "call",
                    "chat_id": "c",
                    "call_id": "c-echo",
                    "tool": "execute",
                    "args": {"command": "echo hi"},
                },
            )
            assert error["code"] == "over_limit"
            assert "max_processes" in error["message"] and "2" in error["message"]
            samples = await scrape(port_of(server.url))
            assert value(samples, "toolwire_processes_running") == 2
            assert value(samples, "toolwire_processes_limit") == 2
            # Every other tool goes on in every chat.
            read = await conn.call("c", "c-read", "read_file", {"path": "f.txt"})
            assert read["outcome"] == "completed"
            # Stopping one frees a slot: the refused id was never stored, so it runs now.
            await conn.send({"type": "cancel", "chat_id": "a", "call_ids": ["a-sleep"]})
            await wait_for(conn, of("cancel_result", "a-sleep"))
            echo = await conn.call("c", "c-echo", "execute", {"command": "echo hi"})
            assert echo["outcome"] == "completed" and echo["output"] == "hi\n"
            await conn.send({"type": "cancel", "chat_id": "b", "call_ids": ["b-sleep"]})
            await wait_for(conn, of("cancel_result", "b-sleep"))
    assert server.agent.ctx.budget.processes == 0


async def _partial(conn: FrameConn, text: str) -> None:
    """The first piece of a text message: the rest comes later."""
    await conn.stream.send_all(conn.ws.send(TextMessage(data=text, message_finished=False)))


async def _finish(conn: FrameConn, text: str) -> None:
    await conn.stream.send_all(conn.ws.send(TextMessage(data=text, message_finished=True)))


async def _wait_until(condition: Any) -> None:
    # Inside the agent, with no message to show it and no event to await: polled.
    while not condition():  # noqa: ASYNC110
        await trio.sleep(0.005)


async def test_message_bytes_in_flight_make_readers_wait_without_stopping_anyone(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    """Three clients each send the first piece of a large message. The first (oldest) and
    the second fit; the third would leave no room for the oldest to finish, so its reader
    waits before reading on. A fourth client's small call is answered meanwhile; once the
    first message is whole, the third goes on and gets its answer."""
    from tests.conftest import start_server

    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "f.txt").write_text("x\n")
    limits = Limits(max_message_bytes=40_000, max_message_bytes_in_flight=60_000)
    server = await start_server(nursery, workspace, limits=limits)
    port = port_of(server.url)
    gate = server.server.message_bytes
    with trio.fail_after(TEST_DEADLINE_S):
        first, second, third = [await FrameConn.open(port, TOKEN) for _ in range(3)]
        for conn in (first, second, third):
            await conn.receive_messages(1)  # welcome
            assert b"max_message_bytes_in_flight" in str(conn.messages[0]).encode()
        pad = "x" * 15_000

        def head(call_id: str) -> str:
            return (
                '{"type":"call","chat_id":"big","call_id":"'
                + call_id
                + '","tool":"read_file","args":{"path":"f.txt"},"pad":"'
            )

        await _partial(first, head("first") + pad)
        await _wait_until(lambda: gate.held > 15_000)
        await _partial(second, head("second") + pad)
        await _wait_until(lambda: gate.held > 30_000)
        # 15 KB held by others + 15 KB more + room for one whole 40 KB message > 60 KB.
        await _partial(third, head("third") + pad)
        await _finish(third, '"}')
        await _wait_until(lambda: gate.waits == 1)
        samples = await scrape(port)
        assert value(samples, "toolwire_message_bytes_in_flight_limit") == 60_000
        assert value(samples, "toolwire_message_bytes_in_flight") == gate.held > 30_000
        # Another client is not held up: a message that arrives whole never waits.
        async with server.connect() as other:
            read = await other.call("small", "s1", "read_file", {"path": "f.txt"})
            assert read["outcome"] == "completed"
        assert third.messages == [third.messages[0]]  # still nothing but its welcome
        await _finish(first, '"}')
        await first.receive_messages(3)  # welcome, accepted, result
        await third.receive_messages(3)
        assert b'"result"' in str(third.messages[-1]).encode()
        await _finish(second, '"}')
        await second.receive_messages(3)
        await _wait_until(lambda: gate.held == 0)
        for conn in (first, second, third):
            await conn.aclose()
    await server.server.shutdown()


async def test_a_connection_that_drops_mid_message_frees_its_bytes(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    from tests.conftest import start_server

    workspace = tmp_path / "ws"
    workspace.mkdir()
    limits = Limits(max_message_bytes=40_000, max_message_bytes_in_flight=40_000)
    server = await start_server(nursery, workspace, limits=limits)
    gate = server.server.message_bytes
    with trio.fail_after(TEST_DEADLINE_S):
        conn = await FrameConn.open(port_of(server.url), TOKEN)
        await conn.receive_messages(1)
        await _partial(conn, '{"type":"cancel","chat_id":"c","call_ids":["' + "y" * 20_000)
        await _wait_until(lambda: gate.held > 0)
        await conn.aclose()
        await _wait_until(lambda: gate.held == 0)
        # With the only room free again, a message in pieces goes through.
        second = await FrameConn.open(port_of(server.url), TOKEN)
        await second.receive_messages(1)
        await _partial(second, '{"type":"cancel","chat_id":"c",')
        await _finish(second, '"call_ids":["z"]}')
        await second.receive_messages(2)
        assert b"cancel_result" in str(second.messages[-1]).encode()
        await second.aclose()
    await server.server.shutdown()


def test_serve_refuses_a_limit_it_cannot_keep(capsys: Any) -> None:
    from toolwire.cli.main import main

    assert main(["serve", "--max-records", "0"]) == 2
    assert "max_records must be an integer >= 1" in capsys.readouterr().err
    # The message that began first always goes on, so the limit must hold one whole message.
    assert main(["serve", "--max-message-bytes-in-flight", "1000"]) == 2
    err = capsys.readouterr().err
    assert "max_message_bytes_in_flight (1000)" in err and "max_message_bytes" in err
