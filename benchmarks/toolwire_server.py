"""A toolwire agent and WebSocket server for the benchmarks
(`python -m toolwire.benchmarks.toolwire_server --workspace DIR --token TOKEN
[--journal memory|sqlite --state-dir DIR --sync full|normal] [--no-metrics] [--skip-commits]`):
the same `Agent` and `Server` as `toolwire serve`, on 127.0.0.1 port 0, printing `PORT <n>` once
it listens. SIGTERM shuts it down like `serve`. The scenarios start it with serve's defaults
(`--journal sqlite --sync full`, `benchmarks/scenarios/common.py`) and with the memory journal as
a row beside them. `--no-metrics` turns the operator's counters off (`AgentContext.metrics =
None`): the baseline of their cost. `--skip-commits` (with the SQLite journal) runs the whole
durable path but skips the statements of every commit (`skipped_commits_journal`): the journal
benchmark's bound on what the loop's own share of durability costs.
"""

from __future__ import annotations

import argparse
import signal
import sqlite3
from pathlib import Path

import trio

from toolwire.actors.agent import Agent, AgentContext
from toolwire.actors.context import Limits
from toolwire.actors.hidden_paths import NOTHING_HIDDEN, HiddenPaths
from toolwire.actors.journal import CommitBatch, Journal, SqliteJournal, open_journal
from toolwire.actors.kept import KeeperClient, KeptProcessBackend
from toolwire.actors.loop_priority import favour_the_event_loop, fold_survivors_out_of_the_collector
from toolwire.transport.server import Server, ServerConfig


def skip_statements(db: sqlite3.Connection, batch: CommitBatch) -> None:
    """A commit's statements, not run: the disk as if it took no time."""
    del db, batch


def skipped_commits_journal(path: Path, sync: str = "full") -> SqliteJournal:
    """The SQLite journal with the statements of every commit skipped, through the journal's
    public `commit_statements` seam. Everything else runs as on serve's defaults: rows built
    and queued, group commits run on the loop or handed to the writer thread by the same rules,
    waiters released when a commit lands. A bound for the journal benchmark, never a journal to
    use: nothing it is given reaches the file, so nothing survives a restart."""
    return SqliteJournal(path, sync, commit_statements=skip_statements)


async def main(
    workspace: str,
    token: str,
    journal: str = "memory",
    state_dir: str = "",
    sync: str = "full",
    metrics: bool = True,
    skip_commits: bool = False,
) -> None:
    favour_the_event_loop()  # as `toolwire serve` does
    fold_survivors_out_of_the_collector()
    chosen: Journal
    if skip_commits:
        if journal != "sqlite" or not state_dir:
            raise SystemExit("--skip-commits needs --journal sqlite and --state-dir")
        chosen = skipped_commits_journal(Path(state_dir) / "journal.sqlite3", sync)
    else:
        chosen = open_journal(journal, Path(state_dir) if state_dir else None, sync)
    # As `toolwire serve`: with a state dir, the commands are held by the keeper (10.1).
    keeper = None
    if journal == "sqlite" and state_dir:
        keeper = KeptProcessBackend(
            KeeperClient.connect_or_start(state_dir), Limits().output_retention_bytes
        )
    # As `toolwire serve` does: its state dir is kept from every tool (one readlink per read).
    hidden = HiddenPaths.of([state_dir]) if state_dir else NOTHING_HIDDEN
    ctx = AgentContext(workspace=workspace, journal=chosen, keeper=keeper, hidden=hidden)
    if not metrics:
        ctx.metrics = None
    async with trio.open_nursery() as nursery:
        agent = await nursery.start(Agent(ctx).run)
        server = Server(agent, ServerConfig(host="127.0.0.1", port=0, token=token))
        port = await nursery.start(server.serve)
        print(f"PORT {port}", flush=True)
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async for _ in signals:
                break
        await server.shutdown()
        nursery.cancel_scope.cancel()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--workspace", required=True)
    parser.add_argument("--token", required=True)
    parser.add_argument("--journal", choices=["memory", "sqlite"], default="memory")
    parser.add_argument("--state-dir", default="")
    parser.add_argument("--sync", choices=["full", "normal"], default="full")
    parser.add_argument("--no-metrics", action="store_true")
    parser.add_argument("--skip-commits", action="store_true")
    args = parser.parse_args()
    trio.run(
        main,
        args.workspace,
        args.token,
        args.journal,
        args.state_dir,
        args.sync,
        not args.no_metrics,
        args.skip_commits,
    )
