"""The keeper client's replies that come later (actors/kept.py, `KeeperClient.request_later`,
`KeptProcessBackend.start_spawn`), against the other end of a real SOCK_SEQPACKET socket pair
played by the test: what it reads is what the keeper would, what it sends back is a reply as the
keeper sends it (with real descriptors and a real process). Time is trio's MockClock, so the
keeper's silence past `REQUEST_TIMEOUT_S` takes no real time.
"""

from __future__ import annotations

import os
import signal
import socket
from pathlib import Path
from typing import Any

import msgspec
import trio
import trio.testing

from toolwire.actors import kept
from toolwire.actors.processes import group_alive


class _Waiter:
    """A `SpawnWaiter` that writes down what it was told."""

    def __init__(self) -> None:
        self.told: list[tuple[str, Any]] = []
        self.changed = trio.Event()

    def _tell(self, what: str, value: Any) -> None:
        self.told.append((what, value))
        self.changed.set()

    def spawned(self, handle: kept.KeptProcess) -> None:
        self._tell("spawned", handle)

    def spawn_failed(self, error: OSError) -> None:
        self._tell("failed", error)

    def spawn_unanswered(self, error: OSError) -> None:
        self._tell("unanswered", error)


def _pair(tmp_path: Path) -> tuple[kept.KeptProcessBackend, socket.socket]:
    ours, keepers = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    ours.setblocking(False)
    client = kept.KeeperClient(str(tmp_path / "keeper"), ours, None)
    return kept.KeptProcessBackend(client, 1 << 20), keepers


def _ask(backend: kept.KeptProcessBackend, waiter: _Waiter, call_id: str) -> None:
    backend.start_spawn(
        ["/bin/sh", "-c", "true"],
        "/",
        {},
        waiter,
        keep=kept.KeepInfo("c", call_id, {"command": "true"}, 0),
    )


def _read(keepers: socket.socket) -> dict[str, Any]:
    message: dict[str, Any] = msgspec.msgpack.decode(keepers.recv(1 << 20))
    return message


async def _told(waiter: _Waiter, count: int) -> None:
    while len(waiter.told) < count:
        waiter.changed = trio.Event()
        await waiter.changed.wait()


async def test_a_spawn_reply_is_read_by_the_reader_and_handed_to_its_waiter(
    tmp_path: Path,
) -> None:
    """Two spawns asked back to back, none waited for; the replies come in order through the
    event reader, each to its own waiter, with its descriptors."""
    backend, keepers = _pair(tmp_path)
    first, second = _Waiter(), _Waiter()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(backend.client.run)
        _ask(backend, first, "k1")
        _ask(backend, second, "k2")
        asked = [_read(keepers), _read(keepers)]
        assert [m["meta"]["call_id"] for m in asked] == ["k1", "k2"]
        assert not first.told and not second.told, "told before the keeper answered"
        read_end, write_end = os.pipe()
        reply = {"rid": asked[1]["rid"], "pid": os.getpid(), "fds": ["out"]}
        socket.send_fds(keepers, [msgspec.msgpack.encode(reply)], [read_end])
        os.close(read_end)
        refusal = {"rid": asked[0]["rid"], "errno": 2, "error": "no such file"}
        keepers.send(msgspec.msgpack.encode(refusal))
        await _told(second, 1)
        await _told(first, 1)
        (what, handle), (failed, error) = second.told[0], first.told[0]
        assert what == "spawned" and isinstance(handle, kept.KeptProcess)
        assert handle.pid == os.getpid()
        os.write(write_end, b"out")
        assert await handle.read_some() == b"out"
        handle.close()
        os.close(write_end)
        assert failed == "failed" and error.errno == 2 and error.strerror == "no such file"
        nursery.cancel_scope.cancel()
    keepers.close()


async def test_a_spawn_the_keeper_does_not_answer_in_time_is_given_up_and_a_late_one_killed(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """The keeper says nothing for `REQUEST_TIMEOUT_S`: the waiter is told it went unanswered
    (the command may have started). When the reply comes after all, no call waits for that
    process any more: its group gets SIGKILL and the keeper is told to release it."""
    backend, keepers = _pair(tmp_path)
    waiter = _Waiter()
    late = await trio.lowlevel.open_process(["sleep", "60"], start_new_session=True)
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(backend.client.run)
            _ask(backend, waiter, "k1")
            asked = _read(keepers)
            await _told(waiter, 1)
            assert waiter.told[0][0] == "unanswered"
            assert trio.current_time() >= kept.REQUEST_TIMEOUT_S
            assert not backend.client.lost, "one silent request is not a lost keeper"
            read_end, write_end = os.pipe()
            reply = {"rid": asked["rid"], "pid": late.pid, "fds": ["out"]}
            socket.send_fds(keepers, [msgspec.msgpack.encode(reply)], [read_end])
            os.close(read_end)
            await late.wait()
            assert late.returncode == -signal.SIGKILL
            assert not group_alive(late.pid)
            await trio.lowlevel.wait_readable(keepers)
            assert _read(keepers) == {"op": "release", "key": asked["key"]}
            assert len(waiter.told) == 1, "told twice"
            os.close(write_end)
            nursery.cancel_scope.cancel()
    finally:
        if late.returncode is None:
            late.kill()
            await late.wait()
        keepers.close()


async def test_spawns_outstanding_when_the_keeper_goes_are_each_unanswered(
    tmp_path: Path,
) -> None:
    """The keeper's end closes with two spawns unanswered: each waiter is told so, once, and
    a spawn asked after that is refused at once (nothing sent)."""
    backend, keepers = _pair(tmp_path)
    waiters = [_Waiter(), _Waiter()]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(backend.client.run)
        for number, waiter in enumerate(waiters):
            _ask(backend, waiter, f"k{number}")
        keepers.close()
        for waiter in waiters:
            await _told(waiter, 1)
            assert waiter.told == [("unanswered", waiter.told[0][1])]
        assert backend.client.lost
        try:
            _ask(backend, _Waiter(), "k9")
        except OSError:
            pass
        else:
            raise AssertionError("a spawn was asked of a keeper that is gone")
        nursery.cancel_scope.cancel()


async def test_more_spawns_than_the_socket_queue_holds_wait_off_the_loop(
    tmp_path: Path,
) -> None:
    """The keeper reads nothing for a while and the agent asks more spawns than the kernel
    queues: each `start_spawn` still returns at once (the rest wait in the client, sent by a
    task as the keeper reads), and every request reaches the keeper in order."""
    backend, keepers = _pair(tmp_path)
    count = 3 * kept.adopt_window() + 10
    waiters = [_Waiter() for _ in range(count)]
    async with trio.open_nursery() as nursery:
        backend.client.nursery = nursery
        nursery.start_soon(backend.client.run)
        for number, waiter in enumerate(waiters):
            _ask(backend, waiter, f"k{number}")  # a send that waited would lose the keeper
        got: list[str] = []
        with trio.fail_after(30):
            while len(got) < count:
                await trio.lowlevel.wait_readable(keepers)
                got.append(_read(keepers)["meta"]["call_id"])
        assert got == [f"k{number}" for number in range(count)]
        nursery.cancel_scope.cancel()
    keepers.close()
