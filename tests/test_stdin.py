"""Interactive processes (PROTOCOL.md 9.1) at the process table: `execute` with `stdin` and with
`pty`, `process_input` and `process_resize`, with real processes on real pipes and terminals.

Each command is started the way the chat starts an `execute` (its args parsed by the tool
registry, then `argv_for`, `env_for`, `stdin_for`, `terminal_for`), pumped and reaped by the
real tasks; each input joins its process's queue synchronously, as the chat does when the call
starts, and runs as `process_tools.process_input` with a cancel scope the test keeps.
"""

from __future__ import annotations

import hashlib
import os
import signal
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from hypothesis import given
from hypothesis import strategies as st

from toolwire.actors import processes, runners, stdin
from toolwire.actors.input_queue import InputQueue
from toolwire.actors.processes import ProcessRecord, ProcessTable, RealProcessBackend
from toolwire.actors.results import (
    TEXT_CANCELED_WHILE_RUNNING,
    Outcome,
    ToolReport,
    ToolwireError,
    text_killed_after,
)
from toolwire.actors.terminal import TerminalSize
from toolwire.actors.tools import execute as execute_tool
from toolwire.actors.tools import process_tools
from toolwire.actors.tools.execute import ExecuteArgs
from toolwire.actors.tools.process_tools import ProcessInputArgs, ProcessResizeArgs
from toolwire.actors.tools.registry import TOOLS, parse_args
from toolwire.simulation.processes import Script, SimBackend, SimProcess

TEST_DEADLINE_S = 20.0
MAX_WAIT_MS = 300_000
# Long enough for any reply on a loaded machine; a call returns as soon as the reply is there.
REPLY_WAIT_MS = 10_000


class Procs:
    """A chat's process table with real processes, and the chat's way of writing to them."""

    def __init__(self, nursery: trio.Nursery, workspace: Path, backend: RealProcessBackend) -> None:
        self.nursery = nursery
        self.workspace = workspace
        self.table = ProcessTable(backend, retention_bytes=1 << 20, result_bytes=64 << 10)

    def start(self, process_id: str, command: str, **args: Any) -> ProcessRecord:
        parsed = parse_args(TOOLS["execute"], {"command": command, **args})
        assert isinstance(parsed, ExecuteArgs)
        record = self.table.spawn(
            process_id,
            command,
            execute_tool.argv_for(parsed),
            execute_tool.cwd_for(parsed, str(self.workspace)),
            execute_tool.env_for(parsed, {**os.environ, "PYTHON_BASIC_REPL": "1"}),
            0,
            stdin=execute_tool.stdin_for(parsed),
            terminal=execute_tool.terminal_for(parsed),
        )
        self.nursery.start_soon(processes.pump, record, lambda _: None)
        self.nursery.start_soon(processes.reap, record, lambda: 0, self.table.exited)
        return record

    def join(self, process_id: str) -> stdin.InputTicket:
        """The call of an input starts: its place in the queue, synchronously."""
        return stdin.join_input(self.table, process_id)

    async def run_input(
        self,
        ticket: stdin.InputTicket,
        data: str | bytes,
        *,
        eof: bool = False,
        wait_ms: int = 0,
        cancel: trio.CancelScope | None = None,
    ) -> ToolReport:
        text = data.decode() if isinstance(data, bytes) else data
        args = ProcessInputArgs(process_id=ticket.process_id, data=text, eof=eof, wait_ms=wait_ms)
        scope = trio.CancelScope() if cancel is None else cancel
        return await process_tools.process_input(ticket, args, MAX_WAIT_MS, scope)

    async def input(
        self, process_id: str, data: str | bytes, *, eof: bool = False, wait_ms: int = 0
    ) -> ToolReport:
        return await self.run_input(self.join(process_id), data, eof=eof, wait_ms=wait_ms)

    def resize(self, process_id: str, rows: int, cols: int) -> ToolReport:
        args = ProcessResizeArgs(process_id=process_id, rows=rows, cols=cols)
        return process_tools.process_resize(self.table, args)

    async def stop_all(self) -> None:
        with trio.move_on_after(5):
            for record in self.table.running():
                # The chat's own stop of a group: SIGTERM, the grace, SIGKILL.
                await runners.term_group(record, 0.5)
                await runners.kill_group(record)


@pytest.fixture(params=["posix_spawn", "popen"])
async def procs(
    nursery: trio.Nursery, tmp_path: Path, request: pytest.FixtureRequest
) -> AsyncIterator[Procs]:
    backend = RealProcessBackend(posix_spawn=request.param == "posix_spawn")
    table = Procs(nursery, tmp_path, backend)
    yield table
    await table.stop_all()


async def until_output(record: ProcessRecord, text: str, since: int = 0) -> str:
    """Wait until the process's output from `since` on holds `text`; that output."""
    while True:
        changed = record.changed
        output, _ = record.output.result_output(since)
        if text in output:
            return output
        assert not record.output_closed.is_set(), f"{text!r} never came: {output!r}"
        await changed.wait()


def data_of(report: ToolReport) -> dict[str, Any]:
    assert report.data is not None, report
    return report.data


# --- a pipe ------------------------------------------------------------------------------------


async def test_a_read_prompt_is_answered_on_a_pipe(procs: Procs) -> None:
    with trio.fail_after(TEST_DEADLINE_S):
        procs.start("p", 'read -p "name? " name; echo "hello $name"', shell="bash", stdin=True)
        report = await procs.input("p", "bob\n", wait_ms=REPLY_WAIT_MS)
    assert report.outcome is Outcome.COMPLETED, report
    # The program read the line once and answered; it exited, so the wait ended there. (bash
    # shows a `read -p` prompt only on a terminal: on a pipe the answer is all there is.)
    assert report.output == "hello bob\n"
    assert report.output_bytes == len("hello bob\n") and report.truncated_bytes == 0
    assert data_of(report) == {
        "written": 4,
        "stdin_offset": 4,
        "output_offset": 0,
        "running": False,
        "exit_code": 0,
    }
    assert (
        report.text
        == "wrote 4 bytes to process p; it has exited (code 0); 10 bytes of output since"
    )


async def test_a_read_prompt_is_answered_on_a_terminal(procs: Procs) -> None:
    with trio.fail_after(TEST_DEADLINE_S):
        record = procs.start(
            "p",
            'read -p "name? " name; echo "hello $name"',
            shell="bash",
            pty={"rows": 24, "cols": 80},
        )
        await until_output(record, "name? ")
        report = await procs.input("p", "bob\n", wait_ms=REPLY_WAIT_MS)
    assert report.outcome is Outcome.COMPLETED, report
    # What a person at the terminal sees: the prompt, then their own echoed line, then the
    # answer, with the terminal's CR LF line ends. The call's output starts at its write.
    assert data_of(report)["output_offset"] == len("name? ")
    assert report.output == "bob\r\nhello bob\r\n"
    assert data_of(report)["running"] is False and data_of(report)["exit_code"] == 0


async def test_inputs_are_written_in_arrival_order_never_interleaved(
    procs: Procs, tmp_path: Path
) -> None:
    with trio.fail_after(TEST_DEADLINE_S):
        record = procs.start("p", "cat > got", stdin=True)
        # Stopped, the reader takes nothing: the first input fills the pipe and waits for room,
        # the others wait behind it.
        record.handle.signal_group(signal.SIGSTOP)
        first = b"a" * (1 << 20)
        tickets = [procs.join("p") for _ in range(3)]
        reports: dict[int, ToolReport] = {}

        async def send(index: int, data: bytes, eof: bool = False) -> None:
            reports[index] = await procs.run_input(tickets[index], data, eof=eof)

        async with trio.open_nursery() as nursery:
            # Their tasks start in the opposite order: the queue, not the scheduler, decides.
            nursery.start_soon(send, 2, b"c" * 10, True)
            nursery.start_soon(send, 1, b"b" * 10)
            nursery.start_soon(send, 0, first)
            await wait_until(record, lambda: record.stdin_offset > 0)
            assert 1 not in reports and 2 not in reports  # still waiting their turn
            record.handle.signal_group(signal.SIGCONT)
        await record.exited.wait()
    assert (tmp_path / "got").read_bytes() == first + b"b" * 10 + b"c" * 10
    assert [data_of(reports[i])["written"] for i in range(3)] == [len(first), 10, 10]
    assert [data_of(reports[i])["stdin_offset"] for i in range(3)] == [
        len(first),
        len(first) + 10,
        len(first) + 20,
    ]
    assert "closed its stdin" in reports[2].text


async def wait_until(record: ProcessRecord, condition: Callable[[], bool]) -> None:
    """Wait until `condition` holds; it is about `record`, which notifies each change (an
    output, an exit, bytes written to its stdin)."""
    while True:
        changed = record.changed
        if condition():
            return
        await changed.wait()


async def test_four_mebibytes_arrive_whole_while_the_loop_keeps_serving(
    procs: Procs, tmp_path: Path
) -> None:
    payload = os.urandom(3 << 20).hex()[: 4 << 20]  # 4 MiB of text
    with trio.fail_after(TEST_DEADLINE_S):
        big = procs.start("big", "cat > big.txt", stdin=True)
        procs.start("echo", "cat", stdin=True)
        big.handle.signal_group(signal.SIGSTOP)
        done = trio.Event()
        reports: list[ToolReport] = []

        async def send_big() -> None:
            reports.append(await procs.input("big", payload, eof=True))
            done.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(send_big)
            await wait_until(big, lambda: big.stdin_offset > 0)
            # The big input waits for room in its pipe on the loop: meanwhile another
            # process's input makes its whole round trip, many times.
            for i in range(20):
                reply = await procs.input("echo", f"line {i}\n", wait_ms=REPLY_WAIT_MS)
                assert reply.output == f"line {i}\n", reply
            assert not done.is_set()
            assert big.stdin_offset < len(payload)
            big.handle.signal_group(signal.SIGCONT)
        await big.exited.wait()
    (report,) = reports
    assert report.outcome is Outcome.COMPLETED, report
    assert data_of(report)["written"] == len(payload) == data_of(report)["stdin_offset"]
    got = (tmp_path / "big.txt").read_bytes()
    assert hashlib.sha256(got).hexdigest() == hashlib.sha256(payload.encode()).hexdigest()


# --- refusals: nothing written -----------------------------------------------------------------


async def test_input_to_a_process_without_stdin_fails_and_writes_nothing(procs: Procs) -> None:
    with trio.fail_after(TEST_DEADLINE_S):
        record = procs.start("p", "echo ready; sleep 30")
        await until_output(record, "ready")
        report = await procs.input("p", "y\n")
    assert report.outcome is Outcome.FAILED
    assert report.text == (
        "process p has no stdin (start it with execute's `stdin: true` or `pty` to write to "
        "it); nothing was written"
    )
    assert data_of(report)["written"] == 0 and record.stdin_offset == 0
    assert data_of(report)["running"] is True


async def test_input_to_an_exited_process_fails_and_writes_nothing(procs: Procs) -> None:
    with trio.fail_after(TEST_DEADLINE_S):
        record = procs.start("p", "exit 3", stdin=True)
        await record.exited.wait()
        report = await procs.input("p", "y\n")
    assert report.outcome is Outcome.FAILED
    assert report.text == "process p has exited (code 3); nothing was written"
    assert data_of(report) == {
        "written": 0,
        "stdin_offset": 0,
        "output_offset": 0,
        "running": False,
        "exit_code": 3,
    }


async def test_input_after_eof_fails_and_writes_nothing(procs: Procs, tmp_path: Path) -> None:
    with trio.fail_after(TEST_DEADLINE_S):
        # Reads to the end of its input, then waits: it is still running when the next input
        # comes, so only the closed stdin can refuse it.
        record = procs.start("p", "cat > got; echo closed; sleep 30", stdin=True)
        closing = await procs.input("p", "last\n", eof=True)
        await until_output(record, "closed")
        report = await procs.input("p", "more\n")
    assert closing.outcome is Outcome.COMPLETED
    assert closing.text.startswith("wrote 5 bytes to process p and closed its stdin; it ")
    assert report.outcome is Outcome.FAILED
    assert report.text == (
        "the stdin of process p was closed by an earlier process_input with eof; "
        "nothing was written"
    )
    assert data_of(report)["written"] == 0 and data_of(report)["stdin_offset"] == 5
    assert (tmp_path / "got").read_bytes() == b"last\n"


async def test_input_to_an_unknown_process_fails(procs: Procs) -> None:
    report = await procs.input("nope", "y\n")
    assert report.outcome is Outcome.FAILED
    assert report.text == (
        "no process 'nope' in this chat (process_list shows this chat's processes)"
    )


async def test_a_process_that_exits_during_an_input_ends_it_with_what_went_in(
    procs: Procs,
) -> None:
    payload = "x" * (4 << 20)
    with trio.fail_after(TEST_DEADLINE_S):
        procs.start("p", "head -c 100000 > /dev/null", stdin=True)
        report = await procs.input("p", payload)
    assert report.outcome is Outcome.FAILED, report
    written = data_of(report)["written"]
    # It read 100,000 bytes; what else went in sat in the pipe when it exited.
    assert 100_000 <= written < len(payload)
    assert report.text == f"process p exited after {written} of {len(payload)} bytes were written"
    assert data_of(report)["running"] is False


async def test_a_process_that_stops_reading_ends_an_input_with_what_went_in(
    procs: Procs,
) -> None:
    with trio.fail_after(TEST_DEADLINE_S):
        record = procs.start("p", "exec 0<&-; echo closed; sleep 30", stdin=True)
        await until_output(record, "closed")
        report = await procs.input("p", "y\n")
    assert report.outcome is Outcome.FAILED
    assert report.text == "process p stopped reading its input after 0 of 2 bytes were written"
    assert data_of(report)["running"] is True


# --- cancel ------------------------------------------------------------------------------------


async def test_cancel_ends_a_writing_and_a_waiting_input_with_what_went_in(
    procs: Procs, tmp_path: Path
) -> None:
    payload = b"z" * (4 << 20)
    with trio.fail_after(TEST_DEADLINE_S):
        record = procs.start("p", "cat > got", stdin=True)
        record.handle.signal_group(signal.SIGSTOP)
        writing, waiting = procs.join("p"), procs.join("p")
        scopes = {"writing": trio.CancelScope(), "waiting": trio.CancelScope()}
        reports: dict[str, ToolReport] = {}

        async def send(name: str, ticket: stdin.InputTicket, data: bytes) -> None:
            reports[name] = await procs.run_input(ticket, data, cancel=scopes[name])

        async with trio.open_nursery() as nursery:
            nursery.start_soon(send, "writing", writing, payload)
            nursery.start_soon(send, "waiting", waiting, b"never")
            await wait_until(record, lambda: record.stdin_offset > 0)
            scopes["waiting"].cancel()
            scopes["writing"].cancel()
        # The queue is free again: a later input goes in right behind what the canceled one
        # wrote, and ends the input.
        record.handle.signal_group(signal.SIGCONT)
        after = await procs.input("p", "end", eof=True)
        await record.exited.wait()
    for name in ("writing", "waiting"):
        assert reports[name].outcome is Outcome.CANCELED
        assert reports[name].text == TEXT_CANCELED_WHILE_RUNNING
    assert data_of(reports["waiting"])["written"] == 0
    written = data_of(reports["writing"])["written"]
    assert 0 < written < len(payload)
    assert data_of(after)["stdin_offset"] == written + 3
    # `written` is exactly what the program got.
    assert (tmp_path / "got").read_bytes() == payload[:written] + b"end"


async def test_an_input_canceled_before_its_turn_writes_nothing(procs: Procs) -> None:
    with trio.fail_after(TEST_DEADLINE_S):
        record = procs.start("p", "cat", stdin=True)
        scope = trio.CancelScope()
        scope.cancel()  # canceled before its task ever ran
        report = await procs.run_input(procs.join("p"), "y\n", cancel=scope)
        later = await procs.input("p", "z\n", wait_ms=REPLY_WAIT_MS)
    assert report.outcome is Outcome.CANCELED
    assert data_of(report)["written"] == 0
    assert later.output == "z\n" and data_of(later)["stdin_offset"] == 2
    assert record.stdin_offset == 2


# --- a terminal --------------------------------------------------------------------------------


PYTHON = f"exec {sys.executable} -q -i"


async def test_a_python_repl_on_a_terminal(procs: Procs) -> None:
    with trio.fail_after(TEST_DEADLINE_S):
        record = procs.start("py", PYTHON, pty={"rows": 24, "cols": 80})
        await until_output(record, ">>> ")
        report = await procs.input("py", "print(6 * 7)\n", wait_ms=REPLY_WAIT_MS)
        assert report.outcome is Outcome.COMPLETED, report
        # The terminal echoes the line and ends lines with CR LF; the program then answers.
        answer = await until_output(record, "42\r\n", data_of(report)["output_offset"])
        assert "print(6 * 7)\r\n" in answer

        # A resize reaches the program: the size (what `stty size` reads) and a SIGWINCH.
        setup = (
            "import signal, subprocess; signal.signal(signal.SIGWINCH, lambda *_: print('winch'))\n"
        )
        await procs.input("py", setup, wait_ms=REPLY_WAIT_MS)
        mark = record.output.total
        resized = procs.resize("py", 40, 100)
        assert resized.outcome is Outcome.COMPLETED
        assert resized.data == {"rows": 40, "cols": 100}
        assert resized.text == "resized the terminal of process py to 40 rows and 100 columns"
        await procs.input("py", "subprocess.run(['stty', 'size'])\n")
        await until_output(record, "40 100\r\n", mark)
        await until_output(record, "winch", mark)

        # Ctrl-C interrupts the running statement, not the interpreter.
        mark = record.output.total
        await procs.input("py", "import time; print('sleep' + 'ing'); time.sleep(60)\n")
        await until_output(record, "sleeping\r\n", mark)  # the statement runs
        await procs.input("py", "\x03")
        await until_output(record, "KeyboardInterrupt", mark)
        mark = record.output.total
        again = await procs.input("py", "print('still here')\n")
        # The prompt: the interpreter reads a new line (an EOF character typed before it does
        # meets the terminal mid-way between the interpreter's line editor and the kernel's).
        await until_output(record, "still here\r\n>>> ", mark)

        # The EOF character at the start of a line ends the interpreter.
        bye = await procs.input("py", "", eof=True, wait_ms=REPLY_WAIT_MS)
        await record.exited.wait()
    assert data_of(again)["running"] is True
    assert bye.outcome is Outcome.COMPLETED and "and the EOF character" in bye.text
    assert data_of(bye)["written"] == 0  # the EOF character is not data
    assert record.status is not None and record.status.exit_code == 0


async def test_a_terminal_is_the_controlling_terminal_of_a_new_session(procs: Procs) -> None:
    command = (
        "stty size; tty; "
        ": </dev/tty && echo has-ctty; "
        'echo "TERM=$TERM"; '
        "cat /proc/$$/stat; "
        "grep SigIgn /proc/$$/status"
    )
    with trio.fail_after(TEST_DEADLINE_S):
        record = procs.start("p", command, pty={"rows": 30, "cols": 120})
        await record.exited.wait()
        await record.output_closed.wait()
    lines = record.output.result_output()[0].split("\r\n")
    assert lines[0] == "30 120"
    assert lines[1].startswith("/dev/pts/")
    assert lines[2] == "has-ctty"
    # PROTOCOL.md 9.1: TERM is the terminal's own unless the call's env names one.
    assert lines[3] == "TERM=xterm-256color"
    # /proc/PID/stat after the command name: state ppid pgrp session tty_nr tpgid ...
    _, pgid, sid, _, tpgid = (int(n) for n in lines[4].rsplit(")", 1)[1].split()[1:6])
    assert sid == pgid == record.handle.pid  # its own session and process group...
    assert tpgid == pgid  # ...in the foreground of its terminal: Ctrl-C reaches it
    # SIGPIPE and SIGXFSZ at their defaults (both backends: Python ignores them).
    ignored = int(lines[5].split()[1], 16)
    assert not ignored & (1 << (signal.SIGPIPE - 1))
    assert not ignored & (1 << (signal.SIGXFSZ - 1))


async def test_the_calls_env_names_the_terminal_type(procs: Procs) -> None:
    with trio.fail_after(TEST_DEADLINE_S):
        record = procs.start(
            "p", 'echo "$TERM"', pty={"rows": 24, "cols": 80}, env={"TERM": "vt100"}
        )
        await record.output_closed.wait()
    assert record.output.result_output() == ("vt100\r\n", 0)


async def test_the_output_of_a_terminal_is_whole_after_its_exit(procs: Procs) -> None:
    with trio.fail_after(TEST_DEADLINE_S):
        record = procs.start("p", "seq 1 20000; exit 5", pty={"rows": 24, "cols": 80})
        await record.exited.wait()
        await record.output_closed.wait()
    expected = "".join(f"{n}\r\n" for n in range(1, 20001)).encode()
    assert record.output.total == len(expected)
    assert record.status is not None and record.status.exit_code == 5


async def test_eof_on_a_terminal_is_the_eof_character(procs: Procs) -> None:
    with trio.fail_after(TEST_DEADLINE_S):
        record = procs.start("p", "cat > got; echo done", pty={"rows": 24, "cols": 80})
        # Mid-line, the EOF character hands over the line without ending the input (as
        # Ctrl-D does); a second one, at the start of a line, ends it.
        first = await procs.input("p", "abc", eof=True)
        assert data_of(first)["running"] is True
        await procs.input("p", "", eof=True)
        await until_output(record, "done")
        await record.exited.wait()
    assert (procs.workspace / "got").read_bytes() == b"abc"


async def test_resize_refusals(procs: Procs) -> None:
    with trio.fail_after(TEST_DEADLINE_S):
        procs.start("pipe", "sleep 30", stdin=True)
        gone = procs.start("gone", "exit 0", pty={"rows": 24, "cols": 80})
        await gone.exited.wait()
        no_terminal = procs.resize("pipe", 24, 80)
        exited = procs.resize("gone", 24, 80)
        missing = procs.resize("nope", 24, 80)
    assert no_terminal.outcome is Outcome.FAILED
    assert no_terminal.text == (
        "process pipe has no terminal (start it with execute's `pty`); nothing was resized"
    )
    assert exited.outcome is Outcome.FAILED
    assert exited.text == "process gone has exited (code 0); nothing was resized"
    assert missing.outcome is Outcome.FAILED and "'nope'" in missing.text


# --- the reply wait ----------------------------------------------------------------------------


async def test_wait_ms_ends_early_when_the_process_exits(procs: Procs) -> None:
    with trio.fail_after(TEST_DEADLINE_S):
        procs.start("p", "read line; echo got-$line; exit 2", stdin=True)
        report = await procs.input("p", "x\n", wait_ms=MAX_WAIT_MS)
    # Waiting the full 5 minutes would miss the test's deadline.
    assert report.output == "got-x\n"
    assert data_of(report)["running"] is False and data_of(report)["exit_code"] == 2


async def test_without_wait_ms_an_input_returns_after_its_write(procs: Procs) -> None:
    with trio.fail_after(TEST_DEADLINE_S):
        # A program that never answers: a call with wait_ms 0 does not wait for one.
        procs.start("p", "cat > /dev/null", stdin=True)
        report = await procs.input("p", "x\n")
    assert report.outcome is Outcome.COMPLETED
    assert data_of(report)["running"] is True and data_of(report)["written"] == 2


async def test_wait_ms_is_capped_and_waits_in_virtual_time(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery
) -> None:
    """With scripted processes (the simulation's backend) in virtual time: an input to a
    command that prints nothing waits exactly its `wait_ms`, capped at max_wait_ms, and the
    command gets the bytes once."""
    spawned: list[SimProcess] = []
    backend = SimBackend(
        {"quiet": Script(chunks=(), duration=1000.0)}, lambda _, p: spawned.append(p)
    )
    table = ProcessTable(backend, retention_bytes=1 << 20, result_bytes=64 << 10)
    record = table.spawn("p", "quiet", ["/bin/sh", "-c", "quiet"], "/", {}, 0, stdin=True)
    nursery.start_soon(processes.pump, record, lambda _: None)
    nursery.start_soon(processes.reap, record, lambda: 0, table.exited)
    args = ProcessInputArgs(process_id="p", data="hi\n", wait_ms=60_000)
    start = trio.current_time()
    report = await process_tools.process_input(
        stdin.join_input(table, "p"), args, 5_000, trio.CancelScope()
    )
    assert trio.current_time() - start == pytest.approx(5.0)
    assert report.outcome is Outcome.COMPLETED and report.output == ""
    (proc,) = spawned
    assert proc.stdin is not None and proc.stdin.data == b"hi\n"


# --- the hard deadline at the process (PROTOCOL.md 9.2) -------------------------------------------


# The deadline itself is enforced by ChatState (tests/test_chat_state.py) and checked on real
# process groups through a server (tests/test_interactive.py: kill_after_ms).


def test_the_hard_deadline_text_is_exact() -> None:
    assert text_killed_after(1500) == (
        "tool call ran past its kill_after_ms of 1500 ms; the process was stopped"
    )


# --- arguments -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("tool", "args", "message"),
    [
        ("execute", {"command": "x", "stdin": "yes"}, "`args.stdin`"),
        ("execute", {"command": "x", "pty": {"rows": 0, "cols": 80}}, "`args.pty.rows`"),
        ("execute", {"command": "x", "pty": {"rows": 24, "cols": 65536}}, "`args.pty.cols`"),
        ("execute", {"command": "x", "pty": {"rows": 24}}, "`args.pty`"),
        ("execute", {"command": "x", "pty": True}, "`args.pty`"),
        ("execute", {"command": "x", "kill_after_ms": -1}, "`args.kill_after_ms`"),
        ("execute", {"command": "x", "kill_after_ms": 1.5}, "`args.kill_after_ms`"),
        ("process_input", {"process_id": "p"}, "`data`"),
        ("process_input", {"process_id": "p", "data": 7}, "`args.data`"),
        ("process_input", {"process_id": "p", "data": "", "wait_ms": -1}, "`args.wait_ms`"),
        ("process_input", {"process_id": "p", "data": "", "eof": 1}, "`args.eof`"),
        ("process_input", {"process_id": "p\n", "data": ""}, "printable"),
        ("process_resize", {"process_id": "p", "rows": 24}, "`cols`"),
        ("process_resize", {"process_id": "p", "rows": 24, "cols": 0}, "`args.cols`"),
    ],
)
def test_bad_arguments_are_refused_naming_the_field(
    tool: str, args: dict[str, Any], message: str
) -> None:
    with pytest.raises(ToolwireError) as caught:
        parse_args(TOOLS[tool], args)
    assert caught.value.code == "bad_args"
    assert caught.value.message.startswith(f"{tool}: ")
    assert message in caught.value.message


def test_what_the_new_arguments_mean() -> None:
    base = {"PATH": "/bin", "TERM": "dumb"}

    def execute(**args: Any) -> ExecuteArgs:
        parsed = parse_args(TOOLS["execute"], {"command": "x", **args})
        assert isinstance(parsed, ExecuteArgs)
        return parsed

    plain = execute()
    assert not execute_tool.stdin_for(plain) and execute_tool.terminal_for(plain) is None
    assert execute_tool.env_for(plain, base)["TERM"] == "dumb"  # not a terminal: untouched
    assert execute_tool.stdin_for(execute(stdin=True))
    # `pty` implies stdin, whatever `stdin` says; TERM is the terminal's unless env names one.
    term = execute(pty={"rows": 24, "cols": 80}, stdin=False)
    assert execute_tool.stdin_for(term)
    assert execute_tool.terminal_for(term) == TerminalSize(24, 80)
    assert execute_tool.env_for(term, base)["TERM"] == "xterm-256color"
    named = execute(pty={"rows": 24, "cols": 80}, env={"TERM": "vt100"})
    assert execute_tool.env_for(named, base)["TERM"] == "vt100"
    assert parse_args(TOOLS["process_input"], {"process_id": "p", "data": "x"}) == (
        ProcessInputArgs(process_id="p", data="x", eof=False, wait_ms=0)
    )


# --- the order of inputs, as a pure rule ---------------------------------------------------------


@given(st.lists(st.tuples(st.sampled_from(["join", "leave"]), st.integers(0, 20)), max_size=60))
def test_the_queue_lets_only_the_oldest_input_write(ops: list[tuple[str, int]]) -> None:
    """Whatever joins and leaves (done, failed or canceled, in any order): exactly the oldest
    input still queued may write, and inputs get their turns in the order they joined."""
    queue = InputQueue()
    model: list[int] = []
    turns: list[int] = []
    for op, pick in ops:
        if op == "join":
            model.append(queue.join())
        elif model:
            ticket = model[pick % len(model)]
            head_changed = queue.leave(ticket)
            assert head_changed == (ticket == model[0])
            model.remove(ticket)
            assert not queue.leave(ticket)  # leaving twice changes nothing
        if model and (not turns or turns[-1] != model[0]):
            turns.append(model[0])
        assert len(queue) == len(model)
        for ticket in model:
            assert queue.may_write(ticket) == (ticket == model[0])
    assert turns == sorted(turns)  # turns come in join order, never back to an older input
    assert len(set(turns)) == len(turns)  # and each input's turn comes at most once
