"""A command's output through the keeper (actors/keeper.py, actors/pipe_tee.py): the agent
reads every byte once and in order however its reading and the command's printing interleave,
and the keeper's record holds what 5.2's retention keeps of it, also once the agent stopped
reading. Real keeper, real commands, real pipes."""

from __future__ import annotations

import os
from pathlib import Path

import trio

from tests.keeper_support import SpawnAnswer, kept_backend
from toolwire.actors import keeper_store
from toolwire.actors.kept import KeepInfo, KeptProcess, KeptProcessBackend
from toolwire.actors.output import RUNNING_HEAD_BYTES

LINES = 700_000  # `seq`'s output: 4.8 MB, many times what the pipes on its way hold
EXPECTED = "".join(f"{i}\n" for i in range(1, LINES + 1)).encode()
RETENTION = 1 << 20  # kept_backend's
HEAD = RUNNING_HEAD_BYTES  # what a record keeps of the start


def _record_of(state: Path, call_id: str) -> keeper_store.ProcessFile:
    directory = keeper_store.procs_dir(str(state / "keeper"))
    for name in os.listdir(directory):
        found = keeper_store.read_process_file(os.path.join(directory, name))
        if found is not None and found.meta.call_id == call_id:
            return found
    raise AssertionError(f"no record of {call_id}")


def _assert_retained(record: keeper_store.ProcessFile) -> None:
    assert record.output.total == len(EXPECTED)
    assert bytes(record.output.head) == EXPECTED[:HEAD]
    assert bytes(record.output.tail) == EXPECTED[len(EXPECTED) - (RETENTION - HEAD) :]


async def _spawn(backend: KeptProcessBackend, tmp_path: Path, call_id: str) -> KeptProcess:
    answer = SpawnAnswer()
    backend.start_spawn(
        ["/bin/sh", "-c", f"seq 1 {LINES}"],
        str(tmp_path),
        {"PATH": os.environ["PATH"]},
        answer,
        keep=KeepInfo("c", call_id, {"command": "seq"}, 0),
    )
    with trio.fail_after(20):
        await answer.came.wait()
    assert answer.handle is not None, answer.error
    return answer.handle


async def test_a_fast_command_s_output_reaches_the_agent_whole_and_in_order_and_recorded(
    tmp_path: Path,
) -> None:
    state = tmp_path / "state"
    async with kept_backend(state) as backend:
        handle = await _spawn(backend, tmp_path, "fast")
        received = bytearray()
        reads = 0
        with trio.fail_after(60):
            while data := await handle.read_some():
                received += data
                reads += 1
                if reads % 2 == 0:
                    # Slower than `seq` now and then, so that the agent's pipe fills and the
                    # keeper holds the command back (whatever the interleaving, the bytes
                    # must come whole and in order).
                    await trio.sleep(0.002)
            status = await handle.wait()
        assert status.exit_code == 0
        assert bytes(received) == EXPECTED
        _assert_retained(_record_of(state, "fast"))
        handle.close()
        handle.release()


async def test_output_after_the_agent_closed_its_pipe_is_recorded_and_the_exit_still_told(
    tmp_path: Path,
) -> None:
    state = tmp_path / "state"
    async with kept_backend(state) as backend:
        handle = await _spawn(backend, tmp_path, "closed")
        with trio.fail_after(20):
            first = await handle.read_some()
        assert first and EXPECTED.startswith(first)
        handle.close()  # the agent's end of the output pipe goes: the keeper only records
        with trio.fail_after(60):
            status = await handle.wait()
        assert status.exit_code == 0
        _assert_retained(_record_of(state, "closed"))
        handle.release()
