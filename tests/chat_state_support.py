"""What the pure tests of ChatState share (tests/test_chat_state.py,
tests/test_chat_state_spawning.py)."""

from __future__ import annotations

from toolwire.actors.effects import CancelRequest, CloseChatRequest, InterruptRequest, Shutdown
from toolwire.simulation.pure_world import World


def stop_command(world: World, kind: str) -> None:
    """A cancel, an interrupt, a close or the agent's shutdown: each stops a running command
    as a cancel does (PROTOCOL.md 5.3, 5.7, 9.6, 9.3)."""
    owed = world.owed["a0"]
    if kind == "cancel":
        owed.cancels += 1
        assert world.request(CancelRequest("a0", ("k1",), None))
    elif kind == "interrupt":
        owed.interrupts += 1
        assert world.request(InterruptRequest("a0", None, None))
    elif kind == "close_chat":
        owed.closes += 1
        assert world.request(CloseChatRequest("a0", None))
    else:
        world.feed(Shutdown())
