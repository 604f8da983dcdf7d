"""A request in flight (what to re-send, what answered it), and the reconnect backoff: the
small data of `ClientState` (pure: no I/O, no event loop)."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from toolwire.transport import protocol
from toolwire.transport.client.handles import CallHandle, Flag, TurnHandle

__all__ = ["MAX_BACKOFF_ATTEMPT", "SUBSCRIBING", "Key", "Kind", "RequestState", "backoff_delay"]

# Reconnect attempts counted for backoff: 2**32 * the initial delay is past any cap.
MAX_BACKOFF_ATTEMPT: Final = 32

Key = tuple[str, str]
Kind = Literal[
    "call", "attach", "cancel", "approve", "turn", "interrupt", "close_chat", "describe_tools"
]
# Requests that make a connection follow a call or a turn.
SUBSCRIBING: Final = frozenset({"call", "attach", "turn"})


@dataclass(eq=False)
class RequestState:
    """One request of ours: what to (re)send, and what answered it."""

    rid: int
    kind: Kind
    message: Any  # the protocol Struct to (re)send
    done: Flag  # set once answered or failed
    frame: str | bytes | None = None  # its encoding for the first send
    handle: CallHandle | None = None  # call / attach
    turn: TurnHandle | None = None  # turn
    created: list[CallHandle] = field(default_factory=list)  # handles made for this request
    internal: bool = False  # made by the client itself (re-attach): nobody awaits it
    sent_gen: int | None = None  # connection it was handed to, None if never sent
    error: BaseException | None = None
    cancel_ids: list[str] = field(default_factory=list)
    cancel_results: dict[str, protocol.CancelResult] = field(default_factory=dict)
    interrupted: protocol.Interrupted | None = None
    chat_closed: protocol.ChatClosed | None = None
    tool_definitions: protocol.ToolDefinitions | None = None
    resolved: protocol.ApprovalResolved | None = None

    def finish(self, error: BaseException | None = None) -> None:
        if not self.done.is_set():
            self.error = error
            self.done.set()


def backoff_delay(attempt: int, initial_s: float, max_s: float, rng: random.Random) -> float:
    """The wait before reconnect attempt `attempt` (0 for the first after a success):
    exponential up to `max_s`, scaled by a random factor in [0.5, 1] so that replicas that lost
    the same agent do not reconnect in lockstep."""
    growth: float = 2.0 ** min(attempt, MAX_BACKOFF_ATTEMPT)
    return min(max_s, initial_s * growth) * rng.uniform(0.5, 1.0)
