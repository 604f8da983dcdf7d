"""The tool-call record table of one chat: a pure state machine (no trio, no I/O).

Each `(chat_id, call_id)` has at most one record. The chat actor applies every request to this
table synchronously, so the transitions below are atomic under trio's cooperative scheduling.
The table decides; the chat actor carries out the decision (starts a task, kills a process).

States (PROTOCOL.md 5.1 and 5.3):

    QUEUED ----------> AWAITING_APPROVAL ----> RUNNING ----> DONE
       |   \\_________________________________/^   |          ^
       |                    | (cancel/deny/expire)  |          |
       +--------------------+---------------------> DONE (not_run / denied)

- QUEUED: accepted as part of a turn whose segment has not started yet. Nothing has happened.
- AWAITING_APPROVAL: parked at an approval gate. Nothing has happened.
- RUNNING: the effect has begun (a process spawned, a file tool started). `effect_started` is
  set exactly once, here, and a record never leaves DONE: at most once, one result.
- DONE: the saved Result is final and is replayed byte for byte to every later request. The
  record holds it until the owner `release_result`s it (a journal that keeps results holds it
  from then on); the record keeps its outcome.
A cancel of an id the table has never seen stores a DONE tombstone with a `not_run` result, so
a retry that arrives after the cancel (the classic race of a retried request) never runs.
"""

from __future__ import annotations

import enum
import hashlib
from collections.abc import Iterator
from typing import Any

import msgspec

from toolwire.actors.budget import AgentBudget
from toolwire.actors.results import Outcome, Result

_fingerprint_encoder = msgspec.json.Encoder(order="sorted")
_FINGERPRINT_DIGEST_BYTES = 16
_FINGERPRINT_PERSON = b"toolwire.args"
# `args_fingerprint_in_pieces` encodes and hashes a string (or bytes) of this many characters
# or more one piece of this size at a time. A multiple of 3, so that the base64 of bytes pieces
# (JSON's encoding of bytes) joins up exactly; 768 Ki: encoding a piece holds the GIL some
# 0.2 ms here, hashing it releases the GIL (hashlib does from 2 KiB on).
FINGERPRINT_PIECE = 3 * 256 * 1024


def args_fingerprint(tool: str, args: Any) -> bytes:
    """A stable digest of (tool, args): key order inside objects does not matter, values do.

    Two requests for one call_id must carry the same tool and args; a mismatch is a `conflict`
    (a reused id from a different tool call must never be answered with another call's result).
    The digest is kept in the journal, so its definition never changes: BLAKE2b-128 of the
    sorted JSON encoding of `[tool, args]`.
    """
    return hashlib.blake2b(
        _fingerprint_encoder.encode([tool, args]),
        digest_size=_FINGERPRINT_DIGEST_BYTES,
        person=_FINGERPRINT_PERSON,
    ).digest()


def args_fingerprint_in_pieces(tool: str, args: Any, piece: int = FINGERPRINT_PIECE) -> bytes:
    """`args_fingerprint(tool, args)`, the same digest, for big args: no whole encoding of them
    is ever made. Each string or bytes value of `piece` characters or more is taken out of the
    args (a placeholder stands in its place), and the rest is encoded once; the digest is then
    fed that encoding with each value's encoding, made `piece` characters at a time, spliced
    in where its placeholder is. JSON's encoding of a string is the encodings of its characters
    one after the other, and base64 of bytes cut at multiples of 3 joins up, so the bytes fed
    are exactly those of the whole encoding.

    Why: the transport runs this on a worker thread for a big message (16 MiB of `content`),
    where the GIL is then held for one piece's encoding at a time instead of the whole
    encoding's 4-5 ms, and released while a piece is hashed (BLAKE2b of 16 MiB: 18 ms)."""
    taken: list[str | bytes] = []
    rest = _fingerprint_encoder.encode([tool, _take_big(args, piece, taken)])
    marks = [_fingerprint_encoder.encode(_placeholder(i)) for i in range(len(taken))]
    if not taken or any(rest.count(mark) != 1 for mark in marks):
        # Nothing big; or a value of the args spells a placeholder: the plain way, same digest.
        return args_fingerprint(tool, args)
    digest = hashlib.blake2b(digest_size=_FINGERPRINT_DIGEST_BYTES, person=_FINGERPRINT_PERSON)
    done = 0
    for at, i in sorted((rest.index(mark), i) for i, mark in enumerate(marks)):
        digest.update(rest[done:at])
        value = taken[i]
        digest.update(b'"')
        for start in range(0, len(value), piece):
            digest.update(
                memoryview(_fingerprint_encoder.encode(value[start : start + piece]))[1:-1]
            )
        digest.update(b'"')
        done = at + len(marks[i])
    digest.update(rest[done:])
    return digest.digest()


def _take_big(value: Any, piece: int, taken: list[str | bytes]) -> Any:
    """`value` with each string or bytes of `piece` characters or more moved into `taken` and
    a placeholder in its place. A function of the module, not a closure that calls itself: such
    a closure is a reference cycle, and every 16 MiB `content` it took would stay alive until
    the cyclic garbage collector ran (seen: 15 of them, 240 MB, and each new message's decode
    paying for fresh pages)."""
    if isinstance(value, str | bytes) and len(value) >= piece:
        taken.append(value)
        return _placeholder(len(taken) - 1)
    if isinstance(value, dict):
        return {key: _take_big(item, piece, taken) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_take_big(item, piece, taken) for item in value]
    return value


def _placeholder(i: int) -> str:
    return f"\x00toolwire.piece.{i}.\x00"


class RecordState(enum.Enum):
    QUEUED = "queued"
    AWAITING_APPROVAL = "awaiting_approval"
    RUNNING = "running"
    DONE = "done"

    @property
    def wire_state(self) -> str:
        # The protocol knows three states. A queued turn call is reported "running": it has been
        # accepted and will run (or be canceled) without another request. docs/protocol.md.
        return "running" if self is RecordState.QUEUED else self.value


class Admission(enum.Enum):
    NEW = "new"  # no record existed: the caller must start (or gate, or queue) the call
    EXISTING = "existing"  # a record exists with the same tool and args: replay / subscribe
    ADOPTED = "adopted"  # a cancel tombstone without a tool now carries this call's tool/args
    CONFLICT = "conflict"  # same call_id, different tool or args: refuse, touch nothing


class CancelAction(enum.Enum):
    TOMBSTONED = "tombstoned"  # unknown id: a not_run tombstone was stored (received: false)
    CLOSED_BEFORE_RUN = "closed_before_run"  # queued or parked: now DONE not_run
    STOP_RUNNING = "stop_running"  # running: the caller must stop the effect and wait
    ALREADY_DONE = "already_done"  # the saved result stays; leftover processes may be killed


class ToolCallRecord(msgspec.Struct, eq=False):
    """One call id's record (a Struct: one is made per new call, and msgspec builds it in C)."""

    call_id: str
    tool: str | None  # None only for a cancel tombstone no call has named yet
    fingerprint: bytes | None
    state: RecordState
    touched_at: float
    requests: int = 0
    effect_started: bool = False
    cancel_requested: bool = False
    started_at_ms: int | None = None
    deadline: float | None = None  # trio clock; fixed at the first start, never moved
    # The saved result, until released to a store that keeps it (the journal); see `outcome`.
    result: Result | None = None
    outcome: Outcome | None = None  # the saved result's outcome, set once with it, kept
    turn_id: str | None = None
    # How many holders (a running turn, a read of the result from the journal) still need this
    # record's result: a pinned record is never forgotten.
    pins: int = 0
    # Set by the owner once the result is durable and sent to whoever waited for it.
    published: bool = False
    # Owned by the chat actor (subscriptions, gate, process, events): opaque to this module.
    # None once a finished record needs none of it, so idle records stay small.
    runtime: Any = None

    @property
    def done(self) -> bool:
        return self.state is RecordState.DONE

    @property
    def pinned(self) -> bool:
        return self.pins > 0

    def pin(self) -> None:
        """One more holder needs this record's result: it is not forgotten until unpinned."""
        self.pins += 1

    def unpin(self) -> None:
        """A holder is done with the result; every unpin matches one earlier pin."""
        if self.pins <= 0:
            raise TransitionError(f"unpin of {self.call_id!r}, which no one pinned")
        self.pins -= 1


class TransitionError(Exception):
    """A transition the state machine forbids: a bug in the caller, never a user error."""


class RecordTable:
    """All records of one chat, ordered by last touch so that forgetting is O(forgotten)."""

    __slots__ = ("_budget", "_records")

    def __init__(self, budget: AgentBudget | None = None) -> None:
        # A plain dict keeps insertion order, and a touch re-inserts: the same order as an
        # OrderedDict's move_to_end at about 50 bytes less per record (10,000 chats x 10).
        self._records: dict[str, ToolCallRecord] = {}
        # The agent-wide count of records (issue 27), kept here where records come and go: a
        # count before and after every input of the chat cost two calls of `len` per input.
        self._budget = budget

    def __len__(self) -> int:
        return len(self._records)

    def __iter__(self) -> Iterator[ToolCallRecord]:
        return iter(list(self._records.values()))

    def get(self, call_id: str) -> ToolCallRecord | None:
        return self._records.get(call_id)

    def restore(self, record: ToolCallRecord) -> None:
        """Insert a record rebuilt from the journal. Callers restore in touch order."""
        if record.call_id in self._records:
            raise TransitionError(f"{record.call_id} restored twice")
        self._records[record.call_id] = record
        self._counted(1)

    def _counted(self, added: int) -> None:
        if self._budget is not None:
            self._budget.records += added

    def touch(self, record: ToolCallRecord, now: float) -> None:
        """Every request, attach or cancel that names a record resets its age (5.4)."""
        record.touched_at = now
        records = self._records
        del records[record.call_id]
        records[record.call_id] = record

    def admit(
        self,
        call_id: str,
        tool: str,
        fingerprint: bytes,
        now: float,
        *,
        initial_state: RecordState,
        turn_id: str | None = None,
    ) -> tuple[Admission, ToolCallRecord | None]:
        """A `call` or a turn's call names `call_id` (PROTOCOL.md 5.1)."""
        if initial_state not in (
            RecordState.QUEUED,
            RecordState.AWAITING_APPROVAL,
            RecordState.RUNNING,
        ):
            raise TransitionError(f"a new record cannot start in {initial_state}")
        record = self._records.get(call_id)
        if record is None:
            record = ToolCallRecord(
                call_id=call_id,
                tool=tool,
                fingerprint=fingerprint,
                state=RecordState.QUEUED,
                touched_at=now,
                requests=1,
                turn_id=turn_id,
            )
            self._records[call_id] = record
            self._counted(1)
            if initial_state is RecordState.AWAITING_APPROVAL:
                self.park(record)
            elif initial_state is RecordState.RUNNING:
                self.begin(record)
            return Admission.NEW, record
        if record.tool is None:
            # A cancel tombstone: the first call to name it fixes its tool and args, so that
            # later repeats are checked for conflicts like any other record.
            record.tool = tool
            record.fingerprint = fingerprint
            record.requests += 1
            self.touch(record, now)
            return Admission.ADOPTED, record
        if record.tool != tool or record.fingerprint != fingerprint:
            return Admission.CONFLICT, record
        record.requests += 1
        self.touch(record, now)
        return Admission.EXISTING, record

    def attach(self, call_id: str, now: float) -> ToolCallRecord | None:
        record = self._records.get(call_id)
        if record is not None:
            record.requests += 1
            self.touch(record, now)
        return record

    def park(self, record: ToolCallRecord) -> None:
        if record.state is not RecordState.QUEUED:
            raise TransitionError(f"cannot park {record.call_id} in {record.state}")
        record.state = RecordState.AWAITING_APPROVAL

    def unpark(self, record: ToolCallRecord) -> None:
        """The gate was answered yes: the call waits to start like a queued one, and its gate
        can never be answered again."""
        if record.state is not RecordState.AWAITING_APPROVAL:
            raise TransitionError(f"cannot unpark {record.call_id} in {record.state}")
        record.state = RecordState.QUEUED

    def begin(self, record: ToolCallRecord) -> None:
        """The effect starts now. This is the one place `effect_started` is set."""
        if record.state not in (RecordState.QUEUED, RecordState.AWAITING_APPROVAL):
            raise TransitionError(f"cannot start {record.call_id} in {record.state}")
        if record.effect_started:
            raise TransitionError(f"{record.call_id} already started once")
        record.state = RecordState.RUNNING
        record.effect_started = True

    def finish(self, record: ToolCallRecord, result: Result) -> bool:
        """Save the one result. The first finish wins; a later one changes nothing (False)."""
        if record.state is RecordState.DONE:
            return False
        if record.state is RecordState.RUNNING and not record.effect_started:
            raise TransitionError(f"{record.call_id} running without an effect")
        if not record.effect_started and result.outcome.value not in ("not_run", "denied"):
            raise TransitionError(
                f"{record.call_id} never started, so it cannot end {result.outcome.value}"
            )
        record.state = RecordState.DONE
        record.result = result
        record.outcome = result.outcome
        return True

    def publish(self, record: ToolCallRecord) -> None:
        """The saved result is durable and went to everyone waiting for it. From here on it
        may be released to the journal, and the record forgotten once it is old (5.4)."""
        if record.state is not RecordState.DONE or record.published:
            raise TransitionError(f"{record.call_id} has no saved result to publish")
        record.published = True

    def amend(self, record: ToolCallRecord, result: Result) -> None:
        """Replace a saved result that could not be stored (the journal refused its row) and no
        one has seen yet, by the agent-failure result that says so (PROTOCOL.md 9.9)."""
        if record.state is not RecordState.DONE or record.published:
            raise TransitionError(f"{record.call_id} has no unpublished result to amend")
        if not record.effect_started and result.outcome.value not in ("not_run", "denied"):
            raise TransitionError(
                f"{record.call_id} never started, so it cannot end {result.outcome.value}"
            )
        record.result = result
        record.outcome = result.outcome

    def release_result(self, record: ToolCallRecord) -> Result:
        """The owner keeps the saved result elsewhere from now on (a journal that holds it):
        the record keeps its state and outcome, so at most once and "first finish wins" hold
        as before. What only a run needed (its deadline, its start time: the result carries
        it) goes too. Returns the result."""
        result = record.result
        if record.state is not RecordState.DONE or result is None:
            raise TransitionError(f"{record.call_id} has no saved result to release")
        record.result = None
        record.deadline = None
        record.started_at_ms = None
        return result

    def cancel(self, call_id: str, now: float) -> tuple[CancelAction, ToolCallRecord]:
        """Decide what a cancel does (PROTOCOL.md 5.3). For TOMBSTONED the caller must still
        `finish` the returned record with a not_run (or canceled, if it killed a leftover
        process) result; for CLOSED_BEFORE_RUN with not_run."""
        record = self._records.get(call_id)
        if record is None:
            record = ToolCallRecord(
                call_id=call_id,
                tool=None,
                fingerprint=None,
                state=RecordState.QUEUED,
                touched_at=now,
            )
            self._records[call_id] = record
            self._counted(1)
            record.cancel_requested = True
            return CancelAction.TOMBSTONED, record
        self.touch(record, now)
        if record.state is RecordState.DONE:
            return CancelAction.ALREADY_DONE, record
        record.cancel_requested = True
        if record.state is RecordState.RUNNING:
            return CancelAction.STOP_RUNNING, record
        return CancelAction.CLOSED_BEFORE_RUN, record

    def forget_expired(self, now: float, forget_after: float) -> list[ToolCallRecord]:
        """Drop published records untouched for `forget_after` seconds (5.4). Live records,
        and ended ones whose result is not durable and sent yet, stay."""
        forgotten: list[ToolCallRecord] = []
        for record in self._records.values():
            if record.touched_at + forget_after > now:
                break  # ordered by touch: everything after is younger
            # Only once its result went out: a result still on its way to disk is owed to
            # whoever asked, and its durable report must find this record, not a new one.
            if record.published and not record.pinned:
                forgotten.append(record)
        for record in forgotten:
            del self._records[record.call_id]
        if forgotten:
            self._counted(-len(forgotten))
        return forgotten
