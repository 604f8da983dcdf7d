"""Scenario `abuse`: another chat's trivial calls while one client attacks the agent (issue 27).

An authenticated but careless client (a model writes the regexes and the id lists) must never
hold up the agent's other chats: no single request, of any size within the limits, may delay
another chat's trivial call by more than 100 ms. Four attacks, each from a process of its own
(`benchmarks/abuse_load.py`, which says exactly what each sends):

- **redos**: `search_files` of `(a+)+$` over a file of `"a" * 28 + "b"` (a backtracking engine
  takes seconds and doubles with each further "a"), cancelled after 1 s;
- **cancel**: one `cancel` of 20,000 ids never called;
- **flood**: 5,000 chats, one `read_file` call each, sent as fast as the socket takes them;
- **big**: 20 connections sending a 16 MiB `write_file` message each, at once.

Per repeat, in a rotated order, each attack and a run with no attack ("alone") get a fresh
agent on `toolwire serve`'s defaults (SQLite journal, sync full; with `--against REF`, then
once more on a fresh agent of REF's), so no attack pays for another's leftovers and the
agent's peak RSS is the attack's own. The measured chat sends a trivial call
(`read_file` of a 300-byte file, `stream: false`) every PROBE_INTERVAL_S over one connection,
each timed from when it was due to its result (`bigwrite.trivial_latencies` says why a fixed
rate), from the attack's start until the attack is answered, for at least `Window.least_s`
and at most `Window.bound_s`; calls still out then get `Window.grace_s` more, and the agent is
killed: on code that an attack freezes (a regex holding the GIL, a quadratic loop), the run
stays bounded. A call still unanswered then counts its latency until that moment, a lower
bound, and the attack's own answer time is capped at the bound (`answered` says whether it
came).

Reported per attack: the measured chat's worst and p99 latency during it, against alone (goal:
worst below 100 ms), how long the attack took to be answered, and the agent's peak RSS
(`VmHWM`) against alone. And the agent's loop lag over the same window (every agent runs
under the loop-lag probe, `benchmarks/loop_lag.py`): how late a 1 ms ticker on the agent's
own loop woke, worst and p99. That is the delay the attack put on every other chat, apart from
what a trivial call waits for anyway: on serve's defaults each call's result waits for its
commit's fsync, and this machine's virtual disk now and then takes tens of milliseconds for
one with no attack at all (the alone row's worst), which no agent code can shorten.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import shutil
import subprocess
import threading
from dataclasses import dataclass
from typing import Any

import trio

from toolwire.benchmarks.abuse_load import BIG_CONNECTIONS, FLOOD_PATH, REDOS_FILE, REDOS_PATTERN
from toolwire.benchmarks.core import (
    BenchContext,
    Comparison,
    Goal,
    Measurement,
    ScenarioResult,
    agent,
    run_side_by_side,
)
from toolwire.benchmarks.procs import READY_TIMEOUT_S, ServerProcess, child_env, rss_bytes
from toolwire.benchmarks.scenarios.common import SMALL_FILE, TRIVIAL_ARGS, servers
from toolwire.benchmarks.scenarios.journal import add_latencies
from toolwire.benchmarks.wire import Codec, await_result, check_completed, ws_connect

MIB = 1024 * 1024
assert FLOOD_PATH == SMALL_FILE  # the flood reads the file every workspace has
AGENT = "toolwire"  # serve's defaults: the SQLite journal, sync full
# The probe sent one call every 100 ms; five times as often gives a p99 of its own
# (250 calls in a window) and still loads the agent with nothing but 50 calls a second.
PROBE_INTERVAL_S = 0.02
# Issue 27's goal: no single request delays another chat's trivial call by more than this.
GOAL_MS = 100.0


@dataclass(frozen=True)
class Attack:
    key: str
    size: int  # what `abuse_load.py --size` takes: "a"s, ids, chats, bytes per message
    quick_size: int

    def label(self, size: int) -> str:
        if self.key == "redos":
            return f'ReDoS search_files "{REDOS_PATTERN}" over "a"*{size}+"b"'
        if self.key == "cancel":
            return f"one cancel of {size:,} unknown ids"
        if self.key == "flood":
            return f"{size:,} chats of one call each"
        return f"{BIG_CONNECTIONS} concurrent {round(size / MIB)} MiB write_file messages"


ATTACKS = (
    Attack("redos", 28, 18),
    Attack("cancel", 20_000, 2_000),
    Attack("flood", 5_000, 300),
    # 16 MiB less 1 KiB: room for the message around the content (as bigwrite).
    Attack("big", 16 * MIB - 1024, MIB),
)


@dataclass(frozen=True)
class Window:
    """How long the measured chat's calls go on, counted from the attack's start."""

    least_s: float  # at least this long, however fast the attack was answered
    bound_s: float  # at most this long: then the agent is stopped, answered or not
    grace_s: float  # calls still out when the calls stop get this much more


class Attacker:
    """`benchmarks/abuse_load.py` connected to one agent, its attack held until `go()`; a
    thread reads what it prints, so `answered` is set the moment it says ANSWERED."""

    def __init__(
        self, ctx: BenchContext, server: ServerProcess, token: str, attack: Attack, size: int,
        bound_s: float,
    ) -> None:  # fmt: skip
        self._log = (ctx.workdir / f"abuse-{attack.key}.log").open("ab")
        self.proc = subprocess.Popen(
            [ctx.python, "-m", "toolwire.benchmarks.abuse_load", f"--port={server.port}",
             f"--token={token}", f"--attack={attack.key}", f"--size={size}",
             f"--bound-s={bound_s}"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log,
            cwd=str(ctx.workdir), env=child_env(),
        )  # fmt: skip
        self.ready = threading.Event()
        self.answered = threading.Event()
        self._lines: list[bytes] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        if not self.ready.wait(READY_TIMEOUT_S):
            self.proc.kill()
            self.proc.wait()
            self._log.close()
            raise RuntimeError(f"the attacker did not connect (exit {self.proc.poll()})")

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            word = line.strip()
            if word == b"READY":
                self.ready.set()
            elif word == b"ANSWERED":
                self.answered.set()
            else:
                self._lines.append(line)

    def go(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(b"go\n")
        self.proc.stdin.flush()

    def finish(self, bound_s: float) -> dict[str, Any]:
        """Its report, once its own bound has passed at the latest."""
        try:
            self.proc.wait(timeout=bound_s + 30)
            self._reader.join(timeout=30)
        finally:
            self._log.close()
        if self.proc.returncode != 0 or not self._lines:
            raise RuntimeError(f"the attacker failed ({self.proc.returncode})")
        report: dict[str, Any] = json.loads(self._lines[-1])
        return report


@dataclass
class Probe:
    samples: list[float]  # ms from due to result; unanswered calls until the agent was stopped
    unanswered: int
    peak_rss: int  # the agent's VmHWM just before it was stopped
    seconds: float  # how long calls were sent for
    # The loop-lag probe's window over the same time (`ServerProcess.loop_lag`); None when the
    # agent's loop did not answer for it (frozen: its lag is then at least `seconds`).
    lag: dict[str, float] | None


def probe(server: ServerProcess, token: str, window: Window, attacker: Attacker | None) -> Probe:
    """The measured chat's trivial calls from the attack's start, for `window.least_s` or until
    the attack is answered, whichever is later, but never beyond `window.bound_s`; then the
    agent is killed (it may be frozen) after its peak RSS is read."""
    codec = Codec("json")

    async def main() -> Probe:
        samples: list[float] = []
        due: dict[str, float] = {}
        all_in = trio.Event()
        sending = True
        async with ws_connect(server.port, token=token, subprotocol=codec.subprotocol) as conn:
            for i in range(20):
                frame = codec.call("probe", f"warm{i}", "read_file", TRIVIAL_ARGS, stream=False)
                await conn.ws.send_message(frame)
                check_completed(await await_result(conn, codec, f"warm{i}"))

            async def receive() -> None:
                while True:
                    message = codec.decode(await conn.ws.get_message())
                    check_completed(message)
                    if message.type == "result" and message.call_id in due:
                        samples.append((trio.current_time() - due.pop(message.call_id)) * 1000)
                        if not sending and not due:
                            all_in.set()

            stop = trio.Event()

            async def until_answered() -> None:
                if attacker is not None:
                    await trio.to_thread.run_sync(
                        attacker.answered.wait, window.bound_s, abandon_on_cancel=True
                    )
                await trio.sleep_until(start + window.least_s)
                stop.set()

            async with trio.open_nursery() as nursery:
                nursery.start_soon(receive)
                server.loop_lag()  # a new window: the ticks from the attack's start
                start = trio.current_time()
                if attacker is not None:
                    attacker.go()
                nursery.start_soon(until_answered)
                sent = 0
                # The bound cancels a send only when the agent stopped reading: that call was
                # due all the same, and counts as unanswered.
                with trio.move_on_at(start + window.bound_s):
                    while True:
                        at = start + sent * PROBE_INTERVAL_S
                        await trio.sleep_until(at)
                        if stop.is_set():
                            break
                        call_id = f"c{sent}"
                        due[call_id] = at
                        sent += 1
                        frame = codec.call("probe", call_id, "read_file", TRIVIAL_ARGS,
                                           stream=False)  # fmt: skip
                        await conn.ws.send_message(frame)
                stopped = trio.current_time()
                sending = False
                if due:
                    with trio.move_on_after(window.grace_s):
                        await all_in.wait()
                end = trio.current_time()
                unanswered = [(end - at) * 1000 for at in due.values()]
                lag: dict[str, float] | None = None
                # RuntimeError: its loop is still held, and there is no window to read.
                with contextlib.suppress(RuntimeError):
                    lag = json.loads(server.control("lag", timeout_s=window.grace_s))
                peak = rss_bytes(server.pid, "VmHWM")
                server.proc.kill()  # bounded, whatever the attack left the agent doing
                server.proc.wait()
                nursery.cancel_scope.cancel()
        return Probe(samples + unanswered, len(unanswered), peak, stopped - start, lag)

    return trio.run(main)


def run(ctx: BenchContext) -> ScenarioResult:
    res = ScenarioResult()
    window = Window(ctx.seconds(5.0, 1.0), ctx.seconds(15.0, 3.0), ctx.seconds(2.0, 1.0))
    # Quick: one repeat (the smoke test runs every scenario; five fresh agents are enough).
    repeats = 1 if ctx.quick else 3
    sizes = {a.key: ctx.size(a.size, a.quick_size) for a in ATTACKS}
    labels = {a.key: a.label(sizes[a.key]) for a in ATTACKS}
    res.params = {
        "calls_for_at_least_s": window.least_s,
        "bound_s": window.bound_s,
        "grace_s": window.grace_s,
        "repeats": repeats,
        "trivial_call": {"tool": "read_file", "args": TRIVIAL_ARGS, "stream": False},
        "trivial_calls_every_ms": PROBE_INTERVAL_S * 1000,
        "agent": "toolwire serve's defaults (SQLite journal, sync full), a fresh one per run",
        "attacks": {a.key: {"label": labels[a.key], "size": sizes[a.key]} for a in ATTACKS},
        "redos_pattern": REDOS_PATTERN,
    }
    res.notes.append(
        f"The measured chat's calls run from the attack's start until it is answered, at least "
        f"{window.least_s:g} s and at most {window.bound_s:g} s; calls still out then get "
        f"{window.grace_s:g} s more, then the agent is killed. A call unanswered at that point "
        "counts its latency until then (a lower bound), and an attack not answered within the "
        f"bound counts {window.bound_s:g} s as its answer time (answered = 0)."
    )
    alone = res.measurement(
        "trivial_alone", "other chat's trivial call, no attack", "ms", higher_is_better=False
    )
    alone_rss = res.measurement(
        "rss_alone_mb", "agent's peak RSS, no attack", "MiB", higher_is_better=False
    )

    def lag(name: str, label: str) -> Measurement:
        return res.measurement(name, f"agent loop lag, {label}", "ms", higher_is_better=False)

    alone_lag = lag("loop_lag_worst_alone", "worst, no attack")
    alone_lag_p99 = lag("loop_lag_p99_alone", "p99, no attack")
    during_lag = {a.key: lag(f"loop_lag_worst_{a.key}", f"worst, {labels[a.key]}") for a in ATTACKS}
    during_lag_p99 = {a.key: lag(f"loop_lag_p99_{a.key}", f"p99, {labels[a.key]}") for a in ATTACKS}
    during: dict[str, Measurement] = {}
    answered: dict[str, Measurement] = {}
    rss: dict[str, Measurement] = {}
    for a in ATTACKS:
        during[a.key] = res.measurement(
            f"toolwire_during_{a.key}", f"other chat's trivial call during {labels[a.key]}", "ms",
            higher_is_better=False,
        )  # fmt: skip
        answered[a.key] = res.measurement(
            f"toolwire_answered_{a.key}", f"{labels[a.key]}: answered after", "ms",
            higher_is_better=False,
        )  # fmt: skip
        rss[a.key] = res.measurement(
            f"toolwire_rss_{a.key}_mb", f"agent's peak RSS, {labels[a.key]}", "MiB",
            higher_is_better=False,
        )  # fmt: skip

    def record(m: Measurement, got: Probe, rss_m: Measurement, key: str | None) -> None:
        add_latencies(m, got.samples)
        worst_lag = alone_lag if key is None else during_lag[key]
        p99_lag = alone_lag_p99 if key is None else during_lag_p99[key]
        if got.lag is None:  # frozen: at least the whole window, and no p99 to give
            worst_lag.add(got.seconds * 1000, answered=0.0)
        else:
            worst_lag.add(got.lag["worst_ms"], answered=1.0, ticks=got.lag["ticks"])
            p99_lag.add(got.lag["p99_ms"], p50_ms=got.lag["p50_ms"])
        # add_extra, not m.extra: while a variant runs for REF, its numbers go to REF's twin
        m.add_extra("worst_ms", max(got.samples))
        m.add_extra("unanswered", float(got.unanswered))
        m.add_extra("calls_for_s", got.seconds)
        rss_m.add(got.peak_rss / MIB)

    def measure(attack: Attack | None, r: int) -> None:
        # A directory per run, removed after it: the big attack leaves 320 MiB of files and as
        # much in the journal.
        own = ctx.scratch(f"abuse-{attack.key if attack else 'alone'}-{r}")
        run_ctx = dataclasses.replace(ctx, workdir=own)
        try:
            with servers(run_ctx, AGENT, current_only=True, loop_lag=True) as srv:
                server = srv[AGENT]
                if attack is None:
                    record(alone, probe(server, srv.token, window, None), alone_rss, None)
                    return
                if attack.key == "redos":
                    (srv.workspace / REDOS_FILE).write_text("a" * sizes["redos"] + "b")
                attacker = Attacker(run_ctx, server, srv.token, attack, sizes[attack.key],
                                    window.bound_s)  # fmt: skip
                try:
                    got = probe(server, srv.token, window, attacker)
                finally:
                    report = attacker.finish(window.bound_s)
                record(during[attack.key], got, rss[attack.key], attack.key)
                came = report["answered_ms"] is not None
                answered[attack.key].add(
                    report["answered_ms"] if came else window.bound_s * 1000,
                    answered=float(came),
                    answers=float(report["answers"]),
                )
                answered[attack.key].add_note(f"repeat {r + 1}: {report['codes']}")
        finally:
            shutil.rmtree(own, ignore_errors=True)

    # `agent`: with `--against REF` each also runs on a fresh agent of REF's.
    variants = [agent(lambda r: measure(None, r))]
    variants += [agent(lambda r, a=a: measure(a, r)) for a in ATTACKS]
    run_side_by_side(ctx, "abuse", variants, repeats)

    goal = Goal("value<", GOAL_MS, f"< {GOAL_MS:g} ms")
    for a in ATTACKS:
        res.comparisons += [
            Comparison(f"other chat's worst trivial call during {labels[a.key]} vs alone",
                       f"toolwire_during_{a.key}", "trivial_alone", stat="worst", goal=goal),
            Comparison(f"other chat's trivial call p99 during {labels[a.key]} vs alone",
                       f"toolwire_during_{a.key}", "trivial_alone", stat="p99"),
            Comparison(f"{labels[a.key]}: answered after (capped at {window.bound_s:g} s)",
                       f"toolwire_answered_{a.key}", None),
            Comparison(f"agent's peak RSS during {labels[a.key]} vs alone",
                       f"toolwire_rss_{a.key}_mb", "rss_alone_mb"),
            Comparison(f"agent loop lag, worst repeat, during {labels[a.key]} vs alone",
                       f"loop_lag_worst_{a.key}", "loop_lag_worst_alone", stat="max",
                       goal=goal),
            Comparison(f"agent loop lag, p99 (median repeat), during {labels[a.key]} vs alone",
                       f"loop_lag_p99_{a.key}", "loop_lag_p99_alone"),
        ]  # fmt: skip
    return res
