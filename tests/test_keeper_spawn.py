"""A spawn through the keeper does not hold the agent's event loop (actors/kept.py,
`KeptProcessBackend.start_spawn`): `toolwire serve` with a state dir as a real process, its
keeper held still with SIGSTOP so that a spawn's reply stays outstanding for as long as the
test says, and let go with SIGCONT.

While the keeper is stopped nothing it would answer can come; what does come (another chat's
answer, the reply to a cancel's round trip) is read off the loop that the spawn would have
blocked. The keeper is always let go again (`_keeper_stopped`), whatever the test did.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from tests.keeper_support import agent, call_message, gone, keeper_pids
from tests.wsclient import RawConn
from toolwire.actors.processes import group_alive


@asynccontextmanager
async def _keeper_stopped(state: Path) -> AsyncIterator[int]:
    """The state dir's keeper, stopped (SIGSTOP) until the block ends, then let go."""
    (keeper,) = keeper_pids(state)
    os.kill(keeper, signal.SIGSTOP)
    try:
        yield keeper
    finally:
        with contextlib.suppress(ProcessLookupError):  # a test may have killed it
            os.kill(keeper, signal.SIGCONT)


def _of(message: dict[str, Any], call_id: str, kind: str) -> bool:
    return message["type"] == kind and message.get("call_id") == call_id


async def _warm(conn: RawConn) -> None:
    """One command first, so the keeper runs and has answered once before it is stopped."""
    await conn.send(call_message("warm", "execute", {"command": "true"}))
    got = await conn.recv_until(lambda m: _of(m, "warm", "result"))
    assert got[-1]["outcome"] == "completed"


async def _spawn_asked(conn: RawConn, barrier: str) -> None:
    """Until the command just called has been asked of the keeper: its spawn goes out when its
    start row is durable, and the journal commits in order, so once a write called after it
    has its result (its own start and result rows durable after that row), the spawn was sent."""
    await conn.send(call_message(barrier, "write_file", {"path": barrier, "content": "x"}))
    got = await conn.recv_until(lambda m: _of(m, barrier, "result"))
    assert got[-1]["outcome"] == "completed"


async def test_another_chats_call_is_answered_while_a_spawn_waits_for_the_keeper(
    tmp_path: Path,
) -> None:
    """Chat `c`'s `execute` is asked of a keeper that cannot answer: chat `d`'s call is
    answered meanwhile, before `c`'s call has a `started` or a result (a loop blocked in the
    spawn's request would have taken nothing until the keeper answered or the request timed
    out, and then `c`'s call would have ended first). Once the keeper goes on, `c`'s command
    runs and ends as usual."""
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "note").write_text("hello")
    async with agent(tmp_path) as (_server, conn):
        await _warm(conn)
        async with _keeper_stopped(tmp_path / "state"):
            await conn.send(call_message("k", "execute", {"command": "echo ran"}, stream=True))
            await conn.recv_until(lambda m: _of(m, "k", "accepted"))
            await _spawn_asked(conn, "w")
            other = {**call_message("r", "read_file", {"path": "note"}), "chat_id": "d"}
            await conn.send(other)
            got = await conn.recv_until(lambda m: _of(m, "r", "result"))
            assert got[-1]["outcome"] == "completed" and "hello" in str(got[-1]["data"])
            ended = [m for m in conn.seen if _of(m, "k", "started") or _of(m, "k", "result")]
            assert not ended, "the spawn ended before the keeper answered"
        got = await conn.recv_until(lambda m: _of(m, "k", "result"))
        assert got[-1]["outcome"] == "completed" and got[-1]["output"] == "ran\n"
        assert [m for m in conn.seen if _of(m, "k", "started")], "no `started` before the result"


async def test_a_cancel_while_the_spawn_waits_for_the_keeper_stops_the_command(
    tmp_path: Path,
) -> None:
    """5.3 with a spawn outstanding: the cancel is taken at once (a later request is answered
    before the keeper answers), but its `cancel_result` waits. Once the keeper answers, the
    command is stopped at once: it never gets to its end (`finished` is never written), the
    call ends `canceled`, and nothing of its group is left when the `cancel_result` comes."""
    ws = tmp_path / "ws"
    ws.mkdir()
    command = "sleep 30; touch finished"
    async with agent(tmp_path) as (_server, conn):
        await _warm(conn)
        async with _keeper_stopped(tmp_path / "state"):
            await conn.send(call_message("k", "execute", {"command": command}, stream=True))
            await conn.recv_until(lambda m: _of(m, "k", "accepted"))
            await _spawn_asked(conn, "w")
            await conn.send({"type": "cancel", "chat_id": "c", "call_ids": ["k"]})
            # A round trip after the cancel: the cancel was taken by the time it comes back.
            await conn.send(call_message("r", "list_dir", {"path": "."}))
            await conn.recv_until(lambda m: _of(m, "r", "result"))
            assert not [m for m in conn.seen if m["type"] == "cancel_result"], (
                "the cancel was answered while the command may be starting"
            )
        got = await conn.recv_until(lambda m: m["type"] == "cancel_result")
        result = got[-1]["result"]
        assert result["outcome"] == "canceled" and result["canceled"]
        (started,) = [m for m in conn.seen if _of(m, "k", "started")]
        pid = started["pid"]
        with trio.fail_after(30):
            await gone(pid)
        assert not group_alive(pid), "a member of the canceled command's group still runs"
        assert not (ws / "finished").exists()


async def test_a_keeper_lost_with_a_spawn_outstanding_ends_the_call_unknown(
    tmp_path: Path,
) -> None:
    """9.9 with 10.1: the keeper dies while it holds a spawn unanswered. It may have started
    the command, so the call ends `unknown` with the agent-failure text (never `failed`, which
    would say nothing ran), and the next command is held by a new keeper."""
    ws = tmp_path / "ws"
    ws.mkdir()
    async with agent(tmp_path) as (_server, conn):
        await _warm(conn)
        async with _keeper_stopped(tmp_path / "state") as keeper:
            await conn.send(call_message("k", "execute", {"command": "echo ran"}))
            await conn.recv_until(lambda m: _of(m, "k", "accepted"))
            await _spawn_asked(conn, "w")
            os.kill(keeper, signal.SIGKILL)
            got = await conn.recv_until(lambda m: _of(m, "k", "result"))
        assert got[-1]["outcome"] == "unknown"
        assert "outcome is unknown" in got[-1]["text"]
        await conn.send(call_message("n", "execute", {"command": "echo next"}))
        after = await conn.recv_until(lambda m: _of(m, "n", "result"))
        assert after[-1]["outcome"] == "completed" and after[-1]["output"] == "next\n"
        assert keeper_pids(tmp_path / "state") not in ([], [keeper])


@pytest.mark.parametrize("sandbox", [None, {"filesystem": "workspace_write"}])
async def test_on_shutdown_keep_with_a_spawn_outstanding_leaves_the_command_to_the_keeper(
    tmp_path: Path, sandbox: dict[str, str] | None
) -> None:
    """10.1's upgrade path with a spawn unanswered: `--on-shutdown keep`, the keeper stopped
    while it holds chat `c`'s spawn, then SIGTERM. The agent does not wait for the keeper: it
    exits 0 at once. The keeper, let go, carries out the spawn it was told (the request was
    already on its socket) and holds the command; the next agent re-adopts it, and the call
    ends with its real result. The command ran once. The same for a sandboxed command, whose
    spawn the keeper hands to a confined thread."""
    ws = tmp_path / "ws"
    ws.mkdir()
    command = "echo ran >> runs; echo ran"
    extra = {} if sandbox is None else {"sandbox": sandbox}
    async with agent(tmp_path, "--on-shutdown", "keep") as (server, conn):
        await _warm(conn)
        async with _keeper_stopped(tmp_path / "state"):
            await conn.send(call_message("k", "execute", {"command": command}, **extra))
            await conn.recv_until(lambda m: _of(m, "k", "accepted"))
            await _spawn_asked(conn, "w")
            server.process.send_signal(signal.SIGTERM)
            with trio.fail_after(5):  # 10.1: exits 0 within one second (room for load)
                assert await server.process.wait() == 0
            assert not (ws / "runs").exists(), "the command ran while the keeper was stopped"
    async with agent(tmp_path) as (_server, conn):
        await conn.send(call_message("k", "execute", {"command": command}, **extra))
        got = await conn.recv_until(lambda m: _of(m, "k", "result"))
    assert got[-1]["outcome"] == "completed", got[-1]
    assert got[-1]["output"] == "ran\n" and got[-1]["data"]["exit_code"] == 0
    assert (ws / "runs").read_text() == "ran\n"
