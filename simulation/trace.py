"""The trace of one simulated run: every request, every event a connection took, every side
effect, fault, connection change and crash, in the order they happened.

Entries are plain tuples (cheap to append: a seed records thousands) whose first item is the
kind and second the virtual time; the index in the list is the entry's sequence number. The
checker reads the whole list after the run; `render` turns it into text for `--trace`.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Literal

import msgspec

from toolwire.actors import events
from toolwire.actors.chat import CallSpec

# ---------------------------------------------------------------------------------------------
# Requests, as the simulated orchestrators send them (the decode-free twin of the wire messages)


@dataclass(frozen=True, slots=True)
class CallReq:
    chat: str
    rid: int
    spec: CallSpec
    stream: bool = True


@dataclass(frozen=True, slots=True)
class AttachReq:
    chat: str
    rid: int
    call_id: str
    from_offset: int = 0


@dataclass(frozen=True, slots=True)
class DetachReq:
    chat: str
    rid: int
    call_id: str


@dataclass(frozen=True, slots=True)
class CancelReq:
    chat: str
    rid: int
    call_ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class ApproveReq:
    chat: str
    rid: int
    call_id: str
    approved: bool
    scope: Literal["call", "chat"] = (
        "call"  # "chat": the call's tool in the whole chat (PROTOCOL.md 9.5)
    )


@dataclass(frozen=True, slots=True)
class TurnReq:
    chat: str
    rid: int
    turn_id: str
    specs: tuple[CallSpec, ...]
    stream: bool = True


@dataclass(frozen=True, slots=True)
class InterruptReq:
    chat: str
    rid: int
    turn_id: str | None = None


@dataclass(frozen=True, slots=True)
class CloseChatReq:
    chat: str
    rid: int


Request = (
    CallReq | AttachReq | DetachReq | CancelReq | ApproveReq | TurnReq | InterruptReq | CloseChatReq
)

# Entry kinds. Layouts (after kind and time):
REQ = "req"  # gen, conn, Request            applied by the agent
LOST = "lost"  # gen, conn, Request          sent on a dead connection: never arrived
EV = "ev"  # conn, Event                     taken from the connection's outbox
OPEN = "open"  # conn, replica
DROP = "drop"  # conn, reason                the connection died: its queue is lost
CLOSE = "close"  # conn                      orderly close at the end of the run
CRASH = "crash"  # gen                       the agent of generation gen died
BOOT = "boot"  # gen, restored              a new agent started on the same journal
EFFECT = "effect"  # gen, chat, call_id, what  a side effect happened (spawn / write / edit)
SIGNAL = "signal"  # gen, chat, call_id, name   the agent signalled a call's process group
REJECT = "reject"  # gen, req_entry, code        the agent refused the request (an `error`)
SHUTDOWN = "shutdown"  # gen                  the agent of generation gen begins a graceful stop
STOPPED = "stopped"  # gen, lost, survivors  its shutdown returned: writes lost, groups left
FAULT = "fault"  # kind, detail
NOTE = "note"  # text

Entry = tuple[Any, ...]


@dataclass
class Trace:
    entries: list[Entry] = field(default_factory=list)
    faults: Counter[str] = field(default_factory=Counter)

    def add(self, *entry: Any) -> int:
        self.entries.append(entry)
        return len(self.entries) - 1

    def fault(self, t: float, kind: str, detail: str = "") -> None:
        self.faults[kind] += 1
        self.entries.append((FAULT, t, kind, detail))

    def digest(self) -> str:
        """A fingerprint of the whole trace: equal digests mean identical runs."""
        h = hashlib.sha256()
        for entry in self.entries:
            h.update(repr(entry).encode())
            h.update(b"\n")
        return h.hexdigest()[:16]


# ---------------------------------------------------------------------------------------------
# Rendering


def short(call_id: str | None) -> str:
    if call_id is None:
        return "-"
    return call_id[:8] if len(call_id) > 12 else call_id


def chat_label(chat: str | None) -> str:
    if chat is None:
        return "-"
    if chat == "":
        return '""'
    return chat[:8] if len(chat) > 12 else chat


def _spec_text(spec: CallSpec) -> str:
    args = msgspec.json.encode(spec.args).decode()
    if len(args) > 60:
        args = args[:57] + "..."
    opts = []
    if spec.timeout_ms:
        opts.append(f"timeout_ms={spec.timeout_ms}")
    if spec.background:
        opts.append("background")
    if spec.approval:
        opts.append("approval")
    extra = (" " + " ".join(opts)) if opts else ""
    return f"{short(spec.call_id)} {spec.tool} {args}{extra}"


def request_text(req: Request) -> str:
    chat = chat_label(req.chat)
    match req:
        case CallReq():
            stream = "" if req.stream else " stream=false"
            return f"call #{req.rid} {chat} {_spec_text(req.spec)}{stream}"
        case AttachReq():
            return f"attach #{req.rid} {chat} {short(req.call_id)} from={req.from_offset}"
        case DetachReq():
            return f"detach #{req.rid} {chat} {short(req.call_id)}"
        case CancelReq():
            return f"cancel #{req.rid} {chat} [{' '.join(short(c) for c in req.call_ids)}]"
        case ApproveReq():
            scope = f" scope={req.scope}" if req.scope != "call" else ""
            return f"approve #{req.rid} {chat} {short(req.call_id)} approved={req.approved}{scope}"
        case TurnReq():
            calls = " | ".join(_spec_text(s) for s in req.specs)
            stream = "" if req.stream else " stream=false"
            return f"turn #{req.rid} {chat} {req.turn_id}{stream}: {calls}"
        case InterruptReq():
            return f"interrupt #{req.rid} {chat} turn={req.turn_id}"
        case CloseChatReq():
            return f"close_chat #{req.rid} {chat}"
    raise TypeError(req)


def result_text(result: Any) -> str:
    text = result.text if len(result.text) <= 50 else result.text[:47] + "..."
    return f"{result.outcome.value} bytes={result.output_bytes} {text!r}"


def event_text(ev: events.Event) -> str:
    match ev:
        case events.AcceptedEvent():
            rid = f" #{ev.rid}" if ev.rid is not None else ""
            return (
                f"accepted{rid} {chat_label(ev.chat_id)} {short(ev.call_id)} "
                f"replay={ev.replay} state={ev.state} requests={ev.requests}"
            )
        case events.OutputEvent():
            data = ev.data if len(ev.data) <= 40 else ev.data[:37] + "..."
            return (
                f"output {chat_label(ev.chat_id)} {short(ev.call_id)} "
                f"@{ev.offset}+{len(ev.data.encode())} {data!r}"
            )
        case events.ResultEvent():
            return f"result {chat_label(ev.chat_id)} {short(ev.call_id)} {result_text(ev.result)}"
        case events.StartedEvent():
            return f"started {chat_label(ev.chat_id)} {short(ev.call_id)} pid={ev.pid}"
        case events.ApprovalEvent():
            return f"approval {chat_label(ev.chat_id)} {short(ev.call_id)} {ev.tool}"
        case events.ApprovalResolvedEvent():
            return f"approval_resolved {chat_label(ev.chat_id)} {short(ev.call_id)} {ev.decision}"
        case events.CancelResultEvent():
            return (
                f"cancel_result #{ev.rid} {chat_label(ev.chat_id)} {short(ev.call_id)} "
                f"received={ev.received} {result_text(ev.result)}"
            )
        case events.TurnPlanEvent():
            segs = " ".join("[" + " ".join(short(c) for c in s) + "]" for s in ev.segments)
            return f"turn_plan #{ev.rid} {chat_label(ev.chat_id)} {ev.turn_id} {segs}"
        case events.TurnResultEvent():
            outs = " ".join(r.outcome.value for r in ev.results)
            return f"turn_result {chat_label(ev.chat_id)} {ev.turn_id} [{outs}]"
        case events.InterruptedEvent():
            ids = " ".join(short(c) for c in ev.call_ids)
            return f"interrupted #{ev.rid} {chat_label(ev.chat_id)} turn={ev.turn_id} [{ids}]"
        case events.ChatClosedEvent():
            ids = " ".join(short(c) for c in ev.call_ids)
            procs = " ".join(short(c) for c in ev.process_ids)
            return f"chat_closed #{ev.rid} {chat_label(ev.chat_id)} [{ids}] processes [{procs}]"
        case events.ErrorEvent():
            return (
                f"error #{ev.rid} {ev.code} {chat_label(ev.chat_id)} {short(ev.call_id)} "
                f"{ev.message[:60]!r}"
            )
    raise TypeError(ev)


def entry_text(entry: Entry) -> str:
    kind, t = entry[0], entry[1]
    head = f"{t:10.4f} "
    if kind == REQ:
        return head + f"g{entry[2]} c{entry[3]} -> {request_text(entry[4])}"
    if kind == LOST:
        return head + f"g{entry[2]} c{entry[3]} -x {request_text(entry[4])} (connection gone)"
    if kind == EV:
        return head + f"   c{entry[2]} <- {event_text(entry[3])}"
    if kind == OPEN:
        return head + f"   c{entry[2]} open (replica r{entry[3]})"
    if kind == DROP:
        return head + f"   c{entry[2]} DROPPED ({entry[3]})"
    if kind == CLOSE:
        return head + f"   c{entry[2]} closed"
    if kind == CRASH:
        return head + f"g{entry[2]} AGENT CRASH"
    if kind == BOOT:
        restored = entry[3] if len(entry) > 3 else ()
        return head + f"g{entry[2]} agent boot ({len(restored)} records in the journal)"
    if kind == EFFECT:
        return head + f"g{entry[2]} EFFECT {entry[5]} {chat_label(entry[3])} {short(entry[4])}"
    if kind == SIGNAL:
        return head + f"g{entry[2]} SIGNAL {entry[5]} {chat_label(entry[3])} {short(entry[4])}"
    if kind == REJECT:
        return head + f"g{entry[2]} refused request of entry {entry[3]}: {entry[4]}"
    if kind == SHUTDOWN:
        return head + f"g{entry[2]} AGENT SHUTDOWN begins"
    if kind == STOPPED:
        return head + f"g{entry[2]} agent stopped ({entry[3]} journal writes lost)"
    if kind == FAULT:
        return head + f"   fault {entry[2]} {entry[3]}"
    if kind == NOTE:
        return head + f"   note {entry[2]}"
    return head + repr(entry)


def render_lines(entries: list[Entry]) -> list[str]:
    return [f"{i:6d} {entry_text(e)}" for i, e in enumerate(entries)]
