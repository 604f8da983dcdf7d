"""Linux's tee(2): the bytes at the head of one pipe, duplicated into another without being
consumed and without a copy (the second pipe takes references to the same pages).

The keeper (actors/keeper.py) records every byte a command prints and forwards it to the
agent. Read into the keeper and written out twice, each byte is copied three times on its way
(out of the command's pipe, into the record, into the agent's socket); duplicated into the
agent's pipe here and then spliced into the record (`os.splice`), it is copied once, by the
kernel, into the record's page cache: on a 200 MB output read at once by its agent, the
keeper's CPU fell from 83-103 to 43-53 ms (docs/benchmarks.md, "Output through the keeper").
Python's `os` has `splice`
but not `tee`, so it is called through the C library, as actors/landlock.py calls its
syscalls. No trio, no state: one call, one answer.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import sys
import termios
from typing import Final

SPLICE_F_NONBLOCK: Final = 0x02

_tee = None
if sys.platform == "linux":
    _libc = ctypes.CDLL(None, use_errno=True)
    _tee = getattr(_libc, "tee", None)
    if _tee is not None:
        _tee.argtypes = (ctypes.c_int, ctypes.c_int, ctypes.c_size_t, ctypes.c_uint)
        _tee.restype = ctypes.c_ssize_t


def available() -> bool:
    """Whether this system has tee(2) (Linux, through its C library)."""
    return _tee is not None


def tee(fd_in: int, fd_out: int, most: int) -> int | None:
    """Duplicate up to `most` bytes at the head of the pipe `fd_in` into the pipe `fd_out`,
    without waiting: how many were (0: `fd_in` is empty and has no writer left, the end of its
    output), or None if nothing could be now (`fd_in` empty, or `fd_out` full). OSError for
    anything else (EINVAL: one of them is not a pipe; EPIPE: `fd_out` has no reader)."""
    assert _tee is not None, "tee(2) is not available here (pipe_tee.available())"
    done = _tee(fd_in, fd_out, most, SPLICE_F_NONBLOCK)
    if done >= 0:
        return int(done)
    code = ctypes.get_errno()
    if code in (errno.EAGAIN, errno.EINTR):
        return None
    raise OSError(code, os.strerror(code))


def pending(fd: int) -> int:
    """How many bytes the pipe `fd` holds now (FIONREAD)."""
    buf = bytearray(4)
    fcntl.ioctl(fd, termios.FIONREAD, buf)
    return int.from_bytes(buf, sys.byteorder, signed=True)
