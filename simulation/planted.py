"""Known bugs, planted in test-only `ChatActor` subclasses, to prove the checker can fail.

Each variant is passed to the real agent as `Agent(ctx, chat_class=...)`; production always uses
`ChatActor` itself. `toolwire sim --plant NAME` (a hidden option) runs one of them, and
tests/test_simulation.py asserts that the simulator finds each one within a bounded number of
seeds.
"""

from __future__ import annotations

import signal
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any

import trio

from toolwire.actors import execute_calls, processes
from toolwire.actors.chat import CallSpec, ChatActor, TurnRun
from toolwire.actors.outbox import Outbox
from toolwire.actors.records import RecordState, ToolCallRecord
from toolwire.actors.results import TEXT_CANCELED_BEFORE_RUN, Outcome


class RepeatRunsAgain(ChatActor):
    """A repeated `call` of a finished command forgets the saved result and runs it again."""

    def call(self, outbox: Outbox, spec: CallSpec, *, stream: bool, rid: Any) -> None:
        record = self.records.get(spec.call_id)
        if (
            record is not None
            and record.done
            and record.tool == "execute"
            and record.outcome is Outcome.COMPLETED
        ):
            self.records._records.pop(spec.call_id, None)
        super().call(outbox, spec, stream=stream, rid=rid)


class CancelSaysNotRun(ChatActor):
    """A cancel of a running command reports `not_run` although the command ran."""

    def _cancel_one(self, call_id: str) -> tuple[bool, ToolCallRecord]:
        record = self.records.get(call_id)
        running = (
            record is not None and record.state is RecordState.RUNNING and record.tool == "execute"
        )
        received, record = super()._cancel_one(call_id)
        if running and not record.done:
            self._finish(
                record, self._plain_result(record, Outcome.NOT_RUN, TEXT_CANCELED_BEFORE_RUN)
            )
        return received, record


class LostOutputChunk(ChatActor):
    """Every third output arrival moves the followers' cursors past it: a chunk is never sent."""

    _arrivals = 0

    def _output_arrived(self, record: ToolCallRecord) -> None:
        self._arrivals += 1
        runtime = self._runtime(record)
        if self._arrivals % 3 == 0 and runtime.process is not None:
            for sub in runtime.subs.values():
                sub.cursor = max(sub.cursor, runtime.process.output.total)
        super()._output_arrived(record)


class TurnMissingResult(ChatActor):
    """A turn of several calls leaves its last call out of `turn_result`."""

    async def _run_turn(self, run: TurnRun) -> None:
        if len(run.call_ids) > 1:
            run.call_ids = run.call_ids[:-1]
        await super()._run_turn(run)


class WriteIgnoresExpected(ChatActor):
    """`write_file` and `edit_files` drop `expected_sha256`: a write never checks what it
    replaces (as if the check did not guard the rename)."""

    def call(self, outbox: Outbox, spec: CallSpec, *, stream: bool, rid: Any) -> None:
        if spec.tool in ("write_file", "edit_files") and isinstance(spec.args, dict):
            args = {k: v for k, v in spec.args.items() if k != "expected_sha256"}
            if isinstance(args.get("files"), list):
                args["files"] = [
                    {k: v for k, v in entry.items() if k != "expected_sha256"}
                    if isinstance(entry, dict)
                    else entry
                    for entry in args["files"]
                ]
            spec = replace(spec, args=args)
        super().call(outbox, spec, stream=stream, rid=rid)


class KillGroupAtLeaderExit(ChatActor):
    """A cancel's SIGKILL follows as soon as the shell exits (the defect of issue 13): the other
    members of the group get no grace, so a child cleaning up after SIGTERM is killed midway."""

    def _spawn(self, fn: Callable[..., Awaitable[None]], *args: Any) -> None:
        if fn is execute_calls.terminate:
            fn = _terminate_at_leader_exit
        super()._spawn(fn, *args)


async def _terminate_at_leader_exit(chat: ChatActor, proc: processes.ProcessRecord) -> None:
    if proc.running:
        proc.handle.signal_group(signal.SIGTERM)
        with trio.move_on_after(chat.ctx.kill_grace_s):
            await proc.exited.wait()
    proc.handle.signal_group(signal.SIGKILL)
    await proc.exited.wait()
    proc.stopped.set()


PLANTED: dict[str, type[ChatActor]] = {
    "repeat-runs-again": RepeatRunsAgain,
    "cancel-says-not-run": CancelSaysNotRun,
    "lost-output-chunk": LostOutputChunk,
    "turn-missing-result": TurnMissingResult,
    "write-ignores-expected": WriteIgnoresExpected,
    "kill-group-at-leader-exit": KillGroupAtLeaderExit,
}
