"""Turns: a `TurnRun` per turn of a chat, and running its segments in plan order.

The chat admits a turn's calls and owns its records; this module keeps what a turn itself
needs (its calls, plan, followers and whether it finished) and drives its segments, each call
through the chat like any other call.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import trio

from toolwire.actors.calls import CallSpec, conflict_error
from toolwire.actors.events import TurnResultEvent
from toolwire.actors.outbox import Outbox
from toolwire.actors.records import RecordState, RecordTable, ToolCallRecord, args_fingerprint
from toolwire.actors.results import Result, ToolwireError

if TYPE_CHECKING:
    from toolwire.actors.chat import ChatActor


@dataclass(eq=False)
class TurnRun:
    """One turn of a chat: its calls in request order and the plan that runs them."""

    turn_id: str
    call_ids: list[str]
    fingerprint: bytes
    segments: list[list[str]]
    # One entry per `turn` request made while the turn runs: each gets its own turn_result.
    followers: list[Outbox] = field(default_factory=list)
    # Set once its turn_result went to the followers (and anything queued before it).
    done: trio.Event = field(default_factory=trio.Event)
    # Every call has its published result. The results themselves stay with the records (and
    # the journal): a repeated turn reads them from there, so a finished turn holds none.
    finished: bool = False


def turn_fingerprint(specs: list[CallSpec]) -> bytes:
    """What a repeated turn must match: every call with its id, tool, args and options."""
    return args_fingerprint(
        "turn",
        [[s.call_id, s.tool, s.args, s.timeout_ms, s.background, s.approval] for s in specs],
    )


def check_new_turn(records: RecordTable, specs: list[CallSpec]) -> list[bytes]:
    """Refuse a new turn before anything is admitted: no calls, a call id twice, or a call id
    already used with another tool or other args. Returns each call's args fingerprint."""
    if not specs:
        raise ToolwireError("bad_args", "turn: calls must not be empty")
    seen: set[str] = set()
    fingerprints = [args_fingerprint(spec.tool, spec.args) for spec in specs]
    for spec, fp in zip(specs, fingerprints, strict=True):
        if spec.call_id in seen:
            raise ToolwireError(
                "bad_args", f"turn: call_id {spec.call_id!r} appears twice in one turn"
            )
        seen.add(spec.call_id)
        record = records.get(spec.call_id)
        if (
            record is not None
            and record.tool is not None
            and (record.tool != spec.tool or record.fingerprint != fp)
        ):
            raise conflict_error(record)
    return fingerprints


def turn_records(records: RecordTable, run: TurnRun) -> list[ToolCallRecord]:
    """The records of a finished turn's calls: pinned while it ran, and a repeat of it
    after one was forgotten is a new turn (see `ChatActor.turn`), so none is missing."""
    found: list[ToolCallRecord] = []
    for call_id in run.call_ids:
        record = records.get(call_id)
        assert record is not None, f"turn {run.turn_id} lost its call {call_id}"
        found.append(record)
    return found


async def run_turn(chat: ChatActor, run: TurnRun) -> None:
    """Run a turn's segments one after another (the calls of a segment at once), then send
    its turn_result to every follower; the turn's pins on its records end here."""
    try:
        for segment in run.segments:
            async with trio.open_nursery() as nursery:
                for call_id in segment:
                    nursery.start_soon(_run_turn_call, chat, call_id)
        # Every segment ran to its end, so every call has its one published result. From
        # here a repeated turn is answered from the records (`_follow_turn`).
        run.finished = True
        followers, run.followers = run.followers, []

        def send(results: list[Result]) -> None:
            for outbox in followers:
                outbox.put(TurnResultEvent(chat.chat_id, run.turn_id, results))
            run.done.set()

        chat._deliver(turn_records(chat.records, run), send)  # pins them until sent
    finally:
        # Also when cancelled (the agent is stopping or crashed): this turn pins them no
        # longer.
        for call_id in run.call_ids:
            record = chat.records.get(call_id)
            if record is not None:
                record.unpin()


async def _run_turn_call(chat: ChatActor, call_id: str) -> None:
    record = chat.records.get(call_id)
    assert record is not None
    runtime = chat._runtime(record)
    if record.state is RecordState.QUEUED:
        chat._start(record, gated=chat._gated(runtime.spec))
    await runtime.done.wait()
