"""`ToolExecutor.run_batch`: the calls of one model response as one `turn` (issue 30, item 3),
on both client shells against a real agent."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from tests.clientshells import SHELLS, Shell
from tests.conftest import LiveServer
from tests.executor_support import ShownOutput, cancel_when
from toolwire import BadArgs, BatchItem, ModelToolCall, OutputChunk, ToolExecutor, UnknownTool

CHAT = "33333333-3333-3333-3333-333333333333"
HELD = {
    "command": "echo x >> marker; printf 0123456789; read x; printf done",
    "stdin": True,
}


@pytest.fixture(params=sorted(SHELLS))
def shell(request: pytest.FixtureRequest) -> Shell:
    return SHELLS[request.param]()


def call(provider_id: str, tool: str, args: Any, message: str = "m1") -> ModelToolCall:
    return ModelToolCall(CHAT, message, provider_id, tool, args)


def runs(live: LiveServer) -> int:
    marker = live.workspace / "marker"
    return len(marker.read_text().splitlines()) if marker.exists() else 0


async def test_read_write_read_of_one_file_in_one_response_is_ordered(
    shell: Shell, live: LiveServer
) -> None:
    """The trap: each call dispatched on its own gave the second read the stale content."""
    (live.workspace / "race.txt").write_text("old\n")
    calls = [
        call("r1", "read_file", {"path": "race.txt"}),
        call("w", "write_file", {"path": "race.txt", "content": "new\n"}),
        call("r2", "read_file", {"path": "race.txt"}),
    ]

    async def body() -> None:
        async with shell.connect(live.url, live.token) as client:
            async with ToolExecutor(client).run_batch(calls) as batch:
                items = await batch.results()
            assert batch.turn is not None
            segments = await batch.turn.plan()
        assert [item.call for item in items] == calls
        contents = [item.unwrap().data for item in items]
        assert contents[0] is not None and contents[0]["content"] == "old\n"
        assert contents[2] is not None and contents[2]["content"] == "new\n"
        assert segments == [[calls[0].call_id], [calls[1].call_id], [calls[2].call_id]]

    await shell.run(body)


async def test_parallel_same_name_calls_each_run_once(shell: Shell, live: LiveServer) -> None:
    calls = [
        call(f"call_{i}", "execute", {"command": f"echo {i}; echo x >> marker"}) for i in range(3)
    ]

    async def body() -> None:
        async with shell.connect(live.url, live.token) as client:
            executor = ToolExecutor(client)
            items = await executor.execute_batch(calls)
            again = await executor.execute_batch(calls)  # a retry of the same response
        assert [item.unwrap().output for item in items] == ["0\n", "1\n", "2\n"]
        assert [item.unwrap() for item in again] == [item.unwrap() for item in items]
        assert runs(live) == 3

    await shell.run(body)


async def test_each_result_comes_as_it_ends_and_all_in_request_order(
    shell: Shell, live: LiveServer
) -> None:
    (live.workspace / "f").write_text("f\n")

    async def body() -> None:
        arrivals: list[BatchItem] = []
        async with shell.connect(live.url, live.token) as client:
            # A background command the first call waits for: two readers, one segment.
            await client.call(CHAT, "bg", "execute", HELD, background=True)
            waiting = call("wait", "process_output", {"process_id": "bg", "wait": True})
            quick = call("quick", "read_file", {"path": "f"})
            async with ToolExecutor(client).run_batch([waiting, quick]) as batch:
                async for item in batch:
                    arrivals.append(item)
                    if item.call is quick:  # `waiting` still waits: end the command
                        args = {"process_id": "bg", "data": "\n"}
                        await client.call(CHAT, "let-go", "process_input", args)
            items = await batch.results()
        assert [item.call for item in arrivals] == [quick, waiting]
        assert [item.call for item in items] == [waiting, quick]
        assert items[0].unwrap().output == "0123456789done"

    await shell.run(body)


async def test_calls_a_model_can_fix_are_refused_the_others_run(
    shell: Shell, live: LiveServer
) -> None:
    calls = [
        call("bad", "execute", {"command": 1}),
        call("unknown", "run_shell", {"command": "echo x >> marker"}),
        call("ok", "execute", {"command": "echo x >> marker"}),
        call("extra", "read_file", {"path": "f", "ofset": 1}),
    ]

    async def body() -> None:
        async with shell.connect(live.url, live.token) as client:
            items = await ToolExecutor(client).execute_batch(calls)
        assert isinstance(items[0].error, BadArgs) and "args.command" in items[0].error.message
        assert isinstance(items[1].error, UnknownTool)
        assert items[2].unwrap().outcome == "completed"
        assert isinstance(items[3].error, BadArgs) and "ofset" in items[3].error.message
        assert runs(live) == 1

    await shell.run(body)


async def test_a_batch_refuses_one_provider_id_twice(live: LiveServer) -> None:
    from toolwire import connect

    with trio.fail_after(10):
        async with connect(live.url, live.token) as client:
            twice = [call("same", "execute", {"command": "true"})] * 2
            with pytest.raises(ValueError, match="twice"):
                await ToolExecutor(client).execute_batch(twice)


async def test_a_cancelled_batch_cancels_its_calls_and_a_resumed_one_shows_nothing_twice(
    shell: Shell, live: LiveServer
) -> None:
    held = call("held", "execute", HELD)
    stopped = call(
        "stopped", "execute", {"command": "echo x >> marker; echo up; read x", "stdin": True}
    )

    async def body() -> None:
        shown = ShownOutput(shell, until="9")
        async with shell.connect(live.url, live.token) as client:
            # The server shuts down mid-batch: its calls go on.
            detaching = ToolExecutor(client, on_cancel="detach")
            ended = await cancel_when(
                shell, lambda: detaching.execute_batch([held], on_output=shown), shown.seen.wait
            )
            assert ended.cancelled
            # The user presses stop on another batch: its calls are canceled on the agent.
            up = ShownOutput(shell)
            canceling = ToolExecutor(client, on_cancel="cancel")
            ended = await cancel_when(
                shell, lambda: canceling.execute_batch([stopped], on_output=up), up.seen.wait
            )
            assert ended.cancelled
        async with shell.connect(live.url, live.token) as after:
            args = {"process_id": held.call_id, "data": "\n"}
            await after.call(CHAT, "let-go", "process_input", args)
            rest: list[OutputChunk] = []
            executor = ToolExecutor(after)
            resume_at = {held.call_id: shown.chunks[-1].end}
            items = await executor.execute_batch(
                [held, stopped], from_offsets=resume_at, on_output=rest.append
            )
        seen = "".join(c.data for c in shown.chunks)
        assert seen + "".join(c.data for c in rest if c.call is held) == "0123456789done"
        assert items[0].unwrap().outcome == "completed"
        assert items[1].unwrap().outcome == "canceled"
        assert runs(live) == 2

    await shell.run(body)
