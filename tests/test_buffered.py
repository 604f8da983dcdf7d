"""The write-buffered stream under the WebSocket (transport/buffered.py), over real TCP sockets on
127.0.0.1: writes never block, bytes arrive intact and in order whether a write went straight to
the socket or waited for the flusher, and a broken peer is reported."""

from __future__ import annotations

import socket
import struct
from collections.abc import AsyncIterator

import pytest
import trio
import trio.testing

from toolwire.transport.buffered import WriteBufferedStream

TEST_DEADLINE_S = 10.0


@pytest.fixture
async def pair(
    nursery: trio.Nursery,
) -> AsyncIterator[tuple[WriteBufferedStream, trio.SocketStream]]:
    """(a buffered writer with its flusher running, the peer's plain stream)."""
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    client = await trio.testing.open_stream_to_socket_listener(listeners[0])
    server = await listeners[0].accept()
    await listeners[0].aclose()
    assert isinstance(server, trio.SocketStream)
    writer = WriteBufferedStream(client)
    nursery.start_soon(writer.flusher)
    await trio.testing.wait_all_tasks_blocked()
    yield writer, server
    await trio.aclose_forcefully(writer)
    await trio.aclose_forcefully(server)


async def read_exactly(stream: trio.abc.ReceiveStream, size: int) -> bytes:
    data = bytearray()
    while len(data) < size:
        piece = await stream.receive_some(min(65536, size - len(data)))
        assert piece, "the stream ended early"
        data += piece
    return bytes(data)


async def test_a_write_on_an_idle_connection_reaches_the_kernel_at_once(
    pair: tuple[WriteBufferedStream, trio.SocketStream],
) -> None:
    writer, peer = pair
    with trio.fail_after(TEST_DEADLINE_S):
        await writer.send_all(b"hello")
        # No task ran in between: the write went straight to the socket, not to the flusher.
        assert writer.buffered_bytes == 0
        assert await read_exactly(peer, 5) == b"hello"


async def test_writes_arrive_in_order_whether_sent_directly_or_queued(
    pair: tuple[WriteBufferedStream, trio.SocketStream],
) -> None:
    # Sizes from a few bytes to far more than the socket takes at once, so that some writes go
    # straight out, some are cut (their rest queued) and some find others queued before them.
    writer, peer = pair
    sizes = [3, 70_000, 1, 5_000_000, 17, 300_000, 2, 4_000_000, 64] * 3
    messages = [struct.pack("!I", i) * (size // 4 + 1) for i, size in enumerate(sizes)]
    expected = b"".join(messages)
    with trio.fail_after(TEST_DEADLINE_S):
        async with trio.open_nursery() as nursery:
            received: list[bytes] = []

            async def read_all() -> None:
                received.append(await read_exactly(peer, len(expected)))

            nursery.start_soon(read_all)
            for message in messages:
                await writer.send_all(message)
            await writer.wait_writable(0)
    assert received[0] == expected


async def test_a_caller_may_reuse_its_buffer_once_send_all_returned(
    pair: tuple[WriteBufferedStream, trio.SocketStream],
) -> None:
    writer, peer = pair
    big = bytearray(b"a" * 8_000_000)  # more than the socket takes: its rest is queued
    with trio.fail_after(TEST_DEADLINE_S):
        await writer.send_all(big)
        big[:] = b"b" * len(big)
        await writer.send_all(memoryview(b"tail"))
        data = await read_exactly(peer, 8_000_004)
    assert data == b"a" * 8_000_000 + b"tail"


async def test_send_all_never_waits_for_a_peer_that_does_not_read(
    pair: tuple[WriteBufferedStream, trio.SocketStream],
) -> None:
    writer, _peer = pair
    chunk = b"x" * 1_000_000
    with trio.fail_after(TEST_DEADLINE_S):
        for _ in range(20):
            await writer.send_all(chunk)
        await trio.testing.wait_all_tasks_blocked()  # the flusher, stuck on the full socket
    # The kernel took a few MB at most; the rest waits in the buffer, counted for backpressure.
    assert writer.buffered_bytes > 10_000_000


async def test_a_reset_peer_is_reported_broken(
    pair: tuple[WriteBufferedStream, trio.SocketStream],
) -> None:
    writer, peer = pair
    # Close with a reset (linger 0), so writes fail instead of filling buffers.
    peer.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    await peer.aclose()
    with trio.fail_after(TEST_DEADLINE_S), pytest.raises(trio.BrokenResourceError):
        while True:
            await writer.send_all(b"y" * 100_000)
            await trio.lowlevel.checkpoint()  # the flusher's turn


async def test_parts_arrive_whole_and_in_order_whether_written_at_once_or_queued(
    pair: tuple[WriteBufferedStream, trio.SocketStream],
) -> None:
    # Batches of parts larger than the socket takes at once: a writev stops inside some part,
    # and the rest of that part and the parts after it must follow exactly once.
    writer, peer = pair
    batches = [
        [struct.pack("!I", b * 100 + p) * (size // 4 + 1) for p, size in enumerate(sizes)]
        for b, sizes in enumerate([[2, 3_000_000, 5, 2_000_000], [7], [1_500_000] * 5, [0, 9]])
    ]
    expected = b"".join(b"".join(parts) for parts in batches) + b"end"
    with trio.fail_after(TEST_DEADLINE_S):
        async with trio.open_nursery() as nursery:
            received: list[bytes] = []

            async def read_all() -> None:
                received.append(await read_exactly(peer, len(expected)))

            nursery.start_soon(read_all)
            for parts in batches:
                await writer.send_parts(parts)
            await writer.send_all(b"end")
    assert received[0] == expected


async def test_parts_on_an_idle_connection_reach_the_kernel_at_once(
    pair: tuple[WriteBufferedStream, trio.SocketStream],
) -> None:
    writer, peer = pair
    with trio.fail_after(TEST_DEADLINE_S):
        await writer.send_parts([b"he", b"llo", b"!"])
        assert writer.buffered_bytes == 0
        assert await read_exactly(peer, 6) == b"hello!"
