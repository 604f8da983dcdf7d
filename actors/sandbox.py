"""What this machine can enforce of a sandbox (PROTOCOL.md 10.4), and how one call's policy
becomes the confinement of its command or the write check of its file tool.

The kernel does the enforcing (actors/landlock.py, actors/seccomp.py, applied on a confined
thread by actors/confined.py); this module decides what to ask of it, refuses what it cannot
give (`sandbox_unsupported`, before anything runs), and checks `write_file`/`edit_files`
targets against the same filesystem point, after symlinks are resolved.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Final

from toolwire.actors import landlock, seccomp
from toolwire.actors.hidden_paths import NOTHING_HIDDEN, CoverCache, HiddenPaths
from toolwire.actors.results import ToolwireError
from toolwire.actors.sandbox_policy import SandboxPolicy


@dataclass(frozen=True, slots=True)
class Confinement:
    """What the confined thread that spawns a command is restricted by."""

    ruleset: landlock.Ruleset
    refuse_tcp: bool


# How many confinements are kept made: a chat server uses a handful of policies, and a client
# that invents a new `writable` list per call must not grow this without bound.
MAX_MADE_CONFINEMENTS: Final = 64


@dataclass(frozen=True, slots=True)
class _Made:
    """A confinement, with the covers (`CoverCache` results) it was made of: still valid
    while the cache hands back the very same tuples (it makes new ones when a directory on the
    way to a hidden path changed), or equal ones (made again while a stamp was too young to
    trust: `RACY_MTIME_NS`)."""

    covers: tuple[tuple[str, ...], ...]
    visible: tuple[str, ...] | None
    confinement: Confinement

    def same_covers(
        self, covers: tuple[tuple[str, ...], ...], visible: tuple[str, ...] | None
    ) -> bool:
        return (
            (visible is self.visible or visible == self.visible)
            and len(covers) == len(self.covers)
            and all(new is old or new == old for new, old in zip(covers, self.covers, strict=True))
        )


class _MadeConfinements:
    """At most `MAX_MADE_CONFINEMENTS`, the least recently made let go."""

    def __init__(self) -> None:
        self._made: dict[tuple[object, ...], _Made] = {}

    def get(self, key: tuple[object, ...]) -> _Made | None:
        return self._made.get(key)

    def remember(self, key: tuple[object, ...], made: _Made) -> None:
        self._made.pop(key, None)
        self._made[key] = made
        if len(self._made) > MAX_MADE_CONFINEMENTS:
            del self._made[next(iter(self._made))]


@dataclass(frozen=True, slots=True)
class Enforcement:
    """The kernel's means, as probed at start (`probe`); built by hand with a lower
    `landlock.abi` it says what an older kernel would enforce."""

    landlock: landlock.Landlock
    seccomp: bool = field(default_factory=seccomp.supported)
    temp_dir: str = field(default_factory=tempfile.gettempdir)
    # The rules that leave out the agent's own files, made again only when a directory on the
    # way to them changes (actors/hidden_paths.py).
    _covers: CoverCache = field(default_factory=CoverCache, init=False, compare=False, repr=False)
    # The confinements made, by what they were made of: a sandboxed spawn then costs the few
    # stats that say the covers are unchanged, not a ruleset of hundreds of rules built again
    # (and the same object each time, which the keeper's client sends once: actors/kept.py).
    _made: _MadeConfinements = field(
        default_factory=_MadeConfinements, init=False, compare=False, repr=False
    )

    @classmethod
    def probe(cls) -> Enforcement:
        return cls(landlock.Landlock.probe())

    @property
    def filesystem(self) -> bool:
        return self.landlock.filesystem

    @property
    def network(self) -> bool:
        return self.landlock.network and self.seccomp

    def limits(self) -> dict[str, bool]:
        """`welcome.limits.sandbox`."""
        return {"filesystem": self.filesystem, "network": self.network}

    def describe(self) -> str:
        """One line for the log of `toolwire serve`."""
        abi = self.landlock.abi
        found = f"Landlock ABI {abi}" if abi else "no Landlock"
        fs = "enforced" if self.filesystem else "NOT enforceable"
        net = "enforced" if self.network else "NOT enforceable"
        return f"sandbox: {found}; filesystem policies {fs}, network off {net}" + (
            "" if self.seccomp else " (no seccomp filter for this architecture)"
        )

    def missing(self, policy: SandboxPolicy) -> list[str]:
        """What this machine lacks to enforce `policy` (empty: it can)."""
        lacks: list[str] = []
        if policy.filesystem != "full" and not self.filesystem:
            lacks.append(
                f"filesystem {policy.filesystem!r} needs Landlock ABI {landlock.FILESYSTEM_ABI}"
            )
        if not policy.network and not self.network:
            if not self.landlock.network:
                lacks.append(f"network false needs Landlock ABI {landlock.NETWORK_ABI}")
            else:
                lacks.append("network false needs a seccomp filter for this architecture")
        return lacks

    def check(self, policy: SandboxPolicy) -> None:
        """Raise `sandbox_unsupported` naming what is missing, unless `policy` is enforceable."""
        lacks = self.missing(policy)
        if lacks:
            abi = self.landlock.abi
            found = (
                f"this kernel offers Landlock ABI {abi}" if abi else "this kernel has no Landlock"
            )
            raise ToolwireError(
                "sandbox_unsupported",
                f"sandbox cannot be enforced here: {'; '.join(lacks)} ({found}); nothing ran",
            )

    def confinement(
        self,
        policy: SandboxPolicy,
        workspace: str,
        *,
        terminal: bool = False,
        hidden: HiddenPaths = NOTHING_HIDDEN,
    ) -> Confinement | None:
        """The confinement of a command under `policy` (None: unconfined, `full` with the
        network on); `terminal`: the command runs on a terminal of its own. Under a policy
        that restricts the filesystem, the `hidden` paths can be neither read nor written:
        reads are allowed beneath everything else, and a write root that holds a hidden path
        becomes its other entries. Raises `sandbox_unsupported` as `check` does."""
        if policy.unrestricted:
            return None
        self.check(policy)
        roots = policy.write_roots(workspace, self.temp_dir)
        resolved = None if roots is None else _resolved_unique(roots)
        covers: tuple[tuple[str, ...], ...] = ()
        visible = None
        if resolved is not None and hidden:
            covers = tuple(self._covers.cover(root, hidden.paths) for root in resolved)
            visible = self._covers.cover("/", hidden.paths)
        key = (policy, resolved, terminal, hidden.paths)
        made = self._made.get(key)
        if made is not None and made.same_covers(covers, visible):
            return made.confinement
        writable = resolved
        if resolved is not None and hidden:
            writable = tuple(path for cover in covers for path in cover)
        try:
            ruleset = self.landlock.ruleset(
                writable=writable, network=policy.network, terminal=terminal, visible=visible
            )
        except landlock.Unsupported as exc:  # unreachable after `check`; never run unconfined
            raise ToolwireError("sandbox_unsupported", str(exc)) from None
        confinement = Confinement(ruleset, refuse_tcp=not policy.network)
        self._made.remember(key, _Made(covers, visible, confinement))
        return confinement

    def outside(self, policy: SandboxPolicy, workspace: str, paths: Iterable[str]) -> str | None:
        """The first of `paths` (as given: relative to the workspace, `~` expanded) that
        `policy` does not let a file tool write, once symlinks are resolved (a link in the
        workspace to a file outside it is outside); None when all may be written."""
        roots = policy.write_roots(workspace, self.temp_dir)
        if roots is None:
            return None
        real_roots = _resolved_unique(roots)
        base = os.path.expanduser(workspace)
        for path in paths:
            target = os.path.realpath(os.path.join(base, os.path.expanduser(path)))
            if not any(_beneath(target, root) for root in real_roots):
                return path
        return None


def _resolved_unique(paths: Iterable[str]) -> tuple[str, ...]:
    out: list[str] = []
    for path in paths:
        real = os.path.realpath(os.path.expanduser(path))
        if real not in out:
            out.append(real)
    return tuple(out)


def _beneath(path: str, root: str) -> bool:
    """`path` is `root` or inside it, component by component (`/a/b` is not inside `/a/bc`)."""
    return path == root or path.startswith(root.rstrip("/") + "/")
