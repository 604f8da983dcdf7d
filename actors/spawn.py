"""posix_spawn from the C library: start a command with what `subprocess.Popen` would do, minus
Popen's own Python work.

Why: `execute` spawns on the event loop thread (see actors/processes.py), so every microsecond a
spawn takes is a microsecond no connection is served. Measured here, sequential `/bin/sh -c true`
with a pipe: `Popen(...)` costs 123 us of CPU and blocks the caller 165 us per spawn (most of it
Python: re-encoding ~70 environment variables, building the exec list, the error pipe); this
module costs 85 us and blocks 140 us. Python's own `os.posix_spawn` is not enough: 3.11 cannot
set the child's working directory or close inherited descriptors, and `execute` needs both.

The child gets what `RealProcessBackend` asks Popen for (stdin=DEVNULL or a pipe, stdout and
stderr to one pipe, cwd, env, start_new_session=True, close_fds=True; or a terminal as all
three, see `spawn`), and a clean signal state:
- a new session, hence a new process group (POSIX_SPAWN_SETSID): killed as a group;
- every signal back to its default action (POSIX_SPAWN_SETSIGDEF with a full set) and none
  blocked (POSIX_SPAWN_SETSIGMASK with an empty one). An ignored signal stays ignored across
  exec, so without this a command would inherit whatever the agent was started with: Python
  ignores SIGPIPE (`yes | head` would never end), and an agent started in the background by a
  non-interactive shell ignores SIGINT and SIGQUIT (Ctrl-C typed on a terminal would do
  nothing), under `nohup` SIGHUP. Popen's restore_signals puts back only SIGPIPE and SIGXFSZ;
- stdout and stderr onto the pipe, stdin onto /dev/null (or the stdin pipe), then the working
  directory, then every descriptor from 3 up closed.
A failure in the child before exec (no such cwd, no such shell) comes back as the OSError Popen
would raise, with the same errno. Arguments Popen refuses (a NUL byte, `=` in a variable name)
raise the same ValueError.

Needs glibc >= 2.34 or a C library with the same non-portable actions (`addchdir_np`,
`addclosefrom_np`); `PosixSpawner.load()` returns None without them, and the caller uses Popen.
"""

from __future__ import annotations

import ctypes
import fcntl
import os
import sys
from collections.abc import Mapping
from typing import Any

# From <spawn.h>; glibc and musl use the same values.
_POSIX_SPAWN_SETSIGDEF = 0x04
_POSIX_SPAWN_SETSIGMASK = 0x08
_POSIX_SPAWN_SETSID = 0x80
# Opaque C structs, allocated generously: glibc's posix_spawn_file_actions_t is 80 bytes,
# posix_spawnattr_t 336 and sigset_t 128 on x86_64.
_FILE_ACTIONS_BYTES = 256
_ATTR_BYTES = 1024
_SIGSET_BYTES = 256
_DEV_NULL = os.fsencode(os.devnull)


def _encode(value: str) -> bytes:
    data = os.fsencode(value)
    if b"\0" in data:
        raise ValueError("embedded null byte")  # as Popen says it
    return data


class _EnvBlock:
    """One environment encoded as a C `envp` array, kept with the mapping it was made from.

    The chat passes the same base environment to nearly every spawn; encoding it anew each time
    is most of Popen's Python cost, so the last one is kept and reused while equal."""

    __slots__ = ("array", "source")

    def __init__(self, env: Mapping[str, str]) -> None:
        self.source = dict(env)
        entries: list[bytes] = []
        for key, value in self.source.items():
            name = _encode(key)
            if b"=" in name:
                raise ValueError("illegal environment variable name")
            entries.append(name + b"=" + _encode(value))
        self.array: Any = (ctypes.c_char_p * (len(entries) + 1))(*entries, None)


class PosixSpawner:
    """Spawns through libc's posix_spawn. Use `load()`; one instance serves every spawn."""

    def __init__(self, libc: ctypes.CDLL) -> None:
        self._spawn = libc.posix_spawn
        self._spawn.argtypes = [
            ctypes.POINTER(ctypes.c_int),
            ctypes.c_char_p,
            ctypes.c_void_p,
            ctypes.c_void_p,
            ctypes.c_void_p,
            ctypes.c_void_p,
        ]
        self._spawn.restype = ctypes.c_int
        self._fa_init = libc.posix_spawn_file_actions_init
        self._fa_init.argtypes = [ctypes.c_void_p]
        self._fa_destroy = libc.posix_spawn_file_actions_destroy
        self._fa_destroy.argtypes = [ctypes.c_void_p]
        self._fa_dup2 = libc.posix_spawn_file_actions_adddup2
        self._fa_dup2.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
        self._fa_open = libc.posix_spawn_file_actions_addopen
        self._fa_open.argtypes = [
            ctypes.c_void_p,
            ctypes.c_int,
            ctypes.c_char_p,
            ctypes.c_int,
            ctypes.c_uint,
        ]
        self._fa_chdir = libc.posix_spawn_file_actions_addchdir_np
        self._fa_chdir.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
        self._fa_closefrom = libc.posix_spawn_file_actions_addclosefrom_np
        self._fa_closefrom.argtypes = [ctypes.c_void_p, ctypes.c_int]
        for fn in (self._fa_init, self._fa_destroy, self._fa_dup2, self._fa_open):
            fn.restype = ctypes.c_int
        self._fa_chdir.restype = ctypes.c_int
        self._fa_closefrom.restype = ctypes.c_int
        # One attribute set serves every spawn: it never changes, and posix_spawn only reads it.
        self._attr = ctypes.create_string_buffer(_ATTR_BYTES)
        every_signal = ctypes.create_string_buffer(_SIGSET_BYTES)
        no_signal = ctypes.create_string_buffer(_SIGSET_BYTES)
        _check(libc.posix_spawnattr_init(self._attr))
        # glibc's sigfillset leaves out its internal signals, and the child skips SIGKILL and
        # SIGSTOP, whose action cannot change.
        _check(libc.sigfillset(every_signal))
        _check(libc.sigemptyset(no_signal))
        _check(libc.posix_spawnattr_setsigdefault(self._attr, every_signal))
        _check(libc.posix_spawnattr_setsigmask(self._attr, no_signal))
        flags = _POSIX_SPAWN_SETSID | _POSIX_SPAWN_SETSIGDEF | _POSIX_SPAWN_SETSIGMASK
        _check(libc.posix_spawnattr_setflags(self._attr, ctypes.c_short(flags)))
        self._env: _EnvBlock | None = None

    @classmethod
    def load(cls) -> PosixSpawner | None:
        """The spawner, or None where the C library lacks an action `execute` needs."""
        if not sys.platform.startswith("linux"):
            return None
        try:
            return cls(ctypes.CDLL(None, use_errno=True))
        except (AttributeError, OSError):
            return None

    def spawn(
        self,
        argv: list[str],
        cwd: str,
        env: Mapping[str, str],
        out_fd: int | None,
        *,
        stdin_fd: int | None = None,
        terminal_path: str | None = None,
    ) -> int:
        """Start argv[0] (a path: no PATH search) in `cwd`, in a new session. Returns the pid.

        Without `terminal_path`: stdout and stderr on `out_fd`, stdin on `stdin_fd` (a pipe's
        read end) or on /dev/null; both descriptors >= 3. With it (then `out_fd` and `stdin_fd`
        are None): the child opens that terminal as stdin, stdout and stderr. Its first open of
        a terminal, right after `setsid` (glibc and musl run the session flag before the file
        actions), makes it the session's controlling terminal, as `login_tty` would."""
        if terminal_path is not None:
            if out_fd is not None or stdin_fd is not None:
                raise ValueError("a terminal is the child's stdin and output: no other fd")
        elif out_fd is None or out_fd < 3 or (stdin_fd is not None and stdin_fd < 3):
            raise ValueError("out_fd and stdin_fd must be >= 3: dup2 onto 0..2 must not clobber")
        args = [_encode(arg) for arg in argv]
        directory = _encode(cwd)
        block = self._env
        if block is None or block.source != env:
            block = self._env = _EnvBlock(env)
        c_argv = (ctypes.c_char_p * (len(args) + 1))(*args, None)
        actions = ctypes.create_string_buffer(_FILE_ACTIONS_BYTES)
        _check(self._fa_init(actions))
        try:
            if terminal_path is not None:
                # Without O_NOCTTY: this open is what acquires the controlling terminal.
                _check(self._fa_open(actions, 0, _encode(terminal_path), os.O_RDWR, 0))
                _check(self._fa_dup2(actions, 0, 1))
                _check(self._fa_dup2(actions, 0, 2))
            else:
                assert out_fd is not None
                _check(self._fa_dup2(actions, out_fd, 1))
                _check(self._fa_dup2(actions, out_fd, 2))
                if stdin_fd is not None:
                    _check(self._fa_dup2(actions, stdin_fd, 0))
                else:
                    _check(self._fa_open(actions, 0, _DEV_NULL, os.O_RDONLY, 0))
            _check(self._fa_chdir(actions, directory))
            _check(self._fa_closefrom(actions, 3))
            pid = ctypes.c_int()
            err = self._spawn(ctypes.byref(pid), args[0], actions, self._attr, c_argv, block.array)
            if err:
                # Popen names the directory when chdir fails, the program otherwise; the child
                # does not say which action failed, so name neither.
                raise OSError(err, os.strerror(err))
            return pid.value
        finally:
            self._fa_destroy(actions)


def _check(err: int) -> None:
    if err:
        raise OSError(err, os.strerror(err))


def pipe_above_stdio() -> tuple[int, int]:
    """An output pipe whose ends are >= 3 (close-on-exec, as os.pipe makes them): the child's
    dup2 onto 1 and 2 must never overwrite the write end, even in an agent started with its
    standard descriptors closed."""
    read_fd, write_fd = os.pipe()
    ends = []
    for fd in (read_fd, write_fd):
        if fd < 3:
            moved = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 3)
            os.close(fd)
            fd = moved
        ends.append(fd)
    return ends[0], ends[1]
