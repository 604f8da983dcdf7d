"""A call's `sandbox` field (PROTOCOL.md 10.4) from the wire into the agent's terms."""

from __future__ import annotations

from toolwire.actors.context import AgentContext
from toolwire.actors.sandbox_policy import SandboxPolicy, normalized
from toolwire.transport import protocol


def call_sandbox(
    ctx: AgentContext, tool: str, field: protocol.Sandbox | None
) -> SandboxPolicy | None:
    """The call's own policy (None for none or the default, which are the same call), after
    refusing with `sandbox_unsupported` a command whose sandbox, floor included, this kernel
    cannot enforce: before anything is recorded or run."""
    policy = None
    if field is not None:
        policy = normalized(field.filesystem, field.writable, field.network, ctx.workspace)
        if policy.unrestricted and not policy.writable:
            policy = None
    ctx.admit_sandbox(tool, policy)
    return policy
