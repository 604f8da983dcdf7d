"""The replaced design, rebuilt faithfully: request/response over HTTP/1.1 keep-alive, on trio.

This is how the anchor's workspace agent and chat server talk (ANCHORS.md): start a tool call
with one request, then ask for its output with another, blocking at most `wait_ms`, and poll
every N ms for progress. It runs the calls through the SAME actors as toolwire (`Agent`,
`ChatActor`): the server holds one `Outbox` per call and reads the call's events from it, so
the benchmark compares only the wire design, never two implementations of the tools.

Endpoints (JSON bodies; `Authorization: Bearer <token>` on every request, as the anchor's
agent API requires):
- `POST /start?wait_ms=M` `{chat_id, call_id, tool, args, timeout_ms?}`: start the call (at most
  once, by the agent's records) and wait up to M ms for its end. Replies `{done, state, result,
  next_offset}`: a short call (a file read) costs one round trip, the best case of the design.
- `GET /output?chat_id=&call_id=&offset=N&wait_ms=M`: output from byte offset N; waits up to M
  ms for new output or the end. Replies `{offset, data, next_offset, started, done, result}`.

The server forgets a call's state (its outbox and output chunks) once a reply has carried its
result, as toolwire's connection forgets a call it has sent the result of: memory then stays
flat however many calls pass, and the baseline pays no growing dict. A repeated `/start` of
that call gets its saved result again from the agent (a repeat); `/output` of it: 404.
- `POST /cancel` `{chat_id, call_ids}`: cancel, and reply once every call has its result
  (`{results: [{call_id, received, result}]}`), as the anchor's cancel does.

`python -m toolwire.benchmarks.http_baseline --workspace DIR --token T [--journal sqlite
--state-dir DIR]` serves it on 127.0.0.1 port 0 and prints `PORT <n>`. `HttpClient` is the
matching hand-written keep-alive client.
"""

from __future__ import annotations

import argparse
import hmac
import signal
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import h11
import msgspec
import trio

from toolwire.actors.agent import Agent, AgentContext
from toolwire.actors.chat import CallSpec
from toolwire.actors.events import CancelResultEvent, OutputEvent, ResultEvent, StartedEvent
from toolwire.actors.journal import open_journal
from toolwire.actors.outbox import Outbox
from toolwire.actors.results import Result, ToolwireError

# Bytes per socket read, as toolwire's server reads.
RECEIVE_BYTES = 64 * 1024
# The anchor's agent caps a blocking output wait at 5 minutes.
MAX_WAIT_MS = 5 * 60 * 1000


class StartRequest(msgspec.Struct):
    chat_id: str
    call_id: str
    tool: str
    args: dict[str, Any]
    timeout_ms: int | None = None


class CancelRequest(msgspec.Struct):
    chat_id: str
    call_ids: list[str]


@dataclass(eq=False)
class CallState:
    """What the HTTP server knows of one call: the events its outbox delivered so far."""

    outbox: Outbox
    chunks: list[tuple[int, str]] = field(default_factory=list)  # (byte offset, text)
    next_offset: int = 0
    started: bool = False
    result: Result | None = None

    def drain(self) -> None:
        while len(self.outbox):
            for event in self.outbox.take(1024):
                if isinstance(event, OutputEvent):
                    self.chunks.append((event.offset, event.data))
                    self.next_offset = event.offset + len(event.data.encode())
                elif isinstance(event, StartedEvent):
                    self.started = True
                elif isinstance(event, ResultEvent):
                    self.result = event.result

    def output_from(self, offset: int) -> tuple[int, str]:
        """The retained text from `offset` (resuming at the first chunk at or after it)."""
        picked = [(o, d) for o, d in self.chunks if o >= offset]
        if not picked:
            return self.next_offset, ""
        return picked[0][0], "".join(d for _, d in picked)

    async def wait(self, wait_ms: int, ready: Any) -> None:
        """Drain, then wait up to `wait_ms` until `ready()` holds."""
        self.drain()
        if ready() or wait_ms <= 0:
            return
        with trio.move_on_after(min(wait_ms, MAX_WAIT_MS) / 1000):
            while not ready():
                await self.outbox.wait()
                self.drain()


class HttpError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class BaselineServer:
    def __init__(self, agent: Agent, token: str) -> None:
        self.agent = agent
        self._expected_auth = f"Bearer {token}".encode()
        self.calls: dict[tuple[str, str], CallState] = {}
        self._encoder = msgspec.json.Encoder()
        self._start_decoder = msgspec.json.Decoder(StartRequest)
        self._cancel_decoder = msgspec.json.Decoder(CancelRequest)

    async def handle(self, stream: trio.abc.Stream) -> None:
        conn = h11.Connection(h11.SERVER)
        try:
            while True:
                request, body = await self._read_request(conn, stream)
                if request is None:
                    return
                try:
                    status, payload = await self._route(request, body)
                except HttpError as exc:
                    status, payload = exc.status, {"error": exc.message}
                data = self._encoder.encode(payload)
                headers = [("Content-Type", "application/json"), ("Content-Length", str(len(data)))]
                out = _send(conn, h11.Response(status_code=status, headers=headers))
                out += _send(conn, h11.Data(data=data))
                out += _send(conn, h11.EndOfMessage())
                await stream.send_all(out)
                if conn.our_state is h11.MUST_CLOSE:
                    return
                conn.start_next_cycle()
        except (trio.BrokenResourceError, trio.ClosedResourceError, h11.RemoteProtocolError):
            pass
        finally:
            await trio.aclose_forcefully(stream)

    async def _read_request(
        self, conn: h11.Connection, stream: trio.abc.Stream
    ) -> tuple[h11.Request | None, bytes]:
        request: h11.Request | None = None
        body = bytearray()
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                conn.receive_data(bytes(await stream.receive_some(RECEIVE_BYTES)))
                continue
            if isinstance(event, h11.Request):
                request = event
            elif isinstance(event, h11.Data):
                body += event.data
            elif isinstance(event, h11.EndOfMessage):
                return request, bytes(body)
            elif isinstance(event, h11.ConnectionClosed):
                return None, b""

    async def _route(self, request: h11.Request, body: bytes) -> tuple[int, Any]:
        self._check_auth(request.headers)
        target = request.target.decode()
        path, _, query = target.partition("?")
        params = dict(urllib.parse.parse_qsl(query))
        if request.method == b"POST" and path == "/start":
            return await self._start(body, _int(params, "wait_ms", 0))
        if request.method == b"GET" and path == "/output":
            return await self._output(params)
        if request.method == b"POST" and path == "/cancel":
            return await self._cancel(body)
        raise HttpError(404, f"no route {request.method.decode()} {path}")

    def _check_auth(self, headers: Any) -> None:
        for name, value in headers:
            if name == b"authorization":
                if hmac.compare_digest(value, self._expected_auth):
                    return
                break
        raise HttpError(401, "missing or wrong bearer token")

    async def _start(self, body: bytes, wait_ms: int) -> tuple[int, Any]:
        try:
            req = self._start_decoder.decode(body)
        except msgspec.DecodeError as exc:
            raise HttpError(400, str(exc)) from None
        key = (req.chat_id, req.call_id)
        state = self.calls.get(key)
        if state is None:
            state = CallState(Outbox(f"http-{req.call_id}"))
            spec = CallSpec(req.call_id, req.tool, req.args, req.timeout_ms)
            try:
                self.agent.call(state.outbox, req.chat_id, spec, stream=True, rid=None)
            except ToolwireError as exc:
                raise HttpError(409 if exc.code == "conflict" else 400, exc.message) from None
            self.calls[key] = state
        await state.wait(wait_ms, lambda: state.result is not None)
        if state.result is not None:
            self._forget(key, state)
        return 200, {
            "done": state.result is not None,
            "started": state.started,
            "next_offset": state.next_offset,
            "result": state.result,
        }

    def _forget(self, key: tuple[str, str], state: CallState) -> None:
        """A reply carries the result: nobody asks this call for more (see the module doc)."""
        if self.calls.get(key) is state:
            del self.calls[key]

    async def _output(self, params: dict[str, str]) -> tuple[int, Any]:
        key = (params.get("chat_id", ""), params.get("call_id", ""))
        state = self.calls.get(key)
        if state is None:
            raise HttpError(404, "unknown call")
        offset = _int(params, "offset", 0)
        await state.wait(
            _int(params, "wait_ms", 0),
            lambda: state.result is not None or state.next_offset > offset,
        )
        if state.result is not None:
            self._forget(key, state)
        first, data = state.output_from(offset)
        return 200, {
            "offset": first,
            "data": data,
            "next_offset": state.next_offset,
            "started": state.started,
            "done": state.result is not None,
            "result": state.result,
        }

    async def _cancel(self, body: bytes) -> tuple[int, Any]:
        try:
            req = self._cancel_decoder.decode(body)
        except msgspec.DecodeError as exc:
            raise HttpError(400, str(exc)) from None
        outbox = Outbox("http-cancel")
        self.agent.cancel(outbox, req.chat_id, req.call_ids, None)
        replies: dict[str, Any] = {}
        while len(replies) < len(req.call_ids):
            await outbox.wait()
            for event in outbox.take(1024):
                if isinstance(event, CancelResultEvent):
                    replies[event.call_id] = {
                        "call_id": event.call_id,
                        "received": event.received,
                        "result": event.result,
                    }
        return 200, {"results": [replies[c] for c in req.call_ids]}


def _send(conn: h11.Connection, event: h11.Event) -> bytes:
    return conn.send(event) or b""


def _int(params: dict[str, str], name: str, default: int) -> int:
    try:
        return int(params.get(name, default))
    except ValueError:
        raise HttpError(400, f"{name} must be an integer") from None


# ---------------------------------------------------------------------------------------------
# The client


class HttpClient:
    """One keep-alive HTTP/1.1 connection, one request at a time (as HTTP/1.1 clients do: none
    of the common ones pipeline)."""

    def __init__(self, stream: trio.abc.Stream, token: str) -> None:
        self.stream = stream
        self._conn = h11.Connection(h11.CLIENT)
        self._auth = f"Bearer {token}"
        self._decoder = msgspec.json.Decoder()
        self._encoder = msgspec.json.Encoder()

    async def request(self, method: str, target: str, body: Any = None) -> tuple[int, Any]:
        conn = self._conn
        data = b"" if body is None else self._encoder.encode(body)
        headers = [
            ("Host", "127.0.0.1"),
            ("User-Agent", "toolwire-bench/1"),
            ("Authorization", self._auth),
            ("Content-Length", str(len(data))),
        ]
        if body is not None:
            headers.append(("Content-Type", "application/json"))
        out = _send(conn, h11.Request(method=method, target=target, headers=headers))
        if data:
            out += _send(conn, h11.Data(data=data))
        out += _send(conn, h11.EndOfMessage())
        await self.stream.send_all(out)
        status = 0
        payload = bytearray()
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                conn.receive_data(bytes(await self.stream.receive_some(RECEIVE_BYTES)))
                continue
            if isinstance(event, h11.Response):
                status = event.status_code
            elif isinstance(event, h11.Data):
                payload += event.data
            elif isinstance(event, h11.EndOfMessage):
                break
            elif isinstance(event, h11.ConnectionClosed):
                raise trio.BrokenResourceError("the server closed the connection")
        conn.start_next_cycle()
        return status, self._decoder.decode(payload) if payload else None


# ---------------------------------------------------------------------------------------------
# The server process


async def main(workspace: str, token: str, journal: str = "memory", state_dir: str = "") -> None:
    ctx = AgentContext(
        workspace=workspace, journal=open_journal(journal, Path(state_dir) if state_dir else None)
    )
    async with trio.open_nursery() as nursery:
        agent = await nursery.start(Agent(ctx).run)
        server = BaselineServer(agent, token)
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        port = listeners[0].socket.getsockname()[1]
        nursery.start_soon(trio.serve_listeners, server.handle, listeners)
        print(f"PORT {port}", flush=True)
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async for _ in signals:
                break
        await agent.shutdown()  # as serve's SIGTERM: every call stopped and saved
        nursery.cancel_scope.cancel()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--workspace", required=True)
    parser.add_argument("--token", required=True)
    # The same journal as the toolwire server it is compared with: only the wire differs.
    parser.add_argument("--journal", choices=["memory", "sqlite"], default="memory")
    parser.add_argument("--state-dir", default="")
    args = parser.parse_args()
    trio.run(main, args.workspace, args.token, args.journal, args.state_dir)
