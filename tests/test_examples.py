"""The runnable examples of docs/integrations.md, run as a user runs them against a real
`toolwire serve`, each twice: the second run gets the saved results (chat_server_tools.py) or
resumes the first, killed mid-command (pydantic_ai_chat.py); nothing runs again."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import trio

from tests.test_serve import ROOT, serve

TOKEN = "example-token-0123456789"


async def test_the_chat_server_example_runs_its_calls_once_as_one_turn(tmp_path: Path) -> None:
    async with serve(tmp_path, env={"TOOLWIRE_TOKEN": TOKEN}) as server:
        env = {k: v for k, v in os.environ.items()} | {
            "TOOLWIRE_TOKEN": TOKEN,
            "PYTHONPATH": str(ROOT),
        }
        argv = [sys.executable, str(ROOT / "examples" / "chat_server_tools.py"), server.url]
        runs = []
        for _ in range(2):
            with trio.fail_after(30):
                done = await trio.run_process(argv, env=env, capture_stdout=True, check=False)
            assert done.returncode == 0, done
            runs.append(done.stdout.decode())
        server.process.send_signal(signal.SIGTERM)  # stops every process group it started
        with trio.fail_after(10):
            await server.process.wait()
    first, second = runs
    assert first.startswith("tools: execute, process_output,")
    assert "[call_3 @0] 20\n" in first  # streamed as it came
    blocks = first.split("--- ")[1:]
    assert [block.split("\n", 1)[0] for block in blocks] == [
        "call_1 write_file",
        "call_2 read_file",
        "call_3 execute",
        "call_4 read_file",
    ]
    assert blocks[1].startswith("call_2 read_file\noutcome: completed\nread 1 of 1 line")
    assert "outcome: completed, exit code 0\ncommand exited with code 0\n20\n" in blocks[2]
    assert "error (the model may retry): read_file: args.path: expected string" in blocks[3]
    # The same calls again: the saved results, the command did not run twice.
    assert second.split("--- ")[1:] == blocks
    assert (tmp_path / "ws" / "runs.log").read_text() == "ran\n"


async def test_the_pydantic_ai_example_resumes_after_its_chat_server_is_killed(
    tmp_path: Path,
) -> None:
    """The chat server of docs/integrations.md ("pydantic-ai"), killed with SIGKILL while its
    command runs, then started again on its saved history: the command ran once, and what the
    first one showed is not shown again."""
    history = tmp_path / "chat.json"
    env = {k: v for k, v in os.environ.items()} | {"TOOLWIRE_TOKEN": TOKEN, "PYTHONPATH": str(ROOT)}
    async with serve(tmp_path, env={"TOOLWIRE_TOKEN": TOKEN}) as server:
        argv = [sys.executable, str(ROOT / "examples" / "pydantic_ai_chat.py"), server.url,
                str(history)]  # fmt: skip
        first = await trio.lowlevel.open_process(argv, env=env, stdout=subprocess.PIPE)
        assert first.stdout is not None
        shown = b""
        with trio.fail_after(30):
            while b"step 1\n" not in shown:
                chunk = await first.stdout.receive_some()
                assert chunk, shown
                shown += chunk
        first.kill()  # the chat server dies mid-command
        await first.wait()
        (tmp_path / "ws" / "go").touch()  # the command goes on and ends meanwhile
        with trio.fail_after(30):
            second = await trio.run_process(argv, env=env, capture_stdout=True, check=False)
        server.process.send_signal(signal.SIGTERM)
        with trio.fail_after(10):
            await server.process.wait()
    assert shown == b"step 1\n"
    assert second.returncode == 0, second
    assert second.stdout.decode() == "step 2\nchecks done\n"  # nothing shown twice
    assert (tmp_path / "ws" / "runs.log").read_text() == "ran\n"  # ran once
    saved = json.loads(history.read_text())["messages"]
    returned = [p for m in saved for p in m["parts"] if p["part_kind"] == "tool-return"]
    assert [(p["tool_call_id"], p["outcome"]) for p in returned] == [
        ("call_1", "success"),
        ("call_2", "success"),
        ("call_3", "success"),
    ]
    assert returned[2]["content"].endswith("\nstep 1\nstep 2\n")
    assert returned[2]["metadata"]["toolwire"]["output"] == "step 1\nstep 2\n"


def test_the_docs_show_the_pydantic_ai_chat_server_as_the_example_has_it() -> None:
    """docs/integrations.md shows the example's chat server, and says how long it is."""
    docs = (ROOT / "docs" / "integrations.md").read_text()
    section = docs.split("\n## pydantic-ai\n", 1)[1]
    block = section.split("```python\n", 1)[1].split("```", 1)[0]
    assert block in (ROOT / "examples" / "pydantic_ai_chat.py").read_text()
    lines = len(block.splitlines())
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert lines < 30 and f"{lines} lines" in " ".join(section.split())
    assert f"a chat server in {lines} lines" in readme
