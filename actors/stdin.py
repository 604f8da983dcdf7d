"""Writing `process_input` to a process (PROTOCOL.md 9.1), on the loop.

- Order: an input joins its process's queue (actors/input_queue.py) when its call starts,
  synchronously (`join_input`), and writes only at the head of the queue: inputs go in in the
  order their calls arrived, one after another, never interleaved.
- Room: the stdin pipe (or terminal) is non-blocking. An input that fills it waits on the loop
  for room (`wait_writable`), so a 4 MiB input to a slow reader blocks neither the loop nor
  another chat, and each write is at most `WRITE_CHUNK_BYTES` with a checkpoint after it.
- Cancel: an input runs inside a cancel scope its caller keeps. Canceled while it waits for its
  turn, it leaves the queue having written nothing; canceled while it writes, it stops between
  two writes; either way `progress.written` says exactly how many bytes went in.
- Refusals: a process without stdin, one that has exited, or one whose stdin an earlier `eof`
  closed gets nothing written; a process that exits while an input is written ends that input
  with what went in so far.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Final, NamedTuple

import trio

from toolwire.actors.processes import (
    InputClosed,
    ProcessRecord,
    ProcessTable,
    StdinPort,
    has_exited,
)

# The most one write() hands the kernel: a pipe's default capacity (a full pipe takes it in
# one go). After each write the input yields, so a large input never holds the loop.
WRITE_CHUNK_BYTES: Final = 64 * 1024

# After the process printed something in reply to an input, `process_input` waits until it has
# been quiet this long (or `wait_ms` is up, or it exited) before it returns. On a terminal the
# first thing printed is the echo of the typed line itself, a moment before the program's own
# answer: returning at the first byte would hand the model its own words and nothing else.
# 50 ms is far longer than the gap between an echo and a REPL's answer on an idle machine, and
# short against a model's turn; a program that keeps printing is cut off by `wait_ms` anyway.
REPLY_QUIET_S: Final = 0.05


class InputEnd(enum.Enum):
    """How an input ended (besides a cancel, which the caller's scope reports)."""

    WRITTEN = "written"  # all of its data went in (and its eof, if asked)
    NO_PROCESS = "no_process"  # the chat has no process of that id: nothing written
    NO_STDIN = "no_stdin"  # the process was started without stdin: nothing written
    EXITED = "exited"  # it had exited when the input's turn came: nothing written
    CLOSED = "closed"  # an earlier input's `eof` closed its stdin: nothing written
    CUT_SHORT = "cut_short"  # it exited (its input went away) before all of data went in


class InputTicket(NamedTuple):
    """An input's place in its process's queue; `record` None when there is no such process."""

    process_id: str
    record: ProcessRecord | None
    ticket: int


@dataclass
class InputProgress:
    """What an input has done so far: readable after a cancel, whenever it came."""

    written: int = 0  # bytes of this input's data that went in
    output_offset: int | None = None  # the process's output offset when its write began


def join_input(table: ProcessTable, process_id: str) -> InputTicket:
    """Take the input's place in its process's queue. Call it synchronously when the call
    starts, in the order the calls arrived, and hand the ticket to `write_input`, which gives
    the place up whatever happens (a ticket that never reaches `write_input` would hold every
    later input back: give it up with `leave_input`)."""
    record = table.get(process_id)
    if record is None:
        return InputTicket(process_id, None, -1)
    return InputTicket(process_id, record, record.inputs.join())


def leave_input(ticket: InputTicket) -> None:
    """Give up the ticket's place (idempotent): the next input may write."""
    record = ticket.record
    if record is not None and record.inputs.leave(ticket.ticket):
        record.next_input()


def refusal(record: ProcessRecord) -> InputEnd | None:
    """Why nothing may be written to `record` now, or None. A process without stdin is named
    first (the caller's mistake, whatever the process did since), then one that exited."""
    if record.handle.stdin is None:
        return InputEnd.NO_STDIN
    if has_exited(record):
        return InputEnd.EXITED
    if record.stdin_closed:
        return InputEnd.CLOSED
    return None


async def write_input(
    ticket: InputTicket, data: bytes, eof: bool, progress: InputProgress
) -> InputEnd:
    """Wait for the input's turn, then write `data` (and end the input if `eof`). Run it inside
    the cancel scope the caller keeps for the call: trio.Cancelled then comes out of here with
    `progress` telling what went in, and the queue is free for the next input."""
    record = ticket.record
    if record is None:
        return InputEnd.NO_PROCESS
    try:
        while not record.inputs.may_write(ticket.ticket):
            await record.input_turn.wait()
        progress.output_offset = record.output.total
        refused = refusal(record)
        if refused is not None:
            return refused
        port = record.handle.stdin
        assert port is not None  # refusal() said so
        if not await _write_all(record, port, data, progress, counted=True):
            return InputEnd.CUT_SHORT
        if eof:
            await _end(record, port)
        return InputEnd.WRITTEN
    finally:
        leave_input(ticket)


async def _end(record: ProcessRecord, port: StdinPort) -> None:
    """`eof`: a pipe is closed (later inputs are refused); a terminal gets its EOF character,
    written like data (not counted: it is no byte of the call's `data`). A process gone by now
    has ended its input anyway."""
    try:
        char = port.end()
    except InputClosed:
        return
    if not port.terminal:
        record.stdin_closed = True
        return
    await _write_all(record, port, char, InputProgress(), counted=False)


async def _write_all(
    record: ProcessRecord,
    port: StdinPort,
    data: bytes,
    progress: InputProgress,
    *,
    counted: bool,
) -> bool:
    """Write all of `data`; False when the process exited (or its input went away) first."""
    view = memoryview(data)
    pos = 0
    while pos < len(view):
        # Nothing is written once the call was canceled: the check and the write have no
        # checkpoint between them, so a cancel is either before a write or after it.
        await trio.lowlevel.checkpoint_if_cancelled()
        if has_exited(record):
            return False
        try:
            n = port.write_some(view[pos : pos + WRITE_CHUNK_BYTES])
        except InputClosed:
            return False
        if n == 0:
            if not await _room_or_exit(record, port):
                return False
            continue
        pos += n
        if counted:
            progress.written += n
            record.stdin_offset += n
            record.notify()  # its stdin moved: whoever watches the process re-checks
        await trio.lowlevel.checkpoint()
    return True


async def _room_or_exit(record: ProcessRecord, port: StdinPort) -> bool:
    """Wait until the input has room again (True) or the process exited (False)."""
    async with trio.open_nursery() as nursery:

        async def until_exit() -> None:
            await record.exited.wait()
            nursery.cancel_scope.cancel()

        nursery.start_soon(until_exit)
        try:
            await port.wait_room()
        except InputClosed:
            nursery.cancel_scope.cancel()
            return False
        nursery.cancel_scope.cancel()
    return not record.exited.is_set()


async def wait_for_reply(record: ProcessRecord, since: int, wait_s: float) -> None:
    """After an input: wait up to `wait_s` for the process to print or exit (PROTOCOL.md 9.1).
    Returns once it exited and its output ended, or once it printed after offset `since` and
    then stayed quiet for REPLY_QUIET_S; at the latest after `wait_s`."""
    if wait_s <= 0:
        return
    with trio.move_on_after(wait_s):
        while True:
            changed = record.changed
            if record.exited.is_set():
                # What it printed last may still be in the pipe: wait for the end of its
                # output, but not for a background child that keeps the output open.
                with trio.move_on_after(REPLY_QUIET_S):
                    await record.output_closed.wait()
                return
            if record.output.total > since:
                with trio.move_on_after(REPLY_QUIET_S) as quiet:
                    await changed.wait()
                if quiet.cancelled_caught:
                    return
            else:
                await changed.wait()
