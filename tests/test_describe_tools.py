"""`describe_tools` -> `tool_definitions` (PROTOCOL.md 10.3) from a real agent: over a raw
socket as any client author would send it, through both Python clients, and as `toolwire
tools` prints it for a model API."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import jsonschema
import pytest
import trio

from tests.clientshells import SHELLS, Shell
from tests.conftest import LiveServer
from tests.test_cli_failures import run_toolwire
from tests.test_serve import serve
from toolwire.actors.tools.registry import TOOLS, input_schema
from toolwire.transport import protocol, reference

TEST_DEADLINE_S = 20.0


@pytest.mark.parametrize("encoding", ["json", "msgpack"])
async def test_the_agent_describes_every_tool_of_its_welcome_in_order(
    live: LiveServer, encoding: str
) -> None:
    with trio.fail_after(TEST_DEADLINE_S):
        async with live.connect(encoding=encoding) as conn:
            assert "describe_tools" in conn.welcome["features"]
            await conn.send({"type": "describe_tools", "rid": "d-1", "unknown": 1})
            reply = await conn.recv()
            await conn.send({"type": "describe_tools"})
            bare = await conn.recv()
    assert reply["type"] == "tool_definitions" and reply["rid"] == "d-1"
    assert "rid" not in bare and bare["tools"] == reply["tools"]
    assert [tool["name"] for tool in reply["tools"]] == conn.welcome["tools"]
    # The docs' welcome example lists what a live agent sends (transport/reference.py).
    assert reference.EXAMPLES["welcome"]["tools"] == conn.welcome["tools"]
    assert reference.EXAMPLES["welcome"]["features"] == conn.welcome["features"]
    for tool in reply["tools"]:
        assert set(tool) == {"name", "description", "input_schema", "effect"}
        entry = TOOLS[tool["name"]]
        assert (tool["description"], tool["effect"]) == (entry.description, entry.effect)
        assert tool["input_schema"] == input_schema(entry)
        jsonschema.Draft202012Validator.check_schema(tool["input_schema"])


async def test_args_the_schema_refuses_are_bad_args_from_the_agent(live: LiveServer) -> None:
    with trio.fail_after(TEST_DEADLINE_S):
        async with live.connect() as conn:
            await conn.send({"type": "describe_tools", "rid": 1})
            schemas = {t["name"]: t["input_schema"] for t in (await conn.recv())["tools"]}
            cases = [
                ("read_file", {"path": "a", "limit": 0}),
                ("read_file", {"path": "a", "ofset": 3}),
                ("execute", {"command": "true", "pty": {"rows": 24, "cols": 80, "x": 1}}),
                ("list_dir", {"depth": 9}),
                ("process_list", {"all": True}),
            ]
            for index, (tool, args) in enumerate(cases):
                assert not jsonschema.Draft202012Validator(schemas[tool]).is_valid(args)
                reply = await conn.call("c", f"bad-{index}", tool, args)
                assert (reply["type"], reply["code"]) == ("error", "bad_args"), reply
            (live.workspace / "a").write_text("x\n")
            good = {"path": "a", "offset": 1}
            assert jsonschema.Draft202012Validator(schemas["read_file"]).is_valid(good)
            assert (await conn.call("c", "good", "read_file", good))["outcome"] == "completed"


@pytest.fixture(params=sorted(SHELLS))
def shell(request: pytest.FixtureRequest) -> Shell:
    return SHELLS[request.param]()


async def test_both_clients_return_typed_definitions(shell: Shell, live: LiveServer) -> None:
    async def body() -> None:
        async with shell.connect(live.url, live.token) as client:
            tools = await client.describe_tools()
            assert all(isinstance(tool, protocol.ToolDefinition) for tool in tools)
            assert [tool.name for tool in tools] == client.welcome.tools
            [list_dir] = [tool for tool in tools if tool.name == "list_dir"]
            assert list_dir.effect == "read"
            assert list_dir.input_schema["properties"]["depth"]["maximum"] == 8

    await shell.run(body)


async def _toolwire_tools(*argv: str) -> subprocess.CompletedProcess[bytes]:
    return await run_toolwire("tools", *argv)


async def test_toolwire_tools_prints_the_shapes_model_apis_take(tmp_path: Path) -> None:
    async with serve(tmp_path) as server:
        where = ["--url", server.url, "--state-dir", str(tmp_path / "state")]
        own = await _toolwire_tools(*where)
        openai = await _toolwire_tools(*where, "--format", "openai")
        anthropic = await _toolwire_tools(*where, "--format", "anthropic")
        refused = await _toolwire_tools("--url", server.url, "--token", "wrong")
    for done in (own, openai, anthropic):
        assert done.returncode == 0, done.stderr
    tools = json.loads(own.stdout)
    assert [t["name"] for t in tools] == list(TOOLS)
    assert json.loads(openai.stdout) == [
        {
            "type": "function",
            "function": {
                "name": t["name"],
                "description": t["description"],
                "parameters": t["input_schema"],
            },
        }
        for t in tools
    ]
    assert json.loads(anthropic.stdout) == [
        {"name": t["name"], "description": t["description"], "input_schema": t["input_schema"]}
        for t in tools
    ]
    assert refused.returncode == 2
    assert refused.stderr.decode().startswith(f"toolwire tools: could not connect to {server.url}")
