"""A deliberately small, independent protocol client for tests: raw trio-websocket + JSON or
msgpack, speaking only what PROTOCOL.md says (not transport/client.py), the way a third-party
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
