"""`ToolExecutor.execute` on both client shells against a real agent: each trap of issue 30 that
chat-server glue fell into has a test here that fails without the executor's rule for it."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest
import trio

from tests.clientshells import SHELLS, Shell
from tests.conftest import LiveServer
from tests.executor_support import HoldingRelay, ShownOutput, cancel_when, new_flag
from toolwire import (
    ApprovalDecision,
    BadArgs,
    CallConflict,
    ModelToolCall,
    OutputChunk,
    RequestError,
    ToolExecutor,
    UnknownTool,
    tool_call_id,
)
from toolwire.transport import protocol

CHAT = "22222222-2222-2222-2222-222222222222"
DENIED_NOT_NOW = "tool call was denied: not now; no changes were made"
# Counts its runs in `marker`, prints ten bytes, then waits for a line on its stdin: the test
# decides when it ends (process_input), and the fixture's shutdown stops it if a test fails.
HELD = {
    "command": "echo x >> marker; printf 0123456789; read x; printf done",
    "stdin": True,
}


@pytest.fixture(params=sorted(SHELLS))
def shell(request: pytest.FixtureRequest) -> Shell:
    return SHELLS[request.param]()


@pytest.fixture
async def relay(nursery: trio.Nursery, live: LiveServer) -> HoldingRelay:
    holding = HoldingRelay(int(live.url.rsplit(":", 1)[1].split("/")[0]))
    await nursery.start(holding.serve)
    return holding


def model_call(provider_id: str, tool: str, args: Any, message: str = "m1") -> ModelToolCall:
    return ModelToolCall(CHAT, message, provider_id, tool, args)


async def release(client: Any, call: ModelToolCall) -> None:
    args = {"process_id": call.call_id, "data": "\n"}
    handle = await client.call(CHAT, f"release-{call.call_id}", "process_input", args)
    assert (await handle.result()).outcome == "completed"


def runs(live: LiveServer) -> int:
    marker = live.workspace / "marker"
    return len(marker.read_text().splitlines()) if marker.exists() else 0


async def test_one_call_one_result_with_its_output_in_offsets(
    shell: Shell, live: LiveServer
) -> None:
    call = model_call("call_1", "execute", json.dumps({"command": "printf ab; printf cd"}))

    async def body() -> None:
        chunks: list[OutputChunk] = []
        async with shell.connect(live.url, live.token) as client:
            result = await ToolExecutor(client).execute(call, on_output=chunks.append)
        assert call.call_id == tool_call_id(CHAT, "m1", "call_1")
        assert (result.outcome, result.output) == ("completed", "abcd")
        at = 0
        for chunk in chunks:
            assert chunk.call is call and chunk.offset == at
            at = chunk.end
        assert "".join(c.data for c in chunks) == "abcd" and at == 4
        # Another replica, the same model call: the saved result, nothing run again.
        async with shell.connect(live.url, live.token) as other:
            again = await ToolExecutor(other).execute(call)
        assert msgspec.json.encode(again) == msgspec.json.encode(result)

    await shell.run(body)


async def test_what_a_model_can_fix_raises_a_typed_error_and_runs_nothing(
    shell: Shell, live: LiveServer
) -> None:
    async def body() -> None:
        async with shell.connect(live.url, live.token) as client:
            executor = ToolExecutor(client)
            with pytest.raises(BadArgs) as wrong_type:
                await executor.execute(model_call("a", "execute", {"command": 1}))
            with pytest.raises(BadArgs):
                await executor.execute(model_call("b", "execute", '{"command": "echo x >> m'))
            with pytest.raises(UnknownTool):
                await executor.execute(model_call("c", "run_shell", {"command": "echo x >> m"}))
            args = {"command": "echo x >> marker"}
            await executor.execute(model_call("d", "execute", args))
            with pytest.raises(CallConflict) as conflict:
                await executor.execute(model_call("d", "execute", {"command": "echo y"}))
        assert wrong_type.value.code == "bad_args" and "command" in wrong_type.value.message
        assert isinstance(conflict.value, RequestError) and conflict.value.code == "conflict"
        assert not (live.workspace / "m").exists() and runs(live) == 1

    await shell.run(body)


async def test_a_restarted_chat_server_resumes_from_its_saved_offset(
    shell: Shell, live: LiveServer
) -> None:
    """The trap: the resumed run re-sent its `call` and showed the output again from 0."""
    call = model_call("call_resume", "execute", HELD)

    async def body() -> None:
        shown = ShownOutput(shell, until="9")
        async with shell.connect(live.url, live.token) as before:
            # The old server shuts down mid-command: "detach" leaves the command running.
            executor = ToolExecutor(before, on_cancel="detach")
            ended = await cancel_when(
                shell, lambda: executor.execute(call, on_output=shown), shown.seen.wait
            )
            assert ended.cancelled
            saved = shown.chunks[-1].end
            assert (saved, "".join(c.data for c in shown.chunks)) == (10, "0123456789")
            # It goes on, and ends while no chat server follows it.
            await release(before, call)
        async with shell.connect(live.url, live.token) as after:
            rest: list[OutputChunk] = []
            result = await ToolExecutor(after).execute(
                call, on_output=rest.append, from_offset=saved
            )
        assert [(c.offset, c.data) for c in rest] == [(10, "done")]  # nothing twice
        assert result.output == "0123456789done" and runs(live) == 1

    await shell.run(body)


async def test_detach_leaves_the_call_running_also_before_accepted(
    shell: Shell, live: LiveServer, relay: HoldingRelay
) -> None:
    """The server shuts down (on_cancel="detach") while the call's `accepted` is on its way:
    the command goes on, and the next server's retry gets its real result."""
    call = model_call("call_detach", "execute", HELD)

    async def body() -> None:
        async with shell.connect(relay.url(), live.token) as client:
            await shell.on_trio(relay.hold)
            executor = ToolExecutor(client, on_cancel="detach")
            ended = await cancel_when(
                shell,
                lambda: executor.execute(call),
                lambda: shell.on_trio(relay.wait_upstream),
                lambda: shell.on_trio(relay.release),
            )
            assert ended.cancelled
            assert client.handle(CHAT, call.call_id) is None  # nothing left to follow
        async with shell.connect(live.url, live.token) as other:
            await release(other, call)
            result = await ToolExecutor(other).execute(call)
        assert (result.outcome, result.output) == ("completed", "0123456789done")
        assert runs(live) == 1

    await shell.run(body)


async def test_cancel_stops_the_call_on_the_agent_also_before_accepted(
    shell: Shell, live: LiveServer, relay: HoldingRelay
) -> None:
    """The trap: a cancellation that lands between the `call` going out and its `accepted`
    coming back left the command running (the user pressed stop; on_cancel="cancel")."""
    call = model_call("call_cancel", "execute", HELD)

    async def body() -> None:
        async with shell.connect(relay.url(), live.token) as client:
            await shell.on_trio(relay.hold)
            executor = ToolExecutor(client, on_cancel="cancel")
            ended = await cancel_when(
                shell,
                lambda: executor.execute(call),
                lambda: shell.on_trio(relay.wait_upstream),
                # The cancel the executor sends waits for its `cancel_result`.
                lambda: shell.on_trio(relay.release),
            )
            assert ended.cancelled
        async with shell.connect(live.url, live.token) as other:
            handle = await other.call(CHAT, call.call_id, "execute", HELD)
            assert handle.accepted.state == "done"  # not left running
            result = await handle.result()
        assert result.outcome in ("canceled", "not_run"), result

    await shell.run(body)


async def test_an_approval_card_is_closed_when_the_gate_closes_elsewhere(
    shell: Shell, live: LiveServer
) -> None:
    """The trap: a card awaited inside the event loop hung the run when an interrupt closed
    the gate. The callback runs as a task and is cancelled on `approval_resolved`."""
    call = model_call("call_gate", "execute", {"command": "echo x >> marker"})

    async def body() -> None:
        closed: list[str] = []
        async with (
            shell.connect(live.url, live.token) as client,
            shell.connect(live.url, live.token) as other,
        ):
            never = new_flag(shell)

            async def card(gated: ModelToolCall, approval: protocol.Approval) -> bool:
                assert (gated, approval.call_id) == (call, call.call_id)
                try:
                    await other.interrupt(CHAT)  # the user pressed stop meanwhile
                    await never.wait()  # the card is never answered
                finally:
                    closed.append("closed")
                return True

            executor = ToolExecutor(client, approval=True, on_approval=card)
            async with shell.fail_after(10):
                result = await executor.execute(call)
        assert result.outcome == "not_run" and closed == ["closed"]
        assert runs(live) == 0

    await shell.run(body)


async def test_approval_answers_and_a_gate_answered_elsewhere(
    shell: Shell, live: LiveServer
) -> None:
    async def body() -> None:
        async with (
            shell.connect(live.url, live.token) as client,
            shell.connect(live.url, live.token) as other,
        ):

            async def card(call: ModelToolCall, approval: protocol.Approval) -> Any:
                if call.provider_call_id == "yes":
                    return True
                if call.provider_call_id == "no":
                    return ApprovalDecision(False, "not now")
                # Another replica answers first: our answer is `not_parked`, not an error.
                await other.approve(CHAT, call.call_id, True)
                return True

            executor = ToolExecutor(client, approval={"execute"}, on_approval=card)
            args = {"command": "echo x >> marker"}
            yes = await executor.execute(model_call("yes", "execute", args))
            no = await executor.execute(model_call("no", "execute", args))
            late = await executor.execute(model_call("late", "execute", args))
            (live.workspace / "f").write_text("ungated\n")
            read = await executor.execute(model_call("read", "read_file", {"path": "f"}))
        assert (yes.outcome, late.outcome, read.outcome) == ("completed",) * 3
        assert (no.outcome, no.text) == ("denied", DENIED_NOT_NOW)
        assert runs(live) == 2

    await shell.run(body)


async def test_results_round_trip_through_plain_json(live: LiveServer) -> None:
    """A framework's history holds plain JSON (a msgspec Struct made pydantic fail)."""
    async with shell_client(live) as client:
        result = await ToolExecutor(client).execute(model_call("j", "execute", {"command": "id"}))
    text = json.dumps(result.to_dict())
    back = protocol.Result.from_dict(json.loads(text))
    assert back == result and msgspec.json.encode(back) == msgspec.json.encode(result)


def shell_client(live: LiveServer) -> Any:
    from toolwire import connect

    return connect(live.url, live.token)


def test_a_model_call_needs_a_provider_id() -> None:
    with pytest.raises(ValueError, match="provider_call_id"):
        ModelToolCall(CHAT, "m1", "", "execute", {})
