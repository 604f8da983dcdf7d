"""The WebSocket server: handshake, auth, one session per connection, keepalive, shutdown.

This is the only module of `transport` that knows `actors`: it hands decoded requests to the
`Agent` and maps the actors' events to wire messages (DESIGN.md, dependency direction).

Per connection: the connection's reader task (trio-websocket's, see `transport/connection.py`)
hands each message to the `Session`, which decodes it and applies it to the agent synchronously;
a sender task drains the connection's outbox (pulling output from per-call cursors), encodes,
and writes; a keepalive task pings. Closing a connection never stops, cancels or loses a call.
"""

from __future__ import annotations

import hmac
import logging
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgspec
import trio
from trio_websocket import ConnectionClosed, WebSocketConnection, WebSocketRequest

from toolwire.actors import events
from toolwire.actors.agent import Agent
from toolwire.actors.chat import CallSpec
from toolwire.actors.outbox import JSON_OUTPUT_CHUNK_BYTES, OUTPUT_CHUNK_BYTES, Outbox
from toolwire.actors.results import Result, ToolwireError
from toolwire.transport import (
    access_control,
    access_log,
    big_messages,
    frames,
    http_status,
    protocol,
    ws_private,
)
from toolwire.transport.big_messages import PreparedMessage
from toolwire.transport.buffered import WriteBufferedStream
from toolwire.transport.codec import SUBPROTOCOLS, Codec, MessageError, choose_subprotocol
from toolwire.transport.connection import DirectConnection, open_server_connection
from toolwire.transport.message_bytes import MessageBytes
from toolwire.transport.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from toolwire.transport.metrics import MetricsPage
from toolwire.transport.sandbox_field import call_sandbox
from toolwire.transport.tool_definitions import tool_definitions

log = logging.getLogger("toolwire.server")

WS_PATH = "/v1"
# Keepalive: a ping every 20 s (the interval asyncio `websockets` and browsers' proxies expect),
# and a connection whose pong is missing for two intervals is closed (PROTOCOL.md 1).
PING_INTERVAL_S = 20.0
# A client has this long to finish the HTTP upgrade; slowloris connections are dropped.
HANDSHAKE_TIMEOUT_S = 10.0
# Events waiting in a connection's outbox above which its reader stops reading requests until
# the sender has caught up to half of it. Replies are a few hundred bytes each, so this bounds a
# client that floods requests without reading to a few MiB. It counts events, never output
# bytes: a sender blocked on bulk output must not stop the reader (see transport/buffered.py).
MAX_QUEUED_EVENTS = 8192
# Bytes per socket read: 64 KiB roughly doubles large-message throughput over the 4 KiB default.
RECEIVE_BUFFER_BYTES = 64 * 1024
# The sender stops taking events while more than this is waiting for the socket, so a stalled
# client holds at most this much per connection; its calls' output waits in their buffers.
SEND_HIGH_WATER_BYTES = 1024 * 1024
# Events encoded per batch before checking the socket: bounds one batch to a few MiB of output.
SEND_BATCH_EVENTS = 32
# How long a closing connection may take to flush its last bytes to a slow peer.
CLOSE_FLUSH_TIMEOUT_S = 1.0
# Close codes (RFC 6455).
CLOSE_GOING_AWAY = 1001
CLOSE_TOO_BIG = 1009
CLOSE_KEEPALIVE = 1011
CLOSE_INTERNAL_ERROR = 1011  # "an unexpected condition prevented the server" (RFC 6455 7.4.1)
# Sent with 1011 when the agent stops because its journal cannot be written (a close reason
# holds at most 123 bytes; the agent's log line names the file and the error).
JOURNAL_FAILED_REASON = "the agent's journal cannot be written; the agent stops"
# A stop for a failed journal gets what a SIGTERM gets (PROTOCOL.md 9.3): the groups' kill
# grace, then this for the results and the closes.
FAILURE_STOP_SLACK_S = 1.0


@dataclass
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 7411
    token: str | None = None  # None: no auth (--insecure-no-auth)
    ssl_context: ssl.SSLContext | None = None
    ping_interval_s: float = PING_INTERVAL_S
    # None: two ping intervals ("misses two pongs"). Tests that ping very often set it apart.
    pong_timeout_s: float | None = None
    # Origins whose WebSocket handshakes are let through (--allow-origin); any other handshake
    # carrying an Origin header is a browser's and gets 403 (PROTOCOL.md 9.8).
    allowed_origins: frozenset[str] = frozenset()


class Server:
    def __init__(self, agent: Agent, config: ServerConfig) -> None:
        self.agent = agent
        self.config = config
        self.port: int | None = None
        self._sessions: set[Session] = set()
        self._listen_scope: trio.CancelScope | None = None
        self._connections: trio.Nursery | None = None
        self._closing = False
        limits = agent.ctx.limits
        # Bytes of messages being received at once, over all connections (issue 27).
        self.message_bytes = MessageBytes(
            limits.max_message_bytes_in_flight, limits.max_message_bytes
        )
        self._metrics_page = MetricsPage(
            agent, lambda: len(self._sessions), lambda: self.message_bytes.held
        )
        # Set once a stop for a failed journal is over (`toolwire serve` then exits 1).
        self.stopped_by_failure = trio.Event()

    async def serve(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        """Listen until shutdown() or cancellation; reports the bound port through `start`."""
        async with trio.open_nursery() as connections:
            self._connections = connections
            connections.start_soon(self._stop_when_agent_fails)
            with trio.CancelScope() as listen_scope:
                self._listen_scope = listen_scope
                listeners = await trio.open_tcp_listeners(self.config.port, host=self.config.host)
                self.port = listeners[0].socket.getsockname()[1]
                task_status.started(self.port)
                await trio.serve_listeners(
                    self.handle_connection, listeners, handler_nursery=connections
                )

    async def shutdown(
        self, code: int = CLOSE_GOING_AWAY, reason: str = "agent shutting down"
    ) -> None:
        """PROTOCOL.md 9.3: stop accepting connections and requests, stop every running call
        and process group and save their results durably (the agent's part), then close every
        connection with 1001 (or `code`)."""
        self._closing = True
        if self._listen_scope is not None:
            self._listen_scope.cancel()
        if self.agent.ready or self.agent.failure is not None:
            await self.agent.shutdown()
        async with trio.open_nursery() as nursery:
            for session in list(self._sessions):
                nursery.start_soon(session.close, code, reason)
        if self._connections is not None:
            self._connections.cancel_scope.cancel()

    async def _stop_when_agent_fails(self) -> None:
        """The agent's journal can no longer write (the agent said why in its log, and
        `/readyz` says 503 from that moment): stop as a SIGTERM stops, the running commands
        with their kill grace, and close every connection with 1011 and the reason."""
        await self.agent.wait_failed()
        with trio.move_on_after(self.agent.ctx.kill_grace_s + FAILURE_STOP_SLACK_S):
            await self.shutdown(CLOSE_INTERNAL_ERROR, JOURNAL_FAILED_REASON)
        self.stopped_by_failure.set()

    # StatusSource: what /readyz and /metrics report (transport/http_status.py).

    def readiness(self) -> str | None:
        if self.agent.failure is not None:
            return "the agent's journal cannot be written; the agent stops"
        if self._closing:
            return "the agent is shutting down"
        if not self.agent.ready:
            return "the agent is recovering its journal"
        return None

    def authorized(self, headers: list[tuple[bytes, bytes]]) -> bool:
        return self.config.token is None or self._authorized(headers)

    def metrics(self) -> tuple[bytes, str]:
        return self._metrics_page.render(), METRICS_CONTENT_TYPE

    async def handle_connection(self, stream: trio.abc.Stream) -> None:
        """Serve one accepted connection to its end: what `serve` runs for each one it accepts,
        and what runs any other byte stream as a connection (the simulation's in-memory ones)."""
        if self.config.ssl_context is not None:
            stream = trio.SSLStream(stream, self.config.ssl_context, server_side=True)
        buffered = WriteBufferedStream(stream)
        peer = access_log.peer_of(stream)
        deadline = trio.current_time() + HANDSHAKE_TIMEOUT_S
        try:
            # Plain HTTP (probes, scrapes) is answered before trio-websocket sees the bytes.
            ws_stream = await self._plain_http_or_replay(stream, buffered, peer, deadline)
            if ws_stream is None:
                return
            async with trio.open_nursery() as nursery:
                nursery.start_soon(buffered.flusher)
                ws: DirectConnection | None = None
                with trio.move_on_at(deadline):
                    connection, request = await open_server_connection(
                        nursery,
                        ws_stream,
                        max_message_bytes=self.agent.ctx.limits.max_message_bytes,
                        receive_buffer_size=RECEIVE_BUFFER_BYTES,
                        message_bytes=self.message_bytes,
                    )
                    if await self._handshake(request):
                        ws = connection
                if ws is not None:
                    session = Session(self, ws, buffered)
                    self._sessions.add(session)
                    access_log.opened(session.id, peer, ws.subprotocol)
                    try:
                        await session.run()
                    finally:
                        self._sessions.discard(session)
                        await session.close(1000, "")
                        access_log.closed(session.id, peer, ws.subprotocol, ws.closed)
                # Flush what is still buffered (a rejection response, a close frame) before
                # the flusher is cancelled with the rest of this connection's tasks.
                with trio.move_on_after(CLOSE_FLUSH_TIMEOUT_S):
                    await buffered.aclose()
                nursery.cancel_scope.cancel()
        except* (
            ConnectionClosed,
            trio.BrokenResourceError,
            trio.ClosedResourceError,
            ssl.SSLError,
        ):
            pass  # the peer vanished mid-handshake or mid-close: nothing of ours is lost
        finally:
            await trio.aclose_forcefully(buffered)

    async def _plain_http_or_replay(
        self,
        stream: trio.abc.Stream,
        buffered: WriteBufferedStream,
        peer: str,
        deadline: float,
    ) -> trio.abc.Stream | None:
        """Answer a plain HTTP request (None: done), or return the stream the WebSocket
        handshake reads: `buffered`, with the bytes read here served first."""
        head = None
        with trio.move_on_at(deadline):
            head = await http_status.read_head(stream)
        if head is None:
            return None  # closed, or too slow to send a request head
        if head.request is not None and not http_status.is_websocket_upgrade(head.request):
            code, path = await http_status.answer(stream, head, self)
            access_log.plain_request(peer, head.request.method, path, code)
            with trio.move_on_after(CLOSE_FLUSH_TIMEOUT_S):
                await stream.aclose()
            return None
        return http_status.ReplayStream(buffered, head.raw)

    async def _handshake(self, request: WebSocketRequest) -> bool:
        """Accept the upgrade, or reject it with the status PROTOCOL.md 1 names (False)."""
        path = request.path.split("?", 1)[0]
        if path != WS_PATH:
            await request.reject(404, body=f"no such path; use {WS_PATH}\n".encode())
            return False
        # Before auth and also without it: a browser page must never reach the agent (9.8).
        origin = access_control.refused_origin(request.headers, self.config.allowed_origins)
        if origin is not None:
            access_log.origin_refused(origin)
            await request.reject(
                403,
                body=b"WebSocket handshakes from browsers are refused; see --allow-origin\n",
            )
            return False
        why_not = self.readiness()
        if why_not is not None:
            # 503 with Retry-After: the client's reconnect loop comes back once recovery ended.
            await request.reject(
                503, extra_headers=[(b"Retry-After", b"1")], body=f"{why_not}\n".encode()
            )
            return False
        if self.config.token is not None and not self._authorized(request.headers):
            await request.reject(
                401,
                extra_headers=[(b"WWW-Authenticate", b"Bearer")],
                body=b"missing or wrong bearer token\n",
            )
            return False
        offered = list(request.proposed_subprotocols)
        chosen = choose_subprotocol(offered)
        if offered and chosen is None:
            body = f"unsupported subprotocols; this agent speaks {', '.join(SUBPROTOCOLS)}\n"
            await request.reject(400, body=body.encode())
            return False
        await request.accept(subprotocol=chosen)
        return True

    def _authorized(self, headers: list[tuple[bytes, bytes]]) -> bool:
        assert self.config.token is not None
        expected = self.config.token.encode()
        for name, value in headers:
            if name.lower() == b"authorization":
                scheme, _, credentials = value.strip().partition(b" ")
                # The scheme is case-insensitive (RFC 7235); the token is compared in constant
                # time, so it cannot be guessed byte by byte from timings.
                return scheme.lower() == b"bearer" and hmac.compare_digest(
                    credentials.strip(), expected
                )
        return False


class BatchWriter:
    """Sends a batch of messages as one write: each becomes its own WebSocket frame (one
    protocol message per WebSocket message), but all frames of the batch are made at once and
    appended to the stream under the connection's send lock in one go.

    Why: `WebSocketConnection.send_message` takes the send lock per message, and taking it is a
    scheduler checkpoint, so every message costs a task switch and usually its own `send`
    syscall. Per-message overhead, not the codec, bounds small-message throughput (issue 6).
    The frames are made by `transport/frames.py` straight from msgspec's bytes. This uses
    internals of trio-websocket (its wsproto connection's state, its send lock, its close
    reason) through `transport/ws_private.py`; the state and locking rules are the ones
    `send_message` follows, so frames from the reader (pongs, close) never interleave with ours
    and no data frame follows a close frame.
    """

    def __init__(self, ws: WebSocketConnection, stream: WriteBufferedStream, *, text: bool) -> None:
        self._ws = ws
        self._stream = stream
        self._lock = ws_private.send_lock(ws)
        self._first = frames.TEXT if text else frames.BINARY

    async def send(self, payloads: list[bytes]) -> None:
        """Send each payload (msgspec's output: UTF-8 JSON for a text connection) as a message."""
        if not payloads:
            return
        ws = self._ws
        if ws_private.close_reason(ws) is not None:
            raise ConnectionClosed(ws_private.close_reason(ws))
        parts = frames.frame_parts(self._first, payloads)
        async with self._lock:
            # Checked under the lock: a close frame may have gone out while we waited for it.
            if not ws_private.is_open(ws):
                # The connection started closing under us: like send_message, report it closed.
                raise ConnectionClosed(ws_private.close_reason(ws))
            await self._stream.send_parts(parts)


class Session:
    """One connection: its outbox, its sender and keepalive tasks, and the `MessageSink` the
    connection's reader hands each request to (`transport/connection.py`)."""

    _next_id = 0

    def __init__(self, server: Server, ws: DirectConnection, stream: WriteBufferedStream):
        Session._next_id += 1
        self.id = Session._next_id
        self.server = server
        self.agent = server.agent
        self.ws = ws
        self.stream = stream
        encoding = SUBPROTOCOLS.get(ws.subprotocol or "", "json")
        self.codec = Codec("msgpack" if encoding == "msgpack" else "json")
        self.outbox = Outbox(
            f"conn-{self.id}",
            output_chunk_bytes=(
                JSON_OUTPUT_CHUNK_BYTES if self.codec.encoding == "json" else OUTPUT_CHUNK_BYTES
            ),
        )
        # Set by the sender after each batch, for whoever waits for the outbox to shrink (the
        # reader when backlogged, the 1009 close); created only while someone waits.
        self._progress: trio.Event | None = None
        self._too_big = trio.Event()
        self._sending = False  # the sender holds a taken batch that is not written yet
        self._handlers: dict[type[Any], Callable[[Any], None]] = {
            protocol.Call: self._on_call,
            protocol.Attach: self._on_attach,
            protocol.Detach: self._on_detach,
            protocol.Cancel: self._on_cancel,
            protocol.Approve: self._on_approve,
            protocol.Turn: self._on_turn,
            protocol.Interrupt: self._on_interrupt,
            protocol.CloseChat: self._on_close_chat,
            protocol.DescribeTools: self._on_describe_tools,
        }

    async def run(self) -> None:
        limits = self.agent.ctx.limits.as_dict()
        # The grace is the agent's (AgentContext), not one of the request limits.
        limits["kill_grace_ms"] = round(self.agent.ctx.kill_grace_s * 1000)
        enforceable = self.agent.ctx.sandbox.limits()
        welcome = protocol.Welcome(
            protocol=protocol.PROTOCOL_VERSION,
            agent_id=self.agent.agent_id,
            boot_id=self.agent.boot_id,
            encoding=self.codec.encoding,
            tools=self.agent.tools,
            limits=protocol.Limits(**limits, sandbox=protocol.SandboxLimits(**enforceable)),
            features=list(protocol.FEATURES)
            + (["sandbox"] if any(enforceable.values()) else [])
            + (["keeps_commands"] if self.agent.ctx.keeper is not None else []),
        )
        try:
            await self.ws.send_message(self.codec.encode(welcome))
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._watch, nursery.cancel_scope)
                nursery.start_soon(self._close_when_too_big, nursery.cancel_scope)
                nursery.start_soon(self._sender)
                nursery.start_soon(self._keepalive)
                # Requests sent right behind the handshake waited in the reader for this.
                self.ws.attach(self)
        except* (ConnectionClosed, trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            self.ws.detach()
            self.outbox.close()
            self._progressed()  # a reader waiting for room reads on (and drops what it reads)
            log.debug("connection %s closed", self.id)

    async def close(self, code: int, reason: str) -> None:
        with trio.move_on_after(CLOSE_FLUSH_TIMEOUT_S):
            await self.ws.aclose(code, reason)

    # MessageSink: called by the connection's reader task, synchronously, per message
    # (`on_message`, below `_close_when_too_big`).

    async def prepare_big_message(self, message: str | bytes) -> PreparedMessage:
        return await big_messages.prepare(self.codec, message)

    def on_too_big(self) -> None:
        self._too_big.set()

    def backlogged(self) -> bool:
        return len(self.outbox) > MAX_QUEUED_EVENTS

    async def wait_for_room(self) -> None:
        while len(self.outbox) > MAX_QUEUED_EVENTS // 2 and not self.outbox.closed:
            await self._wait_progress()

    async def _wait_progress(self) -> None:
        if self._progress is None:
            self._progress = trio.Event()
        await self._progress.wait()

    def _progressed(self) -> None:
        if self._progress is not None:
            self._progress.set()
            self._progress = None

    async def _watch(self, scope: trio.CancelScope) -> None:
        """End the session when the connection closes: trio-websocket closes its (otherwise
        unused) message channel then, whoever closed it."""
        try:
            while True:
                self.on_message(await self.ws.get_message())  # never a message in practice
        except ConnectionClosed:
            pass
        scope.cancel()

    async def _close_when_too_big(self, scope: trio.CancelScope) -> None:
        await self._too_big.wait()
        # The requests before the too-big message were applied and their replies queued: they
        # go out first (for as long as a close may take), then the close frame.
        with trio.move_on_after(CLOSE_FLUSH_TIMEOUT_S):
            while len(self.outbox) or self._sending:
                await self._wait_progress()
        await self.close(CLOSE_TOO_BIG, "message too big")
        scope.cancel()

    def on_message(self, frame: str | bytes, prepared: PreparedMessage | None = None) -> None:
        """Decode one message and apply it, or answer it with an `error`."""
        fingerprints: tuple[bytes | None, ...] | None = None
        try:
            if prepared is None:
                message = self.codec.decode(frame)
            elif prepared.error is not None:
                raise prepared.error
            else:
                message, fingerprints = prepared.message, prepared.fingerprints
        except MessageError as exc:
            self._send_error(events.ErrorEvent("bad_message", exc.message, **exc.envelope))
            return
        try:
            if fingerprints is None:
                self._handlers[type(message)](message)
            elif isinstance(message, protocol.Call):
                self._on_call(message, fingerprints[0])
            else:
                self._on_turn(message, fingerprints)
        except ToolwireError as exc:
            # The envelope is read only for a refusal: a request taken needs none of it.
            rid, chat_id, call_id = _envelope(message)
            self._send_error(events.ErrorEvent(exc.code, exc.message, rid, chat_id, call_id))
        except Exception:
            rid, chat_id, call_id = _envelope(message)
            log.exception("request failed inside the agent", extra={"chat_id": chat_id})
            self._send_error(
                events.ErrorEvent(
                    "internal", "the agent failed to handle this request", rid, chat_id, call_id
                )
            )

    def _send_error(self, error: events.ErrorEvent) -> None:
        """Queue an `error` reply, counted (`toolwire_errors_total`) and logged."""
        metrics = self.agent.ctx.metrics
        if metrics is not None:
            metrics.error_sent(error.code)
        access_log.error_sent(
            self.id, error.code, error.message, error.rid, error.chat_id, error.call_id
        )
        self.outbox.put(error)

    def _on_call(self, m: protocol.Call, fingerprint: bytes | None = None) -> None:
        sandbox = call_sandbox(self.agent.ctx, m.tool, m.sandbox)
        spec = CallSpec(
            m.call_id,
            m.tool,
            m.args,
            m.timeout_ms,
            m.background,
            m.approval,
            fingerprint,
            sandbox,
        )
        self.agent.call(
            self.outbox, m.chat_id, spec, stream=m.stream, rid=m.rid, from_offset=m.from_offset
        )

    def _on_attach(self, m: protocol.Attach) -> None:
        self.agent.attach(self.outbox, m.chat_id, m.call_id, m.from_offset, m.rid)

    def _on_detach(self, m: protocol.Detach) -> None:
        self.agent.detach(self.outbox, m.chat_id, m.call_id)

    def _on_cancel(self, m: protocol.Cancel) -> None:
        self.agent.cancel(self.outbox, m.chat_id, m.call_ids, m.rid)

    def _on_approve(self, m: protocol.Approve) -> None:
        self.agent.approve(self.outbox, m.chat_id, m.call_id, m.approved, m.rid, m.reason, m.scope)

    def _on_turn(
        self, m: protocol.Turn, fingerprints: tuple[bytes | None, ...] | None = None
    ) -> None:
        made = fingerprints or (None,) * len(m.calls)
        ctx = self.agent.ctx
        specs = [
            CallSpec(
                c.call_id,
                c.tool,
                c.args,
                c.timeout_ms,
                c.background,
                c.approval,
                fp,
                call_sandbox(ctx, c.tool, c.sandbox),
            )
            for c, fp in zip(m.calls, made, strict=True)
        ]
        self.agent.turn(self.outbox, m.chat_id, m.turn_id, specs, stream=m.stream, rid=m.rid)

    def _on_interrupt(self, m: protocol.Interrupt) -> None:
        self.agent.interrupt(self.outbox, m.chat_id, m.turn_id, m.rid)

    def _on_close_chat(self, m: protocol.CloseChat) -> None:
        self.agent.close_chat(self.outbox, m.chat_id, m.rid)

    def _on_describe_tools(self, m: protocol.DescribeTools) -> None:
        # Names no chat: answered at once, in the order of welcome.tools (PROTOCOL.md 10.3).
        self.outbox.put(events.ToolDefinitionsEvent(list(self.agent.tools), m.rid))

    async def _sender(self) -> None:
        outbox = self.outbox
        encode = self.codec.encode_bytes
        writer = BatchWriter(self.ws, self.stream, text=self.codec.encoding == "json")
        while True:
            await outbox.wait()
            if outbox.closed:
                return
            # Taken events are not in the outbox any more but not on the wire yet: whoever waits
            # for the replies to leave (the 1009 close) must wait for this batch too.
            self._sending = True
            try:
                await writer.send(
                    [encode(to_wire(event)) for event in outbox.take(SEND_BATCH_EVENTS)]
                )
            finally:
                self._sending = False
            self._progressed()
            # Backpressure: a client that does not read stops us here, not its calls.
            await self.stream.wait_writable(SEND_HIGH_WATER_BYTES)

    async def _keepalive(self) -> None:
        config = self.server.config
        interval = config.ping_interval_s
        pong_timeout = config.pong_timeout_s if config.pong_timeout_s is not None else 2 * interval
        while True:
            await trio.sleep(interval)
            with trio.move_on_after(pong_timeout) as scope:
                await self.ws.ping()
            if scope.cancelled_caught:
                log.info("connection %s missed two pongs; closing it", self.id)
                await self.close(CLOSE_KEEPALIVE, "keepalive timeout")
                return


def _envelope(message: Any) -> tuple[Any, str | None, str | None]:
    """A request's `rid`, `chat_id` and `call_id` (None where it has none), for its error."""
    return message.rid, getattr(message, "chat_id", None), getattr(message, "call_id", None)


# ---------------------------------------------------------------------------------------------
# Domain events -> wire messages


def _result_fields(result: Result) -> dict[str, Any]:
    # The domain Result and the wire Result have the same fields (tests/test_codec.py checks
    # it); asdict copies them in C, and Outcome, a StrEnum, encodes as its value.
    return msgspec.structs.asdict(result)


def wire_result(result: Result) -> protocol.Result:
    return protocol.Result(**_result_fields(result))


def to_wire(event: events.Event) -> Any:
    """One domain event as one wire message Struct."""
    match event:
        case events.OutputEvent():
            return protocol.Output(
                chat_id=event.chat_id, call_id=event.call_id, offset=event.offset, data=event.data
            )
        case events.ResultEvent():
            return protocol.ResultMessage(
                chat_id=event.chat_id, call_id=event.call_id, **_result_fields(event.result)
            )
        case events.AcceptedEvent():
            return protocol.Accepted(
                chat_id=event.chat_id,
                call_id=event.call_id,
                replay=event.replay,
                state=event.state,  # type: ignore[arg-type]
                requests=event.requests,
                rid=event.rid,
            )
        case events.StartedEvent():
            return protocol.Started(
                chat_id=event.chat_id,
                call_id=event.call_id,
                started_at=event.started_at,
                pid=event.pid,
            )
        case events.ApprovalEvent():
            return protocol.Approval(
                chat_id=event.chat_id,
                call_id=event.call_id,
                tool=event.tool,
                args=event.args,
                turn_id=event.turn_id,
            )
        case events.ApprovalResolvedEvent():
            return protocol.ApprovalResolved(
                chat_id=event.chat_id,
                call_id=event.call_id,
                decision=event.decision,  # type: ignore[arg-type]
            )
        case events.CancelResultEvent():
            return protocol.CancelResult(
                chat_id=event.chat_id,
                call_id=event.call_id,
                received=event.received,
                result=wire_result(event.result),
                rid=event.rid,
            )
        case events.TurnPlanEvent():
            return protocol.TurnPlan(
                chat_id=event.chat_id,
                turn_id=event.turn_id,
                segments=event.segments,
                rid=event.rid,
            )
        case events.TurnResultEvent():
            return protocol.TurnResult(
                chat_id=event.chat_id,
                turn_id=event.turn_id,
                results=[wire_result(r) for r in event.results],
            )
        case events.InterruptedEvent():
            return protocol.Interrupted(
                chat_id=event.chat_id, turn_id=event.turn_id, call_ids=event.call_ids, rid=event.rid
            )
        case events.ChatClosedEvent():
            return protocol.ChatClosed(
                chat_id=event.chat_id,
                call_ids=event.call_ids,
                process_ids=event.process_ids,
                rid=event.rid,
            )
        case events.ToolDefinitionsEvent():
            return protocol.ToolDefinitions(tools=tool_definitions(event.tools), rid=event.rid)
        case events.ErrorEvent():
            return protocol.Error(
                code=event.code,  # type: ignore[arg-type]
                message=event.message,
                rid=event.rid,
                chat_id=event.chat_id,
                call_id=event.call_id,
            )
    raise TypeError(f"no wire message for {type(event).__name__}")
