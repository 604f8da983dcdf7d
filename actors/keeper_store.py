"""What the keeper records of each process it holds, on disk in the state dir (PROTOCOL.md
10.1): read by the keeper that writes it, and by an agent that finds a process whose keeper is
gone. No trio: the keeper is a plain process, and the agent reads these files once, at start.

One file per process, `<state>/keeper/p/<key>`, made once at its spawn:
- a header: the magic, the count of every output byte ever recorded (8 bytes, little endian),
  the exit status once the keeper reaped the shell (a fixed 32-byte slot, written in one
  `pwrite` inside the first page, so a reader sees all of it or none), then what the agent told
  the keeper when it asked for the spawn (`Meta`: chat, call, the `execute` args, the first
  start's wall time, msgpack);
- the output under 5.2's retention: the first `head_bytes` bytes, then a ring of
  `retention_bytes - head_bytes` bytes holding the newest ones. At most the header plus
  `retention_bytes`, however much is printed.
A file created costs ~90 us on the ext4 this was measured on, and 300 us to 1 ms when the
machine is busy (a directory ~120 us more, a rename or an unlink as much again): more than the
rest of a spawn. So no spawn creates or deletes one. The keeper takes a spare file made ahead
by a thread of its own (`SpareFiles`) and writes the header in one `pwrite`; a forgotten
process's file goes back to the spares, its magic zeroed first so that no reader takes it for a
record. A file's name is therefore a slot's, not the call's: a reader finds the call in the
meta (`key_for(meta.chat_id, meta.call_id)`).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import queue
import secrets
import signal
import struct
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Final

import msgspec

from toolwire.actors.output import RUNNING_HEAD_BYTES

MAGIC: Final = b"TWKEEP1\0"
_COUNT = struct.Struct("<Q")
# exited, has a code, stopped at its kill_after_ms by the keeper, code, signal number, at_ms
_EXIT = struct.Struct("<BBBxiiQ8x")
_KILLED_AFTER_AT: Final = 2  # the flag's byte in the slot (set on its own, before the exit)
_META_LEN = struct.Struct("<I")
# Spare files the keeper keeps made ahead: more than a burst of spawns takes between two
# refills (the thread makes one in ~0.1-1 ms).
SPARE_FILES: Final = 16
# The thread makes more only once fewer than this are left: a spawn and a release one after
# the other take a spare and give it back, and no file is made or deleted for them.
SPARE_LOW_WATER: Final = 8
COUNT_AT: Final = len(MAGIC)
EXIT_AT: Final = COUNT_AT + _COUNT.size
META_AT: Final = EXIT_AT + _EXIT.size + _META_LEN.size


def key_for(chat_id: str, call_id: str) -> str:
    """The file name of a call's process: fixed length, no path characters, whatever the
    ids hold."""
    digest = hashlib.sha256(chat_id.encode() + b"\0" + call_id.encode())
    return digest.hexdigest()[:32]


def procs_dir(keeper_dir: str) -> str:
    return os.path.join(keeper_dir, "p")


class Meta(msgspec.Struct, kw_only=True):
    """What the agent asked for: enough for a restarted agent to rebuild the call."""

    chat_id: str
    call_id: str
    args: Any  # the `execute` args as the call gave them (msgpack of the wire's JSON)
    started_at_ms: int
    retention_bytes: int
    head_bytes: int = RUNNING_HEAD_BYTES
    pid: int = 0
    terminal: bool = False


@dataclass(frozen=True, slots=True)
class ExitRecord:
    exit_code: int | None
    signal: str | None
    at_ms: int
    killed_after: bool = False  # the keeper stopped it at its kill_after_ms (PROTOCOL.md 9.2)


@dataclass(frozen=True, slots=True)
class Recorded:
    """A recording as read back: the head and tail ranges and the count of all bytes."""

    head: bytearray
    tail: bytearray
    total: int


@dataclass(frozen=True, slots=True)
class ProcessFile:
    """One process's file, read back whole."""

    meta: Meta
    exit: ExitRecord | None
    output: Recorded


def _data_at(meta_len: int) -> int:
    return (META_AT + meta_len + 7) // 8 * 8


class Recording:
    """The file of one process, written by its keeper as it reads the process's output."""

    def __init__(self, path: str, meta: Meta, fd: int | None = None) -> None:
        """A new record of `meta` in `path`, or in `fd` (a spare file of that path: what it
        held before is overwritten or beyond the count, so never read)."""
        self.path = path
        self._head = min(meta.head_bytes, meta.retention_bytes)
        self._ring = meta.retention_bytes - self._head
        self.total = 0
        self._splices = True  # until a file system refuses a splice (`_splice`)
        encoded = msgspec.msgpack.encode(meta)
        self._base = _data_at(len(encoded))
        if fd is None:
            fd = _create(path)
        self._fd = fd
        header = bytearray(self._base)
        header[: len(MAGIC)] = MAGIC
        _META_LEN.pack_into(header, EXIT_AT + _EXIT.size, len(encoded))
        header[META_AT : META_AT + len(encoded)] = encoded
        os.pwrite(self._fd, header, 0)

    def append(self, data: bytes) -> None:
        with memoryview(data) as view:
            done = 0
            for length, at in self._places(len(data)):
                if at is not None:
                    os.pwrite(self._fd, view[done : done + length], at)
                done += length
        self._counted(len(data))

    def append_from_pipe(self, fd: int, count: int) -> None:
        """Move the `count` bytes at the head of the pipe `fd` (it holds at least that many)
        into the record, where `append` would write them: spliced by the kernel, never copied
        through this process (actors/pipe_tee.py says why). Bytes the retention drops are
        read and dropped."""
        for length, at in self._places(count):
            if at is None:
                _discard(fd, length)
            else:
                self._splice(fd, length, at)
        self._counted(count)

    def _places(self, count: int) -> Iterator[tuple[int, int | None]]:
        """Where the next `count` bytes of output go under 5.2's retention, in their order:
        (how many, the file offset they are written at), the offset None for bytes only the
        count keeps (older than the ring's newest)."""
        offset = self.total
        left = count
        if offset < self._head:
            part = min(left, self._head - offset)
            yield part, self._base + offset
            offset += part
            left -= part
        if left > self._ring:  # only the newest bytes of it are retained
            yield left - self._ring, None
            offset += left - self._ring
            left = self._ring
        while left:
            at = (offset - self._head) % self._ring
            part = min(left, self._ring - at)
            yield part, self._base + self._head + at
            offset += part
            left -= part

    def _counted(self, count: int) -> None:
        self.total += count
        os.pwrite(self._fd, _COUNT.pack(self.total), COUNT_AT)

    def _splice(self, fd: int, count: int, at: int) -> None:
        """`count` bytes from the pipe `fd` into the file at `at`; read and written where
        the file system cannot splice (EINVAL)."""
        while count:
            if self._splices:
                try:
                    moved = os.splice(fd, self._fd, count, offset_dst=at)
                except OSError as exc:
                    if exc.errno != errno.EINVAL:
                        raise
                    self._splices = False
                    continue
            else:
                data = os.read(fd, count)
                moved = os.pwrite(self._fd, data, at) if data else 0
                if moved < len(data):  # (a regular file takes all of it, or raises)
                    raise OSError(errno.EIO, "short write to a record")
            if not moved:
                raise OSError(errno.EIO, "a pipe held less than it said")
            count -= moved
            at += moved

    def write_exit(
        self, exit_code: int | None, signum: int, at_ms: int, *, killed_after: bool = False
    ) -> None:
        code = 0 if exit_code is None else exit_code
        slot = _EXIT.pack(1, exit_code is not None, killed_after, code, signum, at_ms)
        os.pwrite(self._fd, slot, EXIT_AT)

    def write_killed_after(self) -> None:
        """The keeper stopped the group at its kill_after_ms (its exit comes later)."""
        os.pwrite(self._fd, b"\1", EXIT_AT + _KILLED_AFTER_AT)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def detach(self) -> int:
        """The file's descriptor, which this recording no longer writes to (-1 once closed)."""
        fd, self._fd = self._fd, -1
        return fd


def _discard(fd: int, count: int) -> None:
    """Read and drop `count` bytes of the pipe `fd` (it holds at least that many)."""
    while count:
        data = os.read(fd, min(count, 1024 * 1024))
        if not data:
            raise OSError(errno.EIO, "a pipe held less than it said")
        count -= len(data)


def _create(path: str) -> int:
    return os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)


class SpareFiles:
    """Files made ahead of the spawns that take them, by a thread of their own (see the module
    docstring): `take` never waits for the disk unless a burst emptied the spares."""

    def __init__(self, directory: str, target: int = SPARE_FILES) -> None:
        self._directory = directory
        self._target = target
        self._spares: queue.SimpleQueue[tuple[str, int]] = queue.SimpleQueue()
        self._count = 0  # spares made or given back, less those taken (the thread's guide)
        self._lock = threading.Lock()
        self._wanted = threading.Event()
        self._closed = threading.Event()
        self._wanted.set()
        threading.Thread(target=self._refill, name="spare-files", daemon=True).start()

    def _new(self) -> tuple[str, int]:
        path = os.path.join(self._directory, "s" + secrets.token_hex(8))
        return path, _create(path)

    def _refill(self) -> None:
        while True:
            self._wanted.wait()
            self._wanted.clear()
            while not self._closed.is_set():
                with self._lock:
                    if self._count >= self._target:
                        break
                    self._count += 1
                try:
                    spare = self._new()
                    if self._closed.is_set():  # made while the keeper ended: not left behind
                        os.close(spare[1])
                        remove(spare[0])
                        return
                    self._spares.put(spare)
                except OSError:
                    with self._lock:
                        self._count -= 1
                    break  # the disk refuses: `take` makes one itself and says why
            if self._closed.is_set():
                return

    def take(self) -> tuple[str, int]:
        """A spare file: its path and a descriptor open for reading and writing."""
        try:
            spare = self._spares.get_nowait()
        except queue.Empty:
            spare = None
        if spare is not None:
            with self._lock:
                self._count -= 1
                low = self._count < SPARE_LOW_WATER
            if low:
                self._wanted.set()
            return spare
        self._wanted.set()
        return self._new()

    def give_back(self, path: str, fd: int) -> None:
        """A forgotten process's file: a spare again (its magic zeroed at once, so no reader
        takes it for a record), or deleted when there are spares enough. `fd` -1: the file is
        closed (its process was done), and opened again here."""
        try:
            if fd < 0:
                fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        except OSError:
            remove(path)
            return
        try:
            os.pwrite(fd, bytes(len(MAGIC)), 0)
        except OSError:
            os.close(fd)
            remove(path)
            return
        with self._lock:
            keep = self._count < self._target and not self._closed.is_set()
            if keep:
                self._count += 1
        if keep:
            self._spares.put((path, fd))
        else:
            os.close(fd)
            remove(path)

    def close(self) -> None:
        """Delete every spare (at the keeper's end; the thread makes no more)."""
        self._closed.set()
        self._wanted.set()
        while True:
            try:
                path, fd = self._spares.get_nowait()
            except queue.Empty:
                return
            os.close(fd)
            remove(path)


def is_record(path: str) -> bool:
    """The file holds a record (its magic), not a spare or a record being made."""
    try:
        with open(path, "rb") as file:
            return file.read(len(MAGIC)) == MAGIC
    except OSError:
        return False


def read_meta(path: str) -> Meta | None:
    """A record's meta only (its header), without its output; None if it is no record."""
    try:
        with open(path, "rb") as file:
            header = file.read(META_AT)
            if len(header) < META_AT or not header.startswith(MAGIC):
                return None
            (meta_len,) = _META_LEN.unpack_from(header, EXIT_AT + _EXIT.size)
            return msgspec.msgpack.decode(file.read(meta_len), type=Meta)
    except (OSError, msgspec.DecodeError):
        return None


def read_process_file(path: str) -> ProcessFile | None:
    """A process's file, or None when it is not one whole (a spawn that never happened).

    Read range by range (`pread`): the header, then each retained range straight into the
    bytearray that `OutputBuffer.load_recorded` takes over. A restarting agent reads one file
    per process it re-adopts, up to `retention_bytes` each, before it answers anything: read
    whole and sliced, each retained byte was copied three more times (100 files of 1 MiB read
    and loaded in 97-102 ms that way, 70-82 ms this way, on the 2-core VM at load 3)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        return _read_open(fd)
    except OSError:
        return None
    finally:
        os.close(fd)


def _read_open(fd: int) -> ProcessFile | None:
    header = os.pread(fd, META_AT, 0)
    if len(header) < META_AT or not header.startswith(MAGIC):
        return None
    (meta_len,) = _META_LEN.unpack_from(header, EXIT_AT + _EXIT.size)
    try:
        meta = msgspec.msgpack.decode(os.pread(fd, meta_len, META_AT), type=Meta)
    except msgspec.DecodeError:
        return None
    exited, has_code, killed_after, code, signum, at_ms = _EXIT.unpack_from(header, EXIT_AT)
    record = None
    if exited:
        record = ExitRecord(
            code if has_code else None,
            None if has_code else signal_name(signum),
            at_ms,
            bool(killed_after),
        )
    (total,) = _COUNT.unpack_from(header, COUNT_AT)
    output = _retained(fd, _data_at(meta_len), total, meta.retention_bytes, meta.head_bytes)
    return ProcessFile(meta, record, output)


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"SIG{signum}"


def _retained(fd: int, base: int, total: int, retention_bytes: int, head_bytes: int) -> Recorded:
    """The head and the ring's newest bytes (oldest first) of the recording whose output
    starts at `base` in `fd`, each read straight into a bytearray of its own (which
    `OutputBuffer.load_recorded` takes over)."""
    head_limit = min(head_bytes, retention_bytes)
    ring = retention_bytes - head_limit
    head = _read_at(fd, min(total, head_limit), base)
    if total <= head_limit or ring == 0:
        return Recorded(head, bytearray(), total)
    first = max(head_limit, total - ring)
    tail = bytearray(total - first)
    view = memoryview(tail)
    filled = 0
    offset = first
    while offset < total:
        at = (offset - head_limit) % ring
        take = min(ring - at, total - offset)
        got = os.preadv(fd, [view[filled : filled + take]], base + head_limit + at)
        filled += got
        if got < take:
            break  # a file cut short: what it holds, as a read of the whole file gave it
        offset += take
    view.release()
    del tail[filled:]
    return Recorded(head, tail, total)


def _read_at(fd: int, size: int, offset: int) -> bytearray:
    data = bytearray(size)
    got = os.preadv(fd, [data], offset)
    del data[got:]
    return data


def remove(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
