"""Simulated orchestrators: chat-server replicas that run a chat's assistant messages.

One `ChatDriver` per chat plays what a chat server does with the model's tool calls: it sends
them (as one `turn`, all at once, or one after another) with Coder-style derived ids, answers
approval gates (sometimes from another replica), interrupts and cancels when its plan says so,
and when its connection dies (or the chat is handed over to another replica) it reconnects and
recovers with the SAME ids: it attaches from the last offset it has or repeats the request.
A driver never checks the agent's promises itself; it only needs every call to end. The
invariant checker judges the trace afterwards.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace

import trio

from toolwire.actors import events
from toolwire.actors.results import Outcome, Result
from toolwire.simulation.scenario import (
    CallPlan,
    ChatPlan,
    MessagePlan,
    RmwPlan,
    rmw_call,
    rmw_token,
)
from toolwire.simulation.trace import (
    NOTE,
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
from toolwire.simulation.world import Conn, Inbox, Reroute, World

# The reply-order moves (PROTOCOL.md 9.9), drawn per message (scenario.reply_order_share).
REPLY_ORDER_MOVES = ("detach-after-call", "repeat-during-replay", "attach-ahead")

# Requests a flaky network may deliver twice (a client that retransmits a frame).
_DUPLICABLE = (CallReq, AttachReq, CancelReq, ApproveReq, TurnReq, CloseChatReq)

# What the agent answers every request with while it shuts down (PROTOCOL.md 9.3): the request
# was refused, not lost, and is sent again once the agent is back.
SHUTTING_DOWN = "shutting down"


@dataclass(eq=False)
class MessageState:
    plan: MessagePlan
    calls: list[CallPlan]
    ids: dict[str, CallPlan]
    results: dict[str, Result] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    turn_results: list[Result] | None = None
    turn_error: str | None = None
    pos: dict[str, int] = field(default_factory=dict)  # contiguous output received
    sent: int = 0  # calls sent so far (sequential mode sends one at a time)
    skipped: bool = False  # an interrupt ended a sequential message: the rest is not sent
    interrupt: InterruptReq | None = None
    interrupted: bool = False
    answering: set[str] = field(default_factory=set)
    rids: dict[int, tuple[str, str | None]] = field(default_factory=dict)
    nursery: trio.Nursery | None = None

    def complete(self) -> bool:
        if self.interrupt is not None and not self.interrupted:
            return False
        if self.plan.mode == "turn":
            return self.turn_results is not None or self.turn_error is not None
        if self.sent < len(self.calls) and not self.skipped:
            return False
        return all(
            c.call_id in self.results or c.call_id in self.errors for c in self.calls[: self.sent]
        )


class ChatDriver:
    def __init__(self, world: World, chat: ChatPlan) -> None:
        self.world = world
        self.chat = chat
        self.scenario = world.plan.scenario
        self.rng = random.Random(f"{world.plan.seed}/driver/{chat.index}")
        self.replica = chat.replica
        self.conn: Conn | None = None
        self.inbox = Inbox()
        self.done_messages = 0
        self.state: MessageState | None = None

    def describe(self) -> str:
        st = self.state
        where = f"chat {self.chat.index} message {self.done_messages}/{len(self.chat.messages)}"
        if st is None:
            return where
        waiting = [
            (c.call_id or "")[:8]
            for c in st.calls[: st.sent]
            if c.call_id not in st.results and c.call_id not in st.errors
        ]
        return (
            f"{where} ({st.plan.mode}): waiting for results of {waiting}, "
            f"turn_result={'yes' if st.turn_results is not None else 'no'}, "
            f"interrupt={'pending' if st.interrupt and not st.interrupted else 'none'}"
        )

    # -- connection ----------------------------------------------------------------------------

    async def _connect(self) -> None:
        old = self.conn
        if old is not None and old.routes.get(self.chat.chat_id) is self.inbox:
            del old.routes[self.chat.chat_id]
        self.inbox.reroute = None
        self.conn = await self.world.conn_for(self.replica)
        self.conn.routes[self.chat.chat_id] = self.inbox

    def send(self, st: MessageState | None, req: Request, kind: str, call_id: str | None) -> None:
        assert self.conn is not None
        if st is not None:
            st.rids[req.rid] = (kind, call_id)
        sent = self.world.send(self.conn, req)
        if (
            sent
            and isinstance(req, _DUPLICABLE)
            and self.rng.random() < self.scenario.duplicate_share
        ):
            self.world.trace.fault(self.world.now(), "duplicate", f"#{req.rid}")
            self.world.send(self.conn, req)

    def rid(self) -> int:
        return self.world.next_rid()

    # -- the chat ------------------------------------------------------------------------------

    async def run(self) -> None:
        await self._connect()
        for message in self.chat.messages:
            if message.rmw is not None:
                await self._run_rmw(message, message.rmw)
            else:
                await self._run_message(message)
            self.done_messages += 1
        self.state = None

    # -- read-modify-write cycles --------------------------------------------------------------

    async def _run_rmw(self, plan: MessagePlan, rmw: RmwPlan) -> None:
        """Read the shared file, write it back expecting the digest read; when the write fails
        because the file changed meanwhile, start over, up to `rmw.attempts` times. Each step
        is a one-call message: retried, attached, handed over and approved like any other."""
        moves = list(plan.moves)  # the first write of the cycle gets the planned moves
        for attempt in range(rmw.attempts):
            read = self._rmw_call(plan, attempt, "r", "read_file", {"path": rmw.path})
            result = await self._run_step(plan, read, [])
            if result is None or result.outcome is not Outcome.COMPLETED or not result.data:
                continue  # interrupted by a crash (unknown) or a cancel: read again
            digest, content = str(result.data["sha256"]), str(result.data["content"])
            token = rmw_token(self.chat.index, plan.message_id, attempt, "w")
            args: dict[str, object]
            if rmw.tool == "write_file":
                new = f"{token}\n{content}"
                args = {"path": rmw.path, "content": new, "expected_sha256": digest}
            else:
                first = content.split("\n", 1)[0]
                edit = {"old": first, "new": f"{token}\n{first}"}
                args = {"files": [{"path": rmw.path, "edits": [edit], "expected_sha256": digest}]}
            write = self._rmw_call(plan, attempt, "w", rmw.tool, args)
            result = await self._run_step(plan, write, moves)
            moves = []
            changed = (
                result is not None
                and result.outcome is Outcome.FAILED
                and result.data is not None
                and "actual_sha256" in result.data
            )
            if not changed:
                return  # written, or ended some other way (denied, canceled, unknown)

    def _rmw_call(
        self, plan: MessagePlan, attempt: int, step: str, tool: str, args: dict[str, object]
    ) -> CallPlan:
        call = rmw_call(self.world.plan, self.chat, plan, attempt, step, tool, args)
        self.world.register_call(self.chat.chat_id, call)
        return call

    async def _run_step(
        self, plan: MessagePlan, call: CallPlan, moves: list[tuple[float, str]]
    ) -> Result | None:
        step = MessagePlan(plan.message_id, "sequential", plan.stream, [call], moves=moves)
        await self._run_message(step)
        assert self.state is not None and call.call_id is not None
        return self.state.results.get(call.call_id)

    async def _run_message(self, plan: MessagePlan) -> None:
        calls = plan.sendable
        if len(calls) < len(plan.calls):
            self.world.trace.add(
                NOTE,
                self.world.now(),
                f"chat {self.chat.index} message {plan.message_id}: "
                f"{len(plan.calls) - len(calls)} calls with unusable provider ids not sent",
            )
        st = MessageState(plan, calls, {c.call_id: c for c in calls if c.call_id is not None})
        self.state = st
        if not calls:
            return
        async with trio.open_nursery() as nursery:
            st.nursery = nursery
            self._send_initial(st)
            for delay, move in plan.moves:
                nursery.start_soon(self._move, st, delay, move)
            while not st.complete():
                try:
                    event = await self.inbox.get()
                except Reroute as reroute:
                    await self._recover(st, reroute.reason)
                    continue
                self._handle(st, event)
            nursery.cancel_scope.cancel()

    def _send_call(self, st: MessageState, call: CallPlan) -> None:
        self.send(
            st,
            CallReq(self.chat.chat_id, self.rid(), call.spec, st.plan.stream),
            "call",
            call.call_id,
        )

    def _send_turn(self, st: MessageState) -> None:
        req = TurnReq(
            self.chat.chat_id,
            self.rid(),
            st.plan.turn_id,
            tuple(c.spec for c in st.calls),
            st.plan.stream,
        )
        self.send(st, req, "turn", None)

    def _send_initial(self, st: MessageState) -> None:
        if st.plan.mode == "turn":
            st.sent = len(st.calls)
            self._send_turn(st)
        elif st.plan.mode == "parallel":
            st.sent = len(st.calls)
            for call in st.calls:
                self._send_call(st, call)
        else:
            self._send_next(st)

    def _send_next(self, st: MessageState) -> None:
        if st.sent >= len(st.calls) or st.skipped:
            return
        if st.interrupt is not None:
            st.skipped = True  # the model's turn was interrupted: the rest is never asked for
            return
        call = st.calls[st.sent]
        st.sent += 1
        self._send_call(st, call)

    # -- events --------------------------------------------------------------------------------

    def _handle(self, st: MessageState, event: events.Event) -> None:
        match event:
            case events.OutputEvent():
                if event.call_id in st.ids:
                    pos = st.pos.get(event.call_id, 0)
                    if event.offset <= pos:
                        st.pos[event.call_id] = max(pos, event.offset + len(event.data.encode()))
            case events.ResultEvent():
                if event.call_id in st.ids and event.call_id not in st.results:
                    st.results[event.call_id] = event.result
                    if st.plan.mode == "sequential":
                        self._send_next(st)
            case events.TurnResultEvent():
                if event.turn_id == st.plan.turn_id:
                    st.turn_results = event.results
            case events.ApprovalEvent():
                self._gate(st, event.call_id)
            case events.AcceptedEvent():
                # `approval` comes once per gate and connection (PROTOCOL.md 5.0): a driver that
                # left this connection and came back learns of a parked gate from `accepted`.
                if event.state == "awaiting_approval":
                    self._gate(st, event.call_id)
            case events.InterruptedEvent():
                if st.interrupt is not None and event.rid == st.interrupt.rid:
                    st.interrupted = True
                    if st.plan.mode == "sequential":
                        self._send_next(st)
            case events.ErrorEvent():
                self._on_error(st, event)
            case _:
                pass

    def _gate(self, st: MessageState, call_id: str) -> None:
        call = st.ids.get(call_id)
        if call is not None and call_id not in st.answering:
            assert st.nursery is not None
            st.answering.add(call_id)
            st.nursery.start_soon(self._answer, st, call)

    def _on_error(self, st: MessageState, event: events.ErrorEvent) -> None:
        if not isinstance(event.rid, int):
            return
        if event.code == "internal" and SHUTTING_DOWN in event.message:
            # Refused while the agent stops: its connections close next, and the recovery after
            # the restart sends again whatever has no answer.
            return
        kind, call_id = st.rids.get(event.rid, ("", None))
        if kind == "attach" and call_id is not None and event.code == "unknown_call":
            # The agent restarted before this call was journaled: it never ran. Ask again.
            if call_id not in st.results:
                self._send_call(st, st.ids[call_id])
        elif kind == "call" and call_id is not None:
            if call_id not in st.results and call_id not in st.errors:
                st.errors[call_id] = event.code
                if st.plan.mode == "sequential":
                    self._send_next(st)
        elif kind == "turn":
            st.turn_error = event.code

    # -- moves ---------------------------------------------------------------------------------

    async def _answer(self, st: MessageState, call: CallPlan) -> None:
        try:
            await trio.sleep(call.decision_delay)
            if call.decision == "ignore":
                return  # left to expire (the agent has an approval timeout)
            assert call.call_id is not None
            req = ApproveReq(
                self.chat.chat_id,
                self.rid(),
                call.call_id,
                call.decision == "approve",
                call.scope,
            )
            if self.world.plan.replicas > 1 and self.rng.random() < 0.3:
                # Another replica answers (the user clicked in another browser tab).
                other = self.rng.choice(
                    [r for r in range(self.world.plan.replicas) if r != self.replica]
                )
                conn = await self.world.conn_for(other)
                st.rids[req.rid] = ("approve", call.call_id)
                self.world.send(conn, req)
            else:
                self.send(st, req, "approve", call.call_id)
        finally:
            st.answering.discard(call.call_id or "")

    async def _move(self, st: MessageState, delay: float, move: str) -> None:
        await trio.sleep(delay)
        if st.complete() or self.conn is None:
            return
        now = self.world.now()
        chat = self.chat.chat_id
        if move == "interrupt":
            turn_id = (
                st.plan.turn_id if st.plan.mode == "turn" and self.rng.random() < 0.5 else None
            )
            req = InterruptReq(chat, self.rid(), turn_id)
            st.interrupt = req
            self.world.trace.fault(now, "interrupt", f"chat {self.chat.index}")
            self.send(st, req, "interrupt", None)
        elif move == "cancel":
            targets = [c.call_id for c in st.calls[: st.sent] if c.call_id is not None]
            if not targets:
                return
            chosen = self.rng.sample(targets, self.rng.randint(1, min(3, len(targets))))
            self.world.trace.fault(now, "cancel", f"chat {self.chat.index} x{len(chosen)}")
            self.send(st, CancelReq(chat, self.rid(), tuple(chosen)), "cancel", None)
        elif move == "close":
            self.world.trace.fault(now, "close_chat", f"chat {self.chat.index}")
            self.send(None, CloseChatReq(chat, self.rid()), "close", None)
        elif move == "takeover":
            self.world.trace.fault(now, "takeover", f"chat {self.chat.index}")
            self.inbox.signal("takeover")
        elif move in REPLY_ORDER_MOVES:
            self._reply_order_move(st, move)
        elif move.startswith("early-cancel:"):
            target = move.split(":", 1)[1]
            self.world.trace.fault(now, "early_cancel", f"chat {self.chat.index}")
            self.send(None, CancelReq(chat, self.rid(), (target,)), "cancel", None)

    def _reply_order_move(self, st: MessageState, move: str) -> None:
        """Back-to-back requests on one connection whose replies PROTOCOL.md 9.9 orders: a
        `detach` right after a (repeated) `call`, a repeated `call` right after an `attach`
        (so during its replay), and an `attach` from an offset ahead of what was sent."""
        sent = [c for c in st.calls[: st.sent] if c.call_id is not None]
        if st.plan.mode == "turn" or not sent:
            return
        call = self.rng.choice(sent)
        assert call.call_id is not None
        chat = self.chat.chat_id
        self.world.trace.fault(self.world.now(), move, f"chat {self.chat.index}")
        if move == "detach-after-call":
            self._send_call(st, call)
            self.send(None, DetachReq(chat, self.rid(), call.call_id), "detach", call.call_id)
        elif move == "repeat-during-replay":
            req = AttachReq(chat, self.rid(), call.call_id, 0)
            self.send(st, req, "attach", call.call_id)
            self._send_call(st, call)
        else:  # attach-ahead: the cursor must not skip what the connection is still owed
            ahead = st.pos.get(call.call_id, 0) + 1_000_000
            self.send(st, AttachReq(chat, self.rid(), call.call_id, ahead), "attach", call.call_id)

    # -- recovery ------------------------------------------------------------------------------

    async def _recover(self, st: MessageState, reason: str) -> None:
        if reason == "takeover" and self.world.plan.replicas > 1:
            old = self.conn
            others = [r for r in range(self.world.plan.replicas) if r != self.replica]
            self.replica = self.rng.choice(others)
            if old is not None and old.alive and self.rng.random() < 0.4:
                # The old replica lets go of the calls it followed.
                for call in st.calls[: st.sent]:
                    assert call.call_id is not None
                    if call.call_id not in st.results:
                        self.send(
                            None,
                            DetachReq(self.chat.chat_id, self.rid(), call.call_id),
                            "detach",
                            call.call_id,
                        )
        await self._connect()
        interrupt_first = self.rng.random() < 0.5
        if interrupt_first:
            self._resend_interrupt(st)
        if st.plan.mode == "turn":
            if st.turn_results is None and st.turn_error is None:
                self._send_turn(st)
        else:
            for call in st.calls[: st.sent]:
                assert call.call_id is not None
                if call.call_id in st.results or call.call_id in st.errors:
                    continue
                if self.rng.random() < 0.5:
                    req = AttachReq(
                        self.chat.chat_id, self.rid(), call.call_id, st.pos.get(call.call_id, 0)
                    )
                    self.send(st, req, "attach", call.call_id)
                else:
                    self._send_call(st, call)
        if not interrupt_first:
            self._resend_interrupt(st)

    def _resend_interrupt(self, st: MessageState) -> None:
        if st.interrupt is None or st.interrupted:
            return
        st.interrupt = replace(st.interrupt, rid=self.rid())
        self.send(st, st.interrupt, "interrupt", None)
