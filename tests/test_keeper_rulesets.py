"""A sandboxed spawn through the keeper names its ruleset by a number the agent told the keeper
once per connection (keeper protocol 2, actors/keeper.py): each command is still confined, a
number the connection never told is refused with nothing run, and an older keeper (protocol
1, left running by an upgrade) still gets the whole ruleset with each spawn.

A real keeper process in a temporary state dir, real commands, real files.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from tests.keeper_support import SpawnAnswer, kept_backend
from toolwire.actors.kept import KeeperClient, KeepInfo, KeptProcessBackend
from toolwire.actors.sandbox import Confinement, Enforcement
from toolwire.actors.sandbox_policy import SandboxPolicy

PROBED = Enforcement.probe()
needs_landlock = pytest.mark.skipif(
    not PROBED.filesystem, reason="this kernel has no Landlock filesystem rules"
)


async def _run(
    backend: KeptProcessBackend, call_id: str, command: str, cwd: Path, confinement: Confinement
) -> int | None:
    """Spawn `command` confined, wait for its exit, and return its exit code."""
    answer = SpawnAnswer()
    backend.start_spawn(
        ["/bin/sh", "-c", command],
        str(cwd),
        {"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
        answer,
        confinement=confinement,
        keep=KeepInfo("chat", call_id, {"command": command}, 0),
    )
    return await answer.exit_code()


def _enforcement(tmp_path: Path) -> Enforcement:
    """This kernel's, with a temporary directory of its own: `workspace_write` allows writing
    in the temporary directory, and the test's `outside` is beneath the system's."""
    temp = tmp_path / "tmp"
    temp.mkdir(exist_ok=True)
    return Enforcement(PROBED.landlock, temp_dir=str(temp))


def _workspace_confined(tmp_path: Path) -> tuple[Path, Path, Confinement]:
    """A workspace, a directory outside it, and the confinement of `workspace_write` there."""
    ws, outside = tmp_path / "ws", tmp_path / "outside"
    ws.mkdir()
    outside.mkdir()
    confinement = _enforcement(tmp_path).confinement(
        SandboxPolicy(filesystem="workspace_write"), str(ws)
    )
    assert confinement is not None
    return ws, outside, confinement


def _write_both(ws: Path, outside: Path, n: int) -> str:
    return f"echo in > {ws}/in{n}; echo out > {outside}/out{n}; true"


@needs_landlock
async def test_each_spawn_of_a_told_ruleset_is_confined(tmp_path: Path) -> None:
    ws, outside, confinement = _workspace_confined(tmp_path)
    async with kept_backend(tmp_path / "state") as backend:
        assert backend.client.protocol == 2
        for n in range(3):
            assert await _run(backend, f"c{n}", _write_both(ws, outside, n), ws, confinement) == 0
        # Told once: every spawn named the same number.
        assert backend.client.ruleset_id(confinement) == backend.client.ruleset_id(confinement)
    assert sorted(p.name for p in ws.iterdir()) == ["in0", "in1", "in2"]
    assert list(outside.iterdir()) == []  # the kernel refused each write outside


@needs_landlock
async def test_an_older_keeper_gets_the_whole_ruleset_and_still_confines(tmp_path: Path) -> None:
    ws, outside, confinement = _workspace_confined(tmp_path)
    async with kept_backend(tmp_path / "state") as backend:
        backend.client.protocol = 1  # as a keeper of the build before protocol 2 answers
        assert await _run(backend, "old", _write_both(ws, outside, 0), ws, confinement) == 0
    assert [p.name for p in ws.iterdir()] == ["in0"]
    assert list(outside.iterdir()) == []


def _raw_spawn(client: KeeperClient, key: str, command: str, number: int) -> dict[str, object]:
    reply, fds = client.request(
        {
            "op": "spawn",
            "key": key,
            "argv": ["/bin/sh", "-c", command],
            "cwd": "/",
            "env": {},
            "stdin": False,
            "meta": {"chat_id": "chat", "call_id": key, "args": {}, "started_at_ms": 0},
            "ruleset_id": number,
        }
    )
    for fd in fds:
        os.close(fd)
    return reply


@needs_landlock
async def test_a_ruleset_number_the_connection_never_told_is_refused_and_nothing_runs(
    tmp_path: Path,
) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    marker = tmp_path / "ran"
    confinement = _enforcement(tmp_path).confinement(
        SandboxPolicy(filesystem="workspace_write"), str(ws)
    )
    assert confinement is not None
    async with kept_backend(tmp_path / "state") as backend:
        told = backend.client.ruleset_id(confinement)
        reply = _raw_spawn(backend.client, "never-told", f"touch {marker}", told + 1)
        assert reply["errno"] == errno.EINVAL and "bad sandbox" in str(reply["error"]), reply
        assert "pid" not in reply
    # A new connection (a restarted agent) starts with nothing told: the old number is unknown.
    async with kept_backend(tmp_path / "state") as backend:
        reply = _raw_spawn(backend.client, "told-before", f"touch {marker}", told)
        assert reply["errno"] == errno.EINVAL, reply
    assert not marker.exists()


@needs_landlock
async def test_a_forgotten_ruleset_is_told_again_under_a_new_number(tmp_path: Path) -> None:
    """The client keeps at most `MAX_RULESETS` told; the oldest is forgotten on both sides,
    and a spawn of it later tells it again: it is never named by a number the keeper dropped."""
    from toolwire.actors import kept

    ws = tmp_path / "ws"
    ws.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    policies = [
        SandboxPolicy(filesystem="workspace_write", writable=(str(tmp_path / f"w{n}"),))
        for n in range(kept.MAX_RULESETS + 1)
    ]
    async with kept_backend(tmp_path / "state") as backend:
        enforcement = _enforcement(tmp_path)
        confinements = [enforcement.confinement(policy, str(ws)) for policy in policies]
        numbers = [backend.client.ruleset_id(c) for c in confinements if c is not None]
        first = confinements[0]
        assert first is not None
        assert backend.client.ruleset_id(first) not in numbers  # told again, a new number
        refused = _raw_spawn(backend.client, "dropped", "true", numbers[0])
        assert refused["errno"] == errno.EINVAL, refused
        assert await _run(backend, "again", _write_both(ws, outside, 0), ws, first) == 0
    assert list(outside.iterdir()) == []
