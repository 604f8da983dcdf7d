"""The invariants of PROTOCOL.md section 9's interactive and lifecycle promises, read from the
same trace as `simulation/checker.py` (which calls `check_interactive` with what it already
derived: each call's one result and the ledger of effects). The letters are the codes' prefixes:

n  stdin (9.1): every byte a process's stdin took belongs to exactly one `process_input` call:
   the stream parses as whole call data (or, for a call whose `written` says so, a prefix of it)
   one call after another, never interleaved, each call at most once, in the order the agent
   started them (their first requests, in the agent generation that ran the process); a
   result's `written` is exactly what the stdin got from it; nothing follows a pipe's `eof`;
h  hard deadlines (9.2): a group still alive at its `kill_after_ms` deadline (counted from the
   first start) gets its SIGTERM then, and is gone after the grace; a call whose result was still
   owed ends `timed_out` with the exact text; that text only when so; no `process_output` or
   `process_input` after the stop reports the process running;
s  graceful shutdown (9.3): every request applied while the agent stops is refused; nothing is
   left running when it stopped; no queued journal write is lost; a command running at the
   shutdown ends `canceled` with the shutdown's text, and that text only after a shutdown;
x  closing a chat (9.6): one `chat_closed` per request; when it is sent no process group of the
   chat is alive; nothing of the chat takes effect after the close in that agent generation;
   a new call in the closed chat is refused with `chat_closed`.
"""

from __future__ import annotations

import itertools
from collections import Counter, defaultdict
from typing import Any, Protocol

from toolwire.actors import events
from toolwire.actors.results import (
    TEXT_CANCELED_WHILE_RUNNING,
    TEXT_SHUTDOWN,
    Result,
    text_killed_after,
)
from toolwire.actors.terminal import DEFAULT_EOF_CHAR
from toolwire.simulation.processes import SimProcess
from toolwire.simulation.scenario import EPOCH_MS, CallPlan
from toolwire.simulation.trace import (
    BOOT,
    CLOSE,
    EV,
    REJECT,
    REQ,
    SHUTDOWN,
    SIGNAL,
    STOPPED,
    CallReq,
    CancelReq,
    CloseChatReq,
    InterruptReq,
    TurnReq,
    chat_label,
    short,
)

Key = tuple[str, str]


class CheckedRun(Protocol):
    """What these checks read of the run under check, and where they report: the `Checker` of
    checker.py is one (it calls `check_interactive` with itself). Named here, not imported, so
    that imports between the two modules point one way."""

    @property
    def entries(self) -> list[tuple[Any, ...]]:
        """The trace (simulation/trace.py)."""

    @property
    def calls(self) -> dict[Key, CallPlan]:
        """Each call's plan, by (chat_id, call_id)."""

    @property
    def processes(self) -> dict[Key, list[SimProcess]]:
        """The simulated processes each call started."""

    @property
    def end_time(self) -> float:
        """When the run ended, in virtual seconds."""

    @property
    def kill_grace_s(self) -> float | None:
        """The agent's kill grace (PROTOCOL.md 5.3), when known."""

    def fail(self, code: str, message: str, entry: int | None = None) -> None:
        """Report one violation."""


_EPS = 1e-6
# Result times are whole milliseconds of the agent's wall clock.
_MS = 0.001


def _at(ms: int | None) -> float | None:
    """A result's wall-clock time as virtual seconds."""
    return None if ms is None else (ms - EPOCH_MS) / 1000


def check_interactive(
    ck: CheckedRun,
    canonical: dict[Key, tuple[Result, int]],
    effects: dict[Key, list[tuple[int, float, int, str]]],
) -> None:
    entries = ck.entries
    gen = 0
    first_in_gen: dict[tuple[int, str, str], int] = {}
    refused: dict[int, str] = {}
    shutdowns: list[tuple[int, float, int]] = []
    stopped: dict[int, tuple[int, float, int, tuple[tuple[str, str], ...]]] = {}
    closes: list[tuple[int, float, int, int, CloseChatReq]] = []
    applied: Counter[tuple[int, int]] = Counter()
    closed_rx: dict[tuple[int, int], list[tuple[int, float]]] = defaultdict(list)
    closed_conns: set[int] = set()
    signals: dict[Key, list[tuple[int, float, str]]] = defaultdict(list)
    reqs: list[tuple[int, int, Any]] = []  # (entry, gen, request)
    # What can stop a running command as a cancel does: (entry, time, request or None for a
    # shutdown), and the calls each turn names (an interrupt with a `turn_id` stops only them).
    stops: list[tuple[int, float, Any]] = []
    turn_calls: dict[tuple[str, str], set[str]] = defaultdict(set)
    for idx, entry in enumerate(entries):
        kind = entry[0]
        if kind == REQ:
            g, conn, req = entry[2], entry[3], entry[4]
            reqs.append((idx, g, req))
            applied[(conn, req.rid)] += 1
            if isinstance(req, CallReq):
                first_in_gen.setdefault((g, req.chat, req.spec.call_id), idx)
            elif isinstance(req, TurnReq):
                for spec in req.specs:
                    first_in_gen.setdefault((g, req.chat, spec.call_id), idx)
                    turn_calls[(req.chat, req.turn_id)].add(spec.call_id)
            elif isinstance(req, CancelReq):
                for call in req.call_ids:
                    first_in_gen.setdefault((g, req.chat, call), idx)
                stops.append((idx, entry[1], req))
            elif isinstance(req, InterruptReq):
                stops.append((idx, entry[1], req))
            elif isinstance(req, CloseChatReq):
                closes.append((idx, entry[1], g, conn, req))
                stops.append((idx, entry[1], req))
        elif kind == REJECT:
            refused[entry[3]] = entry[4]
        elif kind == BOOT:
            gen = entry[2]
            for chat, call, _turn, _state in entry[3]:
                first_in_gen.setdefault((gen, chat, call), idx)
        elif kind == SHUTDOWN:
            shutdowns.append((idx, entry[1], entry[2]))
            stops.append((idx, entry[1], None))
        elif kind == STOPPED:
            stopped[entry[2]] = (idx, entry[1], entry[3], entry[4])
        elif kind == SIGNAL:
            signals[(entry[3], entry[4])].append((idx, entry[1], entry[5]))
        elif kind == CLOSE:
            closed_conns.add(entry[2])
        elif kind == EV:
            ev = entry[3]
            if isinstance(ev, events.ChatClosedEvent) and isinstance(ev.rid, int):
                closed_rx[(entry[2], ev.rid)].append((idx, entry[1]))

    spawn_gen: dict[Key, tuple[int, int, float]] = {}  # key -> (entry, gen, time)
    for key, effs in effects.items():
        for eidx, t, g, what in effs:
            if what == "spawn":
                spawn_gen.setdefault(key, (eidx, g, t))

    _stdin(ck, canonical, first_in_gen, spawn_gen)
    stops = [stop for stop in stops if stop[0] not in refused]
    _deadlines(ck, canonical, signals, stops, turn_calls)
    _shutdowns(ck, canonical, shutdowns, stopped, reqs, refused, spawn_gen)
    _closes(ck, closes, applied, closed_rx, closed_conns, reqs, refused, effects, first_in_gen)


# -- (n) stdin ---------------------------------------------------------------------------------


def _written(result: Result | None) -> int | None:
    """What a result says went in: None when nobody knows (an agent that crashed)."""
    if result is None or result.outcome.value == "unknown":
        return None
    if result.outcome.value in ("not_run", "denied"):
        return 0
    data = result.data or {}
    written = data.get("written")
    return written if isinstance(written, int) else 0


def _stdin(
    ck: CheckedRun,
    canonical: dict[Key, tuple[Result, int]],
    first_in_gen: dict[tuple[int, str, str], int],
    spawn_gen: dict[Key, tuple[int, int, float]],
) -> None:
    inputs: dict[Key, list[tuple[str, bytes, bool]]] = defaultdict(list)
    for (chat, call), plan in ck.calls.items():
        if plan.tool == "process_input":
            target = (chat, str(plan.args.get("process_id")))
            data = str(plan.args.get("data", "")).encode()
            inputs[target].append((call, data, bool(plan.args.get("eof"))))
    for target, calls in sorted(inputs.items()):
        procs = ck.processes.get(target) or []
        port = procs[0].stdin if procs else None
        stream = port.data if port is not None else b""
        terminal = port is not None and port.terminal
        label = f"{chat_label(target[0])}/{short(target[1])}"
        known = {
            call: _written(canonical[(target[0], call)][0])
            if (target[0], call) in canonical
            else None
            for call, _, _ in calls
        }
        data_of = {call: data for call, data, _ in calls}
        eof_of = {call: eof for call, _, eof in calls}
        for call, k in known.items():
            if k is not None and k > len(data_of[call]):
                ck.fail(
                    "n.written_untrue",
                    f"{label}: input {short(call)} says written={k} of {len(data_of[call])} bytes",
                    canonical[(target[0], call)][1],
                )
        pos = 0
        used: dict[str, int] = {}
        order: list[str] = []
        closed_by: str | None = None
        while pos < len(stream):
            rest = stream[pos:]
            if terminal and rest.startswith(DEFAULT_EOF_CHAR) and order and eof_of[order[-1]]:
                pos += len(DEFAULT_EOF_CHAR)
                continue
            best: tuple[int, str] | None = None
            for call, data in data_of.items():
                if call in used:
                    continue
                k = known[call]
                if k is None:
                    n = 0
                    while n < len(data) and n < len(rest) and data[n] == rest[n]:
                        n += 1
                else:
                    n = k if k > 0 and rest[:k] == data[:k] else 0
                if n and (best is None or n > best[0]):
                    best = (n, call)
            if best is None:
                again = next((c for c in used if rest.startswith(data_of[c][:8])), None)
                ck.fail(
                    "n.written_twice" if again else "n.stray_bytes",
                    f"{label}: its stdin got bytes at offset {pos} that "
                    + (
                        f"repeat input {short(again)} (written at offset {used[again]})"
                        if again
                        else "no process_input call (with the `written` its result says) "
                        "accounts for: interleaved or unasked"
                    )
                    + f": {rest[:40]!r}",
                )
                break
            n, call = best
            if closed_by is not None:
                ck.fail(
                    "n.after_eof",
                    f"{label}: input {short(call)} was written after {short(closed_by)} closed "
                    "the stdin with eof",
                )
            used[call] = pos
            order.append(call)
            if eof_of[call] and n == len(data_of[call]) and not terminal:
                closed_by = call
            pos += n
        for call, k in known.items():
            if k and call not in used:
                ck.fail(
                    "n.written_missing",
                    f"{label}: input {short(call)} says written={k}, but its stdin never got "
                    "those bytes",
                    canonical[(target[0], call)][1],
                )
            result = canonical.get((target[0], call))
            completed = result is not None and result[0].outcome.value == "completed"
            if result is not None and completed and k != len(data_of[call]):
                ck.fail(
                    "n.completed_partly",
                    f"{label}: input {short(call)} completed with written={k} of "
                    f"{len(data_of[call])} bytes",
                    result[1],
                )
        spawn = spawn_gen.get(target)
        if spawn is None:
            continue
        g = spawn[1]
        firsts = [(first_in_gen.get((g, target[0], call), -1), call) for call in order]
        for (a_at, a), (b_at, b) in itertools.pairwise(firsts):
            if a_at > b_at >= 0:
                ck.fail(
                    "n.order",
                    f"{label}: input {short(b)} (requested at entry {b_at}) was written after "
                    f"{short(a)} (requested at entry {a_at})",
                    a_at,
                )


# -- (h) hard deadlines --------------------------------------------------------------------------


def _stop_texts(
    stops: list[tuple[int, float, Any]],
    turn_calls: dict[tuple[str, str], set[str]],
    key: Key,
    lo: float,
    term_at: float,
) -> set[str]:
    """The texts of the stops (a cancel, interrupt or close naming the call, or a shutdown)
    the agent applied from `lo`, the earliest its hard deadline can be, to `term_at`, the
    SIGTERM the deadline seems to have sent. A result's `started_at` is whole milliseconds, so
    the deadline is known only to within one: a stop applied in that millisecond, no later than
    the SIGTERM, may have come first (the SIGTERM is then its own), and the first stop decides
    the outcome (docs/protocol.md, "Hard deadline")."""
    chat, call = key
    texts: set[str] = set()
    for _idx, t, req in stops:
        if not lo - _EPS <= t <= term_at + _EPS:
            continue
        if req is None:
            texts.add(TEXT_SHUTDOWN)
        elif req.chat != chat:
            continue
        elif (
            isinstance(req, CloseChatReq)
            or (isinstance(req, CancelReq) and call in req.call_ids)
            or (
                isinstance(req, InterruptReq)
                and (req.turn_id is None or call in turn_calls.get((chat, req.turn_id), ()))
            )
        ):
            texts.add(TEXT_CANCELED_WHILE_RUNNING)
    return texts


def _deadlines(
    ck: CheckedRun,
    canonical: dict[Key, tuple[Result, int]],
    signals: dict[Key, list[tuple[int, float, str]]],
    stops: list[tuple[int, float, Any]],
    turn_calls: dict[tuple[str, str], set[str]],
) -> None:
    grace = ck.kill_grace_s or 0.0
    readers: dict[Key, list[Key]] = defaultdict(list)  # process -> process_output/_input calls
    for (chat, call), plan in ck.calls.items():
        if plan.tool in ("process_output", "process_input"):
            readers[(chat, str(plan.args.get("process_id")))].append((chat, call))
    for key, plan in sorted(ck.calls.items()):
        k_ms = plan.args.get("kill_after_ms") if plan.tool == "execute" else None
        seen = canonical.get(key)
        if seen is None:
            continue
        result, ridx = seen
        label = f"{chat_label(key[0])}/{short(key[1])}"
        killed_text = isinstance(k_ms, int) and result.text == text_killed_after(k_ms)
        if (
            result.outcome.value == "timed_out"
            and "kill_after_ms" in result.text
            and not killed_text
        ):
            ck.fail("h.text", f"{label}: timed out with text {result.text!r}", ridx)
        procs = ck.processes.get(key)
        if not isinstance(k_ms, int) or not procs or result.started_at is None:
            if killed_text:
                ck.fail("h.text", f"{label}: says kill_after_ms stopped it; nothing ran", ridx)
            continue
        proc = procs[0]
        t0 = _at(result.started_at)
        assert t0 is not None
        # The deadline, or the spawn when the start's journal write took longer than it.
        lo = max(t0 + k_ms / 1000, proc.started)
        hi = max(t0 + k_ms / 1000 + _MS, proc.started)
        if hi + grace + 0.05 >= ck.end_time:
            continue  # the run ended before the deadline (and its grace) passed
        sent = signals.get(key, [])
        before = [t for _, t, _ in sent if t < lo - _EPS]
        at_deadline = [
            t for _, t, name in sent if lo - _EPS <= t <= hi + _EPS and name == "SIGTERM"
        ]
        if before or (proc.killed_by == "crash" and (proc.killed_at or 0) < hi):
            continue  # something else stopped it first (a cancel, a close, a shutdown, a crash)
        crashed = any(m.killed_by == "crash" and (m.killed_at or 0) <= hi for m in proc.members)
        if crashed or (proc.killed_at is not None and proc.killed_by == "crash"):
            continue
        if not at_deadline:
            # The agent signals a group only while it lives: no SIGTERM then means none was due,
            # unless the group was still alive after the deadline.
            if proc.group_alive_at(hi + _EPS):
                ck.fail(
                    "h.not_stopped",
                    f"{label}: its group was alive at its kill_after_ms deadline {lo:.4f}s "
                    "and got no SIGTERM then",
                    ridx,
                )
            if killed_text:
                ck.fail(
                    "h.text",
                    f"{label}: says its kill_after_ms stopped it, but no stop came at its "
                    f"deadline {lo:.4f}s",
                    ridx,
                )
            continue
        gone_by = hi + grace + 0.05
        if proc.group_alive_at(gone_by) and proc.killed_by != "crash":
            ck.fail(
                "h.not_stopped",
                f"{label}: stopped at its deadline {lo:.4f}s, still alive at {gone_by:.4f}s",
                ridx,
            )
        done_at = _at(result.finished_at)
        owed = (
            not plan.background
            and done_at is not None
            and done_at >= hi
            and (result.outcome.value != "timed_out" or killed_text)
        )
        overtaken = _stop_texts(stops, turn_calls, key, lo, min(at_deadline))
        if (
            owed
            and result.outcome.value != "unknown"
            and not (result.outcome.value == "timed_out" and result.timed_out and killed_text)
            and not (
                result.outcome.value == "canceled" and result.canceled and result.text in overtaken
            )
        ):
            ck.fail(
                "h.result",
                f"{label}: its result was owed when kill_after_ms stopped it, but it ended "
                f"{result.outcome.value} with {result.text!r}",
                ridx,
            )
        for reader in readers.get(key, []):
            seen_r = canonical.get(reader)
            if seen_r is None or seen_r[0].outcome.value != "completed":
                continue
            r_started, r_done = _at(seen_r[0].started_at), _at(seen_r[0].finished_at)
            data = seen_r[0].data or {}
            if (
                r_started is not None
                and r_done is not None
                and r_started > gone_by
                and data.get("running") is True
            ):
                ck.fail(
                    "h.reported_running",
                    f"{label}: {short(reader[1])} reports it running at {r_done:.4f}s, after "
                    f"its kill_after_ms stopped it at {lo:.4f}s",
                    seen_r[1],
                )


# -- (s) graceful shutdown -----------------------------------------------------------------------


def _shutdowns(
    ck: CheckedRun,
    canonical: dict[Key, tuple[Result, int]],
    shutdowns: list[tuple[int, float, int]],
    stopped: dict[int, tuple[int, float, int, tuple[tuple[str, str], ...]]],
    reqs: list[tuple[int, int, Any]],
    refused: dict[int, str],
    spawn_gen: dict[Key, tuple[int, int, float]],
) -> None:
    windows: list[tuple[float, float]] = []
    for idx, t, g in shutdowns:
        end = stopped.get(g)
        if end is None:
            continue
        eidx, t2, lost, survivors = end
        windows.append((t, t2))
        if lost:
            ck.fail(
                "s.journal_lost", f"g{g}: the shutdown left {lost} journal writes unsaved", eidx
            )
        for chat, call in survivors:
            # Also a group whose shell had exited and whose pipe nobody held: a member that
            # writes elsewhere (`nohup x >/dev/null &`) is the agent's to stop all the same.
            ck.fail(
                "s.group_survived",
                f"g{g}: the group of {chat_label(chat)}/{short(call)} was alive when the "
                "shutdown ended",
                eidx,
            )
        for ridx, rg, _req in reqs:
            if rg == g and idx < ridx < eidx and ridx not in refused:
                ck.fail("s.request_taken", f"g{g}: a request was taken during the shutdown", ridx)
        for key, (sidx, sg, _st) in spawn_gen.items():
            plan = ck.calls.get(key)
            seen = canonical.get(key)
            if sg != g or sidx > idx or plan is None or plan.background or seen is None:
                continue
            result, ridx = seen
            done = _at(result.finished_at)
            procs = ck.processes.get(key) or []
            if done is None or done <= t + _MS or not procs or procs[0].death <= t:
                continue
            k_ms = plan.args.get("kill_after_ms")
            if isinstance(k_ms, int) and result.text == text_killed_after(k_ms):
                continue  # its hard deadline was stopping it already
            if not (result.outcome.value == "canceled" and result.text == TEXT_SHUTDOWN):
                ck.fail(
                    "s.not_canceled",
                    f"{chat_label(key[0])}/{short(key[1])} ran at the shutdown of g{g} but "
                    f"ended {result.outcome.value} with {result.text!r}",
                    ridx,
                )
    for key, (result, ridx) in sorted(canonical.items()):
        if result.text != TEXT_SHUTDOWN:
            continue
        start, done = _at(result.started_at), _at(result.finished_at)
        if (
            start is None
            or done is None
            or not any(start - _MS <= a and b >= done - _MS for a, b in windows)
        ):
            ck.fail(
                "s.text_without_shutdown",
                f"{chat_label(key[0])}/{short(key[1])} has the shutdown's text, but no shutdown "
                "came while it ran",
                ridx,
            )


# -- (x) closing a chat --------------------------------------------------------------------------


def _closes(
    ck: CheckedRun,
    closes: list[tuple[int, float, int, int, CloseChatReq]],
    applied: Counter[tuple[int, int]],
    closed_rx: dict[tuple[int, int], list[tuple[int, float]]],
    closed_conns: set[int],
    reqs: list[tuple[int, int, Any]],
    refused: dict[int, str],
    effects: dict[Key, list[tuple[int, float, int, str]]],
    first_in_gen: dict[tuple[int, str, str], int],
) -> None:
    for idx, _t_close, g, conn, req in closes:
        if idx in refused:
            continue
        got = closed_rx.get((conn, req.rid), [])
        if len(got) > applied[(conn, req.rid)] or (
            conn in closed_conns and len(got) != applied[(conn, req.rid)]
        ):
            ck.fail(
                "x.reply_count",
                f"c{conn} close_chat #{req.rid}: {len(got)} chat_closed replies for "
                f"{applied[(conn, req.rid)]} requests",
                idx,
            )
        if got:
            eidx, t_reply = got[0]
            for key, procs in ck.processes.items():
                if key[0] != req.chat:
                    continue
                for proc in procs:
                    spawned = [e for e in effects.get(key, []) if e[3] == "spawn" and e[2] == g]
                    if spawned and spawned[0][0] < idx and proc.group_alive_at(t_reply):
                        ck.fail(
                            "x.group_alive",
                            f"{chat_label(req.chat)}/{short(key[1])}: chat_closed was sent at "
                            f"{t_reply:.4f}s while a member of its group was alive",
                            eidx,
                        )
        for key, effs in effects.items():
            if key[0] != req.chat:
                continue
            for eidx, _, eg, what in effs:
                if eg == g and eidx > idx:
                    ck.fail(
                        "x.effect_after_close",
                        f"{chat_label(key[0])}/{short(key[1])} ({what}) took effect after the "
                        "chat was closed",
                        eidx,
                    )
        for ridx, rg, other in reqs:
            if rg != g or ridx < idx or not isinstance(other, CallReq) or other.chat != req.chat:
                continue
            first = first_in_gen.get((g, other.chat, other.spec.call_id), ridx)
            if first >= ridx and refused.get(ridx) not in (
                "chat_closed",
                "internal",
                "bad_args",
                "conflict",
                "over_limit",
            ):
                ck.fail(
                    "x.new_call_taken",
                    f"{chat_label(other.chat)}/{short(other.spec.call_id)}: a new call in the "
                    "closed chat was not refused with chat_closed",
                    ridx,
                )
