"""Memory of idle chats with finished records, measured in a fresh process of its own
(`python -m toolwire.benchmarks.scale_worker --chats N --records M --workspace DIR --journal KIND
[--state-dir DIR]`; prints one JSON line).

The agent is driven in-process, without a server: one `Outbox` stands for one connection that
called everything (and was sent every result: the outbox is drained as the calls end), so each
record keeps what a real one keeps, its subscription included. Every call is a `read_file` of a
300-byte file, so a record's saved result holds a small content. RSS is read from /proc after a
full garbage collection, in two steps: after 1 record per chat (chats + first records), and
after the other M-1 records per chat (the per-record cost, chats excluded).

`--recover` instead boots a fresh agent on the SQLite journal a previous run left in
`--state-dir` and reports its RSS once every record is rebuilt (a restart of the same chats).

`--journal sqlite` is what `toolwire serve` runs by default: the SQLite journal in the state dir
(WAL, group commit, fsync per commit), where a durable result lives instead of the heap; its
RSS includes SQLite's own page cache. `--journal memory` keeps every result on its record (the
records are the only store): the comparison, not what serve runs.
"""

from __future__ import annotations

import argparse
import gc
import json
import tempfile
import time
from pathlib import Path

import msgspec
import trio

from toolwire.actors.agent import Agent, AgentContext
from toolwire.actors.chat import CallSpec
from toolwire.actors.events import ResultEvent
from toolwire.actors.journal import open_journal
from toolwire.actors.outbox import Outbox
from toolwire.benchmarks.procs import rss_bytes
from toolwire.benchmarks.scenarios.common import TRIVIAL_ARGS

# Calls in flight at once before the driver waits for results: one connection's pipelining
# window (as in the transport scenario), so that group commit shares each fsync among 64 calls
# instead of one fsync per call. A larger burst leaves more transient memory behind (the
# scenario measures 4,096 too).
WINDOW = 64


def _drain(outbox: Outbox, sample: list[ResultEvent]) -> int:
    """Take every queued event; returns how many results were among them."""
    results = 0
    while len(outbox):
        for event in outbox.take(4096):
            if isinstance(event, ResultEvent):
                results += 1
                if len(sample) < 10:
                    sample.append(event)
    return results


async def measure(
    workspace: str,
    chats: int,
    records: int,
    journal_kind: str,
    state_dir: Path,
    window: int = WINDOW,
) -> dict[str, float | str]:
    journal = open_journal(journal_kind, state_dir)
    async with trio.open_nursery() as nursery:
        agent: Agent = await nursery.start(
            Agent(AgentContext(workspace=workspace, journal=journal)).run
        )
        outbox = Outbox("scale")
        sample: list[ResultEvent] = []
        await trio.sleep(0.05)
        gc.collect()
        rss_start = rss_bytes()
        t0 = time.perf_counter()

        async def add_records(first: int, last: int) -> None:
            sent = received = 0
            for c in range(chats):
                chat = f"chat-{c:05d}"
                for r in range(first, last):
                    spec = CallSpec(f"call-{r}", "read_file", TRIVIAL_ARGS)
                    agent.call(outbox, chat, spec, stream=False, rid=None)
                    sent += 1
                received += _drain(outbox, sample)
                # With the SQLite journal a call ends once its start and its result are on
                # disk: let the writer commit a window's worth before sending more.
                while sent - received >= window:
                    await outbox.wait()
                    received += _drain(outbox, sample)
                if c % 256 == 0:
                    await trio.lowlevel.checkpoint()  # let the new chats' tasks start
            while received < sent:
                await outbox.wait()
                received += _drain(outbox, sample)
            await trio.sleep(0.05)
            gc.collect()

        await add_records(0, 1)
        rss_one = rss_bytes()
        await add_records(1, records)
        rss_all = rss_bytes()
        seconds = time.perf_counter() - t0
        live = sum(len(chat.records) for chat in agent.chats.values())
        done = sum(1 for chat in agent.chats.values() for rec in chat.records if rec.done)
        on_heap = sum(
            1 for chat in agent.chats.values() for rec in chat.records if rec.result is not None
        )
        # The payload a record must keep somewhere, whatever its layout: its result, encoded.
        payload = sum(len(msgspec.msgpack.encode(e.result)) for e in sample) / max(len(sample), 1)
        nursery.cancel_scope.cancel()
    journal.close()
    return {
        "journal": journal_kind,
        "window": window,
        "chats": len(agent.chats),
        "records": live,
        "records_done": done,
        "results_on_heap": on_heap + len(agent.results),
        "rss_start_bytes": rss_start,
        "rss_one_record_bytes": rss_one,
        "rss_all_bytes": rss_all,
        "per_chat_bytes": (rss_one - rss_start) / chats,
        "per_record_bytes": (rss_all - rss_one) / max(chats * (records - 1), 1),
        "result_msgpack_bytes": payload,
        "seconds": seconds,
    }


async def recover(workspace: str, state_dir: Path) -> dict[str, float | str]:
    gc.collect()
    rss_start = rss_bytes()
    journal = open_journal("sqlite", state_dir)
    t0 = time.perf_counter()
    async with trio.open_nursery() as nursery:
        agent: Agent = await nursery.start(
            Agent(AgentContext(workspace=workspace, journal=journal)).run
        )
        seconds = time.perf_counter() - t0
        await trio.sleep(0.05)
        gc.collect()
        rss = rss_bytes()
        on_heap = sum(
            1 for chat in agent.chats.values() for rec in chat.records if rec.result is not None
        )
        nursery.cancel_scope.cancel()
    journal.close()
    return {
        "journal": "sqlite",
        "chats": len(agent.chats),
        "records": agent.recovered,
        "results_on_heap": on_heap,
        "rss_start_bytes": rss_start,
        "rss_recovered_bytes": rss,
        "seconds": seconds,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workspace", required=True)
    parser.add_argument("--chats", type=int, required=True)
    parser.add_argument("--records", type=int, required=True)
    parser.add_argument("--journal", choices=["sqlite", "memory"], default="sqlite")
    parser.add_argument(
        "--state-dir", type=Path, default=None, help="for --journal sqlite (default: a temp dir)"
    )
    parser.add_argument("--window", type=int, default=WINDOW, help="calls in flight at most")
    parser.add_argument(
        "--recover", action="store_true", help="boot on the journal in --state-dir instead"
    )
    args = parser.parse_args()
    if args.recover:
        if args.state_dir is None:
            parser.error("--recover needs --state-dir")
        print(json.dumps(trio.run(recover, args.workspace, args.state_dir)), flush=True)
        return
    with tempfile.TemporaryDirectory(prefix="scale-state-") as tmp:
        state_dir = args.state_dir or Path(tmp)
        result = trio.run(
            measure, args.workspace, args.chats, args.records, args.journal, state_dir, args.window
        )
        result["journal_file_bytes"] = sum(
            p.stat().st_size for p in state_dir.glob("journal.sqlite3*")
        )
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
