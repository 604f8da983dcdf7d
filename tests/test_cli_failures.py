"""How `toolwire call` and `toolwire tools` report failures to a user at a terminal: an agent
they cannot reach and a request the agent refuses each give one line on stderr that names the
command and the reason, and exit status 2, whichever command it was."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import trio

from tests.test_serve import ROOT, serve


async def run_toolwire(*argv: str) -> subprocess.CompletedProcess[bytes]:
    """`toolwire ARGV...` as a user runs it from the checkout (no TOOLWIRE_TOKEN of ours)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("TOOLWIRE_TOKEN", None)
    return await trio.run_process(
        [sys.executable, "-m", "toolwire.cli.main", *argv],
        capture_stdout=True,
        capture_stderr=True,
        check=False,
        env=env,
        cwd=str(ROOT),
    )


async def test_a_refused_request_and_an_unreachable_agent_each_say_why(tmp_path: Path) -> None:
    async with serve(tmp_path) as server:
        state = ["--url", server.url, "--state-dir", str(tmp_path / "state")]
        unknown = await run_toolwire("call", *state, "--chat", "c", "no_such_tool", "{}")
        wrong_token = await run_toolwire(
            "call", "--url", server.url, "--token", "wrong", "execute", '{"command": "true"}'
        )
        tools_refused = await run_toolwire("tools", "--url", server.url, "--token", "wrong")
    for done in (unknown, wrong_token, tools_refused):
        assert done.returncode == 2, done
        assert done.stdout == b""
        assert len(done.stderr.decode().splitlines()) == 1, done.stderr
    assert unknown.stderr.decode().startswith("toolwire call: unknown_tool: ")
    assert wrong_token.stderr.decode().startswith(
        f"toolwire call: could not connect to {server.url}"
    )
    assert tools_refused.stderr.decode().startswith(
        f"toolwire tools: could not connect to {server.url}"
    )
