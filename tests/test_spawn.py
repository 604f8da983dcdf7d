"""The real process backend: what a spawned command gets (PROTOCOL.md 5.2: `/bin/sh -c`, stdin
closed, stdout and stderr merged, a new process group, `args.cwd`, `args.env`), the same through
libc's posix_spawn (actors/spawn.py) and through the Popen fallback, with real processes.
"""

from __future__ import annotations

import fcntl
import os
import platform
import signal
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio

from tests.oswatch import alive
from toolwire.actors import processes
from toolwire.actors.processes import ExitStatus, RealProcessBackend, SpawnedProcess
from toolwire.actors.spawn import PosixSpawner
from toolwire.actors.terminal import TerminalSize

TEST_DEADLINE_S = 10.0
ENV = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "TOOLWIRE_TEST": "spawn"}


def run_agent_script(script: str) -> None:
    """Run `script` in a Python of its own (an agent started in a state this test process must
    not be put in: closed descriptors, ignored signals), from the repository's root."""
    root = Path(__file__).resolve().parent.parent
    subprocess.run(
        [sys.executable, "-c", script],
        check=True,
        cwd=root,
        stdin=subprocess.DEVNULL,
        timeout=TEST_DEADLINE_S,
    )


@pytest.fixture(params=["posix_spawn", "popen"])
def backend(request: pytest.FixtureRequest) -> RealProcessBackend:
    return RealProcessBackend(posix_spawn=request.param == "posix_spawn")


async def run(
    backend: RealProcessBackend,
    command: str,
    cwd: str | Path = "/",
    env: dict[str, str] | None = None,
) -> tuple[str, ExitStatus]:
    """Run `sh -c command` to its end: (its whole output, its exit status)."""
    with trio.fail_after(TEST_DEADLINE_S):
        proc = backend.spawn(["/bin/sh", "-c", command], str(cwd), ENV if env is None else env)
        try:
            output = await read_all(proc)
            return output.decode(), await proc.wait()
        finally:
            proc.close()


async def read_all(proc: SpawnedProcess) -> bytes:
    pieces = []
    while data := await proc.read_some():
        pieces.append(data)
    return b"".join(pieces)


def open_fds() -> set[int]:
    return {int(name) for name in os.listdir("/proc/self/fd")}


async def test_posix_spawn_is_available_with_glibc() -> None:
    """The fast path is the one that runs here (the other tests would pass on Popen alone).

    Seen from outside: posix_spawn returns once the command itself is exec'd, so its pid
    already runs the command's program; the Popen path returns once the Python helper that
    later execs the command is running, so there it would still be the interpreter."""
    name, version = platform.libc_ver()
    if name != "glibc" or tuple(int(p) for p in version.split(".")[:2]) < (2, 34):
        pytest.skip(f"needs glibc >= 2.34, this is {name} {version}")
    assert PosixSpawner.load() is not None
    sleep = await trio.Path("/bin/sleep").resolve()
    proc = RealProcessBackend().spawn(["/bin/sleep", "30"], "/", ENV)
    try:
        assert proc.pid is not None
        assert os.readlink(f"/proc/{proc.pid}/exe") == str(sleep)
    finally:
        proc.signal_group(signal.SIGKILL)
        with trio.fail_after(TEST_DEADLINE_S):
            await proc.wait()
        proc.close()


async def test_cwd_env_and_exit_code(backend: RealProcessBackend, tmp_path: Path) -> None:
    (tmp_path / "marker").write_text("here\n")
    output, status = await run(
        backend, 'pwd; cat marker; echo "$TOOLWIRE_TEST"; exit 7', cwd=tmp_path
    )
    assert output == f"{tmp_path}\nhere\nspawn\n"
    assert status == ExitStatus(7, None)


async def test_the_environment_is_exactly_the_one_given(backend: RealProcessBackend) -> None:
    # Only what the mapping holds: nothing of the agent's own environment leaks in. (The shell
    # itself adds PWD, and may add SHLVL or `_`, none of which is in the agent's environment.)
    env = {"A": "1", "B": "two words", "EMPTY": ""}
    output, _ = await run(backend, "env", env=env)
    seen = dict(line.split("=", 1) for line in output.splitlines())
    for added in ("PWD", "SHLVL", "_", "OLDPWD"):
        seen.pop(added, None)
    assert seen == env


async def test_a_new_environment_replaces_the_previous_one(backend: RealProcessBackend) -> None:
    # posix_spawn keeps the last environment it encoded: a different one must not reuse it.
    first, _ = await run(backend, 'echo "$X"', env={**ENV, "X": "first"})
    second, _ = await run(backend, 'echo "$X"', env={**ENV, "X": "second"})
    again, _ = await run(backend, 'echo "$X"', env={**ENV, "X": "second"})
    assert (first, second, again) == ("first\n", "second\n", "second\n")


async def test_stdin_is_closed_and_stderr_joins_stdout(backend: RealProcessBackend) -> None:
    output, status = await run(backend, "cat; readlink /proc/$$/fd/0; echo out; echo err >&2")
    assert output == "/dev/null\nout\nerr\n"
    assert status.exit_code == 0


async def test_own_session_and_process_group(backend: RealProcessBackend) -> None:
    with trio.fail_after(TEST_DEADLINE_S):
        proc = backend.spawn(["/bin/sh", "-c", "sleep 30"], "/", ENV)
        try:
            assert proc.pid is not None
            assert os.getpgid(proc.pid) == proc.pid
            assert os.getsid(proc.pid) == proc.pid
            assert proc.signal_group(signal.SIGKILL)
            assert await proc.wait() == ExitStatus(None, "SIGKILL")
        finally:
            proc.close()


async def test_no_descriptor_of_the_agent_is_inherited(backend: RealProcessBackend) -> None:
    # An inheritable descriptor (as a library might leave one) is still closed in the child,
    # as Popen's close_fds=True does.
    read_end, write_end = os.pipe()
    os.set_inheritable(read_end, True)
    os.set_inheritable(write_end, True)
    try:
        output, _ = await run(
            backend,
            f"for n in 0 1 2 {read_end} {write_end}; do [ -e /proc/$$/fd/$n ] && echo $n; done",
        )
    finally:
        os.close(read_end)
        os.close(write_end)
    assert output.split() == ["0", "1", "2"]


async def test_sigpipe_is_back_to_its_default(backend: RealProcessBackend) -> None:
    # Python ignores SIGPIPE, and an ignored signal stays ignored across exec: `yes | head`
    # would then spin on EPIPE forever instead of ending.
    assert signal.getsignal(signal.SIGPIPE) == signal.SIG_IGN
    output, status = await run(backend, "grep SigIgn /proc/$$/status; yes | head -n 2")
    ignored = int(output.splitlines()[0].split()[1], 16)
    assert not ignored & (1 << (signal.SIGPIPE - 1))
    assert not ignored & (1 << (signal.SIGXFSZ - 1))
    assert output.splitlines()[1:] == ["y", "y"]
    assert status.exit_code == 0


def test_a_command_starts_with_no_signal_the_agent_ignores_or_blocks(tmp_path: Path) -> None:
    """An agent started in the background by a shell ignores SIGINT and SIGQUIT, under nohup
    SIGHUP; an ignored signal stays ignored across exec. The commands it runs must not inherit
    that: Ctrl-C typed on a terminal (PROTOCOL.md 9.1) must interrupt, a `trap` must be able to
    fire. Checked through the pipe, the stdin pipe and the terminal, on both spawn paths."""
    out = tmp_path / "out.txt"
    script = textwrap.dedent(
        f"""
        import signal, trio
        from toolwire.actors.processes import RealProcessBackend
        from toolwire.actors.terminal import TerminalSize
        for sig in (signal.SIGINT, signal.SIGQUIT, signal.SIGHUP, signal.SIGUSR1):
            signal.signal(sig, signal.SIG_IGN)
        signal.pthread_sigmask(signal.SIG_BLOCK, {{signal.SIGUSR2, signal.SIGTERM}})
        # grep reads its own status: the shell's would show the mask dash sets while it waits.
        COMMAND = "exec grep -E '^Sig(Ign|Blk)' /proc/self/status"
        async def main():
            results = []
            for posix_spawn in (True, False):
                backend = RealProcessBackend(posix_spawn=posix_spawn)
                for how in ({{}}, {{"stdin": True}}, {{"terminal": TerminalSize(24, 80)}}):
                    proc = backend.spawn(["/bin/sh", "-c", COMMAND], "/", {{}}, **how)
                    data = b""
                    while piece := await proc.read_some():
                        data += piece
                    await proc.wait()
                    proc.close()
                    results.append(data.decode().split())
            with open({str(out)!r}, "w") as f:
                f.write(repr(results))
        trio.run(main)
        """
    )
    run_agent_script(script)
    clean = ["SigBlk:", "0000000000000000", "SigIgn:", "0000000000000000"]
    # glibc's posix_spawn leaves its two internal signals (32 and 33, below the SIGRTMIN it
    # gives programs) ignored in the child, and sigfillset cannot name them; no program
    # linked with glibc can use them, and none of the agent's dispositions is among them.
    glibc = ["SigBlk:", "0000000000000000", "SigIgn:", f"{(1 << 31) | (1 << 32):016x}"]
    assert out.read_text() == repr([glibc] * 3 + [clean] * 3)


async def test_a_missing_cwd_fails_to_start_and_leaks_nothing(
    backend: RealProcessBackend, tmp_path: Path
) -> None:
    before = open_fds()
    with pytest.raises(FileNotFoundError) as caught:
        backend.spawn(["/bin/sh", "-c", "true"], str(tmp_path / "missing"), ENV)
    assert caught.value.strerror == os.strerror(2)  # what the result's text quotes
    assert open_fds() == before


async def test_a_missing_shell_fails_to_start(backend: RealProcessBackend) -> None:
    with pytest.raises(FileNotFoundError):
        backend.spawn(["/nonexistent/sh", "-c", "true"], "/", ENV)


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        (["/bin/sh", "-c", "echo a\0b"], ENV, "embedded null byte"),
        (["/bin/sh", "-c", "true"], {**ENV, "A=B": "1"}, "illegal environment variable name"),
        (["/bin/sh", "-c", "true"], {**ENV, "A": "x\0y"}, "embedded null byte"),
    ],
)
async def test_arguments_popen_refuses_are_refused_alike(
    backend: RealProcessBackend, argv: list[str], env: dict[str, str], message: str
) -> None:
    before = open_fds()
    with pytest.raises(ValueError, match=message):
        backend.spawn(argv, "/", env)
    assert open_fds() == before


async def test_many_spawns_leave_no_process_and_no_descriptor(
    backend: RealProcessBackend,
) -> None:
    before = open_fds()
    pids = []
    with trio.fail_after(TEST_DEADLINE_S):
        for i in range(50):
            proc = backend.spawn(["/bin/sh", "-c", f"echo {i}"], "/", ENV)
            assert proc.pid is not None
            pids.append(proc.pid)
            assert await read_all(proc) == f"{i}\n".encode()
            assert (await proc.wait()).exit_code == 0
            proc.close()
    assert not any(alive(pid) for pid in pids)
    # None left open by the spawns; a descriptor another test left to the garbage collector
    # may close meanwhile, so the set can only shrink.
    assert open_fds() <= before


def test_spawning_works_with_the_standard_descriptors_closed(tmp_path: Path) -> None:
    """An agent started with stdin, stdout and stderr closed gets pipe ends 0..2 from the
    kernel: the child's dup2 onto 1 and 2 must not clobber the pipe it writes to."""
    out = tmp_path / "out.txt"
    script = textwrap.dedent(
        f"""
        import os, sys, trio
        from toolwire.actors.processes import RealProcessBackend
        async def main():
            # Closed once trio runs, so that its own descriptors do not fill 0..2 first.
            for fd in (0, 1, 2):
                os.close(fd)
            results = []
            for posix_spawn in (True, False):
                assert os.pipe() == (0, 1)  # the lowest free numbers
                os.close(0)
                os.close(1)
                proc = RealProcessBackend(posix_spawn=posix_spawn).spawn(
                    ["/bin/sh", "-c", "echo hello; echo world >&2"], "/", {{}})
                data = b""
                while piece := await proc.read_some():
                    data += piece
                results.append((data, (await proc.wait()).exit_code))
                proc.close()
            with open({str(out)!r}, "w") as f:
                f.write(repr(results))
        trio.run(main)
        """
    )
    run_agent_script(script)
    assert out.read_text() == repr([(b"hello\nworld\n", 0), (b"hello\nworld\n", 0)])


def test_stdin_pipes_and_terminals_work_with_the_standard_descriptors_closed(
    tmp_path: Path,
) -> None:
    """With 0..2 closed in the agent, a stdin pipe's and a terminal's own descriptors would be
    0..2 too: they must not be clobbered by the child's dup2s either (PROTOCOL.md 9.1)."""
    out = tmp_path / "out.txt"
    script = textwrap.dedent(
        f"""
        import os, sys, trio
        from toolwire.actors.processes import RealProcessBackend
        from toolwire.actors.terminal import TerminalSize
        async def read_all(proc):
            data = b""
            while piece := await proc.read_some():
                data += piece
            return data, (await proc.wait()).exit_code
        async def main():
            for fd in (0, 1, 2):
                os.close(fd)
            results = []
            for posix_spawn in (True, False):
                backend = RealProcessBackend(posix_spawn=posix_spawn)
                proc = backend.spawn(
                    ["/bin/sh", "-c", "cat; echo world >&2"], "/", {{}}, stdin=True)
                assert proc.stdin.write_some(memoryview(b"in\\n")) == 3
                proc.stdin.end()
                results.append(await read_all(proc))
                proc.close()
                proc = backend.spawn(
                    ["/bin/sh", "-c", "echo hello; echo world >&2"], "/", {{}},
                    terminal=TerminalSize(24, 80))
                results.append(await read_all(proc))
                proc.close()
            with open({str(out)!r}, "w") as f:
                f.write(repr(results))
        trio.run(main)
        """
    )
    run_agent_script(script)
    expected = [(b"in\nworld\n", 0), (b"hello\r\nworld\r\n", 0)] * 2
    assert out.read_text() == repr(expected)


# --- stdin and terminals (PROTOCOL.md 9.1) --------------------------------------------------------


async def test_a_stdin_pipe_carries_input_until_it_is_ended(backend: RealProcessBackend) -> None:
    with trio.fail_after(TEST_DEADLINE_S):
        proc = backend.spawn(
            ["/bin/sh", "-c", "readlink /proc/$$/fd/0 | cut -c1-5; cat"], "/", ENV, stdin=True
        )
        try:
            port = proc.stdin
            assert port is not None and not port.terminal
            assert port.write_some(memoryview(b"typed\n")) == 6
            assert port.end() == b""  # a pipe is closed: the program reads the end
            with pytest.raises(processes.InputClosed):
                port.write_some(memoryview(b"late"))
            assert await read_all(proc) == b"pipe:\ntyped\n"
            assert (await proc.wait()).exit_code == 0
        finally:
            proc.close()


async def test_a_full_stdin_pipe_takes_nothing_until_there_is_room(
    backend: RealProcessBackend,
) -> None:
    with trio.fail_after(TEST_DEADLINE_S):
        proc = backend.spawn(["/bin/sh", "-c", "read go; cat >/dev/null"], "/", ENV, stdin=True)
        try:
            port = proc.stdin
            assert port is not None
            written = 0
            while (n := port.write_some(memoryview(b"x" * 65536))) > 0:
                written += n  # never blocks: a full pipe takes 0
            assert written > 0
            await port.wait_room()  # the program reads: room again
            assert port.write_some(memoryview(b"y")) == 1
        finally:
            proc.signal_group(signal.SIGKILL)
            await proc.wait()
            proc.close()


async def test_a_terminal_spawn_and_its_resize(backend: RealProcessBackend) -> None:
    with trio.fail_after(TEST_DEADLINE_S):
        proc = backend.spawn(
            ["/bin/sh", "-c", "stty size; read line; stty size; echo got $line"],
            "/",
            ENV,
            terminal=TerminalSize(24, 80),
        )
        try:
            port = proc.stdin
            assert port is not None and port.terminal
            assert await proc.read_some() == b"24 80\r\n"
            port.resize(TerminalSize(50, 132))
            assert port.write_some(memoryview(b"hi\n")) == 3
            # The echo of the typed line, then the program's own lines, all CR LF.
            assert await read_all(proc) == b"hi\r\n50 132\r\ngot hi\r\n"
            assert (await proc.wait()).exit_code == 0
        finally:
            proc.close()
        with pytest.raises(processes.InputClosed):
            port.write_some(memoryview(b"late"))  # released with the process


async def test_terminal_spawns_leave_no_process_and_no_descriptor(
    backend: RealProcessBackend,
) -> None:
    before = open_fds()
    pids = []
    with trio.fail_after(TEST_DEADLINE_S):
        for i in range(20):
            proc = backend.spawn(
                ["/bin/sh", "-c", f"echo {i}"], "/", ENV, terminal=TerminalSize(24, 80)
            )
            assert proc.pid is not None
            pids.append(proc.pid)
            assert await read_all(proc) == f"{i}\r\n".encode()
            assert (await proc.wait()).exit_code == 0
            proc.close()
            proc = backend.spawn(["/bin/sh", "-c", "cat"], "/", ENV, stdin=True)
            assert proc.stdin is not None
            proc.stdin.end()
            assert await read_all(proc) == b""
            await proc.wait()
            proc.close()
    assert not any(alive(pid) for pid in pids)
    # None left open by the spawns; a descriptor another test left to the garbage collector
    # may close meanwhile, so the set can only shrink.
    assert open_fds() <= before


@pytest.mark.parametrize("missing", ["shell", "cwd"])
async def test_a_terminal_command_that_cannot_start_fails_and_leaks_nothing(
    backend: RealProcessBackend, tmp_path: Path, missing: str
) -> None:
    before = open_fds()
    argv = ["/nonexistent/sh" if missing == "shell" else "/bin/sh", "-c", "true"]
    cwd = str(tmp_path / "missing") if missing == "cwd" else "/"
    with pytest.raises(FileNotFoundError):
        backend.spawn(argv, cwd, ENV, terminal=TerminalSize(24, 80))
    with pytest.raises(FileNotFoundError):
        backend.spawn(argv, cwd, ENV, stdin=True)
    # None left open by the failed spawns; a descriptor another test left to the garbage
    # collector may close meanwhile (the full suite's `==` here failed once on a busy
    # machine), so the set can only shrink.
    assert open_fds() <= before


# --- the output pipe ------------------------------------------------------------------------------


class StandInPipe:
    """Our own pipe, standing in for a process's (its writer is the test, so "full" is exact).
    Both ends are non-blocking: a pipe smaller than expected fails a test, never hangs it."""

    def __init__(self) -> None:
        self.read_end, self.write_end = os.pipe()
        os.set_blocking(self.read_end, False)
        os.set_blocking(self.write_end, False)

    def write(self, data: bytes) -> None:
        os.write(self.write_end, data)

    def close_writer(self) -> None:
        """EOF for the reader (closed once: a closed number may be reused by another file)."""
        if self.write_end >= 0:
            os.close(self.write_end)
            self.write_end = -1


@asynccontextmanager
async def pipe_reader() -> AsyncIterator[tuple[processes._RealProcess, StandInPipe]]:
    """A process handle (of a real `sleep`) reading a `StandInPipe`; all cleaned up on exit."""
    proc = RealProcessBackend().spawn(["/bin/sh", "-c", "sleep 30"], "/", ENV)
    assert proc.pid is not None
    pipe = StandInPipe()
    handle = processes._RealProcess(proc.pid, pipe.read_end, None)
    try:
        yield handle, pipe
    finally:
        pipe.close_writer()
        proc.signal_group(signal.SIGKILL)
        await proc.wait()
        proc.close()
        handle.close()


async def test_a_full_pipe_grows_and_later_reads_take_more() -> None:
    with trio.fail_after(TEST_DEADLINE_S):
        async with pipe_reader() as (handle, pipe):
            default = fcntl.fcntl(pipe.read_end, fcntl.F_GETPIPE_SZ)
            if default >= processes.BULK_PIPE_BYTES:
                pytest.skip(f"the default pipe already holds {default} bytes (large pages)")
            pipe.write(b"a" * 1000)
            assert await handle.read_some() == b"a" * 1000  # not full: nothing changes
            assert fcntl.fcntl(pipe.read_end, fcntl.F_GETPIPE_SZ) == default
            pipe.write(b"b" * processes.READ_CHUNK_BYTES)  # fills it
            assert await handle.read_some() == b"b" * processes.READ_CHUNK_BYTES
            assert fcntl.fcntl(pipe.read_end, fcntl.F_GETPIPE_SZ) == processes.BULK_PIPE_BYTES
            assert handle.read_bytes == processes.BULK_PIPE_BYTES
            pipe.write(b"c" * processes.BULK_PIPE_BYTES)  # fits now, read at once
            assert await handle.read_some() == b"c" * processes.BULK_PIPE_BYTES
            pipe.close_writer()
            assert await handle.read_some() == b""


async def test_a_refused_pipe_growth_keeps_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    # Larger than any pipe can be: the kernel refuses it (EINVAL), as it refuses a user over
    # its pipe quota (EPERM). Reading goes on with the default pipe, nothing lost.
    monkeypatch.setattr(processes, "BULK_PIPE_BYTES", 2**31 + 4096)
    with trio.fail_after(TEST_DEADLINE_S):
        async with pipe_reader() as (handle, pipe):
            default = fcntl.fcntl(pipe.read_end, fcntl.F_GETPIPE_SZ)
            for piece in (b"a", b"b", b"c"):
                pipe.write(piece * processes.READ_CHUNK_BYTES)  # a full read each time
                assert await handle.read_some() == piece * processes.READ_CHUNK_BYTES
            assert fcntl.fcntl(pipe.read_end, fcntl.F_GETPIPE_SZ) == default
            assert handle.read_bytes == processes.READ_CHUNK_BYTES


async def test_a_large_output_arrives_whole_through_a_growing_pipe(
    backend: RealProcessBackend,
) -> None:
    expected = "".join(f"{i}\n" for i in range(1, 400_001)).encode()  # 2.7 MB
    with trio.fail_after(TEST_DEADLINE_S):
        proc = backend.spawn(["/bin/sh", "-c", "seq 1 400000"], "/", ENV)
        try:
            assert await read_all(proc) == expected
            assert (await proc.wait()).exit_code == 0
        finally:
            proc.close()
