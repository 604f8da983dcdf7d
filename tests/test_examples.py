"""The runnable example of docs/integrations.md, run as a user runs it against a real
`toolwire serve`, twice: the second run gets the saved results and runs nothing again."""

from __future__ import annotations

import os
import signal
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
