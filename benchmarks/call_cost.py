"""What one trivial call costs the agent's process, in measures this shared machine's load does
not move: `python -m toolwire.benchmarks.call_cost [--against REF]... [--journal
memory|sqlite|both] [--calls LOW,HIGH] [--count-calls N] [--profile-calls N] [--no-callgrind]
[--no-cprofile] [--keep DIR] [--json PATH]`. The trivial call is the transport scenario's:
`read_file` of a 300-byte file, `stream: false`, 64 in flight on one connection.

- Instructions per call: valgrind's callgrind counts every instruction the server's process
  runs (all its threads), whatever else the machine does. The benchmark server runs under
  `valgrind --tool=callgrind` twice, once answering LOW and once HIGH calls; (HIGH's count -
  LOW's) / (HIGH - LOW) is one call's share: start-up, imports and shutdown are in both runs
  and drop out of the difference.
- Bytecodes per call, by component: the server runs under `profile_probe.py`, whose tracer
  counts the bytecodes each function runs over N calls (after a warm-up); each function goes
  to one component by `COMPONENTS`. Also the same on a busy machine as on a quiet one, and
  the interpreter's share of the instructions follows them (some 95 instructions a bytecode
  here, on both builds).
- cProfile's shares, by the same components: the profiler switched on by the same probe for
  a fixed count of calls. Times, so they move with the machine's load; and cProfile adds a
  fixed cost to every Python call, so its shares lean towards code that makes many small
  calls. They say where the time goes; the counts say how much work there is.

All of it on the working tree's agent and, with `--against REF` (repeatable), on REF's, built
as `toolwire bench --against` builds it (`benchmarks/against.py`, sharing its cache). Not a
`toolwire bench` scenario: under callgrind a run takes minutes, and its numbers need no quiet
machine.
"""

from __future__ import annotations

import argparse
import json
import pstats
import re
import secrets
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import trio

from toolwire.benchmarks.core import TREE, Build
from toolwire.benchmarks.procs import PROFILE_PROBE_SCRIPT, ServerProcess, child_env
from toolwire.benchmarks.scenarios.common import SMALL_FILE, SMALL_FILE_TEXT, TRIVIAL_ARGS
from toolwire.benchmarks.wire import Codec, pipelined_calls, ws_connect

WINDOW = 64
# Under callgrind Python runs some 50-100 times slower: imports alone take tens of seconds.
VALGRIND_TIMEOUT_S = 900.0
WARMUP_CALLS = 300

# (component, file pattern, function name pattern): a profiled function's own time (and a
# traced one's bytecodes) goes to the first row whose patterns match its file (searched) and its
# name (matched whole). The names: decode and bounds (the message parsed and checked),
# ids, admission (the chat deciding to take the call and running its bookkeeping: the tool's
# args checked, its record's state moved), journal row (the record of the call kept and
# journaled), followers and outbox (the reply routed to the connections that follow the call
# and queued), encode (domain events made into frames), send (frames written to the socket);
# beside them: receive (the socket read, WebSocket frames parsed), the tool itself, metrics and
# logs, trio's scheduler. A C function (cProfile's `~`) goes to its callers' components.
_CHAT = r"actors/(chat|chat_state)\.py"
COMPONENTS: tuple[tuple[str, str, str], ...] = (
    ("receive", r"trio_websocket/|wsproto/|transport/ws_private\.py|transport/message_bytes\.py"
     r"|<frozen codecs>", r".*"),
    ("receive", r"transport/connection\.py", r".*"),
    ("receive", r"transport/(buffered|http_status)\.py|trio/_highlevel_socket\.py|trio/_socket\.py",
     r"receive_some|_nonblocking_helper|wrapper"),
    ("ids", r"transport/ids\.py", r".*"),
    ("ids", r"transport/protocol\.py", r".*id.*"),
    ("decode and bounds", r"transport/(codec|bounds|outline|big_messages)\.py",
     r"decode|_may_exceed|may_exceed.*|_has_long_digit_run|check_bounds|_check_bounds|outline.*"
     r"|prepare.*"),
    ("decode and bounds", r"transport/server\.py", r"on_message|_dispatch|backlogged"),
    ("encode", r"transport/server\.py", r"to_wire|_result_fields|wire_result|<listcomp>"),
    ("encode", r"transport/(codec|frames)\.py", r".*"),
    ("send", r"transport/server\.py", r"send|_sender|_progressed"),
    ("send", r"transport/buffered\.py", r".*"),
    ("metrics and logs", r"actors/(metrics|observe)\.py|transport/(metrics|access_log)\.py"
     r"|logging/", r".*"),
    ("journal row", r"actors/(journal|journal_rows|journal_effects|records|chat_journal)\.py",
     r".*"),
    ("journal row", _CHAT, r".*(journal|durable|_row).*"),
    ("followers and outbox", r"actors/(followers|outbox|results|call_results|events|result_cache"
     r"|result_lane)\.py", r".*"),
    ("followers and outbox", _CHAT, r"_subscribe|_publish.*|_report_result|_maybe_close_output"
     r"|_maybe_release|_follow.*|_send.*|_deliver.*|_wake_replies|_settle|<lambda>"),
    ("the tool (read_file)", r"actors/tools/files\.py", r"(?!check_args|_check_).*"),
    ("the tool (read_file)", r"posixpath|genericpath", r".*"),
    ("admission", r"actors/|transport/server\.py", r".*"),
    ("trio scheduler", r"trio/|outcome/|sniffio/|selectors|<string>|<attrs generated", r".*"),
)  # fmt: skip


@dataclass
class Cost:
    """One build's numbers on one journal."""

    build: str
    journal: str
    calls: tuple[int, int] = (0, 0)
    instructions: tuple[int, int] = (0, 0)
    profile_calls: int = 0
    count_calls: int = 0
    entries: dict[str, float] = field(default_factory=dict)  # component -> per call
    bytecodes: dict[str, float] = field(default_factory=dict)  # component -> per call
    profile_s: float = 0.0
    shares: dict[str, float] = field(default_factory=dict)  # component -> fraction of profile_s
    top: list[tuple[str, float]] = field(default_factory=list)  # function -> tottime seconds

    @property
    def per_call(self) -> float:
        (lo, hi), (i_lo, i_hi) = self.calls, self.instructions
        return (i_hi - i_lo) / (hi - lo) if hi > lo else 0.0


def server_args(build: Build, journal: str, workspace: Path, state: Path, token: str) -> list[str]:
    args = [f"--workspace={workspace}", f"--journal={journal}", f"--token={token}"]
    if journal == "sqlite":
        args.append(f"--state-dir={state}")
    if build.is_ref:
        from toolwire.benchmarks.against import server_args as shimmed

        args = shimmed(build, args, "toolwire")
    return args


async def _calls(port: int, token: str, chat: str, n: int, warmup: int = 0) -> None:
    codec = Codec("json")
    frames = [codec.call(chat, f"c{i}", "read_file", TRIVIAL_ARGS, stream=False) for i in range(n)]
    warm = [
        codec.call(chat, f"w{i}", "read_file", TRIVIAL_ARGS, stream=False) for i in range(warmup)
    ]
    async with ws_connect(port, token=token, subprotocol=codec.subprotocol) as conn:
        if warm:
            await pipelined_calls(conn, codec, warm, WINDOW)
        done = await pipelined_calls(conn, codec, frames, WINDOW)
    if done != n:
        raise RuntimeError(f"{done} of {n} calls answered")


def _tag(build: Build) -> str:
    """A build's name in file names: REF's commit (several REFs may be measured at once)."""
    return build.commit[:12] if build.commit else build.key


class Bench:
    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.token = secrets.token_urlsafe(24)
        self.workspace = workdir / "workspace"
        self.workspace.mkdir(exist_ok=True)
        (self.workspace / SMALL_FILE).write_text(SMALL_FILE_TEXT)
        self._runs = 0

    def _state(self) -> Path:
        self._runs += 1
        state = self.workdir / f"state-{self._runs}"
        state.mkdir()
        return state

    def _env(self, build: Build) -> dict[str, str]:
        return build.env if build.env is not None else child_env()

    def instructions(self, build: Build, journal: str, n: int) -> int:
        """The server's instruction count over its whole life, having answered `n` calls."""
        out = self.workdir / f"callgrind-{_tag(build)}-{journal}-{n}.out"
        server = ServerProcess(
            build.python,
            build.module("toolwire_server"),
            server_args(build, journal, self.workspace, self._state(), self.token),
            self.workdir,
            env=self._env(build),
            launcher=["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}"],
            ready_timeout_s=VALGRIND_TIMEOUT_S,
            stop_timeout_s=VALGRIND_TIMEOUT_S,
        )
        try:
            trio.run(_calls, server.port, self.token, "cost", n)
        finally:
            server.stop()
        match = re.search(r"^totals:\s*(\d+)", out.read_text(), re.M)
        if match is None:
            raise RuntimeError(f"{out}: no totals line (did callgrind finish?)")
        return int(match.group(1))

    def opcodes(self, build: Build, journal: str, n: int) -> dict[str, list[int]]:
        """Per function, over `n` calls after a warm-up: [entries, bytecodes run]."""
        out = self.workdir / f"opcodes-{_tag(build)}-{journal}-{n}.json"
        server = ServerProcess(
            build.python,
            build.module("toolwire_server"),
            server_args(build, journal, self.workspace, self._state(), self.token),
            self.workdir,
            env=self._env(build),
            probe=PROFILE_PROBE_SCRIPT,
        )
        try:
            trio.run(_calls, server.port, self.token, "warm", WARMUP_CALLS)
            server.control("count")
            trio.run(_calls, server.port, self.token, "cost", n)
            server.control(f"stop-count {out}", timeout_s=VALGRIND_TIMEOUT_S)
        finally:
            server.stop()
        counts: dict[str, list[int]] = json.loads(out.read_text())
        return counts

    def profile(self, build: Build, journal: str, n: int) -> pstats.Stats:
        out = self.workdir / f"cprofile-{_tag(build)}-{journal}-{n}.pstats"
        server = ServerProcess(
            build.python,
            build.module("toolwire_server"),
            server_args(build, journal, self.workspace, self._state(), self.token),
            self.workdir,
            env=self._env(build),
            probe=PROFILE_PROBE_SCRIPT,
        )
        try:
            trio.run(_calls, server.port, self.token, "warm", WARMUP_CALLS)
            server.control("start")
            trio.run(_calls, server.port, self.token, "cost", n)
            server.control(f"stop {out}")
        finally:
            server.stop()
        return pstats.Stats(str(out))


def component_of(path: str, name: str) -> str:
    for component, path_re, name_re in COMPONENTS:
        if re.search(path_re, path) and re.fullmatch(name_re, name):
            return component
    return "other"


def breakdown(stats: pstats.Stats) -> tuple[float, dict[str, float], list[tuple[str, float]]]:
    """Total own time, each component's share of it, and the costliest functions. A C
    function's time (file `~`) is split among its callers' components, by the time each
    caller's calls of it took."""
    per: dict[str, float] = {}
    funcs: list[tuple[str, float]] = []
    raw = stats.stats  # type: ignore[attr-defined]  # pstats keeps them here, undocumented
    for (path, line, name), (_cc, _nc, tottime, _ct, callers) in raw.items():
        if path == "~" and callers:
            for (c_path, _c_line, c_name), caller_stats in callers.items():
                component = component_of(c_path, c_name)
                per[component] = per.get(component, 0.0) + caller_stats[2]
            component = "(by callers)"
        else:
            component = component_of(path, name)
            per[component] = per.get(component, 0.0) + tottime
        short = re.sub(r".*/(site-packages|src|toolwire)/", "", path)
        funcs.append((f"{short}:{line}({name}) [{component}]", tottime))
    total = sum(per.values()) or 1.0
    funcs.sort(key=lambda item: -item[1])
    return total, {k: v / total for k, v in sorted(per.items(), key=lambda kv: -kv[1])}, funcs[:40]


def measure(
    bench: Bench,
    build: Build,
    journal: str,
    calls: tuple[int, int],
    profile_calls: int,
    count_calls: int,
    callgrind: bool,
    cprofile: bool,
) -> Cost:
    cost = Cost(build.label, journal)
    if callgrind:
        cost.calls = calls
        cost.instructions = (
            bench.instructions(build, journal, calls[0]),
            bench.instructions(build, journal, calls[1]),
        )
    if count_calls:
        cost.count_calls = count_calls
        for key, (entered, ran) in bench.opcodes(build, journal, count_calls).items():
            path, _, rest = key.rpartition(":")
            _line, _, name = rest.partition("(")
            component = component_of(path, name[:-1])
            cost.entries[component] = cost.entries.get(component, 0.0) + entered / count_calls
            cost.bytecodes[component] = cost.bytecodes.get(component, 0.0) + ran / count_calls
    if cprofile:
        stats = bench.profile(build, journal, profile_calls)
        cost.profile_calls = profile_calls
        cost.profile_s, cost.shares, cost.top = breakdown(stats)
    return cost


def _order(component: str) -> int:
    names = [name for name, _path, _fn in COMPONENTS]
    return names.index(component) if component in names else len(names)


def table(costs: Sequence[Cost]) -> str:
    """Markdown: a column per build and journal; per component, the bytecodes it ran per call
    and its share of cProfile's time."""
    components = sorted({c for cost in costs for c in [*cost.shares, *cost.bytecodes]}, key=_order)
    rows = [
        "| per trivial call | " + " | ".join(f"{c.build}, {c.journal}" for c in costs) + " |",
        "|---|" + "---:|" * len(costs),
        "| instructions (callgrind) | "
        + " | ".join(f"{c.per_call:,.0f}" if c.per_call else "" for c in costs)
        + " |",
        "| Python function entries | "
        + " | ".join(f"{sum(c.entries.values()):,.0f}" if c.entries else "" for c in costs)
        + " |",
        "| bytecodes | "
        + " | ".join(f"{sum(c.bytecodes.values()):,.0f}" if c.bytecodes else "" for c in costs)
        + " |",
    ]
    for component in components:
        cells = []
        for c in costs:
            parts = []
            if c.bytecodes:
                parts.append(f"{c.bytecodes.get(component, 0.0):,.0f}")
            if c.shares:
                parts.append(f"{c.shares.get(component, 0.0):.0%}")
            cells.append(" / ".join(parts))
        rows.append(f"| {component} (bytecodes / cProfile share) | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m toolwire.benchmarks.call_cost")
    parser.add_argument(
        "--against", metavar="REF", action="append", default=[],
        help="also measure REF's agent (repeatable)",
    )  # fmt: skip
    parser.add_argument(
        "--journal", choices=["memory", "sqlite", "both"], default="both",
        help="the memory journal, serve's default (sqlite, sync full), or both",
    )  # fmt: skip
    parser.add_argument("--calls", default="500,1500", help="LOW,HIGH calls under callgrind")
    parser.add_argument("--profile-calls", type=int, default=4000)
    parser.add_argument(
        "--count-calls", type=int, default=500, help="calls traced for bytecode counts (0: none)"
    )
    parser.add_argument("--no-callgrind", action="store_true")
    parser.add_argument("--no-cprofile", action="store_true")
    parser.add_argument("--keep", type=Path, help="keep the raw outputs in this directory")
    parser.add_argument("--json", type=Path, help="write the numbers here")
    args = parser.parse_args(argv)
    lo, hi = (int(x) for x in args.calls.split(","))
    if not 0 <= lo < hi:
        parser.error(f"--calls {args.calls!r}: want LOW,HIGH with 0 <= LOW < HIGH")
    if not args.no_callgrind and shutil.which("valgrind") is None:
        parser.error("valgrind is not on PATH (or pass --no-callgrind)")
    builds = [TREE]
    if args.against:
        from toolwire.benchmarks.against import build

        builds += [build(ref, report=print) for ref in args.against]
    journals = ["memory", "sqlite"] if args.journal == "both" else [args.journal]
    workdir = args.keep or Path(tempfile.mkdtemp(prefix="call-cost-"))
    workdir.mkdir(parents=True, exist_ok=True)
    bench = Bench(workdir)
    costs = []
    try:
        for journal in journals:
            for b in builds:
                print(f"measuring {b.label} on the {journal} journal", flush=True)
                cost = measure(
                    bench, b, journal, (lo, hi), args.profile_calls, args.count_calls,
                    not args.no_callgrind, not args.no_cprofile,
                )  # fmt: skip
                costs.append(cost)
                print(f"  {cost.per_call:,.0f} instructions per call {cost.instructions}")
                for name, seconds in cost.top[:25]:
                    print(f"  {seconds * 1e6 / max(cost.profile_calls, 1):8.1f} us  {name}")
    finally:
        if args.keep is None:
            shutil.rmtree(workdir)
    print(table(costs))
    if args.json:
        args.json.write_text(
            json.dumps([asdict(c) | {"per_call": c.per_call} for c in costs], indent=2) + "\n"
        )


if __name__ == "__main__":
    main()
