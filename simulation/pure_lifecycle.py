"""Invariants (s) and (x) of the pure seed mode: a chat's close (PROTOCOL.md 9.6) and the
agent's graceful shutdown (9.3), judged where a model without the shell can see them.

simulation/pure_seed.py plays the plans' `close` moves (a `CloseChatRequest` to the chat's
`ChatState`) and `shutdown` faults (`Shutdown` to every chat's `ChatState`, requests refused
meanwhile as the Agent refuses them, the journal made durable once every chat said
`ShutdownDone`, then a restart from the committed rows). This module keeps what those checks
need to remember and judges it; the codes are the agent mode's
(simulation/checks_interactive.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from toolwire.actors.results import TEXT_SHUTDOWN, Outcome, Result, text_killed_after
from toolwire.simulation.pure_world import require

# The agent's own refusal while it stops (actors/agent.py, `Agent.chat`): every request, of
# every chat, until the restart.
SHUTTING_DOWN_CODE = "internal"
SHUTTING_DOWN_TEXT = "the agent is shutting down; send this again once it restarted"
# Result times are whole milliseconds of the wall clock.
_MS = 0.001
# What a new call in a closed chat may be refused with besides `chat_closed` (its own faults
# come first), as the agent mode allows.
CLOSED_REFUSALS = ("chat_closed", "bad_args", "conflict", "over_limit")


@dataclass
class Shutdowns:
    """The shutdowns of one seed, in virtual seconds: [start, end], end infinite while one
    runs."""

    spans: list[list[float]] = field(default_factory=list)

    @property
    def stopping(self) -> bool:
        return bool(self.spans) and math.isinf(self.spans[-1][1])

    def begin(self, t: float) -> None:
        self.spans.append([t, math.inf])

    def end(self, t: float) -> None:
        self.spans[-1][1] = t

    def covers(self, start: float, done: float) -> bool:
        """A shutdown began while a call ran (after its start) and lasted until it ended."""
        return any(start - _MS <= a and b >= done - _MS for a, b in self.spans)


@dataclass
class ChatLifecycle:
    """What one chat's close and shutdowns left to check."""

    # The first close the chat took in this agent generation (None: open); a restart forgets
    # it, as the ChatState does.
    closed_at: float | None = None
    # Some close was taken (in any generation): the calls it ended are rightly `canceled`,
    # also when their saved results are sent again after a restart.
    ever_closed: bool = False
    # Foreground commands whose shell ran when a shutdown began: call id -> that instant.
    shut_running: dict[str, float] = field(default_factory=dict)
    # The chat said `ShutdownDone` for the shutdown under way.
    shut_done: bool = False

    def restarted(self) -> None:
        self.closed_at = None
        self.shut_done = False

    def closed(self, now: float) -> None:
        if self.closed_at is None:
            self.closed_at = now
        self.ever_closed = True


def at_s(wall_ms: int | None, epoch_ms: int) -> float | None:
    return None if wall_ms is None else (wall_ms - epoch_ms) / 1000


def check_shutdown_result(
    label: str,
    call_id: str,
    result: Result,
    chat: ChatLifecycle,
    shutdowns: Shutdowns,
    kill_after_ms: object,
    epoch_ms: int,
) -> None:
    """(s): a command running at a shutdown ends `canceled` with 9.3's text, and that text
    only when a shutdown came while the call ran."""
    start, done = at_s(result.started_at, epoch_ms), at_s(result.finished_at, epoch_ms)
    if result.text == TEXT_SHUTDOWN:
        require(
            start is not None and done is not None and shutdowns.covers(start, done),
            "s.text_without_shutdown",
            f"{label} has the shutdown's text, but no shutdown came while it ran",
        )
    t = chat.shut_running.get(call_id)
    if t is None or done is None or done <= t + _MS:
        return
    if isinstance(kill_after_ms, int) and result.text == text_killed_after(kill_after_ms):
        return  # its hard deadline was stopping it already
    require(
        result.outcome is Outcome.CANCELED and result.text == TEXT_SHUTDOWN,
        "s.not_canceled",
        f"{label} ran at the shutdown at {t:.4f}s but ended {result.outcome.value} "
        f"with {result.text!r}",
    )
