"""The environment a command starts from: the agent's own, minus the agent's secrets.

A model that runs `env` (or `printenv`, or `cat /proc/self/environ`) puts whatever the command
sees into the transcript, and the agent's bearer token lets anyone who holds it run commands as
the agent's user. So no secret of the agent ever reaches a command's environment: not the
variable it may have come from (`TOOLWIRE_TOKEN`), and not any other variable whose value holds
the token, wherever the token was read from (a token file, the state dir, the variable). A
call's own `env` is applied on top by `execute` (PROTOCOL.md 9.1): what the chat server asks
for, it gets.

Pure: no I/O; the caller passes the environment and the secrets.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

# Variables that carry a secret of the agent and nothing a command needs: the token `toolwire
# serve` reads at start-up (and `toolwire call` from a terminal).
AGENT_SECRET_VARIABLES = frozenset({"TOOLWIRE_TOKEN"})


def command_environment(
    environ: Mapping[str, str], secrets: Iterable[str | None] = ()
) -> dict[str, str]:
    """`environ` without AGENT_SECRET_VARIABLES and without any variable whose value contains
    one of `secrets` (None and empty strings name no secret)."""
    held = [secret for secret in secrets if secret]
    return {
        name: value
        for name, value in environ.items()
        if name not in AGENT_SECRET_VARIABLES and not any(secret in value for secret in held)
    }
