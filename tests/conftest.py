"""Shared fixtures: a real agent and WebSocket server on 127.0.0.1 in the test's nursery."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
import trio
from hypothesis import HealthCheck, settings

from tests import wsclient
from toolwire.actors.agent import Agent, AgentContext, Limits
from toolwire.actors.journal import SqliteJournal
from toolwire.transport.server import Server, ServerConfig

# No hypothesis test asserts on time: on a busy CI machine an example may take seconds, which is
# not a failure (hypothesis's default deadline of 200 ms per example, and its health check of
# slow data generation, would make it one).
settings.register_profile("toolwire", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("toolwire")

TOKEN = "test-token-0123456789"

# Hypothesis writes its example database under the working directory unless told otherwise.
os.environ.setdefault("HYPOTHESIS_STORAGE_DIRECTORY", "/tmp/toolwire-hypothesis")


@dataclass
class LiveServer:
    agent: Agent
    server: Server
    url: str
    token: str
    workspace: Path

    def connect(self, **kwargs: Any) -> AbstractAsyncContextManager[wsclient.RawConn]:
        return wsclient.connect(self.url, self.token, **kwargs)


async def start_server(
    nursery: trio.Nursery,
    workspace: Path,
    *,
    limits: Limits | None = None,
    token: str | None = TOKEN,
    **ctx_kwargs: Any,
) -> LiveServer:
    ctx = AgentContext(workspace=str(workspace), **ctx_kwargs)
    if limits is not None:
        ctx = replace(ctx, limits=limits)
    agent = await nursery.start(Agent(ctx).run)
    server = Server(agent, ServerConfig(host="127.0.0.1", port=0, token=token))
    port = await nursery.start(server.serve)
    return LiveServer(agent, server, f"ws://127.0.0.1:{port}/v1", token or "", workspace)


@pytest.fixture(params=["memory", "sqlite"])
async def live(
    nursery: trio.Nursery, tmp_path: Path, request: pytest.FixtureRequest
) -> AsyncIterator[LiveServer]:
    """Every test of a live server runs twice: with the memory journal (results stay on the
    records), and with the SQLite journal of `toolwire serve` and no recent-results cache, so
    that every repeat, attach, cancel and turn of a finished call reads its result back from
    the journal."""
    workspace = tmp_path / "ws"
    workspace.mkdir()
    if request.param == "sqlite":
        journal = SqliteJournal(tmp_path / "state" / "journal.sqlite3")
        server = await start_server(nursery, workspace, journal=journal, result_cache_entries=0)
    else:
        server = await start_server(nursery, workspace)
    yield server
    await server.server.shutdown()  # as SIGTERM stops `toolwire serve`: no process outlives it


MakeServer = Callable[..., Awaitable[LiveServer]]


@pytest.fixture(params=["memory", "sqlite"])
async def make_server(
    nursery: trio.Nursery, tmp_path: Path, request: pytest.FixtureRequest
) -> AsyncIterator[MakeServer]:
    """Servers with their own limits, policy or kill grace (keyword arguments of
    `start_server`), each with a workspace of its own; their processes are stopped after. Like
    `live`, every test runs twice: on the memory journal and on SQLite with no recent-results
    cache (unless the test brings its own journal)."""
    servers: list[LiveServer] = []

    async def make(**kwargs: Any) -> LiveServer:
        workspace = tmp_path / f"ws{len(servers)}"
        workspace.mkdir()
        if request.param == "sqlite" and "journal" not in kwargs:
            state = tmp_path / f"state{len(servers)}"
            kwargs |= {"journal": SqliteJournal(state / "journal.sqlite3")}
            kwargs.setdefault("result_cache_entries", 0)
        server = await start_server(nursery, workspace, **kwargs)
        servers.append(server)
        return server

    yield make
    for server in servers:
        await server.server.shutdown()
