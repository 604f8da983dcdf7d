"""`render_result`: the one text a model is given for a Result (RENDERING.md), checked on the
shared vectors that the TypeScript client's tests read too, and on a real agent's results."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import trio

from tests.conftest import LiveServer
from toolwire import ModelToolCall, ToolExecutor, connect, render_result
from toolwire.transport.protocol import Result

VECTORS = json.loads((Path(__file__).parent / "vectors" / "rendering.json").read_text())
CASES = VECTORS["cases"]


@pytest.mark.parametrize("case", CASES, ids=[case["name"] for case in CASES])
def test_every_vector_renders_as_written(case: dict[str, object]) -> None:
    result = Result.from_dict(case["result"])  # type: ignore[arg-type]
    assert render_result(result) == case["rendered"]


def test_the_vectors_cover_every_outcome_and_every_rule() -> None:
    outcomes = {case["result"]["outcome"] for case in CASES}
    assert outcomes == {
        "completed",
        "failed",
        "timed_out",
        "canceled",
        "not_run",
        "denied",
        "unknown",
    }
    rendered = [case["rendered"] for case in CASES]
    for part in (
        ", exit code ",
        ", signal ",
        ", timed out",
        ", canceled",
        " output bytes omitted)",
    ):
        assert any(part in text for text in rendered), part


async def test_a_real_commands_result_renders_its_outcome_text_and_output(
    live: LiveServer,
) -> None:
    calls = [
        ModelToolCall("c", "m", "1", "execute", {"command": "echo hi"}),
        ModelToolCall("c", "m", "2", "execute", {"command": "echo err; exit 3"}),
    ]
    with trio.fail_after(20):
        async with connect(live.url, live.token) as client:
            executor = ToolExecutor(client)
            texts = [render_result(await executor.execute(call)) for call in calls]
    assert texts == [
        "outcome: completed, exit code 0\ncommand exited with code 0\nhi\n",
        "outcome: completed, exit code 3\ncommand exited with code 3\nerr\n",
    ]
