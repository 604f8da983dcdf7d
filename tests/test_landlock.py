"""actors/landlock.py at every ABI level (1 to 7), and the confined threads that apply it.

A lower ABI is `Landlock(abi)` built by hand: its rulesets use only that ABI's rights, and the
running kernel (which offers more) accepts them as it would from a program written for the
older ABI. So each level is checked for real: what it refuses to promise (`Unsupported`), and,
where it can enforce, a command spawned by a thread confined at that level cannot write outside
or open a TCP connection, while the test's own (main) thread still can."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from toolwire.actors import landlock
from toolwire.actors.confined import MAX_THREADS, ConfinedThread, ConfinedThreads
from toolwire.actors.landlock import Landlock, Unsupported

KERNEL = Landlock.probe()
pytestmark = pytest.mark.skipif(KERNEL.abi < 4, reason="needs a kernel with Landlock ABI >= 4")


@pytest.fixture
def dirs() -> Iterator[tuple[Path, Path]]:
    """(writable, outside): neither under the other, outside not under the temp dir."""
    writable = Path(tempfile.mkdtemp(prefix="toolwire-ll-in-"))
    outside = Path(tempfile.mkdtemp(dir="/var/tmp", prefix="toolwire-ll-out-"))
    yield writable, outside
    shutil.rmtree(writable)
    shutil.rmtree(outside)


def test_the_kernel_reports_its_abi() -> None:
    assert KERNEL.abi >= 4  # this machine: 7
    assert KERNEL.filesystem and KERNEL.network


@pytest.mark.parametrize("abi", range(0, 8))
def test_what_each_abi_can_promise(abi: int) -> None:
    level = Landlock(abi)
    assert level.filesystem == (abi >= 3)  # before 3, truncate(2) was out of reach
    assert level.network == (abi >= 4)
    if abi < 3:
        with pytest.raises(Unsupported, match="filesystem rules need Landlock ABI 3"):
            level.ruleset(writable=[], network=True)
    if abi < 4:
        with pytest.raises(Unsupported, match="network rules need Landlock ABI 4"):
            level.ruleset(writable=None, network=False)
    if abi >= 3:
        rules = level.ruleset(writable=["/w"], network=abi < 4)
        handled = rules.handled_fs
        assert handled & landlock.LANDLOCK_ACCESS_FS_WRITE_FILE
        assert handled & landlock.LANDLOCK_ACCESS_FS_REFER
        assert handled & landlock.LANDLOCK_ACCESS_FS_TRUNCATE
        # reading and executing stay allowed everywhere: never handled
        assert not handled & (
            landlock.LANDLOCK_ACCESS_FS_READ_FILE | landlock.LANDLOCK_ACCESS_FS_EXECUTE
        )
        assert ("/w", handled) in rules.rules
        assert ("/dev/null", landlock.LANDLOCK_ACCESS_FS_WRITE_FILE) in rules.rules
        assert bool(rules.scoped & landlock.LANDLOCK_SCOPE_SIGNAL) == (abi >= 6)
        # with `visible` (the agent's own files left out), reading is handled: allowed only
        # beneath those paths and beneath the write roots
        hiding = level.ruleset(writable=["/w"], network=True, visible=["/etc", "/usr"])
        assert hiding.handled_fs == handled | landlock.LANDLOCK_ACCESS_FS_READ_FILE
        assert ("/etc", landlock.LANDLOCK_ACCESS_FS_READ_FILE) in hiding.rules
        assert ("/w", hiding.handled_fs) in hiding.rules
    if abi >= 4:
        net = level.ruleset(writable=None, network=False)
        assert net.handled_fs == 0 and net.rules == ()
        assert net.handled_net == (
            landlock.LANDLOCK_ACCESS_NET_BIND_TCP | landlock.LANDLOCK_ACCESS_NET_CONNECT_TCP
        )
        assert bool(net.scoped & landlock.LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET) == (abi >= 6)


def _run_confined(thread: ConfinedThread, command: str) -> subprocess.CompletedProcess[str]:
    return thread.call(
        lambda: subprocess.run(["/bin/sh", "-c", command], capture_output=True, text=True)
    )


@pytest.mark.parametrize("abi", range(3, 8))
def test_a_command_of_a_confined_thread_cannot_write_outside(
    abi: int, dirs: tuple[Path, Path]
) -> None:
    writable, outside = dirs
    (outside / "kept").write_text("keep")
    rules = Landlock(abi).ruleset(writable=[str(writable)], network=True)
    thread = ConfinedThread(rules, refuse_tcp=False)
    try:
        inside = _run_confined(thread, f"echo a > {writable}/a && echo b > /dev/null")
        out = _run_confined(thread, f"echo x > {outside}/x")
        cut = _run_confined(thread, f"truncate -s 0 {outside}/kept")
        moved = _run_confined(thread, f"mv {writable}/a {outside}/a")
    finally:
        thread.close()
    assert inside.returncode == 0, inside.stderr
    assert (writable / "a").exists()
    assert out.returncode != 0 and "Permission denied" in out.stderr
    assert cut.returncode != 0 and (outside / "kept").read_text() == "keep"
    assert moved.returncode != 0 and not (outside / "a").exists()
    # The test's own thread was never confined.
    (outside / "main").write_text("main")
    assert (outside / "main").read_text() == "main"


@pytest.mark.parametrize("abi", range(4, 8))
def test_a_command_of_a_confined_thread_cannot_reach_tcp(abi: int) -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    connect = f"python3 -c \"import socket; socket.create_connection(('127.0.0.1', {port}))\""
    try:
        landlock_only = ConfinedThread(
            Landlock(abi).ruleset(writable=None, network=False), refuse_tcp=False
        )
        both = ConfinedThread(Landlock(abi).ruleset(writable=None, network=False), refuse_tcp=True)
        try:
            refused = _run_confined(landlock_only, connect)
            # Landlock alone lets a never-bound socket listen (the kernel binds it itself):
            # the seccomp filter is what closes that.
            listen = "python3 -c 'import socket; socket.socket().listen()'"
            through = _run_confined(landlock_only, listen)
            closed = _run_confined(both, listen)
        finally:
            landlock_only.close()
            both.close()
        socket.create_connection(("127.0.0.1", port)).close()  # the main thread still can
    finally:
        listener.close()
    assert refused.returncode != 0 and "Permission denied" in refused.stderr
    assert through.returncode == 0, through.stderr
    assert closed.returncode != 0 and "Permission denied" in closed.stderr


def test_threads_are_kept_per_ruleset_and_bounded() -> None:
    threads = ConfinedThreads()
    rules = [
        Landlock(KERNEL.abi).ruleset(writable=[f"/w{i}"], network=True)
        for i in range(MAX_THREADS + 4)
    ]
    try:
        first = threads.thread_for(rules[0], refuse_tcp=False)
        assert threads.thread_for(rules[0], refuse_tcp=False) is first
        assert threads.thread_for(rules[0], refuse_tcp=True) is not first
        made = [threads.thread_for(rule, refuse_tcp=False) for rule in rules[1:]]
        # the least recently used were let go: MAX_THREADS stay, each of the others has ended
        assert len(threads) == MAX_THREADS
        assert (
            not first.alive
            and [thread.alive for thread in made] == [False] * 3 + [True] * MAX_THREADS
        )
        assert made[-1] is threads.thread_for(rules[-1], refuse_tcp=False)
    finally:
        threads.close()
    assert not any(thread.alive for thread in made)


def test_a_thread_that_cannot_be_confined_runs_nothing() -> None:
    # An ABI-7 attribute size on a ruleset that claims ABI 99 rights the kernel does not know.
    bogus = landlock.Ruleset(7, 1 << 62, 0, 0, ())
    thread = ConfinedThread(bogus, refuse_tcp=False)
    ran = []
    try:
        with pytest.raises(OSError, match="the sandbox could not be applied"):
            thread.call(lambda: ran.append(os.getpid()))
    finally:
        thread.close()
    assert ran == []
