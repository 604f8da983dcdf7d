#!/usr/bin/env python3
"""Break each rule of docs/architecture.md's "Where each rule lives" on purpose, one at a time,
and check that the pure tests notice (issue 28: a rule the tests cannot see is not protected).

For every row of that table this holds one mutation: a textual replacement in the source
(exactly one match, or the row is stale). It applies it, runs tests/test_chat_state.py (for a
rule of the shell's, the live test file the row names), and restores the source, whatever
happens. A mutation passes when the file fails, the test the
row names is among the failures, and one of the row's invariant codes (`b.cursor_skips`, ...)
is in the output; it "survives" when the file passes. The rows here and the table's rows must
be the same (matched by the table's first column), so neither can drift from the other.

Usage: .ci/mutations.py [PYTHON] [--only TEXT] [--examples N]
PYTHON runs pytest (default: .venv/bin/python, else python3); `--only` keeps the rows whose
rule contains TEXT; `--examples` is the state machine's example count (its default: 400).
Exit status 0 when every mutation fails as documented, 1 otherwise. Takes some minutes.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "architecture.md"
TEST_FILE = "tests/test_chat_state.py"
KEEPER_FILE = "tests/test_chat_state_keeper.py"
SPAWNING_FILE = "tests/test_chat_state_spawning.py"
# The answer-only follow against the general one, through the real Followers and Outbox.
ANSWER_FILE = "tests/test_answer_follow.py"
MACHINE = "TestChatStateMachine"


@dataclass(frozen=True)
class Mutation:
    rule: str  # the table's first column, exactly
    path: str  # the file mutated, from the root
    old: str  # the text replaced (must occur exactly once)
    new: str
    test: str  # the test the table says fails (a test id's tail, or the machine)
    codes: tuple[str, ...]  # the invariant codes the table names; one of them must show
    test_file: str = TEST_FILE  # where that test is (the shell's rows: a live test)


CHAT_STATE = "actors/chat_state.py"

MUTATIONS = [
    Mutation(
        "9.9 cursor: a repeat moves the cursor only back while an earlier request on the "
        "connection owes output",
        CHAT_STATE,
        "        rewind_only = (\n"
        "            before is not None and before.stream and not before.detached"
        " and before.owed > 0\n"
        "        )\n",
        "        rewind_only = False\n",
        MACHINE,
        ("b.cursor_skips",),
    ),
    Mutation(
        "same, the other way: with nothing owed the cursor goes where the request asks",
        CHAT_STATE,
        "        rewind_only = (\n"
        "            before is not None and before.stream and not before.detached"
        " and before.owed > 0\n"
        "        )\n",
        "        rewind_only = True\n",
        MACHINE,
        ("b.cursor_skips",),
    ),
    Mutation(
        "how a connection streams: any request since its last detach that streams",
        CHAT_STATE,
        "follower.stream = follower.stream or stream\n",
        "follower.stream = stream\n",
        MACHINE,
        ("b.stream_decided",),
    ),
    Mutation(
        "a detach ends what the connection streamed (a `stream: false` repeat then brings no "
        "`started`)",
        CHAT_STATE,
        "follower.stream = follower.resolved_events = False\n",
        "follower.resolved_events = False\n",
        "test_a_stream_false_call_sent_again_after_a_detach_brings_no_started",
        ("b.stream_decided",),
    ),
    Mutation(
        "a detach keeps the follow exactly while a request on it waits for the live result",
        CHAT_STATE,
        "self._out.append(Detach(conn, call_id, keep))\n",
        "self._out.append(Detach(conn, call_id, False))\n",
        MACHINE,
        ("b.detach_keep",),
    ),
    Mutation(
        "5.2 shrink: an ended command's retention shrinks to the result's size",
        CHAT_STATE,
        "        self._out.append(ShrinkOutput(event.call_id))\n",
        "        pass\n",
        MACHINE,
        ("p.output_kept",),
    ),
    Mutation(
        "same: never while something could still print",
        CHAT_STATE,
        "    def _on_process_exited(self, event: ProcessExited) -> None:\n",
        "    def _on_process_exited(self, event: ProcessExited) -> None:\n"
        "        self._out.append(ShrinkOutput(event.call_id))\n",
        MACHINE,
        ("p.shrunk_early",),
    ),
    Mutation(
        "5.2 listing: an exited command leaves `process_list` `exited_retention_s` after its exit",
        CHAT_STATE,
        "            self._out.append(DropProcess(call_id))\n",
        "            pass\n",
        MACHINE,
        ("p.listed_too_long",),
    ),
    Mutation(
        "same: not before",
        CHAT_STATE,
        "keep_until = self._now - self.config.exited_retention_s\n",
        "keep_until = self._now\n",
        MACHINE,
        ("p.dropped_early",),
    ),
    Mutation(
        "5.3 a stop a client asked for makes the listing say `canceled`",
        CHAT_STATE,
        '                canceled=reason == "cancel",\n',
        "                canceled=False,\n",
        MACHINE,
        ("p.stop_flags",),
    ),
    Mutation(
        "9.2 the hard deadline's stop makes it say `timed_out`",
        CHAT_STATE,
        '                timed_out=reason == "kill_after",\n',
        "                timed_out=False,\n",
        MACHINE,
        ("p.stop_flags",),
    ),
    Mutation(
        "9.3, 9.6 what lingers of a spent group is stopped only if a member is alive",
        CHAT_STATE,
        'only_if_alive=reason != "cancel",\n',
        'only_if_alive=reason == "kill_after",\n',
        "test_a_stop_does_not_wait_for_the_hard_deadline_of_a_command_that_ended[close_chat]",
        ("p.stop_flags",),
    ),
    Mutation(
        "a group step that fails in the shell: the call ends `unknown`, the group gets SIGKILL",
        CHAT_STATE,
        "    def _on_group_lost(self, event: GroupLost) -> None:\n",
        "    def _on_group_lost(self, event: GroupLost) -> None:\n        return\n",
        "test_a_group_step_that_fails_at_once_lets_the_shutdown_finish",
        ("k.lost_call_running", "k.lost_group_not_killed"),
    ),
    Mutation(
        "same: a SIGKILL that fails too gives the group up, so nothing waits for it forever",
        CHAT_STATE,
        "            return\n        del self.groups[event.call_id]\n",
        "            return\n        return\n        del self.groups[event.call_id]\n",
        MACHINE,
        ("k.lost_group_held",),
    ),
    Mutation(
        "the shell reports a group step that fails at once as `GroupLost` (not as the call's "
        "`ToolFailed`, which a call already ended ignores)",
        "actors/chat.py",
        "self._inbox.append(fx.GroupLost(call_id))\n",
        "self._inbox.append(fx.ToolFailed(call_id))\n",
        "test_a_group_the_shell_cannot_look_at_is_killed_and_the_shutdown_ends",
        (),
        "tests/test_group_lost.py",
    ),
    Mutation(
        "9.6 a durable close survives a restart while the chat has records",
        CHAT_STATE,
        "        if event.closed:\n            self.closed = True\n",
        "        if False:\n            self.closed = True\n",
        MACHINE,
        ("x.close_not_restored",),
    ),
    Mutation(
        "9.5, 9.6 a chat with no record left drops its close and approval rows",
        CHAT_STATE,
        "        if not self.records:\n"
        "            if event.approved_tools and self.config.journal_enabled:\n"
        "                self._out.append(JournalForgetApprovals())\n"
        "            if event.closed:\n"
        "                self._out.append(JournalReopen())\n"
        "            return\n",
        "        if not self.records:\n            return\n",
        MACHINE,
        ("x.stale_rows",),
    ),
    Mutation(
        "same: nothing of them is restored onto a chat without records",
        CHAT_STATE,
        "                self._out.append(JournalReopen())\n            return\n",
        "                self._out.append(JournalReopen())\n",
        MACHINE,
        ("x.close_not_restored",),
    ),
    Mutation(
        "9.5 a chat-scope approval survives a restart while the chat has records",
        CHAT_STATE,
        "        for tool in event.approved_tools:\n",
        "        for tool in ():\n",
        "test_a_chat_scope_approval_survives_a_restart_while_the_chat_has_records",
        ("x.approvals_not_restored",),
    ),
    Mutation(
        "10.1 a restored running call whose process the keeper holds is re-adopted, not ended",
        CHAT_STATE,
        "            if kept is not None and kept.held and self._readopt(record, call, kept):\n",
        "            if False:\n",
        "test_a_held_command_is_adopted_and_its_hard_deadline_counts_from_its_first_start",
        (),
        KEEPER_FILE,
    ),
    Mutation(
        "10.1, 9.2 a re-adopted process's `kill_after_ms` counts from the FIRST start (one "
        "passed during the downtime fires at once)",
        CHAT_STATE,
        "kill_at = self._now + parsed.kill_after_ms / 1000 - since_start_s\n",
        "kill_at = self._now + parsed.kill_after_ms / 1000\n",
        "test_a_held_command_is_adopted_and_its_hard_deadline_counts_from_its_first_start",
        (),
        KEEPER_FILE,
    ),
    Mutation(
        "10.1 a process gone unrecorded ends its call `unknown` with the output recorded up to "
        "then",
        CHAT_STATE,
        "                    self._execute_result(\n"
        "                        record, kept.snapshot, Outcome.UNKNOWN, "
        "text=TEXT_AGENT_RESTARTED\n"
        "                    ),\n",
        "                    self._plain_result(record, Outcome.UNKNOWN, TEXT_AGENT_RESTARTED),\n",
        "test_a_command_gone_unrecorded_ends_unknown_with_the_output_recorded_up_to_then",
        (),
        KEEPER_FILE,
    ),
    Mutation(
        "10.1 a background or timed-out process whose call returned is re-adopted and listed",
        CHAT_STATE,
        "if kept is not None and not (kept.held and self._readopt(record, None, kept)):\n",
        "if kept is not None:\n",
        "test_a_background_command_whose_call_returned_is_adopted_and_listed",
        (),
        KEEPER_FILE,
    ),
    Mutation(
        "10.1 a restored process that is not re-adopted (gone unrecorded, or its record cannot "
        "take it back) is stopped and its file dropped, never left running unseen",
        CHAT_STATE,
        "                self._out.append(ReleaseKept(record.call_id))\n"
        "                # Gone without a recorded exit",
        "                pass\n                # Gone without a recorded exit",
        "test_a_held_command_whose_record_cannot_take_it_back_is_released_not_left_running",
        (),
        KEEPER_FILE,
    ),
    Mutation(
        "10.1 a keeper killed under a live agent ends the call `unknown` with its output",
        CHAT_STATE,
        'output read up to then; for the rest it counts as exited."""\n'
        "        record = self.records.get(event.call_id)\n"
        "        if record is not None and record.state is RecordState.RUNNING:\n",
        'output read up to then; for the rest it counts as exited."""\n'
        "        record = self.records.get(event.call_id)\n"
        "        if False:\n",
        "test_a_keeper_killed_under_a_live_agent_ends_the_call_unknown_with_its_output",
        (),
        KEEPER_FILE,
    ),
    Mutation(
        "no filesystem call in `ChatState.handle` (the turn planner)",
        CHAT_STATE,
        "        run.segments = planner.plan_segments(run.call_ids, reservations)\n",
        '        __import__("os").path.realpath(".")\n'
        "        run.segments = planner.plan_segments(run.call_ids, reservations)\n",
        "test_planning_a_turn_makes_no_filesystem_call",
        (),
    ),
    Mutation(
        "a turn's calls start only once its paths are resolved; nothing of the turn is sent "
        "before its plan",
        CHAT_STATE,
        "        self._out.append(ResolveTurn(req.turn_id, req.specs))\n",
        "        self._out.append(ResolveTurn(req.turn_id, req.specs))\n"
        "        self._on_turn_planned(\n"
        "            TurnPlanned(req.turn_id, (planner.BARRIER_RESERVATION,) * len(call_ids))\n"
        "        )\n",
        MACHINE,
        ("d.plan_before_resolved",),
    ),
    Mutation(
        "a stop asked while a command is being spawned stops it when the keeper answers",
        CHAT_STATE,
        "        if record.cancel_requested:\n            # Canceled while it was being spawned",
        "        if False:\n            # Canceled while it was being spawned",
        "test_a_stop_while_the_command_is_spawned_stops_it_once_the_keeper_answers[cancel-False]",
        ("s.stop_while_spawning_lost",),
        SPAWNING_FILE,
    ),
    Mutation(
        "a new call is followed without a subscription only when it sends nothing but its "
        "result (no gate)",
        CHAT_STATE,
        "            if not gated and self._answer_only(tool):\n",
        "            if self._answer_only(tool):\n",
        "test_the_answer_only_path_sends_and_journals_what_the_general_path_does",
        (),
        ANSWER_FILE,
    ),
    Mutation(
        "a command being spawned holds its process slot until the keeper answers",
        CHAT_STATE,
        "            self._hold_slot(self._launching, record.call_id)\n"
        "            call.spawning = True\n",
        "            call.spawning = True\n",
        "test_a_command_being_spawned_holds_its_process_slot_and_keeps_the_chat",
        (),
        SPAWNING_FILE,
    ),
]


def table_rules() -> list[str]:
    """The first column of every row of the doc's "Where each rule lives" table."""
    text = DOC.read_text()
    section = text.split("## Where each rule lives", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ")]
    # The header and its |---| line are skipped: the header is the only row named "rule".
    return [row.split(" | ")[0][2:] for row in rows if not row.startswith("| rule |")]


def run_tests(python: str, test_file: str, examples: int | None) -> tuple[int, str]:
    env = dict(os.environ)
    # A fresh example database each time: a failure one mutation found is not replayed into
    # the next one's run, so each result stands on its own.
    with tempfile.TemporaryDirectory(prefix="toolwire-mutations-") as db:
        env["HYPOTHESIS_STORAGE_DIRECTORY"] = db
        if examples is not None:
            env["TOOLWIRE_STATE_EXAMPLES"] = str(examples)
        done = subprocess.run(
            [python, "-m", "pytest", "-q", "-rf", "-p", "no:cacheprovider", test_file],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
    return done.returncode, done.stdout + done.stderr


def verdict(mutation: Mutation, code: int, output: str) -> tuple[bool, str]:
    if code == 0:
        return False, "SURVIVES: the file passed"
    failed = re.findall(r"^FAILED (\S+)", output, flags=re.MULTILINE)
    if not failed:
        return False, f"no test failed, yet pytest exited {code}:\n{output[-2000:]}"
    named = [f for f in failed if f.endswith(mutation.test) or f"::{mutation.test}" in f]
    seen = [c for c in mutation.codes if f"[{c}]" in output]
    shown = [f.split("::", 1)[1] for f in (named or failed)[:2]]
    more = len(failed) - len(shown)
    summary = f"failed: {', '.join(shown)}" + (f" and {more} more" if more else "")
    if seen:
        summary += f" ({', '.join(seen)})"
    if not named:
        return False, f"fails, but not {mutation.test}: {summary}"
    if mutation.codes and not seen:
        return False, f"fails, but without {' or '.join(mutation.codes)}: {summary}"
    return True, summary


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    default_python = ROOT / ".venv" / "bin" / "python"
    parser.add_argument(
        "python", nargs="?", default=str(default_python) if default_python.exists() else "python3"
    )
    parser.add_argument("--only", default=None)
    parser.add_argument("--examples", type=int, default=None)
    options = parser.parse_args()

    documented, held = table_rules(), [m.rule for m in MUTATIONS]
    if sorted(documented) != sorted(held) or len(set(held)) != len(held):
        print("the table and this script disagree on the rules:", file=sys.stderr)
        for rule in sorted(set(documented) - set(held)):
            print(f"  in the table only: {rule}", file=sys.stderr)
        for rule in sorted(set(held) - set(documented)):
            print(f"  here only: {rule}", file=sys.stderr)
        return 1

    chosen = [m for m in MUTATIONS if options.only is None or options.only in m.rule]
    bad = 0
    for number, mutation in enumerate(chosen, 1):
        path = ROOT / mutation.path
        original = path.read_text()
        count = original.count(mutation.old)
        print(f"[{number}/{len(chosen)}] {mutation.rule}", flush=True)
        if count != 1:
            print(f"    STALE: the text to replace occurs {count} times in {mutation.path}")
            bad += 1
            continue
        try:
            path.write_text(original.replace(mutation.old, mutation.new))
            code, output = run_tests(options.python, mutation.test_file, options.examples)
        finally:
            path.write_text(original)
        ok, summary = verdict(mutation, code, output)
        print(f"    {'ok' if ok else 'NOT AS DOCUMENTED'}: {summary}", flush=True)
        bad += not ok
    print(f"{len(chosen) - bad} of {len(chosen)} mutations fail as documented")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
