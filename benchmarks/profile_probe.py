"""A cProfile switch inside a benchmark agent's own trio loop
(`python PATH/profile_probe.py MODULE ARGS...`, the agent module's own command line after it).

It runs MODULE (a benchmark server such as `toolwire.benchmarks.toolwire_server`) as `python -m
MODULE ARGS...` would, with one more task in its loop: a reader of this process's stdin. A line
`start` turns a `cProfile.Profile` on, a line `stop PATH` turns it off and writes its stats to
PATH (the `pstats` format), and each is answered by one line `ok` on stdout once done. So a
profile covers only the section the benchmark times, not the imports and start-up before it.

`count` and `stop-count PATH` do the same with a tracer instead of the profiler: it counts the
bytecodes each function executes and how often it is entered (`sys.settrace` with opcode
events), and writes `{"file:line(name)": [entries, bytecodes], ...}` as JSON to PATH. Slow (a
Python call per bytecode), but its counts are the same on a busy machine as on a quiet one:
where cProfile's times say where the time went, these say how much work each function did.

The reader runs in the loop's thread, which is the thread the profiler must be switched on in
(a profiler follows the thread that enabled it; the journal's writer thread is not profiled).
Why a wrapper run by path: the same probe runs in the working tree's agent and in REF's
(`benchmarks/against.py`), whose server may predate it; this file imports only the standard
library and trio, so REF's interpreter runs it unchanged (see `loop_lag.py`, the same shape).
"""

from __future__ import annotations

import cProfile
import json
import os
import runpy
import sys
from collections.abc import Awaitable, Callable
from types import CodeType, FrameType
from typing import Any

import trio


class OpcodeCounter:
    """Per code object: how often it was entered (or resumed) and how many bytecodes it ran."""

    def __init__(self) -> None:
        self.entries: dict[CodeType, int] = {}
        self.opcodes: dict[CodeType, int] = {}

    def start(self) -> None:
        sys.settrace(self._global)

    def stop(self, path: str) -> None:
        sys.settrace(None)
        # Summed by name: code objects may share one (every dataclass's generated `__init__`
        # is `<string>:2(__init__)`), and a dict made from them would keep only the last.
        out: dict[str, list[int]] = {}
        for code in set(self.entries) | set(self.opcodes):
            counts = out.setdefault(
                f"{code.co_filename}:{code.co_firstlineno}({code.co_name})", [0, 0]
            )
            counts[0] += self.entries.get(code, 0)
            counts[1] += self.opcodes.get(code, 0)
        with open(path, "w") as f:
            json.dump(out, f)
        self.entries, self.opcodes = {}, {}

    def _global(self, frame: FrameType, event: str, arg: Any) -> Any:
        code = frame.f_code
        self.entries[code] = self.entries.get(code, 0) + 1
        frame.f_trace_opcodes = True
        return self._local

    def _local(self, frame: FrameType, event: str, arg: Any) -> Any:
        if event == "opcode":
            code = frame.f_code
            self.opcodes[code] = self.opcodes.get(code, 0) + 1
        return self._local


async def answer(profiler: cProfile.Profile) -> None:
    counter = OpcodeCounter()
    stdin = trio.lowlevel.FdStream(os.dup(sys.stdin.fileno()))
    buffered = b""
    while True:
        data = await stdin.receive_some(4096)
        if not data:
            return  # the benchmark closed the pipe: keep serving, stop answering
        buffered += data
        while b"\n" in buffered:
            line, buffered = buffered.split(b"\n", 1)
            command, _, path = line.decode().strip().partition(" ")
            if command == "start":
                profiler.enable()
            elif command == "stop" and path:
                profiler.disable()
                profiler.dump_stats(path)
            elif command == "count":
                counter.start()
            elif command == "stop-count" and path:
                counter.stop(path)
            else:
                print(f"unknown command {line!r}", flush=True)
                continue
            print("ok", flush=True)


def with_probe(run: Callable[..., Any]) -> Callable[..., Any]:
    """`trio.run` with the stdin reader in the loop beside `main`."""

    def probed_run(main: Callable[..., Awaitable[Any]], *args: Any, **kwargs: Any) -> Any:
        async def probed() -> Any:
            profiler = cProfile.Profile()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(answer, profiler)
                result = await main(*args)
                nursery.cancel_scope.cancel()
            return result

        return run(probed, **kwargs)

    return probed_run


if __name__ == "__main__":
    if len(sys.argv) < 2:
        raise SystemExit("usage: profile_probe.py MODULE [ARGS...]")
    module = sys.argv[1]
    sys.argv = [module, *sys.argv[2:]]
    trio.run = with_probe(trio.run)  # the server's own `trio.run(main, ...)` gets the probe
    runpy.run_module(module, run_name="__main__", alter_sys=True)
