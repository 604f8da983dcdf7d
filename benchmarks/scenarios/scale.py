"""Scenario `scale`: memory of many idle chats, and many processes running at once.

- Memory: `benchmarks.scale_worker` (a fresh process; the agent driven in-process, no server)
  creates 10,000 chats with 10 finished `read_file` records each and reports its RSS, the cost
  per chat (with its first record) and per further record. The goal row runs what `toolwire
  serve` runs by default, the SQLite journal (in a fresh state dir), where a finished result
  lives on disk and only the newest 1,024 stay in memory; calls go 64 at a time (one
  connection's pipelining window, as in the transport scenario). For comparison: the memory
  journal, where every result stays on its record; and the same SQLite run driven as one burst
  of 4,096 calls at a time, whose transient tasks leave the allocator holding more memory once
  idle (RSS depends on how the chats were filled, not only on what they hold). And a restart: a
  fresh process recovers the SQLite run's journal and reports its RSS once every record is
  rebuilt.
- Processes: one WebSocket to the toolwire server process starts 1,000 `sleep 2` calls at once
  (`stream: false`), spread over chats of at most 50 (max_processes_per_chat is 64), and checks
  that every call completed with exit code 0. The peak held at once is the largest overlap of
  the results' [started_at, finished_at] intervals (the agent's own clock, in ms); this client
  also samples the server's live children from /proc every 20 ms, and its RSS. The baseline runs
  the same sleeps with `trio.run_process` in this process, timing each the same way.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time
from pathlib import Path

import trio

from toolwire.benchmarks.core import (
    BenchContext,
    Comparison,
    Goal,
    Measurement,
    ScenarioResult,
    agent,
    current_build,
    run_side_by_side,
)
from toolwire.benchmarks.procs import ServerProcess, child_env, rss_bytes
from toolwire.benchmarks.scenarios.common import make_workspace, servers
from toolwire.benchmarks.wire import Codec, UnexpectedReply, ws_connect

MB = 1024 * 1024
# Calls in flight while the memory worker fills the chats: one connection's pipelining window
# (the transport scenario's), and a burst as large as one group commit.
WINDOW = 64
BURST_WINDOW = 4096
CALLS_PER_CHAT = 50
SAMPLE_INTERVAL_S = 0.02


def run(ctx: BenchContext) -> ScenarioResult:
    res = ScenarioResult()
    chats = ctx.size(10_000, 200)
    records = 10
    n_procs = ctx.size(1_000, 40)
    # Long enough that the last of the 1,000 has started before the first ends: spawning them
    # takes toolwire ~2 s on this loaded 2-core machine (trio ~1 s).
    sleep_s = ctx.seconds(3.0, 0.5)
    repeats = ctx.repeats(2)
    res.params = {
        "chats": chats,
        "records_per_chat": records,
        "record": "read_file of a 300-byte file, finished",
        "memory_driver": "in-process Agent in a fresh subprocess (benchmarks.scale_worker)",
        "memory_journals": "sqlite (toolwire serve's default; goal), memory (comparison)",
        "memory_window": WINDOW,
        "memory_burst_window": BURST_WINDOW,
        "processes": n_procs,
        "process_command": f"sleep {sleep_s:g}",
        "calls_per_chat": CALLS_PER_CHAT,
        "repeats": repeats,
    }
    m_rss = res.measurement(
        "rss_mb",
        f"RSS with {chats:,} chats x {records} records, SQLite journal",
        "MiB",
        higher_is_better=False,
    )
    m_chat = res.measurement(
        "bytes_per_chat",
        "memory per chat (with its first record), SQLite journal",
        "bytes",
        higher_is_better=False,
    )
    m_record = res.measurement(
        "bytes_per_record",
        "memory per further finished record, SQLite journal",
        "bytes",
        higher_is_better=False,
    )
    m_rss_mem = res.measurement(
        "rss_mb_memory",
        f"RSS with {chats:,} chats x {records} records, memory journal",
        "MiB",
        higher_is_better=False,
    )
    m_chat_mem = res.measurement(
        "bytes_per_chat_memory",
        "memory per chat (with its first record), memory journal",
        "bytes",
        higher_is_better=False,
    )
    m_record_mem = res.measurement(
        "bytes_per_record_memory",
        "memory per further finished record, memory journal",
        "bytes",
        higher_is_better=False,
    )
    m_rss_recovered = res.measurement(
        "rss_mb_recovered",
        f"RSS after a restart rebuilt the {chats:,} chats x {records} records (SQLite)",
        "MiB",
        higher_is_better=False,
    )
    m_rss_burst = res.measurement(
        "rss_mb_burst",
        f"RSS with {chats:,} chats x {records} records, SQLite, {BURST_WINDOW:,} calls at a time",
        "MiB",
        higher_is_better=False,
    )
    m_done = res.measurement("procs_completed", f"of {n_procs} processes, completed", "processes")
    m_peak = res.measurement("procs_peak", "processes alive at once (peak)", "processes")
    m_wall = res.measurement(
        "procs_wall_s",
        f"wall time, {n_procs} x sleep {sleep_s:g}, toolwire",
        "s",
        higher_is_better=False,
    )
    m_trio_wall = res.measurement(
        "trio_procs_wall_s",
        f"wall time, {n_procs} x sleep {sleep_s:g}, bare trio",
        "s",
        higher_is_better=False,
    )
    m_trio_peak = res.measurement("trio_procs_peak", "bare trio: alive at once (peak)", "processes")
    workspace = make_workspace(ctx)

    with servers(ctx, "toolwire") as srv:

        def worker(journal: str, window: int, state_dir: Path | None = None) -> dict[str, float]:
            out = _scale_worker(ctx, workspace, chats, records, journal, window, state_dir)
            if out["records_done"] != chats * records:
                raise UnexpectedReply(f"scale worker: {out}")
            return out

        def memory_sqlite(r: int) -> None:
            state_dir = ctx.scratch("scale-state")
            out = worker("sqlite", WINDOW, state_dir)
            m_rss.add(
                out["rss_all_bytes"] / MB,
                rss_start_mib=out["rss_start_bytes"] / MB,
                results_on_heap=out["results_on_heap"],
                journal_file_mib=out["journal_file_bytes"] / MB,
            )
            m_chat.add(out["per_chat_bytes"])
            m_record.add(out["per_record_bytes"], result_msgpack_bytes=out["result_msgpack_bytes"])
            # A restart of the same chats: a fresh agent rebuilds every record from the journal.
            again = _scale_worker(ctx, workspace, chats, records, "sqlite", WINDOW, state_dir, True)
            if again["records"] != chats * records:
                raise UnexpectedReply(f"scale worker --recover: {again}")
            m_rss_recovered.add(
                again["rss_recovered_bytes"] / MB,
                rss_start_mib=again["rss_start_bytes"] / MB,
                boot_s=again["seconds"],
            )

        def memory_memory(r: int) -> None:
            out = worker("memory", WINDOW)
            m_rss_mem.add(
                out["rss_all_bytes"] / MB,
                rss_start_mib=out["rss_start_bytes"] / MB,
                results_on_heap=out["results_on_heap"],
            )
            m_chat_mem.add(out["per_chat_bytes"])
            m_record_mem.add(
                out["per_record_bytes"], result_msgpack_bytes=out["result_msgpack_bytes"]
            )

        def memory_burst(r: int) -> None:
            out = worker("sqlite", BURST_WINDOW)
            m_rss_burst.add(out["rss_all_bytes"] / MB, rss_start_mib=out["rss_start_bytes"] / MB)

        def toolwire_procs(r: int) -> None:
            trio.run(
                _toolwire_procs,
                srv["toolwire"],
                srv.token,
                f"procs-{r}",
                n_procs,
                sleep_s,
                m_done,
                m_peak,
                m_wall,
            )

        def trio_procs(r: int) -> None:
            trio.run(_trio_procs, n_procs, sleep_s, m_trio_wall, m_trio_peak)

        variants = [
            *(agent(v) for v in (memory_sqlite, memory_memory, memory_burst, toolwire_procs)),
            trio_procs,
        ]
        run_side_by_side(ctx, "scale", variants, repeats)

    res.comparisons = [
        Comparison(
            f"RSS of {chats:,} idle chats with {records} finished records each "
            "(SQLite journal, serve's default)",
            "rss_mb",
            None,
            goal=Goal("value<", 100.0, "< 100 MiB"),
        ),
        Comparison(
            "RSS of the same chats: SQLite journal vs memory journal (results on the heap)",
            "rss_mb",
            "rss_mb_memory",
        ),
        Comparison(
            "memory per further finished record: SQLite journal vs memory journal",
            "bytes_per_record",
            "bytes_per_record_memory",
        ),
        Comparison(
            "RSS of the same chats after a restart rebuilt them from the SQLite journal",
            "rss_mb_recovered",
            None,
        ),
        Comparison(
            f"RSS of the same chats filled {BURST_WINDOW:,} calls at a time (SQLite journal)",
            "rss_mb_burst",
            None,
        ),
        Comparison(
            f"{n_procs:,} concurrent processes: completed, none lost",
            "procs_completed",
            None,
            goal=Goal("value>=", float(n_procs), f"all {n_procs:,}"),
        ),
        Comparison(
            f"{n_procs:,} concurrent processes: peak alive at once vs bare trio",
            "procs_peak",
            "trio_procs_peak",
            goal=Goal("value>=", float(n_procs), f"{n_procs:,} held"),
        ),
        Comparison(
            f"{n_procs:,} x sleep {sleep_s:g}: wall time vs bare trio",
            "procs_wall_s",
            "trio_procs_wall_s",
        ),
    ]
    return res


def _scale_worker(
    ctx: BenchContext,
    workspace: Path,
    chats: int,
    records: int,
    journal: str,
    window: int,
    state_dir: Path | None = None,
    recover: bool = False,
) -> dict[str, float]:
    build = current_build()  # the worker is the agent: REF's with `--against`
    argv = [
        build.python,
        "-m",
        build.module("scale_worker"),
        "--workspace",
        str(workspace),
        "--chats",
        str(chats),
        "--records",
        str(records),
        "--journal",
        journal,
        "--window",
        str(window),
    ]
    if journal == "sqlite":
        argv += ["--state-dir", str(state_dir or ctx.scratch("scale-state"))]
    if recover:
        argv.append("--recover")
    out = subprocess.run(
        argv,
        capture_output=True,
        text=True,
        env=build.env if build.env is not None else child_env(),
        cwd=ctx.workdir,
        check=False,
    )
    if out.returncode != 0:
        raise RuntimeError(f"scale_worker failed: {out.stderr[-2000:]}")
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def max_overlap(intervals: list[tuple[float, float]]) -> int:
    """The most intervals open at one instant (an end at t closes before a start at t opens)."""
    edges = sorted([(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals])
    best = current = 0
    for _, step in edges:
        current += step
        best = max(best, current)
    return best


def _children(pid: int) -> int:
    """How many children `pid` has right now (Linux /proc/<pid>/task/*/children)."""
    count = 0
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                count += len(f.read().split())
    except OSError:
        pass
    return count


async def _sample_peak(pid: int, peak: list[int], rss: list[int] | None = None) -> None:
    """Sample until cancelled: the most children `pid` had beyond those it had at the start."""
    before = _children(pid)
    while True:
        peak[0] = max(peak[0], _children(pid) - before)
        if rss is not None:
            with contextlib.suppress(OSError):
                rss[0] = max(rss[0], rss_bytes(pid))
        await trio.sleep(SAMPLE_INTERVAL_S)


async def _toolwire_procs(
    server: ServerProcess,
    token: str,
    chat_prefix: str,
    n: int,
    sleep_s: float,
    m_done: Measurement,
    m_peak: Measurement,
    m_wall: Measurement,
) -> None:
    codec = Codec("json")
    command = f"sleep {sleep_s:g}"
    frames = [
        codec.call(
            f"{chat_prefix}-{i // CALLS_PER_CHAT}",
            f"s{i}",
            "execute",
            {"command": command},
            stream=False,
        )
        for i in range(n)
    ]
    peak = [0]
    rss = [0]
    completed = 0
    intervals: list[tuple[float, float]] = []
    async with (
        ws_connect(server.port, token=token, subprotocol=codec.subprotocol) as conn,
        trio.open_nursery() as nursery,
    ):
        nursery.start_soon(_sample_peak, server.pid, peak, rss)
        t0 = time.perf_counter()
        for frame in frames:
            await conn.ws.send_message(frame)
        results = 0
        while results < n:
            message = codec.decode(await conn.ws.get_message())
            if message.type == "error":
                raise UnexpectedReply(f"error {message.code}: {message.message}")
            if message.type != "result":
                continue
            results += 1
            data = message.data if isinstance(message.data, dict) else {}
            if message.outcome == "completed" and data.get("exit_code") == 0:
                completed += 1
            if message.started_at is not None and message.finished_at is not None:
                intervals.append((message.started_at, message.finished_at))
        wall = time.perf_counter() - t0
        nursery.cancel_scope.cancel()
    m_done.add(completed)
    m_peak.add(
        max_overlap(intervals), sampled_children_peak=peak[0], server_rss_peak_mib=rss[0] / MB
    )
    m_wall.add(wall)


async def _trio_procs(n: int, sleep_s: float, m_wall: Measurement, m_peak: Measurement) -> None:
    peak = [0]
    intervals: list[tuple[float, float]] = []

    async def one() -> None:
        start = time.time() * 1000
        await trio.run_process(["sleep", f"{sleep_s:g}"])
        intervals.append((start, time.time() * 1000))

    async with trio.open_nursery() as outer:
        outer.start_soon(_sample_peak, os.getpid(), peak)
        t0 = time.perf_counter()
        async with trio.open_nursery() as nursery:
            for _ in range(n):
                nursery.start_soon(one)
        wall = time.perf_counter() - t0
        outer.cancel_scope.cancel()
    m_wall.add(wall)
    m_peak.add(max_overlap(intervals), sampled_children_peak=peak[0])
