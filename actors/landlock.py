"""Landlock (Linux >= 5.13), the kernel's unprivileged sandbox, through its three system calls.

Everything toolwire knows about Landlock is in this module: the kernel's constants, by the names
of <linux/landlock.h>, which access rights exist from which ABI version, how a sandbox policy
(PROTOCOL.md 10.4) becomes a ruleset, and the calls that apply one to the calling thread.

Why by hand and not the `landlock` package of PyPI (1.0.0.dev5): that is a development release
of a wrapper around these same three calls, a dependency whose API may still change, and it
would hide the ABI handling this module must get exactly right (refuse what cannot be enforced,
never run less restricted than asked). The calls are three `syscall(2)`s with two small
structs; written here they are ~100 lines that tests/test_landlock.py exercises at every ABI.

What Landlock does: a thread restricts itself (`landlock_restrict_self`, after
`prctl(PR_SET_NO_NEW_PRIVS)`), for good: every process it then starts inherits the domain, and
nothing inside can lift it. It needs no root, no user namespace and no setuid helper.

`Landlock(abi)` is built from the ABI the kernel reports (`Landlock.probe()`); a lower `abi`
passed by hand is how tests see what an older kernel would enforce: the rulesets made for it
use only that ABI's rights, and the kernel accepts them as it would from an older program.
"""

from __future__ import annotations

import ctypes
import os
import stat
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

# System call numbers: Landlock was added after the numbering was unified across
# architectures, so they are the same on x86_64, aarch64 and the others.
SYS_LANDLOCK_CREATE_RULESET: Final = 444
SYS_LANDLOCK_ADD_RULE: Final = 445
SYS_LANDLOCK_RESTRICT_SELF: Final = 446

# <linux/prctl.h>
PR_SET_NO_NEW_PRIVS: Final = 38

# landlock_create_ruleset flags
LANDLOCK_CREATE_RULESET_VERSION: Final = 1 << 0

# Rule types of landlock_add_rule
LANDLOCK_RULE_PATH_BENEATH: Final = 1
LANDLOCK_RULE_NET_PORT: Final = 2

# Filesystem access rights (the ABI that brought each one)
LANDLOCK_ACCESS_FS_EXECUTE: Final = 1 << 0  # 1
LANDLOCK_ACCESS_FS_WRITE_FILE: Final = 1 << 1  # 1
LANDLOCK_ACCESS_FS_READ_FILE: Final = 1 << 2  # 1
LANDLOCK_ACCESS_FS_READ_DIR: Final = 1 << 3  # 1
LANDLOCK_ACCESS_FS_REMOVE_DIR: Final = 1 << 4  # 1
LANDLOCK_ACCESS_FS_REMOVE_FILE: Final = 1 << 5  # 1
LANDLOCK_ACCESS_FS_MAKE_CHAR: Final = 1 << 6  # 1
LANDLOCK_ACCESS_FS_MAKE_DIR: Final = 1 << 7  # 1
LANDLOCK_ACCESS_FS_MAKE_REG: Final = 1 << 8  # 1
LANDLOCK_ACCESS_FS_MAKE_SOCK: Final = 1 << 9  # 1
LANDLOCK_ACCESS_FS_MAKE_FIFO: Final = 1 << 10  # 1
LANDLOCK_ACCESS_FS_MAKE_BLOCK: Final = 1 << 11  # 1
LANDLOCK_ACCESS_FS_MAKE_SYM: Final = 1 << 12  # 1
LANDLOCK_ACCESS_FS_REFER: Final = 1 << 13  # 2: rename and link across directories
LANDLOCK_ACCESS_FS_TRUNCATE: Final = 1 << 14  # 3: truncate(2), ftruncate(2), O_TRUNC
LANDLOCK_ACCESS_FS_IOCTL_DEV: Final = 1 << 15  # 5: ioctl(2) on device files

# Network access rights (ABI 4): TCP only; UDP, raw sockets and others are not covered.
LANDLOCK_ACCESS_NET_BIND_TCP: Final = 1 << 0
LANDLOCK_ACCESS_NET_CONNECT_TCP: Final = 1 << 1

# Scopes (ABI 6): IPC a domain may not reach outside itself.
LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET: Final = 1 << 0
LANDLOCK_SCOPE_SIGNAL: Final = 1 << 1

# ABI 7 adds only audit-log flags of landlock_restrict_self (LANDLOCK_RESTRICT_SELF_LOG_*):
# nothing a policy here needs, so ABI 7 enforces what ABI 6 does.

# Every right that changes the filesystem (everything but execute, read file, read dir and
# device ioctls), by the ABI that first offers it.
_WRITE_RIGHTS_BY_ABI: Final = (
    (
        1,
        LANDLOCK_ACCESS_FS_WRITE_FILE
        | LANDLOCK_ACCESS_FS_REMOVE_DIR
        | LANDLOCK_ACCESS_FS_REMOVE_FILE
        | LANDLOCK_ACCESS_FS_MAKE_CHAR
        | LANDLOCK_ACCESS_FS_MAKE_DIR
        | LANDLOCK_ACCESS_FS_MAKE_REG
        | LANDLOCK_ACCESS_FS_MAKE_SOCK
        | LANDLOCK_ACCESS_FS_MAKE_FIFO
        | LANDLOCK_ACCESS_FS_MAKE_BLOCK
        | LANDLOCK_ACCESS_FS_MAKE_SYM,
    ),
    (2, LANDLOCK_ACCESS_FS_REFER),
    (3, LANDLOCK_ACCESS_FS_TRUNCATE),
)

# The first ABI that can enforce each point. Filesystem needs 3: before it, truncate(2) of any
# file was outside Landlock's reach, so "writes no file" could not be promised.
FILESYSTEM_ABI: Final = 3
NETWORK_ABI: Final = 4
SCOPE_ABI: Final = 6

# Device files every confined command may still write, as on any Unix: the bit bucket and its
# controlling terminal. A command on a terminal (`pty`) also gets /dev/pts: it opens its own
# terminal itself, after the domain is in force; a command without one never opens a terminal.
DEVICE_WRITABLE: Final = ("/dev/null", "/dev/zero", "/dev/full", "/dev/tty")
TERMINALS: Final = "/dev/pts"


class _RulesetAttr(ctypes.Structure):
    _fields_ = (
        ("handled_access_fs", ctypes.c_uint64),
        ("handled_access_net", ctypes.c_uint64),
        ("scoped", ctypes.c_uint64),
    )


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1  # __attribute__((packed)) in the kernel's header: 12 bytes
    _fields_ = (("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32))


_libc = ctypes.CDLL(None, use_errno=True)
_syscall = _libc.syscall
_syscall.restype = ctypes.c_long
_prctl = _libc.prctl
_prctl.restype = ctypes.c_int


def _raise_errno(what: str) -> None:
    code = ctypes.get_errno()
    raise OSError(code, f"{what}: {os.strerror(code)}")


@dataclass(frozen=True, slots=True)
class Ruleset:
    """What one sandbox domain handles and allows: the input of `restrict_current_thread`.

    `handled_fs`/`handled_net` are the rights the domain controls (anything not handled stays
    allowed); `rules` maps each path to the handled filesystem rights allowed beneath it;
    nothing of `handled_net` is allowed anywhere (no port rules); `scoped` are ABI 6 scopes."""

    abi: int
    handled_fs: int
    handled_net: int
    scoped: int
    rules: tuple[tuple[str, int], ...]


@dataclass(frozen=True, slots=True)
class Landlock:
    """The Landlock of one kernel, as far as `abi` goes (0: none)."""

    abi: int

    @classmethod
    def probe(cls) -> Landlock:
        """The running kernel's ABI (0 when Landlock is absent, disabled or not Linux)."""
        if not sys.platform.startswith("linux"):
            return cls(abi=0)  # the system call numbers are Linux's
        version = _syscall(
            SYS_LANDLOCK_CREATE_RULESET, None, ctypes.c_size_t(0), LANDLOCK_CREATE_RULESET_VERSION
        )
        return cls(abi=max(int(version), 0))

    @property
    def filesystem(self) -> bool:
        """Whether a command can be kept from writing files (read_only, workspace_write)."""
        return self.abi >= FILESYSTEM_ABI

    @property
    def network(self) -> bool:
        """Whether a command can be kept from TCP connections and listening (network false)."""
        return self.abi >= NETWORK_ABI

    def write_rights(self) -> int:
        rights = 0
        for since, bits in _WRITE_RIGHTS_BY_ABI:
            if self.abi >= since:
                rights |= bits
        return rights

    def ruleset(
        self,
        *,
        writable: Iterable[str] | None,
        network: bool,
        terminal: bool = False,
        visible: Iterable[str] | None = None,
    ) -> Ruleset:
        """The ruleset of a policy: `writable` None leaves the filesystem alone (`full`),
        else writes are allowed only beneath those paths (empty: `read_only`) and to
        `DEVICE_WRITABLE` (and `TERMINALS` for a command on a `terminal`); `network` False
        refuses every TCP bind and connect. With `visible` (only with `writable`), files may
        be read only beneath those paths and beneath `writable` (actors/hidden_paths.py: what
        the agent keeps to itself is in neither). Raises `Unsupported` naming what this ABI
        lacks."""
        missing = []
        if writable is not None and not self.filesystem:
            missing.append(f"filesystem rules need Landlock ABI {FILESYSTEM_ABI}")
        if not network and not self.network:
            missing.append(f"network rules need Landlock ABI {NETWORK_ABI}")
        if missing:
            raise Unsupported(self.abi, missing)
        handled_fs = 0
        rules: list[tuple[str, int]] = []
        if writable is not None:
            handled_fs = self.write_rights()
            if visible is not None:
                handled_fs |= LANDLOCK_ACCESS_FS_READ_FILE
                rules.extend((path, LANDLOCK_ACCESS_FS_READ_FILE) for path in visible)
            devices = (*DEVICE_WRITABLE, TERMINALS) if terminal else DEVICE_WRITABLE
            rules.extend((path, LANDLOCK_ACCESS_FS_WRITE_FILE) for path in devices)
            rules.extend((path, handled_fs) for path in writable)
        handled_net = 0
        scoped = 0
        if not network:
            handled_net = LANDLOCK_ACCESS_NET_BIND_TCP | LANDLOCK_ACCESS_NET_CONNECT_TCP
            if self.abi >= SCOPE_ABI:
                scoped |= LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET
        if self.abi >= SCOPE_ABI and (handled_fs or handled_net):
            # A confined command may not signal what is outside its domain (the agent itself,
            # the user's other processes).
            scoped |= LANDLOCK_SCOPE_SIGNAL
        return Ruleset(self.abi, handled_fs, handled_net, scoped, tuple(rules))


class Unsupported(Exception):
    """The kernel cannot enforce a policy: `missing` says what it lacks."""

    def __init__(self, abi: int, missing: list[str]) -> None:
        self.abi = abi
        self.missing = missing
        found = f"this kernel offers Landlock ABI {abi}" if abi else "this kernel has no Landlock"
        super().__init__(f"{'; '.join(missing)} ({found})")


def _attr_size(abi: int) -> int:
    # An older kernel refuses (E2BIG) a larger struct with non-zero fields it does not know.
    if abi >= SCOPE_ABI:
        return ctypes.sizeof(_RulesetAttr)
    if abi >= NETWORK_ABI:
        return 16
    return 8


def restrict_current_thread(ruleset: Ruleset) -> None:
    """Confine the calling thread, for good, and every process it starts from now on. Paths of
    `ruleset.rules` that do not exist grant nothing (and are skipped). Raises OSError."""
    if not (ruleset.handled_fs or ruleset.handled_net or ruleset.scoped):
        return  # nothing to restrict: `full` with the network on
    attr = _RulesetAttr(ruleset.handled_fs, ruleset.handled_net, ruleset.scoped)
    fd = _syscall(
        SYS_LANDLOCK_CREATE_RULESET,
        ctypes.byref(attr),
        ctypes.c_size_t(_attr_size(ruleset.abi)),
        ctypes.c_uint32(0),
    )
    if fd < 0:
        _raise_errno("landlock_create_ruleset")
    try:
        for path, allowed in ruleset.rules:
            try:
                parent = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except FileNotFoundError:
                continue
            try:
                if not stat.S_ISDIR(os.fstat(parent).st_mode):
                    # A rule on a file may hold only the rights that apply to files.
                    allowed &= (
                        LANDLOCK_ACCESS_FS_EXECUTE
                        | LANDLOCK_ACCESS_FS_WRITE_FILE
                        | LANDLOCK_ACCESS_FS_READ_FILE
                        | LANDLOCK_ACCESS_FS_TRUNCATE
                        | LANDLOCK_ACCESS_FS_IOCTL_DEV
                    )
                rule = _PathBeneathAttr(allowed & ruleset.handled_fs, parent)
                if (
                    _syscall(
                        SYS_LANDLOCK_ADD_RULE,
                        ctypes.c_int(fd),
                        ctypes.c_int(LANDLOCK_RULE_PATH_BENEATH),
                        ctypes.byref(rule),
                        ctypes.c_uint32(0),
                    )
                    < 0
                ):
                    _raise_errno(f"landlock_add_rule {path}")
            finally:
                os.close(parent)
        if _prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            _raise_errno("prctl(PR_SET_NO_NEW_PRIVS)")
        if _syscall(SYS_LANDLOCK_RESTRICT_SELF, ctypes.c_int(fd), ctypes.c_uint32(0)) < 0:
            _raise_errno("landlock_restrict_self")
    finally:
        os.close(fd)
