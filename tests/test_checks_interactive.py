"""The simulation's hard-deadline rule (h.result, PROTOCOL.md 9.2) on hand-written traces.

A result's `started_at` is whole milliseconds of the agent's wall clock, so the checker knows a
`kill_after_ms` deadline only to within one millisecond. Seeds 60051 and 62683 of
`interactive` had an interrupt (a close_chat) applied in that millisecond, a fraction of it
before the agent's deadline: the stop was the interrupt's and the call rightly ended
`canceled`, but the checker took the SIGTERM for the deadline's and reported h.result. These
traces reproduce that moment exactly, and the orders the checker must still judge.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from toolwire.actors.chat import CallSpec
from toolwire.actors.events import ResultEvent
from toolwire.actors.results import (
    TEXT_CANCELED_WHILE_RUNNING,
    TEXT_SHUTDOWN,
    Outcome,
    Result,
    text_killed_after,
)
from toolwire.simulation.checker import check
from toolwire.simulation.processes import Script, SimProcess
from toolwire.simulation.scenario import EPOCH_MS, CallPlan
from toolwire.simulation.trace import (
    EFFECT,
    EV,
    REQ,
    SHUTDOWN,
    SIGNAL,
    CancelReq,
    CloseChatReq,
    InterruptReq,
    TurnReq,
)

CHAT, CALL, TURN = "c", "k", "t"
KILL_AFTER_MS = 23
ARGS: dict[str, Any] = {"command": "sim-run @t19@", "kill_after_ms": KILL_AFTER_MS}
# The call starts at 21.7 ms (its `started_at` says 21), spawns at 24 ms: the agent's deadline
# is 44.7 ms, the checker can only tell it lies in [44, 45) ms.
STARTED_MS, SPAWN, GRACE = 21, 0.024, 1.0
DEADLINE = 0.0447


def _stop_request(kind: str, t: float) -> tuple[Any, ...]:
    if kind == "shutdown":
        return (SHUTDOWN, t, 0)
    req: Any = {
        "cancel": CancelReq(CHAT, 2, (CALL,)),
        "interrupt": InterruptReq(CHAT, 2, TURN),
        "close_chat": CloseChatReq(CHAT, 2),
    }[kind]
    return (REQ, t, 0, 1, req)


def _violations(
    tmp_path: Path, stop: tuple[Any, ...] | None, term_at: float, result: Result
) -> set[str]:
    """Check a trace of one command with a hard deadline, stopped at `term_at` (after `stop`,
    when given) and killed at the end of its grace, that ended with `result`."""
    proc = SimProcess(Script(chunks=(), duration=10.0), pid=7, started=SPAWN)
    proc.owner = (CHAT, CALL)
    proc.kill(term_at, "SIGTERM")
    entries: list[tuple[Any, ...]] = [
        (REQ, 0.0, 0, 1, TurnReq(CHAT, 1, TURN, (CallSpec(CALL, "execute", ARGS),))),
        (EFFECT, SPAWN, 0, CHAT, CALL, "spawn"),
    ]
    if stop is not None:
        entries.append(stop)
    entries += [
        (SIGNAL, term_at, 0, CHAT, CALL, "SIGTERM"),
        (EV, term_at + GRACE + 0.01, 1, ResultEvent(CHAT, CALL, result)),
    ]
    plan = CallPlan(token="t19", provider_id="p", tool="execute", args=ARGS, call_id=CALL)
    found = check(
        entries,
        calls={(CHAT, CALL): plan},
        processes={(CHAT, CALL): [proc]},
        workspace=str(tmp_path),
        approval_timeout_s=None,
        end_time=5.0,
        stuck=[],
        kill_grace_s=GRACE,
    )
    return {v.code for v in found if v.code.startswith("h.")}


def _result(outcome: Outcome, text: str, finished: float) -> Result:
    return Result(
        tool="execute",
        outcome=outcome,
        text=text,
        data={"exit_code": None, "signal": "SIGTERM", "process_id": CALL},
        output="",
        output_bytes=0,
        truncated_bytes=0,
        timed_out=outcome is Outcome.TIMED_OUT,
        canceled=outcome is Outcome.CANCELED,
        started_at=EPOCH_MS + STARTED_MS,
        finished_at=EPOCH_MS + round(finished * 1000),
        wall_ms=round(finished * 1000) - STARTED_MS,
    )


CANCELED_BY = {
    "cancel": TEXT_CANCELED_WHILE_RUNNING,
    "interrupt": TEXT_CANCELED_WHILE_RUNNING,
    "close_chat": TEXT_CANCELED_WHILE_RUNNING,
    "shutdown": TEXT_SHUTDOWN,
}


@pytest.mark.parametrize("kind", sorted(CANCELED_BY))
def test_a_stop_applied_in_the_deadlines_millisecond_before_it_may_end_the_call_canceled(
    tmp_path: Path, kind: str
) -> None:
    """The stop came 0.2 ms before the agent's deadline, which then found the group already
    stopping: the first stop decides, so `canceled` with the stop's own text is right."""
    t = 0.0445
    result = _result(Outcome.CANCELED, CANCELED_BY[kind], t + GRACE + 0.01)
    assert _violations(tmp_path, _stop_request(kind, t), t, result) == set()


def test_a_stop_in_the_deadlines_millisecond_may_also_find_the_deadline_first(
    tmp_path: Path,
) -> None:
    """Same instant, other order: the deadline's stop came first and the result is its own."""
    t = 0.0445
    result = _result(Outcome.TIMED_OUT, text_killed_after(KILL_AFTER_MS), t + GRACE + 0.01)
    assert _violations(tmp_path, _stop_request("interrupt", t), t, result) == set()


@pytest.mark.parametrize("kind", sorted(CANCELED_BY))
def test_a_stop_after_the_deadlines_sigterm_leaves_the_deadlines_result_owed(
    tmp_path: Path, kind: str
) -> None:
    """The deadline's SIGTERM came first; a stop applied after it finds the outcome fixed:
    `canceled` is a violation."""
    result = _result(Outcome.CANCELED, CANCELED_BY[kind], DEADLINE + GRACE + 0.01)
    stop = _stop_request(kind, DEADLINE + 0.0002)
    assert _violations(tmp_path, stop, DEADLINE, result) == {"h.result"}


def test_a_stop_that_does_not_name_the_call_leaves_the_deadlines_result_owed(
    tmp_path: Path,
) -> None:
    """An interrupt of another turn, in the same millisecond, stops nothing of this call."""
    t = 0.0445
    result = _result(Outcome.CANCELED, TEXT_CANCELED_WHILE_RUNNING, t + GRACE + 0.01)
    other = (REQ, t, 0, 1, InterruptReq(CHAT, 2, "another-turn"))
    assert _violations(tmp_path, other, t, result) == {"h.result"}
    assert _violations(tmp_path, None, t, result) == {"h.result"}


def test_a_cancel_must_not_carry_the_shutdowns_text(tmp_path: Path) -> None:
    t = 0.0445
    result = _result(Outcome.CANCELED, TEXT_SHUTDOWN, t + GRACE + 0.01)
    assert _violations(tmp_path, _stop_request("cancel", t), t, result) == {"h.result"}
