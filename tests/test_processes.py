"""The process tools of PROTOCOL.md section 8 (`process_output`, `process_signal`,
`process_list`) and the process table's retention (5.2), through a real server and real
processes; plus the process table's ordering with a scripted backend (no processes at all).
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Mapping
from typing import Any

import trio

from tests.conftest import LiveServer, MakeServer
from tests.oswatch import alive
from tests.wsclient import Message, RawConn, of, wait_for
from toolwire.actors.agent import Limits
from toolwire.actors.processes import (
    ExitStatus,
    ProcessTable,
    RealProcessBackend,
    SpawnedProcess,
    StdinPort,
)
from toolwire.actors.terminal import TerminalSize

TEST_DEADLINE_S = 10.0


async def run(conn: RawConn, call_id: str, tool: str, chat_id: str = "c", **args: Any) -> Message:
    result = await conn.call(chat_id, call_id, tool, args)
    assert result["type"] == "result", result
    return result


def execute(call_id: str, command: str) -> Message:
    return {
        "type": "call",
        "chat_id": "c",
        "call_id": call_id,
        "tool": "execute",
        "args": {"command": command},
    }


async def background(conn: RawConn, call_id: str, command: str) -> Message:
    result = await conn.call("c", call_id, "execute", {"command": command}, background=True)
    assert result["outcome"] == "completed", result
    return result


# --- process_output -------------------------------------------------------------------------------


async def test_process_output_without_wait_answers_at_once(live: LiveServer) -> None:
    with trio.fail_after(TEST_DEADLINE_S):
        async with live.connect() as conn:
            # A foreground call streams its output; once the line is there, read it with the tool.
            await conn.send(execute("p", "echo up; sleep 30"))
            await conn.recv_until(lambda m: m["type"] == "output" and "up" in m["data"])
            state = await run(conn, "o", "process_output", process_id="p")
    assert state["outcome"] == "completed"
    assert state["output"] == "up\n"
    data = state["data"]
    assert data["running"] is True and data["exit_code"] is None
    assert data["timed_out"] is False and data["canceled"] is False
    # No wait was asked for: a tool that waited for the `sleep 30` would miss the test's
    # deadline (no upper bound on a duration here: a busy machine must not fail the test).


async def test_process_output_wait_returns_when_the_process_exits(live: LiveServer) -> None:
    with trio.fail_after(TEST_DEADLINE_S):
        async with live.connect() as conn:
            await background(conn, "p", "sleep 0.2; echo fin; exit 4")
            state = await run(conn, "o", "process_output", process_id="p", wait=True)
    data = state["data"]
    assert data["running"] is False and data["exit_code"] == 4
    assert state["output"] == "fin\n"  # everything it wrote before it exited


async def test_process_output_wait_ms_bounds_the_wait(live: LiveServer) -> None:
    with trio.fail_after(TEST_DEADLINE_S):
        async with live.connect() as conn:
            await background(conn, "p", "sleep 30")
            state = await run(conn, "o", "process_output", process_id="p", wait=True, wait_ms=200)
    assert state["data"]["running"] is True
    assert state["wall_ms"] >= 200  # it waited; unbounded, it would miss the test's deadline


async def test_process_output_wait_is_capped_by_max_wait_ms(make_server: MakeServer) -> None:
    server = await make_server(limits=Limits(max_wait_ms=200))
    with trio.fail_after(TEST_DEADLINE_S):
        async with server.connect() as conn:
            assert conn.welcome["limits"]["max_wait_ms"] == 200
            await background(conn, "p", "sleep 30")
            asked = await run(
                conn, "o1", "process_output", process_id="p", wait=True, wait_ms=600_000
            )
            default = await run(conn, "o2", "process_output", process_id="p", wait=True)
    for state in (asked, default):
        assert state["data"]["running"] is True
        assert state["wall_ms"] >= 200  # capped: waiting 600 s would miss the test's deadline


async def test_process_output_of_an_unknown_process_fails(live: LiveServer) -> None:
    with trio.fail_after(TEST_DEADLINE_S):
        async with live.connect() as conn:
            state = await run(conn, "o", "process_output", process_id="nope")
            bad = await conn.call("c", "o2", "process_output", {"process_id": ""})
    assert state["outcome"] == "failed" and "nope" in state["text"]
    assert bad["type"] == "error" and bad["code"] == "bad_args"


# --- process_signal -------------------------------------------------------------------------------


async def test_process_signal_delivers_to_a_running_process(live: LiveServer) -> None:
    with trio.fail_after(TEST_DEADLINE_S):
        async with live.connect() as conn:
            await background(conn, "p", "sleep 30")
            sent = await run(conn, "s1", "process_signal", process_id="p", signal="SIGTERM")
            state = await run(conn, "o", "process_output", process_id="p", wait=True)
            again = await run(conn, "s2", "process_signal", process_id="p", signal="SIGTERM")
    assert sent["outcome"] == "completed" and sent["data"] == {"delivered": True}
    assert state["data"]["running"] is False
    assert state["data"]["signal"] == "SIGTERM" and state["data"]["exit_code"] is None
    # process_signal is not a cancel: the process record does not claim one.
    assert state["data"]["canceled"] is False
    assert again["outcome"] == "completed" and again["data"] == {"delivered": False}
    assert "not delivered" in again["text"]


async def test_process_signal_sends_the_named_signal(live: LiveServer) -> None:
    command = "trap 'echo got-usr1; exit 3' USR1; echo ready; while :; do sleep 0.05; done"
    with trio.fail_after(TEST_DEADLINE_S):
        async with live.connect() as conn:
            await conn.send(execute("p", command))
            await conn.recv_until(lambda m: m["type"] == "output" and "ready" in m["data"])
            sent = await run(conn, "s", "process_signal", process_id="p", signal="SIGUSR1")
            # The command may exit (and its result arrive) before process_signal's own result,
            # while `run` waited for that one: look at what was already received first.
            result = await wait_for(conn, of("result", "p"))
    assert sent["data"]["delivered"] is True
    # The trap ran: the shell got SIGUSR1 (not some other signal) and exited through it.
    assert result["data"]["exit_code"] == 3
    # (The shell may also report its `sleep` child killed by the same group signal.)
    assert result["output"].startswith("ready\n")
    assert result["output"].endswith("got-usr1\n")


class _HeldReapBackend:
    """Real processes whose reap waits for the test: between the shell's exit and `release`,
    the shell is a zombie the agent has not collected, deterministically (the agent reaps as
    soon as the exit is visible, so without this the window is a few microseconds wide)."""

    def __init__(self) -> None:
        self._real = RealProcessBackend()
        self.reap_allowed = trio.Event()

    def spawn(
        self,
        argv: list[str],
        cwd: str,
        env: Mapping[str, str],
        *,
        stdin: bool = False,
        terminal: TerminalSize | None = None,
    ) -> SpawnedProcess:
        real = self._real.spawn(argv, cwd, env, stdin=stdin, terminal=terminal)
        return _HeldReap(real, self.reap_allowed)


class _HeldReap:
    """A real process (every method of `SpawnedProcess` is the real one's) whose `wait`, the
    reap, waits for the test. The chat asks `group_alive` when it stops or watches the group,
    so a missing method here fails the chat's stop and the test's teardown never ends."""

    def __init__(self, real: SpawnedProcess, reap_allowed: trio.Event) -> None:
        self._real = real
        self._reap_allowed = reap_allowed
        self.pid = real.pid

    @property
    def stdin(self) -> StdinPort | None:
        return self._real.stdin

    async def read_some(self) -> bytes:
        return await self._real.read_some()

    def read_available(self) -> bytes:
        return self._real.read_available()

    async def wait(self) -> ExitStatus:
        await self._reap_allowed.wait()
        return await self._real.wait()

    def signal_group(self, sig: signal.Signals) -> bool:
        return self._real.signal_group(sig)

    def group_alive(self) -> bool:
        return self._real.group_alive()

    def poll_exited(self) -> bool:
        return self._real.poll_exited()

    def close(self) -> None:
        self._real.close()


async def test_process_signal_to_an_exited_process_not_reaped_yet_is_not_delivered(
    make_server: MakeServer,
) -> None:
    """The shell exits while the agent's reap of it is held back (`_HeldReapBackend`), so
    `process_signal` arrives while the shell is a zombie, every time. `killpg` succeeds on a
    group whose only member is a zombie; the command has nonetheless ended and nothing
    receives the signal, so it must not be reported delivered."""
    backend = _HeldReapBackend()
    server = await make_server(backend=backend)
    with trio.fail_after(TEST_DEADLINE_S):
        async with server.connect() as conn:
            await background(conn, "p", "exit 5")
            pid = (await wait_for(conn, of("started", "p")))["pid"]
            pidfd = os.pidfd_open(pid)  # readable once the shell has exited (reaped or not)
            try:
                await trio.lowlevel.wait_readable(pidfd)
            finally:
                os.close(pidfd)
            sent = await run(conn, "s", "process_signal", process_id="p", signal="SIGTERM")
            backend.reap_allowed.set()
            state = await run(conn, "o", "process_output", process_id="p", wait=True)
    assert sent["outcome"] == "completed" and sent["data"] == {"delivered": False}
    assert sent["text"] == "process p has already exited; SIGTERM was not delivered"
    # The signal changed nothing: the shell's own exit stands.
    assert state["data"]["running"] is False and state["data"]["exit_code"] == 5
    assert state["data"]["signal"] is None


async def test_process_signal_after_running_false_is_not_delivered_to_a_leftover_child(
    live: LiveServer,
) -> None:
    """`process_output` says `running: false` once the shell has exited, also while a
    background child it started still runs in its process group. A later `process_signal`
    must agree that the process has exited (`killpg` would reach the child and succeed), and
    must not signal the child behind that answer: it keeps running until the cancel."""
    with trio.fail_after(TEST_DEADLINE_S):
        async with live.connect() as conn:
            done = await conn.call("c", "p", "execute", {"command": "sleep 30 & echo $!"})
            child = int(done["output"])
            try:
                state = await run(conn, "o", "process_output", process_id="p")
                sent = await run(conn, "s", "process_signal", process_id="p", signal="SIGKILL")
                child_alive = alive(child)
                await conn.send({"type": "cancel", "chat_id": "c", "call_ids": ["p"]})
                await wait_for(conn, of("cancel_result", "p"))
            finally:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(child, signal.SIGKILL)  # whatever failed above: leave nothing behind
    assert state["data"]["running"] is False and state["data"]["exit_code"] == 0
    assert sent["data"] == {"delivered": False} and "not delivered" in sent["text"]
    assert child_alive  # the SIGKILL was not sent behind a "not delivered"


async def test_process_signal_refuses_unknown_signals(live: LiveServer) -> None:
    with trio.fail_after(TEST_DEADLINE_S):
        async with live.connect() as conn:
            await background(conn, "p", "sleep 30")
            bad = await conn.call("c", "s", "process_signal", {"process_id": "p", "signal": "TERM"})
            state = await run(conn, "o", "process_output", process_id="p")
    assert bad["type"] == "error" and bad["code"] == "bad_args"
    assert state["data"]["running"] is True


# --- process_list ---------------------------------------------------------------------------------


async def test_process_list_is_newest_first_with_exit_codes_and_times(live: LiveServer) -> None:
    with trio.fail_after(TEST_DEADLINE_S):
        async with live.connect() as conn:
            first = await conn.call("c", "a", "execute", {"command": "exit 3"})
            second = await conn.call("c", "b", "execute", {"command": "sleep 30"}, background=True)
            third = await conn.call("c", "d", "execute", {"command": "true"})
            listed = await run(conn, "l", "process_list")
    assert [r["data"]["exit_code"] for r in (first, second, third)] == [3, None, 0]
    rows = listed["data"]["processes"]
    assert [r["process_id"] for r in rows] == ["d", "b", "a"]
    assert [r["command"] for r in rows] == ["true", "sleep 30", "exit 3"]
    assert [r["running"] for r in rows] == [False, True, False]
    assert [r["exit_code"] for r in rows] == [0, None, 3]
    assert rows[0]["started_at"] >= rows[1]["started_at"] >= rows[2]["started_at"]
    assert rows[1]["exited_at"] is None
    for row, result in ((rows[0], third), (rows[2], first)):
        assert row["started_at"] == result["started_at"]
        assert row["started_at"] <= row["exited_at"] <= result["finished_at"]
    assert listed["text"] == "3 processes, 1 running"


class _FakeHandle:
    pid: int | None = None

    async def read_some(self) -> bytes:
        return b""

    def read_available(self) -> bytes:
        return b""

    async def wait(self) -> ExitStatus:
        return ExitStatus(0, None)

    def signal_group(self, sig: signal.Signals) -> bool:
        return False

    def poll_exited(self) -> bool:
        return True

    def group_alive(self) -> bool:
        return False

    def close(self) -> None:
        pass


class _FakeBackend:
    def spawn(self, argv: list[str], cwd: str, env: Mapping[str, str]) -> _FakeHandle:
        return _FakeHandle()


def test_listing_is_newest_first_even_within_one_millisecond() -> None:
    table = ProcessTable(
        _FakeBackend(),
        retention_bytes=1024 * 1024,
        result_bytes=64 * 1024,
    )
    for process_id in ("first", "second", "third"):
        table.spawn(process_id, "true", ["true"], "/", {}, started_at_ms=1_000)
    table.spawn("fourth", "true", ["true"], "/", {}, started_at_ms=999)  # the wall clock stepped
    assert [p.process_id for p in table.listing()] == ["fourth", "third", "second", "first"]


# --- retention of exited processes (5.2) ----------------------------------------------------------


async def test_exited_processes_are_forgotten_after_retention(make_server: MakeServer) -> None:
    server = await make_server(limits=Limits(exited_retention_s=0))
    with trio.fail_after(TEST_DEADLINE_S):
        async with server.connect() as conn:
            await conn.call("c", "gone", "execute", {"command": "echo bye"})
            await background(conn, "live", "sleep 30")
            chat = server.agent.chats["c"]
            proc = chat.processes.get("gone")
            assert proc is not None
            await proc.output_closed.wait()  # its pipe is drained: nothing more can arrive
            server.agent.sweep()
            listed = await run(conn, "l", "process_list")
            state = await run(conn, "o", "process_output", process_id="gone")
            repeat = await conn.call("c", "gone", "execute", {"command": "echo bye"})
    # The exited process is gone; the running one is never dropped.
    assert [r["process_id"] for r in listed["data"]["processes"]] == ["live"]
    assert state["outcome"] == "failed"
    # Only the process listing was dropped: the call's record still answers a repeat.
    assert repeat["outcome"] == "completed" and repeat["output"] == "bye\n"


async def test_exited_processes_stay_listed_within_retention(live: LiveServer) -> None:
    with trio.fail_after(TEST_DEADLINE_S):
        async with live.connect() as conn:
            await conn.call("c", "done", "execute", {"command": "echo bye"})
            proc = live.agent.chats["c"].processes.get("done")
            assert proc is not None
            await proc.output_closed.wait()
            live.agent.sweep()
            state = await run(conn, "o", "process_output", process_id="done")
    assert state["outcome"] == "completed" and state["output"] == "bye\n"
    assert state["data"]["running"] is False and state["data"]["exit_code"] == 0
