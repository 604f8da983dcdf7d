"""The client's pure core on its own: `ClientState` under a hypothesis state machine (no event
loop, no socket), `backoff_delay`, and `OutputCursor` (the de-duplication by byte offset).

The state machine plays the agent too, as a small model of PROTOCOL.md's follow rules: a
`call` or `attach` is answered with `accepted` and then the call's output from the offset asked
for, and its result once it has one; output and results go to whoever follows the call on the
live connection; nothing reaches a client between connections. Against it, calls start and
stream, connections drop and come back at any point, results arrive twice, an `approve` is in
flight when the link drops. What the client must keep whatever the interleaving: each handle
has every byte of its output once, in order; its result once, with the whole output; after a
reconnect every unfinished call is followed again and unanswered requests go out in request
order; an `approve` is never re-sent.
"""

from __future__ import annotations

import ast
import itertools
import random
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from toolwire.actors.output import OutputBuffer
from toolwire.transport import protocol
from toolwire.transport.client import ConnectionLost, OutputCursor, RequestError
from toolwire.transport.client.handles import CallHandle
from toolwire.transport.client.requests import RequestState, backoff_delay
from toolwire.transport.client.state import ClientState
from toolwire.transport.codec import Codec

CHAT = "chat"
CALL_IDS = ("a", "b", "c")


class PlainFlag:
    """A Flag for a test without an event loop: it must never be waited on while unset."""

    def __init__(self) -> None:
        self._set = False

    def set(self) -> None:
        self._set = True

    def is_set(self) -> bool:
        return self._set

    async def wait(self) -> None:
        assert self._set, "a pure test waited on a flag nobody set"


def failure(handle: CallHandle) -> BaseException | None:
    """Why a handle ended without a result, or None (unfinished, or ended with one)."""
    if not handle.done:
        return None
    try:
        resolved(handle.result())
    except (RequestError, ConnectionLost) as error:
        return error
    return None


def resolved(coroutine: Coroutine[Any, Any, Any]) -> Any:
    """The value of a coroutine that completes without suspending (its flag is set)."""
    try:
        coroutine.send(None)
    except StopIteration as stop:
        return stop.value
    raise AssertionError("the coroutine suspended")


class AgentModel:
    """The agent's side of the follow rules, one connection at a time."""

    def __init__(self) -> None:
        self.codec = Codec("json")
        self.output: dict[str, bytes] = {}
        self.finished: set[str] = set()
        self.following: dict[str, int] = {}  # call id -> next offset, on the live connection
        self.rids_this_connection: list[int] = []
        self.approves_received: list[int] = []

    def result(self, call_id: str) -> protocol.ResultMessage:
        text = self.output[call_id].decode()
        return protocol.ResultMessage(
            chat_id=CHAT, call_id=call_id, tool="execute", outcome="completed", text="done",
            data=None, output=text, output_bytes=len(self.output[call_id]), truncated_bytes=0,
            timed_out=False, canceled=False, started_at=1, finished_at=2, wall_ms=1,
        )  # fmt: skip

    def on_frame(self, frame: str | bytes) -> list[Any]:
        """The replies to one frame from the client."""
        message = self.codec.decode(frame)
        assert message.rid not in self.rids_this_connection, "a request sent twice"
        self.rids_this_connection.append(message.rid)
        if isinstance(message, protocol.Approve):
            self.approves_received.append(message.rid)
            return []  # never answered here: it is in flight when the link drops
        replay = message.call_id in self.output
        if isinstance(message, protocol.Attach) and not replay:
            return [protocol.Error(rid=message.rid, code="unknown_call", message="unknown")]
        self.output.setdefault(message.call_id, b"")
        state = "done" if message.call_id in self.finished else "running"
        offset = message.from_offset if isinstance(message, protocol.Attach) else 0
        accepted = protocol.Accepted(
            rid=message.rid, chat_id=CHAT, call_id=message.call_id, replay=replay,
            state=state, requests=1,
        )  # fmt: skip
        return [accepted, *self.follow(message.call_id, offset)]

    def follow(self, call_id: str, offset: int) -> list[Any]:
        self.following[call_id] = offset
        return self.catch_up(call_id)

    def catch_up(self, call_id: str) -> list[Any]:
        offset, data = self.following[call_id], self.output[call_id]
        sent: list[Any] = []
        if offset < len(data):
            sent.append(
                protocol.Output(
                    chat_id=CHAT, call_id=call_id, offset=offset, data=data[offset:].decode()
                )
            )
            self.following[call_id] = len(data)
        if call_id in self.finished:
            sent.append(self.result(call_id))
            del self.following[call_id]
        return sent


class ClientStateMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.state = ClientState(Codec("json", side="client"), PlainFlag, rng=random.Random(0))
        self.agent = AgentModel()
        self.handles: dict[str, CallHandle] = {}
        self.approves: list[RequestState] = []
        self.user_rids: set[int] = set()
        self.welcome = protocol.Welcome(
            protocol=1, agent_id="agent", boot_id="boot", encoding="json", tools=["execute"],
            limits=protocol.Limits(
                max_message_bytes=1 << 20, output_retention_bytes=1 << 20,
                result_output_bytes=1 << 16, max_wait_ms=1000, forget_after_s=60,
                exited_retention_s=60, max_processes_per_chat=8,
            ),
        )  # fmt: skip
        self.connect()

    # -- the wire, both ways ---------------------------------------------------------------------

    def to_agent(self, frame: str | bytes | None) -> None:
        if frame is None:
            return
        assert self.state.live
        for reply in self.agent.on_frame(frame):
            self.to_client(reply)

    def to_client(self, message: Any) -> None:
        if self.state.live:
            self.state.receive(self.agent.codec.encode(message))

    def send(self, request: RequestState) -> None:
        self.user_rids.add(request.rid)
        self.state.register(request)
        self.to_agent(self.state.frame_to_send(request))

    # -- rules -----------------------------------------------------------------------------------

    @precondition(lambda self: not self.state.live)
    @rule()
    def connect(self) -> None:
        self.agent.following.clear()
        self.agent.rids_this_connection = []
        gen = self.state.on_connected(self.welcome)
        first = True
        while (batch := self.state.resubscribe(gen, first)) is not None:
            first = False
            for request in batch:
                self.to_agent(self.state.resend_frame(request, gen))

    @precondition(lambda self: self.state.live)
    @rule()
    def disconnect(self) -> None:
        self.state.on_disconnected()

    @rule(call_id=st.sampled_from(CALL_IDS))
    def call(self, call_id: str) -> None:
        message = protocol.Call(
            rid=self.state.next_rid(), chat_id=CHAT, call_id=call_id, tool="execute",
            args={"command": "true"},
        )  # fmt: skip
        request = self.state.call(message)
        assert request.handle is not None
        current = self.handles.get(call_id)
        if current is not None and not current.done:
            assert request.handle is current  # one handle per call per client
        self.handles[call_id] = request.handle
        self.send(request)

    @precondition(lambda self: bool(self.agent.output))
    @rule(data=st.data())
    def attach(self, data: st.DataObject) -> None:
        call_id = data.draw(st.sampled_from(sorted(self.agent.output)))
        request = self.state.attach(CHAT, call_id, 0, stream=True)
        assert request.handle is not None
        self.handles[call_id] = request.handle
        self.send(request)

    @precondition(lambda self: bool(self.agent.output))
    @rule(data=st.data(), text=st.text(alphabet="ab\né€", min_size=1, max_size=5))
    def agent_prints(self, data: st.DataObject, text: str) -> None:
        unfinished = sorted(set(self.agent.output) - self.agent.finished)
        if not unfinished:
            return
        call_id = data.draw(st.sampled_from(unfinished))
        self.agent.output[call_id] += text.encode()
        if call_id in self.agent.following and self.state.live:
            for message in self.agent.catch_up(call_id):
                self.to_client(message)

    @precondition(lambda self: bool(set(self.agent.output) - self.agent.finished))
    @rule(data=st.data())
    def agent_finishes(self, data: st.DataObject) -> None:
        call_id = data.draw(st.sampled_from(sorted(set(self.agent.output) - self.agent.finished)))
        self.agent.finished.add(call_id)
        if call_id in self.agent.following and self.state.live:
            for message in self.agent.catch_up(call_id):
                self.to_client(message)

    @precondition(lambda self: bool(self.agent.finished) and self.state.live)
    @rule(data=st.data())
    def agent_repeats_a_result(self, data: st.DataObject) -> None:
        call_id = data.draw(st.sampled_from(sorted(self.agent.finished)))
        self.to_client(self.agent.result(call_id))

    @rule(call_id=st.sampled_from(CALL_IDS))
    def approve(self, call_id: str) -> None:
        message = protocol.Approve(
            rid=self.state.next_rid(), chat_id=CHAT, call_id=call_id, approved=True
        )
        request = self.state.approve(message)
        self.approves.append(request)
        self.send(request)

    # -- what must hold --------------------------------------------------------------------------

    @invariant()
    def each_handle_has_each_byte_once_and_one_result(self) -> None:
        for call_id, handle in self.handles.items():
            assert failure(handle) is None  # the agent knows every call: none may fail
            whole = self.agent.output.get(call_id, b"").decode()
            assert whole.startswith(handle.output_text())
            assert handle.gaps == []
            if handle.done:
                result = resolved(handle.result())
                assert result.output == whole == handle.output_text()
                assert resolved(handle.result()) is result  # the same, once

    @invariant()
    def a_resubscribed_connection_follows_every_unfinished_call(self) -> None:
        if not (self.state.live and self.state.ready):
            return
        for call_id, handle in self.handles.items():
            if handle.was_accepted and not handle.done:
                assert call_id in self.agent.following or call_id in self.agent.finished
                # ... and has everything the agent printed so far.
                assert handle.output_text() == self.agent.output[call_id].decode()

    @invariant()
    def requests_go_out_in_request_order(self) -> None:
        mine = [rid for rid in self.agent.rids_this_connection if rid in self.user_rids]
        assert mine == sorted(mine)

    @invariant()
    def an_approve_is_never_resent_and_fails_with_its_connection(self) -> None:
        assert len(self.agent.approves_received) == len(set(self.agent.approves_received))
        for request in self.approves:
            if request.sent_gen is not None and request.sent_gen != self.state.gen:
                assert isinstance(request.error, ConnectionLost)
            if not self.state.live and request.sent_gen is not None:
                assert request.done.is_set()


ClientStateMachine.TestCase.settings = settings(max_examples=300, stateful_step_count=40)
test_client_state_machine = ClientStateMachine.TestCase


SHARED_MODULES = ("state", "replies", "requests", "handles", "cursor", "errors", "api")
LOOP_OR_IO = {"trio", "trio_websocket", "asyncio", "websockets", "socket", "ssl", "wsproto"}


def test_the_shared_client_modules_import_no_event_loop_and_no_socket() -> None:
    """Both shells share every decision only while the shared modules stay loop-agnostic."""
    folder = Path(__file__).resolve().parent.parent / "transport" / "client"
    for name in SHARED_MODULES:
        tree = ast.parse((folder / f"{name}.py").read_text())
        imported = {
            alias.name.split(".")[0]
            for node in ast.walk(tree)
            if isinstance(node, ast.Import)
            for alias in node.names
        } | {
            (node.module or "").split(".")[0]
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom)
        }
        allowed = {"ssl"} if name == "api" else set()  # api.py only builds the TLS context
        assert not (imported & LOOP_OR_IO) - allowed, (name, imported & LOOP_OR_IO)


@given(
    attempt=st.integers(0, 100),
    initial=st.floats(0.001, 1.0),
    spread=st.floats(1.0, 100.0),
    seed=st.integers(0, 2**32),
)
def test_backoff_doubles_up_to_the_cap_with_jitter(
    attempt: int, initial: float, spread: float, seed: int
) -> None:
    cap = initial * spread
    delay = backoff_delay(attempt, initial, cap, random.Random(seed))
    ceiling = min(cap, initial * 2.0 ** min(attempt, 32))
    assert ceiling * 0.5 <= delay <= ceiling
    # The same random source gives the same delay: the plan is a function of its inputs.
    assert delay == backoff_delay(attempt, initial, cap, random.Random(seed))


def test_after_loss_stops_on_refusal_and_backs_off_otherwise() -> None:
    from toolwire.transport.client import ConnectError

    state = ClientState(Codec("json", side="client"), PlainFlag, rng=random.Random(1))
    first = state.after_loss(OSError("refused"), 0, 0)
    assert first is None and isinstance(state.fatal, ConnectError)
    assert state.fatal.status_code is None and isinstance(state.fatal.__cause__, OSError)

    state = ClientState(Codec("json", side="client"), PlainFlag, backoff_initial_s=0.1)
    state.connections = 1
    plans = [state.after_loss(OSError(), 1, attempt) for attempt in range(3)]
    assert [plan[1] for plan in plans if plan] == [1, 2, 3]
    assert all(plan and plan[0] <= 0.1 * 2**i for i, plan in enumerate(plans))
    assert state.after_loss(ConnectError(503), 1, 0) is not None  # 503: the agent restarts
    assert state.after_loss(ConnectError(401), 1, 0) is None  # a wrong token stays wrong
    assert isinstance(state.fatal, ConnectError) and state.fatal.status_code == 401


# -- OutputCursor (the pure de-duplication core) ------------------------------------------------


def test_cursor_drops_repeats_trims_overlaps_and_records_jumps() -> None:
    cursor = OutputCursor()
    assert cursor.take(0, "héllo ") == (0, "héllo ")
    end = len("héllo ".encode())
    cursor.rewound = True  # a repeated call moved the agent's cursor back
    assert cursor.take(0, "héllo ") is None
    assert cursor.take(0, "héllo wörld") == (end, "wörld")
    assert cursor.take(100, "tail") == (100, "tail")
    assert cursor.gaps == [(end + len("wörld".encode()), 100)]
    assert cursor.offset == 104


def test_cursor_never_cuts_inside_a_character() -> None:
    cursor = OutputCursor()
    cursor.take(0, "ab")
    cursor.rewound = True
    # Suppose the agent's chunk starts one byte earlier than we think a character starts:
    # the cut skips the continuation bytes instead of emitting half a character.
    assert cursor.take(1, "bé!") == (2, "é!")
    cursor.rewound = True
    assert cursor.take(2, "é!") is None
    cursor.offset = 3  # inside "é" (bytes 2..3): the rest of it is skipped, not mangled
    cursor.rewound = True
    assert cursor.take(2, "é!?") == (4, "!?")


def test_cursor_learns_the_real_length_of_replacement_characters() -> None:
    cursor = OutputCursor()
    # b"a\xffb" arrives as "a\ufffdb": 3 raw bytes, but 5 once re-encoded.
    assert cursor.take(0, "a\ufffdb") == (0, "a\ufffdb")
    assert cursor.offset == 5 and cursor.low == 3
    # The next chunk of the same stream starts at raw offset 3: nothing of it is dropped.
    assert cursor.take(3, "cd") == (3, "cd")
    assert cursor.offset == 5 and cursor.gaps == []


@given(
    st.text(min_size=1, max_size=60),
    st.lists(st.integers(0, 60), max_size=6),
    st.integers(0, 60),
    st.lists(st.integers(0, 60), max_size=6),
    st.integers(0, 60),
)
def test_cursor_replays_give_every_byte_once(
    text: str, first_cuts: list[int], stop: int, replay_cuts: list[int], restart: int
) -> None:
    """Deliver a prefix in arbitrary chunks, then replay from any earlier character boundary
    with other chunk boundaries (a repeated call or a re-attach): the text comes out whole."""
    boundaries = sorted({0, len(text)} | {c % (len(text) + 1) for c in first_cuts})
    stop_at = stop % (len(text) + 1)

    def offset(chars: int) -> int:
        return len(text[:chars].encode())

    cursor = OutputCursor()
    delivered: list[str] = []
    delivered_to = 0  # characters
    for a, b in itertools.pairwise(boundaries):
        if b > stop_at:
            break
        assert cursor.take(offset(a), text[a:b]) == (offset(a), text[a:b])
        delivered.append(text[a:b])
        delivered_to = b
    restart_at = restart % (delivered_to + 1)  # the agent resumes at or before our offset
    replay = sorted({restart_at, len(text)} | {c % (len(text) + 1) for c in replay_cuts})
    replay = [b for b in replay if b >= restart_at]
    cursor.rewound = True
    for a, b in itertools.pairwise(replay):
        taken = cursor.take(offset(a), text[a:b])
        if taken is not None:
            delivered.append(taken[1])
    assert "".join(delivered) == text
    assert cursor.offset == len(text.encode()) and cursor.gaps == []


@settings(max_examples=400, deadline=None)
@given(
    pieces=st.lists(
        st.binary(max_size=12)
        | st.text(max_size=6).map(str.encode)
        | st.sampled_from([b"\xff", b"\xe2\x82", b"\xac", b"\xf0\x9f", b"\x98\x80", b"\xed\xa0"]),
        max_size=12,
    ),
    reads=st.lists(st.integers(1, 9), min_size=1, max_size=20),
    cut_after=st.integers(0, 20),
)
def test_cursor_resumes_without_loss_over_invalid_utf8(
    pieces: list[bytes], reads: list[int], cut_after: int
) -> None:
    """The agent's own OutputBuffer chunks random output (invalid UTF-8 included); the
    connection drops after some chunks and the client re-attaches from `resume_offset`: the
    joined text equals the whole output decoded once, nothing lost, nothing doubled."""
    buffer = OutputBuffer(retention_bytes=1 << 20, head_bytes=1 << 19)
    for piece in pieces:
        buffer.append(piece)
    buffer.close()
    expected = b"".join(pieces).decode("utf-8", "replace")
    cursor = OutputCursor()
    delivered: list[str] = []
    agent_cursor, sizes = 0, itertools.cycle(reads)
    for _ in range(cut_after):  # the first connection
        chunk = buffer.read(agent_cursor, next(sizes))
        if chunk is None:
            break
        agent_cursor = chunk.next_offset
        taken = cursor.take(chunk.offset, chunk.data)
        if taken is not None:
            delivered.append(taken[1])
    cursor.rewound = True  # reconnect: attach from where the client says
    agent_cursor = cursor.resume_offset
    while (chunk := buffer.read(agent_cursor, next(sizes))) is not None:
        agent_cursor = chunk.next_offset
        taken = cursor.take(chunk.offset, chunk.data)
        if taken is not None:
            delivered.append(taken[1])
    assert "".join(delivered) == expected
    assert cursor.gaps == []
