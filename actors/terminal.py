"""Pseudo-terminals for `execute` with `pty` (PROTOCOL.md 9.1), from the standard library.

A command on a terminal sees what it would see in a terminal emulator: stdin, stdout and stderr
are the terminal's slave side, the terminal is the controlling terminal of the command's new
session (so Ctrl-C typed as `\\x03` interrupts its foreground process group, and a resize sends
it SIGWINCH), and the line discipline does what it does for a person at a keyboard: echo, CR LF
line ends, the EOF character. The agent holds the master side: what the command prints is read
from it, what `process_input` types is written to it, a resize is an ioctl on it.

Only the agent's side is opened here; the child opens the slave by its path as its first act
after `setsid`, which is what makes it the controlling terminal (actors/spawn.py).
"""

from __future__ import annotations

import fcntl
import os
import struct
import termios
from typing import Final, NamedTuple

# `struct winsize` holds unsigned shorts: 65535 is the largest size the kernel can store. A
# terminal of 0 rows or columns means "unknown" to programs, and curses programs divide by it.
MIN_TERMINAL_SIDE: Final = 1
MAX_TERMINAL_SIDE: Final = 65535

# What `TERM` says unless the command's `env` names one (PROTOCOL.md 9.1): what the terminal
# emulators of the peers (xterm.js, VS Code, Codex's app-server) announce, and what every
# program's terminfo knows.
DEFAULT_TERM: Final = "xterm-256color"

# The EOF character when the terminal cannot be asked (Ctrl-D, the POSIX default of VEOF).
DEFAULT_EOF_CHAR: Final = b"\x04"


class TerminalSize(NamedTuple):
    rows: int
    cols: int


class Terminal(NamedTuple):
    """A new pseudo-terminal: the agent keeps `master`; the child opens `slave_path`.

    `slave` stays open in the agent until the child has opened its own (close it after the
    spawn): a terminal whose slave side no one holds reads as hung up (EIO) on the master."""

    master: int
    slave: int
    slave_path: str


def open_terminal(size: TerminalSize) -> Terminal:
    """A new pseudo-terminal of that size, its master non-blocking. Both descriptors are
    >= 3 and close-on-exec, so a child's dup2 onto 0..2 never overwrites one of them, even in
    an agent started with its standard descriptors closed."""
    fds = list(os.openpty())
    try:
        for index, fd in enumerate(fds):
            if fd < 3:
                fds[index] = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 3)
                os.close(fd)
        master, slave = fds
        set_size(master, size)
        os.set_blocking(master, False)
        return Terminal(master, slave, os.ttyname(slave))
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise


def set_size(fd: int, size: TerminalSize) -> None:
    """Resize the terminal of `fd` (either side). The kernel sends SIGWINCH to the terminal's
    foreground process group when the size changes, as a terminal emulator's resize does."""
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", size.rows, size.cols, 0, 0))


def eof_char(fd: int) -> bytes:
    """The terminal's EOF character (VEOF, Ctrl-D unless the program changed it): what a person
    presses to end a terminal's input. The master shares the slave's settings on Linux."""
    try:
        char = termios.tcgetattr(fd)[6][termios.VEOF]
    except termios.error:
        return DEFAULT_EOF_CHAR
    return char if isinstance(char, bytes) and char else DEFAULT_EOF_CHAR
