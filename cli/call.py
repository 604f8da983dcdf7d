"""`toolwire call`: run one tool call from a terminal, streaming its output as it comes."""

from __future__ import annotations

import json
import os
import sys
import uuid
from pathlib import Path
from typing import Any

import msgspec

from toolwire.cli.client_failure import CLIENT_FAILURES, report_failure
from toolwire.transport import protocol
from toolwire.transport.client import connect


def read_token(explicit: str | None, state_dir: Path) -> str | None:
    if explicit:
        return explicit
    env_token = os.environ.get("TOOLWIRE_TOKEN", "").strip()
    if env_token:
        return env_token
    path = state_dir / "token"
    if path.exists():
        return path.read_text().strip() or None
    return None


def parse_args_json(text: str) -> dict[str, Any]:
    try:
        args = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SystemExit(f"toolwire call: ARGS_JSON is not valid JSON: {exc}") from None
    if not isinstance(args, dict):
        raise SystemExit(
            'toolwire call: ARGS_JSON must be a JSON object, e.g. \'{"command": "ls"}\''
        )
    return args


def exit_status(result: protocol.Result) -> int:
    """The command's own exit status for execute; 0/1 for other tools; 124 for a timeout
    (as coreutils' timeout), 130 for a canceled call (as a shell after Ctrl-C)."""
    if result.outcome == "timed_out":
        return 124
    if result.outcome in ("canceled", "not_run", "denied"):
        return 130
    if result.outcome == "unknown":
        return 70  # EX_SOFTWARE: something failed inside the agent
    data = result.data or {}
    if result.tool == "execute" and result.outcome == "completed":
        code = data.get("exit_code")
        if isinstance(code, int):
            return code
        return 128 + 9 if data.get("signal") else 0
    return 0 if result.outcome == "completed" else 1


async def run_call(
    url: str,
    token: str | None,
    chat_id: str,
    tool: str,
    args: dict[str, Any],
    *,
    call_id: str | None,
    timeout_ms: int | None,
    as_json: bool,
    sandbox: dict[str, Any] | None = None,
) -> int:
    call_id = call_id or str(uuid.uuid4())
    try:
        async with connect(url, token, reconnect=True) as client:
            handle = await client.call(
                chat_id, call_id, tool, args, timeout_ms=timeout_ms, sandbox=sandbox
            )
            streamed = False
            async for event in handle:
                if isinstance(event, protocol.Output) and not as_json:
                    sys.stdout.write(event.data)
                    sys.stdout.flush()
                    streamed = True
            result = await handle.result()
    except CLIENT_FAILURES as exc:
        return report_failure("toolwire call", url, exc)
    if as_json:
        print(msgspec.json.encode(result).decode())
    else:
        if not streamed and result.output:
            sys.stdout.write(result.output)
            if not result.output.endswith("\n"):
                sys.stdout.write("\n")
        print(f"[{result.outcome}] {result.text}", file=sys.stderr)
    return exit_status(result)
