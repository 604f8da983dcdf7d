"""What one request costs the chat is linear in what it names (issue 27, defect 2).

A `cancel` of 20,000 unknown ids used to take 28.5 s in a real agent, freezing every chat: each
durable result made `ChatState` ask every pending reply again, and a turn's planner compared
each call with every other one of its segment. Timing lives in benchmarks/ (`toolwire bench
--only request_cost` draws the curve of time per id); here the measure is the work itself,
counted and deterministic: every Python function call and every call into C made while the
pure `ChatState` (with a journal, as `toolwire serve` runs it) takes the request and every
completion it causes. Work per id must stay flat from 10 ids to thousands: the quadratic code
does about as many calls per id as there are ids, so it fails by a factor of hundreds, far
beyond the slack allowed here, and the count cannot flake.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from types import FrameType
from typing import Any

import pytest

from toolwire.actors import effects as fx
from toolwire.actors.results import ToolwireError
from toolwire.benchmarks.scenarios.request_cost import (
    REQUESTS,
    chat_state,
    drive,
    reads,
    turn_request,
)

SMALL = 10
LARGE = 3000
# Work per id of the large request over that of the small one. Flat code stays near 1 (a few
# fixed costs spread over more ids make it lower); the quadratic code was at LARGE / SMALL.
SLACK = 2.0

CONN = "conn"
# The requests and the shell's part are the benchmark's (benchmarks/scenarios/request_cost.py):
# the same work is timed there and counted here.


class _OverBudget(Exception):
    pass


class _CallCounter:
    """Counts function calls (Python and C) through `sys.setprofile`; raises once over a
    budget, so that quadratic code fails fast instead of running for minutes."""

    def __init__(self, budget: int | None = None) -> None:
        self.calls = 0
        self.budget = budget

    def _profile(self, frame: FrameType, event: str, arg: Any) -> None:
        if event == "call" or event == "c_call":
            self.calls += 1
            if self.budget is not None and self.calls > self.budget:
                raise _OverBudget

    def run(self, work: Callable[[], None]) -> int:
        sys.setprofile(self._profile)
        try:
            work()
        finally:
            sys.setprofile(None)
        return self.calls


@pytest.mark.parametrize("name", sorted(REQUESTS))
def test_work_per_id_stays_flat_from_10_to_thousands_of_ids(name: str) -> None:
    make = REQUESTS[name]
    state, request = make(SMALL)
    sent: list[fx.Effect] = []
    small = _CallCounter().run(lambda: sent.extend(drive(state, request)))
    assert sent, f"{name}: the request got no reply"
    per_id = small / SMALL
    budget = int(per_id * LARGE * SLACK)
    state, request = make(LARGE)
    counter = _CallCounter(budget)
    try:
        counter.run(lambda: drive(state, request))
    except _OverBudget:
        pytest.fail(
            f"{name}: {LARGE} ids took more than {budget} calls ({SLACK} x {per_id:.0f} per id, "
            f"the cost of {SMALL} ids): the work per id grows with the ids"
        )
    assert state.replies_waiting == 0, f"{name}: a reply still waits after {LARGE} ids"


def test_a_cancel_gets_one_cancel_result_per_id_in_request_order() -> None:
    state, request = REQUESTS["cancel_unknown"](LARGE)
    sent = drive(state, request)
    ids = [e.event.call_id for e in sent if isinstance(e, fx.Send)]  # type: ignore[attr-defined]
    assert ids == [f"id-{i}" for i in range(LARGE)]


def test_a_list_longer_than_max_ids_per_request_is_refused_and_changes_nothing() -> None:
    state = chat_state(max_ids=100)
    with pytest.raises(ToolwireError) as refused:
        state.handle(fx.CancelRequest(CONN, tuple(f"id-{i}" for i in range(101)), None), 0.0, 0)
    assert refused.value.code == "over_limit"
    assert "max_ids_per_request" in refused.value.message and "100" in refused.value.message
    with pytest.raises(ToolwireError) as refused:
        state.handle(turn_request(reads(101), stream=True), 0.0, 0)
    assert refused.value.code == "over_limit"
    assert "max_ids_per_request" in refused.value.message
    assert len(state.records) == 0 and not state.turns
    # At the limit itself, both are taken.
    drive(state, fx.CancelRequest(CONN, tuple(f"id-{i}" for i in range(100)), None))
    drive(state, turn_request(reads(100), stream=True))
    assert len(state.records) == 200
