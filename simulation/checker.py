"""The invariant checker: reads a whole trace (and the side-effect ledger in it) and reports
every broken promise as a `Violation` naming the trace entry where it shows.

Invariants (issue 7, item 3; the letters are the codes' prefixes):

a  no side effect twice for one (chat, call), whatever retries, takeovers and crashes happened;
b  every `call`/`attach` request is answered on its connection by exactly one `accepted` (or
   `error`) and, once the call ended, exactly one `result`; a connection that died is owed
   nothing more, but never gets more than it was owed; every result of one call (in `result`,
   `cancel_result` and `turn_result`, on any connection, in any generation) is identical; per
   call and connection `accepted` comes first;
c  outcomes are truthful: `not_run`/`denied` left no effect, `completed`/`canceled`/`timed_out`
   of an effectful tool did have one and report what the process did (exit status, output),
   `unknown` only after a crash of the agent or an injected failure inside it;
d  every turn request gets one `turn_plan` and one `turn_result` with one result per call in
   request order; the plan keeps request order, puts no conflicting reservations in one
   segment and closes a segment only when it must (actors.planner); segments run in order;
e  streamed output, joined by offsets, is exactly what the process printed: every `output`
   event's text is the printed bytes at its offset, offsets are contiguous per connection
   (a repeated request may rewind them; nothing is skipped), and before a live-followed call's
   `result` the connection has everything up to the result's `output_bytes`;
f  no gated call has an effect before an `approve` of it in the same agent generation, or an
   approval with scope "chat" of its tool in its chat that is in force (PROTOCOL.md 9.5:
   from the accepted `approve` on, and after a restart only when it was journaled and the chat
   has records); a call of such a tool requested while the approval is in force never parks;
   a gate is resolved at most once per connection, with one decision per generation; `denied`
   and "not approved in time" results match an answer or an approval timeout;
g  no connection receives an event of a chat (or call) it never named;
i  interrupts: one `interrupted` per request, after the requester's results and turn results
   of what it ended; no call named before an interrupt has an effect after it;
k  cancels: one `cancel_result` per call id per request, with the call's one result;
l  liveness: every orchestrator finished, no request left unanswered at the end;
p  process groups (PROTOCOL.md 5.3): no SIGKILL reaches a group less than the kill grace
   after its first SIGTERM, and a member alive at that SIGTERM whose cleanup is shorter than
   the grace finishes it; no member is alive when a `canceled` result, or the `cancel_result`
   of a cancel that found the group running, is sent;
w  no write lost on the files read-modify-write cycles share: every write that took place
   expected (expected_sha256) exactly the bytes the file held, and every completed write's
   bytes are the file's final content or were expected by a write after it.
"""

from __future__ import annotations

import hashlib
import os
from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Any

from toolwire.actors import events, planner, reservations
from toolwire.actors.output import DEFAULT_RESULT_BYTES, RESULT_HEAD_BYTES, OutputBuffer
from toolwire.actors.results import (
    TEXT_AGENT_FAILURE,
    TEXT_AGENT_RESTARTED,
    TEXT_APPROVAL_EXPIRED,
    TEXT_SHUTDOWN,
    Result,
    text_killed_after,
)
from toolwire.actors.tools.registry import reserves_of
from toolwire.simulation.checks_interactive import check_interactive
from toolwire.simulation.processes import CRASH_KILL, SPAWN_OSERROR, SPAWN_RAISES, SimProcess
from toolwire.simulation.scenario import EPOCH_MS, CallPlan
from toolwire.simulation.trace import (
    BOOT,
    CLOSE,
    CRASH,
    EFFECT,
    EV,
    OPEN,
    REJECT,
    REQ,
    SHUTDOWN,
    SIGNAL,
    STOPPED,
    ApproveReq,
    AttachReq,
    CallReq,
    CancelReq,
    CloseChatReq,
    DetachReq,
    InterruptReq,
    TurnReq,
    chat_label,
    short,
)

EFFECTFUL = frozenset({"execute", "write_file", "edit_files"})
# Slack for virtual-time sums (a deadline computed as now + grace by another path).
_EPS = 1e-6


@dataclass(frozen=True)
class Violation:
    code: str
    message: str
    entry: int | None = None

    def __str__(self) -> str:
        where = f" (trace entry {self.entry})" if self.entry is not None else ""
        return f"[{self.code}] {self.message}{where}"


Key = tuple[str, str]  # (chat_id, call_id)
ConnKey = tuple[int, str, str]  # (conn, chat_id, call_id)


class Checker:
    def __init__(
        self,
        entries: list[tuple[Any, ...]],
        *,
        calls: dict[Key, CallPlan],
        processes: dict[Key, list[SimProcess]],
        workspace: str,
        approval_timeout_s: float | None,
        end_time: float,
        stuck: list[str],
        shared_files: dict[str, bytes] | None = None,
        kill_grace_s: float | None = None,
    ) -> None:
        self.entries = entries
        # The agent's kill grace (PROTOCOL.md 5.3): invariant (p), when known.
        self.kill_grace_s = kill_grace_s
        # The files read-modify-write cycles share, with their initial bytes: invariant (w).
        self.shared_files = shared_files or {}
        self.calls = calls
        self.processes = processes
        self.workspace = workspace
        self.approval_timeout_s = approval_timeout_s
        self.end_time = end_time
        self.stuck = stuck
        self.violations: list[Violation] = []
        self._printed: dict[Key, bytes] = {}
        self._decoded: dict[tuple[str, str, int], str] = {}
        self._ends: dict[Key, set[int]] | None = None

    def fail(self, code: str, message: str, entry: int | None = None) -> None:
        if len(self.violations) < 200:  # a broken run reports its first 200, not millions
            self.violations.append(Violation(code, message, entry))

    def printed(self, key: Key) -> bytes | None:
        got = self._printed.get(key)
        if got is None:
            procs = self.processes.get(key)
            if not procs:
                return None
            got = self._printed[key] = procs[0].printed(self.end_time)
        return got

    def incomplete_tail(self, key: Key, n: int) -> int:
        """Bytes at the end of the first n printed bytes that start a character not complete
        yet: a streaming reader holds them back until the rest arrives (or the output ends)."""
        data = (self.printed(key) or b"")[:n]
        for back in range(1, min(4, len(data)) + 1):
            byte = data[-back]
            if byte < 0x80:
                return 0
            if byte >= 0xC0:  # a lead byte: how long should its character be?
                need = 2 if byte < 0xE0 else 3 if byte < 0xF0 else 4
                return back if back < need else 0
        return 0

    def printed_text_from(self, key: Key, offset: int) -> str:
        cache_key = (key[0], key[1], offset)
        got = self._decoded.get(cache_key)
        if got is None:
            data = self.printed(key) or b""
            got = self._decoded[cache_key] = data[offset:].decode("utf-8", "replace")
        return got

    # -----------------------------------------------------------------------------------------

    def run(self) -> list[Violation]:
        fail = self.fail
        gen = 0
        conn_gen: dict[int, int] = {}
        closed: set[int] = set()
        crashes: list[int] = []  # entry indexes
        # Requests
        req_count: Counter[tuple[int, int]] = Counter()  # (conn, rid) -> applied requests
        req_by_rid: dict[int, Any] = {}
        req_by_rid_idx: dict[int, int] = {}
        named_chat: set[tuple[int, str]] = set()
        named_call: set[ConnKey] = set()
        first_request: dict[Key, int] = {}
        requested_in_gen: dict[tuple[int, str], list[tuple[int, str, str | None]]] = defaultdict(
            list
        )  # (gen, chat) -> [(entry, call_id, turn_id)]
        turns: dict[tuple[str, str], list[str]] = {}  # (chat, turn_id) -> call ids
        turn_reqs: list[tuple[int, int, TurnReq]] = []  # (entry, conn, req)
        cancel_reqs: list[tuple[int, int, CancelReq]] = []
        interrupt_reqs: list[tuple[int, int, int, InterruptReq]] = []  # entry, conn, gen, req
        approvals: dict[Key, list[tuple[int, int, bool]]] = defaultdict(list)  # entry, gen, yes
        detached: set[ConnKey] = set()
        # Answers
        owed: Counter[ConnKey] = Counter()
        accepted: Counter[ConnKey] = Counter()
        results_rx: Counter[ConnKey] = Counter()
        answered_rid: Counter[tuple[int, int]] = Counter()  # accepted/error with rid
        plan_rx: Counter[tuple[int, int]] = Counter()
        turn_result_rx: Counter[tuple[int, str, str]] = Counter()
        cancel_rx: Counter[tuple[int, int, str]] = Counter()
        interrupted_rx: Counter[tuple[int, int]] = Counter()
        first_in_gen: dict[tuple[int, str, str], int] = {}  # first request creating a record
        live_stream: set[ConnKey] = set()
        pos: dict[ConnKey, int] = {}
        floor: dict[ConnKey, int] = {}  # an attach asked only for output from here on
        # Offsets a repeated call/attach moved the cursor back to, each usable once.
        resets: dict[ConnKey, list[int]] = defaultdict(list)
        canonical: dict[Key, tuple[Result, int]] = {}
        resolved: Counter[tuple[int, str, str]] = Counter()
        decisions: dict[tuple[int, str, str], str] = {}
        effects: dict[Key, list[tuple[int, float, int, str]]] = defaultdict(list)
        cancel_named: dict[Key, int] = {}  # first cancel / interrupt naming (entry)
        plans: dict[tuple[str, str], tuple[int, list[list[str]]]] = {}
        accepted_events: list[tuple[int, int, events.AcceptedEvent]] = []
        # (gen, chat, call) -> the requests naming it: (entry, conn, rid, is_turn)
        naming: dict[tuple[int, str, str], list[tuple[int, int, int, bool]]] = defaultdict(list)
        restored: set[tuple[int, str, str]] = set()
        errored: set[int] = set()
        refused: set[int] = set()  # REQ entries the agent refused (REJECT)
        # approve{approved: true, scope: "chat"} requests: (entry, gen, chat, call_id)
        scope_approves: list[tuple[int, int, str, str]] = []
        boots: list[tuple[int, int, set[str], tuple[tuple[str, str], ...]]] = []
        parked_seen: list[tuple[int, int, str, str]] = []  # (entry, conn, chat, call_id)
        signals: dict[Key, list[tuple[int, float, str]]] = defaultdict(list)
        cancel_results: list[tuple[int, float, int, Key]] = []  # (entry, time, rid, key)
        canceled_seen: dict[Key, tuple[int, float]] = {}  # first event with a canceled result
        req_time: dict[int, float] = {}  # rid -> when the agent first applied it
        # Requests applied while the agent shut down (PROTOCOL.md 9.3): refused, not failed.
        stopping = False
        during_shutdown: set[int] = set()  # rids
        closes: list[tuple[int, int, CloseChatReq]] = []  # (entry, gen, req)

        def same_result(key: Key, result: Result, idx: int, where: str) -> None:
            seen = canonical.get(key)
            if seen is None:
                canonical[key] = (result, idx)
            elif seen[0] != result:
                fields = [
                    f"{name} {getattr(seen[0], name)!r:.40} != {getattr(result, name)!r:.40}"
                    for name in result.__struct_fields__
                    if getattr(seen[0], name) != getattr(result, name)
                ]
                fail(
                    "b.results_differ",
                    f"{chat_label(key[0])}/{short(key[1])}: {where} differs from the result "
                    f"first seen at entry {seen[1]}: {'; '.join(fields)}",
                    idx,
                )

        for idx, entry in enumerate(self.entries):
            kind = entry[0]
            if kind == EV:
                conn, ev = entry[2], entry[3]
                chat = ev.chat_id
                if chat is not None and (conn, chat) not in named_chat:
                    fail(
                        "g.foreign_chat",
                        f"c{conn} got {type(ev).__name__} of chat {chat_label(chat)}, "
                        "which it never named",
                        idx,
                    )
                call_id = getattr(ev, "call_id", None)
                raw_rid = getattr(ev, "rid", None)
                rid: int | None = raw_rid if isinstance(raw_rid, int) else None
                ck: ConnKey = (conn, chat or "", call_id or "")
                if isinstance(ev, events.OutputEvent):
                    self._output(idx, ck, ev, accepted, pos, resets)
                elif isinstance(ev, events.ResultEvent):
                    if ck not in named_call:
                        fail(
                            "g.foreign_call",
                            f"c{conn} got a result of {short(call_id)} it never named",
                            idx,
                        )
                    results_rx[ck] += 1
                    if results_rx[ck] > accepted[ck]:
                        fail(
                            "b.result_unasked",
                            f"c{conn} got result #{results_rx[ck]} of {short(call_id)} for "
                            f"{accepted[ck]} accepted requests",
                            idx,
                        )
                    same_result((ev.chat_id, ev.call_id), ev.result, idx, "result")
                    r = ev.result
                    if r.outcome.value == "canceled":
                        canceled_seen.setdefault((ev.chat_id, ev.call_id), (idx, entry[1]))
                    if (
                        ck in live_stream
                        and ck not in detached
                        and r.tool == "execute"
                        and r.output_bytes > 0
                        and max(pos.get(ck, -1), floor.get(ck, -1)) < r.output_bytes
                    ):
                        fail(
                            "e.output_incomplete",
                            f"c{conn} followed {short(call_id)} live but had output up to "
                            f"{pos.get(ck)} of {r.output_bytes} bytes at its result",
                            idx,
                        )
                elif isinstance(ev, events.AcceptedEvent):
                    if ev.state == "awaiting_approval":
                        parked_seen.append((idx, conn, ev.chat_id, ev.call_id))
                    accepted[ck] += 1
                    accepted_events.append((idx, conn, ev))
                    if rid is not None:
                        answered_rid[(conn, rid)] += 1
                        req = req_by_rid.get(rid)
                        stream = isinstance(req, AttachReq) or (
                            isinstance(req, CallReq) and req.stream
                        )
                        if isinstance(req, CallReq) and not ev.replay:
                            gk = (conn_gen.get(conn, 0), ev.chat_id, ev.call_id)
                            first = first_in_gen.get(gk)
                            if first is not None and first < req_by_rid_idx[rid]:
                                fail(
                                    "b.replay_false",
                                    f"accepted replay=false for {short(call_id)}, which an "
                                    f"earlier request (entry {first}) had already created",
                                    idx,
                                )
                    else:
                        stream = True  # only a streaming turn sends accepted per call
                    if accepted[ck] > owed[ck]:
                        fail(
                            "b.accepted_unasked",
                            f"c{conn} got accepted #{accepted[ck]} of {short(call_id)} for "
                            f"{owed[ck]} requests",
                            idx,
                        )
                    if ev.state != "done" and stream:
                        live_stream.add(ck)
                    elif ev.state == "done" and results_rx[ck] == accepted[ck] - 1:
                        live_stream.discard(ck)  # nothing live is outstanding here any more
                elif isinstance(ev, events.StartedEvent):
                    if accepted[ck] == 0:
                        fail(
                            "b.order",
                            f"c{conn} got started of {short(call_id)} before accepted",
                            idx,
                        )
                    if not self.processes.get((ev.chat_id, ev.call_id)):
                        fail("c.started_without_process", f"started for {short(call_id)}", idx)
                elif isinstance(ev, events.ApprovalEvent):
                    parked_seen.append((idx, conn, ev.chat_id, ev.call_id))
                    if ck not in named_call:
                        fail("g.foreign_call", f"c{conn} got approval of {short(call_id)}", idx)
                elif isinstance(ev, events.ApprovalResolvedEvent):
                    g = conn_gen.get(conn, 0)
                    gk2 = (conn, ev.chat_id, ev.call_id)
                    resolved[gk2] += 1
                    if resolved[gk2] > 1:
                        fail(
                            "f.gate_resolved_twice",
                            f"c{conn} got approval_resolved for {short(call_id)} "
                            f"{resolved[gk2]} times",
                            idx,
                        )
                    dk = (g, ev.chat_id, ev.call_id)
                    if decisions.setdefault(dk, ev.decision) != ev.decision:
                        fail(
                            "f.gate_two_decisions",
                            f"gate of {short(call_id)} resolved {decisions[dk]} and {ev.decision}",
                            idx,
                        )
                    if ck not in named_call:
                        fail(
                            "g.foreign_call",
                            f"c{conn} got approval_resolved of {short(call_id)}",
                            idx,
                        )
                elif isinstance(ev, events.CancelResultEvent):
                    cancel_rx[(conn, rid or 0, ev.call_id)] += 1
                    same_result((ev.chat_id, ev.call_id), ev.result, idx, "cancel_result")
                    cancel_results.append((idx, entry[1], rid or 0, (ev.chat_id, ev.call_id)))
                    if ev.result.outcome.value == "canceled":
                        canceled_seen.setdefault((ev.chat_id, ev.call_id), (idx, entry[1]))
                    if not ev.received and ev.result.outcome.value not in ("not_run", "canceled"):
                        fail(
                            "k.unreceived_outcome",
                            f"cancel_result received=false with {ev.result.outcome.value}",
                            idx,
                        )
                elif isinstance(ev, events.TurnPlanEvent):
                    plan_rx[(conn, rid or 0)] += 1
                    answered_rid[(conn, rid or 0)] += 1
                    if (ev.chat_id, ev.turn_id) not in plans:
                        plans[(ev.chat_id, ev.turn_id)] = (idx, ev.segments)
                        self._plan(idx, ev, turns.get((ev.chat_id, ev.turn_id)))
                elif isinstance(ev, events.TurnResultEvent):
                    turn_result_rx[(conn, ev.chat_id, ev.turn_id)] += 1
                    ids = turns.get((ev.chat_id, ev.turn_id), [])
                    if len(ev.results) != len(ids):
                        fail(
                            "d.turn_result_count",
                            f"turn {ev.turn_id} has {len(ids)} calls but its turn_result "
                            f"carries {len(ev.results)} results",
                            idx,
                        )
                    for call, result in zip(ids, ev.results, strict=False):
                        same_result((ev.chat_id, call), result, idx, f"turn_result {ev.turn_id}")
                        if result.outcome.value == "canceled":
                            canceled_seen.setdefault((ev.chat_id, call), (idx, entry[1]))
                elif isinstance(ev, events.InterruptedEvent):
                    interrupted_rx[(conn, rid or 0)] += 1
                    for call in ev.call_ids:
                        k3 = (conn, ev.chat_id, call)
                        if accepted[k3] > 0 and results_rx[k3] == 0 and k3 not in detached:
                            fail(
                                "i.interrupted_before_result",
                                f"interrupted came before the result of {short(call)} on c{conn}",
                                idx,
                            )
                    for tidx, tconn, treq in turn_reqs:
                        if (
                            tconn == conn
                            and tidx < req_by_rid_idx.get(rid or 0, idx)
                            and treq.chat == ev.chat_id
                            and (ev.turn_id is None or ev.turn_id == treq.turn_id)
                            and plan_rx[(conn, treq.rid)] > 0
                            and turn_result_rx[(conn, treq.chat, treq.turn_id)] == 0
                        ):
                            fail(
                                "i.interrupted_before_turn_result",
                                f"interrupted came before turn_result of {treq.turn_id}",
                                idx,
                            )
                elif isinstance(ev, events.ErrorEvent):
                    if rid is not None:
                        errored.add(rid)
                        answered_rid[(conn, rid)] += 1
                        req = req_by_rid.get(rid)
                        if isinstance(req, CallReq):
                            owed[(conn, req.chat, req.spec.call_id)] -= 1
                        elif isinstance(req, AttachReq):
                            owed[(conn, req.chat, req.call_id)] -= 1
                        elif isinstance(req, TurnReq) and req.stream:
                            for spec in req.specs:
                                owed[(conn, req.chat, spec.call_id)] -= 1
                    # (A wire `detach` carries no rid the trace knows: its refusal shows
                    # only by arriving while the agent stops.)
                    if ev.code == "internal" and not (
                        (rid in during_shutdown or stopping) and "shutting down" in ev.message
                    ):
                        fail("b.internal_error", f"the agent failed a request: {ev.message}", idx)
            elif kind == REQ:
                g, conn, req = entry[2], entry[3], entry[4]
                if stopping:
                    during_shutdown.add(req.rid)
                req_count[(conn, req.rid)] += 1
                req_by_rid[req.rid] = req
                req_by_rid_idx.setdefault(req.rid, idx)
                req_time.setdefault(req.rid, entry[1])
                named_chat.add((conn, req.chat))
                if isinstance(req, CallReq):
                    key = (req.chat, req.spec.call_id)
                    ck = (conn, req.chat, req.spec.call_id)
                    named_call.add(ck)
                    owed[ck] += 1
                    resets[ck].append(0)
                    first_request.setdefault(key, idx)
                    first_in_gen.setdefault((g, req.chat, req.spec.call_id), idx)
                    naming[(g, req.chat, req.spec.call_id)].append((idx, conn, req.rid, False))
                    requested_in_gen[(g, req.chat)].append((idx, req.spec.call_id, None))
                elif isinstance(req, AttachReq):
                    ck = (conn, req.chat, req.call_id)
                    named_call.add(ck)
                    owed[ck] += 1
                    created = first_in_gen.get((g, req.chat, req.call_id))
                    if created is not None and created < idx:
                        # An attach names only a call the agent has (else: unknown_call).
                        naming[(g, req.chat, req.call_id)].append((idx, conn, req.rid, False))
                    resets[ck].append(req.from_offset)
                    # A repeated request moves the cursor only back (PROTOCOL.md 9.9): an attach
                    # from ahead never excuses output an earlier request still owes.
                    floor[ck] = min(floor.get(ck, req.from_offset), req.from_offset)
                elif isinstance(req, TurnReq):
                    turns.setdefault((req.chat, req.turn_id), [s.call_id for s in req.specs])
                    turn_reqs.append((idx, conn, req))
                    for spec in req.specs:
                        ck = (conn, req.chat, spec.call_id)
                        named_call.add(ck)
                        first_request.setdefault((req.chat, spec.call_id), idx)
                        first_in_gen.setdefault((g, req.chat, spec.call_id), idx)
                        naming[(g, req.chat, spec.call_id)].append((idx, conn, req.rid, True))
                        requested_in_gen[(g, req.chat)].append((idx, spec.call_id, req.turn_id))
                        if req.stream:
                            owed[ck] += 1
                            resets[ck].append(0)
                elif isinstance(req, CancelReq):
                    cancel_reqs.append((idx, conn, req))
                    for call in req.call_ids:
                        named_call.add((conn, req.chat, call))
                        cancel_named.setdefault((req.chat, call), idx)
                        first_in_gen.setdefault((g, req.chat, call), idx)
                elif isinstance(req, ApproveReq):
                    named_call.add((conn, req.chat, req.call_id))
                    approvals[(req.chat, req.call_id)].append((idx, g, req.approved))
                    if req.approved and req.scope == "chat":
                        scope_approves.append((idx, g, req.chat, req.call_id))
                elif isinstance(req, InterruptReq):
                    interrupt_reqs.append((idx, conn, g, req))
                elif isinstance(req, CloseChatReq):
                    closes.append((idx, g, req))
                elif isinstance(req, DetachReq):
                    ck = (conn, req.chat, req.call_id)
                    detached.add(ck)
                    live_stream.discard(ck)
            elif kind == EFFECT:
                effects[(entry[3], entry[4])].append((idx, entry[1], entry[2], entry[5]))
            elif kind == SIGNAL:
                signals[(entry[3], entry[4])].append((idx, entry[1], entry[5]))
            elif kind == REJECT:
                refused.add(entry[3])
            elif kind == OPEN:
                conn_gen[entry[2]] = gen
            elif kind == CLOSE:
                closed.add(entry[2])
            elif kind == CRASH:
                crashes.append(idx)
            elif kind == SHUTDOWN:
                stopping = True
            elif kind == STOPPED:
                stopping = False
            elif kind == BOOT:
                gen = entry[2]
                boots.append((idx, gen, {row[0] for row in entry[3]}, entry[4]))
                for chat, call, turn_id, _state in entry[3]:
                    restored.add((gen, chat, call))
                    requested_in_gen[(gen, chat)].append((idx, call, turn_id))
                    first_in_gen.setdefault((gen, chat, call), idx)

        # -- (b) every request answered once, on connections that lived to the end ------------
        for (conn, rid), n in sorted(req_count.items()):
            req = req_by_rid[rid]
            if conn not in closed:
                continue
            if isinstance(req, CallReq | AttachReq | TurnReq):
                call = req.spec.call_id if isinstance(req, CallReq) else getattr(req, "call_id", "")
                # A detach does not withdraw a reply (PROTOCOL.md 9.9): no excuse for it.
                got = answered_rid[(conn, rid)]
                if got != n:
                    fail(
                        "b.request_answers",
                        f"c{conn} request #{rid} ({type(req).__name__}) sent {n}x got {got} "
                        "accepted/turn_plan/error replies",
                    )
        for ck, n in sorted(owed.items()):
            conn = ck[0]
            if conn not in closed:
                continue  # owed nothing more; getting more than asked is reported as it happens
            if accepted[ck] != n:
                fail(
                    "b.accepted_count",
                    f"c{conn} {short(ck[2])}: {n} requests, {accepted[ck]} accepted",
                )
            if results_rx[ck] != accepted[ck]:
                fail(
                    "b.result_count",
                    f"c{conn} {chat_label(ck[1])}/{short(ck[2])}: {accepted[ck]} accepted "
                    f"requests, {results_rx[ck]} results",
                )
        self._requests_counts(accepted_events, naming, restored, errored, refused, conn_gen)
        # turn_result per turn request
        per_turn: Counter[tuple[int, str, str]] = Counter()
        for _, conn, treq in turn_reqs:
            if plan_rx[(conn, treq.rid)] > 0 or conn in closed:
                per_turn[(conn, treq.chat, treq.turn_id)] += 1
        for tk, n in sorted(per_turn.items()):
            conn = tk[0]
            errs = sum(
                1
                for _, c2, r2 in turn_reqs
                if c2 == conn
                and (r2.chat, r2.turn_id) == tk[1:]
                and answered_rid[(conn, r2.rid)] > plan_rx[(conn, r2.rid)]
            )
            want = n - errs
            got = turn_result_rx[tk]
            if got > want or (conn in closed and got != want):
                fail(
                    "d.turn_result_per_request",
                    f"c{conn} turn {tk[2]}: {want} turn requests, {got} turn_results",
                )
        # cancels and interrupts
        for idx, conn, creq in cancel_reqs:
            if conn in closed:
                for call in creq.call_ids:
                    n = req_count[(conn, creq.rid)]
                    got = cancel_rx[(conn, creq.rid, call)]
                    if got != n:
                        fail(
                            "k.cancel_result_count",
                            f"c{conn} cancel #{creq.rid} of {short(call)}: {got} cancel_results",
                            idx,
                        )
        for idx, conn, g, ireq in interrupt_reqs:
            if conn in closed and interrupted_rx[(conn, ireq.rid)] != req_count[(conn, ireq.rid)]:
                fail(
                    "i.interrupted_count",
                    f"c{conn} interrupt #{ireq.rid}: {interrupted_rx[(conn, ireq.rid)]} "
                    "interrupted replies",
                    idx,
                )
            scope = turns.get((ireq.chat, ireq.turn_id)) if ireq.turn_id is not None else None
            for ridx, call, _turn in requested_in_gen[(g, ireq.chat)]:
                if ridx > idx or (scope is not None and call not in scope):
                    continue
                for eidx, _, egen, what in effects.get((ireq.chat, call), []):
                    if egen == g and eidx > idx:
                        fail(
                            "i.effect_after_interrupt",
                            f"{short(call)} ({what}) had an effect after interrupt #{ireq.rid}",
                            eidx,
                        )
            for ridx, call, _turn in requested_in_gen[(g, ireq.chat)]:
                if ridx < idx and (scope is None or call in scope):
                    key = (ireq.chat, call)
                    cancel_named[key] = min(cancel_named.get(key, idx), idx)

        # A close ends every unresolved call of its chat as an interrupt does (PROTOCOL.md 9.6).
        for idx, g, close in closes:
            for ridx, call, _turn in requested_in_gen[(g, close.chat)]:
                if ridx < idx:
                    key = (close.chat, call)
                    cancel_named[key] = min(cancel_named.get(key, idx), idx)

        # -- (f) approvals with scope "chat" ---------------------------------------------------
        in_force = self._scope_approvals(scope_approves, refused, boots)
        for idx, conn, chat, call in parked_seen:
            g = conn_gen.get(conn, 0)
            plan = self.calls.get((chat, call))
            first = first_in_gen.get((g, chat, call))
            since = in_force.get((g, chat, plan.tool)) if plan is not None else None
            if since is not None and first is not None and since < first:
                fail(
                    "f.parked_despite_scope",
                    f"{chat_label(chat)}/{short(call)} parked at a gate, but its tool "
                    f"{plan.tool if plan else '?'} was approved for the chat (entry {since}) "
                    f"before it was requested (entry {first})",
                    idx,
                )

        # -- (a), (c), (f): effects against results ------------------------------------------
        for key, effs in sorted(effects.items()):
            if len(effs) > 1:
                fail(
                    "a.effect_twice",
                    f"{chat_label(key[0])}/{short(key[1])} had {len(effs)} side effects "
                    f"({', '.join(f'{w} in g{g} at {t:.3f}s' for _, t, g, w in effs)})",
                    effs[1][0],
                )
            plan = self.calls.get(key)
            if plan is not None and plan.gated:
                for eidx, _, egen, _ in effs:
                    ok = (
                        any(yes and g == egen and aidx < eidx for aidx, g, yes in approvals[key])
                        or in_force.get((egen, key[0], plan.tool), eidx) < eidx
                    )
                    if not ok:
                        fail(
                            "f.ran_without_approval",
                            f"gated {short(key[1])} had an effect without an approval before it",
                            eidx,
                        )
        for key, (result, idx) in sorted(canonical.items()):
            self._truth(
                key,
                result,
                idx,
                effects.get(key, []),
                first_request,
                crashes,
                approvals,
                cancel_named,
            )

        # -- (d) segments run one after another -------------------------------------------
        for (chat, turn_id), (pidx, segments) in sorted(plans.items()):
            for k in range(1, len(segments)):
                ended: list[tuple[int, str]] = []
                for c in segments[k - 1]:
                    prev = canonical.get((chat, c))
                    if prev is not None and prev[0].finished_at is not None:
                        ended.append((prev[0].finished_at, c))
                if not ended:
                    continue
                last_end, last = max(ended)
                for c in segments[k]:
                    this = canonical.get((chat, c))
                    started = this[0].started_at if this is not None else None
                    if started is not None and started < last_end:
                        fail(
                            "d.segments_overlap",
                            f"turn {turn_id}: {short(c)} of segment {k} started before "
                            f"{short(last)} of segment {k - 1} ended",
                            pidx,
                        )

        # -- (p) process groups ---------------------------------------------------------------
        self._group_grace(signals)
        self._group_gone(effects, cancel_results, canceled_seen, req_by_rid_idx, req_time)

        # -- (w) no write lost -----------------------------------------------------------------
        for path, initial in sorted(self.shared_files.items()):
            self._no_lost_write(path, initial, canonical, effects)

        # -- (n), (h), (s), (x): PROTOCOL.md 9's stdin, deadlines, shutdown, close ------------
        check_interactive(self, canonical, effects)

        # -- (l) liveness ----------------------------------------------------------------------
        for text in self.stuck:
            fail("l.stuck", text)
        return self.violations

    def _scope_approvals(
        self,
        scope_approves: list[tuple[int, int, str, str]],
        refused: set[int],
        boots: list[tuple[int, int, set[str], tuple[tuple[str, str], ...]]],
    ) -> dict[tuple[int, str, str], int]:
        """Where each approval with scope "chat" is in force (PROTOCOL.md 9.5): (generation,
        chat, tool) -> the trace entry from which it is. In the generation that granted it,
        from the `approve` the agent accepted (one it refused, say `not_parked`, grants
        nothing); in a later one, from its boot, when the journal kept it (it was committed
        before the crash) and the chat has records (it lasts while the chat has records). A
        journaled approval no accepted `approve` granted is a violation of its own."""
        in_force: dict[tuple[int, str, str], int] = {}
        granted: dict[tuple[str, str], int] = {}
        for idx, g, chat, call in scope_approves:
            plan = self.calls.get((chat, call))
            if idx in refused or plan is None:
                continue
            in_force.setdefault((g, chat, plan.tool), idx)
            granted.setdefault((chat, plan.tool), idx)
        for bidx, g, chats, journaled in boots:
            for chat, tool in journaled:
                if granted.get((chat, tool), bidx) >= bidx:
                    self.fail(
                        "f.scope_unfounded",
                        f"the journal approves {tool} for chat {chat_label(chat)}, which no "
                        "accepted approve with scope chat granted",
                        bidx,
                    )
                elif chat in chats:
                    in_force[(g, chat, tool)] = min(in_force.get((g, chat, tool), bidx), bidx)
        return in_force

    def _group_grace(self, signals: dict[Key, list[tuple[int, float, str]]]) -> None:
        """(p) Every member of a group has the kill grace from the SIGTERM that stops it
        (PROTOCOL.md 5.3): no SIGKILL reaches a group less than the grace after its first
        SIGTERM (`p.grace_cut`), and a member that was alive at that SIGTERM and cleans up in
        less than the grace finishes its cleanup, so its marker is written (`p.cleanup_cut`).
        A member the shell started after that SIGTERM gets only what is left of the grace.
        Groups a `process_signal` call names are left out (its signals are not a stop), and so
        are the kills of a crash (the simulated host's, never recorded as the agent's)."""
        grace = self.kill_grace_s
        if grace is None:
            return
        signalled = {
            (chat, str(plan.args.get("process_id")))
            for (chat, _), plan in self.calls.items()
            if plan.tool == "process_signal"
        }
        for key, sent in sorted(signals.items()):
            if key in signalled:
                continue
            label = f"{chat_label(key[0])}/{short(key[1])}"
            terms = [t for _, t, name in sent if name != "SIGKILL"]
            for idx, t, name in sent:
                if name == "SIGKILL" and not any(s + grace <= t + _EPS for s in terms):
                    first = f"its first SIGTERM came at {terms[0]:.4f}s" if terms else "no SIGTERM"
                    self.fail(
                        "p.grace_cut",
                        f"{label}: SIGKILL reached the group at {t:.4f}s, {first} (kill grace "
                        f"{grace}s)",
                        idx,
                    )
            if not terms:
                continue
            for proc in self.processes.get(key, []):
                for n, member in enumerate(proc.members):
                    cleanup = member.spec.term_cleanup
                    if (
                        member.term_at is None
                        or abs(member.term_at - terms[0]) > _EPS
                        or cleanup is None
                        or cleanup >= grace - _EPS
                        or member.killed_by == CRASH_KILL
                        or member.cleaned_up
                    ):
                        continue
                    self.fail(
                        "p.cleanup_cut",
                        f"{label}: member {n} of the group got SIGTERM at {member.term_at:.4f}s "
                        f"and needed {cleanup:.3f}s to clean up (kill grace {grace}s), but was "
                        f"killed at {member.killed_at or 0.0:.4f}s: its cleanup never finished",
                        next((i for i, t, name in sent if name == "SIGKILL"), None),
                    )

    def _group_gone(
        self,
        effects: dict[Key, list[tuple[int, float, int, str]]],
        cancel_results: list[tuple[int, float, int, Key]],
        canceled_seen: dict[Key, tuple[int, float]],
        req_by_rid_idx: dict[int, int],
        req_time: dict[int, float],
    ) -> None:
        """(p) A cancel waits until the group is empty (PROTOCOL.md 5.3): no member of a
        call's group is alive when a result saying `canceled` is sent, nor when the
        `cancel_result` of a cancel is sent that found the group still running (its shell, or
        a member holding the output pipe, as a background child does), whatever the outcome."""

        def spawned(key: Key, before: int) -> list[SimProcess]:
            spawns = [eidx for eidx, _, _, what in effects.get(key, []) if what == "spawn"]
            procs = self.processes.get(key, [])
            return [p for eidx, p in zip(spawns, procs, strict=False) if eidx < before]

        for key, (idx, t) in sorted(canceled_seen.items()):
            for proc in spawned(key, idx):
                if proc.group_alive_at(t):
                    self.fail(
                        "p.member_alive",
                        f"{chat_label(key[0])}/{short(key[1])}: a canceled result was sent at "
                        f"{t:.4f}s while a member of its process group was still alive",
                        idx,
                    )
        for idx, t, rid, key in cancel_results:
            req_idx, applied = req_by_rid_idx.get(rid), req_time.get(rid)
            if req_idx is None or applied is None:
                continue
            for proc in spawned(key, req_idx):
                if proc.pipe_open_at(applied) and proc.group_alive_at(t):
                    self.fail(
                        "p.member_alive",
                        f"{chat_label(key[0])}/{short(key[1])}: cancel_result sent at {t:.4f}s "
                        "while a member of the group the cancel found running was still alive",
                        idx,
                    )

    def _no_lost_write(
        self,
        path: str,
        initial: bytes,
        canonical: dict[Key, tuple[Result, int]],
        effects: dict[Key, list[tuple[int, float, int, str]]],
    ) -> None:
        """(w) on one shared file. Replays every write that took place (the ledger), in the
        order it took place, from the file's initial bytes: each must have expected exactly
        what the file held then, and the replay must end at the bytes on disk. Then the
        promise itself: every completed write's bytes are the file's final content, or some
        write that took place expected them (it had read them)."""
        writes = {
            key: plan
            for key, plan in self.calls.items()
            if plan.shared_path == path and plan.tool in ("write_file", "edit_files")
        }
        took_place = sorted(
            (eidx, key) for key, plan in writes.items() for eidx, *_ in effects.get(key, [])
        )
        content = initial
        expected_by_writes: set[str] = set()
        for eidx, key in took_place:
            plan = writes[key]
            expected = _expected_sha256(plan)
            expected_by_writes.add(expected)
            if expected != _sha256(content):
                self.fail(
                    "w.stale_write",
                    f"{path}: {chat_label(key[0])}/{short(key[1])} wrote expecting "
                    f"{expected[:12]} while the file held {_sha256(content)[:12]}",
                    eidx,
                )
            content = _apply_write(plan, content)
        on_disk = _read(os.path.join(self.workspace, path))
        if on_disk != content:
            self.fail(
                "w.final_content",
                f"{path}: holds {_sha256(on_disk or b'')[:12]} on disk, the writes that took "
                f"place leave {_sha256(content)[:12]}",
            )
        final = _sha256(on_disk) if on_disk is not None else None
        for key in writes:
            seen = canonical.get(key)
            if seen is None or seen[0].outcome.value != "completed":
                continue
            written = _written_sha256(seen[0])
            if written != final and written not in expected_by_writes:
                self.fail(
                    "w.lost_write",
                    f"{path}: the completed write {chat_label(key[0])}/{short(key[1])} left "
                    f"{(written or '?')[:12]}, which is neither the final content nor what a "
                    "later write expected",
                    seen[1],
                )

    # -----------------------------------------------------------------------------------------

    def _output(
        self,
        idx: int,
        ck: ConnKey,
        ev: events.OutputEvent,
        accepted: Counter[ConnKey],
        pos: dict[ConnKey, int],
        resets: dict[ConnKey, list[int]],
    ) -> None:
        key = (ck[1], ck[2])
        if accepted[ck] == 0:
            self.fail("b.order", f"c{ck[0]} got output of {short(ck[2])} before accepted", idx)
        if self.printed(key) is None:
            self.fail("e.output_without_process", f"output for {short(ck[2])}", idx)
            return
        end = ev.offset + len(ev.data.encode())
        if not self.printed_text_from(key, ev.offset).startswith(ev.data):
            cut = self.final_replacement(key, ev)
            if cut is None:
                self.fail(
                    "e.output_mismatch",
                    f"c{ck[0]} output of {short(ck[2])} at offset {ev.offset} is not what the "
                    "process printed there",
                    idx,
                )
            else:
                end = cut
        expected = pos.get(ck)
        allowed = resets.get(ck)
        if ev.offset != expected and allowed and ev.offset in allowed:
            allowed.remove(ev.offset)  # the rewind (or start) one request asked for
        elif ev.offset != expected:
            if self.retention_jump(key, expected, allowed, ev.offset):
                pass
            elif expected is None or ev.offset > expected:
                self.fail(
                    "e.output_gap",
                    f"c{ck[0]} output of {short(ck[2])} jumps to offset {ev.offset}, expected "
                    f"{expected if expected is not None else sorted(allowed or ())}: bytes lost",
                    idx,
                )
            else:
                self.fail(
                    "e.output_rewound",
                    f"c{ck[0]} output of {short(ck[2])} went back to {ev.offset} from {expected} "
                    "without a repeated request",
                    idx,
                )
        pos[ck] = end

    def final_replacement(self, key: Key, ev: events.OutputEvent) -> int | None:
        """PROTOCOL.md 9.9: where a call ended inside a character (a result's `output_bytes`),
        followers get that incomplete character as one U+FFFD at its offset. If `ev` ends so,
        the offset just past it (the call's end); else None."""
        if not ev.data.endswith("\ufffd"):
            return None
        head = ev.data[:-1]
        if not self.printed_text_from(key, ev.offset).startswith(head):
            return None
        at = ev.offset + len(head.encode())
        for n in self.ends().get(key, ()):
            if self.incomplete_tail(key, n) and n - self.incomplete_tail(key, n) == at:
                return n
        return None

    def ends(self) -> dict[Key, set[int]]:
        """Every `output_bytes` a result of each call said (where its output ended)."""
        if self._ends is None:
            self._ends = {}
            for entry in self.entries:
                if entry[0] != EV:
                    continue
                ev = entry[3]
                if isinstance(ev, events.ResultEvent | events.CancelResultEvent):
                    key = (ev.chat_id, ev.call_id)
                    self._ends.setdefault(key, set()).add(ev.result.output_bytes)
        return self._ends

    def _requests_counts(
        self,
        accepted_events: list[tuple[int, int, events.AcceptedEvent]],
        naming: dict[tuple[int, str, str], list[tuple[int, int, int, bool]]],
        restored: set[tuple[int, str, str]],
        errored: set[int],
        refused: set[int],
        conn_gen: dict[int, int],
    ) -> None:
        """`accepted.requests` counts the call/turn/attach requests that named the call, this
        one included (PROTOCOL.md 4). Checked within one agent generation, for records that
        generation created (the journal does not keep the count across a restart). A request
        the agent refused changed nothing, so it does not count, also when its `error` never
        reached the client (a connection stalled, then dropped)."""
        seen: Counter[tuple[int, int | None, str, str]] = Counter()
        for idx, conn, ev in accepted_events:
            rid = ev.rid if isinstance(ev.rid, int) else None
            g = conn_gen.get(conn, 0)
            gk = (g, ev.chat_id, ev.call_id)
            if gk in restored:
                continue
            reqs = [r for r in naming.get(gk, []) if r[2] not in errored and r[0] not in refused]
            k = seen[(conn, rid, ev.chat_id, ev.call_id)]
            seen[(conn, rid, ev.chat_id, ev.call_id)] += 1
            mine = [r for r in reqs if r[1] == conn and (r[2] == rid if rid is not None else r[3])]
            if k >= len(mine):
                continue  # unmatched: reported as b.accepted_unasked
            at = mine[k][0]
            want = sum(1 for r in reqs if r[0] <= at)
            if ev.requests != want:
                self.fail(
                    "b.requests_count",
                    f"accepted of {short(ev.call_id)} says requests={ev.requests}; "
                    f"{want} requests had named it",
                    idx,
                )

    def retention_jump(
        self, key: Key, expected: int | None, allowed: list[int] | None, offset: int
    ) -> bool:
        """A declared jump (PROTOCOL.md 5.2): once an exited process's buffer shrinks to the
        Result's head and tail, a reader in the middle resumes at the tail."""
        total = len(self.printed(key) or b"")
        if total <= DEFAULT_RESULT_BYTES:
            return False
        tail_start = total - (DEFAULT_RESULT_BYTES - RESULT_HEAD_BYTES)
        starts = [expected] if expected is not None else sorted(allowed or ())
        return any(s <= tail_start for s in starts) and tail_start <= offset <= tail_start + 3

    def _plan(self, idx: int, ev: events.TurnPlanEvent, call_ids: list[str] | None) -> None:
        if call_ids is None:
            return
        flat = [c for seg in ev.segments for c in seg]
        if flat != call_ids:
            self.fail(
                "d.plan_order", f"turn {ev.turn_id}: segments do not flatten to the calls", idx
            )
            return
        specs: dict[str, CallPlan] = {
            c: p for c in call_ids if (p := self.calls.get((ev.chat_id, c))) is not None
        }
        if len(specs) != len(call_ids):
            return
        res = {
            c: reservations.reservation_for(
                planner.PlannedCall(c, reserves_of(specs[c].tool), specs[c].args), self.workspace
            )
            for c in call_ids
        }
        barrier = planner.Access.BARRIER
        for k, seg in enumerate(ev.segments):
            if len(seg) > 1 and any(res[c].access is barrier for c in seg):
                self.fail("d.plan_barrier", f"turn {ev.turn_id}: a barrier shares segment {k}", idx)
            for i, a in enumerate(seg):
                for b in seg[i + 1 :]:
                    if planner.conflicts(res[a], res[b]):
                        self.fail(
                            "d.plan_conflict",
                            f"turn {ev.turn_id}: {short(a)} and {short(b)} conflict in segment {k}",
                            idx,
                        )
            if k > 0:
                first = seg[0]
                prev = ev.segments[k - 1]
                needed = (
                    res[first].access is barrier
                    or any(res[c].access is barrier for c in prev)
                    or any(planner.conflicts(res[first], res[c]) for c in prev)
                )
                if not needed:
                    self.fail(
                        "d.plan_not_greedy",
                        f"turn {ev.turn_id}: segment {k} needlessly split from segment {k - 1}",
                        idx,
                    )

    def _truth(
        self,
        key: Key,
        result: Result,
        idx: int,
        effs: list[tuple[int, float, int, str]],
        first_request: dict[Key, int],
        crashes: list[int],
        approvals: dict[Key, list[tuple[int, int, bool]]],
        cancel_named: dict[Key, int],
    ) -> None:
        fail = self.fail
        plan = self.calls.get(key)
        outcome = result.outcome.value
        label = f"{chat_label(key[0])}/{short(key[1])}"
        if outcome in ("not_run", "denied") and effs:
            fail(
                "c.not_run_with_effect",
                f"{label} ended {outcome} but its {effs[0][3]} happened at entry {effs[0][0]}",
                idx,
            )
        if plan is None:
            return
        tool = plan.tool
        if outcome == "unknown":
            if result.text == TEXT_AGENT_RESTARTED:
                first = first_request.get(key, cancel_named.get(key))
                if first is None or not any(c > first for c in crashes):
                    fail("c.unknown_without_crash", f"{label} says the agent restarted", idx)
            elif result.text == TEXT_AGENT_FAILURE:
                injected = plan.fail is not None or (
                    plan.script is not None and plan.script.spawn_error == SPAWN_RAISES
                )
                if not injected:
                    fail(
                        "c.unknown_without_failure", f"{label} says it failed inside the agent", idx
                    )
            else:
                fail("c.unknown_text", f"{label} unknown with text {result.text!r}", idx)
            return
        if outcome == "denied":
            if not any(not yes for _, _, yes in approvals.get(key, [])):
                fail("f.denied_without_answer", f"{label} denied but nobody denied it", idx)
            return
        if outcome == "not_run":
            if result.text == TEXT_APPROVAL_EXPIRED and (
                self.approval_timeout_s is None or not plan.gated
            ):
                fail("f.expired_without_timeout", f"{label} expired without a timeout", idx)
            return
        if plan.fail is not None and outcome == "completed":
            fail("c.completed_despite_failure", f"{label} completed though its tool raised", idx)
        if tool in EFFECTFUL and outcome in ("completed", "canceled", "timed_out") and not effs:
            fail("c.no_effect", f"{label} ended {outcome} but nothing happened", idx)
        if tool != "execute":
            return
        if outcome == "failed":
            if effs:
                fail("c.failed_with_effect", f"{label} failed but its process started", idx)
            elif (
                plan.script is not None
                and plan.script.spawn_error != SPAWN_OSERROR
                and not (plan.background and plan.timeout_ms)
            ):
                fail("c.failed_untrue", f"{label} failed: {result.text!r}", idx)
            return
        procs = self.processes.get(key)
        if not procs:
            return
        proc = procs[0]
        if outcome == "canceled" and result.text != TEXT_SHUTDOWN:  # shutdowns: (s)
            named = cancel_named.get(key)
            if named is None or named > idx:
                fail("c.canceled_without_cancel", f"{label} canceled but nobody canceled it", idx)
            elif proc.end_at <= proc.death and proc.end_at < self._entry_time(named) - 1e-9:
                fail(
                    "c.canceled_after_exit",
                    f"{label} reported canceled but its process had exited by itself at "
                    f"{proc.death:.4f}s, before the cancel",
                    idx,
                )
        k_ms = plan.args.get("kill_after_ms")
        if (
            outcome == "timed_out"
            and isinstance(k_ms, int)
            and result.text == text_killed_after(k_ms)
        ):
            pass  # a hard deadline's stop: (h) judges it
        elif outcome == "timed_out":
            if plan.timeout_ms is None:
                fail("c.timed_out_without_timeout", f"{label} timed out without timeout_ms", idx)
            elif result.finished_at is not None and (
                proc.death + 0.001 < (result.finished_at - EPOCH_MS) / 1000
            ):
                fail("c.timed_out_untrue", f"{label} timed out but its process had ended", idx)
        if outcome == "completed" and not plan.background:
            status = proc.status()
            data = result.data or {}
            if data.get("exit_code") != status.exit_code or data.get("signal") != status.signal:
                fail(
                    "c.exit_status",
                    f"{label} reports exit {data.get('exit_code')}/{data.get('signal')}, the "
                    f"process ended {status.exit_code}/{status.signal}",
                    idx,
                )
        self._result_output(key, label, result, idx)

    def _entry_time(self, idx: int) -> float:
        return float(self.entries[idx][1])

    def _result_output(self, key: Key, label: str, result: Result, idx: int) -> None:
        printed = self.printed(key) or b""
        n = result.output_bytes
        if n > len(printed):
            self.fail(
                "c.output_bytes",
                f"{label} claims {n} output bytes; the process printed {len(printed)}",
                idx,
            )
            return
        buffer = OutputBuffer()
        buffer.append(printed[:n])
        expected, truncated = buffer.result_output()
        if result.output != expected or result.truncated_bytes != truncated:
            self.fail(
                "c.result_output",
                f"{label} result output differs from what the process printed "
                f"({len(result.output)} chars, truncated {result.truncated_bytes})",
                idx,
            )


def _sha256(data: bytes | None) -> str:
    return hashlib.sha256(data or b"").hexdigest()


def _read(path: str) -> bytes | None:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return None


def _expected_sha256(plan: CallPlan) -> str:
    if plan.tool == "write_file":
        return str(plan.args["expected_sha256"])
    entries: list[dict[str, Any]] = plan.args["files"]  # type: ignore[assignment]
    return str(entries[0]["expected_sha256"])


def _apply_write(plan: CallPlan, content: bytes) -> bytes:
    """The bytes a read-modify-write step leaves, applied to `content` as the tool does."""
    if plan.tool == "write_file":
        return str(plan.args["content"]).encode()
    entries: list[dict[str, Any]] = plan.args["files"]  # type: ignore[assignment]
    edit = entries[0]["edits"][0]
    return content.decode().replace(edit["old"], edit["new"], 1).encode()


def _written_sha256(result: Result) -> str | None:
    data = result.data or {}
    if "files" in data:
        return str(data["files"][0]["sha256"])
    return str(data["sha256"]) if "sha256" in data else None


def check(
    entries: list[tuple[Any, ...]],
    *,
    calls: dict[Key, CallPlan],
    processes: dict[Key, list[SimProcess]],
    workspace: str,
    approval_timeout_s: float | None,
    end_time: float,
    stuck: list[str],
    shared_files: dict[str, bytes] | None = None,
    kill_grace_s: float | None = None,
) -> list[Violation]:
    return Checker(
        entries,
        calls=calls,
        processes=processes,
        workspace=workspace,
        approval_timeout_s=approval_timeout_s,
        end_time=end_time,
        stuck=stuck,
        shared_files=shared_files,
        kill_grace_s=kill_grace_s,
    ).run()
