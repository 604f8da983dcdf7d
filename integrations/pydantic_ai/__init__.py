"""toolwire's tools for a pydantic-ai `Agent` (extra `pydantic-ai`): `ToolwireToolset`.

    async with toolwire.aio.connect(url, token) as client:
        toolset = ToolwireToolset(client, chat_id, approval={"write_file"}, shown=saved_offsets)
        agent = Agent(model, toolsets=[toolset], output_type=[str, DeferredToolRequests])
        try:
            result = await agent.run(prompt, message_history=history, event_stream_handler=show)
        except RunCancelled as stopped:                 # toolset.interrupt() was called
            history = await toolset.repair(stopped.all_messages())

docs/integrations.md ("pydantic-ai") says what each part guarantees.
"""

from __future__ import annotations

# `pip install toolwire` does not bring pydantic-ai: say which extra does.
try:
    import pydantic_ai  # noqa: F401
except ModuleNotFoundError as missing:
    if missing.name != "pydantic_ai":
        raise
    raise ModuleNotFoundError(
        "toolwire.integrations.pydantic_ai needs pydantic-ai: "
        "pip install 'toolwire[pydantic-ai]' (or '.[pydantic-ai]' in a checkout)",
        name="pydantic_ai",
    ) from None

from toolwire.integrations.pydantic_ai.events import ToolwireOutput
from toolwire.integrations.pydantic_ai.history import RESULT_KEY, framework_outcome, message_id
from toolwire.integrations.pydantic_ai.toolset import ToolwireToolset

__all__ = ["RESULT_KEY", "ToolwireOutput", "ToolwireToolset", "framework_outcome", "message_id"]
