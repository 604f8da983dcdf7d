"""Adapters of toolwire's executor to agent frameworks, each behind an extra of its own:
`toolwire.integrations.pydantic_ai` (`pip install 'toolwire[pydantic-ai]'`).

They use the clients' executor only (transport/client/executor.py): the stable call ids, the
typed errors, output with offsets, one turn per model response and `render_result` are its;
an integration maps them onto its framework's toolsets, events, retries and history."""
