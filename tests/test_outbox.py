"""The connection outbox (actors/outbox.py) pulling output from per-call cursors: how much one
`take` holds, and that every byte still leaves once, in order, with its offset."""

from __future__ import annotations

from toolwire.actors.events import OutputEvent, ResultEvent
from toolwire.actors.outbox import OUTPUT_CHUNK_BYTES, TAKE_OUTPUT_BYTES, Outbox, Subscription
from toolwire.actors.output import OutputBuffer
from toolwire.actors.results import Outcome, Result

MIB = 1024 * 1024


def follower(outbox: Outbox, call_id: str, data: bytes) -> Subscription:
    buffer = OutputBuffer()  # the default retention (1 MiB) holds all of `data`
    buffer.append(data)
    sub = Subscription(outbox, "c", call_id)
    sub.stream = True
    sub.buffer = buffer
    sub.output_ready()
    return sub


def output_bytes(events: list[object]) -> int:
    return sum(len(e.data) for e in events if isinstance(e, OutputEvent))


def test_one_take_holds_about_take_output_bytes_and_the_rest_follows_in_order() -> None:
    outbox = Outbox("t")
    data = {f"call{n}": bytes([ord("a") + n]) * MIB for n in range(3)}  # 3 MiB in all
    for call_id, payload in data.items():
        follower(outbox, call_id, payload)
    first = outbox.take(32)
    assert TAKE_OUTPUT_BYTES <= output_bytes(first) < TAKE_OUTPUT_BYTES + OUTPUT_CHUNK_BYTES
    events = list(first)
    while len(outbox):
        events += outbox.take(32)
    for call_id, payload in data.items():
        mine = [e for e in events if isinstance(e, OutputEvent) and e.call_id == call_id]
        at = 0
        for event in mine:
            assert event.offset == at
            at += len(event.data)
        assert "".join(e.data for e in mine).encode() == payload
        assert all(len(e.data) <= OUTPUT_CHUNK_BYTES for e in mine)


def execute_result(output_bytes: int, *, timed_out: bool = False) -> Result:
    return Result(
        tool="execute",
        outcome=Outcome.TIMED_OUT if timed_out else Outcome.COMPLETED,
        text="",
        data=None,
        output="",
        output_bytes=output_bytes,
        truncated_bytes=0,
        timed_out=timed_out,
        canceled=False,
        started_at=None,
        finished_at=None,
        wall_ms=None,
    )


def test_a_result_brings_all_output_before_it_whatever_the_budget() -> None:
    outbox = Outbox("t")
    sub = follower(outbox, "big", b"x" * MIB)
    outbox.put_result(sub, ResultEvent("c", "big", execute_result(MIB)))
    events: list[object] = []
    while len(outbox):
        events += outbox.take(32)
    assert output_bytes(events) == MIB
    assert isinstance(events[-1], ResultEvent)


def test_a_result_brings_output_up_to_its_output_bytes_though_the_command_ran_on() -> None:
    """A follower whose cursor waits before a character that the call's timeout cut, taken
    after the command (which runs on) appended more of that character but not all of it:
    the output it gets before the `result` still reaches the result's `output_bytes`
    (PROTOCOL.md 5.0 and 9.9; seeds 61075 and 62718 of the crashes scenario)."""
    outbox = Outbox("t")
    sub = follower(outbox, "slow", b"@t7@ 0 \xf0")
    assert outbox.take() == [OutputEvent("c", "slow", 0, "@t7@ 0 ")]  # the lead byte waits
    assert sub.buffer is not None
    outbox.put_result(sub, ResultEvent("c", "slow", execute_result(8, timed_out=True)))
    sub.buffer.append(b"\x9f\x99")  # after the timeout, before the sender takes the result
    events = outbox.take()
    assert events[:-1] == [OutputEvent("c", "slow", 7, "\ufffd")]
    assert isinstance(events[-1], ResultEvent)
