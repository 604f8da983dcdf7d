"""The agent's own files, which no tool reads or writes and no sandboxed command can reach.

The state dir holds the token a chat server authenticates with and the journal (every chat's
commands, args and outputs); `--token-file` may name a token elsewhere. A model that asks
`read_file` for the token, or runs `cat` on it, would put the key to the agent into its
transcript (issue 27). So:

- every file tool refuses a path that resolves inside them, whatever the call's sandbox (the
  agent does that work itself, so it can always refuse), and a search or a listing skips them;
- a command under a sandbox that restricts the filesystem (`read_only`, `workspace_write`)
  may neither read nor write them: Landlock allows only what a rule names, so the rules of such
  a sandbox name everything else (`visible_cover`), not `/`.

A command without a filesystem sandbox runs with the full rights of the agent's user, and a
user's process can read that user's files: that is the one route left, and docs/sandbox.md and
`toolwire serve`'s log say so (`--sandbox workspace_write` closes it).
"""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Final

# The `failed` text of a file tool asked for one of them (nothing is read or written).
TEXT_HIDDEN = (
    "{path} is the agent's own state (its token and journal): no tool reads or writes it; "
    "nothing was done"
)


def beneath(path: str, root: str) -> bool:
    """`path` is `root` or inside it, component by component (`/a/b` is not inside `/a/bc`)."""
    return path == root or path.startswith(root.rstrip("/") + "/")


@dataclass(frozen=True, slots=True)
class HiddenPaths:
    """Resolved paths (no symlink on them), and the (device, inode) of those that existed when
    made, which a directory walk compares with what it stats anyway."""

    paths: tuple[str, ...] = ()
    identities: frozenset[tuple[int, int]] = frozenset()
    # `covers` in one `startswith` (it runs on every read_file of `toolwire serve`).
    _prefixes: tuple[str, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        prefixes = tuple(path.rstrip("/") + "/" for path in self.paths)
        object.__setattr__(self, "_prefixes", prefixes)

    @classmethod
    def of(cls, paths: Iterable[str | os.PathLike[str]]) -> HiddenPaths:
        real: list[str] = []
        identities: set[tuple[int, int]] = set()
        for path in paths:
            resolved = os.path.realpath(os.path.expanduser(os.fspath(path)))
            if resolved in real:
                continue
            real.append(resolved)
            try:
                st = os.stat(resolved)
            except OSError:
                continue  # not there yet: the path check still covers it
            identities.add((st.st_dev, st.st_ino))
        return cls(tuple(real), frozenset(identities))

    def __bool__(self) -> bool:
        return bool(self.paths)

    def covers(self, resolved: str) -> bool:
        """Whether a resolved path is one of them or inside one."""
        return resolved.startswith(self._prefixes) or resolved in self.paths

    def hides(self, st: os.stat_result) -> bool:
        """Whether a file or directory a walk came to is one of them (by identity)."""
        return (st.st_dev, st.st_ino) in self.identities

    def covers_fd(self, fd: int) -> bool:
        """Whether the file open on `fd` is inside them: the kernel's name for the very file
        that was opened, so no symlink swapped after the check can fool it."""
        if not self.paths:
            return False
        try:
            name = os.readlink("/proc/self/fd/%d" % fd)  # noqa: UP031 (the faster here)
        except OSError:
            return False  # no /proc: the path checks of the callers remain
        return name.startswith(self._prefixes) or name in self.paths


NOTHING_HIDDEN: Final = HiddenPaths()


def visible_cover(root: str, hidden: tuple[str, ...]) -> tuple[str, ...]:
    """Paths whose trees together hold everything beneath `root` except the `hidden` paths (all
    resolved): `root` itself when none is inside it; else, for each directory on the way to a
    hidden path, its other entries one by one. An entry that is a symlink into (or around) a
    hidden path is left out: a Landlock rule on it would name its target. What is created
    later directly in a directory on the way is not covered until the cover is made again."""
    inside = tuple(path for path in hidden if beneath(path, root))
    if not inside:
        return (root,)
    if root in inside:
        return ()
    out: list[str] = []
    try:
        names = sorted(os.listdir(root))
    except OSError:
        return ()
    for name in names:
        child = os.path.join(root, name)
        try:
            is_link = stat.S_ISLNK(os.lstat(child).st_mode)
        except OSError:
            continue
        if is_link:
            target = os.path.realpath(child)
            if any(beneath(target, path) or beneath(path, target) for path in hidden):
                continue
            out.append(child)
            continue
        out.extend(visible_cover(child, inside))
    return tuple(out)


# A directory's mtime this recent may still be the one a change made after it was read gives it
# too: a file system stamps changes with a coarse clock, so an entry made within the same tick
# as the last change leaves the mtime as it was. A cover listed while a stamp is this young is
# not kept (as git re-checks a file whose mtime is not older than its index: "racy git"). The
# tick is the kernel's coarse clock (a few ms) on file systems with nanosecond stamps, and 1 or
# 2 s on those without (ext3, HFS+, FAT), whose stamps are whole seconds: such a stamp gets the
# longer wait (a whole second from a fine clock is rare, and then costs a walk for 2 s).
RACY_MTIME_NS: Final = 50_000_000
RACY_WHOLE_SECOND_MTIME_NS: Final = 2_000_000_000


def _trusted(stamp: int, now: int) -> bool:
    """`stamp` (a directory's st_mtime_ns, read after `now`) is old enough that a change
    after the directory was read has moved it."""
    young = RACY_WHOLE_SECOND_MTIME_NS if stamp % 1_000_000_000 == 0 else RACY_MTIME_NS
    return now - stamp > young


@dataclass
class CoverCache:
    """`visible_cover` made again only when a directory it listed changed (its mtime): a
    sandboxed spawn then costs a few stats, not a walk of the directories on the way. One made
    while a directory's mtime was too young to be trusted (`RACY_MTIME_NS`) is made again
    next time."""

    _entries: dict[tuple[str, tuple[str, ...]], tuple[tuple[int, ...], tuple[str, ...]]] = field(
        default_factory=dict
    )

    def cover(self, root: str, hidden: tuple[str, ...]) -> tuple[str, ...]:
        key = (root, hidden)
        now = time.time_ns()
        stamps = _stamps(root, hidden)
        cached = self._entries.get(key)
        if cached is not None and cached[0] == stamps:
            return cached[1]
        made = visible_cover(root, hidden)
        if all(_trusted(stamp, now) for stamp in stamps):
            self._entries[key] = (stamps, made)
        else:
            self._entries.pop(key, None)  # a change may share its stamp: list it again
        return made


def _stamps(root: str, hidden: tuple[str, ...]) -> tuple[int, ...]:
    """The mtimes of the directories `visible_cover` lists: those from `root` down to each
    hidden path's parent."""
    dirs: set[str] = set()
    for path in hidden:
        if not beneath(path, root) or path == root:
            continue
        parent = os.path.dirname(path)
        while beneath(parent, root):
            dirs.add(parent)
            if parent == root:
                break
            parent = os.path.dirname(parent)
    out: list[int] = []
    for directory in sorted(dirs):
        try:
            out.append(os.stat(directory).st_mtime_ns)
        except OSError:
            out.append(-1)
    return tuple(out)
