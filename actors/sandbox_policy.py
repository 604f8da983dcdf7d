"""The sandbox of a call (PROTOCOL.md 10.4) as a value: pure, no trio, no I/O.

A policy has three points: `filesystem` (what may be written), `writable` (extra roots for
`workspace_write`) and `network`. The floor of `toolwire serve --sandbox/--sandbox-network`
and a call's own policy meet point by point (`meet`): each point takes the stricter side.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from typing import Any, Final, Literal

Filesystem = Literal["read_only", "workspace_write", "full"]
FILESYSTEMS: Final[tuple[Filesystem, ...]] = ("read_only", "workspace_write", "full")
_RANK: Final = {name: rank for rank, name in enumerate(FILESYSTEMS)}

# The exact text of PROTOCOL.md 10.4 for a file tool's write outside the policy.
TEXT_OUTSIDE = "{path} is outside what this call may write; no changes were made"


@dataclass(frozen=True, slots=True)
class SandboxPolicy:
    """One call's sandbox; the default is no sandbox at all (`full`, `[]`, network on).
    `writable` means something only under `workspace_write`, and is empty otherwise."""

    filesystem: Filesystem = "full"
    writable: tuple[str, ...] = ()
    network: bool = True

    def __post_init__(self) -> None:
        if self.writable and self.filesystem != "workspace_write":
            object.__setattr__(self, "writable", ())

    @property
    def unrestricted(self) -> bool:
        return self.filesystem == "full" and self.network

    def meet(self, other: SandboxPolicy) -> SandboxPolicy:
        """The stricter of the two on each point: what may be written is what both allow
        (`writable` counts only under `workspace_write`), the network only if both allow it."""
        network = self.network and other.network
        if self.filesystem == "full":
            return SandboxPolicy(other.filesystem, other.writable, network)
        if other.filesystem == "full":
            return SandboxPolicy(self.filesystem, self.writable, network)
        if "read_only" in (self.filesystem, other.filesystem):
            return SandboxPolicy("read_only", (), network)
        mine = set(self.writable)
        both = tuple(path for path in other.writable if path in mine)
        return SandboxPolicy("workspace_write", both, network)

    def at_least_as_strict_as(self, other: SandboxPolicy) -> bool:
        return self.meet(other) == self

    def write_roots(self, workspace: str, temp_dir: str) -> tuple[str, ...] | None:
        """The directories beneath which writes are allowed, as given (the caller resolves
        them); None when every write is (`full`)."""
        if self.filesystem == "full":
            return None
        if self.filesystem == "read_only":
            return ()
        return (workspace, temp_dir, *self.writable)

    def to_wire(self) -> dict[str, Any]:
        return {
            "filesystem": self.filesystem,
            "writable": list(self.writable),
            "network": self.network,
        }

    def identity(self) -> bytes:
        """What a call id stands for besides its tool and args (PROTOCOL.md 10.4: a repeat with
        another sandbox is a conflict). Empty for the default, so a call that names the default
        sandbox is the same call as one that names none."""
        if self.unrestricted and not self.writable:
            return b""
        text = f"{self.filesystem}\0{int(self.network)}\0" + "\0".join(self.writable)
        return hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest()


FULL: Final = SandboxPolicy()


def normalized(
    filesystem: Filesystem, writable: list[str], network: bool, workspace: str
) -> SandboxPolicy:
    """A call's `sandbox` field as a policy: `writable` paths made absolute against the
    workspace (`~` expanded) and folded (`..`), without duplicates, in their given order.
    Symlinks are resolved later, where the filesystem is at hand."""
    roots: list[str] = []
    for path in writable:
        absolute = os.path.normpath(
            os.path.join(os.path.expanduser(workspace), os.path.expanduser(path))
        )
        if absolute not in roots:
            roots.append(absolute)
    return SandboxPolicy(filesystem, tuple(roots), network)


def policy_from_row(row: Any) -> SandboxPolicy | None:
    """A journal row's `sandbox` (`SandboxPolicy.to_wire`) back as a policy."""
    if row is None:
        return None
    return SandboxPolicy(row["filesystem"], tuple(row["writable"]), bool(row["network"]))


def combined_fingerprint(args_fingerprint: bytes, sandbox: SandboxPolicy | None) -> bytes:
    """The record's fingerprint: the args' own, extended by the sandbox's identity."""
    identity = b"" if sandbox is None else sandbox.identity()
    if not identity:
        return args_fingerprint
    return hashlib.sha256(args_fingerprint + b"\0sandbox\0" + identity).digest()
