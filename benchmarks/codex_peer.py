"""OpenAI's Codex app-server as a peer baseline: its binary in a subprocess, spoken to the way
its own clients do, JSON-RPC 2.0 as one JSON object a line over the process's stdin and stdout.

What the `peers` scenario asks of it: `initialize` (then the `initialized` notification), and
`command/exec` of an argv with `sandboxPolicy: {"type": "dangerFullAccess"}`, its unsandboxed
setting (the default, read-only, runs every command under bubblewrap). A `command/exec` with
`streamStdoutStderr` (and the `processId` that requires) sends its output as
`command/exec/outputDelta` notifications before the response. The server gets a `CODEX_HOME`
of its own (an empty temporary directory): no login, no user config, nothing of the user's
touched; `command/exec` needs no login.

Where to find the binary: `--codex PATH` of `toolwire bench`, else `$TOOLWIRE_BENCH_CODEX`
(docs/benchmarks.md says how to install it).
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import IO, Any

import trio

CODEX_ENV = "TOOLWIRE_BENCH_CODEX"
UNSANDBOXED = {"type": "dangerFullAccess"}
# Its start (config, a startup check) takes about a second here; more means it is stuck.
INITIALIZE_TIMEOUT_S = 30.0


def find_codex(path: str | None) -> tuple[str | None, str]:
    """The Codex binary to run (from `path`, else $TOOLWIRE_BENCH_CODEX), or None and why not:
    the reason is the scenario's "skipped: ..." line."""
    where = path or os.environ.get(CODEX_ENV)
    if not where:
        return None, (
            f"no Codex app-server: pass --codex PATH or set {CODEX_ENV} "
            "(docs/benchmarks.md, 'peers', says how to install it)"
        )
    if not (os.path.isfile(where) and os.access(where, os.X_OK)):
        return None, f"no Codex app-server: {where!r} is not an executable file"
    return where, ""


class CodexError(RuntimeError):
    """The app-server answered a request with a JSON-RPC error, or ended."""


class CodexAppServer:
    """One running `codex app-server`: `request` sends a request and waits for its response;
    notifications go to `on_notification`."""

    def __init__(self, process: trio.Process) -> None:
        self.process = process
        self._next_id = 0
        self._waiting: dict[int, trio.MemorySendChannel[dict[str, Any]]] = {}
        self.on_notification: Callable[[dict[str, Any]], None] = lambda _message: None
        self._send_lock = trio.Lock()

    @property
    def pid(self) -> int:
        return self.process.pid

    async def request(self, method: str, params: dict[str, Any]) -> Any:
        self._next_id += 1
        rid = self._next_id
        send, receive = trio.open_memory_channel[dict[str, Any]](1)
        self._waiting[rid] = send
        line = json.dumps({"jsonrpc": "2.0", "id": rid, "method": method, "params": params})
        await self._write(line)
        async with receive:
            message = await receive.receive()
        if "error" in message:
            raise CodexError(f"{method}: {message['error']}")
        return message.get("result")

    async def notify(self, method: str) -> None:
        await self._write(json.dumps({"jsonrpc": "2.0", "method": method}))

    async def exec(self, argv: list[str], **options: Any) -> dict[str, Any]:
        """`command/exec` of `argv`, unsandboxed; the response (exitCode, stdout, stderr)."""
        result: dict[str, Any] = await self.request(
            "command/exec", {"command": argv, "sandboxPolicy": UNSANDBOXED, **options}
        )
        return result

    async def _write(self, line: str) -> None:
        assert self.process.stdin is not None
        async with self._send_lock:
            await self.process.stdin.send_all(line.encode() + b"\n")

    async def read_loop(self) -> None:
        assert self.process.stdout is not None
        buffered = b""
        async for data in self.process.stdout:
            buffered += data
            *lines, buffered = buffered.split(b"\n")
            for line in lines:
                if line.strip():
                    self._dispatch(json.loads(line))
        for send in self._waiting.values():
            send.send_nowait({"error": "the app-server ended"})
        self._waiting.clear()

    def _dispatch(self, message: dict[str, Any]) -> None:
        rid = message.get("id")
        if "method" in message:
            if rid is None:
                self.on_notification(message)
            # A request from the server (an approval): none is asked for by what we send.
            return
        send = self._waiting.pop(rid, None) if isinstance(rid, int) else None
        if send is not None:
            send.send_nowait(message)


@asynccontextmanager
async def codex_app_server(
    binary: str, cwd: Path, home: Path, stderr: IO[bytes]
) -> AsyncIterator[CodexAppServer]:
    """Start `binary app-server` in `cwd` with CODEX_HOME `home` (its log to `stderr`),
    initialize it, and stop it after (its stdin closed: it exits; killed if not within 5 s)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CODEX_")}
    env["CODEX_HOME"] = str(home)
    process = await trio.lowlevel.open_process(
        [binary, "app-server"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=stderr,
        cwd=str(cwd),
        env=env,
    )
    server = CodexAppServer(process)
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(server.read_loop)
            with trio.fail_after(INITIALIZE_TIMEOUT_S):
                await server.request(
                    "initialize", {"clientInfo": {"name": "toolwire-bench", "version": "1"}}
                )
            await server.notify("initialized")
            try:
                yield server
            finally:
                assert process.stdin is not None
                await process.stdin.aclose()
                with trio.move_on_after(5):
                    await process.wait()
                nursery.cancel_scope.cancel()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
