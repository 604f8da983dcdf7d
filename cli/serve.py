"""`toolwire serve`: run the agent and its WebSocket server until SIGTERM or SIGINT."""

from __future__ import annotations

import ipaddress
import logging
import os
import signal
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import trio

from toolwire.actors.agent import Agent, AgentContext
from toolwire.actors.command_env import command_environment
from toolwire.actors.context import Limits
from toolwire.actors.hidden_paths import HiddenPaths
from toolwire.actors.journal import JournalError, open_journal
from toolwire.actors.kept import KeeperClient, KeptProcessBackend
from toolwire.actors.loop_priority import favour_the_event_loop, fold_survivors_out_of_the_collector
from toolwire.actors.results import ToolwireError
from toolwire.actors.sandbox import Enforcement
from toolwire.actors.sandbox_policy import FULL, SandboxPolicy
from toolwire.actors.spawn import PosixSpawner
from toolwire.cli.agent_token import private_state_dir, resolve_token
from toolwire.cli.private_process import forget_secrets, make_undumpable
from toolwire.transport.server import Server, ServerConfig

log = logging.getLogger("toolwire.serve")

DEFAULT_PORT = 7411
# PROTOCOL.md 9.3: on SIGTERM the agent exits within kill_grace_ms plus this: the groups get
# their grace, then saving the results and closing the connections get one second.
SHUTDOWN_SLACK_S = 1.0


@dataclass
class ServeOptions:
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    workspace: Path = field(default_factory=Path.cwd)
    state_dir: Path | None = None
    token_file: Path | None = None
    insecure_no_auth: bool = False
    tls_cert: Path | None = None
    tls_key: Path | None = None
    approve: frozenset[str] = frozenset()
    approval_timeout_s: float | None = None
    journal: str = "sqlite"
    allowed_origins: frozenset[str] = frozenset()
    sync: str = "full"  # the SQLite journal's synchronous level (actors.journal.SYNC_LEVELS)
    limits: Limits = field(default_factory=Limits)
    # --sandbox / --sandbox-network: the floor of every call's sandbox (PROTOCOL.md 10.4).
    sandbox_floor: SandboxPolicy = FULL
    # --on-shutdown keep: SIGTERM leaves the commands running for the next agent (10.1).
    keep_on_shutdown: bool = False


def default_state_dir() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(Path.home(), ".local", "state")
    return Path(base) / "toolwire"


def is_loopback(host: str) -> bool:
    if host in ("localhost", ""):
        return host == "localhost"
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def ssl_context(options: ServeOptions) -> ssl.SSLContext | None:
    if options.tls_cert is None and options.tls_key is None:
        return None
    if options.tls_cert is None or options.tls_key is None:
        raise SystemExit("toolwire serve: --tls-cert and --tls-key go together")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(options.tls_cert, options.tls_key)
    return context


async def serve(options: ServeOptions) -> None:
    favour_the_event_loop()
    fold_survivors_out_of_the_collector()
    state_dir = options.state_dir or default_state_dir()
    token, token_source = resolve_token(options.token_file, options.insecure_no_auth, state_dir)
    if options.journal != "memory":
        private_state_dir(state_dir)  # the journal holds commands, args and outputs
    # No secret of the agent reaches a command (actors/command_env.py, cli/private_process.py):
    # not its variable, not a variable holding the token, not the agent's own /proc entries.
    command_env = command_environment(os.environ, [token])
    forget_secrets(token)
    undumpable = make_undumpable()
    tls = ssl_context(options)
    workspace = options.workspace.resolve()
    if not workspace.is_dir():
        raise SystemExit(f"toolwire serve: workspace {workspace} is not a directory")
    if token is None:
        log.warning(
            "authentication is DISABLED (--insecure-no-auth); anyone who can reach this port "
            "can run commands as this user"
        )
    if tls is None and not is_loopback(options.host):
        log.warning(
            "listening without TLS on a non-loopback address; the token and every command "
            "travel in clear text. Use --tls-cert/--tls-key or bind 127.0.0.1.",
            extra={"host": options.host},
        )
    # A corrupt or unreadable journal raises JournalError here: the agent stops and says which
    # file, rather than starting empty and running again what already ran.
    # A floor this machine cannot enforce stops the start: every command would be refused.
    enforcement = Enforcement.probe()
    try:
        enforcement.check(options.sandbox_floor)
    except ToolwireError as exc:
        raise SystemExit(f"toolwire serve: --sandbox/--sandbox-network: {exc.message}") from None
    journal = open_journal(options.journal, state_dir, options.sync)
    # What this machine can enforce, for the operator to check (docs/sandbox.md). Logged once
    # the journal is open: a start that fails there says so in one line.
    log.info(enforcement.describe(), extra={"sandbox": enforcement.limits()})
    if not options.sandbox_floor.unrestricted:
        log.info("sandbox floor", extra={"sandbox_floor": options.sandbox_floor.to_wire()})
    if options.sandbox_floor.filesystem == "full" and token is not None:
        # The one way left to the token (docs/sandbox.md, "The agent's own files").
        log.info(
            "a command without a filesystem sandbox runs with this user's full rights and can "
            "read the state dir, token included; --sandbox workspace_write (or a call's own "
            "sandbox) keeps commands out of it"
        )
    # The commands outlive the agent (PROTOCOL.md 10.1): a keeper in the state dir holds them,
    # with the journal that says which call each belongs to. No journal, nothing to re-adopt
    # them into: the agent holds them itself.
    keeper = None
    if options.journal != "memory":
        if PosixSpawner.load() is None:
            log.warning("this C library lacks posix_spawn's actions: commands die with the agent")
        else:
            client = KeeperClient.connect_or_start(str(state_dir))
            keeper = KeptProcessBackend(client, options.limits.output_retention_bytes)
    ctx = AgentContext(
        workspace=str(workspace),
        keeper=keeper,
        keep_on_shutdown=options.keep_on_shutdown,
        approve_tools=options.approve,
        approval_timeout_s=options.approval_timeout_s,
        journal=journal,
        base_env=command_env,
        limits=options.limits,
        sandbox_floor=options.sandbox_floor,
        sandbox=enforcement,
        # No tool reads or writes these, nor a command under a filesystem sandbox.
        hidden=HiddenPaths.of(
            [state_dir] + ([options.token_file] if options.token_file is not None else [])
        ),
    )
    agent = Agent(ctx)
    server = Server(
        agent,
        ServerConfig(
            host=options.host,
            port=options.port,
            token=token,
            ssl_context=tls,
            allowed_origins=options.allowed_origins,
        ),
    )
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with trio.open_nursery() as nursery:
            # The port opens before recovery, so probes see the truth while a large journal is
            # rebuilt: /healthz 200, /readyz 503, WebSocket handshakes 503 until the agent is
            # ready (PROTOCOL.md 9.7). A signal meanwhile stops the start.
            port = await nursery.start(server.serve)
            nursery.start_soon(
                _stop_on_signal, signals, server, nursery.cancel_scope, ctx.kill_grace_s
            )
            nursery.start_soon(_end_when_stopped_by_failure, server, nursery.cancel_scope)
            # Where the token came from (a file path or the variable), never the token itself.
            log.info("token", extra={"token_source": token_source})
            if undumpable is False:
                log.warning(
                    "could not make the agent undumpable (prctl PR_SET_DUMPABLE): a command "
                    "of this user may read the token from /proc/<agent pid>/environ or mem"
                )
            log.info("workspace", extra={"workspace": str(workspace)})
            log.info("port open; recovering the journal", extra={"port": port})
            await nursery.start(agent.run)
            scheme = "wss" if tls else "ws"
            where = getattr(journal, "path", None)
            log.info(
                f"journal {options.journal}"
                + (
                    f" at {where} (sync {options.sync}), {agent.recovered} records recovered"
                    + (" (a new journal file)" if getattr(journal, "created", False) else "")
                    if where
                    else ""
                ),
                extra={"recovered": agent.recovered},
            )
            log.info("ready", extra={"port": port})
            print(f"toolwire listening on {scheme}://{options.host}:{port}/v1", flush=True)
    if agent.failure is not None:
        # The stop is over (commands stopped, connections closed with 1011): exit 1 with
        # the reason on stderr (cli/main.py), as for a journal that failed at start.
        raise JournalError(agent.failure)


async def _end_when_stopped_by_failure(server: Server, scope: trio.CancelScope) -> None:
    """The agent's journal failed and the server stopped it in order: end the process."""
    await server.stopped_by_failure.wait()
    scope.cancel()


async def _stop_on_signal(
    signals: AsyncIterator[int], server: Server, scope: trio.CancelScope, grace_s: float
) -> None:
    async for signum in signals:
        log.info("received %s; shutting down", signal.Signals(signum).name)
        with trio.move_on_after(grace_s + SHUTDOWN_SLACK_S):
            await server.shutdown()
        scope.cancel()
        return
