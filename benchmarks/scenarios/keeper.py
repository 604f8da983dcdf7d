"""Scenario `keeper`: what holding the commands so that they outlive the agent costs
(PROTOCOL.md 10.1; docs/architecture.md, "The keeper").

- **Memory.** The keeper's RSS idle (the first agent connected, nothing held) and holding N
  running commands; the difference per command.
- **Restart.** 1 and N commands running (each printed a line and sleeps), the agent killed with
  SIGKILL, a new `toolwire serve` started on the same state dir: the time from that start (the
  new process's exec) to the first `output` event of an `attach` from offset 0 of one of the
  commands, and, beside it, to its "listening" line (recovery and re-adoption done).

These rows start `toolwire serve` itself, on its defaults (SQLite journal, sync full, the
keeper): an operator's restart is what they are about. Its modules run from their bytecode
cache, as an installed package's do (pip compiles them at install): the scenario unsets
PYTHONDONTWRITEBYTECODE for it, since compiling toolwire's sources at each start (as this
checkout's editable install does under that variable) about doubles the start. There is no
baseline to divide by: no build before the keeper re-adopts anything, so with `--against` REF
has no side here.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import trio

from toolwire.benchmarks.core import (
    BenchContext,
    Comparison,
    Goal,
    ScenarioResult,
    run_side_by_side,
)
from toolwire.benchmarks.procs import child_env, rss_bytes
from toolwire.benchmarks.wire import Codec, ws_connect

# What each command does: one line, then nothing for longer than any run of this scenario.
COMMAND = "echo started; exec sleep 600"
# Commands per chat (a chat runs at most 64 processes, max_processes_per_chat).
PER_CHAT = 50
# A `toolwire serve` that has not said it listens by then is broken, not slow.
START_TIMEOUT_S = 60.0
# How long a stopped agent's keeper may take to exit once its commands are stopped.
KEEPER_EXIT_TIMEOUT_S = 10.0
GOAL_MS = 1000.0

_codec = Codec("json")


def run(ctx: BenchContext) -> ScenarioResult:
    res = ScenarioResult()
    many = ctx.size(100, 5)
    counts = (1, many)
    repeats = ctx.repeats(5)
    res.params = {
        "commands": list(counts),
        "command": COMMAND,
        "repeats": repeats,
        "bytecode": "cached (PYTHONDONTWRITEBYTECODE unset for the agent)",
    }
    first_output = {
        n: res.measurement(
            f"restart_output_n{n}",
            f"a restarted agent's start to a re-adopted call's first output, {n} running",
            "ms",
            higher_is_better=False,
        )
        for n in counts
    }
    listening = {
        n: res.measurement(
            f"restart_listening_n{n}",
            f"a restarted agent's start to its listening line, {n} running",
            "ms",
            higher_is_better=False,
        )
        for n in counts
    }
    idle = res.measurement(
        "keeper_rss_idle", "the keeper's RSS, nothing held", "MiB", higher_is_better=False
    )
    held = res.measurement(
        "keeper_rss_held",
        f"the keeper's RSS holding {many} commands",
        "MiB",
        higher_is_better=False,
    )
    per_process = res.measurement(
        "keeper_bytes_per_process",
        "the keeper's RSS per command held (held - idle) / N",
        "bytes",
        higher_is_better=False,
    )

    def restart(n: int) -> None:
        base = ctx.scratch(f"keeper-{n}")
        figures = _restart_once(base, n)
        first_output[n].add(figures["output_ms"])
        listening[n].add(figures["listening_ms"])
        if n == many:
            # Beside RSS, its private part (RssAnon: the heap, not the shared libraries).
            idle.add(
                figures["keeper_idle"] / 2**20, private_mib=figures["keeper_idle_anon"] / 2**20
            )
            held.add(
                figures["keeper_held"] / 2**20, private_mib=figures["keeper_held_anon"] / 2**20
            )
            per_process.add(
                (figures["keeper_held"] - figures["keeper_idle"]) / n,
                private_bytes=(figures["keeper_held_anon"] - figures["keeper_idle_anon"]) / n,
            )

    def variant(n: int) -> Callable[[int], None]:
        return lambda _repeat: restart(n)

    run_side_by_side(ctx, "keeper", [variant(n) for n in counts], repeats)
    for n in counts:
        res.comparisons.append(
            Comparison(
                f"a restarted agent's start to a re-adopted call's first output, {n} running",
                f"restart_output_n{n}",
                None,
                goal=Goal("value<", GOAL_MS, "< 1 s") if n == many else None,
            )
        )
    res.comparisons.append(
        Comparison(
            f"the keeper's RSS per command held ({many} held)", "keeper_bytes_per_process", None
        )
    )
    res.comparisons.append(Comparison("the keeper's RSS, nothing held", "keeper_rss_idle", None))
    if ctx.against is not None:
        res.notes.append("no REF rows: a build before the keeper re-adopts nothing")
    return res


class Serve:
    """`toolwire serve` on serve's defaults, port 0, in `base` (workspace and state dir)."""

    def __init__(self, base: Path) -> None:
        self.base = base
        (base / "ws").mkdir(exist_ok=True)
        self.started = time.perf_counter()
        with (base / "serve.log").open("ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "toolwire.cli.main", "serve", "--port", "0",
                 "--workspace", str(base / "ws"), "--state-dir", str(base / "state")],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=log,
                env={
                    k: v
                    for k, v in child_env().items()
                    if k not in ("TOOLWIRE_TOKEN", "PYTHONDONTWRITEBYTECODE")
                },
            )  # fmt: skip
        self.port = self._listening()
        self.listening_at = time.perf_counter()
        self.token = (base / "state" / "token").read_text().strip()

    def _listening(self) -> int:
        assert self.proc.stdout is not None
        line = b""
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            ready, _, _ = select.select([self.proc.stdout], [], [], 0.5)
            if ready:
                line = self.proc.stdout.readline()
                break
            if self.proc.poll() is not None:
                break
        text = line.decode()
        if "listening on" not in text:
            self.kill()
            tail = (self.base / "serve.log").read_text()[-2000:]
            raise RuntimeError(f"toolwire serve did not listen ({text!r}): {tail}")
        return int(text.rsplit(":", 1)[1].split("/", 1)[0])

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()

    def stop(self) -> None:
        """SIGTERM: serve's default stop ends every command, and the keeper exits after."""
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(START_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()


def _restart_once(base: Path, n: int) -> dict[str, float]:
    first = Serve(base)
    try:
        keeper = keeper_pid(base / "state" / "keeper")
        keeper_idle = rss_bytes(keeper)
        keeper_idle_anon = rss_bytes(keeper, "RssAnon")
        trio.run(_start_commands, first.port, first.token, n)
        keeper_held = rss_bytes(keeper)
        keeper_held_anon = rss_bytes(keeper, "RssAnon")
    finally:
        first.kill()
    second = Serve(base)
    try:
        output_at = trio.run(_first_output, second.port, second.token, n // 2)
    finally:
        second.stop()
        _wait_gone(keeper)
    return {
        "output_ms": (output_at - second.started) * 1000,
        "listening_ms": (second.listening_at - second.started) * 1000,
        "keeper_idle": keeper_idle,
        "keeper_held": keeper_held,
        "keeper_idle_anon": keeper_idle_anon,
        "keeper_held_anon": keeper_held_anon,
    }


async def _start_commands(port: int, token: str, n: int) -> None:
    """`n` calls of COMMAND, back once each printed its line."""
    async with ws_connect(port, token=token, subprotocol=_codec.subprotocol) as conn:
        for i in range(n):
            await conn.ws.send_message(
                _codec.call(
                    f"c{i // PER_CHAT}", f"k{i}", "execute", {"command": COMMAND}, stream=True
                )
            )
        printed: set[str] = set()
        while len(printed) < n:
            message = _codec.decode(await conn.ws.get_message())
            if message.type == "output" and message.call_id is not None:
                printed.add(message.call_id)
            elif message.type in ("error", "result"):
                raise RuntimeError(f"a command ended before the restart: {message}")


async def _first_output(port: int, token: str, i: int) -> float:
    """When the first `output` of an `attach` of command `i` from offset 0 arrived."""
    async with ws_connect(port, token=token, subprotocol=_codec.subprotocol) as conn:
        attach = {"type": "attach", "chat_id": f"c{i // PER_CHAT}", "call_id": f"k{i}",
                  "from_offset": 0}  # fmt: skip
        await conn.ws.send_message(_codec.encode(attach))
        while True:
            message = _codec.decode(await conn.ws.get_message())
            if message.type == "output":
                return time.perf_counter()
            if message.type in ("error", "result"):
                raise RuntimeError(f"the re-adopted call answered {message}")


def keeper_pid(keeper_dir: Path) -> int:
    """The pid of the keeper of `keeper_dir` (its command line names the directory)."""
    wanted = str(keeper_dir).encode()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            argv = Path(f"/proc/{name}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"toolwire.actors.keeper" in argv and wanted in argv:
            return int(name)
    raise RuntimeError(f"no keeper runs for {keeper_dir}")


def _wait_gone(pid: int) -> None:
    """Until the keeper exited (its commands stopped), so the next run meets no leftover."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    try:
        select.select([fd], [], [], KEEPER_EXIT_TIMEOUT_S)
    finally:
        os.close(fd)
