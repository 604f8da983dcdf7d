"""The attacking client of the `abuse` scenario, in a process of its own
(`python -m toolwire.benchmarks.abuse_load --port N --token T --attack KIND --size N
--bound-s S`).

It connects (every connection it needs), prints `READY`, waits for one line on stdin, then
makes its attack and waits for the agent's answers to it, at most `--bound-s` seconds (an
agent the attack froze would otherwise keep this process, and the benchmark, waiting for
minutes). It prints `ANSWERED` the moment the last answer arrives, and at the end one JSON
line: `{"answered_ms": ms or null, "answers": n, "expected": n, "codes": {...}}`,
`answered_ms` null when the answers did not all come in time.

- `redos`: `search_files` of `(a+)+$` over `redos.txt` (the scenario writes it: `--size` "a"s
  and a "b"), and a `cancel` of it after CANCEL_AFTER_S, as a client that gives up would send;
  answered by the search's result.
- `cancel`: one `cancel` of `--size` ids never called; answered by a `cancel_result` per id (or
  one `error`, such as `over_limit` for a list above a limit).
- `flood`: `--size` calls (`read_file` of the small file, `stream: false`), each in a chat of
  its own, sent as fast as the socket takes them; answered by a result or error per call.
- `big`: BIG_CONNECTIONS connections at once, each sending one `write_file` of `--size` bytes
  (MessagePack, one message each); answered by a result or error per write (a connection
  the agent closes is counted apart: the benchmark's own kill of a frozen agent closes them
  too).

A process of its own, as bigwrite's writer: what the attack costs a client (encoding and
masking 16 MiB messages, decoding 20,000 replies) is never charged to the chat that is measured.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

import trio
from trio_websocket import ConnectionClosed

from toolwire.benchmarks.wire import Codec, WsConn, ws_connect
from toolwire.benchmarks.write_load import content_of

ATTACKS = ("redos", "cancel", "flood", "big")
REDOS_FILE = "redos.txt"
REDOS_PATTERN = "(a+)+$"
# The reproduction sent its cancel after one second.
CANCEL_AFTER_S = 1.0
# Twenty 16 MiB messages at once: the reproduction (861 MiB peak on the code it ran).
BIG_CONNECTIONS = 20
# What each call of the flood reads: the small file of the trivial call (scenarios/common.py
# writes it into every benchmark workspace).
FLOOD_PATH = "small.txt"


class Tally:
    """Answers of one attack as they arrive: done once `expected` have come, or at the first
    `error` where one request carries the whole attack (an `error` then answers all of it)."""

    def __init__(self, expected: int, *, one_request: bool) -> None:
        self.expected = expected
        self.one_request = one_request
        self.answers = 0
        self.codes: Counter[str] = Counter()
        self.done = trio.Event()
        self.t0 = 0.0
        self.answered_ms: float | None = None

    def answer(self, what: str, *, whole_request: bool = False) -> None:
        self.answers += 1
        self.codes[what] += 1
        ends_all = whole_request and self.one_request
        if (ends_all or self.answers >= self.expected) and not self.done.is_set():
            self.answered_ms = (time.perf_counter() - self.t0) * 1000
            self.done.set()


async def _read_answers(conn: WsConn, codec: Codec, tally: Tally, kinds: frozenset[str]) -> None:
    try:
        while True:
            message = codec.decode(await conn.ws.get_message())
            if message.type == "error":
                tally.answer(f"error {message.code}", whole_request=True)
            elif message.type in kinds:
                tally.answer(message.type if message.outcome is None else message.outcome)
    except ConnectionClosed:
        # Not an answer: the benchmark kills a frozen agent at its bound, which closes it too.
        tally.codes["connection closed"] += 1


async def redos(conns: list[WsConn], codec: Codec, size: int, tally: Tally) -> None:
    del size  # the file the scenario wrote holds it
    [conn] = conns
    args = {"pattern": REDOS_PATTERN, "path": REDOS_FILE}
    await conn.ws.send_message(codec.call("evil", "redos-1", "search_files", args, stream=False))
    await trio.sleep(CANCEL_AFTER_S)
    await conn.ws.send_message(codec.cancel("evil", ["redos-1"]))


async def cancel(conns: list[WsConn], codec: Codec, size: int, tally: Tally) -> None:
    [conn] = conns
    await conn.ws.send_message(codec.cancel("t", [f"unknown-{i}" for i in range(size)]))


async def flood(conns: list[WsConn], codec: Codec, size: int, tally: Tally) -> None:
    [conn] = conns
    for i in range(size):
        frame = codec.call(f"flood-{i}", "c", "read_file", {"path": FLOOD_PATH}, stream=False)
        await conn.ws.send_message(frame)


async def big(conns: list[WsConn], codec: Codec, size: int, tally: Tally) -> None:
    content = content_of(size)
    frames = [
        codec.call(f"big-{i}", "w", "write_file", {"path": f"big-{i}.txt", "content": content},
                   stream=False)
        for i in range(len(conns))
    ]  # fmt: skip
    async with trio.open_nursery() as nursery:
        for conn, frame in zip(conns, frames, strict=True):
            nursery.start_soon(_send_or_count_closed, conn, frame, tally)


async def _send_or_count_closed(conn: WsConn, frame: str | bytes, tally: Tally) -> None:
    with contextlib.suppress(ConnectionClosed):  # its reader counts the close
        await conn.ws.send_message(frame)


Attack = Callable[[list[WsConn], Codec, int, Tally], Awaitable[None]]
# attack -> (what it sends, its connections, the message types that answer it)
PLANS: dict[str, tuple[Attack, int, frozenset[str]]] = {
    "redos": (redos, 1, frozenset({"result"})),
    "cancel": (cancel, 1, frozenset({"cancel_result"})),
    "flood": (flood, 1, frozenset({"result"})),
    "big": (big, BIG_CONNECTIONS, frozenset({"result"})),
}


def expected_answers(attack: str, size: int) -> int:
    if attack in ("cancel", "flood"):
        return size
    if attack == "big":
        return BIG_CONNECTIONS
    return 1


async def main(port: int, token: str, attack: str, size: int, bound_s: float) -> dict[str, Any]:
    # MessagePack, as a 16 MiB file must fit in one message (JSON would escape its newlines).
    codec = Codec("msgpack")
    run, connections, kinds = PLANS[attack]
    # The cancel attack is one request of `size` ids: one error refuses all of them.
    tally = Tally(expected_answers(attack, size), one_request=attack == "cancel")
    conns: list[WsConn] = []
    async with trio.open_nursery() as outer:

        async def hold(task_status: trio.TaskStatus[WsConn]) -> None:
            async with ws_connect(port, token=token, subprotocol=codec.subprotocol) as conn:
                task_status.started(conn)
                await trio.sleep_forever()

        for _ in range(connections):
            conns.append(await outer.start(hold))
        print("READY", flush=True)
        await trio.to_thread.run_sync(sys.stdin.readline)
        tally.t0 = time.perf_counter()
        with trio.move_on_after(bound_s):
            async with trio.open_nursery() as nursery:
                for conn in conns:
                    nursery.start_soon(_read_answers, conn, codec, tally, kinds)
                nursery.start_soon(run, conns, codec, size, tally)
                await tally.done.wait()
                print("ANSWERED", flush=True)  # the scenario's calls may stop now
                nursery.cancel_scope.cancel()
        outer.cancel_scope.cancel()
    return {
        "answered_ms": tally.answered_ms,
        "answers": tally.answers,
        "expected": tally.expected,
        "codes": dict(tally.codes),
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--token", required=True)
    parser.add_argument("--attack", choices=ATTACKS, required=True)
    parser.add_argument("--size", type=int, required=True)
    parser.add_argument("--bound-s", type=float, required=True)
    args = parser.parse_args()
    report = trio.run(main, args.port, args.token, args.attack, args.size, args.bound_s)
    print(json.dumps(report), flush=True)
