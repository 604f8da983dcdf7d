"""Known bugs, planted in test-only `ChatState` subclasses, to prove the checker can fail.

Each variant is handed to the real agent as `Agent(ctx, state_class=...)`: the agent and its
shells run unchanged, only the decisions differ; production always uses `ChatState` itself and
keeps no hook for these. `toolwire sim --plant NAME` (a hidden option) runs one of them, and
tests/test_simulation.py asserts that the simulator finds each one within a bounded number of
seeds.
"""

from __future__ import annotations

import msgspec

from toolwire.actors.chat_state import ChatState
from toolwire.actors.effects import (
    AttachRequest,
    CallRequest,
    CloseChatRequest,
    GroupEmpty,
    KillAfter,
    ProcessExited,
    TurnPlanned,
)
from toolwire.actors.records import RecordState, RecordTable, ToolCallRecord
from toolwire.actors.results import (
    TEXT_CANCELED_BEFORE_RUN,
    TEXT_CANCELED_WHILE_RUNNING,
    TEXT_SHUTDOWN,
    Outcome,
    Result,
)


def _forget(state: ChatState, call_id: str) -> None:
    """Drop one record as if it had never been, through RecordTable's public surface only: a
    new table holds the others, restored in their touch order (iteration order), as the
    journal's restore does. The planted bugs below that forget a saved result use it. (The new
    table counts what it restores in the agent's budget, as the old one counted its records:
    the old one's count goes with it.)"""
    if state.budget is not None:
        state.budget.records -= len(state.records)
    kept = RecordTable(state.budget)
    for record in state.records:
        if record.call_id != call_id:
            kept.restore(record)
    state.records = kept


class RepeatRunsAgain(ChatState):
    """A repeated `call` of a finished command forgets the saved result and runs it again."""

    def _on_call(self, req: CallRequest) -> None:
        record = self.records.get(req.spec.call_id)
        if (
            record is not None
            and record.done
            and record.tool == "execute"
            and record.outcome is Outcome.COMPLETED
        ):
            _forget(self, req.spec.call_id)
        super()._on_call(req)


class CancelSaysNotRun(ChatState):
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


class LostOutputChunk(ChatState):
    """An `attach` resumes one byte past the offset it asked for: that byte is never sent."""

    def _on_attach(self, req: AttachRequest) -> None:
        super()._on_attach(msgspec.structs.replace(req, from_offset=req.from_offset + 1))


class TurnMissingResult(ChatState):
    """A turn of several calls leaves its last call out of `turn_result`."""

    def _on_turn_planned(self, event: TurnPlanned) -> None:
        run = self.turns.get(event.turn_id)
        unplanned = run is not None and run.segments is None
        super()._on_turn_planned(event)
        if unplanned and run is not None and len(run.call_ids) > 1:
            run.call_ids = run.call_ids[:-1]


class WriteIgnoresExpected(ChatState):
    """`write_file` and `edit_files` drop `expected_sha256`: a write never checks what it
    replaces (as if the check did not guard the rename)."""

    def _on_call(self, req: CallRequest) -> None:
        spec = req.spec
        if spec.tool in ("write_file", "edit_files") and isinstance(spec.args, dict):
            args = {k: v for k, v in spec.args.items() if k != "expected_sha256"}
            if isinstance(args.get("files"), list):
                args["files"] = [
                    {k: v for k, v in entry.items() if k != "expected_sha256"}
                    if isinstance(entry, dict)
                    else entry
                    for entry in args["files"]
                ]
            req = msgspec.structs.replace(req, spec=msgspec.structs.replace(spec, args=args))
        super()._on_call(req)


class KillGroupAtLeaderExit(ChatState):
    """A cancel's SIGKILL follows as soon as the shell exits (the defect of issue 13): the other
    members of the group get no grace, so a child cleaning up after SIGTERM is killed midway."""

    def _on_process_exited(self, event: ProcessExited) -> None:
        super()._on_process_exited(event)
        self._kill_if_leader_gone(event.call_id)

    def _stop_group(self, call_id: str, *, unless_exited: bool, reason: str = "cancel") -> None:
        super()._stop_group(call_id, unless_exited=unless_exited, reason=reason)
        if not unless_exited and reason == "cancel":  # a leftover group (5.3's done row)
            self._kill_if_leader_gone(call_id)

    def _kill_if_leader_gone(self, call_id: str) -> None:
        group = self.groups.get(call_id)
        if group is not None and group.stopping == "term" and group.leader_exited:
            self._on_group_empty(GroupEmpty(call_id))


class InputRepeatWritesAgain(ChatState):
    """A repeated `call` of a finished `process_input` forgets the saved result and writes its
    data to the process again (the retry types twice)."""

    def _on_call(self, req: CallRequest) -> None:
        record = self.records.get(req.spec.call_id)
        if record is not None and record.done and record.tool == "process_input":
            _forget(self, req.spec.call_id)
        super()._on_call(req)


class KillAfterIgnored(ChatState):
    """`kill_after_ms` is read but its deadline never stops anything."""

    def _on_kill_after(self, event: KillAfter) -> None:
        group = self.groups.get(event.call_id)
        if group is not None:
            group.kill_after_ms = None


class ShutdownSaysCanceled(ChatState):
    """The calls a shutdown stops are saved with the plain cancel text, not the shutdown's."""

    def _finish(self, record: ToolCallRecord, result: Result) -> None:
        if result.text == TEXT_SHUTDOWN:
            result = msgspec.structs.replace(result, text=TEXT_CANCELED_WHILE_RUNNING)
        super()._finish(record, result)


class CloseLeavesGroups(ChatState):
    """`close_chat` ends the chat's unresolved calls but leaves the process groups of calls
    that already returned (background and timed-out commands) running."""

    _closing = False

    def _on_close_chat(self, req: CloseChatRequest) -> None:
        self._closing = True
        try:
            super()._on_close_chat(req)
        finally:
            self._closing = False

    def _stop_every_group(self) -> list[str]:
        if not self._closing:
            return super()._stop_every_group()
        return []


PLANTED: dict[str, type[ChatState]] = {
    "repeat-runs-again": RepeatRunsAgain,
    "cancel-says-not-run": CancelSaysNotRun,
    "lost-output-chunk": LostOutputChunk,
    "turn-missing-result": TurnMissingResult,
    "write-ignores-expected": WriteIgnoresExpected,
    "kill-group-at-leader-exit": KillGroupAtLeaderExit,
    "input-repeat-writes-again": InputRepeatWritesAgain,
    "kill-after-ignored": KillAfterIgnored,
    "shutdown-says-canceled": ShutdownSaysCanceled,
    "close-leaves-groups": CloseLeavesGroups,
}
