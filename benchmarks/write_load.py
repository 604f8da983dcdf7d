"""The writing chat of the `bigwrite` scenario, in a process of its own
(`python -m toolwire.benchmarks.write_load --port N --token T --bytes N --chat C
[--edit-files K]`).

Over one WebSocket of its own (MessagePack), in chat C (new for every writer: the call ids
`w0`, `w1`, ... of an earlier writer in the same chat would be answered from their records,
without a write), one call after the other, as a model rewriting big files would:
- by default it writes a file of `--bytes` bytes (`write_file`, `stream: false`);
- with `--edit-files K` it edits the K files `edit_files_paths(C, K)` (made beforehand by the
  benchmark with `edit_file_text`) in one `edit_files` call each time: one line of each file,
  its marker, is replaced by the next marker, so every call changes and rewrites every file.
It prints `READY` once the first call has completed, goes on until SIGTERM, waits for the call
under way, then prints one JSON line: `{"writes": n, "write_ms": [each call, request to result]}`.

A process of its own so that what writing costs the client (building and masking a 16 MiB
message) is not charged to the client whose calls are measured: only the agent is shared.
"""

from __future__ import annotations

import argparse
import json
import signal
import time
from typing import Any

import trio

from toolwire.benchmarks.wire import Codec, await_result, check_completed, ws_connect

PATH = "bigwrite.txt"
LINE = "x" * 99 + "\n"


def content_of(size: int) -> str:
    """`size` bytes of text in 100-byte lines (a source file, not one giant line)."""
    whole, rest = divmod(size, len(LINE))
    return LINE * whole + "y" * rest


def edit_files_paths(chat: str, count: int) -> list[str]:
    """The files a writer in `chat` edits: a directory per chat, so no two writers (of two
    agents, or one after the other) edit one file."""
    return [f"{chat}/bigedit-{i}.txt" for i in range(count)]


def marker(i: int) -> str:
    """The line the i-th edit of a file replaces (and the (i-1)-th wrote)."""
    return f"edit marker {i:09d}\n"


def edit_file_text(size: int) -> str:
    """`size` bytes of 100-byte lines with `marker(0)` in the middle: the file `--edit-files`
    edits."""
    half = content_of((size - len(marker(0))) // 2)
    return half + marker(0) + content_of(size - len(marker(0)) - len(half))


def call_args(chat: str, edit_files: int, i: int, content: str) -> tuple[str, dict[str, Any]]:
    if not edit_files:
        return "write_file", {"path": PATH, "content": content}
    edits = [{"old": marker(i), "new": marker(i + 1)}]
    return "edit_files", {
        "files": [{"path": p, "edits": edits} for p in edit_files_paths(chat, edit_files)]
    }


async def main(port: int, token: str, size: int, chat: str, edit_files: int = 0) -> None:
    # MessagePack: JSON would escape every newline to two bytes, and a 16 MiB file would no
    # longer fit in the largest message.
    codec = Codec("msgpack")
    content = "" if edit_files else content_of(size)
    write_ms: list[float] = []
    async with ws_connect(port, token=token, subprotocol=codec.subprotocol) as conn:
        stopping = trio.Event()

        async def write_on() -> None:
            i = 0
            while not stopping.is_set():
                call_id = f"w{i}"
                tool, args = call_args(chat, edit_files, i, content)
                frame = codec.call(chat, call_id, tool, args, stream=False)
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
                # The call under way runs to its result: a write the agent went on with after
                # this process left would load the agent of the next variant's measurement.
                stopping.set()
    print(json.dumps({"writes": len(write_ms), "write_ms": write_ms}), flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--token", required=True)
    parser.add_argument("--bytes", type=int, required=True)
    parser.add_argument("--chat", required=True)
    parser.add_argument("--edit-files", type=int, default=0)
    args = parser.parse_args()
    trio.run(main, args.port, args.token, args.bytes, args.chat, args.edit_files)
