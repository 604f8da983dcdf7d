"""The writing chat of the `bigwrite` scenario, in a process of its own
(`python -m toolwire.benchmarks.write_load --port N --token T --bytes N`).

Over one WebSocket of its own (MessagePack), in chat `bigwrite-writer`, it writes a file of
`--bytes` bytes (`write_file`, `stream: false`) one call after the other, as a model rewriting a
big file would.
It prints `READY` once the first write has completed, writes on until SIGTERM, then prints one
JSON line: `{"writes": n, "write_ms": [each write, request to result]}`.

A process of its own so that what writing costs the client (building and masking a 16 MiB
message) is not charged to the client whose calls are measured: only the agent is shared.
"""

from __future__ import annotations

import argparse
import json
import signal
import time

import trio

from toolwire.benchmarks.wire import Codec, await_result, check_completed, ws_connect

CHAT = "bigwrite-writer"
PATH = "bigwrite.txt"
LINE = "x" * 99 + "\n"


def content_of(size: int) -> str:
    """`size` bytes of text in 100-byte lines (a source file, not one giant line)."""
    whole, rest = divmod(size, len(LINE))
    return LINE * whole + "y" * rest


async def main(port: int, token: str, size: int) -> None:
    # MessagePack: JSON would escape every newline to two bytes, and a 16 MiB file would no
    # longer fit in the largest message.
    codec = Codec("msgpack")
    content = content_of(size)
    write_ms: list[float] = []
    async with ws_connect(port, token=token, subprotocol=codec.subprotocol) as conn:

        async def write_on() -> None:
            i = 0
            while True:
                call_id = f"w{i}"
                frame = codec.call(
                    CHAT, call_id, "write_file", {"path": PATH, "content": content}, stream=False
                )
                t0 = time.perf_counter()
                await conn.ws.send_message(frame)
                check_completed(await await_result(conn, codec, call_id))
                write_ms.append((time.perf_counter() - t0) * 1000)
                if i == 0:
                    print("READY", flush=True)
                i += 1

        with trio.open_signal_receiver(signal.SIGTERM) as signals:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(write_on)
                async for _ in signals:
                    break
                nursery.cancel_scope.cancel()
    print(json.dumps({"writes": len(write_ms), "write_ms": write_ms}), flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--token", required=True)
    parser.add_argument("--bytes", type=int, required=True)
    args = parser.parse_args()
    trio.run(main, args.port, args.token, args.bytes)
