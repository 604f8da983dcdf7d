"""The client's API, the same for both shells: requests in async/await form over `ClientState`.

    async with connect("ws://127.0.0.1:7411/v1", token) as client:
        call_id = tool_call_id(chat_id, message_id, provider_call_id)   # transport/ids.py
        handle = await client.call(chat_id, call_id, "execute", {"command": "make test"})
        async for event in handle:              # Started, Output, Approval, ApprovalResolved
            if isinstance(event, protocol.Output):
                print(event.data, end="")
        result = await handle.result()          # exactly once, whatever was retried
        outcomes = await client.cancel_and_collect(chat_id, [call_id])   # id -> final Result
        await client.interrupt(chat_id)          # end the chat's unresolved calls

One `Client` is one logical connection to an agent (PROTOCOL.md). Every decision is
`ClientState`'s; this class only waits: it registers a request, hands its frame to the shell's
`_send_frame`, and awaits the request's flag. The shell (`session.py` on trio, `aio.py` on
asyncio) owns the socket: connect, read (each frame into `ClientState.receive`), keepalive,
reconnect with `ClientState.after_loss`'s delay, close.

Resume (`reconnect=True`, the default): when the connection is lost (not on `aclose`), the
client reconnects with exponential backoff and jitter, re-`attach`es every unfinished call from
the last byte offset it knows exactly (see `OutputCursor`), and re-sends unanswered requests
that are idempotent by design: `call` (at most once per call id), `attach`, `cancel` (a repeat
returns the saved result), `turn` (a repeated turn_id attaches) and `interrupt`. Output is
de-duplicated by byte offset, so every handle sees each byte once, in order, and its one result.
`approve` is not idempotent (a second one is `not_parked`), so an `approve` in flight when the
connection drops raises `ConnectionLost`: it may or may not have been applied, and the call's
events tell. If the agent restarted meanwhile (`welcome.boot_id` changed), the client goes on:
the agent's journal answers the re-attaches, and a call it has no record of fails its handle
with `RequestError("unknown_call")`.
"""

from __future__ import annotations

import ssl
import urllib.parse
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any, Literal

import msgspec

from toolwire.transport import protocol
from toolwire.transport.client.handles import CallHandle, FlagFactory, TurnHandle
from toolwire.transport.client.requests import RequestState
from toolwire.transport.client.runtime import TaskRuntime
from toolwire.transport.client.state import ClientState
from toolwire.transport.codec import SUBPROTOCOLS, Codec, Encoding

__all__ = ["CallSpecLike", "ClientAPI"]

CallSpecLike = protocol.CallSpec | dict[str, Any]


class ClientAPI:
    """What a caller uses; a shell subclasses it and supplies the connection (`_send_frame`)."""

    def __init__(
        self,
        url: str,
        token: str | None,
        encoding: Encoding,
        make_flag: FlagFactory,
        *,
        reconnect: bool,
        backoff_initial_s: float,
        backoff_max_s: float,
        ssl_context: ssl.SSLContext | None,
        runtime: TaskRuntime,
    ) -> None:
        if encoding not in ("json", "msgpack"):
            raise ValueError(f"encoding must be 'json' or 'msgpack', not {encoding!r}")
        if backoff_initial_s <= 0 or backoff_max_s < backoff_initial_s:
            raise ValueError("need 0 < backoff_initial_s <= backoff_max_s")
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("ws", "wss") or not parts.hostname:
            raise ValueError(f"not a ws:// or wss:// URL: {url!r}")
        self.url = url
        self.encoding: Encoding = encoding
        # The shell's tasks, cancellation and shielding, for the executor (executor.py).
        self.runtime = runtime
        self.backoff_initial_s = backoff_initial_s
        self.backoff_max_s = backoff_max_s
        self._host = parts.hostname
        self._port = parts.port or (443 if parts.scheme == "wss" else 80)
        host = f"[{self._host}]" if ":" in self._host else self._host
        self._host_header = host if parts.port is None else f"{host}:{self._port}"
        self._resource = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        self._ssl: ssl.SSLContext | None = None
        if parts.scheme == "wss":
            self._ssl = ssl_context or ssl.create_default_context()
        self._authorization = f"Bearer {token}" if token else None
        self._subprotocol = next(name for name, enc in SUBPROTOCOLS.items() if enc == encoding)
        self._state = ClientState(
            Codec(encoding, side="client"),
            make_flag,
            reconnect=reconnect,
            backoff_initial_s=backoff_initial_s,
            backoff_max_s=backoff_max_s,
        )

    # -- state -------------------------------------------------------------------------------

    @property
    def reconnect(self) -> bool:
        """Whether a lost connection is re-established (else what is unfinished fails)."""
        return self._state.reconnect

    @reconnect.setter
    def reconnect(self, value: bool) -> None:
        self._state.reconnect = value

    @property
    def connections(self) -> int:
        """Successful connects, the first included."""
        return self._state.connections

    @property
    def errors(self) -> list[protocol.Error]:
        """`error` messages that answered no request of ours (the newest 1,000)."""
        return self._state.errors

    @property
    def welcome(self) -> protocol.Welcome:
        """The `welcome` of the current (or last) connection."""
        assert self._state.welcome is not None, "not connected yet"
        return self._state.welcome

    @property
    def boot_id(self) -> str:
        return self.welcome.boot_id

    @property
    def connected(self) -> bool:
        return self._state.live

    async def wait_connections(self, count: int) -> None:
        """Wait until the client has connected `count` times in all (`connections`): after a
        lost connection, `wait_connections(client.connections + 1)` waits for the reconnect.
        Raises ConnectionLost if the client stops first."""
        while self._state.connections < count:
            self._state.check_usable()
            await self._state.connection_changed.wait()

    def handle(self, chat_id: str, call_id: str) -> CallHandle | None:
        """The unfinished handle this client holds for a call, if any."""
        return self._state.handles.get((chat_id, call_id))

    # -- requests ----------------------------------------------------------------------------

    async def call(
        self,
        chat_id: str,
        call_id: str,
        tool: str,
        args: dict[str, Any],
        *,
        timeout_ms: int | None = None,
        background: bool = False,
        approval: bool = False,
        stream: bool = True,
        sandbox: protocol.Sandbox | dict[str, Any] | None = None,
        from_offset: int = 0,
    ) -> CallHandle:
        """Send `call` and return once it is `accepted`; raise RequestError on `error`.

        At most once per (chat_id, call_id): a repeat gets the same call's events and its
        saved result. `stream=False` asks only for accepted/approval/result (no output kept).
        `sandbox` (PROTOCOL.md 10.4, e.g. `{"filesystem": "workspace_write", "network":
        False}`) confines the command; where the agent's kernel cannot enforce it, this raises
        RequestError("sandbox_unsupported") and nothing ran. It is part of what the call id
        stands for: a repeat with another sandbox raises RequestError("conflict").

        `from_offset` (PROTOCOL.md 10.2): the output this caller already has of the call (saved
        across a restart of the caller), so the handle yields only bytes from that offset on.
        An agent with the feature `call_from_offset` starts sending there; an older one ignores
        the field and sends from 0, and the handle drops what lies before it: either way
        nothing is shown twice, and the result is the same.
        """
        if from_offset < 0:
            raise ValueError(f"from_offset must be >= 0, not {from_offset}")
        message = protocol.Call(
            rid=self._state.next_rid(),
            chat_id=chat_id,
            call_id=call_id,
            tool=tool,
            args=args,
            timeout_ms=timeout_ms,
            background=background,
            approval=approval,
            stream=stream,
            sandbox=None if sandbox is None else msgspec.convert(sandbox, protocol.Sandbox),
            from_offset=from_offset,
        )
        request = self._state.call(message)
        await self._roundtrip(request)
        assert request.handle is not None
        return request.handle

    async def attach(self, chat_id: str, call_id: str, from_offset: int = 0) -> CallHandle:
        """Follow an existing call from `from_offset`: retained output, then live events, then
        its result. RequestError("unknown_call") if the agent has no record of it."""
        request = self._state.attach(chat_id, call_id, from_offset, stream=True)
        await self._roundtrip(request)
        assert request.handle is not None
        return request.handle

    async def detach(self, chat_id: str, call_id: str) -> None:
        """Stop following a call (it goes on). Its handle fails with `Detached`. The agent does
        not answer a detach; an `unknown_call` error for it lands in `errors`."""
        frame = self._state.detach(chat_id, call_id)
        if frame is not None:
            await self._send_frame(frame)

    async def cancel(
        self, chat_id: str, call_ids: Sequence[str]
    ) -> dict[str, protocol.CancelResult]:
        """Cancel calls (PROTOCOL.md 5.3); waits for one `cancel_result` per distinct id.

        A cancel of a running call waits for it to end (SIGTERM, then SIGKILL after the
        agent's grace), so this can take `kill_grace_ms`. Safe to repeat.
        """
        ids = list(dict.fromkeys(call_ids))
        if not ids:
            return {}
        request = self._state.cancel(chat_id, ids)
        await self._roundtrip(request)
        return {call_id: request.cancel_results[call_id] for call_id in ids}

    async def cancel_and_collect(
        self, chat_id: str, call_ids: Sequence[str]
    ) -> dict[str, protocol.Result]:
        """Cancel many calls at once and map each id to its truthful final result: `not_run`
        for one that never ran (also an id the agent never saw), `canceled` with the output
        so far for one that was running, and the real result for one that had finished."""
        return {
            call_id: reply.result
            for call_id, reply in (await self.cancel(chat_id, call_ids)).items()
        }

    async def approve(
        self,
        chat_id: str,
        call_id: str,
        approved: bool,
        reason: str | None = None,
        scope: Literal["call", "chat"] = "call",
    ) -> protocol.ApprovalResolved:
        """Answer a parked approval gate; returns the `approval_resolved` that closed it.

        `scope="chat"` with `approved=True` approves the call's tool for the whole chat
        (PROTOCOL.md 9.5): its other parked gates open too, and later calls of it run with no
        gate. `reason` goes with a denial into the call's `denied` text.

        The agent sends no direct reply to a successful `approve`: the approving connection,
        like every follower of the call, gets `approval_resolved` (docs/protocol.md), and a
        failed one gets an `error` with our rid. So this waits for whichever comes first: an
        `approval_resolved` for this call with our decision, or the error, raised as
        RequestError (`not_parked`, `unknown_call`).

        Caveat: if another client answers the same gate the same way at the same moment, its
        `approval_resolved` may be taken for ours (the effect is the one asked for; our late
        `not_parked` then lands in `errors`). A different decision is never mistaken for ours.
        `approve` is not idempotent, so it is not re-sent: one in flight when the connection
        drops raises ConnectionLost (the call's events and result tell what happened).
        """
        message = protocol.Approve(
            rid=self._state.next_rid(),
            chat_id=chat_id,
            call_id=call_id,
            approved=approved,
            reason=reason,
            scope=scope,
        )
        request = self._state.approve(message)
        await self._roundtrip(request)
        assert request.resolved is not None
        return request.resolved

    def approvals(self) -> AsyncIterator[protocol.Approval]:
        """Every `approval` this client receives, from any call it follows (also the calls of
        `stream=False` turns), once per gate, in arrival order; ends when the client closes.
        Approvals are kept from the start, so none is missed by iterating late; the iterator
        is shared: consume it from one task."""
        return self._state.approvals

    async def turn(
        self,
        chat_id: str,
        turn_id: str,
        calls: Sequence[CallSpecLike],
        stream: bool = True,
        from_offsets: Mapping[str, int] | None = None,
    ) -> TurnHandle:
        """Run a batch with the read/write planner (PROTOCOL.md 5.6). Returns once the plan
        (and, with stream=True, every call's `accepted`) arrived; RequestError on `error`.
        With stream=True, `handle.calls[call_id]` follows each call.

        `from_offsets`: the output this caller already has of some of the calls (by call id),
        as `call(from_offset=...)` takes it. A turn's call specs carry no offset on the wire
        (PROTOCOL.md 10.2 names `call` only), so the agent sends each call's output from 0 and
        its handle drops the bytes before its offset: nothing is shown twice."""
        specs: list[protocol.CallSpec] = []
        for spec in calls:
            if isinstance(spec, protocol.CallSpec):
                specs.append(spec)
                continue
            try:
                specs.append(msgspec.convert(spec, protocol.CallSpec))
            except msgspec.ValidationError as exc:
                raise ValueError(f"bad call spec {spec!r}: {exc}") from None
        message = protocol.Turn(
            rid=self._state.next_rid(), chat_id=chat_id, turn_id=turn_id, calls=specs, stream=stream
        )
        request, turn = self._state.turn(message, from_offsets or {})
        await self._roundtrip(request)
        if request.turn is turn:  # a new turn, not a repeat of one we follow
            for handle in turn.calls.values():
                await handle.wait_accepted()
        return turn

    async def interrupt(self, chat_id: str, turn_id: str | None = None) -> list[str]:
        """Cancel every unresolved call of the chat (or of one turn); returns once the agent
        says the chat is quiet (`interrupted`), with the ids of the calls it ended."""
        request = self._state.interrupt(chat_id, turn_id)
        await self._roundtrip(request)
        assert request.interrupted is not None
        return request.interrupted.call_ids

    async def close_chat(self, chat_id: str) -> protocol.ChatClosed:
        """Close the chat (PROTOCOL.md 9.6): its unresolved calls end, its processes are
        stopped; returns the agent's `chat_closed` (the calls it ended, the processes it
        stopped). A new call in it fails with `chat_closed` until its records are forgotten."""
        request = self._state.close_chat(chat_id)
        await self._roundtrip(request)
        assert request.chat_closed is not None
        return request.chat_closed

    async def describe_tools(self) -> list[protocol.ToolDefinition]:
        """The agent's tools as a model is given them (PROTOCOL.md 10.3), in the order of
        `welcome.tools`: name, description, input_schema (JSON Schema 2020-12 of the args,
        self-contained) and effect ("read", "write" or "process"). Raises RequestError
        (`bad_message`) from an agent that does not have `describe_tools` in its features."""
        request = self._state.describe_tools()
        await self._roundtrip(request)
        assert request.tool_definitions is not None
        return request.tool_definitions.tools

    # -- plumbing ------------------------------------------------------------------------------

    async def _roundtrip(self, request: RequestState) -> None:
        """Register, send, and wait for the reply; raise the request's error if it failed."""
        self._state.register(request)
        completed = False
        try:
            frame = self._state.frame_to_send(request)
            if frame is not None:
                await self._send_frame(frame)
            await request.done.wait()
            completed = True
        finally:
            if not completed:
                self._state.abandon(request)
        if request.error is not None:
            raise request.error

    async def _resubscribe(self, gen: int) -> None:
        """After connect `gen`: send what `ClientState.resubscribe` says, pass after pass,
        until it says nothing is left (then requests go out directly again)."""
        first = True
        while (batch := self._state.resubscribe(gen, first)) is not None:
            first = False
            for request in batch:
                frame = self._state.resend_frame(request, gen)
                if frame is not None:
                    await self._send_frame(frame)

    async def _send_frame(self, frame: str | bytes) -> None:
        """Send one frame on the current connection; a failure is left to the reader, which
        sees the loss (the request is re-sent or failed after it)."""
        raise NotImplementedError
