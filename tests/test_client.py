"""transport/client.py against a real agent and server on 127.0.0.1, real processes, no mocks.

Network loss is real too: `Proxy` is a TCP relay between client and server whose `cut()`
closes both sides of every relayed connection, as a dropped link or a restarted load balancer
does. Waiting is always on an event (a message, a result); nothing sleeps to let time pass.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import msgspec
import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from tests import wsclient
from tests.conftest import TOKEN, LiveServer, start_server
from toolwire.actors.agent import Limits
from toolwire.actors.output import OutputBuffer
from toolwire.transport import protocol
from toolwire.transport.client import (
    Client,
    ConnectError,
    ConnectionLost,
    MessageTooBig,
    OutputCursor,
    RequestError,
    connect,
)
from toolwire.transport.ids import tool_call_id

CHAT = "11111111-1111-1111-1111-111111111111"
TEXT_CANCELED = "tool call was canceled while running"
TEXT_NOT_RUN = "tool call was canceled before it ran; no changes were made"


# -- helpers -----------------------------------------------------------------------------------


class Proxy:
    """A TCP relay. `cut()` drops every relayed connection; `upstream_port` may be switched
    (a different agent behind the same address, as after a restart or a failover)."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.port = 0
        self.accepted = 0
        self._streams: set[trio.SocketStream] = set()

    async def serve(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.port = listeners[0].socket.getsockname()[1]
        task_status.started(self.port)
        await trio.serve_listeners(self._relay, listeners)

    def url(self, path: str = "/v1") -> str:
        return f"ws://127.0.0.1:{self.port}{path}"

    async def cut(self) -> None:
        for stream in list(self._streams):
            await trio.aclose_forcefully(stream)

    async def _relay(self, down: trio.SocketStream) -> None:
        self.accepted += 1
        up = await trio.open_tcp_stream("127.0.0.1", self.upstream_port)
        self._streams |= {down, up}
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._pipe, down, up, nursery.cancel_scope)
                nursery.start_soon(self._pipe, up, down, nursery.cancel_scope)
        finally:
            self._streams -= {down, up}
            await trio.aclose_forcefully(down)
            await trio.aclose_forcefully(up)

    @staticmethod
    async def _pipe(
        src: trio.SocketStream, dst: trio.SocketStream, scope: trio.CancelScope
    ) -> None:
        try:
            while data := await src.receive_some(65536):
                await dst.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        scope.cancel()


@pytest.fixture
async def proxy(nursery: trio.Nursery, live: LiveServer) -> Proxy:
    relay = Proxy(int(live.url.rsplit(":", 1)[1].split("/")[0]))
    await nursery.start(relay.serve)
    return relay


def sockets_to(port: int) -> int:
    """How many of this process's fds are TCP sockets whose peer port is `port`: the client's
    connections to a server or proxy on 127.0.0.1 (the server's own sockets have it as their
    local port, so they do not count). Exact and immediate, unlike a count of all fds, which
    would also see the in-process server closing its side whenever it gets to it."""
    peer_port_of: dict[str, int] = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except FileNotFoundError:
            continue
        for line in lines:
            fields = line.split()
            peer_port_of[fields[9]] = int(fields[2].rsplit(":", 1)[1], 16)
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:[") and peer_port_of.get(target[8:-1]) == port:
            count += 1
    return count


def port_of(url: str) -> int:
    return int(url.rsplit(":", 1)[1].split("/")[0])


def numbered_lines(n: int) -> str:
    return "".join(f"line {i}\n" for i in range(1, n + 1))


async def until_started(handle: AsyncIterator[object]) -> list[object]:
    seen = []
    async for event in handle:
        seen.append(event)
        if isinstance(event, protocol.Started):
            return seen
    raise AssertionError(f"ended without started: {seen}")


def encoded(result: protocol.Result) -> bytes:
    return msgspec.json.encode(result)


# -- call, stream, result ---------------------------------------------------------------------


@pytest.mark.parametrize("encoding", ["json", "msgpack"])
async def test_call_streams_events_and_ends_in_one_result(live: LiveServer, encoding: str) -> None:
    async with connect(live.url, live.token, encoding) as client:  # type: ignore[arg-type]
        assert client.welcome.encoding == encoding and client.connections == 1
        handle = await client.call(
            CHAT, "c1", "execute", {"command": "printf 'one\\n'; sleep 0.05; printf 'two ü\\n'"}
        )
        assert handle.accepted.state == "running" and not handle.accepted.replay
        events = [event async for event in handle]
        assert isinstance(events[0], protocol.Started)
        outputs = [e for e in events if isinstance(e, protocol.Output)]
        assert "".join(o.data for o in outputs) == "one\ntwo ü\n"
        assert [o.offset for o in outputs] == sorted(o.offset for o in outputs)
        result = await handle.result()
        assert result.outcome == "completed" and result.data is not None
        assert result.data["exit_code"] == 0 and result.output == "one\ntwo ü\n"
        assert handle.output_text() == "one\ntwo ü\n"
        assert handle.offset == len("one\ntwo ü\n".encode()) and handle.gaps == []
        assert await handle.result() is result
        assert client.handle(CHAT, "c1") is None  # ended handles are not kept


async def test_stream_false_keeps_no_output(live: LiveServer) -> None:
    async with connect(live.url, live.token) as client:
        handle = await client.call(CHAT, "quiet", "execute", {"command": "echo hi"}, stream=False)
        assert [event async for event in handle] == []
        assert (await handle.result()).output == "hi\n"
        assert handle.output_text() == ""


async def test_a_repeated_call_gets_the_saved_result_and_runs_once(live: LiveServer) -> None:
    call_id = tool_call_id(CHAT, "42", "call_1")
    assert call_id == "ca92e3e7-ee42-5889-b1df-75869f9117ee"
    args = {"command": "echo x >> marker; echo ran"}
    async with connect(live.url, live.token) as client, connect(live.url, live.token) as other:
        # Gated, so that the repeat surely finds it unfinished (parked) without any timing.
        first = await client.call(CHAT, call_id, "execute", args, approval=True)
        again = await client.call(CHAT, call_id, "execute", args, approval=True)
        assert again is first  # one handle per call per client
        assert again.accepted.replay and again.accepted.requests == 2
        await client.approve(CHAT, call_id, True)
        result = await first.result()
        assert result.outcome == "completed" and result.output == "ran\n"
        later = await client.call(CHAT, call_id, "execute", args)
        assert later is not first and later.accepted.replay and later.accepted.state == "done"
        elsewhere = await other.call(CHAT, call_id, "execute", args)
        for handle in (later, elsewhere):
            assert encoded(await handle.result()) == encoded(result)  # byte for byte
        assert (live.workspace / "marker").read_text() == "x\n"
        with pytest.raises(RequestError) as conflict:
            await client.call(CHAT, call_id, "execute", {"command": "echo other"})
        assert conflict.value.code == "conflict"


async def test_request_errors_raise_and_unmatched_errors_are_kept(live: LiveServer) -> None:
    async with connect(live.url, live.token) as client:
        with pytest.raises(RequestError) as unknown:
            await client.call(CHAT, "u", "no_such_tool", {})
        assert unknown.value.code == "unknown_tool" and client.handle(CHAT, "u") is None
        with pytest.raises(RequestError) as missing:
            await client.attach(CHAT, "never-called")
        assert missing.value.code == "unknown_call"
        assert client._ws is not None
        await client._ws.send_message("{not json")  # a frame the agent cannot parse: no rid
        await (await client.call(CHAT, "after", "execute", {"command": "true"})).result()
        assert [e.code for e in client.errors] == ["bad_message"]  # arrived before `accepted`


async def test_a_message_over_the_agents_limit_is_refused_before_sending(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    small = await start_server(nursery, tmp_path, limits=Limits(max_message_bytes=4096))
    async with connect(small.url, small.token) as client:
        with pytest.raises(MessageTooBig):
            await client.call(CHAT, "big", "write_file", {"path": "f", "content": "x" * 5000})
        await (await client.call(CHAT, "small", "execute", {"command": "true"})).result()
        assert client.connections == 1 and not (tmp_path / "f").exists()


# -- cancel ------------------------------------------------------------------------------------


async def test_cancel_of_a_running_call(live: LiveServer) -> None:
    async with connect(live.url, live.token) as client:
        handle = await client.call(CHAT, "sleeper", "execute", {"command": "sleep 30"})
        await until_started(handle)
        with trio.fail_after(5):
            replies = await client.cancel(CHAT, ["sleeper"])
        reply = replies["sleeper"]
        assert reply.received and reply.result.outcome == "canceled"
        assert reply.result.text == TEXT_CANCELED and reply.result.canceled
        assert encoded(await handle.result()) == encoded(reply.result)
        again = await client.cancel(CHAT, ["sleeper"])  # idempotent: the saved result
        assert encoded(again["sleeper"].result) == encoded(reply.result)


async def test_cancel_and_collect_maps_every_outcome(live: LiveServer) -> None:
    async with connect(live.url, live.token) as client:
        done = await client.call(CHAT, "done", "execute", {"command": "echo finished"})
        await done.result()
        running = await client.call(CHAT, "running", "execute", {"command": "echo up; sleep 30"})
        await until_started(running)
        with trio.fail_after(5):
            outcomes = await client.cancel_and_collect(CHAT, ["unknown", "running", "done"])
        assert list(outcomes) == ["unknown", "running", "done"]
        assert outcomes["unknown"].outcome == "not_run" and outcomes["unknown"].text == TEXT_NOT_RUN
        assert outcomes["running"].outcome == "canceled"
        assert outcomes["done"].outcome == "completed" and outcomes["done"].output == "finished\n"
        # The cancel stored a tombstone: a late retry of the unknown id never runs.
        late = await client.call(CHAT, "unknown", "execute", {"command": "echo x >> late"})
        assert (await late.result()).outcome == "not_run"
        assert not (live.workspace / "late").exists()


# -- reconnect ---------------------------------------------------------------------------------


async def _close_websocket(client: Client, proxy: Proxy) -> None:
    assert client._ws is not None
    await client._ws.aclose()  # a clean close from our side, as a dying process would


async def _cut_network(client: Client, proxy: Proxy) -> None:
    await proxy.cut()  # both TCP sides just go away


@pytest.mark.parametrize("drop", [_close_websocket, _cut_network], ids=["ws_close", "network_cut"])
async def test_reconnect_resumes_output_without_loss_or_duplicates(
    live: LiveServer, proxy: Proxy, drop: Callable[[Client, Proxy], Awaitable[None]]
) -> None:
    expected = numbered_lines(50)
    command = 'for i in $(seq 1 50); do echo "line $i"; sleep 0.02; done'
    async with connect(proxy.url(), live.token, backoff_initial_s=0.01) as client:
        handle = await client.call(CHAT, "counter", "execute", {"command": command})
        dropped = False
        events: list[object] = []
        async for event in handle:
            events.append(event)
            if not dropped and "line 10\n" in handle.output_text():
                dropped = True
                await drop(client, proxy)
        assert dropped and client.connections == 2
        assert handle.output_text() == expected  # nothing lost, nothing doubled
        assert handle.gaps == [] and handle.offset == len(expected)
        outputs = [e for e in events if isinstance(e, protocol.Output)]
        offsets = [o.offset for o in outputs]
        assert offsets == sorted(set(offsets))
        assert sum(isinstance(e, protocol.Started) for e in events) == 1
        result = await handle.result()
        assert result.outcome == "completed" and result.output == expected
        assert proxy.accepted == 2 and sockets_to(proxy.port) == 1
    assert sockets_to(proxy.port) == 0


# A command that prints an invalid UTF-8 byte, then waits for the file `go` before printing
# more: so the two prints are surely two `output` events, with a pause between them.
INVALID_UTF8_COMMAND = "printf 'a\\377b\\n'; while [ ! -e go ]; do sleep 0.01; done; printf 'c\\n'"


async def test_offsets_stay_exact_after_invalid_utf8(live: LiveServer) -> None:
    async with connect(live.url, live.token) as client:
        handle = await client.call(CHAT, "bin", "execute", {"command": INVALID_UTF8_COMMAND})
        async for event in handle:
            if isinstance(event, protocol.Output) and event.offset == 0:
                # 4 raw bytes, 6 once re-encoded: the client cannot know which yet.
                assert event.data == "a\ufffdb\n" and handle.offset == 6
                (live.workspace / "go").touch()
        result = await handle.result()
        assert handle.output_text() == result.output == "a\ufffdb\nc\n"
        # The next chunk's offset (4) told the client where the first one really ended.
        assert handle.offset == result.output_bytes == 6 and handle.gaps == []


async def test_a_reconnect_after_invalid_utf8_loses_nothing(live: LiveServer, proxy: Proxy) -> None:
    async with connect(proxy.url(), live.token, backoff_initial_s=0.01) as client:
        handle = await client.call(CHAT, "bin", "execute", {"command": INVALID_UTF8_COMMAND})
        async for event in handle:
            if isinstance(event, protocol.Output) and event.offset == 0:
                await proxy.cut()
                await client.wait_connections(2)
                (live.workspace / "go").touch()
        result = await handle.result()
        assert handle.output_text() == result.output


async def test_requests_in_flight_are_resent_after_a_reconnect(
    live: LiveServer, proxy: Proxy
) -> None:
    async with connect(proxy.url(), live.token, backoff_initial_s=0.01) as client:
        sleeper = await client.call(CHAT, "s", "execute", {"command": "sleep 30"})
        await until_started(sleeper)
        async with trio.open_nursery() as nursery:
            replies: dict[str, protocol.CancelResult] = {}

            async def cancel() -> None:
                replies.update(await client.cancel(CHAT, ["s"]))

            await proxy.cut()  # the cancel is sent into a dead or dying connection
            nursery.start_soon(cancel)
        assert replies["s"].result.outcome == "canceled"
        assert (await sleeper.result()).outcome == "canceled"
        assert client.connections == 2


async def test_without_reconnect_a_lost_connection_fails_what_is_unfinished(
    live: LiveServer, proxy: Proxy
) -> None:
    async with connect(proxy.url(), live.token, reconnect=False) as client:
        handle = await client.call(CHAT, "orphan", "execute", {"command": "sleep 30"})
        await until_started(handle)
        await proxy.cut()
        with pytest.raises(ConnectionLost):
            await handle.result()
        with pytest.raises(ConnectionLost):
            await client.call(CHAT, "next", "execute", {"command": "true"})
    assert proxy.accepted == 1 and sockets_to(proxy.port) == 0


async def test_after_an_agent_restart_a_call_it_does_not_know_fails_its_handle(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    first = await start_server(nursery, tmp_path)
    second = await start_server(nursery, tmp_path)  # a fresh agent, no journal of the first
    relay = Proxy(port_of(first.url))
    await nursery.start(relay.serve)
    try:
        async with connect(relay.url(), TOKEN, backoff_initial_s=0.01) as client:
            boot = client.boot_id
            handle = await client.call(CHAT, "lost", "execute", {"command": "sleep 30"})
            await until_started(handle)
            relay.upstream_port = port_of(second.url)
            await relay.cut()
            with pytest.raises(RequestError) as lost:
                await handle.result()
            assert lost.value.code == "unknown_call"
            assert client.connections == 2 and client.boot_id != boot
            fresh = await client.call(CHAT, "fresh", "execute", {"command": "echo ok"})
            assert (await fresh.result()).output == "ok\n"
    finally:
        await first.agent.stop_processes(0.5)


# -- approvals ---------------------------------------------------------------------------------


async def test_a_gated_call_is_announced_and_runs_after_approve(live: LiveServer) -> None:
    async with connect(live.url, live.token) as client:
        handle = await client.call(
            CHAT, "gated", "execute", {"command": "echo approved"}, approval=True
        )
        assert handle.accepted.state == "awaiting_approval"
        approvals = client.approvals()
        announced = await approvals.__anext__()
        assert (announced.chat_id, announced.call_id, announced.tool) == (CHAT, "gated", "execute")
        resolved = await client.approve(CHAT, "gated", True)
        assert resolved.decision == "approved"
        events = [event async for event in handle]
        kinds = [type(e).__name__ for e in events]
        assert kinds[:3] == ["Approval", "ApprovalResolved", "Started"]
        result = await handle.result()
        assert result.outcome == "completed" and result.output == "approved\n"
        with pytest.raises(RequestError) as not_parked:
            await client.approve(CHAT, "gated", True)
        assert not_parked.value.code == "not_parked"
        with pytest.raises(RequestError) as unknown:
            await client.approve(CHAT, "no-such-call", True)
        assert unknown.value.code == "unknown_call"


async def test_approve_from_a_client_that_does_not_follow_the_call(live: LiveServer) -> None:
    async with connect(live.url, live.token) as caller, connect(live.url, live.token) as approver:
        handle = await caller.call(
            CHAT, "deny-me", "execute", {"command": "echo x >> denied"}, approval=True
        )
        quiet = await caller.call(
            CHAT, "quiet-gate", "execute", {"command": "echo ok"}, approval=True, stream=False
        )
        resolved = await approver.approve(CHAT, "deny-me", False, reason="no")
        assert resolved.decision == "denied"
        assert approver.handle(CHAT, "deny-me") is None  # approving does not follow a call
        assert (await handle.result()).outcome == "denied"
        assert not (live.workspace / "denied").exists()
        # The caller follows "quiet-gate" without streaming: no approval_resolved as a
        # follower, but the approving connection always gets one.
        assert (await caller.approve(CHAT, "quiet-gate", True)).decision == "approved"
        assert (await quiet.result()).output == "ok\n" and quiet.output_text() == ""


# Two agent behaviours approve() and approvals() rely on. Both were agent bugs when this client
# was written (fixed in fe606bd); they are checked here with the independent raw client.


async def test_the_approving_connection_gets_approval_resolved(live: LiveServer) -> None:
    """docs/protocol.md: approve has no direct reply, but the approving connection gets
    approval_resolved even when it does not follow the call."""
    async with live.connect() as caller, live.connect() as approver:
        await caller.send(
            {
                "type": "call",
                "chat_id": CHAT,
                "call_id": "g",
                "tool": "execute",
                "args": {"command": "true"},
                "approval": True,
            }
        )
        await caller.recv_until(lambda m: m["type"] == "approval")
        await approver.send(
            {"type": "approve", "rid": 1, "chat_id": CHAT, "call_id": "g", "approved": True}
        )
        # A barrier: an invalid request is answered at once, in order, and changes nothing. So
        # whatever the approve made the agent send this connection has arrived before it.
        await approver.send(
            {"type": "attach", "rid": 2, "chat_id": CHAT, "call_id": "g", "from_offset": -1}
        )
        got = await approver.recv_until(lambda m: m.get("rid") == 2)
        assert got[-1]["type"] == "error" and got[-1]["code"] == "bad_message"
        await caller.recv_until(wsclient.is_result("g"))  # the approve did take effect
        assert [m["type"] for m in got[:-1]] == ["approval_resolved"]


async def test_a_repeated_call_does_not_announce_the_gate_again(live: LiveServer) -> None:
    """PROTOCOL.md 5.0: a follower gets `approval` once; only output may be sent again."""
    call = {
        "type": "call",
        "chat_id": CHAT,
        "call_id": "g",
        "tool": "execute",
        "args": {"command": "true"},
        "approval": True,
    }
    async with live.connect() as conn:
        await conn.send(call | {"rid": 1})
        await conn.send(call | {"rid": 2})
        # A barrier, as above: everything the two calls made the agent send has arrived.
        await conn.send(
            {"type": "attach", "rid": 3, "chat_id": CHAT, "call_id": "g", "from_offset": -1}
        )
        got = await conn.recv_until(lambda m: m.get("rid") == 3)
        assert [m["type"] for m in got] == ["accepted", "approval", "accepted", "error"]


# -- turns and interrupt -----------------------------------------------------------------------


async def test_turn_plans_runs_and_reports_every_call(live: LiveServer) -> None:
    async with connect(live.url, live.token) as client:
        turn = await client.turn(
            CHAT,
            "t1",
            [
                {
                    "call_id": "w",
                    "tool": "write_file",
                    "args": {"path": "a.txt", "content": "hi\n"},
                },
                {"call_id": "r", "tool": "read_file", "args": {"path": "a.txt"}},
                protocol.CallSpec(call_id="e", tool="execute", args={"command": "cat a.txt"}),
            ],
        )
        assert await turn.plan() == [["w"], ["r"], ["e"]]
        results = await turn.results()
        assert [r.outcome for r in results] == ["completed"] * 3
        assert results[2].output == "hi\n"
        assert set(turn.calls) == {"w", "r", "e"}
        assert turn.calls["e"].output_text() == "hi\n"
        assert encoded(await turn.calls["r"].result()) == encoded(results[1])


async def test_interrupt_ends_a_turn_with_a_result_for_every_call(live: LiveServer) -> None:
    async with connect(live.url, live.token) as client:
        turn = await client.turn(
            CHAT,
            "t2",
            [
                {"call_id": "long", "tool": "execute", "args": {"command": "sleep 30"}},
                {"call_id": "next", "tool": "execute", "args": {"command": "echo x >> next"}},
            ],
        )
        await until_started(turn.calls["long"])
        with trio.fail_after(5):
            ended = await client.interrupt(CHAT, "t2")
        assert sorted(ended) == ["long", "next"]
        results = await turn.results()
        assert [r.outcome for r in results] == ["canceled", "not_run"]
        assert not (live.workspace / "next").exists()
        assert await client.interrupt(CHAT) == []  # nothing left: still answered


async def test_a_turn_and_its_gate_survive_a_reconnect(live: LiveServer, proxy: Proxy) -> None:
    async with connect(proxy.url(), live.token, backoff_initial_s=0.01) as client:
        approvals = client.approvals()
        turn = await client.turn(
            CHAT,
            "t3",
            [
                {
                    "call_id": "g",
                    "tool": "execute",
                    "args": {"command": "echo gated"},
                    "approval": True,
                },
                {"call_id": "p", "tool": "execute", "args": {"command": "printf 'a\\nb\\n'"}},
            ],
        )
        assert (await approvals.__anext__()).call_id == "g"
        await proxy.cut()
        await client.wait_connections(2)
        # Sent after the re-sent turn, which made the new connection follow "g" again.
        assert (await client.approve(CHAT, "g", True)).decision == "approved"
        results = await turn.results()
        assert [(r.outcome, r.output) for r in results] == [
            ("completed", "gated\n"),
            ("completed", "a\nb\n"),
        ]
        assert turn.calls["p"].output_text() == "a\nb\n" and client.connections == 2
        # The re-sent turn announced "g" again; the approvals stream has it once.
        await client.call(CHAT, "g2", "execute", {"command": "true"}, approval=True)
        assert (await approvals.__anext__()).call_id == "g2"
        await client.cancel(CHAT, ["g2"])


# -- connecting --------------------------------------------------------------------------------


async def test_a_rejected_handshake_raises_and_is_not_retried(
    live: LiveServer, proxy: Proxy
) -> None:
    with pytest.raises(ConnectError) as wrong_token:
        async with connect(proxy.url(), "wrong-token"):
            raise AssertionError("connected with a wrong token")
    assert wrong_token.value.status_code == 401
    assert b"token" in wrong_token.value.body
    with pytest.raises(ConnectError) as wrong_path:
        async with connect(proxy.url("/v2"), live.token):
            raise AssertionError("connected to a wrong path")
    assert wrong_path.value.status_code == 404
    assert proxy.accepted == 2  # one attempt each
    assert sockets_to(proxy.port) == 0


async def test_an_unreachable_agent_raises_connect_error(live: LiveServer) -> None:
    listener = trio.socket.socket()
    await listener.bind(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    listener.close()  # a port nobody listens on
    with pytest.raises(ConnectError) as unreachable:
        async with connect(f"ws://127.0.0.1:{port}/v1", live.token):
            raise AssertionError("connected to nothing")
    assert unreachable.value.status_code is None
    assert isinstance(unreachable.value.__cause__, OSError)


async def test_no_socket_leaks_after_peer_closes_rejections_and_1009(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    small = await start_server(nursery, tmp_path, limits=Limits(max_message_bytes=4096))
    port = port_of(small.url)
    fds_before = len(os.listdir("/proc/self/fd"))
    for _ in range(10):
        with pytest.raises(ConnectError):
            async with connect(small.url, "wrong-token"):
                pass
    assert sockets_to(port) == 0
    # All fds too, with slack for the in-process agent, which closes its side of each
    # connection on its own schedule: one leaked fd per connection would show up as 10.
    assert len(os.listdir("/proc/self/fd")) - fds_before < 5
    async with connect(small.url, small.token, backoff_initial_s=0.01) as client:
        assert sockets_to(port) == 1
        assert client._ws is not None
        # Bypass the client's size check: the agent closes the connection with 1009.
        await client._ws.send_message("x" * 5000)
        handle = await client.call(CHAT, "after-1009", "execute", {"command": "echo ok"})
        assert (await handle.result()).output == "ok\n"
        assert client.connections == 2
        assert sockets_to(port) == 1  # the socket of the connection the agent closed is gone
        await small.server.shutdown(0.1)  # the agent closes with 1001 and stops listening
    assert sockets_to(port) == 0


async def test_a_cancelled_client_closes_at_once(live: LiveServer) -> None:
    # Under CLOSE_TIMEOUT_S (1 s), which a graceful close that cannot complete would wait out.
    with trio.fail_after(0.9), trio.CancelScope() as scope:
        async with connect(live.url, live.token) as client:
            await client.call(CHAT, "bg", "execute", {"command": "sleep 30"})
            assert sockets_to(port_of(live.url)) == 1
            scope.cancel()  # no graceful close: trio-websocket's reader is cancelled too
            await trio.sleep_forever()
    assert scope.cancelled_caught and sockets_to(port_of(live.url)) == 0


async def test_a_body_exception_propagates_unwrapped(live: LiveServer) -> None:
    with pytest.raises(KeyError):
        async with connect(live.url, live.token):
            raise KeyError("mine")


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
