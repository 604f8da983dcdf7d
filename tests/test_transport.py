"""The WebSocket server as an independent client sees it (PROTOCOL.md sections 1, 4, 6)."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import msgspec
import pytest
import trio
import trio.testing
from trio_websocket import ConnectionClosed, ConnectionRejected, open_websocket_url

from tests.conftest import TOKEN, LiveServer, start_server
from tests.wsclient import FrameConn, connect, is_result
from toolwire.actors.agent import Limits
from toolwire.actors.sandbox import Enforcement
from toolwire.transport import server as server_module


async def _rejected(url: str, headers: list[tuple[bytes, bytes]], protos: list[str]) -> int:
    with pytest.raises(ConnectionRejected) as info:
        async with open_websocket_url(url, extra_headers=headers, subprotocols=protos):
            pass
    return info.value.status_code


AUTH = [(b"authorization", f"Bearer {TOKEN}".encode())]


async def test_handshake_rejections(live: LiveServer) -> None:
    base = live.url.rsplit("/", 1)[0]
    assert await _rejected(live.url, [], ["toolwire.v1.json"]) == 401
    wrong = [(b"authorization", b"Bearer not-the-token")]
    assert await _rejected(live.url, wrong, ["toolwire.v1.json"]) == 401
    assert await _rejected(live.url, [(b"authorization", TOKEN.encode())], []) == 401
    assert await _rejected(live.url, [(b"authorization", b"Basic " + TOKEN.encode())], []) == 401
    assert (
        await _rejected(live.url, [(b"authorization", b"Bearer " + TOKEN.encode()[:-1])], []) == 401
    )
    assert await _rejected(base + "/v2", AUTH, ["toolwire.v1.json"]) == 404
    assert await _rejected(base + "/", AUTH, []) == 404
    assert await _rejected(live.url, AUTH, ["toolwire.v2.json", "graphql-ws"]) == 400


async def test_the_auth_scheme_is_case_insensitive(live: LiveServer) -> None:
    headers = [(b"AUTHORIZATION", b"bearer " + TOKEN.encode())]
    async with open_websocket_url(live.url, extra_headers=headers) as ws:
        assert json.loads(await ws.get_message())["type"] == "welcome"


async def test_no_subprotocol_means_json_and_first_supported_offer_wins(live: LiveServer) -> None:
    async with connect(live.url, TOKEN, subprotocols=[]) as conn:
        assert conn.welcome["encoding"] == "json"
    async with connect(
        live.url, TOKEN, encoding="msgpack", subprotocols=["x-unknown", "toolwire.v1.msgpack"]
    ) as conn:
        assert conn.welcome["encoding"] == "msgpack"


async def test_welcome_carries_identity_tools_and_limits(live: LiveServer) -> None:
    async with live.connect() as first, live.connect() as second:
        welcome = first.welcome
        enforceable = Enforcement.probe().limits()
        assert welcome["protocol"] == 1
        assert welcome["agent_id"]
        uuid.UUID(welcome["boot_id"])
        assert second.welcome["boot_id"] == welcome["boot_id"]  # one agent start, one boot id
        assert welcome["tools"] == [
            "execute", "process_output", "process_signal", "process_list",
            "process_input", "process_resize",
            "read_file", "write_file", "edit_files", "search_files", "list_dir",
        ]  # fmt: skip
        assert welcome["limits"] == {
            "max_message_bytes": 16 * 1024 * 1024,
            "output_retention_bytes": 1024 * 1024,
            "result_output_bytes": 64 * 1024,
            "max_wait_ms": 300_000,
            "forget_after_s": 3600,
            "exited_retention_s": 3600,
            "max_processes_per_chat": 64,
            "kill_grace_ms": 2000,  # PROTOCOL.md 9: the grace of 5.3
            # The bounds of one request and of the whole agent (issue 27, docs/protocol.md).
            "max_ids_per_request": 1000,
            "max_records": 100_000,
            "max_processes": 256,
            "max_message_bytes_in_flight": 64 * 1024 * 1024,
            # What this kernel can enforce (PROTOCOL.md 10.4), as the agent probes it at start.
            "sandbox": enforceable,
        }
        # The 1.1 and 1.2 additions this build implements, and only those (PROTOCOL.md 9, 10).
        assert welcome["features"] == [
            "stdin",
            "pty",
            "kill_after",
            "approval_scope",
            "expected_sha256",
            "close_chat",
            "http_status",
            "call_from_offset",
            "describe_tools",
            "list_dir",
        ] + (["sandbox"] if any(enforceable.values()) else [])


async def test_welcome_reports_the_agents_kill_grace(nursery: trio.Nursery, tmp_path: Path) -> None:
    # A client learns how long a cancel, a hard deadline or a shutdown may take to stop a
    # process group: the grace the agent really gives (PROTOCOL.md 9, 5.3).
    server = await start_server(nursery, tmp_path, kill_grace_s=0.25)
    async with server.connect() as conn:
        assert conn.welcome["limits"]["kill_grace_ms"] == 250


async def test_requests_sent_before_welcome_is_read_are_accepted(live: LiveServer) -> None:
    async with open_websocket_url(live.url, extra_headers=AUTH) as ws:
        await ws.send_message(
            json.dumps({"type": "call", "chat_id": "", "call_id": "early", "tool": "process_list",
                        "args": {}, "rid": "r1"})
        )  # fmt: skip
        types = [json.loads(await ws.get_message())["type"] for _ in range(3)]
        assert types == ["welcome", "accepted", "result"]


@pytest.mark.parametrize("encoding", ["json", "msgpack"])
async def test_each_bad_input_gets_a_clear_error_and_the_connection_goes_on(
    live: LiveServer, encoding: str
) -> None:
    async with live.connect(encoding=encoding) as conn:
        enc = (lambda m: msgspec.msgpack.encode(m)) if encoding == "msgpack" else json.dumps
        cases: list[tuple[str | bytes, str, str]] = [
            (b"\xc1" if encoding == "msgpack" else "{not json", "bad_message", ""),
            (enc({"type": "call", "rid": 5, "chat_id": 3}), "bad_message", "$.chat_id"),
            (enc({"type": "teleport", "rid": 6}), "bad_message", "$.type"),
            (
                enc({"type": "call", "rid": 7, "chat_id": "c", "call_id": "u", "tool": "rm_rf",
                     "args": {}}),
                "unknown_tool",
                "rm_rf",
            ),
            (
                enc({"type": "call", "rid": 8, "chat_id": "c", "call_id": "b", "tool": "execute",
                     "args": {"command": 5}}),
                "bad_args",
                "args.command",
            ),
            (
                enc({"type": "attach", "rid": 9, "chat_id": "c", "call_id": "never"}),
                "unknown_call",
                "never",
            ),
        ]  # fmt: skip
        for frame, code, needle in cases:
            await conn.send_raw(frame)
            reply = await conn.recv()
            assert reply["type"] == "error", reply
            assert reply["code"] == code, reply
            assert needle in reply["message"], reply
        rids = [m.get("rid") for m in conn.seen[1:]]
        assert rids == [None, 5, 6, 7, 8, 9]
        # Nothing was recorded for the refused calls, and the connection still works.
        await conn.send({"type": "attach", "chat_id": "c", "call_id": "b", "rid": 10})
        assert (await conn.recv())["code"] == "unknown_call"
        result = await conn.call("c", "ok", "execute", {"command": "echo fine"})
        assert result["output"] == "fine\n"


async def test_an_oversized_message_closes_with_1009_and_has_no_effect(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    live = await start_server(nursery, tmp_path, limits=Limits(max_message_bytes=4096))
    marker = tmp_path / "marker"
    async with live.connect() as conn:
        assert conn.welcome["limits"]["max_message_bytes"] == 4096
        big = {"type": "call", "chat_id": "c", "call_id": "big", "tool": "execute",
               "args": {"command": f"touch {marker}", "pad": "é" * 3000}}  # fmt: skip
        await conn.send(big)  # 3000 chars but over 6000 bytes
        with pytest.raises(ConnectionClosed) as info:
            await conn.recv()
        assert info.value.reason.code == 1009
    async with live.connect() as conn:
        await conn.send({"type": "attach", "chat_id": "c", "call_id": "big"})
        assert (await conn.recv())["code"] == "unknown_call"
    assert not marker.exists()


async def test_a_repeated_call_gets_the_saved_result_without_a_second_run(live: LiveServer) -> None:
    marker = live.workspace / "runs"
    args = {"command": f"echo run >> {marker}; echo done"}
    async with live.connect() as a, live.connect(encoding="msgpack") as b:
        first = await a.call("c", "once", "execute", args)
        second = await b.call("c", "once", "execute", args)
        replay = [m for m in b.seen if m["type"] == "accepted"][-1]
    assert replay["replay"] is True and replay["state"] == "done" and replay["requests"] == 2
    assert first == second
    assert marker.read_text() == "run\n"


def _port(live: LiveServer) -> int:
    return int(live.url.rsplit(":", 1)[1].split("/")[0])


async def test_a_burst_in_one_write_is_answered_in_order_up_to_a_too_big_message(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    """The reader applies every message of a socket read in one go (transport/connection.py).
    A burst in one TCP write, with a bad message and a too-big one in it, gets every reply
    before the too-big message, in order, then the 1009; nothing after it runs."""
    live = await start_server(nursery, tmp_path, limits=Limits(max_message_bytes=4096))
    (tmp_path / "f.txt").write_text("hello\n")
    marker = tmp_path / "marker"

    def call(call_id: str, tool: str, args: dict[str, object], rid: int) -> str:
        message = {"type": "call", "chat_id": "c", "call_id": call_id, "tool": tool,
                   "args": args, "stream": False, "rid": rid}  # fmt: skip
        return json.dumps(message, ensure_ascii=False)

    read = {"path": "f.txt"}
    too_big = call("big", "execute", {"command": f"touch {marker}", "pad": "é" * 3000}, 7)
    assert len(too_big) < 4096 < len(too_big.encode())  # over the limit in bytes only
    conn = await FrameConn.open(_port(live), TOKEN)
    burst = conn.frames(
        call("r0", "read_file", read, 0),
        call("r1", "read_file", read, 1),
        "{not json",
        call("r2", "read_file", {"path": "missing.txt"}, 2),
        json.dumps({"type": "detach", "chat_id": "c", "call_id": "nope", "rid": 3}),
        call("r4", "read_file", read, 4),
        too_big,
        call("after", "execute", {"command": f"touch {marker}"}, 8),
    )
    with trio.fail_after(10):
        await conn.stream.send_all(burst)
        await conn.receive_until_closed()
    await conn.aclose()
    got = [json.loads(m) for m in conn.messages]
    assert got[0]["type"] == "welcome"
    assert [(m["type"], m.get("call_id"), m.get("rid")) for m in got[1:]] == [
        ("accepted", "r0", 0),
        ("result", "r0", None),
        ("accepted", "r1", 1),
        ("result", "r1", None),
        ("error", None, None),
        ("accepted", "r2", 2),
        ("result", "r2", None),
        ("error", "nope", 3),
        ("accepted", "r4", 4),
        ("result", "r4", None),
    ]
    assert got[2]["data"]["content"] == "hello\n" and got[7]["outcome"] == "failed"
    assert got[5]["code"] == "bad_message" and got[8]["code"] == "unknown_call"
    assert conn.closed_with == 1009
    async with live.connect() as other:
        for call_id in ("big", "after"):
            await other.send({"type": "attach", "chat_id": "c", "call_id": call_id})
            assert (await other.recv())["code"] == "unknown_call"
    assert not marker.exists()


async def test_a_client_that_floods_without_reading_stops_being_read(
    nursery: trio.Nursery, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Backpressure on requests: replies wait in the connection's outbox, and once too many
    wait, the reader stops reading until the sender catches up. So a client that sends and
    never reads blocks on its own socket instead of growing the agent's memory; once it reads,
    every reply arrives, in order."""
    monkeypatch.setattr(server_module, "MAX_QUEUED_EVENTS", 100)
    monkeypatch.setattr(server_module, "SEND_HIGH_WATER_BYTES", 16 * 1024)
    live = await start_server(nursery, tmp_path)
    conn = await FrameConn.open(_port(live), TOKEN, rcvbuf=4096)
    (session,) = live.server._sessions
    total = 20_000
    # Unknown fields are ignored. Over 20 MB of requests and 8 MB of replies (the call_id is
    # in each): more than the kernel's socket buffers hold either way.
    pad = "p" * 1000
    sent = 0

    async def flood() -> None:
        nonlocal sent
        for i in range(total):
            call_id = f"{i:0200d}"
            detach = {"type": "detach", "chat_id": "c", "call_id": call_id, "rid": i, "pad": pad}
            await conn.stream.send_all(conn.frames(json.dumps(detach)))
            sent += 1

    with trio.fail_after(60):
        async with trio.open_nursery() as inner:
            inner.start_soon(flood)
            await trio.testing.wait_all_tasks_blocked()
            # Everyone is stuck: the client on its full socket, the agent's sender on the
            # client's, and the agent's reader on the outbox, which stays bounded.
            assert sent < total
            assert len(session.outbox) <= 100 + 1
            assert session.stream.buffered_bytes < 1024 * 1024
            await conn.receive_messages(1 + total)
    await conn.aclose()
    errors = [json.loads(m) for m in conn.messages[1:]]
    assert [e["rid"] for e in errors] == list(range(total))
    assert {e["code"] for e in errors} == {"unknown_call"}


BULK_MESSAGES = 400


async def test_bulk_both_ways_with_pings_on_both_sides_does_not_deadlock(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    """Regression: trio-websocket 0.12.2 deadlocks when both peers ping while both send bulk
    data (each reader waits for the send lock its own blocked sender holds). The server keeps
    reading whatever its sender is doing, so every ping gets its pong and all data flows."""
    live = await start_server(nursery, tmp_path)
    live.server.config.ping_interval_s = 0.005
    live.server.config.pong_timeout_s = 60.0
    output_bytes = 100 * 1024 * 1024
    pad = "x" * (256 * 1024)
    async with live.connect() as conn:
        command = f"head -c {output_bytes} /dev/zero | tr '\\0' 'y'"
        await conn.send(
            {"type": "call", "chat_id": "c", "call_id": "bulk", "tool": "execute",
             "args": {"command": command}}
        )  # fmt: skip
        errors = 0
        pongs = 0
        next_offset = 0
        result: dict[str, object] | None = None

        async def send_bulk() -> None:
            for i in range(BULK_MESSAGES):
                await conn.send({"type": "detach", "chat_id": "c", "call_id": f"n{i}", "pad": pad})

        async def ping_often() -> None:
            nonlocal pongs
            while True:
                await conn.ws.ping()
                pongs += 1
                await trio.sleep(0.002)

        # About 1 s with the fix; without it both sides stall forever.
        with trio.fail_after(30):
            async with trio.open_nursery() as inner:
                inner.start_soon(send_bulk)
                inner.start_soon(ping_often)
                while errors < BULK_MESSAGES or result is None:
                    message = await conn.recv()
                    if message["type"] == "output":
                        # In offset order; a forward jump is a declared retention jump.
                        assert message["offset"] >= next_offset
                        next_offset = message["offset"] + len(message["data"])
                    elif message["type"] == "error":
                        assert message["code"] == "unknown_call"
                        errors += 1
                    elif message["type"] == "result":
                        result = message
                inner.cancel_scope.cancel()
    assert result is not None and result["output_bytes"] == output_bytes
    assert next_offset == output_bytes  # the stream reached the end of the output
    assert pongs > 0


async def test_result_arrives_on_every_connection_that_called(live: LiveServer) -> None:
    async with live.connect() as a, live.connect() as b:
        args = {"command": "sleep 0.2; echo both"}
        await a.send(
            {"type": "call", "chat_id": "c", "call_id": "x", "tool": "execute", "args": args}
        )
        assert (await a.recv())["type"] == "accepted"
        await b.send(
            {"type": "call", "chat_id": "c", "call_id": "x", "tool": "execute", "args": args}
        )
        got_b = await b.recv_until(is_result("x"))
        got_a = await a.recv_until(is_result("x"))
        assert got_b[0]["replay"] is True
        assert got_a[-1] == got_b[-1]
        assert "".join(m["data"] for m in got_b if m["type"] == "output") == "both\n"


async def test_a_peer_that_misses_two_pongs_is_closed(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    """Keepalive (PROTOCOL.md 1): a client that never answers pings is closed (code 1011) once a
    pong is overdue; its calls go on. The client here is raw wsproto that reads but never
    answers pings."""
    from wsproto import ConnectionType, WSConnection
    from wsproto.events import AcceptConnection, CloseConnection, Ping, Request

    live = await start_server(nursery, tmp_path)
    live.server.config.ping_interval_s = 0.05
    port = int(live.url.rsplit(":", 1)[1].split("/")[0])
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    ws = WSConnection(ConnectionType.CLIENT)
    await stream.send_all(ws.send(Request(host="127.0.0.1", target="/v1", extra_headers=AUTH)))
    pings = 0
    closed_with: int | None = None
    with trio.fail_after(10):
        while closed_with is None:
            data = await stream.receive_some(65536)
            if not data:
                break
            ws.receive_data(data)
            for event in ws.events():
                if isinstance(event, AcceptConnection):
                    continue
                if isinstance(event, Ping):
                    pings += 1  # never answered
                elif isinstance(event, CloseConnection):
                    closed_with = event.code
    await stream.aclose()
    assert pings >= 1
    assert closed_with == 1011


async def test_escaped_json_output_fits_a_client_with_the_common_1_mib_message_limit(
    live: LiveServer,
) -> None:
    # NUL bytes are escaped as six bytes each in JSON. The test client keeps trio-websocket's
    # default 1 MiB message limit (as Python's `websockets` does): every output message must
    # still fit it, and the client must reassemble every byte.
    size = 700_000
    async with live.connect() as conn:
        with trio.fail_after(30):
            result = await conn.call(
                "c", "zeros", "execute", {"command": f"head -c {size} /dev/zero"}, stream=True
            )
        assert result["outcome"] == "completed" and result["output_bytes"] == size
        outputs = [m for m in conn.seen if m["type"] == "output" and m["call_id"] == "zeros"]
        assert len(outputs) > 1
        assert "".join(m["data"] for m in outputs) == "\0" * size
        assert all(len(json.dumps(m)) < 1024 * 1024 for m in outputs)


def _nested(levels: int) -> Any:
    """`levels` arrays nested in each other: [[[...]]]."""
    value: Any = []
    for _ in range(levels - 1):
        value = [value]
    return value


def _encode_with_deep_field(message: dict[str, Any], levels: int, encoding: str) -> str | bytes:
    """`message` with its field `z` set to `levels` nested arrays, encoded by hand: deeper than
    Python's own encoders can recurse."""
    if encoding == "json":
        return json.dumps(message | {"z": "@"}).replace('"@"', "[" * levels + "]" * levels)
    packed = msgspec.msgpack.encode(message | {"z": "@"})
    return packed.replace(b"\xa1@", b"\x91" * (levels - 1) + b"\x90")


def _nested_objects(message: dict[str, Any], field: str, levels: int, encoding: str) -> str | bytes:
    """`message` with `field` set to `levels` objects nested in each other ({"a": {"a": ...}}),
    encoded by hand, in the place `field` takes in `message`."""
    if encoding == "json":
        nested = '{"a":' * levels + "1" + "}" * levels
        return json.dumps(message | {field: "@"}).replace('"@"', nested)
    nested_mp = b"\x81\xa1a" * levels + b"\x01"
    return msgspec.msgpack.encode(message | {field: "@"}).replace(b"\xa1@", nested_mp)


@pytest.mark.parametrize("encoding", ["json", "msgpack"])
@pytest.mark.parametrize("levels", [200, 1000, 100_000])
async def test_a_message_too_deep_for_any_recursive_decoder_keeps_its_rid(
    live: LiveServer, encoding: str, levels: int
) -> None:
    """Issue 26, defect 3: an `attach` whose unknown field `x` nests 1,000 objects got
    `bad_message` without its `rid` (at 200 levels it had one), so a client matching replies by
    `rid` waited forever. The `rid`, `chat_id` and `call_id` at level 1 are echoed whatever the
    depth, with the path where the message first nests too deep; fields after the deep one count
    too, and the connection goes on."""
    head = {"type": "attach", "chat_id": "c", "call_id": "n1", "rid": "v2b"}
    tail = {"type": "attach", "chat_id": "c", "rid": 11, "call_id": "n2"}
    async with live.connect(encoding=encoding) as conn:
        for message, rid in ((head, "v2b"), (tail, 11)):
            field_last = message is head
            order = message | {"x": "@"} if field_last else {"x": "@"} | message
            frame = _nested_objects(order, "x", levels, encoding)
            await conn.send_raw(frame)
            reply = await conn.recv()
            assert reply["type"] == "error" and reply["code"] == "bad_message", reply
            assert reply.get("rid") == rid, reply
            assert (reply.get("chat_id"), reply.get("call_id")) == ("c", message["call_id"])
            assert reply["message"] == (
                "objects and arrays nest deeper than 64 levels - at `$.x" + ".a" * 63 + "`"
            )
        await conn.send({"type": "attach", "chat_id": "c", "call_id": "n1", "rid": 12})
        reply = await conn.recv()
        assert (reply["type"], reply["code"], reply["rid"]) == ("error", "unknown_call", 12)


@pytest.mark.parametrize("encoding", ["json", "msgpack"])
async def test_values_out_of_bounds_anywhere_are_refused_and_the_agent_lives_on(
    live: LiveServer, encoding: str
) -> None:
    """PROTOCOL.md 9.9: an integer MessagePack cannot carry, or nesting deeper than 64 levels,
    anywhere in a message is `bad_message` naming where; nothing is recorded or run, the
    connection stays open and the agent goes on. (An integer of 2**64 in `timeout_ms` used to be
    accepted, then killed the agent in the SQLite journal's encoder; an unknown field nested
    1,000 deep closed the connection with 1011.)"""
    marker = live.workspace / "marker"
    touch = {"command": f"echo ran >> {marker}"}
    enc = (lambda m: msgspec.msgpack.encode(m)) if encoding == "msgpack" else json.dumps

    def call(call_id: str, rid: int, **extra: Any) -> dict[str, Any]:
        return {"type": "call", "rid": rid, "chat_id": "c", "call_id": call_id,
                "tool": "execute", "args": touch} | extra  # fmt: skip

    deep_args = touch | {"z": _nested(63)}  # 63 arrays inside args inside the message: 65 levels
    attach = {"type": "attach", "rid": 2, "chat_id": "c", "call_id": "k2"}
    cases: list[tuple[str | bytes, int | None, str]] = [
        (enc(call("k1", 1, args=deep_args)), 1, "$.args.z"),
        (_encode_with_deep_field(attach, 100, encoding), 2, "$.z"),
        (_encode_with_deep_field(attach, 1000, encoding), 2, "$.z" + "[0]" * 63),
        (
            enc({"type": "turn", "rid": 3, "chat_id": "c", "turn_id": "t",
                 "calls": [{"call_id": "k3", "tool": "execute", "args": deep_args}]}),
            3,
            "$.calls[0].args.z",
        ),
    ]  # fmt: skip
    if encoding == "json":  # MessagePack cannot even spell these integers
        cases += [
            (enc(call("k4", 4, timeout_ms=2**64)), 4, "$.timeout_ms"),
            (enc(call("k5", 5, args=touch | {"z": 2**70})), 5, "$.args.z"),
            (enc(call("k6", 6, args=touch | {"z": [-(2**63) - 1]})), 6, "$.args.z[0]"),
            (
                enc({"type": "turn", "rid": 7, "chat_id": "c", "turn_id": "t",
                     "calls": [{"call_id": "k7", "tool": "execute", "args": touch,
                                "timeout_ms": 18446744073709551616}]}),
                7,
                "$.calls[0].timeout_ms",
            ),
            (enc(call("k8", 8) | {"unknown": {"deep": 2**64}}), 8, "$.unknown.deep"),
            (enc(call("k9", 2**64)), None, "$.rid"),  # an rid out of range is not echoed
        ]  # fmt: skip
    async with live.connect(encoding=encoding) as conn:
        for frame, rid, where in cases:
            await conn.send_raw(frame)
            reply = await conn.recv()
            assert reply["type"] == "error" and reply["code"] == "bad_message", reply
            assert where in reply["message"], reply
            assert reply.get("rid") == rid, reply
        # The bounds themselves are in: 64 levels, -2**63 and 2**64 - 1, here in unknown
        # fields of the message, which are ignored (3; an unknown field of `args` is bad_args
        # from 1.2, PROTOCOL.md 10.3).
        in_bounds: dict[str, Any] = {"z": _nested(63)}
        if encoding == "json":
            in_bounds |= {"lo": -(2**63), "hi": 2**64 - 1}
        await conn.send(call("fine", 9) | in_bounds)
        result = await conn.recv_until(lambda m: m["type"] in ("result", "error"))
        assert result[-1]["outcome"] == "completed", result
        # None of the refused calls was recorded: each id is still free and runs once now.
        for call_id in ("k1", "k3", "k4", "k5"):
            result = await conn.call("c", call_id, "execute", touch)
            assert result["outcome"] == "completed", result
    assert marker.read_text() == "ran\n" * 5
