"""A seccomp filter that refuses TCP sockets: what `network: false` needs beyond Landlock.

Landlock's TCP rules (ABI 4 to 7) refuse `bind` and `connect`, but not `listen` on a socket that
was never bound: the kernel then binds it to an ephemeral port itself, and the socket listens
(measured on Linux 6.18: `socket(); listen()` succeeds inside a domain that handles
LANDLOCK_ACCESS_NET_BIND_TCP). PROTOCOL.md 10.4 promises no listening socket, so a confined
command may not create a stream socket of AF_INET or AF_INET6 at all (TCP, MPTCP, SCTP):
`socket()` fails with EACCES, "Permission denied". Connections and listeners of other families
(Unix sockets) are untouched, and so are datagram sockets (UDP), which Landlock does not cover
either; docs/sandbox.md says so.

Like Landlock, a filter is installed on the calling thread only (no SECCOMP_FILTER_FLAG_TSYNC),
needs `no_new_privs` and no privilege, is inherited by every process the thread starts, and
can never be removed.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import socket
import struct
import sys
from typing import Final

# <linux/prctl.h>, <linux/seccomp.h>, <linux/filter.h>, <linux/audit.h>
PR_SET_NO_NEW_PRIVS: Final = 38
PR_SET_SECCOMP: Final = 22
SECCOMP_MODE_FILTER: Final = 2
SECCOMP_RET_ALLOW: Final = 0x7FFF0000
SECCOMP_RET_ERRNO: Final = 0x00050000
BPF_LD_W_ABS: Final = 0x20  # BPF_LD | BPF_W | BPF_ABS
BPF_ALU_AND_K: Final = 0x54  # BPF_ALU | BPF_AND | BPF_K
BPF_JEQ_K: Final = 0x15  # BPF_JMP | BPF_JEQ | BPF_K
BPF_RET_K: Final = 0x06  # BPF_RET | BPF_K
AUDIT_ARCH_X86_64: Final = 0xC000003E
AUDIT_ARCH_I386: Final = 0x40000003
AUDIT_ARCH_AARCH64: Final = 0xC00000B7
AUDIT_ARCH_ARM: Final = 0x40000028
X32_SYSCALL_BIT: Final = 0x40000000
SOCK_TYPE_MASK: Final = 0xF

# struct seccomp_data: nr, arch, instruction_pointer, args[6] (low 32 bits first: little endian)
_NR: Final = 0
_ARCH: Final = 4
_ARG0: Final = 16
_ARG1: Final = 24

# (native arch, its socket(2) numbers; compat arch, the numbers that create a socket there, the
# socketcall(2) multiplexer among them: its arguments are behind a pointer, so refused whole).
_ARCHES: Final = {
    "x86_64": (AUDIT_ARCH_X86_64, (41, X32_SYSCALL_BIT | 41), AUDIT_ARCH_I386, (102, 359)),
    "aarch64": (AUDIT_ARCH_AARCH64, (198,), AUDIT_ARCH_ARM, (281,)),
}


def supported() -> bool:
    """Whether this machine (Linux, and an architecture with a filter here) can refuse them."""
    return sys.platform.startswith("linux") and platform.machine() in _ARCHES


_Jump = str | None


def _assemble(lines: list[tuple[str | None, int, int, _Jump, _Jump]]) -> bytes:
    """BPF from (label, code, k, label if true, label if false) lines: jumps are resolved to
    the forward offsets BPF wants (None: the next instruction)."""
    where = {label: index for index, (label, *_rest) in enumerate(lines) if label}
    out = []
    for index, (_label, code, k, if_true, if_false) in enumerate(lines):
        jt = 0 if if_true is None else where[if_true] - index - 1
        jf = 0 if if_false is None else where[if_false] - index - 1
        out.append(struct.pack("=HBBI", code, jt, jf, k))
    return b"".join(out)


def program() -> bytes:
    """The filter of this machine's architecture (see `supported`)."""
    native, sockets, compat, compat_sockets = _ARCHES[platform.machine()]
    lines: list[tuple[str | None, int, int, _Jump, _Jump]] = [
        (None, BPF_LD_W_ABS, _ARCH, None, None),
        (None, BPF_JEQ_K, native, None, "compat"),
        (None, BPF_LD_W_ABS, _NR, None, None),
    ]
    lines += [(None, BPF_JEQ_K, nr, "domain", None) for nr in sockets]
    lines += [
        (None, BPF_RET_K, SECCOMP_RET_ALLOW, None, None),
        ("domain", BPF_LD_W_ABS, _ARG0, None, None),
        (None, BPF_JEQ_K, socket.AF_INET, "type", None),
        (None, BPF_JEQ_K, socket.AF_INET6, "type", "allow"),
        ("type", BPF_LD_W_ABS, _ARG1, None, None),
        (None, BPF_ALU_AND_K, SOCK_TYPE_MASK, None, None),  # without NONBLOCK / CLOEXEC
        (None, BPF_JEQ_K, socket.SOCK_STREAM, "deny", None),
        (None, BPF_JEQ_K, socket.SOCK_SEQPACKET, "deny", "allow"),
        ("compat", BPF_JEQ_K, compat, None, "allow"),
        (None, BPF_LD_W_ABS, _NR, None, None),
    ]
    lines += [(None, BPF_JEQ_K, nr, "deny", None) for nr in compat_sockets]
    lines += [
        ("allow", BPF_RET_K, SECCOMP_RET_ALLOW, None, None),
        ("deny", BPF_RET_K, SECCOMP_RET_ERRNO | errno.EACCES, None, None),
    ]
    return _assemble(lines)


class _SockFprog(ctypes.Structure):
    _fields_ = (("len", ctypes.c_ushort), ("filter", ctypes.c_void_p))


_prctl = ctypes.CDLL(None, use_errno=True).prctl
_prctl.restype = ctypes.c_int


def refuse_tcp_sockets_on_current_thread() -> None:
    """Install the filter on the calling thread, for good (after setting its no_new_privs).
    Raises OSError."""
    if _prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:  # what an unprivileged filter needs
        err = ctypes.get_errno()
        raise OSError(err, f"prctl(PR_SET_NO_NEW_PRIVS): {os.strerror(err)}")
    code = program()
    buffer = ctypes.create_string_buffer(code, len(code))
    fprog = _SockFprog(len(code) // 8, ctypes.cast(buffer, ctypes.c_void_p))
    if _prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl(PR_SET_SECCOMP): {os.strerror(err)}")
