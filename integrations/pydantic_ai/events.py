"""The custom event that carries a toolwire call's output into a pydantic-ai run's event
stream (`event_stream_handler`, `run_stream_events`, `iter`, the UI adapters)."""

from __future__ import annotations

from dataclasses import dataclass

from pydantic_ai.messages import CustomEvent

__all__ = ["ToolwireOutput"]


@dataclass(kw_only=True)
class ToolwireOutput(CustomEvent):
    """Output of one toolwire call as it streams, each byte once, in order. `tool_call_id` and
    `tool_name` are the model's (CustomEvent's attribution fields); `call_id` is toolwire's.
    Save `end` per `call_id` (what `ToolwireToolset.shown` holds) to resume without showing
    anything twice."""

    call_id: str
    offset: int  # byte offset of `text` in the call's output
    text: str
    end: int  # the byte offset after `text`: where a resumed call continues
