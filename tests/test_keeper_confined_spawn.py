"""A sandboxed spawn is handed to its ruleset's confined thread and answered when that thread
has started it (actors/keeper.py, `_spawn` and `_on_spawned`): meanwhile the keeper answers
every other request; a second spawn of its key is refused at once; a spawn whose agent goes
before it is answered starts nothing that stays running, and the keeper waits for it before it
ends; what the thread raises is answered as an error, and the keeper goes on.

The keeper here is the real `Keeper` running in a thread of the test process (so the test can
reach its confined thread), with real Landlock threads, real commands and a real socket. A
spawn is held in its thread by handing that thread, first, a job that waits for the test
(`ConfinedThread.call` from another thread): the thread runs its jobs one at a time, so the
spawn waits behind it, exactly as a slow spawn would.
"""

from __future__ import annotations

import errno
import os
import shutil
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import trio

from tests.keeper_support import SpawnAnswer, kept_backend
from toolwire.actors.keeper import Keeper
from toolwire.actors.kept import (
    KeeperClient,
    KeepInfo,
    KeptProcessBackend,
)
from toolwire.actors.sandbox import Confinement, Enforcement
from toolwire.actors.sandbox_policy import SandboxPolicy

PROBED = Enforcement.probe()
pytestmark = pytest.mark.skipif(
    not PROBED.filesystem, reason="this kernel has no Landlock filesystem rules"
)
ENV = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}


@dataclass
class _Here:
    keeper: Keeper
    loop: threading.Thread
    backend: KeptProcessBackend
    confinement: Confinement
    workspace: Path


@asynccontextmanager
async def _keeper_here(tmp_path: Path) -> AsyncIterator[_Here]:
    """A keeper on a thread of this process, its agent's client, and a workspace confinement."""
    state = tmp_path / "state"
    keeper_dir = state / "keeper"
    keeper_dir.mkdir(parents=True, mode=0o700)
    keeper = Keeper(str(keeper_dir))
    loop = threading.Thread(target=keeper.run, name="test-keeper", daemon=True)
    loop.start()
    ws, temp = tmp_path / "ws", tmp_path / "tmp"
    ws.mkdir()
    temp.mkdir()
    confinement = Enforcement(PROBED.landlock, temp_dir=str(temp)).confinement(
        SandboxPolicy(filesystem="workspace_write"), str(ws)
    )
    assert confinement is not None
    try:
        async with kept_backend(state) as backend:
            yield _Here(keeper, loop, backend, confinement, ws)
    finally:
        with trio.fail_after(20):
            await trio.to_thread.run_sync(loop.join)  # no agent, nothing held: it ends
        keeper.close()
        keeper.confined.close()


@contextmanager
def _thread_held(here: _Here) -> Iterator[None]:
    """The confinement's thread in the keeper busy with a job that waits until the block
    ends: the spawns handed to it meanwhile wait behind that job."""
    thread = here.keeper.confined.thread_for(
        here.confinement.ruleset, refuse_tcp=here.confinement.refuse_tcp
    )
    entered, release = threading.Event(), threading.Event()

    def hold() -> None:
        entered.set()
        release.wait()

    holder = threading.Thread(target=thread.call, args=(hold,), daemon=True)
    holder.start()
    entered.wait()
    try:
        yield
    finally:
        release.set()
        holder.join()


def _spawn(
    here: _Here, call_id: str, argv: list[str], *, confined: bool, cwd: str | None = None
) -> SpawnAnswer:
    answer = SpawnAnswer()
    here.backend.start_spawn(
        argv,
        cwd if cwd is not None else str(here.workspace),
        ENV,
        answer,
        confinement=here.confinement if confined else None,
        keep=KeepInfo("chat", call_id, {"argv": argv}, 0),
    )
    return answer


async def _failure(answer: SpawnAnswer) -> OSError:
    with trio.fail_after(20):
        await answer.came.wait()
    assert answer.handle is None, "it should have been refused"
    assert answer.error is not None
    return answer.error


class _Reply:
    """A `ReplyWaiter` for a request sent by hand."""

    def __init__(self) -> None:
        self.came = trio.Event()
        self.reply: dict[str, Any] = {}

    def replied(self, reply: dict[str, Any], fds: list[int]) -> None:
        for fd in fds:
            os.close(fd)
        self.reply = reply
        self.came.set()

    def unanswered(self, error: OSError) -> None:
        self.reply = {"errno": error.errno, "error": str(error)}
        self.came.set()


async def _ping(here: _Here) -> None:
    reply = _Reply()
    here.backend.client.request_later({"op": "ping"}, reply)
    with trio.fail_after(20):
        await reply.came.wait()
    assert "errno" not in reply.reply


def _children() -> set[int]:
    """This process's children (the keeper here is this process: they are its commands)."""
    found: set[int] = set()
    for task in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{task}/children") as f:
            found.update(int(pid) for pid in f.read().split())
    return found


async def test_other_requests_are_answered_while_a_sandboxed_spawn_waits_for_its_thread(
    tmp_path: Path,
) -> None:
    async with _keeper_here(tmp_path) as here:
        assert await _spawn(here, "warm", ["/bin/true"], confined=True).exit_code() == 0
        with _thread_held(here):
            confined = _spawn(here, "confined", ["/bin/sh", "-c", "exit 3"], confined=True)
            # An unconfined command runs to its end, and a ping is answered, meanwhile.
            assert await _spawn(here, "plain", ["/bin/true"], confined=False).exit_code() == 0
            await _ping(here)
            assert not confined.came.is_set()
        assert await confined.exit_code() == 3


async def test_a_second_spawn_of_a_key_whose_spawn_is_pending_is_refused_at_once(
    tmp_path: Path,
) -> None:
    async with _keeper_here(tmp_path) as here:
        with _thread_held(here):
            first = _spawn(here, "same", ["/bin/true"], confined=True)
            error = await _failure(_spawn(here, "same", ["/bin/true"], confined=False))
            assert error.errno == errno.EEXIST
            assert not first.came.is_set()
        assert await first.exit_code() == 0


async def test_a_spawn_pending_when_its_agent_goes_is_held_for_the_next_agent(
    tmp_path: Path,
) -> None:
    """The agent goes (a crash, or `--on-shutdown keep`) while its sandboxed spawn waits in the
    confined thread: the keeper still carries it out, as it carries out an unconfined spawn
    read after its agent went, and holds the command (its start row is durable, so the next
    agent re-adopts it by its key): its output is recorded and its exit written, and the
    keeper ends only once it is done."""
    async with _keeper_here(tmp_path) as here:
        with _thread_held(here):
            pending = _spawn(here, "kept", ["/bin/sh", "-c", "echo kept"], confined=True)
            await _ping(here)  # sent after the spawn: the keeper has taken the spawn
            here.backend.client.close()  # the agent goes before the spawn is answered
            assert not pending.came.is_set()
        with trio.fail_after(20):
            await trio.to_thread.run_sync(here.loop.join)  # it ends once the command is done
        (held,) = here.keeper.held.values()  # (held by the key `kept.KeepInfo` makes)
        assert held.status is not None and held.status[0] == 0
        assert held.recording is not None and held.recording.total == len(b"kept\n")


async def test_a_spawn_pending_when_another_agent_connects_leaves_nothing_running(
    tmp_path: Path,
) -> None:
    """A new agent connects (it replaces the old one's connection, and lists what it
    re-adopts) while the old agent's sandboxed spawn waits in the confined thread: no agent
    would ever answer for that command, so what the spawn started is killed and reaped, and
    the keeper holds nothing of it."""
    sleep = shutil.which("sleep")
    assert sleep is not None
    before = _children()
    async with _keeper_here(tmp_path) as here:
        with _thread_held(here):
            pending = _spawn(here, "orphan", [sleep, "60"], confined=True)
            await _ping(here)  # sent after the spawn: the keeper has taken the spawn
            newer = KeeperClient.connect_or_start(str(tmp_path / "state"))
            assert newer.protocol >= 2  # it was answered: its connection replaced the old one
            here.backend.client.close()
            newer.close()
            assert not pending.came.is_set()
        # Had the keeper held `sleep 60`, it would not end within the 20 s.
        with trio.fail_after(20):
            await trio.to_thread.run_sync(here.loop.join)
        assert here.keeper.held == {}
    assert _children() <= before


async def test_what_the_confined_thread_raises_is_answered_as_an_error(tmp_path: Path) -> None:
    async with _keeper_here(tmp_path) as here:
        with _thread_held(here):
            missing = _spawn(here, "missing", [str(tmp_path / "no-such-program")], confined=True)
            nul = _spawn(here, "nul", ["/bin/echo", "a\0b"], confined=True)
            no_cwd = _spawn(
                here, "no-cwd", ["/bin/true"], confined=True, cwd=str(tmp_path / "gone")
            )
        assert (await _failure(missing)).errno == errno.ENOENT
        assert (await _failure(nul)).errno == errno.EINVAL
        assert (await _failure(no_cwd)).errno == errno.ENOENT
        # A bug's exception (a cwd that is no string: the spawner raises TypeError) fails
        # that spawn alone, as an error naming the keeper.
        broken = _Reply()
        client = here.backend.client
        message = {
            "op": "spawn",
            "key": "broken",
            "argv": ["/bin/true"],
            "cwd": 5,
            "env": ENV,
            "meta": {"chat_id": "chat", "call_id": "broken", "args": {}, "started_at_ms": 0},
            "ruleset_id": client.ruleset_id(here.confinement),
        }
        client.request_later(message, broken)
        with trio.fail_after(20):
            await broken.came.wait()
        assert broken.reply["errno"] == errno.EIO
        assert "keeper error" in broken.reply["error"]
        # Nothing of those is held, and the keeper goes on spawning confined.
        assert here.keeper.held.keys() == set()
        assert await _spawn(here, "after", ["/bin/true"], confined=True).exit_code() == 0
