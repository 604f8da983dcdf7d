"""The wire slice: connections through the real WebSocket server instead of a bare Outbox.

In a wire run each simulated connection is a `trio.testing.memory_stream_pair`: the server end
goes to the real `transport.server.Server`'s per-connection handler (handshake, `Session`,
its reader, sender and keepalive), the client end to a trio-websocket client that encodes the
orchestrator's requests with the real codec (JSON or MessagePack, drawn per connection) and
decodes every agent message back into the domain event the checker reads.

The server is given a `RecordingAgent` in front of the real agent: it writes each request into
the trace at the moment the Session hands it over (so the trace orders requests as the agent
saw them, not as they were queued on a socket), then passes it on unchanged.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal, Protocol

from toolwire.actors import events
from toolwire.actors.chat import CallSpec
from toolwire.actors.outbox import Outbox
from toolwire.actors.results import Outcome, Result, ToolwireError
from toolwire.simulation.trace import (
    ApproveReq,
    AttachReq,
    CallReq,
    CancelReq,
    CloseChatReq,
    DetachReq,
    InterruptReq,
    Request,
    TurnReq,
)
from toolwire.transport import protocol
from toolwire.transport.codec import SUBPROTOCOLS

if TYPE_CHECKING:
    from toolwire.actors.agent import Agent

SUBPROTOCOL_NAMES = tuple(SUBPROTOCOLS)


class RequestLog(Protocol):
    """Where a `RecordingAgent` writes what the agent was handed: the `World` of world.py is one
    (named here, not imported, so that imports between the two modules point one way)."""

    def applied(self, outbox: Outbox, req: Request) -> int:
        """The request reaches the agent now: its trace entry."""

    def rejected(self, entry: int, code: str) -> None:
        """The agent refused the request of trace entry `entry` with error `code`."""


class RecordingAgent:
    """What the Server sees as its agent: records each request, then applies it."""

    def __init__(self, world: RequestLog, agent: Agent) -> None:
        self._world = world
        self._agent = agent

    def __getattr__(self, name: str) -> Any:
        return getattr(self._agent, name)

    def _apply(self, outbox: Outbox, req: Request, apply: Callable[[], None]) -> None:
        """Record the request, apply it, and record a refusal (the Session's `error`) with it:
        the checker must know what the agent refused even when the reply is lost."""
        entry = self._world.applied(outbox, req)
        try:
            apply()
        except ToolwireError as exc:
            self._world.rejected(entry, exc.code)
            raise
        except Exception:
            self._world.rejected(entry, "internal")
            raise

    def call(
        self,
        outbox: Outbox,
        chat_id: str,
        spec: CallSpec,
        *,
        stream: bool,
        rid: Any,
        from_offset: int = 0,
    ) -> None:
        # The orchestrator of the simulation never sends `from_offset` (PROTOCOL.md 10.2): the
        # checker's model of output cursors has a `call` start at 0.
        self._apply(
            outbox,
            CallReq(chat_id, rid, spec, stream),
            lambda: self._agent.call(
                outbox, chat_id, spec, stream=stream, rid=rid, from_offset=from_offset
            ),
        )

    def attach(
        self, outbox: Outbox, chat_id: str, call_id: str, from_offset: int, rid: Any
    ) -> None:
        self._apply(
            outbox,
            AttachReq(chat_id, rid, call_id, from_offset),
            lambda: self._agent.attach(outbox, chat_id, call_id, from_offset, rid),
        )

    def detach(self, outbox: Outbox, chat_id: str, call_id: str) -> None:
        self._apply(
            outbox,
            DetachReq(chat_id, 0, call_id),
            lambda: self._agent.detach(outbox, chat_id, call_id),
        )

    def cancel(self, outbox: Outbox, chat_id: str, call_ids: list[str], rid: Any) -> None:
        self._apply(
            outbox,
            CancelReq(chat_id, rid, tuple(call_ids)),
            lambda: self._agent.cancel(outbox, chat_id, call_ids, rid),
        )

    def approve(
        self,
        outbox: Outbox,
        chat_id: str,
        call_id: str,
        approved: bool,
        rid: Any,
        reason: str | None = None,
        scope: Literal["call", "chat"] = "call",
    ) -> None:
        self._apply(
            outbox,
            ApproveReq(chat_id, rid, call_id, approved, scope),
            lambda: self._agent.approve(outbox, chat_id, call_id, approved, rid, reason, scope),
        )

    def turn(
        self,
        outbox: Outbox,
        chat_id: str,
        turn_id: str,
        specs: list[CallSpec],
        *,
        stream: bool,
        rid: Any,
    ) -> None:
        self._apply(
            outbox,
            TurnReq(chat_id, rid, turn_id, tuple(specs), stream),
            lambda: self._agent.turn(outbox, chat_id, turn_id, specs, stream=stream, rid=rid),
        )

    def interrupt(self, outbox: Outbox, chat_id: str, turn_id: str | None, rid: Any) -> None:
        self._apply(
            outbox,
            InterruptReq(chat_id, rid, turn_id),
            lambda: self._agent.interrupt(outbox, chat_id, turn_id, rid),
        )

    def close_chat(self, outbox: Outbox, chat_id: str, rid: Any) -> None:
        self._apply(
            outbox,
            CloseChatReq(chat_id, rid),
            lambda: self._agent.close_chat(outbox, chat_id, rid),
        )


def _spec(spec: CallSpec) -> protocol.CallSpec:
    return protocol.CallSpec(
        call_id=spec.call_id,
        tool=spec.tool,
        args=spec.args,
        timeout_ms=spec.timeout_ms,
        background=spec.background,
        approval=spec.approval,
    )


def to_message(req: Request) -> Any:
    """The wire message a client sends for one request."""
    match req:
        case CallReq():
            s = req.spec
            return protocol.Call(
                chat_id=req.chat,
                call_id=s.call_id,
                tool=s.tool,
                args=s.args,
                timeout_ms=s.timeout_ms,
                background=s.background,
                approval=s.approval,
                stream=req.stream,
                rid=req.rid,
            )
        case AttachReq():
            return protocol.Attach(
                chat_id=req.chat, call_id=req.call_id, from_offset=req.from_offset, rid=req.rid
            )
        case DetachReq():
            return protocol.Detach(chat_id=req.chat, call_id=req.call_id, rid=req.rid)
        case CancelReq():
            return protocol.Cancel(chat_id=req.chat, call_ids=list(req.call_ids), rid=req.rid)
        case ApproveReq():
            return protocol.Approve(
                chat_id=req.chat,
                call_id=req.call_id,
                approved=req.approved,
                scope=req.scope,
                rid=req.rid,
            )
        case TurnReq():
            return protocol.Turn(
                chat_id=req.chat,
                turn_id=req.turn_id,
                calls=[_spec(s) for s in req.specs],
                stream=req.stream,
                rid=req.rid,
            )
        case InterruptReq():
            return protocol.Interrupt(chat_id=req.chat, turn_id=req.turn_id, rid=req.rid)
        case CloseChatReq():
            return protocol.CloseChat(chat_id=req.chat, rid=req.rid)
    raise TypeError(req)


def _result(r: Any) -> Result:
    return Result(
        tool=r.tool,
        outcome=Outcome(r.outcome),
        text=r.text,
        data=r.data,
        output=r.output,
        output_bytes=r.output_bytes,
        truncated_bytes=r.truncated_bytes,
        timed_out=r.timed_out,
        canceled=r.canceled,
        started_at=r.started_at,
        finished_at=r.finished_at,
        wall_ms=r.wall_ms,
    )


def from_message(m: Any) -> events.Event | None:
    """The domain event a wire message carries (None for `welcome`)."""
    match m:
        case protocol.Accepted():
            return events.AcceptedEvent(m.chat_id, m.call_id, m.replay, m.state, m.requests, m.rid)
        case protocol.Output():
            return events.OutputEvent(m.chat_id, m.call_id, m.offset, m.data)
        case protocol.ResultMessage():
            return events.ResultEvent(m.chat_id, m.call_id, _result(m))
        case protocol.Started():
            return events.StartedEvent(m.chat_id, m.call_id, m.started_at, m.pid)
        case protocol.Approval():
            return events.ApprovalEvent(m.chat_id, m.call_id, m.tool, m.args, m.turn_id)
        case protocol.ApprovalResolved():
            return events.ApprovalResolvedEvent(m.chat_id, m.call_id, m.decision)
        case protocol.CancelResult():
            return events.CancelResultEvent(
                m.chat_id, m.call_id, m.received, _result(m.result), m.rid
            )
        case protocol.TurnPlan():
            return events.TurnPlanEvent(m.chat_id, m.turn_id, m.segments, m.rid)
        case protocol.TurnResult():
            return events.TurnResultEvent(m.chat_id, m.turn_id, [_result(r) for r in m.results])
        case protocol.Interrupted():
            return events.InterruptedEvent(m.chat_id, m.turn_id, m.call_ids, m.rid)
        case protocol.ChatClosed():
            return events.ChatClosedEvent(m.chat_id, m.call_ids, m.process_ids, m.rid)
        case protocol.Error():
            return events.ErrorEvent(m.code, m.message, m.rid, m.chat_id, m.call_id)
        case protocol.Welcome():
            return None
    raise TypeError(m)
