"""The journal's faults as an operator meets them, on a real `toolwire serve` (issue 26): a
journal that cannot be opened or written at start fails the start in one line, before
"ready"; a disk that fills up under a running agent (`prlimit --fsize`) stops it in order,
its commands stopped, its connections closed with 1011, its exit status 1."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import trio
from trio_websocket import ConnectionClosed

from tests.oswatch import alive
from tests.test_serve import ROOT
from tests.wsclient import connect, wait_for
from toolwire.actors.journal import SqliteJournal
from toolwire.transport.server import CLOSE_INTERNAL_ERROR, JOURNAL_FAILED_REASON

TOKEN = "journal-serve-token-0123456789"


def unprivileged() -> list[str]:
    """What runs the agent so that file modes stop it. Root passes every permission check
    through two capabilities (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH): as root, the agent runs
    without them (still root, still able to run this checkout's interpreter, but held to the
    modes like any user); as anyone else, as it is."""
    if os.geteuid() != 0:
        return []
    if shutil.which("setpriv") is None:
        pytest.skip("needs util-linux setpriv to drop root's file-mode override")
    return ["setpriv", "--bounding-set=-dac_override,-dac_read_search", "--"]


def serve_argv(state: Path, workspace: Path) -> list[str]:
    return [sys.executable, "-m", "toolwire.cli.main", "serve", "--port", "0",
            "--state-dir", str(state), "--workspace", str(workspace)]  # fmt: skip


def start_fails(
    state: Path, workspace: Path, *, held_to_modes: bool = False, token_env: bool = True
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "TOOLWIRE_TOKEN"}
    env["PYTHONPATH"] = str(ROOT)
    if token_env:
        env["TOOLWIRE_TOKEN"] = TOKEN
    prefix = unprivileged() if held_to_modes else []
    return subprocess.run(
        [*prefix, *serve_argv(state, workspace)], cwd=ROOT, env=env, capture_output=True,
        text=True, timeout=30,
    )  # fmt: skip


def assert_one_line(done: subprocess.CompletedProcess[str], *words: str) -> None:
    assert done.returncode == 1, done
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("toolwire serve: "), lines
    for word in words:
        assert word in lines[0], lines[0]
    assert "Traceback" not in done.stderr
    assert "listening" not in done.stdout


@pytest.mark.parametrize("read_only", ["file", "dir"])
def test_a_read_only_journal_fails_the_start_in_one_line(tmp_path: Path, read_only: str) -> None:
    """Before this, SQLite opened an existing journal file read-only, the agent logged
    "ready", and the first call's commit killed it (exit 1, no close frame to any client)."""
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    journal = state / "journal.sqlite3"
    SqliteJournal(journal).close()  # a journal there already, as after an earlier run
    (journal if read_only == "file" else state).chmod(0o500 if read_only == "dir" else 0o400)
    try:
        done = start_fails(state, tmp_path, held_to_modes=True)
    finally:
        state.chmod(0o700)
        journal.chmod(0o600)
    assert_one_line(done, str(journal), "cannot be written", "read-only for this user")


def test_a_state_dir_the_agent_cannot_enter_fails_the_start_in_one_line(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir(mode=0o000)
    try:
        for token_env in (True, False):  # the journal's open, and the token's file before it
            done = start_fails(state, tmp_path, held_to_modes=True, token_env=token_env)
            assert_one_line(done, str(state), "Permission denied")
    finally:
        state.chmod(0o700)


def test_a_state_dir_that_is_a_file_fails_the_start_in_one_line(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.write_text("not a directory\n")
    for token_env in (True, False):
        done = start_fails(state, tmp_path, token_env=token_env)
        assert_one_line(done, str(state))


def test_a_journal_path_that_is_a_directory_fails_the_start_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "state").mkdir(mode=0o700)  # private, as serve wants it: no warning
    (tmp_path / "state" / "journal.sqlite3").mkdir()
    done = start_fails(tmp_path / "state", tmp_path)
    assert_one_line(done, "journal.sqlite3 is not a file")


def test_a_journal_created_anew_where_one_was_is_logged_as_a_warning(tmp_path: Path) -> None:
    """`0 records recovered` after the journal was deleted between runs does not pass for a
    first start: the journal's id file next to it names the lost one."""
    state = tmp_path / "state"
    argv = [*serve_argv(state, tmp_path), "--log-format", "text"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TOOLWIRE_TOKEN": TOKEN}

    def start_and_stop() -> str:
        process = subprocess.Popen(
            argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        assert process.stdout is not None
        assert process.stdout.readline().startswith("toolwire listening")
        process.terminate()
        _, stderr = process.communicate(timeout=30)
        assert process.returncode == 0, stderr
        return stderr

    first = start_and_stop()
    assert "a new journal file" in first and "warning" not in first
    assert "warning" not in start_and_stop()
    (state / "journal.sqlite3").unlink()
    for leftover in ("-wal", "-shm"):
        (state / f"journal.sqlite3{leftover}").unlink(missing_ok=True)
    again = start_and_stop()
    warnings = [line for line in again.splitlines() if " warning " in line]
    assert len(warnings) == 1, again
    assert "not the journal this state dir last used" in warnings[0]
    assert "a new, empty journal file was created" in warnings[0]


@pytest.mark.skipif(shutil.which("prlimit") is None, reason="needs util-linux prlimit")
async def test_a_full_disk_under_a_running_agent_stops_it_in_order(tmp_path: Path) -> None:
    """The journal's file may not grow any more (RLIMIT_FSIZE, as `prlimit --fsize` sets it:
    writes past the limit fail with EFBIG, as on a full disk). The next commit fails, so does
    every retry: readiness goes false, the log says why, the running command is stopped, the
    client gets 1011 with the reason, and the agent exits 1."""
    state = tmp_path / "state"
    workspace = tmp_path / "ws"
    workspace.mkdir()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TOOLWIRE_TOKEN": TOKEN}
    argv = [*serve_argv(state, workspace), "--log-format", "text"]
    stderr = bytearray()
    async with trio.open_nursery() as nursery:
        process = await trio.lowlevel.open_process(
            argv, cwd=str(ROOT), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        assert process.stdout is not None and process.stderr is not None
        err = process.stderr

        async def drain() -> None:
            async for chunk in err:
                stderr.extend(chunk)

        nursery.start_soon(drain)
        line = b""
        with trio.fail_after(20):
            while not line.endswith(b"\n"):
                chunk = await process.stdout.receive_some(1)
                assert chunk, bytes(stderr).decode()
                line += chunk
        url = line.decode().split()[-1]
        try:
            async with connect(url, TOKEN) as conn:
                await conn.send({"type": "call", "chat_id": "c2", "call_id": "long",
                                 "tool": "execute",
                                 "args": {"command": "echo $$; exec sleep 300"}})  # fmt: skip
                output = await wait_for(conn, lambda m: m["type"] == "output")
                pid = int(output["data"].split()[0])
                wal = state / "journal.sqlite3-wal"
                limit = wal.stat().st_size  # not one byte more may be appended
                await trio.run_process(["prlimit", "--pid", str(process.pid), f"--fsize={limit}"])
                await conn.send({"type": "call", "chat_id": "c1", "call_id": "w",
                                 "tool": "write_file",
                                 "args": {"path": "never.txt", "content": "x"}})  # fmt: skip
                with trio.fail_after(15), pytest.raises(ConnectionClosed) as closed:
                    while True:
                        await conn.recv()
                assert closed.value.reason.code == CLOSE_INTERNAL_ERROR
                assert closed.value.reason.reason == JOURNAL_FAILED_REASON
            with trio.fail_after(15):
                code = await process.wait()
        finally:
            if process.returncode is None:
                process.kill()
                await process.wait()
    text = bytes(stderr).decode()
    assert code == 1, text
    assert not alive(pid), "the running command was left behind"
    assert not (workspace / "never.txt").exists()
    critical = [line for line in text.splitlines() if " critical " in line]
    assert len(critical) == 1, text
    assert "cannot be written" in critical[0] and "the agent stops" in critical[0]
    assert text.splitlines()[-1].startswith("toolwire serve: journal "), text
