"""The client's behaviour suite, run against both shells (trio on trio-websocket, asyncio on
`websockets`: the `shell` parameter), against a real agent and server on 127.0.0.1, real
processes, no mocks.

Network loss is real too: `Proxy` is a TCP relay between client and server whose `cut()`
closes both sides of every relayed connection, as a dropped link or a restarted load balancer
does. Waiting is always on an event (a message, a result); nothing sleeps to let time pass.
Each test body awaits only the client's API, so it runs unchanged on either event loop (see
tests/clientshells.py).
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import msgspec
import pytest
import trio

from tests import wsclient
from tests.clientshells import SHELLS, Shell
from tests.conftest import TOKEN, LiveServer, start_server
from toolwire.actors.agent import Limits
from toolwire.transport import protocol
from toolwire.transport.client import (
    ConnectError,
    ConnectionLost,
    MessageTooBig,
    RequestError,
    aio,
    connect,
    session,
)
from toolwire.transport.client.api import ClientAPI
from toolwire.transport.ids import tool_call_id

CHAT = "11111111-1111-1111-1111-111111111111"
TEXT_CANCELED = "tool call was canceled while running"
TEXT_NOT_RUN = "tool call was canceled before it ran; no changes were made"


@pytest.fixture(params=sorted(SHELLS))
def shell(request: pytest.FixtureRequest) -> Shell:
    return SHELLS[request.param]()


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


# -- call, stream, attach, result --------------------------------------------------------------


@pytest.mark.parametrize("encoding", ["json", "msgpack"])
async def test_call_streams_events_and_ends_in_one_result(
    shell: Shell, live: LiveServer, encoding: str
) -> None:
    async def body() -> None:
        async with shell.connect(live.url, live.token, encoding) as client:
            assert client.welcome.encoding == encoding and client.connections == 1
            command = "printf 'one\\n'; sleep 0.05; printf 'two ü\\n'"
            handle = await client.call(CHAT, "c1", "execute", {"command": command})
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

    await shell.run(body)


async def test_stream_false_keeps_no_output(shell: Shell, live: LiveServer) -> None:
    async def body() -> None:
        async with shell.connect(live.url, live.token) as client:
            handle = await client.call(
                CHAT, "quiet", "execute", {"command": "echo hi"}, stream=False
            )
            assert [event async for event in handle] == []
            assert (await handle.result()).output == "hi\n"
            assert handle.output_text() == ""

    await shell.run(body)


async def test_attach_from_an_offset_gets_the_rest_and_the_same_result(
    shell: Shell, live: LiveServer
) -> None:
    async def body() -> None:
        async with shell.connect(live.url, live.token) as caller:
            done = await caller.call(CHAT, "lines", "execute", {"command": "seq 1 5"})
            result = await done.result()
        async with shell.connect(live.url, live.token) as other:
            whole = await other.attach(CHAT, "lines")
            assert whole.accepted.replay and whole.accepted.state == "done"
            assert encoded(await whole.result()) == encoded(result)
            assert whole.output_text() == "1\n2\n3\n4\n5\n"
            rest = await other.attach(CHAT, "lines", from_offset=4)  # after "1\n2\n"
            events = [event async for event in rest]
            outputs = [e for e in events if isinstance(e, protocol.Output)]
            assert [(o.offset, o.data) for o in outputs] == [(4, "3\n4\n5\n")]
            assert rest.output_text() == "3\n4\n5\n" and rest.offset == 10
            assert encoded(await rest.result()) == encoded(result)
            with pytest.raises(RequestError) as missing:
                await other.attach(CHAT, "never-called")
            assert missing.value.code == "unknown_call"

    await shell.run(body)


async def test_a_repeated_call_gets_the_saved_result_and_runs_once(
    shell: Shell, live: LiveServer
) -> None:
    call_id = tool_call_id(CHAT, "42", "call_1")
    assert call_id == "ca92e3e7-ee42-5889-b1df-75869f9117ee"
    args = {"command": "echo x >> marker; echo ran"}

    async def body() -> None:
        async with (
            shell.connect(live.url, live.token) as client,
            shell.connect(live.url, live.token) as other,
        ):
            # Gated, so that the repeat surely finds it unfinished (parked) without any timing.
            first = await client.call(CHAT, call_id, "execute", args, approval=True)
            again = await client.call(CHAT, call_id, "execute", args, approval=True)
            assert again is first  # one handle per call per client
            assert again.accepted.replay and again.accepted.requests == 2
            await client.approve(CHAT, call_id, True)
            result = await first.result()
            assert result.outcome == "completed" and result.output == "ran\n"
            later = await client.call(CHAT, call_id, "execute", args)
            assert later is not first and later.accepted.replay
            assert later.accepted.state == "done"
            elsewhere = await other.call(CHAT, call_id, "execute", args)
            for handle in (later, elsewhere):
                assert encoded(await handle.result()) == encoded(result)  # byte for byte
            assert (live.workspace / "marker").read_text() == "x\n"
            with pytest.raises(RequestError) as conflict:
                await client.call(CHAT, call_id, "execute", {"command": "echo other"})
            assert conflict.value.code == "conflict"

    await shell.run(body)


async def test_request_errors_raise_and_unmatched_errors_are_kept(
    shell: Shell, live: LiveServer
) -> None:
    async def body() -> None:
        async with shell.connect(live.url, live.token) as client:
            with pytest.raises(RequestError) as unknown:
                await client.call(CHAT, "u", "no_such_tool", {})
            assert unknown.value.code == "unknown_tool" and client.handle(CHAT, "u") is None
            await shell.send_raw(client, "{not json")  # the agent cannot parse it: no rid
            await (await client.call(CHAT, "after", "execute", {"command": "true"})).result()
            assert [e.code for e in client.errors] == ["bad_message"]  # before `accepted`

    await shell.run(body)


async def test_a_message_over_the_agents_limit_is_refused_before_sending(
    shell: Shell, nursery: trio.Nursery, tmp_path: Path
) -> None:
    small = await start_server(nursery, tmp_path, limits=Limits(max_message_bytes=4096))

    async def body() -> None:
        async with shell.connect(small.url, small.token) as client:
            with pytest.raises(MessageTooBig):
                await client.call(CHAT, "big", "write_file", {"path": "f", "content": "x" * 5000})
            await (await client.call(CHAT, "small", "execute", {"command": "true"})).result()
            assert client.connections == 1 and not (tmp_path / "f").exists()

    await shell.run(body)


# -- cancel ------------------------------------------------------------------------------------


async def test_cancel_of_a_running_call(shell: Shell, live: LiveServer) -> None:
    async def body() -> None:
        async with shell.connect(live.url, live.token) as client:
            handle = await client.call(CHAT, "sleeper", "execute", {"command": "sleep 30"})
            await until_started(handle)
            async with shell.fail_after(5):
                replies = await client.cancel(CHAT, ["sleeper"])
            reply = replies["sleeper"]
            assert reply.received and reply.result.outcome == "canceled"
            assert reply.result.text == TEXT_CANCELED and reply.result.canceled
            assert encoded(await handle.result()) == encoded(reply.result)
            again = await client.cancel(CHAT, ["sleeper"])  # idempotent: the saved result
            assert encoded(again["sleeper"].result) == encoded(reply.result)

    await shell.run(body)


async def test_cancel_and_collect_maps_every_outcome(shell: Shell, live: LiveServer) -> None:
    async def body() -> None:
        async with shell.connect(live.url, live.token) as client:
            done = await client.call(CHAT, "done", "execute", {"command": "echo finished"})
            await done.result()
            running = await client.call(
                CHAT, "running", "execute", {"command": "echo up; sleep 30"}
            )
            await until_started(running)
            async with shell.fail_after(5):
                outcomes = await client.cancel_and_collect(CHAT, ["unknown", "running", "done"])
            assert list(outcomes) == ["unknown", "running", "done"]
            assert outcomes["unknown"].outcome == "not_run"
            assert outcomes["unknown"].text == TEXT_NOT_RUN
            assert outcomes["running"].outcome == "canceled"
            assert outcomes["done"].outcome == "completed"
            assert outcomes["done"].output == "finished\n"
            # The cancel stored a tombstone: a late retry of the unknown id never runs.
            late = await client.call(CHAT, "unknown", "execute", {"command": "echo x >> late"})
            assert (await late.result()).outcome == "not_run"
            assert not (live.workspace / "late").exists()

    await shell.run(body)


# -- reconnect ---------------------------------------------------------------------------------


async def _close_websocket(shell: Shell, client: ClientAPI, proxy: Proxy) -> None:
    await shell.close_websocket(client)  # a clean close from our side, as a dying process would


async def _cut_network(shell: Shell, client: ClientAPI, proxy: Proxy) -> None:
    await shell.on_trio(proxy.cut)  # both TCP sides just go away


@pytest.mark.parametrize("drop", [_close_websocket, _cut_network], ids=["ws_close", "network_cut"])
async def test_reconnect_resumes_output_without_loss_or_duplicates(
    shell: Shell,
    live: LiveServer,
    proxy: Proxy,
    drop: Callable[[Shell, ClientAPI, Proxy], Awaitable[None]],
) -> None:
    expected = numbered_lines(50)
    # The marker shows whether the command ran more than once (it must not, whatever resent).
    command = 'echo run >> ran; for i in $(seq 1 50); do echo "line $i"; sleep 0.02; done'

    async def body() -> None:
        async with shell.connect(proxy.url(), live.token, backoff_initial_s=0.01) as client:
            handle = await client.call(CHAT, "counter", "execute", {"command": command})
            dropped = False
            events: list[object] = []
            async for event in handle:
                events.append(event)
                if not dropped and "line 10\n" in handle.output_text():
                    dropped = True
                    await drop(shell, client, proxy)
            assert dropped and client.connections == 2
            assert handle.output_text() == expected  # nothing lost, nothing doubled
            assert handle.gaps == [] and handle.offset == len(expected)
            outputs = [e for e in events if isinstance(e, protocol.Output)]
            offsets = [o.offset for o in outputs]
            assert offsets == sorted(set(offsets))
            assert sum(isinstance(e, protocol.Started) for e in events) == 1
            result = await handle.result()
            assert result.outcome == "completed" and result.output == expected
            assert await handle.result() is result  # the one result, however often sent
            assert (live.workspace / "ran").read_text() == "run\n"  # not run again
            assert proxy.accepted == 2 and sockets_to(proxy.port) == 1
        assert sockets_to(proxy.port) == 0

    await shell.run(body)


# A command that prints an invalid UTF-8 byte, then waits for the file `go` before printing
# more: so the two prints are surely two `output` events, with a pause between them.
INVALID_UTF8_COMMAND = "printf 'a\\377b\\n'; while [ ! -e go ]; do sleep 0.01; done; printf 'c\\n'"


async def test_offsets_stay_exact_after_invalid_utf8(shell: Shell, live: LiveServer) -> None:
    async def body() -> None:
        async with shell.connect(live.url, live.token) as client:
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

    await shell.run(body)


async def test_a_reconnect_after_invalid_utf8_loses_nothing(
    shell: Shell, live: LiveServer, proxy: Proxy
) -> None:
    async def body() -> None:
        async with shell.connect(proxy.url(), live.token, backoff_initial_s=0.01) as client:
            handle = await client.call(CHAT, "bin", "execute", {"command": INVALID_UTF8_COMMAND})
            async for event in handle:
                if isinstance(event, protocol.Output) and event.offset == 0:
                    await shell.on_trio(proxy.cut)
                    await client.wait_connections(2)
                    (live.workspace / "go").touch()
            result = await handle.result()
            assert handle.output_text() == result.output

    await shell.run(body)


async def test_requests_in_flight_are_resent_after_a_reconnect(
    shell: Shell, live: LiveServer, proxy: Proxy
) -> None:
    async def body() -> None:
        async with shell.connect(proxy.url(), live.token, backoff_initial_s=0.01) as client:
            sleeper = await client.call(CHAT, "s", "execute", {"command": "sleep 30"})
            await until_started(sleeper)
            await shell.on_trio(proxy.cut)
            replies = await client.cancel(CHAT, ["s"])  # sent into a dead or dying connection
            assert replies["s"].result.outcome == "canceled"
            assert (await sleeper.result()).outcome == "canceled"
            assert client.connections == 2

    await shell.run(body)


async def test_without_reconnect_a_lost_connection_fails_what_is_unfinished(
    shell: Shell, live: LiveServer, proxy: Proxy
) -> None:
    async def body() -> None:
        async with shell.connect(proxy.url(), live.token, reconnect=False) as client:
            handle = await client.call(CHAT, "orphan", "execute", {"command": "sleep 30"})
            await until_started(handle)
            await shell.on_trio(proxy.cut)
            with pytest.raises(ConnectionLost):
                await handle.result()
            with pytest.raises(ConnectionLost):
                await client.call(CHAT, "next", "execute", {"command": "true"})
        assert proxy.accepted == 1 and sockets_to(proxy.port) == 0

    await shell.run(body)


async def test_after_an_agent_restart_a_call_it_does_not_know_fails_its_handle(
    shell: Shell, nursery: trio.Nursery, tmp_path: Path
) -> None:
    first = await start_server(nursery, tmp_path)
    second = await start_server(nursery, tmp_path)  # a fresh agent, no journal of the first
    relay = Proxy(port_of(first.url))
    await nursery.start(relay.serve)

    async def body() -> None:
        async with shell.connect(relay.url(), TOKEN, backoff_initial_s=0.01) as client:
            boot = client.boot_id
            handle = await client.call(CHAT, "lost", "execute", {"command": "sleep 30"})
            await until_started(handle)
            relay.upstream_port = port_of(second.url)
            await shell.on_trio(relay.cut)
            with pytest.raises(RequestError) as lost:
                await handle.result()
            assert lost.value.code == "unknown_call"
            assert client.connections == 2 and client.boot_id != boot
            fresh = await client.call(CHAT, "fresh", "execute", {"command": "echo ok"})
            assert (await fresh.result()).output == "ok\n"

    try:
        await shell.run(body)
    finally:
        await first.server.shutdown()


# -- approvals ---------------------------------------------------------------------------------


async def test_a_gated_call_is_announced_and_runs_after_approve(
    shell: Shell, live: LiveServer
) -> None:
    async def body() -> None:
        async with shell.connect(live.url, live.token) as client:
            handle = await client.call(
                CHAT, "gated", "execute", {"command": "echo approved"}, approval=True
            )
            assert handle.accepted.state == "awaiting_approval"
            approvals = client.approvals()
            announced = await approvals.__anext__()
            assert (announced.chat_id, announced.call_id) == (CHAT, "gated")
            assert announced.tool == "execute"
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

    await shell.run(body)


async def test_approve_from_a_client_that_does_not_follow_the_call(
    shell: Shell, live: LiveServer
) -> None:
    async def body() -> None:
        async with (
            shell.connect(live.url, live.token) as caller,
            shell.connect(live.url, live.token) as approver,
        ):
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

    await shell.run(body)


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


async def test_turn_plans_runs_and_reports_every_call(shell: Shell, live: LiveServer) -> None:
    async def body() -> None:
        async with shell.connect(live.url, live.token) as client:
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

    await shell.run(body)


async def test_interrupt_ends_a_turn_with_a_result_for_every_call(
    shell: Shell, live: LiveServer
) -> None:
    async def body() -> None:
        async with shell.connect(live.url, live.token) as client:
            turn = await client.turn(
                CHAT,
                "t2",
                [
                    {"call_id": "long", "tool": "execute", "args": {"command": "sleep 30"}},
                    {"call_id": "next", "tool": "execute", "args": {"command": "echo x >> next"}},
                ],
            )
            await until_started(turn.calls["long"])
            async with shell.fail_after(5):
                ended = await client.interrupt(CHAT, "t2")
            assert sorted(ended) == ["long", "next"]
            results = await turn.results()
            assert [r.outcome for r in results] == ["canceled", "not_run"]
            assert not (live.workspace / "next").exists()
            assert await client.interrupt(CHAT) == []  # nothing left: still answered

    await shell.run(body)


async def test_a_turn_and_its_gate_survive_a_reconnect(
    shell: Shell, live: LiveServer, proxy: Proxy
) -> None:
    async def body() -> None:
        async with shell.connect(proxy.url(), live.token, backoff_initial_s=0.01) as client:
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
            await shell.on_trio(proxy.cut)
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

    await shell.run(body)


# -- connecting --------------------------------------------------------------------------------


async def test_a_rejected_handshake_raises_and_is_not_retried(
    shell: Shell, live: LiveServer, proxy: Proxy
) -> None:
    async def body() -> None:
        with pytest.raises(ConnectError) as wrong_token:
            async with shell.connect(proxy.url(), "wrong-token"):
                raise AssertionError("connected with a wrong token")
        assert wrong_token.value.status_code == 401
        assert b"token" in wrong_token.value.body
        with pytest.raises(ConnectError) as wrong_path:
            async with shell.connect(proxy.url("/v2"), live.token):
                raise AssertionError("connected to a wrong path")
        assert wrong_path.value.status_code == 404
        assert proxy.accepted == 2  # one attempt each
        assert sockets_to(proxy.port) == 0

    await shell.run(body)


async def test_an_unreachable_agent_raises_connect_error(shell: Shell, live: LiveServer) -> None:
    listener = trio.socket.socket()
    await listener.bind(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    listener.close()  # a port nobody listens on

    async def body() -> None:
        with pytest.raises(ConnectError) as unreachable:
            async with shell.connect(f"ws://127.0.0.1:{port}/v1", live.token):
                raise AssertionError("connected to nothing")
        assert unreachable.value.status_code is None
        assert isinstance(unreachable.value.__cause__, OSError)

    await shell.run(body)


async def test_no_socket_leaks_after_peer_closes_rejections_and_1009(
    shell: Shell, nursery: trio.Nursery, tmp_path: Path
) -> None:
    small = await start_server(nursery, tmp_path, limits=Limits(max_message_bytes=4096))
    port = port_of(small.url)

    async def body() -> None:
        fds_before = len(os.listdir("/proc/self/fd"))
        for _ in range(10):
            with pytest.raises(ConnectError):
                async with shell.connect(small.url, "wrong-token"):
                    pass
        assert sockets_to(port) == 0
        # All fds too, with slack for the in-process agent, which closes its side of each
        # connection on its own schedule: one leaked fd per connection would show up as 10.
        assert len(os.listdir("/proc/self/fd")) - fds_before < 5
        async with shell.connect(small.url, small.token, backoff_initial_s=0.01) as client:
            assert sockets_to(port) == 1
            # Bypass the client's size check: the agent closes the connection with 1009.
            await shell.send_raw(client, "x" * 5000)
            handle = await client.call(CHAT, "after-1009", "execute", {"command": "echo ok"})
            assert (await handle.result()).output == "ok\n"
            assert client.connections == 2
            assert sockets_to(port) == 1  # the socket of the connection the agent closed is gone
            # The agent closes with 1001 and stops listening.
            await shell.on_trio(small.server.shutdown)
        assert sockets_to(port) == 0

    await shell.run(body)


async def test_connect_is_a_new_client_opened_and_a_client_opens_once(
    shell: Shell, live: LiveServer
) -> None:
    client_class = session.Client if shell.name == "trio" else aio.Client

    async def body() -> None:
        client = client_class(live.url, live.token)
        async with client.open() as opened:
            assert opened is client and client.connected and client.connections == 1
            handle = await client.call(CHAT, "opened", "execute", {"command": "echo hi"})
            assert (await handle.result()).output == "hi\n"
            with pytest.raises(RuntimeError, match="opened already"):
                async with client.open():
                    raise AssertionError("opened twice")
            assert client.connected  # the refused second open changed nothing
        assert not client.connected
        with pytest.raises(RuntimeError, match="opened already"):
            async with client.open():
                raise AssertionError("opened again after its close")

    await shell.run(body)


async def test_a_body_exception_propagates_unwrapped(shell: Shell, live: LiveServer) -> None:
    async def body() -> None:
        with pytest.raises(KeyError):
            async with shell.connect(live.url, live.token):
                raise KeyError("mine")

    await shell.run(body)


async def test_a_cancelled_trio_client_closes_at_once(live: LiveServer) -> None:
    # Under CLOSE_TIMEOUT_S (1 s), which a graceful close that cannot complete would wait out.
    # trio only: its cancellation also cancels trio-websocket's reader, which the close needs.
    with trio.fail_after(0.9), trio.CancelScope() as scope:
        async with connect(live.url, live.token) as client:
            await client.call(CHAT, "bg", "execute", {"command": "sleep 30"})
            assert sockets_to(port_of(live.url)) == 1
            scope.cancel()  # no graceful close: trio-websocket's reader is cancelled too
            await trio.sleep_forever()
    assert scope.cancelled_caught and sockets_to(port_of(live.url)) == 0
