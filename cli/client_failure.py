"""How a command-line client (`toolwire call`, `toolwire tools`) reports an agent it could not
reach or a request the agent refused: one line on stderr naming the command, exit status 2."""

from __future__ import annotations

import sys

from toolwire.transport.client import ConnectError, RequestError

# What a client command catches around its session with the agent.
CLIENT_FAILURES = (ConnectError, RequestError, OSError)

FAILURE_STATUS = 2


def report_failure(command: str, url: str, exc: Exception) -> int:
    """Print why `command` failed and give its exit status. RequestError is checked first:
    the agent answered, so the line carries its code rather than a connection failure."""
    if isinstance(exc, RequestError):
        print(f"{command}: {exc.code}: {exc.message}", file=sys.stderr)
    else:
        print(f"{command}: could not connect to {url}: {exc}", file=sys.stderr)
    return FAILURE_STATUS
