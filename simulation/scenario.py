"""Scenarios (how often each fault happens) and the seed-driven plan of one run: which chats,
which assistant messages, which tool calls with which Coder-style derived ids, what each
simulated command prints, and when the faults strike.

Everything here is drawn from `random.Random` streams seeded by strings (`"<seed>/plan"`), which
Python hashes with SHA-512 whatever PYTHONHASHSEED says: one seed is one plan on every host.
"""

from __future__ import annotations

import itertools
import random
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Literal

from toolwire.actors.chat import CallSpec
from toolwire.simulation.processes import SPAWN_OSERROR, SPAWN_RAISES, Member, Reader, Script
from toolwire.transport.ids import tool_call_ids

# Wall clock of the simulated host at virtual time 0 (2026-01-01T00:00:00Z): timestamps in
# results are then plausible unix milliseconds, and a pure function of the virtual clock.
EPOCH_MS = 1_767_225_600_000


@dataclass(frozen=True)
class Scenario:
    """Rates of everything a run can do. Counts are means per seed; shares are per message,
    per call or per request."""

    name: str
    description: str
    chats: tuple[int, int] = (3, 5)
    messages: tuple[int, int] = (2, 4)
    calls: tuple[int, int] = (2, 6)
    replicas: tuple[int, int] = (2, 3)
    turn_share: float = 0.55  # messages sent as a `turn` (else as `call`s)
    sequential_share: float = 0.3  # of the call-messages: one call after the other
    no_stream_share: float = 0.12
    gated_share: float = 0.07  # calls with approval: true
    policy_share: float = 0.15  # runs whose agent gates a tool by policy (--approve)
    approval_timeout_share: float = 0.3  # runs with --approval-timeout-s
    timeout_share: float = 0.12  # execute calls with a timeout_ms shorter than the command
    background_share: float = 0.04
    spawn_failure_share: float = 0.02  # execute whose spawn raises (OSError or not)
    tool_failure_share: float = 0.02  # file tool that raises inside the agent
    # Faults (means per seed), and per-message shares for the orchestrators' own moves.
    drops: float = 1.2
    stalls: float = 0.8
    crashes: float = 0.25
    duplicate_share: float = 0.05  # requests sent twice in a row
    takeover_share: float = 0.08
    interrupt_share: float = 0.07
    cancel_share: float = 0.08
    early_cancel_share: float = 0.02  # cancel of a call id before its call is sent
    # Messages with a reply-order move (PROTOCOL.md 9.9): detach right after call, a repeat
    # during an attach's replay, an attach from an offset ahead. Drawn from a stream of its
    # own, so the rest of every seed's plan is what it was before these moves existed.
    reply_order_share: float = 0.1
    horizon_s: float = 12.0  # faults strike within this much virtual time
    # Read-modify-write cycles per chat (mean) on the files every chat shares (shared/s*.txt):
    # read, then write with expected_sha256 = the digest read; on a changed-file failure, again.
    rmw_cycles: float = 1.0
    # Runs whose connections go through the real WebSocket server (simulation/wire.py).
    wire_share: float = 0.1
    # Commands that leave other processes in their group (children, background members), each
    # with its own reaction to SIGTERM (PROTOCOL.md 5.3: the cancel's grace is the group's).
    group_share: float = 0.4
    # Approvals sent with scope "chat" (PROTOCOL.md 9.5): of the approving answers, and of the
    # denying ones (where the scope must change nothing).
    scope_chat_share: float = 0.3
    # Interactive sessions per chat (mean, PROTOCOL.md 9.1): an `execute` with `stdin` or `pty`
    # whose script reads its input, then messages of `process_input` calls to it.
    interactive: float = 0.15
    # Commands with a hard deadline (`kill_after_ms`, PROTOCOL.md 9.2), of all `execute`s.
    kill_after_share: float = 0.05
    # Graceful shutdowns of the agent (PROTOCOL.md 9.3) with a restart on the same journal.
    shutdowns: float = 0.05
    # Chats that a driver closes (`close_chat`, PROTOCOL.md 9.6) in the middle of a message.
    close_share: float = 0.03


DEFAULT = Scenario("default", "a mix of everything")

SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        DEFAULT,
        Scenario(
            "calm",
            "no injected faults: the baseline",
            drops=0,
            stalls=0,
            crashes=0,
            duplicate_share=0,
            takeover_share=0,
            interrupt_share=0,
            cancel_share=0,
            early_cancel_share=0,
            reply_order_share=0,
            spawn_failure_share=0,
            tool_failure_share=0,
            shutdowns=0,
            close_share=0,
        ),
        Scenario(
            "retries",
            "connection drops, stalled readers and duplicate sends; every retry reuses its ids",
            drops=4,
            stalls=2,
            crashes=0,
            duplicate_share=0.2,
        ),
        Scenario(
            "takeover",
            "chats handed from replica to replica mid-call, plus drops",
            replicas=(3, 4),
            drops=2,
            takeover_share=0.5,
            crashes=0,
        ),
        Scenario(
            "interrupts",
            "interrupts and cancels at any moment, of turns and of whole chats",
            interrupt_share=0.45,
            cancel_share=0.4,
            early_cancel_share=0.1,
            crashes=0.1,
        ),
        Scenario(
            "approvals",
            "many gated calls, answered late, from other replicas, denied or left to expire",
            gated_share=0.4,
            policy_share=0.5,
            approval_timeout_share=0.5,
            crashes=0.15,
        ),
        Scenario(
            "wire",
            "the default mix of faults, every connection through the real WebSocket server",
            wire_share=1.0,
        ),
        Scenario(
            "files",
            "many chats racing read-modify-write cycles on shared files, with drops and takeovers",
            chats=(4, 6),
            messages=(1, 2),
            rmw_cycles=3.0,
            drops=2,
            takeover_share=0.3,
            crashes=0.3,
        ),
        Scenario(
            "crashes",
            "agent crashes and restarts on the same journal, at any moment",
            crashes=2.0,
            drops=0.5,
        ),
        Scenario(
            "interactive",
            "processes fed by process_input (retried, duplicated, canceled), hard deadlines, "
            "graceful shutdowns with a restart, chats closed while calls run",
            interactive=1.5,
            kill_after_share=0.3,
            shutdowns=0.6,
            close_share=0.25,
            crashes=0.2,
            cancel_share=0.15,
        ),
    )
}

# The default mix: each seed picks one of these by its own draw.
MIX = (
    "default",
    "default",
    "default",
    "retries",
    "takeover",
    "interrupts",
    "approvals",
    "crashes",
    "interactive",
)


def scenario_for(name: str, seed: int) -> Scenario:
    if name == "mix":
        return SCENARIOS[random.Random(f"{seed}/mix").choice(MIX)]
    return SCENARIOS[name]


# ---------------------------------------------------------------------------------------------
# The plan of one run


@dataclass
class CallPlan:
    token: str  # unique per planned call; printed by its command, written into its files
    provider_id: str
    tool: str
    args: dict[str, object]
    call_id: str | None = None  # None when the provider id is unusable (empty or repeated)
    timeout_ms: int | None = None
    background: bool = False
    approval: bool = False
    gated: bool = False
    decision: str = "approve"  # approve / deny / ignore (leave the gate to expire)
    scope: Literal["call", "chat"] = "call"  # the answer's scope: call / chat (PROTOCOL.md 9.5)
    decision_delay: float = 0.5
    script: Script | None = None
    fail: str | None = None  # "before" / "after": the file tool raises inside the agent
    # The shared file a read-modify-write step reads or writes (its args are made at run time).
    shared_path: str | None = None

    @property
    def spec(self) -> CallSpec:
        assert self.call_id is not None
        return CallSpec(
            self.call_id, self.tool, self.args, self.timeout_ms, self.background, self.approval
        )


@dataclass
class RmwPlan:
    """A read-modify-write cycle on a shared file, as a model does it: read the file, then
    write it back (with `write_file`, or an `edit_files` that adds a line at its top) expecting
    the digest it read; if the file changed meanwhile, read and write again, up to `attempts`
    times. The calls are made at run time, since a write's args depend on what was read."""

    path: str  # relative to the workspace, one of SHARED_FILES
    tool: str  # write_file / edit_files
    attempts: int


@dataclass
class MessagePlan:
    message_id: str
    mode: str  # turn / parallel / sequential / rmw
    stream: bool
    calls: list[CallPlan]
    turn_id: str = ""
    # The orchestrator's own moves during this message, as (delay after the first send, what).
    moves: list[tuple[float, str]] = field(default_factory=list)
    rmw: RmwPlan | None = None  # mode "rmw" only

    @property
    def sendable(self) -> list[CallPlan]:
        return [c for c in self.calls if c.call_id is not None]


@dataclass
class ChatPlan:
    index: int
    chat_id: str
    directory: str  # relative to the workspace
    messages: list[MessagePlan]
    replica: int


@dataclass
class Plan:
    seed: int
    scenario: Scenario
    chats: list[ChatPlan]
    replicas: int
    approve_tools: frozenset[str]
    approval_timeout_s: float | None
    kill_grace_s: float
    faults: list[tuple[float, str]]  # (virtual time, drop / stall / crash)
    files: dict[str, bytes]  # initial workspace files
    wire: bool = False  # connections through the real server (simulation/wire.py)

    def calls(self) -> list[tuple[ChatPlan, MessagePlan, CallPlan]]:
        return [(c, m, k) for c in self.chats for m in c.messages for k in m.calls]


# The files every chat's read-modify-write cycles share: few, so that cycles collide. Each
# starts with a line no write ever adds (the edits of a cycle insert a line above the first).
SHARED_FILES = {f"shared/s{k}.txt": f"shared s{k} start\n".encode() for k in range(2)}


def rmw_token(chat: int, message_id: str, attempt: int, step: str) -> str:
    """The token of one step of a cycle: unique per call, and no token is a substring of
    another (the closing "@"), so an edit's `old` (a first line) occurs exactly once."""
    return f"@rmw{chat}.{message_id}.{attempt}{step}@"


def rmw_call(
    plan: Plan,
    chat: ChatPlan,
    message: MessagePlan,
    attempt: int,
    step: str,
    tool: str,
    args: dict[str, object],
) -> CallPlan:
    """One step of a read-modify-write cycle, made at run time (its args depend on what was
    read), with Coder-style ids from the cycle, the attempt and the step."""
    assert message.rmw is not None
    token = rmw_token(chat.index, message.message_id, attempt, step)
    provider_id = f"toolu_{token}"
    [call_id] = tool_call_ids(chat.chat_id, f"{message.message_id}.{attempt}{step}", [provider_id])
    assert call_id is not None  # the one provider id of a step is never unusable
    return CallPlan(
        token=token,
        provider_id=provider_id,
        tool=tool,
        args=args,
        call_id=call_id,
        gated=tool in plan.approve_tools,
        shared_path=message.rmw.path,
    )


_TEXT_PIECES = ("ok", "building", "warning: x", "é", "naïve", "漢字", "🙂", "done", "ünïcödé")


def _output(rng: random.Random, token: str) -> bytes:
    lines: list[str] = []
    for i in range(rng.randint(1, 8)):
        words = " ".join(rng.choice(_TEXT_PIECES) for _ in range(rng.randint(1, 5)))
        lines.append(f"{token} {i} {words}\n")
    if rng.random() < 0.02:
        # Big enough that the Result keeps only a head and a tail (result_output_bytes).
        lines.append(("x" * 99 + "\n") * rng.randint(700, 1200))
    return "".join(lines).encode()


def make_script(rng: random.Random, token: str, spawn_failure_share: float) -> Script:
    kind = rng.random()
    if kind < 0.5:
        duration = rng.uniform(0.001, 0.3)
    elif kind < 0.9:
        duration = rng.uniform(0.3, 3.0)
    else:
        duration = rng.uniform(3.0, 15.0)
    output = _output(rng, token) if rng.random() < 0.9 else b""
    # Cut the output at random byte positions, so a multi-byte character may be split across
    # two writes (the output buffer must hold its first bytes back).
    pieces = rng.randint(1, 6) if output else 0
    cuts = (
        sorted(rng.sample(range(1, len(output)), min(pieces - 1, len(output) - 1)))
        if output
        else []
    )
    bounds = [0, *cuts, len(output)]
    data = [output[a:b] for a, b in itertools.pairwise(bounds) if b > a]
    times = sorted(rng.uniform(0, duration * 0.98) for _ in data)
    spawn_error = None
    if rng.random() < spawn_failure_share:
        spawn_error = rng.choice((SPAWN_OSERROR, SPAWN_RAISES))
    return Script(
        chunks=tuple(zip(times, data, strict=True)),
        duration=duration,
        exit_code=rng.choices((0, 1, 2, 127), weights=(70, 15, 10, 5))[0],
        ignores_term=rng.random() < 0.15,
        spawn_error=spawn_error,
    )


class _Planner:
    def __init__(self, seed: int, scenario: Scenario) -> None:
        self.rng = random.Random(f"{seed}/plan")
        self.scenario = scenario
        self.tokens = 0

    def token(self) -> str:
        self.tokens += 1
        return f"@t{self.tokens}@"

    def uuid(self) -> str:
        return str(uuid.UUID(int=self.rng.getrandbits(128), version=4))

    def call(
        self,
        chat: ChatPlan,
        provider_id: str,
        executes: list[str],
        approve_tools: frozenset[str],
        timeouts: bool,
    ) -> CallPlan:
        rng, s = self.rng, self.scenario
        token = self.token()
        directory = chat.directory
        tool = rng.choices(
            (
                "execute",
                "write_file",
                "edit_files",
                "read_file",
                "process_output",
                "process_signal",
                "process_list",
            ),
            weights=(40, 15, 14, 17, 6, 4, 4),
        )[0]
        if tool.startswith("process_") and tool != "process_list" and not executes:
            tool = "execute"
        plan = CallPlan(token=token, provider_id=provider_id, tool=tool, args={})
        if tool == "execute":
            plan.script = make_script(rng, token, s.spawn_failure_share)
            plan.args = {"command": f"sim-run {token}"}
            r = rng.random()
            if r < s.timeout_share:
                plan.timeout_ms = max(1, int(plan.script.duration * 1000 * rng.uniform(0.1, 0.8)))
            elif r < s.timeout_share * 1.5:
                plan.timeout_ms = int(plan.script.duration * 1000) + rng.randint(50, 5000)
            elif r < s.timeout_share * 1.5 + s.background_share:
                plan.background = True
            elif r < s.timeout_share * 1.5 + s.background_share + 0.01:
                plan.background, plan.timeout_ms = True, 1000  # bad_args: both at once
        elif tool == "write_file":
            path = rng.choice((f"{directory}/f{rng.randint(0, 3)}.txt", f"{directory}/sub/n.txt"))
            plan.args = {"path": path, "content": f"{token}\n" + "text\n" * rng.randint(0, 4)}
        elif tool == "edit_files":
            files = []
            for k in rng.sample(range(3), rng.choice((1, 1, 2))):
                old = "END" if rng.random() < 0.9 else f"NOT THERE {token}"
                files.append(
                    {
                        "path": f"{directory}/f{k}.txt",
                        "edits": [{"old": old, "new": f"{token}\nEND"}],
                    }
                )
            plan.args = {"files": files}
        elif tool == "read_file":
            name = rng.choice(("f0.txt", "f1.txt", "f2.txt", "f3.txt", "missing.txt"))
            plan.args = {"path": f"{directory}/{name}"}
            if rng.random() < 0.02:
                plan.args = {"file": name}  # malformed: a barrier, fails when run
        elif tool == "process_output":
            plan.args = {"process_id": rng.choice(executes)}
            if rng.random() < 0.5:
                plan.args["wait"] = True
                plan.args["wait_ms"] = rng.randint(0, 4000)
        elif tool == "process_signal":
            plan.args = {
                "process_id": rng.choice(executes),
                "signal": rng.choice(("SIGTERM", "SIGKILL", "SIGINT")),
            }
        if tool in ("write_file", "edit_files") and rng.random() < s.tool_failure_share:
            plan.fail = rng.choice(("before", "after"))
        plan.approval = rng.random() < s.gated_share
        plan.gated = plan.approval or tool in approve_tools
        if plan.gated:
            plan.decision = rng.choices(("approve", "deny", "ignore"), weights=(70, 20, 10))[0]
            if plan.decision == "ignore" and not timeouts:
                plan.decision = "approve"
            plan.decision_delay = rng.choice((rng.uniform(0.001, 0.1), rng.uniform(0.1, 4.0)))
        return plan


def make_plan(seed: int, scenario: Scenario) -> Plan:
    p = _Planner(seed, scenario)
    rng, s = p.rng, scenario
    replicas = rng.randint(*s.replicas)
    approve_tools: frozenset[str] = frozenset()
    if rng.random() < s.policy_share:
        approve_tools = frozenset({rng.choice(("write_file", "execute", "edit_files"))})
    approval_timeout_s = rng.uniform(1.0, 10.0) if rng.random() < s.approval_timeout_share else None
    kill_grace_s = rng.choice((0.2, 1.0, 2.0))
    chats: list[ChatPlan] = []
    files: dict[str, bytes] = {}
    n_chats = rng.randint(*s.chats)
    chatless = rng.random() < 0.15
    for ci in range(n_chats):
        chat_id = "" if chatless and ci == 0 else p.uuid()
        chat = ChatPlan(ci, chat_id, f"c{ci}", [], rng.randrange(replicas))
        for k in range(3):
            files[f"c{ci}/f{k}.txt"] = b"".join(b"line %d\n" % i for i in range(5)) + b"END\n"
        executes: list[str] = []
        for mi in range(rng.randint(*s.messages)):
            message_id = str(mi * 2 + 1)
            n_calls = rng.randint(*s.calls)
            provider_ids = [f"toolu_{rng.getrandbits(40):010x}" for _ in range(n_calls)]
            if n_calls > 1 and rng.random() < 0.03:
                provider_ids[1] = provider_ids[0]  # a provider that repeats an id: unusable
            ids = tool_call_ids(chat_id, message_id, provider_ids)
            calls = []
            for provider_id, call_id in zip(provider_ids, ids, strict=True):
                plan = p.call(
                    chat, provider_id, executes, approve_tools, approval_timeout_s is not None
                )
                plan.call_id = call_id
                calls.append(plan)
            for plan in calls:
                if plan.tool == "execute" and plan.call_id is not None:
                    executes.append(plan.call_id)
            r = rng.random()
            mode = (
                "turn"
                if r < s.turn_share
                else "sequential"
                if rng.random() < s.sequential_share
                else "parallel"
            )
            message = MessagePlan(
                message_id=message_id,
                mode=mode,
                stream=rng.random() >= s.no_stream_share,
                calls=calls,
                turn_id=f"turn-{chat_id[:8] or 'none'}-{message_id}",
            )
            for share, move in (
                (s.interrupt_share, "interrupt"),
                (s.cancel_share, "cancel"),
                (s.takeover_share, "takeover"),
            ):
                if rng.random() < share:
                    message.moves.append(
                        (rng.choice((rng.uniform(0, 0.05), rng.uniform(0, 4))), move)
                    )
            chat.messages.append(message)
        chats.append(chat)
    reply_order = random.Random(f"{seed}/reply-order")
    for chat in chats:
        for message in chat.messages:
            if reply_order.random() < s.reply_order_share:
                move = reply_order.choice(
                    ("detach-after-call", "repeat-during-replay", "attach-ahead")
                )
                message.moves.append((reply_order.uniform(0, 0.5), move))
    # An early cancel names a call of a later message before that message is sent: the cancel
    # leaves a tombstone and the call, when it comes, must get the saved not_run.
    for chat in chats:
        for mi, message in enumerate(chat.messages[:-1]):
            if rng.random() < s.early_cancel_share:
                later = chat.messages[mi + 1].sendable
                if later:
                    target = rng.choice(later).call_id
                    message.moves.append((rng.uniform(0, 1), f"early-cancel:{target}"))
    faults: list[tuple[float, str]] = []
    for count, kind in ((s.drops, "drop"), (s.stalls, "stall"), (s.crashes, "crash")):
        for _ in range(_poisson(rng, count)):
            faults.append((rng.uniform(0, s.horizon_s), kind))
    faults.sort()
    _plan_rmw_cycles(random.Random(f"{seed}/rmw"), s, chats)
    _plan_groups(random.Random(f"{seed}/groups"), s, chats)
    _plan_scopes(random.Random(f"{seed}/scopes"), s, chats)
    _plan_interactive(random.Random(f"{seed}/interactive"), s, chats, approve_tools)
    _plan_kill_after(random.Random(f"{seed}/kill-after"), s, chats)
    _plan_closes(random.Random(f"{seed}/close"), s, chats)
    shutdowns = random.Random(f"{seed}/shutdown")
    for _ in range(_poisson(shutdowns, s.shutdowns)):
        faults.append((shutdowns.uniform(0, s.horizon_s), "shutdown"))
    faults.sort()
    files.update(SHARED_FILES)
    return Plan(
        seed=seed,
        scenario=s,
        chats=chats,
        replicas=replicas,
        approve_tools=approve_tools,
        approval_timeout_s=approval_timeout_s,
        kill_grace_s=kill_grace_s,
        faults=faults,
        files=files,
        wire=random.Random(f"{seed}/wire").random() < s.wire_share,
    )


def _plan_rmw_cycles(rng: random.Random, s: Scenario, chats: list[ChatPlan]) -> None:
    """Insert each chat's read-modify-write cycles among its messages. A stream of its own, so
    that the rest of a seed's plan is what it was before cycles existed."""
    for chat in chats:
        for k in range(_poisson(rng, s.rmw_cycles)):
            message = MessagePlan(
                message_id=f"rmw{k}",
                mode="rmw",
                stream=rng.random() >= s.no_stream_share,
                calls=[],
                rmw=RmwPlan(
                    path=rng.choice(sorted(SHARED_FILES)),
                    tool=rng.choice(("write_file", "edit_files")),
                    attempts=rng.randint(2, 5),
                ),
            )
            for share, move in ((s.takeover_share, "takeover"), (s.cancel_share / 2, "cancel")):
                if rng.random() < share:
                    message.moves.append((rng.uniform(0, 0.5), move))
            chat.messages.insert(rng.randint(0, len(chat.messages)), message)


def _plan_groups(rng: random.Random, s: Scenario, chats: list[ChatPlan]) -> None:
    """Give some commands other members in their process group. A stream of its own, so that
    the rest of a seed's plan is what it was before groups existed."""
    for call, script in _commands(chats):
        if rng.random() < s.group_share:
            members = tuple(
                make_member(rng, call.token, k, script.duration)
                for k in range(rng.choice((1, 1, 2, 3)))
            )
            chunks = script.chunks
            if any(m.chunks for m in members):
                # Another writer's line in the middle of a character would make the stream
                # invalid UTF-8: the shell writes whole characters here.
                chunks = whole_characters(chunks)
            call.script = replace(script, chunks=chunks, members=members)


def _commands(chats: list[ChatPlan]) -> Iterator[tuple[CallPlan, Script]]:
    """Every planned command that spawns (a script, no spawn error), in plan order."""
    for chat in chats:
        for message in chat.messages:
            for call in message.calls:
                script = call.script
                if script is not None and script.spawn_error is None:
                    yield call, script


def whole_characters(chunks: tuple[tuple[float, bytes], ...]) -> tuple[tuple[float, bytes], ...]:
    """The same bytes, with a character split across two chunks moved whole into the later."""
    out: list[tuple[float, bytes]] = []
    carry = b""
    for t, data in chunks:
        data = carry + data
        cut = len(data) - _incomplete_tail(data)
        carry = data[cut:]
        if cut:
            out.append((t, data[:cut]))
    if carry:  # unreachable for whole outputs; kept so that no byte is ever lost
        out.append((chunks[-1][0], carry))
    return tuple(out)


def _incomplete_tail(data: bytes) -> int:
    """How many bytes at the end of `data` begin a character that is not complete."""
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte < 0x80:
            return 0
        if byte >= 0xC0:
            need = 2 if byte < 0xE0 else 3 if byte < 0xF0 else 4
            return back if back < need else 0
    return 0


def make_member(rng: random.Random, token: str, k: int, shell_s: float) -> Member:
    """A child the shell waits for (it ends before the shell), or a background one that may
    outlive it; it exits at SIGTERM, ignores it, or traps it and cleans up for a while (shorter
    or longer than the kill grace, which is 0.2-2 s)."""
    # Most children start at once (a build's compiler, a test runner's workers), some later.
    early = rng.random() < 0.6
    start = rng.uniform(0.0005, max(0.001, shell_s * (0.05 if early else 0.5)))
    if rng.random() < 0.6:
        duration = max(0.0005, (shell_s - start) * rng.uniform(0.5, 0.98))
        holds_pipe = rng.random() < 0.8
    else:
        duration = max(0.0005, shell_s - start) + rng.uniform(0.1, 20.0)
        holds_pipe = rng.random() < 0.5
    cleanup = rng.choices((0.0, rng.uniform(0.005, 3.0), None), weights=(25, 60, 15))[0]
    chunks: tuple[tuple[float, bytes], ...] = ()
    if holds_pipe:
        chunks = tuple(
            sorted(
                (
                    rng.uniform(0, duration * 0.98),
                    f"{token} m{k}.{i} {rng.choice(_TEXT_PIECES)}\n".encode(),
                )
                for i in range(rng.randint(0, 2))
            )
        )
    return Member(start, duration, cleanup, holds_pipe, chunks)


def _plan_scopes(rng: random.Random, s: Scenario, chats: list[ChatPlan]) -> None:
    """Answer some gates with scope "chat". A stream of its own, like the cycles'."""
    for chat in chats:
        for message in chat.messages:
            for call in message.calls:
                if call.gated and call.decision != "ignore" and rng.random() < s.scope_chat_share:
                    call.scope = "chat"


_LETTERS = "abcdefghijklmnopqrstuvwxyz0123456789 "


def _plan_interactive(
    rng: random.Random, s: Scenario, chats: list[ChatPlan], approve_tools: frozenset[str]
) -> None:
    """Insert each chat's interactive sessions among its messages: an `execute` with a stdin
    pipe or a terminal (sometimes neither: its inputs must fail) whose script reads what it is
    given, then one to three messages of `process_input` calls to it, several at once in
    parallel messages (they queue), the last sometimes with `eof`. A stream of its own."""
    for chat in chats:
        for k in range(_poisson(rng, s.interactive)):
            token = f"@x{chat.index}.{k}@"
            duration = rng.choice((rng.uniform(0.05, 1.0), rng.uniform(1.0, 20.0)))
            script = Script(
                chunks=((0.0, f"{token} ready\n".encode()),),
                duration=duration,
                exit_code=rng.choice((0, 0, 1)),
                ignores_term=rng.random() < 0.1,
                reader=Reader(
                    capacity=rng.choice((16, 64, 512, 65536)),
                    period=rng.uniform(0.001, 0.1),
                    chunk=rng.choice((1, 7, 64, 4096)),
                ),
                echo_prefix=token.encode(),
            )
            args: dict[str, object] = {"command": f"sim-run {token}"}
            how = rng.random()
            if how < 0.55:
                args["stdin"] = True
            elif how < 0.9:
                args["pty"] = {"rows": 24, "cols": 80}
            # The agent's policy gates it like any other `execute` (answered as a
            # read-modify-write step is: approved, after the default delay).
            start = CallPlan(
                token, f"toolu_{token}", "execute", args, script=script,
                gated="execute" in approve_tools,
            )  # fmt: skip
            mode = rng.random()
            if mode < 0.6:
                start.background = True
            elif mode < 0.9:
                start.timeout_ms = max(1, int(duration * 1000 * rng.uniform(0.05, 0.5)))
            message_id = f"ia{k}"
            [start.call_id] = tool_call_ids(chat.chat_id, message_id, [start.provider_id])
            block = [MessagePlan(message_id, "sequential", rng.random() >= 0.1, [start])]
            n_messages = rng.randint(1, 3)
            for m in range(n_messages):
                inputs: list[CallPlan] = []
                n_inputs = rng.choice((1, 1, 2, 3))
                for j in range(n_inputs):
                    itoken = f"<i{chat.index}.{k}.{m}.{j}>"
                    size = rng.choice((0, 8, 40, 300, 2000))
                    payload = "".join(rng.choice(_LETTERS) for _ in range(rng.randint(0, size)))
                    iargs: dict[str, object] = {
                        "process_id": start.call_id,
                        "data": f"{itoken}{payload}\n",
                    }
                    if m == n_messages - 1 and j == n_inputs - 1 and rng.random() < 0.3:
                        iargs["eof"] = True
                    wait = rng.choice((0, 0, 20, 300))
                    if wait:
                        iargs["wait_ms"] = wait
                    inputs.append(CallPlan(itoken, f"toolu_{itoken}", "process_input", iargs))
                mid = f"ia{k}.{m}"
                ids = tool_call_ids(chat.chat_id, mid, [c.provider_id for c in inputs])
                for call, call_id in zip(inputs, ids, strict=True):
                    call.call_id = call_id
                message = MessagePlan(
                    mid,
                    "parallel" if rng.random() < 0.6 else "sequential",
                    rng.random() >= 0.1,
                    inputs,
                )
                for share, move in ((s.cancel_share * 2, "cancel"), (s.takeover_share, "takeover")):
                    if rng.random() < share:
                        message.moves.append((rng.uniform(0, 0.3), move))
                block.append(message)
            at = rng.randint(0, len(chat.messages))
            chat.messages[at:at] = block


def _plan_kill_after(rng: random.Random, s: Scenario, chats: list[ChatPlan]) -> None:
    """Give some commands a hard deadline (`kill_after_ms`), shorter or longer than they run,
    foreground, timed-out and background alike. A stream of its own."""
    for call, script in _commands(chats):
        if rng.random() < s.kill_after_share:
            ms = int(script.duration * 1000 * rng.uniform(0.1, 1.6))
            call.args = {**call.args, "kill_after_ms": max(1, ms)}


def _plan_closes(rng: random.Random, s: Scenario, chats: list[ChatPlan]) -> None:
    """Close some chats (`close_chat`) during one of their messages. A stream of its own."""
    for chat in chats:
        if chat.messages and rng.random() < s.close_share:
            message = rng.choice(chat.messages)
            message.moves.append((rng.choice((rng.uniform(0, 0.05), rng.uniform(0, 3))), "close"))


def _poisson(rng: random.Random, mean: float) -> int:
    if mean <= 0:
        return 0
    # Knuth's method: fine for the small means used here.
    limit, k, p = pow(2.718281828459045, -mean), 0, 1.0
    while True:
        p *= rng.random()
        if p <= limit:
            return k
        k += 1
