"""Interactive and long-running commands through a real server (PROTOCOL.md 9.1, 9.2): stdin
pipes and terminals written with `process_input`, `process_resize`, and the hard deadline
`kill_after_ms`. Real processes, real terminals, real sockets."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import trio

from tests.conftest import LiveServer
from tests.oswatch import alive
from tests.wsclient import Message, RawConn, of, wait_for

TEST_DEADLINE_S = 20.0


async def start(conn: RawConn, call_id: str, command: str, **args: Any) -> Message:
    """A background command (with `stdin`, `pty`, ... in args)."""
    result = await conn.call("c", call_id, "execute", {"command": command, **args}, background=True)
    assert result["outcome"] == "completed", result
    return result


async def run_streaming(conn: RawConn, call_id: str, command: str, **args: Any) -> None:
    """A foreground command whose output `conn` streams live until its result."""
    await conn.send({"type": "call", "chat_id": "c", "call_id": call_id, "tool": "execute",
                     "args": {"command": command, **args}, "stream": True})  # fmt: skip
    await wait_for(conn, of("started", call_id))


async def type_in(conn: RawConn, call_id: str, process_id: str, data: str, **args: Any) -> Message:
    result = await conn.call(
        "c", call_id, "process_input", {"process_id": process_id, "data": data, **args}
    )
    assert result["type"] == "result", result
    return result


async def printed(conn: RawConn, process_id: str, text: str) -> None:
    """Wait until the command's streamed output holds `text` (an event, not a sleep)."""

    def has_it() -> bool:
        got = "".join(m["data"] for m in conn.seen if m["type"] == "output"
                      and m["call_id"] == process_id)  # fmt: skip
        return text in got

    while not has_it():
        await conn.recv()


async def exit_of(conn: RawConn, call_id: str, process_id: str) -> Message:
    result = await conn.call(
        "c", call_id, "process_output", {"process_id": process_id, "wait": True, "wait_ms": 15_000}
    )
    assert result["data"]["running"] is False, result
    return result


async def test_a_prompt_is_answered_and_a_retried_input_types_once(
    live: LiveServer, tmp_path: Path
) -> None:
    typed = live.workspace / "typed.txt"
    with trio.fail_after(TEST_DEADLINE_S):
        async with live.connect() as conn:
            await run_streaming(
                conn,
                "sh",
                'read -p "name? " n; echo "hello $n"; '
                'while read -r line; do echo "$line" >> typed.txt; echo got; done',
                shell="bash",
                pty={"rows": 24, "cols": 80},
            )
            await printed(conn, "sh", "name? ")
            answer = await type_in(conn, "i1", "sh", "ada\n", wait_ms=5000)
            await printed(conn, "sh", "hello ada")
            line = await type_in(conn, "i2", "sh", "once\n", wait_ms=5000)
            again = await type_in(conn, "i2", "sh", "once\n", wait_ms=5000)  # a retry
        async with live.connect() as other:  # a retry after a reconnect
            after = await type_in(other, "i2", "sh", "once\n", wait_ms=5000)
            await type_in(other, "i3", "sh", "", eof=True)
            await exit_of(other, "w", "sh")
    assert answer["outcome"] == "completed" and answer["data"]["written"] == 4
    assert line["outcome"] == "completed" and line["data"]["written"] == 5
    # The retries got the saved result: the program saw the line once.
    assert again == line and after == line
    assert typed.read_text() == "once\n"
    assert line["data"]["stdin_offset"] == 9  # "ada\n" and "once\n": every input's bytes


async def test_python_on_a_terminal_resizes_and_takes_ctrl_c(live: LiveServer) -> None:
    with trio.fail_after(TEST_DEADLINE_S):
        async with live.connect() as conn:
            # `exec`: Ctrl-C goes to the terminal's whole foreground group, the shell included.
            await run_streaming(conn, "py", "exec python3 -q -i", pty={"rows": 24, "cols": 80})
            await printed(conn, "py", ">>> ")
            await type_in(conn, "a", "py", "print(6 * 7)\n", wait_ms=2000)
            await printed(conn, "py", "42\r\n")  # the terminal's line ends
            size = await conn.call(
                "c", "r", "process_resize", {"process_id": "py", "rows": 30, "cols": 100}
            )
            await type_in(conn, "b", "py", "import subprocess; subprocess.run(['stty', 'size'])\n")
            await printed(conn, "py", "30 100\r\n")
            # A statement that says, from inside its loop, that it runs (its echo does not hold
            # the joined word), so the Ctrl-C comes while it runs.
            loop = "for i in itertools.count():\n    if i == 1000: print('sp' + 'inning')\n\n"
            await type_in(conn, "c0", "py", "import itertools\n")
            await type_in(conn, "c1", "py", loop)
            await printed(conn, "py", "spinning\r\n")
            await type_in(conn, "c2", "py", "\x03")  # Ctrl-C
            await printed(conn, "py", "KeyboardInterrupt")
            await type_in(conn, "d", "py", "print('still here')\n")
            await printed(conn, "py", "still here\r\n")
            # (Not Ctrl-D: GNU readline takes the terminal out of canonical mode while it reads
            # a line, so an EOF character that comes between two reads may be dropped.)
            await type_in(conn, "e", "py", "exit()\n")
            ended = await wait_for(conn, of("result", "py"))
    assert size["outcome"] == "completed"
    assert ended["data"]["exit_code"] == 0, (ended["text"], ended["data"], ended["output"][-300:])


async def test_inputs_that_cannot_be_written_fail_and_write_nothing(live: LiveServer) -> None:
    with trio.fail_after(TEST_DEADLINE_S):
        async with live.connect() as conn:
            await start(conn, "closed", "sleep 30")
            no_stdin = await type_in(conn, "i1", "closed", "x\n")
            await start(conn, "gone", "exit 3", stdin=True)
            await exit_of(conn, "w1", "gone")
            exited = await type_in(conn, "i2", "gone", "x\n")
            await start(conn, "cat", "cat; sleep 30", stdin=True)  # runs on after the EOF
            await type_in(conn, "i3", "cat", "last\n", eof=True)
            after_eof = await type_in(conn, "i4", "cat", "more\n")
            no_terminal = await conn.call(
                "c", "r", "process_resize", {"process_id": "cat", "rows": 2, "cols": 2}
            )
            await conn.send({"type": "cancel", "chat_id": "c", "call_ids": ["closed", "cat"]})
            await wait_for(conn, of("cancel_result", "cat"))
    for result in (no_stdin, exited, after_eof):
        assert result["outcome"] == "failed", result
        assert result["data"]["written"] == 0
    assert "has no stdin" in no_stdin["text"]
    assert "has exited (code 3)" in exited["text"]
    assert "closed by an earlier process_input" in after_eof["text"]
    assert no_terminal["outcome"] == "failed" and "has no terminal" in no_terminal["text"]


async def test_a_large_input_waits_for_room_while_other_chats_are_answered(
    live: LiveServer,
) -> None:
    data = "".join(f"{i:07d}\n" for i in range(512 * 1024))  # 4 MiB
    go = live.workspace / "go"
    (live.workspace / "small.txt").write_text("small\n")
    with trio.fail_after(TEST_DEADLINE_S):
        async with live.connect() as conn, live.connect() as other:
            # The reader waits for a file before it reads: the pipe fills, the input waits.
            await start(
                conn, "cat", "while [ ! -e go ]; do sleep 0.02; done; cat > out", stdin=True
            )
            await conn.send({"type": "call", "chat_id": "c", "call_id": "big",
                             "tool": "process_input",
                             "args": {"process_id": "cat", "data": data, "eof": True}})  # fmt: skip
            await wait_for(conn, of("accepted", "big"))
            for i in range(20):
                answered = await other.call("d", f"r{i}", "read_file", {"path": "small.txt"})
                assert answered["outcome"] == "completed"
            assert not [m for m in conn.seen if m["type"] == "result" and m["call_id"] == "big"]
            go.write_text("")
            big = await wait_for(conn, of("result", "big"))
            await exit_of(conn, "w", "cat")
    assert big["outcome"] == "completed" and big["data"]["written"] == len(data)
    assert (live.workspace / "out").read_text() == data


async def test_kill_after_stops_every_member_of_the_group(live: LiveServer) -> None:
    pids = live.workspace / "pids"
    with trio.fail_after(TEST_DEADLINE_S):
        async with live.connect() as conn:
            result = await conn.call(
                "c",
                "k",
                "execute",
                {
                    "command": "sleep 100 & echo $! > pids; echo $$ >> pids; sleep 100",
                    "kill_after_ms": 300,
                },
            )
    assert result["outcome"] == "timed_out" and result["timed_out"] is True
    assert result["text"] == (
        "tool call ran past its kill_after_ms of 300 ms; the process was stopped"
    )
    assert not result["canceled"]
    members = [int(line) for line in pids.read_text().split()]
    assert len(members) == 2 and not any(alive(pid) for pid in members)


async def test_kill_after_stops_a_background_command_that_keeps_its_result(
    live: LiveServer,
) -> None:
    with trio.fail_after(TEST_DEADLINE_S):
        async with live.connect() as conn:
            started = await conn.call(
                "c", "bg", "execute", {"command": "sleep 100", "kill_after_ms": 200},
                background=True,
            )  # fmt: skip
            stopped = await exit_of(conn, "w", "bg")
            again = await conn.call(
                "c", "bg", "execute", {"command": "sleep 100", "kill_after_ms": 200},
                background=True,
            )  # fmt: skip
    assert started["outcome"] == "completed"
    assert again == started  # it keeps the result it returned
    assert stopped["data"]["timed_out"] is True and stopped["data"]["signal"] == "SIGTERM"


async def test_a_canceled_input_says_how_much_went_in(live: LiveServer) -> None:
    data = "x" * (4 * 1024 * 1024)
    with trio.fail_after(TEST_DEADLINE_S):
        async with live.connect() as conn:
            # Never reads: the pipe fills and the input waits for room until it is canceled.
            await start(conn, "deaf", "sleep 30", stdin=True)
            args = {"process_id": "deaf", "data": data}
            await conn.send(
                {"type": "call", "chat_id": "c", "call_id": "in", "tool": "process_input"}
                | {"args": args}
            )
            # A write sent after it is answered after the input's start is durable and its
            # writer ran (journal commits call back in order): the input is waiting for room.
            await conn.call("c", "mark", "write_file", {"path": "mark", "content": "m"})
            await conn.send({"type": "cancel", "chat_id": "c", "call_ids": ["in"], "rid": 1})
            reply = await wait_for(conn, of("cancel_result", "in"))
            await conn.send({"type": "cancel", "chat_id": "c", "call_ids": ["deaf"]})
            await wait_for(conn, of("cancel_result", "deaf"))
    result = reply["result"]
    assert reply["received"] is True
    assert result["outcome"] == "canceled" and result["canceled"] is True, result
    assert 0 < result["data"]["written"] < len(data)  # what filled the pipe went in
