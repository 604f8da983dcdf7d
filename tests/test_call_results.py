"""The Result a call is saved with (actors/call_results.py, pure)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from toolwire.actors.call_results import execute_result, plain_result
from toolwire.actors.effects import ProcessSnapshot
from toolwire.actors.output import OutputBuffer
from toolwire.actors.records import RecordState, ToolCallRecord
from toolwire.actors.results import TEXT_CANCELED_BEFORE_RUN, TEXT_CANCELED_WHILE_RUNNING, Outcome


def snapshot(
    buffer: OutputBuffer, *, exit_code: int | None, signal: str | None, exited: bool = True
) -> ProcessSnapshot:
    """The command "p" as its result tells it: what the shell reads off its process."""
    output, truncated = buffer.result_output()
    return ProcessSnapshot("p", exit_code, signal, exited, output, buffer.total, truncated)


def record(started_at_ms: int | None, cancel_requested: bool = False) -> ToolCallRecord:
    rec = ToolCallRecord(
        call_id="c", tool="execute", fingerprint=b"f", state=RecordState.RUNNING, touched_at=0.0
    )
    rec.started_at_ms = started_at_ms
    rec.cancel_requested = cancel_requested
    return rec


@given(
    started=st.none() | st.integers(0, 2**41),
    elapsed=st.integers(0, 10**7),
    outcome=st.sampled_from(list(Outcome)),
    cancel_requested=st.booleans(),
)
def test_times_count_from_the_first_start(
    started: int | None, elapsed: int, outcome: Outcome, cancel_requested: bool
) -> None:
    finished = (started or 0) + elapsed
    result = plain_result(record(started, cancel_requested), "t", outcome, "x", finished)
    assert result.started_at == started and result.finished_at == finished
    assert result.wall_ms == (None if started is None else elapsed)
    # `canceled` is true only for a call a cancel really ended.
    assert result.canceled == (cancel_requested and outcome in (Outcome.CANCELED, Outcome.NOT_RUN))


@given(chunks=st.lists(st.binary(max_size=3000), max_size=40), exit_code=st.integers(0, 255))
def test_an_execute_result_carries_head_and_tail_and_its_exit(
    chunks: list[bytes], exit_code: int
) -> None:
    buffer = OutputBuffer(retention_bytes=4096, head_bytes=1024, result_bytes=2048,
                          result_head_bytes=512)  # fmt: skip
    for chunk in chunks:
        buffer.append(chunk)
    buffer.close()
    result = execute_result(
        record(1000), outcome=Outcome.COMPLETED,
        snapshot=snapshot(buffer, exit_code=exit_code, signal=None), timeout_ms=None,
        timed_out=False, canceled=False, finished_ms=1500,
    )  # fmt: skip
    assert (result.output, result.truncated_bytes) == buffer.result_output()
    assert result.output_bytes == sum(map(len, chunks))
    assert result.data == {"exit_code": exit_code, "signal": None, "process_id": "p"}
    assert result.text == f"command exited with code {exit_code}"


def test_the_exact_texts_of_section_7() -> None:
    buffer = OutputBuffer()
    running = snapshot(buffer, exit_code=None, signal=None, exited=False)
    common = {"snapshot": running, "finished_ms": 2}
    timed = execute_result(
        record(1), outcome=Outcome.TIMED_OUT, timeout_ms=250, timed_out=True, canceled=False,
        **common,  # type: ignore[arg-type]
    )  # fmt: skip
    assert timed.text == "tool call timed out after 250 ms; the process is still running"
    killed = execute_result(
        record(1), outcome=Outcome.CANCELED, timeout_ms=None, timed_out=False, canceled=True,
        **common,  # type: ignore[arg-type]
    )  # fmt: skip
    assert killed.text == TEXT_CANCELED_WHILE_RUNNING and killed.canceled
    signaled = execute_result(
        record(1), outcome=Outcome.COMPLETED,
        snapshot=snapshot(buffer, exit_code=None, signal="SIGKILL"), timeout_ms=None,
        timed_out=False, canceled=False, finished_ms=2,
    )  # fmt: skip
    assert signaled.text == "command was killed by SIGKILL"
    assert signaled.data == {"exit_code": None, "signal": "SIGKILL", "process_id": "p"}
    not_run = plain_result(
        record(None, True), "execute", Outcome.NOT_RUN, TEXT_CANCELED_BEFORE_RUN, 5
    )
    assert not_run.wall_ms is None and not_run.canceled
