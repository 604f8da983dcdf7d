"""A deliberately small, independent protocol client for tests: raw trio-websocket + JSON or
msgpack, speaking only what PROTOCOL.md says (not transport/client/), the way a third-party
client author would."""

from __future__ import annotations

import json
import ssl
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import msgspec
import trio
from trio_websocket import WebSocketConnection, open_websocket_url
from wsproto import ConnectionType, WSConnection
from wsproto.events import (
    AcceptConnection,
    BytesMessage,
    CloseConnection,
    Event,
    Request,
    TextMessage,
)

Message = dict[str, Any]


class RawConn:
    def __init__(self, ws: WebSocketConnection, encoding: str) -> None:
        self.ws = ws
        self.encoding = encoding
        self.welcome: Message = {}
        self.seen: list[Message] = []  # everything received, in order

    async def send(self, message: Message) -> None:
        if self.encoding == "msgpack":
            await self.ws.send_message(msgspec.msgpack.encode(message))
        else:
            await self.ws.send_message(json.dumps(message))

    async def send_raw(self, frame: str | bytes) -> None:
        await self.ws.send_message(frame)

    async def recv(self) -> Message:
        frame = await self.ws.get_message()
        if isinstance(frame, bytes):
            message: Message = msgspec.msgpack.decode(frame)
        else:
            message = json.loads(frame)
        self.seen.append(message)
        return message

    async def recv_until(self, predicate: Callable[[Message], bool]) -> list[Message]:
        """Receive until a message matches; returns all received, the match last."""
        got: list[Message] = []
        while True:
            message = await self.recv()
            got.append(message)
            if predicate(message):
                return got

    async def call(self, chat_id: str, call_id: str, tool: str, args: Any, **extra: Any) -> Message:
        """Send a call and receive until its result (or error). Whatever arrives meanwhile, such
        as another call's result, is consumed here but kept in `seen`: wait for it afterwards
        with `wait_for`, which looks there first, never with `recv_until`."""
        await self.send(
            {"type": "call", "chat_id": chat_id, "call_id": call_id, "tool": tool, "args": args}
            | extra
        )
        got = await self.recv_until(
            lambda m: m["type"] in ("result", "error") and m.get("call_id") == call_id
        )
        return got[-1]


def messages(conn: RawConn, call_id: str, kind: str | None = None) -> list[Message]:
    """Everything `conn` received about `call_id` (of one `type`, if given), in order."""
    return [
        m for m in conn.seen if m.get("call_id") == call_id and (kind is None or m["type"] == kind)
    ]


def streamed(conn: RawConn, call_id: str) -> str:
    """The call's output as a client de-duplicating by offset reassembles it."""
    by_offset: dict[int, str] = {}
    for m in messages(conn, call_id, "output"):
        by_offset.setdefault(m["offset"], m["data"])
    text, at = "", 0
    for offset in sorted(by_offset):
        data = by_offset[offset]
        if offset + len(data.encode()) <= at:
            continue
        assert offset == at, f"gap: expected offset {at}, got {offset}"
        text += data
        at = offset + len(data.encode())
    return text


async def wait_for(conn: RawConn, predicate: Callable[[Message], bool], start: int = 0) -> Message:
    """The first message from index `start` (already received or still to come) that matches."""
    for message in conn.seen[start:]:
        if predicate(message):
            return message
    return (await conn.recv_until(predicate))[-1]


def of(kind: str, call_id: str, chat_id: str | None = None) -> Callable[[Message], bool]:
    """Matches a message of one `type` about one call (of one chat, if given)."""
    return lambda m: (
        m["type"] == kind
        and m.get("call_id") == call_id
        and (chat_id is None or m.get("chat_id") == chat_id)
    )


async def state_of(conn: RawConn, chat_id: str, call_id: str) -> str:
    """The call's state as the agent reports it now (`accepted.state` of an `attach`)."""
    start = len(conn.seen)
    await conn.send({"type": "attach", "chat_id": chat_id, "call_id": call_id})
    accepted = await wait_for(conn, of("accepted", call_id, chat_id), start)
    state: str = accepted["state"]
    return state


def is_result(call_id: str) -> Callable[[Message], bool]:
    return lambda m: m["type"] == "result" and m["call_id"] == call_id


@asynccontextmanager
async def connect(
    url: str,
    token: str | None,
    *,
    encoding: str = "json",
    subprotocols: list[str] | None = None,
    ssl_context: ssl.SSLContext | None = None,
) -> AsyncIterator[RawConn]:
    headers = [(b"authorization", f"Bearer {token}".encode())] if token else []
    if subprotocols is None:
        subprotocols = [f"toolwire.v1.{encoding}"]
    async with open_websocket_url(
        url,
        extra_headers=headers,
        subprotocols=subprotocols,
        message_queue_size=1024,
        ssl_context=ssl_context,
    ) as ws:
        conn = RawConn(ws, encoding)
        conn.welcome = await conn.recv()
        assert conn.welcome["type"] == "welcome"
        try:
            yield conn
        finally:
            # trio-websocket leaves its TCP socket open after some closes; close it ourselves.
            with trio.move_on_after(1):
                await ws.aclose()


class FrameConn:
    """A client on raw wsproto, for what trio-websocket's client cannot do: several messages in
    one TCP write, fragmented messages, not reading at all, no automatic pongs."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.ws = WSConnection(ConnectionType.CLIENT)
        self._parts: list[str | bytes] = []
        self.messages: list[str | bytes] = []  # complete messages received, in order
        self.closed_with: int | None = None

    @classmethod
    async def open(cls, port: int, token: str | None, *, rcvbuf: int | None = None) -> FrameConn:
        """Connect and finish the handshake. `rcvbuf` shrinks the socket's receive buffer before
        connecting, so that a client that stops reading blocks the agent's writes early."""
        sock = trio.socket.socket()
        if rcvbuf is not None:
            sock.setsockopt(trio.socket.SOL_SOCKET, trio.socket.SO_RCVBUF, rcvbuf)
        await sock.connect(("127.0.0.1", port))
        conn = cls(trio.SocketStream(sock))
        await conn.handshake(token)
        return conn

    async def handshake(self, token: str | None) -> None:
        """Ask for the WebSocket upgrade (with `token`, when given) and wait until accepted."""
        headers = [(b"authorization", f"Bearer {token}".encode())] if token else []
        await self.stream.send_all(
            self.ws.send(Request(host="127.0.0.1", target="/v1", extra_headers=headers))
        )
        while not await self._receive(lambda event: isinstance(event, AcceptConnection)):
            pass

    def frames(self, *messages: str | bytes | Event) -> bytes:
        """The bytes of these messages (or wsproto events), to send in one write."""
        return b"".join(
            self.ws.send(
                m
                if isinstance(m, Event)
                else TextMessage(data=m)
                if isinstance(m, str)
                else BytesMessage(data=m)
            )
            for m in messages
        )

    async def receive_until_closed(self) -> None:
        while self.closed_with is None:
            if await self._receive(lambda event: False) is None:
                return

    async def receive_messages(self, count: int) -> None:
        while len(self.messages) < count:
            if await self._receive(lambda event: False) is None:
                return

    async def _receive(self, stop: Callable[[Event], bool]) -> bool | None:
        """One socket read; True if an event matched `stop`, None at the end of the stream."""
        data = await self.stream.receive_some(65536)
        if not data:
            return None
        self.ws.receive_data(data)
        found = False
        for event in self.ws.events():
            if isinstance(event, TextMessage | BytesMessage):
                self._parts.append(event.data)
                if event.message_finished:
                    joined: str | bytes = (
                        "".join(p for p in self._parts if isinstance(p, str))
                        if isinstance(event, TextMessage)
                        else b"".join(p for p in self._parts if isinstance(p, bytes))
                    )
                    self.messages.append(joined)
                    self._parts = []
            elif isinstance(event, CloseConnection):
                self.closed_with = event.code
            found = found or stop(event)
        return found

    async def aclose(self) -> None:
        await self.stream.aclose()
