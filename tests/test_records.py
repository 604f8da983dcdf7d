"""The record table (actors/records.py): a pure state machine, tested without trio or I/O.

A hypothesis `RuleBasedStateMachine` drives one table with every transition the chat actor uses
(admit, park, begin, finish, release, cancel, attach, touch, pin, forget) against a plain model,
and
checks the promises of PROTOCOL.md 5.1, 5.3 and 5.4 after every step. The plain tests below it
walk each row of the 5.1 and 5.3 tables once, by name.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from toolwire.actors.records import (
    Admission,
    CancelAction,
    RecordState,
    RecordTable,
    ToolCallRecord,
    TransitionError,
    args_fingerprint,
)
from toolwire.actors.results import TEXT_CANCELED_BEFORE_RUN, Outcome, Result

FORGET_AFTER = 100.0
CALL_IDS = st.sampled_from(["a", "b", "c", "d", "e"])
TOOLS = st.sampled_from(["execute", "read_file"])
ARGS = st.sampled_from([{"x": 1}, {"x": 2}, {"y": [1, 2]}])
INITIAL = st.sampled_from([RecordState.QUEUED, RecordState.AWAITING_APPROVAL, RecordState.RUNNING])
OUTCOMES = st.sampled_from(list(Outcome))


def result(outcome: Outcome, text: str = "t") -> Result:
    return Result(
        tool="execute",
        outcome=outcome,
        text=text,
        data=None,
        output="",
        output_bytes=0,
        truncated_bytes=0,
        timed_out=False,
        canceled=outcome is Outcome.CANCELED,
        started_at=None,
        finished_at=1,
        wall_ms=None,
    )


@dataclass
class Model:
    """What the table should hold for one call_id."""

    tool: str | None
    fingerprint: bytes | None
    requests: int
    touched_at: float
    begins: int = 0
    result: Result | None = None  # the first result saved, by identity
    released: bool = False  # the owner took the result off the record (the journal holds it)
    canceled_before_run: bool = False
    pins: int = 0
    published: bool = False  # the owner sent the durable result: the record may be forgotten

    @property
    def done(self) -> bool:
        return self.result is not None


def snapshot(record: ToolCallRecord) -> tuple[object, ...]:
    return (
        record.tool,
        record.fingerprint,
        record.state,
        record.requests,
        record.touched_at,
        record.effect_started,
        record.cancel_requested,
        record.result,
        record.outcome,
        record.pins,
    )


class RecordTableMachine(RuleBasedStateMachine):
    @initialize()
    def setup(self) -> None:
        self.table = RecordTable()
        self.model: dict[str, Model] = {}
        self.now = 0.0

    # -- helpers ----------------------------------------------------------------------------

    def record(self, call_id: str) -> ToolCallRecord:
        record = self.table.get(call_id)
        assert record is not None, call_id
        return record

    def touched(self, call_id: str) -> None:
        self.model[call_id].touched_at = self.now

    # -- rules ------------------------------------------------------------------------------

    @rule(seconds=st.floats(min_value=0, max_value=2 * FORGET_AFTER))
    def advance(self, seconds: float) -> None:
        self.now += seconds

    @rule(call_id=CALL_IDS, tool=TOOLS, args=ARGS, initial=INITIAL)
    def admit(self, call_id: str, tool: str, args: dict[str, object], initial: RecordState) -> None:
        fp = args_fingerprint(tool, args)
        model = self.model.get(call_id)
        before = None if call_id not in self.model else snapshot(self.record(call_id))
        admission, record = self.table.admit(call_id, tool, fp, self.now, initial_state=initial)
        assert record is not None
        if model is None:
            assert admission is Admission.NEW
            assert record.requests == 1 and record.tool == tool and record.fingerprint == fp
            expected_state = initial
            self.model[call_id] = Model(tool, fp, 1, self.now)
            if initial is RecordState.RUNNING:
                self.model[call_id].begins += 1
            assert record.state is expected_state
            return
        if model.tool is None:
            assert admission is Admission.ADOPTED
            model.tool, model.fingerprint = tool, fp
        elif model.tool != tool or model.fingerprint != fp:
            assert admission is Admission.CONFLICT
            # A conflict never touches the record: not its age, not its count, not its state.
            assert snapshot(record) == before
            return
        else:
            assert admission is Admission.EXISTING
        model.requests += 1
        self.touched(call_id)
        assert record.requests == model.requests
        assert record.touched_at == self.now

    @rule(call_id=CALL_IDS)
    def attach(self, call_id: str) -> None:
        record = self.table.attach(call_id, self.now)
        if call_id not in self.model:
            assert record is None
            assert self.table.get(call_id) is None  # attach never creates a record
            return
        assert record is not None
        self.model[call_id].requests += 1
        self.touched(call_id)

    @rule(call_id=CALL_IDS)
    def touch(self, call_id: str) -> None:
        if call_id in self.model:
            self.table.touch(self.record(call_id), self.now)
            self.touched(call_id)

    @rule(call_id=CALL_IDS)
    def pin(self, call_id: str) -> None:
        if call_id in self.model:
            self.record(call_id).pin()
            self.model[call_id].pins += 1

    @rule(call_id=CALL_IDS)
    def unpin(self, call_id: str) -> None:
        if call_id not in self.model:
            return
        if self.model[call_id].pins:
            self.record(call_id).unpin()
            self.model[call_id].pins -= 1
        else:
            with pytest.raises(TransitionError):  # an unpin with no pin is the caller's bug
                self.record(call_id).unpin()

    @rule(call_id=CALL_IDS)
    def release(self, call_id: str) -> None:
        if call_id not in self.model:
            return
        record = self.record(call_id)
        model = self.model[call_id]
        if model.done and not model.released:
            assert self.table.release_result(record) is model.result
            model.released = True
            assert record.result is None and record.state is RecordState.DONE
        else:
            before = snapshot(record)
            with pytest.raises(TransitionError):
                self.table.release_result(record)  # nothing saved, or already released
            assert snapshot(record) == before

    @rule(call_id=CALL_IDS)
    def park(self, call_id: str) -> None:
        if call_id not in self.model:
            return
        record = self.record(call_id)
        if record.state is RecordState.QUEUED:
            self.table.park(record)
            assert record.state.value == "awaiting_approval"
        else:
            before = snapshot(record)
            with pytest.raises(TransitionError):
                self.table.park(record)
            assert snapshot(record) == before

    @rule(call_id=CALL_IDS)
    def begin(self, call_id: str) -> None:
        if call_id not in self.model:
            return
        record = self.record(call_id)
        model = self.model[call_id]
        allowed = (
            record.state in (RecordState.QUEUED, RecordState.AWAITING_APPROVAL)
            and model.begins == 0
        )
        if allowed:
            self.table.begin(record)
            model.begins += 1
            assert record.state is RecordState.RUNNING and record.effect_started
        else:
            before = snapshot(record)
            with pytest.raises(TransitionError):
                self.table.begin(record)
            assert snapshot(record) == before

    @rule(call_id=CALL_IDS, outcome=OUTCOMES)
    def finish(self, call_id: str, outcome: Outcome) -> None:
        if call_id not in self.model:
            return
        record = self.record(call_id)
        model = self.model[call_id]
        new = result(outcome)
        before = snapshot(record)
        if model.done:
            # A record never leaves DONE and keeps its first result: a later finish is a no-op.
            assert self.table.finish(record, new) is False
            assert snapshot(record) == before
            return
        if model.begins == 0 and outcome not in (Outcome.NOT_RUN, Outcome.DENIED):
            # Nothing ran, so the call cannot claim to have completed, failed or been canceled.
            with pytest.raises(TransitionError):
                self.table.finish(record, new)
            assert snapshot(record) == before
            return
        assert self.table.finish(record, new) is True
        model.result = new

    @rule(call_id=CALL_IDS)
    def cancel(self, call_id: str) -> None:
        model = self.model.get(call_id)
        action, record = self.table.cancel(call_id, self.now)
        if model is None:
            assert action is CancelAction.TOMBSTONED
            assert record.tool is None and record.requests == 0 and record.cancel_requested
            # The chat actor saves the tombstone's not_run result at once; so do we.
            assert self.table.finish(record, result(Outcome.NOT_RUN, TEXT_CANCELED_BEFORE_RUN))
            self.model[call_id] = Model(
                None, None, 0, self.now, result=record.result, canceled_before_run=True
            )
            return
        self.touched(call_id)
        if model.done:
            assert action is CancelAction.ALREADY_DONE
        elif model.begins:
            assert action is CancelAction.STOP_RUNNING
            assert record.cancel_requested
        else:
            assert action is CancelAction.CLOSED_BEFORE_RUN
            assert self.table.finish(record, result(Outcome.NOT_RUN, TEXT_CANCELED_BEFORE_RUN))
            model.result = record.result
            model.canceled_before_run = True

    @rule(call_id=CALL_IDS)
    def publish(self, call_id: str) -> None:
        if call_id not in self.model:
            return
        record = self.record(call_id)
        model = self.model[call_id]
        if model.done and not model.published:
            self.table.publish(record)
            model.published = True
            assert record.published
        else:
            before = snapshot(record)
            with pytest.raises(TransitionError):
                self.table.publish(record)
            assert snapshot(record) == before

    @rule()
    def forget(self) -> None:
        expected = {
            call_id
            for call_id, m in self.model.items()
            if m.published and not m.pins and self.now - m.touched_at >= FORGET_AFTER
        }
        forgotten = self.table.forget_expired(self.now, FORGET_AFTER)
        assert {r.call_id for r in forgotten} == expected
        assert len(forgotten) == len(expected)
        for call_id in expected:
            assert self.table.get(call_id) is None
            del self.model[call_id]

    # -- invariants -------------------------------------------------------------------------

    @invariant()
    def table_matches_model(self) -> None:
        if not hasattr(self, "table"):
            return
        assert len(self.table) == len(self.model)
        assert {r.call_id for r in self.table} == set(self.model)
        for call_id, model in self.model.items():
            record = self.record(call_id)
            # At most once: the effect started at most once, and the record knows it.
            assert model.begins <= 1
            assert record.effect_started == (model.begins == 1)
            if model.canceled_before_run:
                assert model.begins == 0 and not record.effect_started
                assert record.outcome is Outcome.NOT_RUN
            if model.done:
                assert model.result is not None
                assert record.state is RecordState.DONE
                # The first result, forever: on the record until released, then its outcome.
                assert record.result is (None if model.released else model.result)
                assert record.outcome is model.result.outcome
            else:
                assert record.state is not RecordState.DONE and record.result is None
                assert record.outcome is None
            assert record.pins == model.pins
            assert record.requests == model.requests
            assert record.touched_at == model.touched_at
            assert record.tool == model.tool and record.fingerprint == model.fingerprint


RecordTableMachine.TestCase.settings = settings(
    max_examples=300, stateful_step_count=40, deadline=None
)
TestRecordTable = RecordTableMachine.TestCase


# --- the rows of PROTOCOL.md 5.1 ------------------------------------------------------------------

FP = args_fingerprint("execute", {"command": "true"})


def admit(
    table: RecordTable,
    call_id: str = "c",
    *,
    state: RecordState = RecordState.RUNNING,
    tool: str = "execute",
    fp: bytes = FP,
    now: float = 0.0,
) -> tuple[Admission, ToolCallRecord]:
    admission, record = table.admit(call_id, tool, fp, now, initial_state=state)
    assert record is not None
    return admission, record


def test_5_1_none_runs_once() -> None:
    table = RecordTable()
    admission, record = admit(table)
    assert admission is Admission.NEW
    assert record.state is RecordState.RUNNING and record.effect_started
    assert record.requests == 1
    with pytest.raises(TransitionError):
        table.begin(record)  # a second start is refused


@pytest.mark.parametrize("state", [RecordState.AWAITING_APPROVAL, RecordState.RUNNING])
def test_5_1_awaiting_or_running_repeat_subscribes(state: RecordState) -> None:
    table = RecordTable()
    _, record = admit(table, state=state)
    admission, again = admit(table, state=RecordState.RUNNING, now=5.0)
    assert admission is Admission.EXISTING and again is record
    assert record.state is state  # a repeat never starts or restarts anything
    assert record.requests == 2 and record.touched_at == 5.0
    assert record.effect_started == (state is RecordState.RUNNING)


def test_5_1_done_repeat_gets_saved_result() -> None:
    table = RecordTable()
    _, record = admit(table)
    first = result(Outcome.COMPLETED)
    assert table.finish(record, first)
    admission, again = admit(table, now=1.0)
    assert admission is Admission.EXISTING and again is record
    assert record.result is first and record.state is RecordState.DONE
    assert not table.finish(record, result(Outcome.FAILED))
    assert record.result is first


def test_5_1_canceled_before_run_is_adopted_not_run() -> None:
    table = RecordTable()
    action, tomb = table.cancel("c", 0.0)
    assert action is CancelAction.TOMBSTONED
    saved = result(Outcome.NOT_RUN, TEXT_CANCELED_BEFORE_RUN)
    assert table.finish(tomb, saved)
    admission, record = admit(table, state=RecordState.RUNNING, now=1.0)
    assert admission is Admission.ADOPTED and record is tomb
    assert not record.effect_started and record.state is RecordState.DONE
    assert record.result is saved
    assert record.tool == "execute" and record.fingerprint == FP
    # Once adopted, the tombstone is checked for conflicts like any record.
    other = args_fingerprint("execute", {"command": "false"})
    assert admit(table, fp=other, now=2.0)[0] is Admission.CONFLICT
    assert admit(table, now=3.0)[0] is Admission.EXISTING


@pytest.mark.parametrize(
    ("tool", "args"), [("read_file", {"command": "true"}), ("execute", {"command": "false"})]
)
def test_5_1_conflict_touches_nothing(tool: str, args: dict[str, str]) -> None:
    table = RecordTable()
    _, record = admit(table, now=1.0)
    admit(table, "other", now=2.0)
    before = snapshot(record)
    order = [r.call_id for r in table]
    admission, same = admit(table, tool=tool, fp=args_fingerprint(tool, args), now=50.0)
    assert admission is Admission.CONFLICT and same is record
    assert snapshot(record) == before
    assert [r.call_id for r in table] == order  # its age (forget order) is unchanged too


def test_fingerprint_ignores_key_order_but_not_values() -> None:
    a = args_fingerprint("execute", {"command": "x", "cwd": "d"})
    assert a == args_fingerprint("execute", {"cwd": "d", "command": "x"})
    assert a != args_fingerprint("execute", {"command": "x", "cwd": "e"})
    assert a != args_fingerprint("read_file", {"command": "x", "cwd": "d"})


# --- the rows of PROTOCOL.md 5.3 ------------------------------------------------------------------


def test_5_3_none_stores_a_tombstone() -> None:
    table = RecordTable()
    action, record = table.cancel("c", 7.0)
    assert action is CancelAction.TOMBSTONED
    assert table.get("c") is record and len(table) == 1
    assert record.tool is None and record.cancel_requested and not record.effect_started
    assert record.requests == 0 and record.touched_at == 7.0
    with pytest.raises(TransitionError):
        table.finish(record, result(Outcome.COMPLETED))  # it never ran
    assert table.finish(record, result(Outcome.NOT_RUN, TEXT_CANCELED_BEFORE_RUN))


@pytest.mark.parametrize("state", [RecordState.QUEUED, RecordState.AWAITING_APPROVAL])
def test_5_3_before_run_closes(state: RecordState) -> None:
    table = RecordTable()
    _, record = admit(table, state=state)
    action, same = table.cancel("c", 3.0)
    assert action is CancelAction.CLOSED_BEFORE_RUN and same is record
    assert record.cancel_requested and record.touched_at == 3.0
    assert table.finish(record, result(Outcome.NOT_RUN, TEXT_CANCELED_BEFORE_RUN))
    with pytest.raises(TransitionError):
        table.begin(record)  # a closed gate never opens
    assert not record.effect_started


def test_5_3_running_asks_to_stop() -> None:
    table = RecordTable()
    _, record = admit(table)
    action, same = table.cancel("c", 3.0)
    assert action is CancelAction.STOP_RUNNING and same is record
    assert record.cancel_requested and record.state is RecordState.RUNNING
    # The run ends with whatever really happened; the first finish wins.
    assert table.finish(record, result(Outcome.CANCELED))
    assert not table.finish(record, result(Outcome.COMPLETED))
    assert record.result is not None and record.result.outcome is Outcome.CANCELED


def test_5_3_done_keeps_the_saved_result() -> None:
    table = RecordTable()
    _, record = admit(table)
    saved = result(Outcome.COMPLETED)
    table.finish(record, saved)
    action, same = table.cancel("c", 9.0)
    assert action is CancelAction.ALREADY_DONE and same is record
    assert record.result is saved and record.touched_at == 9.0
    assert not record.cancel_requested  # the saved result never turns into "canceled"


# --- PROTOCOL.md 5.4 ------------------------------------------------------------------------------


def test_5_4_forgets_only_old_done_unpinned_and_touch_resets_age() -> None:
    table = RecordTable()
    _, done_old = admit(table, "done-old", now=0.0)
    table.finish(done_old, result(Outcome.COMPLETED))
    _, unsent = admit(table, "unsent", now=0.0)
    table.finish(unsent, result(Outcome.COMPLETED))  # its result is not durable and sent yet
    _, running = admit(table, "running", now=0.0)
    _, pinned = admit(table, "pinned", now=0.0)
    table.finish(pinned, result(Outcome.COMPLETED))
    pinned.pins = 2  # a turn and a read of its result
    _, touched = admit(table, "touched", now=0.0)
    table.finish(touched, result(Outcome.COMPLETED))
    table.touch(touched, 60.0)
    for record in (done_old, pinned, touched):
        table.publish(record)
    assert table.forget_expired(99.9, FORGET_AFTER) == []
    assert [r.call_id for r in table.forget_expired(100.0, FORGET_AFTER)] == ["done-old"]
    assert {r.call_id for r in table} == {"unsent", "running", "pinned", "touched"}
    assert table.forget_expired(159.9, FORGET_AFTER) == []
    assert [r.call_id for r in table.forget_expired(160.0, FORGET_AFTER)] == ["touched"]
    pinned.pins -= 1
    assert table.forget_expired(160.0, FORGET_AFTER) == []  # one holder is left
    pinned.pins -= 1
    assert [r.call_id for r in table.forget_expired(160.0, FORGET_AFTER)] == ["pinned"]
    # Live records are never forgotten, nor one whose result is still owed.
    assert [r.call_id for r in table] == ["unsent", "running"]
    assert running.state is RecordState.RUNNING
    # A forgotten id is unknown again: 5.4 lets it run anew (its record is gone).
    assert admit(table, "done-old", now=200.0)[0] is Admission.NEW


def test_a_released_result_leaves_its_outcome_and_the_first_finish_still_wins() -> None:
    table = RecordTable()
    _, record = admit(table, now=0.0)
    record.deadline = 30.0
    record.started_at_ms = 1234
    saved = result(Outcome.COMPLETED)
    assert table.finish(record, saved)
    assert table.release_result(record) is saved
    assert record.result is None and record.outcome is Outcome.COMPLETED
    assert record.deadline is None and record.started_at_ms is None  # the result carries it
    # Still done, still at most once: no second finish, no restart, a repeat is EXISTING.
    assert not table.finish(record, result(Outcome.FAILED))
    assert record.result is None and record.outcome is Outcome.COMPLETED
    with pytest.raises(TransitionError):
        table.begin(record)
    assert admit(table, now=1.0)[0] is Admission.EXISTING
    assert table.cancel("c", 2.0)[0] is CancelAction.ALREADY_DONE
