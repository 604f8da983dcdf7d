"""transport/connection.py on its own: a `DirectConnection` over a real socket, fed by a raw
wsproto client, handing messages to a sink defined here."""

from __future__ import annotations

import logging

import pytest
import trio
import trio.testing
from wsproto.events import BytesMessage, TextMessage

from tests.wsclient import FrameConn
from toolwire.transport.big_messages import BIG_MESSAGE_BYTES, PreparedMessage
from toolwire.transport.connection import (
    FAIR_SHARE_MESSAGES,
    DirectConnection,
    open_server_connection,
)


class Sink:
    """Records what the connection hands over; raises on the message "boom"."""

    def __init__(self) -> None:
        self.messages: list[str | bytes] = []
        self.prepared: list[PreparedMessage | None] = []
        self.too_big = 0

    def on_message(self, message: str | bytes, prepared: PreparedMessage | None = None) -> None:
        if message == "boom":
            raise RuntimeError("planted failure")
        self.messages.append(message)
        self.prepared.append(prepared)

    async def prepare_big_message(self, message: str | bytes) -> PreparedMessage:
        await trio.lowlevel.checkpoint()  # as a real sink awaits: later messages come after
        return PreparedMessage(message=len(message), error=None)

    def on_too_big(self) -> None:
        self.too_big += 1

    def backlogged(self) -> bool:
        return False

    async def wait_for_room(self) -> None:
        raise AssertionError("never backlogged")


async def _serve_one(
    nursery: trio.Nursery, max_message_bytes: int, *, attach: bool = True
) -> tuple[int, trio.MemoryReceiveChannel[DirectConnection], Sink]:
    """Listen on 127.0.0.1; the first client gets a DirectConnection (sent on the channel)."""
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    send, receive = trio.open_memory_channel[DirectConnection](1)
    sink = Sink()

    async def accept_one() -> None:
        stream = await listeners[0].accept()
        async with trio.open_nursery() as conn_nursery:
            connection, request = await open_server_connection(
                conn_nursery, stream, max_message_bytes=max_message_bytes, receive_buffer_size=None
            )
            await request.accept()
            if attach:
                connection.attach(sink)
            await send.send(connection)

    nursery.start_soon(accept_one)
    return port, receive, sink


async def test_fragmented_messages_are_joined_and_counted_in_bytes(nursery: trio.Nursery) -> None:
    port, connections, sink = await _serve_one(nursery, max_message_bytes=10)
    client = await FrameConn.open(port, None)
    await connections.receive()
    await client.stream.send_all(
        client.frames(
            TextMessage(data="ab", message_finished=False),
            TextMessage(data="cd", message_finished=True),
            b"\x00\x01",
            "éé",  # 2 characters, 4 bytes
            TextMessage(data="é" * 3, message_finished=False),  # 6 bytes so far
            TextMessage(data="é" * 3, message_finished=True),  # 12 bytes: over 10
            "after",
        )
    )
    with trio.fail_after(5):
        while not sink.too_big:
            await trio.testing.wait_all_tasks_blocked()
    assert sink.messages == ["abcd", b"\x00\x01", "éé"]
    assert sink.too_big == 1
    await client.aclose()


async def test_a_big_message_is_joined_off_the_loop_prepared_and_kept_in_order(
    nursery: trio.Nursery,
) -> None:
    """A message of BIG_MESSAGE_BYTES or more, in many parts, is joined whole, goes to the
    sink's `prepare_big_message` (which awaits), and is applied with what it prepared, after
    the message before it and before the one after it; a smaller one is applied at once."""
    port, connections, sink = await _serve_one(nursery, max_message_bytes=4 * BIG_MESSAGE_BYTES)
    client = await FrameConn.open(port, None)
    await connections.receive()
    part = bytes(range(256)) * 4096  # 1 MiB, every byte value
    await client.stream.send_all(
        client.frames(
            b"before",
            BytesMessage(data=part, message_finished=False),
            BytesMessage(data=part, message_finished=False),
            BytesMessage(data=b"end", message_finished=True),
            b"after",
        )
    )
    with trio.fail_after(10):
        while len(sink.messages) < 3:
            await trio.testing.wait_all_tasks_blocked()
    big = part * 2 + b"end"
    assert sink.messages == [b"before", big, b"after"]
    assert [p.message if p else None for p in sink.prepared] == [None, len(big), None]
    await client.aclose()


async def test_messages_wait_for_the_sink_and_a_failing_sink_closes_with_1011(
    nursery: trio.Nursery, caplog: pytest.LogCaptureFixture
) -> None:
    port, connections, sink = await _serve_one(nursery, max_message_bytes=1000, attach=False)
    client = await FrameConn.open(port, None)
    connection = await connections.receive()
    await client.stream.send_all(client.frames("first", "boom", "never"))
    await trio.testing.wait_all_tasks_blocked()
    assert sink.messages == []  # no sink yet: the reader waits, nothing is dropped
    with caplog.at_level(logging.ERROR, logger="toolwire.server"):
        connection.attach(sink)
        with trio.fail_after(5):
            await client.receive_until_closed()
    assert client.closed_with == 1011
    assert sink.messages == ["first"]
    assert any(r.exc_info and "planted failure" in str(r.exc_info[1]) for r in caplog.records), (
        caplog.records
    )
    await client.aclose()


async def test_a_reader_lets_other_tasks_run_between_its_share_of_messages(
    nursery: trio.Nursery,
) -> None:
    """Hundreds of requests in one socket read are not all applied in one go: after each
    FAIR_SHARE_MESSAGES the reader yields, so another connection's task (here a ticker) runs
    in between (issue 27's flood of chats)."""
    port, connections, sink = await _serve_one(nursery, max_message_bytes=1 << 20)
    client = await FrameConn.open(port, None)
    await connections.receive()
    ticks = 0
    seen: list[int] = []
    original = sink.on_message
    count = 10 * FAIR_SHARE_MESSAGES
    all_in = trio.Event()

    def on_message(message: str | bytes, prepared: PreparedMessage | None = None) -> None:
        seen.append(ticks)
        original(message, prepared)
        if len(seen) == count:
            all_in.set()

    sink.on_message = on_message  # type: ignore[method-assign]

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await trio.lowlevel.checkpoint()

    nursery.start_soon(ticker)
    await client.stream.send_all(client.frames(*[f"m{i}" for i in range(count)]))
    with trio.fail_after(10):
        await all_in.wait()
    assert sink.messages == [f"m{i}" for i in range(count)]  # in order, none lost
    # The ticker ran within every two shares (the scheduler may run the reader first in the
    # batch after a yield, then the ticker): no run of messages applied with no tick between
    # is longer. Without the yields one socket read's 160 messages are one run.
    longest = max(seen.count(tick) for tick in set(seen))
    assert longest <= 2 * FAIR_SHARE_MESSAGES, seen
    await client.aclose()
