"""The keeper's record of a process (actors/keeper_store.py) and the output buffer a restarted
agent rebuilds from it (`OutputBuffer.restored`): what was printed while no agent ran is read
back exactly as an agent that had read it all along would hold it (PROTOCOL.md 10.1, 5.2)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from toolwire.actors import keeper_store
from toolwire.actors.output import OutputBuffer

RETENTION = 4096
HEAD = 1024

chunks = st.lists(st.binary(min_size=1, max_size=3 * RETENTION), max_size=12)


def _meta(**extra: object) -> keeper_store.Meta:
    return keeper_store.Meta(
        chat_id="c", call_id="k", args={"command": "x"}, started_at_ms=1,
        retention_bytes=RETENTION, head_bytes=HEAD, **extra,  # type: ignore[arg-type]
    )  # fmt: skip


def _record(pieces: list[bytes]) -> keeper_store.ProcessFile:
    with tempfile.TemporaryDirectory() as tmp:
        return _record_in(Path(tmp), pieces)


def _record_in(tmp: Path, pieces: list[bytes]) -> keeper_store.ProcessFile:
    path = str(tmp / "p")
    recording = keeper_store.Recording(path, _meta())
    for piece in pieces:
        recording.append(piece)
    recording.close()
    read = keeper_store.read_process_file(path)
    assert read is not None
    return read


@settings(max_examples=200, deadline=None)
@given(pieces=chunks)
def test_a_recording_keeps_the_first_and_the_newest_bytes(pieces: list[bytes]) -> None:
    whole = b"".join(pieces)
    read = _record(pieces)
    assert read.meta == _meta()
    assert read.exit is None
    assert read.output.total == len(whole)
    assert read.output.head == whole[:HEAD]
    assert read.output.tail == whole[max(HEAD, len(whole) - (RETENTION - HEAD)) :]


def _reads(buffer: OutputBuffer) -> list[tuple[int, str] | None]:
    chunks = [
        buffer.read(o, 1 << 20, final_at=buffer.total) for o in range(0, buffer.total + 1, 61)
    ]
    return [None if c is None else (c.offset, c.data) for c in chunks]


@settings(max_examples=200, deadline=None)
@given(pieces=chunks, retention=st.integers(1, 2 * RETENTION))
def test_a_restored_buffer_takes_over_the_bytearrays_it_is_given_and_reads_as_from_copies(
    pieces: list[bytes], retention: int
) -> None:
    """A restart loads the recorded ranges into each buffer without copying them (the
    bytearrays read from the file become its storage), also when this agent retains less or
    more than the recording did: it reads exactly as a buffer loaded from copies."""
    read = _record(pieces)
    # As the agent restores it: its own retention, the recording's head within it.
    limits = {"retention_bytes": retention, "head_bytes": min(HEAD, retention)}
    total = read.output.total
    copied = OutputBuffer.restored(
        bytes(read.output.head), bytes(read.output.tail), total, **limits
    )
    taken = OutputBuffer.restored(read.output.head, read.output.tail, total, **limits)
    assert _reads(taken) == _reads(copied)
    assert taken.result_output() == copied.result_output()
    taken.append(b"after")
    copied.append(b"after")
    assert _reads(taken) == _reads(copied)


@settings(max_examples=200, deadline=None)
@given(pieces=chunks)
def test_a_restored_buffer_reads_as_the_buffer_that_saw_every_byte(pieces: list[bytes]) -> None:
    live = OutputBuffer(retention_bytes=RETENTION, head_bytes=HEAD)
    for piece in pieces:
        live.append(piece)
    read = _record(pieces)
    restored = OutputBuffer.restored(
        read.output.head,
        read.output.tail,
        read.output.total,
        retention_bytes=RETENTION,
        head_bytes=HEAD,
    )
    # From every offset a reader could ask for, the same bytes at the same offsets.
    assert restored.total == live.total
    for offset in range(0, live.total + 1, 97):
        want = live.read(offset, 1 << 20, final_at=live.total)
        got = restored.read(offset, 1 << 20, final_at=restored.total)
        if want is None or got is None:
            assert want is None and got is None
            continue
        assert got.offset == want.offset
        assert got.data == want.data
    assert restored.result_output() == live.result_output()


def test_an_exit_is_recorded_in_its_slot(tmp_path: Path) -> None:
    path = str(tmp_path / "p")
    recording = keeper_store.Recording(path, _meta(pid=42, terminal=True))
    recording.append(b"out")
    recording.write_exit(None, 9, 1234)
    read = keeper_store.read_process_file(path)
    assert read is not None
    assert read.exit == keeper_store.ExitRecord(None, "SIGKILL", 1234)
    assert read.meta.pid == 42 and read.meta.terminal
    recording.write_exit(3, 0, 5)
    again = keeper_store.read_process_file(path)
    assert again is not None and again.exit == keeper_store.ExitRecord(3, None, 5)
    assert again.output.head == b"out"


def test_a_file_that_is_not_a_whole_record_is_none(tmp_path: Path) -> None:
    (tmp_path / "p").write_bytes(b"TWKE")
    assert keeper_store.read_process_file(str(tmp_path / "p")) is None
    assert keeper_store.read_process_file(str(tmp_path / "missing")) is None


def test_a_stop_at_the_hard_deadline_is_recorded_before_and_with_the_exit(tmp_path: Path) -> None:
    path = str(tmp_path / "p")
    recording = keeper_store.Recording(path, _meta())
    recording.write_killed_after()
    assert keeper_store.read_process_file(path).exit is None  # type: ignore[union-attr]
    recording.write_exit(None, 15, 7, killed_after=True)
    read = keeper_store.read_process_file(path)
    assert read is not None and read.exit == keeper_store.ExitRecord(None, "SIGTERM", 7, True)


@settings(max_examples=200, deadline=None)
@given(
    pieces=st.lists(
        st.tuples(st.binary(min_size=1, max_size=3 * RETENTION), st.booleans()), max_size=12
    ),
    retention=st.integers(1, 2 * RETENTION),
    head=st.integers(0, 2 * RETENTION),
)
def test_output_spliced_from_a_pipe_is_recorded_as_output_written_from_memory(
    pieces: list[tuple[bytes, bool]], retention: int, head: int
) -> None:
    """The keeper moves a command's output from its pipe into the record by splice
    (`append_from_pipe`), and writes what it read itself (a terminal's, a last drain) with
    `append`, the two in any order: the file is byte for byte the one `append` alone makes,
    and the pipe gives up exactly the bytes it was asked for."""
    meta = keeper_store.Meta(
        chat_id="c", call_id="k", args={}, started_at_ms=1,
        retention_bytes=retention, head_bytes=head,
    )  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        written = keeper_store.Recording(str(Path(tmp) / "written"), meta)
        spliced = keeper_store.Recording(str(Path(tmp) / "spliced"), meta)
        read_end, write_end = os.pipe()
        try:
            for piece, from_pipe in pieces:
                written.append(piece)
                if from_pipe:
                    os.write(write_end, piece + b"after")
                    spliced.append_from_pipe(read_end, len(piece))
                    assert os.read(read_end, 100) == b"after"  # nothing more was taken
                else:
                    spliced.append(piece)
        finally:
            os.close(read_end)
            os.close(write_end)
        written.close()
        spliced.close()
        assert spliced.total == written.total == sum(len(p) for p, _ in pieces)
        assert (Path(tmp) / "spliced").read_bytes() == (Path(tmp) / "written").read_bytes()
