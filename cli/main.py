"""The `toolwire` command: serve, call, tools, schema."""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
from pathlib import Path
from typing import Any

import trio


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="toolwire",
        description="A tool-call runtime for AI coding agents: at-most-once tool calls over "
        "one WebSocket.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = sub.add_parser("serve", help="run the agent and its WebSocket server")
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=7411, help="port (default 7411; 0 = any)")
    serve.add_argument("--workspace", type=Path, default=None, help="default: the current dir")
    serve.add_argument(
        "--state-dir", type=Path, default=None, help="token and journal (~/.local/state/toolwire)"
    )
    serve.add_argument("--token-file", type=Path, default=None, help="file holding the token")
    serve.add_argument(
        "--insecure-no-auth", action="store_true", help="accept clients without a token (DANGER)"
    )
    serve.add_argument("--tls-cert", type=Path, default=None)
    serve.add_argument("--tls-key", type=Path, default=None)
    serve.add_argument(
        "--log-format",
        choices=["text", "json"],
        default=None,
        help="text for people, json (one object per line) for log pipelines; default: text "
        "when stderr is a terminal, else json",
    )
    serve.add_argument(
        "--log-level",
        choices=["debug", "info", "warning", "error"],
        default="info",
        help="info (default) logs every call's end and every error sent; warning keeps only "
        "warnings and failures",
    )
    serve.add_argument(
        "--allow-origin",
        action="append",
        default=[],
        metavar="ORIGIN",
        help="let WebSocket handshakes from this exact browser origin through (repeatable; "
        "e.g. https://ide.example.com); every other handshake with an Origin gets 403",
    )
    serve.add_argument(
        "--approve",
        default="",
        metavar="TOOL,...",
        help="tools whose calls wait for an approval (e.g. execute,write_file,edit_files)",
    )
    serve.add_argument(
        "--approval-timeout-s",
        type=float,
        default=None,
        help="end a gate left unanswered this long as not_run",
    )
    # The agent-wide bounds (issue 27); defaults and their reasons in actors/context.py.
    serve.add_argument(
        "--max-records",
        type=int,
        default=None,
        metavar="N",
        help="tool call records held in memory over all chats; past it new calls get "
        "over_limit (default 100000)",
    )
    serve.add_argument(
        "--max-processes",
        type=int,
        default=None,
        metavar="N",
        help="processes running over all chats; past it execute gets over_limit (default 256)",
    )
    serve.add_argument(
        "--max-message-bytes-in-flight",
        type=int,
        default=None,
        metavar="BYTES",
        help="bytes of messages being received at once over all connections; past it readers "
        "wait (default 67108864, four 16 MiB messages)",
    )
    serve.add_argument(
        "--max-ids-per-request",
        type=int,
        default=None,
        metavar="N",
        help="ids one cancel or turn may name; past it the request gets over_limit (default 1000)",
    )

    serve.add_argument(
        "--journal",
        choices=["sqlite", "memory"],
        default="sqlite",
        help="where records survive restarts (memory: nothing survives; for experiments)",
    )
    serve.add_argument(
        "--sync",
        choices=["full", "normal"],
        default="full",
        help="what a journal commit waits for (full: survives a power loss; normal: survives "
        "a crash of the agent, the last commits may be lost with the machine); docs/durability.md",
    )

    serve.add_argument(
        "--sandbox",
        choices=["read_only", "workspace_write", "full"],
        default="full",
        help="the floor of every call's sandbox filesystem point: no call writes more than "
        "this allows (default full); docs/sandbox.md",
    )
    serve.add_argument(
        "--sandbox-network",
        choices=["on", "off"],
        default="on",
        help="off: no command may open a TCP connection or listen, whatever its call asks",
    )

    serve.add_argument(
        "--on-shutdown",
        choices=["stop", "keep"],
        default="stop",
        help="what SIGTERM does to running commands: stop them (default) or keep them running "
        "for the next agent on this state dir to re-adopt (upgrades); docs/operations.md",
    )

    call = sub.add_parser("call", help="run one tool call and stream its output")
    call.add_argument("tool", help="tool name, e.g. execute")
    call.add_argument("args_json", metavar="ARGS_JSON", help='e.g. \'{"command": "ls -la"}\'')
    call.add_argument("--url", default="ws://127.0.0.1:7411/v1")
    call.add_argument("--token", default=None, help="default: TOOLWIRE_TOKEN, else the state dir")
    call.add_argument("--state-dir", type=Path, default=None)
    call.add_argument("--chat", default="", help='chat id (default "": no chat)')
    call.add_argument("--call-id", default=None, help="default: a new UUID")
    call.add_argument("--timeout-ms", type=int, default=None)
    call.add_argument("--json", action="store_true", help="print the Result as JSON")
    call.add_argument(
        "--sandbox",
        choices=["read_only", "workspace_write", "full"],
        default=None,
        help="the call's sandbox filesystem point (PROTOCOL.md 10.4; default: none asked)",
    )
    call.add_argument(
        "--sandbox-network", choices=["on", "off"], default=None, help="off: no TCP, no listening"
    )
    call.add_argument(
        "--sandbox-writable",
        action="append",
        default=[],
        metavar="PATH",
        help="with --sandbox workspace_write: another directory it may write (repeatable)",
    )

    tools = sub.add_parser(
        "tools", help="print the agent's tool definitions for a model API (describe_tools)"
    )
    tools.add_argument(
        "--format",
        choices=["json", "openai", "anthropic"],
        default="json",
        help="json: toolwire's own {name, description, input_schema, effect}; openai: "
        "function tools {type, function: {name, description, parameters}}; anthropic: "
        "{name, description, input_schema}",
    )
    tools.add_argument("--url", default="ws://127.0.0.1:7411/v1")
    tools.add_argument("--token", default=None, help="default: TOOLWIRE_TOKEN, else the state dir")
    tools.add_argument("--state-dir", type=Path, default=None)

    bench = sub.add_parser("bench", help="run the side-by-side benchmark suite")
    bench.add_argument(
        "--quick", action="store_true", help="tiny sizes: seconds in total (a smoke test)"
    )
    bench.add_argument(
        "--out",
        type=Path,
        default=Path("bench-results"),
        help="directory for the JSON, Markdown and PNG results (default bench-results/)",
    )
    bench.add_argument(
        "--only",
        default="",
        metavar="NAME,...",
        help=(
            "run only these scenarios (transport, reqresp, process, sandbox, streaming, scale,"
            " journal, bigwrite, interactive, abuse, request_cost, peers, keeper)"
        ),
    )
    bench.add_argument(
        "--against",
        default=None,
        metavar="REF",
        help="also run the agent of REF (a commit, tag or branch), built into a virtualenv of "
        "its own, beside the working tree's; rows give new / REF",
    )
    bench.add_argument(
        "--codex",
        default=None,
        metavar="PATH",
        help="the Codex binary (`codex`, which runs `codex app-server`) the peers scenario "
        "compares with (default $TOOLWIRE_BENCH_CODEX; without either it is skipped)",
    )
    bench.add_argument(
        "--against-cache",
        type=Path,
        default=None,
        metavar="DIR",
        help="where REF's builds are kept, by commit (default $TOOLWIRE_BENCH_CACHE, else "
        "~/.cache/toolwire/bench-builds)",
    )

    sim = sub.add_parser("sim", help="deterministic fault-injection simulation of the agent")
    sim.add_argument("--seeds", type=int, default=None, help="how many seeds (default 100)")
    sim.add_argument("--seed", type=int, default=None, help="first seed (alone: just this one)")
    sim.add_argument("--scenario", default="mix", help="mix (default) or a named scenario")
    sim.add_argument("--jobs", type=int, default=None, help="worker processes (default: CPUs)")
    sim.add_argument("--trace", action="store_true", help="print the trace (of failing seeds)")
    sim.add_argument("--json", type=Path, default=None, help="write the summary as JSON")
    sim.add_argument(
        "--mode",
        default="mix",
        help="mix (default: real agent, wire slice and pure ChatState seeds) or agent|wire|pure",
    )
    sim.add_argument("--plant", default=None, help=argparse.SUPPRESS)  # tests: a planted bug

    schema = sub.add_parser("schema", help="print the JSON Schema of the wire protocol")
    schema.add_argument("--out", type=Path, default=None, help="write to a file instead")
    schema.add_argument(
        "--doc",
        type=Path,
        default=None,
        help="also rewrite the generated message reference of this Markdown file",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _build_parser().parse_args(argv)
    if args.command == "serve":
        from toolwire.cli.logs import default_log_format, setup_logging
        from toolwire.cli.serve import ServeOptions, serve
        from toolwire.transport.access_control import BadOrigin, check_allowed_origin

        try:
            origins = frozenset(check_allowed_origin(o) for o in args.allow_origin)
        except BadOrigin as exc:
            print(f"toolwire serve: --allow-origin: {exc}", file=sys.stderr)
            return 2
        setup_logging(
            args.log_format or default_log_format(sys.stderr),
            getattr(logging, args.log_level.upper()),
        )
        approve = frozenset(t.strip() for t in args.approve.split(",") if t.strip())
        timeout = args.approval_timeout_s
        if timeout is not None and not (math.isfinite(timeout) and timeout >= 0):
            print(
                f"toolwire serve: --approval-timeout-s must be a number >= 0, not {timeout}",
                file=sys.stderr,
            )
            return 2
        unknown = approve - set(_tool_names())
        if unknown:
            print(
                f"toolwire serve: --approve names unknown tools: {sorted(unknown)}", file=sys.stderr
            )
            return 2
        from dataclasses import replace

        from toolwire.actors.context import Limits
        from toolwire.actors.sandbox_policy import SandboxPolicy

        chosen = {
            name: getattr(args, name)
            for name in (
                "max_records",
                "max_processes",
                "max_message_bytes_in_flight",
                "max_ids_per_request",
            )
            if getattr(args, name) is not None
        }
        try:
            limits = replace(Limits(), **chosen)
        except ValueError as exc:
            print(f"toolwire serve: {exc}", file=sys.stderr)
            return 2
        options = ServeOptions(
            host=args.host,
            port=args.port,
            workspace=args.workspace or Path.cwd(),
            state_dir=args.state_dir,
            token_file=args.token_file,
            insecure_no_auth=args.insecure_no_auth,
            tls_cert=args.tls_cert,
            tls_key=args.tls_key,
            approve=approve,
            approval_timeout_s=args.approval_timeout_s,
            journal=args.journal,
            allowed_origins=origins,
            sync=args.sync,
            limits=limits,
            sandbox_floor=SandboxPolicy(args.sandbox, (), args.sandbox_network == "on"),
            keep_on_shutdown=args.on_shutdown == "keep",
        )
        from toolwire.actors.journal import JournalError

        try:
            trio.run(serve, options)
        except (JournalError, BaseExceptionGroup) as exc:
            # A journal that cannot be read stops the agent with the file named, never a reset.
            group = exc if isinstance(exc, BaseExceptionGroup) else BaseExceptionGroup("", [exc])
            found, _ = group.split(JournalError)
            if found is None:
                raise
            for error in _leaves(found):
                print(f"toolwire serve: {error}", file=sys.stderr)
            return 1
        return 0
    if args.command == "call":
        from toolwire.cli.call import parse_args_json, read_token, run_call

        if args.sandbox_writable and args.sandbox != "workspace_write":
            print(
                "toolwire call: --sandbox-writable needs --sandbox workspace_write",
                file=sys.stderr,
            )
            return 2
        from toolwire.cli.serve import default_state_dir

        token = read_token(args.token, args.state_dir or default_state_dir())
        return trio.run(
            lambda: run_call(
                args.url,
                token,
                args.chat,
                args.tool,
                parse_args_json(args.args_json),
                call_id=args.call_id,
                timeout_ms=args.timeout_ms,
                as_json=args.json,
                sandbox=_call_sandbox(args),
            )
        )
    if args.command == "tools":
        from toolwire.cli.call import read_token
        from toolwire.cli.serve import default_state_dir
        from toolwire.cli.tools import run_tools

        token = read_token(args.token, args.state_dir or default_state_dir())
        return trio.run(run_tools, args.url, token, args.format)
    if args.command == "schema":
        text = schema_text()
        if args.doc is not None:
            from toolwire.transport.reference import update

            update(args.doc)
        if args.out is not None:
            args.out.write_text(text)
        else:
            sys.stdout.write(text)
        return 0
    if args.command == "bench":
        from toolwire.benchmarks.runner import main as bench_main

        only = [name.strip() for name in args.only.split(",") if name.strip()]
        return bench_main(
            quick=args.quick,
            out=args.out,
            only=only,
            against=args.against,
            cache_dir=args.against_cache,
            codex=args.codex,
        )
    if args.command == "sim":
        from toolwire.simulation.cli import run_from_args

        return run_from_args(args)
    raise AssertionError(args.command)


def _leaves(group: BaseExceptionGroup[BaseException]) -> list[BaseException]:
    leaves: list[BaseException] = []
    for exc in group.exceptions:
        leaves.extend(_leaves(exc) if isinstance(exc, BaseExceptionGroup) else [exc])
    return leaves


def _call_sandbox(args: argparse.Namespace) -> dict[str, Any] | None:
    """The `sandbox` field `toolwire call --sandbox...` asks for (None: none)."""
    if args.sandbox is None and args.sandbox_network is None and not args.sandbox_writable:
        return None
    sandbox: dict[str, Any] = {"filesystem": args.sandbox or "full"}
    if args.sandbox_writable:
        sandbox["writable"] = list(args.sandbox_writable)
    if args.sandbox_network is not None:
        sandbox["network"] = args.sandbox_network == "on"
    return sandbox


def schema_text() -> str:
    from toolwire.transport.codec import json_schema

    return json.dumps(_with_tool_args(json_schema()), indent=2, sort_keys=True) + "\n"


def _with_tool_args(schema: dict[str, Any]) -> dict[str, Any]:
    """Add the args of every tool: a `call`'s `args` is any object on the wire (the agent checks
    it against the tool it names and answers `bad_args`), so the messages alone do not say what
    a tool accepts. `$defs.ToolArgs` maps each tool name to the schema of its args: the
    self-contained `input_schema` that `describe_tools` sends (PROTOCOL.md 10.3)."""
    from toolwire.actors.tools.registry import TOOLS, input_schema

    schema["$defs"]["ToolArgs"] = {
        "description": "The `args` of a `call` (or a turn's call), by the tool it names.",
        "type": "object",
        "properties": {name: input_schema(tool) for name, tool in TOOLS.items()},
    }
    return schema


def _tool_names() -> list[str]:
    from toolwire.actors.tools.registry import TOOL_NAMES

    return TOOL_NAMES


if __name__ == "__main__":
    sys.exit(main())
