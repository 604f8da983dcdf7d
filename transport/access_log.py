"""The server's log lines for operators: connections opened and closed, plain HTTP requests,
refused browsers, and every `error` sent (`toolwire serve --log-format json` writes each as one
JSON object, `cli/logs.py`).

Fields name the connection (`conn`, `peer`, `subprotocol`), the request (`rid`, `chat_id`,
`call_id`) and the error's `code`; never a token, a header value other than an Origin, a
message's args, or any output: the log may be shipped where those must not go.
"""

from __future__ import annotations

import logging
from typing import Any

import trio
from trio_websocket import CloseReason

log = logging.getLogger("toolwire.server")


def peer_of(stream: trio.abc.Stream) -> str:
    """`host:port` of the other end ("?" when the stream is not a socket)."""
    inner = stream.transport_stream if isinstance(stream, trio.SSLStream) else stream
    if not isinstance(inner, trio.SocketStream):
        return "?"
    try:
        address = inner.socket.getpeername()
    except OSError:
        return "?"
    if isinstance(address, tuple) and len(address) >= 2:
        host, port = address[0], address[1]
        return f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}"
    return str(address)


def opened(conn: int, peer: str, subprotocol: str | None) -> None:
    log.info(
        "connection opened",
        extra={"conn": conn, "peer": peer, "subprotocol": subprotocol or "toolwire.v1.json"},
    )


def closed(conn: int, peer: str, subprotocol: str | None, reason: CloseReason | None) -> None:
    extra: dict[str, Any] = {
        "conn": conn,
        "peer": peer,
        "subprotocol": subprotocol or "toolwire.v1.json",
    }
    if reason is not None:
        extra["close_code"] = reason.code
    log.info("connection closed", extra=extra)


def plain_request(peer: str, method: bytes, path: str, status: int) -> None:
    # Probes come every few seconds: debug, so they do not drown the log at the default level.
    if log.isEnabledFor(logging.DEBUG):
        log.debug(
            "http request",
            extra={
                "peer": peer,
                "method": method.decode("ascii", "replace"),
                "path": path,
                "status": status,
            },
        )


def origin_refused(origin: str) -> None:
    log.warning("browser handshake refused (403)", extra={"origin": origin})


def error_sent(
    conn: int, code: str, message: str, rid: Any, chat_id: str | None, call_id: str | None
) -> None:
    """One `error` message went to a client. `message` is the agent's own text (it names a
    field path or a limit, never a value the client sent)."""
    if log.isEnabledFor(logging.INFO):
        extra: dict[str, Any] = {"conn": conn, "code": code, "error": message}
        if rid is not None:
            extra["rid"] = rid
        if chat_id is not None:
            extra["chat_id"] = chat_id
        if call_id is not None:
            extra["call_id"] = call_id
        log.info("error sent", extra=extra)
