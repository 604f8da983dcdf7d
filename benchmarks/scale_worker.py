"""Memory of idle chats with finished records, measured in a fresh process of its own
(`python -m benchmarks.scale_worker --chats N --records M --workspace DIR`; prints one JSON line).

The agent is driven in-process, without a server: one `Outbox` stands for one connection that
called everything (and was sent every result: the outbox is drained as the calls end), so each
record keeps what a real one keeps, its subscription included. Every call is a `read_file` of a
300-byte file, so a record's saved result holds a small content. RSS is read from /proc after a
full garbage collection, in two steps: after 1 record per chat (chats + first records), and
after the other M-1 records per chat (the per-record cost, chats excluded).
"""

from __future__ import annotations

import argparse
import gc
import json
import time

import msgspec
import trio

from actors.agent import Agent, AgentContext
from actors.chat import CallSpec
from actors.outbox import Outbox
from benchmarks.procs import rss_bytes
from benchmarks.scenarios.common import TRIVIAL_ARGS


def _drain(outbox: Outbox) -> int:
    taken = 0
    while len(outbox):
        taken += len(outbox.take(4096))
    return taken


async def measure(workspace: str, chats: int, records: int) -> dict[str, float]:
    async with trio.open_nursery() as nursery:
        agent: Agent = await nursery.start(Agent(AgentContext(workspace=workspace)).run)
        outbox = Outbox("scale")
        await trio.sleep(0.05)
        gc.collect()
        rss_start = rss_bytes()
        t0 = time.perf_counter()

        async def add_records(first: int, last: int) -> None:
            for c in range(chats):
                chat = f"chat-{c:05d}"
                for r in range(first, last):
                    spec = CallSpec(f"call-{r}", "read_file", TRIVIAL_ARGS)
                    agent.call(outbox, chat, spec, stream=False, rid=None)
                _drain(outbox)
                if c % 256 == 0:
                    await trio.lowlevel.checkpoint()  # let the new chats' tasks start
            await trio.sleep(0.05)
            gc.collect()

        await add_records(0, 1)
        rss_one = rss_bytes()
        await add_records(1, records)
        rss_all = rss_bytes()
        seconds = time.perf_counter() - t0
        live = sum(len(chat.records) for chat in agent.chats.values())
        done = sum(1 for chat in agent.chats.values() for rec in chat.records if rec.done)
        # The payload a record must keep whatever its layout: its result, encoded.
        sample = [rec.result for rec in next(iter(agent.chats.values())).records]
        payload = sum(len(msgspec.msgpack.encode(r)) for r in sample) / max(len(sample), 1)
        nursery.cancel_scope.cancel()
    return {
        "chats": len(agent.chats),
        "records": live,
        "records_done": done,
        "rss_start_bytes": rss_start,
        "rss_one_record_bytes": rss_one,
        "rss_all_bytes": rss_all,
        "per_chat_bytes": (rss_one - rss_start) / chats,
        "per_record_bytes": (rss_all - rss_one) / max(chats * (records - 1), 1),
        "result_msgpack_bytes": payload,
        "seconds": seconds,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workspace", required=True)
    parser.add_argument("--chats", type=int, required=True)
    parser.add_argument("--records", type=int, required=True)
    args = parser.parse_args()
    print(json.dumps(trio.run(measure, args.workspace, args.chats, args.records)), flush=True)


if __name__ == "__main__":
    main()
