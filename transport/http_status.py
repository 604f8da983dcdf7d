"""Plain HTTP on the WebSocket's port: `/healthz`, `/readyz`, `/metrics` (PROTOCOL.md 9.7).

Every connection starts with an HTTP/1.1 request head. This module reads that head (parsed by
h11, the HTTP library wsproto itself uses) before trio-websocket sees the connection:
- a WebSocket upgrade, or anything that is not a well-formed request, goes on to the WebSocket
  handshake exactly as before: the bytes read here are handed back through `ReplayStream`, so
  trio-websocket reads them as if nothing had come first;
- any other request is answered here, once, and the connection is closed (`Connection: close`:
  probes and scrapes open one connection each, and a loop never waits on an idle keep-alive).

So the probes share the server's accept loop and handshake deadline, and a WebSocket session
is never touched by them: they run on connections of their own.
"""

from __future__ import annotations

from dataclasses import dataclass
from http import HTTPStatus
from typing import Protocol

import h11
import trio

# The largest request head accepted: h11's and wsproto's own default (what trio-websocket
# allowed before this module read the head first).
MAX_HEAD_BYTES = 16 * 1024
# Bytes per read while the head comes in: a probe's or a handshake's head is a few hundred.
HEAD_READ_BYTES = 4096

HEALTH_PATH = "/healthz"
READY_PATH = "/readyz"
METRICS_PATH = "/metrics"


class StatusSource(Protocol):
    """What the pages report; the server provides it."""

    def readiness(self) -> str | None:
        """None when ready (recovery done, requests taken), else why not."""

    def authorized(self, headers: list[tuple[bytes, bytes]]) -> bool:
        """The request carries the server's bearer token (always True without auth)."""

    def metrics(self) -> tuple[bytes, str]:
        """The exposition and its content type."""


@dataclass
class RequestHead:
    raw: bytes  # every byte read from the connection so far (the head, maybe more)
    request: h11.Request | None  # None: not a well-formed HTTP/1.1 request head
    connection: h11.Connection | None  # the parser, to answer in the same HTTP version


async def read_head(stream: trio.abc.Stream) -> RequestHead | None:
    """Read until a whole request head arrived. None if the peer closed first."""
    parser = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD_BYTES)
    raw = bytearray()
    while True:
        try:
            event = parser.next_event()
        except h11.RemoteProtocolError:
            return RequestHead(bytes(raw), None, None)
        if isinstance(event, h11.Request):
            return RequestHead(bytes(raw), event, parser)
        if event is not h11.NEED_DATA:
            return RequestHead(bytes(raw), None, None)
        data = await stream.receive_some(HEAD_READ_BYTES)
        if not data:
            return None
        raw += data
        parser.receive_data(bytes(data))


def is_websocket_upgrade(request: h11.Request) -> bool:
    """The request asks for a WebSocket (RFC 6455 4.1: `Upgrade: websocket`); wsproto then
    checks the rest of the handshake and rejects a broken one as it always did."""
    for name, value in request.headers:
        if name == b"upgrade" and b"websocket" in value.lower():
            return True
    return False


async def answer(
    stream: trio.abc.Stream, head: RequestHead, status: StatusSource
) -> tuple[int, str]:
    """Answer one plain request on `stream`; returns the status code and path (for the log)."""
    assert head.request is not None and head.connection is not None
    request = head.request
    path = request.target.decode("ascii", "replace").split("?", 1)[0]
    code, body, content_type, extra = _route(request, path, status)
    headers = [
        (b"content-type", content_type.encode()),
        (b"content-length", str(len(body)).encode()),
        (b"cache-control", b"no-store"),
        (b"connection", b"close"),
        *extra,
    ]
    parser = head.connection
    reason = HTTPStatus(code).phrase.encode()
    out = parser.send(h11.Response(status_code=code, headers=headers, reason=reason)) or b""
    if request.method != b"HEAD":
        out += parser.send(h11.Data(data=body)) or b""
    out += parser.send(h11.EndOfMessage()) or b""
    await stream.send_all(out)
    return code, path


_TEXT = "text/plain; charset=utf-8"


def _route(
    request: h11.Request, path: str, status: StatusSource
) -> tuple[int, bytes, str, list[tuple[bytes, bytes]]]:
    if request.method not in (b"GET", b"HEAD"):
        return 405, b"only GET and HEAD are answered here\n", _TEXT, [(b"allow", b"GET, HEAD")]
    if path == HEALTH_PATH:
        return 200, b"ok", _TEXT, []
    if path == READY_PATH:
        why = status.readiness()
        if why is None:
            return 200, b"ready", _TEXT, []
        return 503, f"not ready: {why}".encode(), _TEXT, [(b"retry-after", b"1")]
    if path == METRICS_PATH:
        if not status.authorized(list(request.headers)):
            challenge = [(b"www-authenticate", b"Bearer")]
            return 401, b"missing or wrong bearer token\n", _TEXT, challenge
        body, content_type = status.metrics()
        return 200, body, content_type, []
    return 404, b"no such path; /healthz, /readyz, /metrics, or a WebSocket on /v1\n", _TEXT, []


class ReplayStream(trio.abc.Stream):
    """`inner`, whose first reads return `prefix` (the bytes `read_head` took) again."""

    def __init__(self, inner: trio.abc.Stream, prefix: bytes) -> None:
        self.inner = inner
        self._prefix = prefix

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        prefix = self._prefix
        if prefix:
            if max_bytes is None or max_bytes >= len(prefix):
                self._prefix = b""
                await trio.lowlevel.checkpoint()
                return prefix
            self._prefix = prefix[max_bytes:]
            await trio.lowlevel.checkpoint()
            return prefix[:max_bytes]
        return await self.inner.receive_some(max_bytes)

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await self.inner.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self.inner.wait_send_all_might_not_block()

    async def aclose(self) -> None:
        await self.inner.aclose()
