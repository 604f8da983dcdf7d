"""Commands that outlive the agent (PROTOCOL.md 10.1): `toolwire serve` as a real process,
killed with SIGKILL while its commands run, and started again on the same state dir.

Each command says when it reached a point by writing to a FIFO the test reads (an event, not
a sleep), and waits for the test's go-ahead by polling for a file the test creates (that loop
is the command's own, not the test's). Each command also appends a line to `runs` when it
starts: nothing may run twice.
"""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import sys
from pathlib import Path
from typing import Any

import trio

from tests.keeper_support import agent, call_message, gone, keeper_pids
from tests.test_serve import ServeProcess
from tests.wsclient import RawConn, connect
from toolwire.actors.keeper_store import SPARE_FILES
from toolwire.actors.kept import adopt_window

RESTARTED = "the agent restarted while the tool call was running; its outcome is unknown"
KEEPER_GONE = (
    "the keeper holding the command was killed while it ran; the rest of its process group "
    "was stopped and its outcome is unknown"
)


def _wait_for(name: str) -> str:
    """Shell: wait (polling, inside the command) until the file `name` exists."""
    return f"while [ ! -e {name} ]; do sleep 0.01; done"


def _tell(fifo: str) -> str:
    return f"echo x > {fifo}"


async def _told(path: Path) -> None:
    """Wait until the command wrote to the FIFO `path` (opening it blocks until it does)."""

    def read() -> None:
        with path.open() as fifo:
            fifo.read()

    with trio.fail_after(30):
        await trio.to_thread.run_sync(read)


async def _kill9(server: ServeProcess) -> None:
    server.process.kill()
    await server.process.wait()


def _output_of(messages: list[dict[str, Any]]) -> tuple[int, str]:
    """The first offset and the output stitched from `output` events, checking they join."""
    first: int | None = None
    text = ""
    for m in messages:
        if m["type"] != "output":
            continue
        if first is None:
            first = m["offset"]
        else:
            assert m["offset"] == first + len(text.encode()), messages
        text += m["data"]
    return (first or 0), text


def _fifos(ws: Path, *names: str) -> None:
    for name in names:
        os.mkfifo(ws / name)


async def test_a_foreground_command_survives_kill_9_of_the_agent_and_ends_with_its_result(
    tmp_path: Path,
) -> None:
    """Printed before, during and after the downtime: re-attached from 0 and from the offset
    the client had, the stitched output is the command's, one result with its exit code."""
    ws = tmp_path / "ws"
    ws.mkdir()
    _fifos(ws, "f1", "f2")
    command = (
        f"echo run >> runs; echo before; {_tell('f1')}; {_wait_for('go1')}; echo during; "
        f"{_tell('f2')}; {_wait_for('go2')}; echo after; exit 3"
    )
    call = {"type": "call", "chat_id": "c", "call_id": "k", "tool": "execute",
            "args": {"command": command}}  # fmt: skip
    async with agent(tmp_path) as (server, conn):
        assert "keeps_commands" in conn.welcome["features"]
        await conn.send(call)
        await _told(ws / "f1")
        seen = await conn.recv_until(lambda m: m["type"] == "output" and "before" in m["data"])
        had = sum(len(m["data"].encode()) for m in seen if m["type"] == "output")
        await _kill9(server)
    (ws / "go1").touch()
    await _told(ws / "f2")  # "during" was printed while no agent ran
    async with agent(tmp_path) as (server, conn):
        await conn.send({"type": "attach", "chat_id": "c", "call_id": "k", "from_offset": 0})
        got = await conn.recv_until(lambda m: m["type"] == "output" and "during" in m["data"])
        assert got[0]["type"] == "accepted" and got[0]["state"] == "running"
        token = (tmp_path / "state" / "token").read_text().strip()
        async with connect(server.url, token) as other:
            await other.send({"type": "attach", "chat_id": "c", "call_id": "k", "from_offset": had})
            resumed = await other.recv_until(
                lambda m: m["type"] == "output" and "during" in m["data"]
            )
            (ws / "go2").touch()
            resumed += await other.recv_until(lambda m: m["type"] == "result")
        got += await conn.recv_until(lambda m: m["type"] == "result")
        # A repeat of the call after its end: the saved result, nothing run again.
        await conn.send(call)
        repeat = await conn.recv_until(lambda m: m["type"] == "result")
    assert _output_of(got) == (0, "before\nduring\nafter\n")
    assert _output_of(resumed) == (had, "during\nafter\n")
    results = [m for m in got if m["type"] == "result"]
    assert len(results) == 1
    result = results[0]
    assert result["outcome"] == "completed" and result["data"]["exit_code"] == 3
    assert result["output"] == "before\nduring\nafter\n"
    assert repeat[-1] == result
    assert (ws / "runs").read_text() == "run\n"


async def test_more_commands_than_the_adopt_window_are_each_re_adopted_with_their_own_output(
    tmp_path: Path,
) -> None:
    """A restart asks the keeper for several processes at once (`kept.adopt_window`): each
    call still gets its own process back, its own output stitched from offset 0 and its own
    result, and none runs twice."""
    ws = tmp_path / "ws"
    ws.mkdir()
    count = 3 * adopt_window() + 1
    _fifos(ws, *(f"f{i}" for i in range(count)))
    async with agent(tmp_path) as (server, conn):
        for i in range(count):
            command = (
                f"echo run{i} >> runs; echo before{i}; {_tell(f'f{i}')}; {_wait_for('go')}; "
                f"echo after{i}; exit {i}"
            )
            await conn.send({"type": "call", "chat_id": "c", "call_id": f"k{i}",
                             "tool": "execute", "args": {"command": command}})  # fmt: skip
        for i in range(count):
            await _told(ws / f"f{i}")
        await _kill9(server)
    async with agent(tmp_path) as (server, conn):
        for i in range(count):
            await conn.send({"type": "attach", "chat_id": "c", "call_id": f"k{i}",
                             "from_offset": 0})  # fmt: skip
        (ws / "go").touch()
        got: list[dict[str, Any]] = []
        results: dict[str, dict[str, Any]] = {}
        with trio.fail_after(60):
            while len(results) < count:
                message = await conn.recv()
                got.append(message)
                if message["type"] == "result":
                    results[message["call_id"]] = message
    for i in range(count):
        mine = [m for m in got if m.get("call_id") == f"k{i}"]
        assert _output_of(mine) == (0, f"before{i}\nafter{i}\n"), mine
        result = results[f"k{i}"]
        assert result["outcome"] == "completed" and result["data"]["exit_code"] == i, result
        assert result["output"] == f"before{i}\nafter{i}\n"
    assert sorted((ws / "runs").read_text().split()) == sorted(f"run{i}" for i in range(count))


async def test_the_keeper_keeps_no_descriptor_for_a_finished_command(tmp_path: Path) -> None:
    """Finished commands stay listed for an hour: the keeper holds their records on disk, not
    a pidfd and an open file each, or a busy hour of short commands would exhaust its
    descriptors (and a keeper that fails a spawn there takes every command with it). Also
    re-adopted after a restart, each such command gives its saved result."""
    count = 40
    async with agent(tmp_path) as (server, conn):
        [keeper] = keeper_pids(tmp_path / "state")
        before = None
        for i in range(count):
            # Every other one with a stdin pipe, whose write end the keeper holds while it runs.
            await conn.send({"type": "call", "chat_id": "c", "call_id": f"k{i}", "tool": "execute",
                             "args": {"command": f"echo {i}", "stdin": i % 2 == 1}})  # fmt: skip
            await conn.recv_until(lambda m: m["type"] == "result")
            if i == 4:
                before = len(os.listdir(f"/proc/{keeper}/fd"))
        after = len(os.listdir(f"/proc/{keeper}/fd"))
        # Two per finished command before (70 here); the spare files it makes ahead of the
        # spawns come and go, up to SPARE_FILES open at once.
        assert before is not None and after <= before + SPARE_FILES, (before, after)
        await _kill9(server)
    async with agent(tmp_path) as (server, conn):
        await conn.send({"type": "call", "chat_id": "c", "call_id": "k7", "tool": "execute",
                         "args": {"command": "echo 7", "stdin": True}})  # fmt: skip
        got = await conn.recv_until(lambda m: m["type"] == "result")
        await conn.send({"type": "call", "chat_id": "c", "call_id": "l", "tool": "process_output",
                         "args": {"process_id": "k9"}})  # fmt: skip
        listed = await conn.recv_until(lambda m: m["type"] == "result")
    assert got[-1]["outcome"] == "completed" and got[-1]["output"] == "7\n", got[-1]
    assert listed[-1]["outcome"] == "completed", listed[-1]
    assert listed[-1]["data"]["running"] is False and listed[-1]["data"]["exit_code"] == 0
    assert listed[-1]["output"] == "9\n"


async def test_a_command_that_ends_while_no_agent_runs_gets_its_real_result(
    tmp_path: Path,
) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    _fifos(ws, "f1")
    command = (
        f"echo run >> runs; echo $$ > pid; echo one; {_tell('f1')}; {_wait_for('go')}; "
        "echo two; exit 5"
    )
    async with agent(tmp_path) as (server, conn):
        await conn.send({"type": "call", "chat_id": "c", "call_id": "k", "tool": "execute",
                         "args": {"command": command}})  # fmt: skip
        await _told(ws / "f1")
        await _kill9(server)
    (ws / "go").touch()
    await gone(int((ws / "pid").read_text()))  # it ended while no agent ran
    async with agent(tmp_path) as (server, conn):
        await conn.send({"type": "attach", "chat_id": "c", "call_id": "k", "from_offset": 0})
        got = await conn.recv_until(lambda m: m["type"] == "result")
    result = got[-1]
    assert result["outcome"] == "completed" and result["data"]["exit_code"] == 5, (
        result,
        (tmp_path / "state" / "keeper" / "keeper.log").read_text(),
    )
    assert result["output"] == "one\ntwo\n"
    assert (ws / "runs").read_text() == "run\n"


async def test_a_keeper_killed_with_its_process_ends_the_call_unknown_with_its_output(
    tmp_path: Path,
) -> None:
    """As a reboot does: agent, keeper and command all gone; the journal says running."""
    ws = tmp_path / "ws"
    ws.mkdir()
    _fifos(ws, "f1")
    command = f"echo $$ > pid; echo printed; {_tell('f1')}; {_wait_for('never')}"
    async with agent(tmp_path) as (server, conn):
        await conn.send({"type": "call", "chat_id": "c", "call_id": "k", "tool": "execute",
                         "args": {"command": command}})  # fmt: skip
        await _told(ws / "f1")
        await conn.recv_until(lambda m: m["type"] == "output" and "printed" in m["data"])
        keepers = keeper_pids(tmp_path / "state")
        assert len(keepers) == 1
        shell = int((ws / "pid").read_text())
        await _kill9(server)
    os.kill(keepers[0], signal.SIGKILL)
    os.killpg(shell, signal.SIGKILL)
    await gone(keepers[0])
    await gone(shell)
    async with agent(tmp_path) as (server, conn):
        await conn.send({"type": "attach", "chat_id": "c", "call_id": "k", "from_offset": 0})
        got = await conn.recv_until(lambda m: m["type"] == "result")
    result = got[-1]
    assert result["outcome"] == "unknown"
    assert result["text"] == RESTARTED
    assert result["output"] == "printed\n"


async def test_a_journal_that_says_running_for_a_process_whose_keeper_is_gone(
    tmp_path: Path,
) -> None:
    """The agent is killed, then its keeper alone: the command runs on, its output going
    nowhere, its exit never to be recorded. The next agent ends the call `unknown` with the
    output recorded up to then, and stops the command (nothing runs on unseen), once."""
    ws = tmp_path / "ws"
    ws.mkdir()
    _fifos(ws, "f1")
    command = f"echo run >> runs; echo $$ > pid; echo printed; {_tell('f1')}; {_wait_for('never')}"
    async with agent(tmp_path) as (server, conn):
        await conn.send(call_message("k", "execute", {"command": command}))
        await _told(ws / "f1")
        await conn.recv_until(lambda m: m["type"] == "output" and "printed" in m["data"])
        (keeper,) = keeper_pids(tmp_path / "state")
        await _kill9(server)
    os.kill(keeper, signal.SIGKILL)
    await gone(keeper)
    shell = int((ws / "pid").read_text())
    os.kill(shell, 0)  # it still runs
    async with agent(tmp_path) as (server, conn):
        await gone(shell)  # stopped at the restart
        result = await _result(conn, call_message("k", "execute", {"command": command}))
    assert result["outcome"] == "unknown" and result["text"] == RESTARTED
    assert result["output"] == "printed\n"
    assert (ws / "runs").read_text() == "run\n"


async def test_a_keeper_killed_under_a_live_agent_ends_its_call_unknown_a_new_one_holds_the_next(
    tmp_path: Path,
) -> None:
    """The keeper alone is killed: the call it held ends `unknown` with the output read up to
    then and a text saying why, nothing of its group runs on, and the next command is held by
    a new keeper (it survives a kill -9 of the agent in turn)."""
    ws = tmp_path / "ws"
    ws.mkdir()
    _fifos(ws, "f1")
    command = f"echo $$ > pid; echo printed; {_tell('f1')}; {_wait_for('never')}"
    async with agent(tmp_path) as (_server, conn):
        await conn.send(call_message("k", "execute", {"command": command}))
        await _told(ws / "f1")
        await conn.recv_until(lambda m: m["type"] == "output" and "printed" in m["data"])
        shell = int((ws / "pid").read_text())
        (keeper,) = keeper_pids(tmp_path / "state")
        os.kill(keeper, signal.SIGKILL)
        got = await conn.recv_until(lambda m: m["type"] == "result")
        result = got[-1]
        assert result["outcome"] == "unknown"
        assert result["text"] == KEEPER_GONE
        assert result["output"] == "printed\n"
        await gone(shell)  # its group was stopped: nothing runs unseen
        after = await _result(conn, call_message("n", "execute", {"command": "echo next"}))
        assert after["outcome"] == "completed" and after["output"] == "next\n"
        assert keeper_pids(tmp_path / "state") not in ([], [keeper])


async def _result(conn: RawConn, message: dict[str, Any]) -> dict[str, Any]:
    await conn.send(message)
    got = await conn.recv_until(
        lambda m: m["type"] == "result" and m["call_id"] == message["call_id"]
    )
    return got[-1]


async def test_a_terminal_is_typed_into_once_after_re_adoption(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    command = "echo run >> runs; read line; echo got:$line; exit 4"
    call = call_message("t", "execute", {"command": command, "pty": {"rows": 24, "cols": 80}})
    async with agent(tmp_path) as (server, conn):
        await conn.send(call)
        await conn.recv_until(lambda m: m["type"] == "started")
        await _kill9(server)
    async with agent(tmp_path) as (server, conn):
        typed = call_message("in", "process_input", {"process_id": "t", "data": "hello\n"})
        first = await _result(conn, typed)
        assert first["outcome"] == "completed", first
        again = await _result(conn, typed)  # a retry after a lost reply types nothing
        assert again == first
        await conn.send({"type": "attach", "chat_id": "c", "call_id": "t", "from_offset": 0})
        got = await conn.recv_until(lambda m: m["type"] == "result" and m["call_id"] == "t")
    result = got[-1]
    assert result["data"]["exit_code"] == 4
    assert result["output"].count("got:hello") == 1
    assert (ws / "runs").read_text() == "run\n"


async def test_a_pipe_stdin_command_takes_input_and_eof_after_re_adoption(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    call = call_message(
        "p", "execute", {"command": "echo run >> runs; cat; echo done", "stdin": True}
    )
    async with agent(tmp_path) as (server, conn):
        await conn.send(call)
        await conn.recv_until(lambda m: m["type"] == "started")
        await _kill9(server)
    async with agent(tmp_path) as (server, conn):
        typed = call_message(
            "in", "process_input", {"process_id": "p", "data": "abc\n", "eof": True}
        )
        assert (await _result(conn, typed))["outcome"] == "completed"
        await conn.send({"type": "attach", "chat_id": "c", "call_id": "p", "from_offset": 0})
        got = await conn.recv_until(lambda m: m["type"] == "result" and m["call_id"] == "p")
    assert got[-1]["output"] == "abc\ndone\n"
    assert got[-1]["data"]["exit_code"] == 0
    assert (ws / "runs").read_text() == "run\n"


async def test_background_and_timed_out_processes_are_re_adopted(tmp_path: Path) -> None:
    """Their calls returned before the restart; their processes are listed as running,
    their output (also what was printed while no agent ran) readable, their exit recorded."""
    ws = tmp_path / "ws"
    ws.mkdir()
    _fifos(ws, "b1", "t1")
    bg = call_message("bg", "execute", {"command": f"echo bg1; {_tell('b1')}; {_wait_for('go')}; "
                                 "echo bg2; exit 6"}, background=True)  # fmt: skip
    slow_command = f"echo t1; {_tell('t1')}; {_wait_for('go')}; echo t2"
    slow = call_message("slow", "execute", {"command": slow_command}, timeout_ms=50)
    async with agent(tmp_path) as (server, conn):
        assert (await _result(conn, bg))["outcome"] == "completed"
        await _told(ws / "b1")
        timed = await _result(conn, slow)
        assert timed["outcome"] == "timed_out"
        await _told(ws / "t1")
        await _kill9(server)
    async with agent(tmp_path) as (server, conn):
        listing = await _result(conn, call_message("l1", "process_list", {}))
        running = {p["process_id"]: p for p in listing["data"]["processes"]}
        assert running["bg"]["running"] and running["slow"]["running"], listing
        (ws / "go").touch()
        for pid, text, code in (("bg", "bg1\nbg2\n", 6), ("slow", "t1\nt2\n", 0)):
            out = call_message(f"o-{pid}", "process_output",
                        {"process_id": pid, "wait": True, "wait_ms": 20_000})  # fmt: skip
            read = await _result(conn, out)
            while read["data"]["running"]:
                read = await _result(conn, {**out, "call_id": out["call_id"] + "x"})
                out = {**out, "call_id": out["call_id"] + "x"}
            assert read["output"] == text and read["data"]["exit_code"] == code, read
        # The calls keep the results they had.
        assert (await _result(conn, slow)) == timed


async def test_kill_after_that_passes_while_no_agent_runs_is_enforced_by_the_keeper(
    tmp_path: Path,
) -> None:
    """9.2 while no agent runs (10.1): the keeper stops the group when the deadline passes
    (the command is gone before any agent starts again), and the next agent's result says
    so."""
    ws = tmp_path / "ws"
    ws.mkdir()
    _fifos(ws, "f1")
    command = f"echo run >> runs; echo $$ > pid; echo up; {_tell('f1')}; {_wait_for('never')}"
    call = call_message("k", "execute", {"command": command, "kill_after_ms": 300})
    async with agent(tmp_path) as (server, conn):
        await conn.send(call)
        await _told(ws / "f1")
        await _kill9(server)
    await gone(int((ws / "pid").read_text()))  # stopped by its keeper: no agent runs
    async with agent(tmp_path) as (server, conn):
        await conn.send({"type": "attach", "chat_id": "c", "call_id": "k", "from_offset": 0})
        got = await conn.recv_until(lambda m: m["type"] == "result")
        listed = await _result(conn, call_message("l", "process_output", {"process_id": "k"}))
    result = got[-1]
    assert result["outcome"] == "timed_out" and result["timed_out"] is True
    assert (
        result["text"] == "tool call ran past its kill_after_ms of 300 ms; the process was stopped"
    )
    assert result["output"] == "up\n"
    assert listed["data"]["running"] is False and listed["data"]["timed_out"] is True
    assert (ws / "runs").read_text() == "run\n"


async def test_two_restarts_in_a_row_and_on_shutdown_keep(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    _fifos(ws, "f1", "f2", "f3")
    command = (
        f"echo run >> runs; echo a; {_tell('f1')}; {_wait_for('go1')}; echo b; {_tell('f2')}; "
        f"{_wait_for('go2')}; echo c; {_tell('f3')}; {_wait_for('go3')}; echo d; exit 9"
    )
    async with agent(tmp_path, "--on-shutdown", "keep") as (server, conn):
        await conn.send(call_message("k", "execute", {"command": command}))
        await _told(ws / "f1")
        server.process.send_signal(signal.SIGTERM)
        with trio.fail_after(5):  # 10.1: exits 0 within one second (room for load)
            assert await server.process.wait() == 0
    (ws / "go1").touch()
    await _told(ws / "f2")
    async with agent(tmp_path) as (server, conn):
        await conn.send({"type": "attach", "chat_id": "c", "call_id": "k", "from_offset": 0})
        await conn.recv_until(lambda m: m["type"] == "output" and "b" in m["data"])
        await _kill9(server)
    (ws / "go2").touch()
    await _told(ws / "f3")
    async with agent(tmp_path) as (server, conn):
        await conn.send({"type": "attach", "chat_id": "c", "call_id": "k", "from_offset": 0})
        got = await conn.recv_until(lambda m: m["type"] == "output" and "c" in m["data"])
        (ws / "go3").touch()
        got += await conn.recv_until(lambda m: m["type"] == "result")
    assert _output_of(got) == (0, "a\nb\nc\nd\n")
    assert got[-1]["data"]["exit_code"] == 9 and got[-1]["output"] == "a\nb\nc\nd\n"
    assert (ws / "runs").read_text() == "run\n"


_ROGUE = r"""
import socket, sys, msgspec
sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
try:
    sock.connect(sys.argv[1])
except OSError as e:
    print("connect:", e.strerror); sys.exit(0)
sock.settimeout(5)
spawn = {"op": "spawn", "rid": 1, "key": "rogue", "argv": ["/bin/sh", "-c", "touch " + sys.argv[2]],
         "cwd": "/", "env": {}, "meta": {}}
for message in ({"op": "ping", "rid": 0, "secret": "guess"}, spawn):
    try:
        sock.send(msgspec.msgpack.encode(message))
        print("reply:", sock.recv(65536) or "closed")
    except OSError as e:
        print("refused:", e.strerror or type(e).__name__)
"""


async def test_a_command_that_asks_the_keeper_itself_is_refused(tmp_path: Path) -> None:
    """The keeper's socket is this user's, and a command runs as this user (under a sandbox
    too): a connection that does not open with the directory's secret is closed before
    anything it asks is done, and the agent's own connection stays, so a command can neither
    spawn through the keeper (out of its sandbox) nor cut the agent off its processes."""
    sock = tmp_path / "state" / "keeper" / "keeper.sock"
    marker = tmp_path / "rogue-ran"
    (tmp_path / "ws").mkdir(exist_ok=True)
    (tmp_path / "ws" / "rogue.py").write_text(_ROGUE)
    async with agent(tmp_path) as (_server, conn):
        first = await conn.call("c", "warm", "execute", {"command": "true"})  # a keeper runs
        assert first["type"] == "result" and first["data"]["exit_code"] == 0
        results = []
        for call_id, sandbox in (("open", None), ("confined", {"filesystem": "workspace_write"})):
            extra = {} if sandbox is None else {"sandbox": sandbox}
            command = f"{sys.executable} rogue.py {sock} {marker}"
            with trio.fail_after(30):
                results.append(
                    await conn.call("c", call_id, "execute", {"command": command}, **extra)
                )
        after = await conn.call("c", "after", "execute", {"command": "echo still"})
    for result in results:
        assert result["data"]["exit_code"] == 0, result["output"]
        assert "reply: closed" in result["output"] or "refused" in result["output"], result
        assert "reply: b" not in result["output"], result["output"]  # nothing was answered
    assert not marker.exists()
    assert after["output"] == "still\n"  # the agent still holds its keeper connection


def _children_of(pid: int) -> list[str]:
    """The command lines of `pid`'s children."""
    lines = []
    for task in os.listdir(f"/proc/{pid}/task"):
        for child in Path(f"/proc/{pid}/task/{task}/children").read_text().split():
            with contextlib.suppress(OSError):
                lines.append(Path(f"/proc/{child}/cmdline").read_bytes().replace(b"\0", b" "))
    return [line.decode(errors="replace") for line in lines]


async def test_a_process_the_keeper_cannot_hold_is_killed_its_call_unknown_the_keeper_lives_on(
    tmp_path: Path,
) -> None:
    """Out of descriptors right after a spawn (its pidfd made, the agent's output socket not):
    the keeper kills the process and its group at once and says so, the call ends `unknown`
    (it ran, if only for an instant), and the keeper, which holds every other command, goes on.
    The limit is set on the live keeper so that exactly the socketpair after the spawn fails:
    the pipe takes two of the three descriptors left, the child's /dev/null the third, the
    write end closed after the spawn gives one back for the pidfd."""
    procs = tmp_path / "state" / "keeper" / "p"
    async with agent(tmp_path) as (_server, conn):
        first = await conn.call("c", "warm", "execute", {"command": "true"})  # a keeper runs
        assert first["data"]["exit_code"] == 0
        [keeper] = keeper_pids(tmp_path / "state")
        # Its spare files made, so that it opens no descriptor between the count and the
        # spawn. Another process's files: no event of ours says when, so their count is read.
        with trio.fail_after(30):
            while sum(name.startswith("s") for name in os.listdir(procs)) < SPARE_FILES:  # noqa: ASYNC110
                await trio.sleep(0.01)
        soft, hard = resource.prlimit(keeper, resource.RLIMIT_NOFILE)
        resource.prlimit(
            keeper, resource.RLIMIT_NOFILE, (len(os.listdir(f"/proc/{keeper}/fd")) + 3, hard)
        )
        try:
            lost = await conn.call("c", "lost", "execute", {"command": "sleep 30 # held-not"})
        finally:
            resource.prlimit(keeper, resource.RLIMIT_NOFILE, (soft, hard))
        assert lost["outcome"] == "unknown", lost
        assert lost["text"] == "tool call failed inside the agent; its outcome is unknown"
        assert not any("held-not" in line for line in _children_of(keeper))  # killed, reaped
        after = await conn.call("c", "after", "execute", {"command": "echo still"})
        assert after["output"] == "still\n"
        assert keeper_pids(tmp_path / "state") == [keeper]  # the same keeper, alive
