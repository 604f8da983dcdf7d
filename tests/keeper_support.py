"""What the keeper's live tests share (tests/test_keeper.py, tests/test_keeper_spawn.py):
`toolwire serve` on a state dir with a client, a call's message, the keeper's processes."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio

from tests.test_serve import ServeProcess, serve
from tests.wsclient import RawConn, connect
from toolwire.actors.kept import KeeperClient, KeptProcess, KeptProcessBackend


@asynccontextmanager
async def agent(tmp_path: Path, *extra: str) -> AsyncIterator[tuple[ServeProcess, RawConn]]:
    async with serve(tmp_path, *extra) as server:
        token = (tmp_path / "state" / "token").read_text().strip()
        async with connect(server.url, token) as conn:
            yield server, conn


def call_message(call_id: str, tool: str, args: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"type": "call", "chat_id": "c", "call_id": call_id, "tool": tool, "args": args,
            **extra}  # fmt: skip


def keeper_pids(state: Path) -> list[int]:
    """The keepers of the state dir `state` (its `keeper` directory on their command line)."""
    pids = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{name}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"toolwire.actors.keeper" in cmdline and str(state / "keeper").encode() in cmdline:
            pids.append(int(name))
    return pids


async def gone(pid: int) -> None:
    """Wait until `pid` exited (its pidfd turns readable: an event, not a poll)."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    try:
        with trio.fail_after(30):
            await trio.lowlevel.wait_readable(fd)
    finally:
        os.close(fd)


@asynccontextmanager
async def kept_backend(state: Path) -> AsyncIterator[KeptProcessBackend]:
    """The agent's side of the keeper of state dir `state` (started if none runs), running as
    the agent runs it: its client's reader in a nursery of its own; closed at the end."""
    client = KeeperClient.connect_or_start(str(state))
    backend = KeptProcessBackend(client, 1 << 20)
    try:
        async with trio.open_nursery() as nursery:
            client.nursery = backend.nursery = nursery  # as the agent's run sets them
            nursery.start_soon(client.run)
            yield backend
            nursery.cancel_scope.cancel()
    finally:
        backend.client.close()


class SpawnAnswer:
    """The keeper's answer to one spawn (`kept.SpawnWaiter`), for tests that spawn through
    `KeptProcessBackend.start_spawn` as the agent does."""

    def __init__(self) -> None:
        self.came = trio.Event()
        self.handle: KeptProcess | None = None
        self.error: OSError | None = None

    def spawned(self, handle: KeptProcess) -> None:
        self.handle = handle
        self.came.set()

    def spawn_failed(self, error: OSError) -> None:
        self.error = error
        self.came.set()

    def spawn_unanswered(self, error: OSError) -> None:
        self.spawn_failed(error)

    async def exit_code(self) -> int | None:
        """Wait for the answer, then the output's end and the exit; the exit code."""
        with trio.fail_after(20):
            await self.came.wait()
            handle = self.handle
            assert handle is not None, self.error
            while await handle.read_some():
                pass
            status = await handle.wait()
        handle.close()
        handle.release()
        return status.exit_code
