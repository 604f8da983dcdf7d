"""The benchmark's WebSocket client side: raw trio-websocket + msgspec, with byte counting.

The hot loops do not use `transport/client/`: a benchmark driver should cost as little as it
can, and the echo baseline is driven by the very same code, so whatever the client costs, it
costs both sides alike. Bytes are counted where they meet the socket (`CountingStream`), both
directions, after the handshake unless a caller asks otherwise.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, cast

import msgspec
import trio
from trio_websocket import WebSocketConnection, wrap_client_stream

# The client queues this many received messages: it must never be what limits a pipeline.
CLIENT_QUEUE = 8192
# Bytes per socket read on the client: up to 1 MiB, so a 256 KiB `output` message is one read,
# not four. Each read costs trio-websocket a pass through its reader (wsproto events, a message
# part): with 64 KiB reads the client spent 0.15-0.20 s of CPU on a 200 MB stream and fell behind
# the agent in about half the runs; with 1 MiB, 0.09-0.10 s (issue 6). Small messages are read
# as they come either way: the transport scenario's rates did not move.
CLIENT_RECEIVE_BYTES = 1024 * 1024
# Largest message the client accepts: an `output` event carries at most 256 KiB of text (128 KiB
# on JSON, which may escape it to six bytes a byte: NUL -> \u0000).
CLIENT_MAX_MESSAGE = 8 * 1024 * 1024


class CountingStream(trio.abc.Stream):
    """A stream that counts the bytes it hands to and takes from the socket."""

    def __init__(self, inner: trio.abc.Stream) -> None:
        self.inner = inner
        self.sent = 0
        self.received = 0

    def reset(self) -> None:
        self.sent = 0
        self.received = 0

    @property
    def total(self) -> int:
        return self.sent + self.received

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        self.sent += len(data)
        await self.inner.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self.inner.wait_send_all_might_not_block()

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        data = await self.inner.receive_some(max_bytes)
        self.received += len(data)
        return data

    async def aclose(self) -> None:
        await self.inner.aclose()


@dataclass
class WsConn:
    ws: WebSocketConnection
    counter: CountingStream
    welcome: Any = None


@asynccontextmanager
async def ws_connect(
    port: int,
    *,
    token: str | None = None,
    subprotocol: str | None = None,
    resource: str = "/v1",
) -> AsyncIterator[WsConn]:
    """One WebSocket to 127.0.0.1:port. With a subprotocol (toolwire), waits for `welcome`."""
    socket_stream = await trio.open_tcp_stream("127.0.0.1", port)
    counter = CountingStream(socket_stream)
    headers = [(b"authorization", f"Bearer {token}".encode())] if token else []
    try:
        async with trio.open_nursery() as nursery:
            ws = await wrap_client_stream(
                nursery,
                cast(trio.SocketStream, counter),  # any trio Stream works; the hint is narrow
                "127.0.0.1",
                resource,
                subprotocols=[subprotocol] if subprotocol else None,
                extra_headers=headers,
                message_queue_size=CLIENT_QUEUE,
                max_message_size=CLIENT_MAX_MESSAGE,
                receive_buffer_size=CLIENT_RECEIVE_BYTES,
            )
            conn = WsConn(ws, counter)
            if subprotocol is not None:
                conn.welcome = await ws.get_message()
            counter.reset()
            try:
                yield conn
            finally:
                with trio.move_on_after(2):
                    await ws.aclose()
                nursery.cancel_scope.cancel()
    finally:
        await trio.aclose_forcefully(socket_stream)


# ---------------------------------------------------------------------------------------------
# toolwire messages, as a third-party client would write them


class Incoming(msgspec.Struct):
    """Every agent message, read leniently: only what the benchmarks look at."""

    type: str
    call_id: str | None = None
    outcome: str | None = None
    offset: int | None = None
    data: Any = None
    output_bytes: int | None = None
    started_at: int | None = None
    finished_at: int | None = None
    received: bool | None = None
    result: Any = None
    code: str | None = None
    message: str | None = None
    text: str | None = None


# `Codec("json-stdlib")`: JSON on the wire like "json", but encoded and decoded by the standard
# library's `json` module, as a chat server without msgspec would (the outside client).
STDLIB_JSON = "json-stdlib"


class Codec:
    """Encode `call`/`cancel` requests and decode agent messages for one encoding: "json" and
    "msgpack" with msgspec, or `STDLIB_JSON` (JSON with the `json` module)."""

    def __init__(self, encoding: str) -> None:
        self.encoding = encoding
        self._stdlib = encoding == STDLIB_JSON
        if self._stdlib:
            encoding = "json"
        self.subprotocol = f"toolwire.v1.{encoding}"
        self._json_decoder = msgspec.json.Decoder(Incoming)
        self._msgpack_decoder = msgspec.msgpack.Decoder(Incoming)
        self._json_encoder = msgspec.json.Encoder()
        self._msgpack_encoder = msgspec.msgpack.Encoder()

    def encode(self, message: dict[str, Any]) -> str | bytes:
        if self._stdlib:
            return json.dumps(message, separators=(",", ":"), ensure_ascii=False)
        if self.encoding == "json":
            return self._json_encoder.encode(message).decode()
        return self._msgpack_encoder.encode(message)

    def decode(self, frame: str | bytes) -> Incoming:
        if self._stdlib:
            # A dict, as `json.loads` gives it; the fields the benchmarks read copied from it
            # into the struct the other encodings decode to (a C call, some 1 us: the
            # standard library's parse is what this client is about).
            fields = json.loads(frame)
            return Incoming(**{k: fields.get(k) for k in _INCOMING_FIELDS if k in fields})
        if isinstance(frame, str):
            return self._json_decoder.decode(frame)
        return self._msgpack_decoder.decode(frame)

    def call(
        self,
        chat_id: str,
        call_id: str,
        tool: str,
        args: dict[str, Any],
        *,
        stream: bool,
        sandbox: dict[str, Any] | None = None,
    ) -> str | bytes:
        message: dict[str, Any] = {
            "type": "call",
            "chat_id": chat_id,
            "call_id": call_id,
            "tool": tool,
            "args": args,
            "stream": stream,
        }
        if sandbox is not None:
            message["sandbox"] = sandbox
        return self.encode(message)

    def cancel(self, chat_id: str, call_ids: list[str]) -> str | bytes:
        return self.encode({"type": "cancel", "chat_id": chat_id, "call_ids": call_ids})


_INCOMING_FIELDS = Incoming.__struct_fields__


class UnexpectedReply(RuntimeError):
    pass


def check_completed(message: Incoming) -> None:
    if message.type == "error":
        raise UnexpectedReply(f"error {message.code}: {message.message}")
    if message.type == "result" and message.outcome != "completed":
        raise UnexpectedReply(f"call {message.call_id} ended {message.outcome}: {message.text}")


async def _pipeline(
    conn: WsConn, frames: list[str | bytes], window: int, answers: Callable[[str | bytes], bool]
) -> int:
    """Send every frame with at most `window` unanswered; return the answers received.
    `answers(message)` says whether an incoming message answers one frame."""
    ws = conn.ws
    slots = trio.Semaphore(window)
    total = len(frames)

    async def sender() -> None:
        for frame in frames:
            await slots.acquire()
            await ws.send_message(frame)

    done = 0
    async with trio.open_nursery() as nursery:
        nursery.start_soon(sender)
        while done < total:
            if answers(await ws.get_message()):
                done += 1
                slots.release()
    return done


async def pipelined_calls(
    conn: WsConn, codec: Codec, frames: list[str | bytes], window: int
) -> int:
    """Toolwire calls: a call is answered by its `result` (or an `error`); `accepted` only
    says it was taken."""

    def answers(frame: str | bytes) -> bool:
        message = codec.decode(frame)
        if message.type == "result" or message.type == "error":
            check_completed(message)
            return True
        return False

    return await _pipeline(conn, frames, window, answers)


async def pipelined_echo(conn: WsConn, frames: list[str | bytes], window: int) -> int:
    """The same pipeline against the echo server: a message is answered by its echo."""
    return await _pipeline(conn, frames, window, lambda _frame: True)


async def await_result(conn: WsConn, codec: Codec, call_id: str) -> Incoming:
    while True:
        message = codec.decode(await conn.ws.get_message())
        if message.type == "error":
            raise UnexpectedReply(f"error {message.code}: {message.message}")
        if message.type == "result" and message.call_id == call_id:
            return message
