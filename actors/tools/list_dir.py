"""The `list_dir` tool (PROTOCOL.md 10.5): the entries of a directory, to a depth.

A plain synchronous function that the chat runs on a worker thread (its registry entry), like
search_files. Bounded whatever the tree holds: the walk streams each directory (never reads a
whole one into a list), keeps only the `MAX_ENTRIES` smallest paths in a heap, and stops after
visiting `MAX_VISITED` entries, saying so in its data and text. So a directory of millions of
entries costs at most `MAX_ENTRIES` kept entries and `MAX_VISITED` stat calls.
"""

from __future__ import annotations

import heapq
import os
import stat
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Protocol

import msgspec

from toolwire.actors.hidden_paths import NOTHING_HIDDEN, TEXT_HIDDEN, HiddenPaths
from toolwire.actors.results import Outcome, ToolFailure, ToolReport
from toolwire.actors.tools import patterns
from toolwire.actors.tools.files import VCS_DIRS, PathShower, check_glob, check_path, os_failure
from toolwire.actors.tools.mounts import PseudoFilesystems

# PROTOCOL.md 10.5: more entries than this and the first ones by path are listed, `truncated`.
MAX_ENTRIES = 1000
# The walk stops after this many entries (listed or not, a glob may skip most of them): about
# a second of lstat calls on a local disk, and a bound on a tree of millions of files, or a
# slow network mount, which would otherwise hold the worker thread for minutes.
MAX_VISITED = 200_000
MAX_DEPTH = 8

DESCRIPTION = (
    "List a directory of the workspace (default its root): entries {path, type (file, dir, "
    "symlink or other), size, mtime_ms} sorted by path, paths relative to the workspace. "
    "depth 1 (default) lists the directory's own entries, up to 8 goes that many levels "
    "down; glob keeps only entries whose path below the directory matches (`*`, `**`, `?`, "
    "`[...]`; without a `/` it matches the base name at any depth). Symlinks are listed, "
    "not followed; VCS directories such as .git are listed but not entered, and pseudo "
    "filesystems such as /proc are not entered. At most "
    f"{MAX_ENTRIES} entries (the first by path; truncated says more exist), and the walk stops "
    f"after {MAX_VISITED} entries visited (visited_all false). Fails for a missing path or a "
    "file. Use it to find your way around before reading or searching."
)


class ListDirArgs(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    path: Annotated[
        Annotated[str, msgspec.Meta(min_length=1)] | None,
        msgspec.Meta(
            description="The directory to list, relative to the workspace or absolute; default"
            " the workspace root."
        ),
    ] = None
    depth: Annotated[
        int,
        msgspec.Meta(
            ge=1,
            le=MAX_DEPTH,
            description="How many levels to list: 1 is the directory's own entries.",
        ),
    ] = 1
    glob: Annotated[
        Annotated[str, msgspec.Meta(min_length=1)] | None,
        msgspec.Meta(
            description="Only entries whose path below the directory matches this glob;"
            " directories are still entered to `depth`."
        ),
    ] = None


def check_args(args: ListDirArgs) -> None:
    """What the Struct's shape does not say; ValueError naming the field."""
    if args.path is not None:
        check_path("args.path", args.path)
    if not 1 <= args.depth <= MAX_DEPTH:  # a Struct built by hand skips Meta's bounds
        raise ValueError(f"args.depth: must be 1..{MAX_DEPTH}")
    if args.glob is not None:
        check_glob("args.glob", args.glob)


EntryType = Literal["file", "dir", "symlink", "other"]


class _Kept:
    """A heap item ordered backwards, so the heap's top is the largest path kept: one more
    entry replaces it when it sorts before it."""

    __slots__ = ("entry", "path")

    def __init__(self, path: str, entry: dict[str, Any]) -> None:
        self.path = path
        self.entry = entry

    def __lt__(self, other: _Kept) -> bool:
        return self.path > other.path


@dataclass
class _Walk:
    shower: PathShower
    glob: patterns.GlobMatcher | None
    pseudo: PseudoFilesystems
    kept: list[_Kept]
    hidden: HiddenPaths
    visited: int = 0
    matched: int = 0
    unreadable: int = 0
    pseudo_skipped: int = 0
    hidden_skipped: int = 0

    def keep(self, path: str, rel: str, st: os.stat_result) -> None:
        if self.glob is not None and not self.glob.matches(rel):
            return
        self.matched += 1
        shown = self.shower(path)
        if len(self.kept) == MAX_ENTRIES and not shown < self.kept[0].path:
            return
        item = _Kept(shown, _entry(shown, st))
        if len(self.kept) < MAX_ENTRIES:
            heapq.heappush(self.kept, item)
        else:
            heapq.heapreplace(self.kept, item)


def _entry(shown: str, st: os.stat_result) -> dict[str, Any]:
    mode = st.st_mode
    kind: EntryType
    if stat.S_ISLNK(mode):
        kind = "symlink"
    elif stat.S_ISDIR(mode):
        kind = "dir"
    elif stat.S_ISREG(mode):
        kind = "file"
    else:
        kind = "other"
    return {"path": shown, "type": kind, "size": st.st_size, "mtime_ms": st.st_mtime_ns // 10**6}


def list_dir(
    workspace: str, args: ListDirArgs, *, hidden: HiddenPaths = NOTHING_HIDDEN
) -> ToolReport:
    """The entries of `args.path` (default the workspace) to `args.depth` levels:
    ``data = {"entries": [{path, type, size, mtime_ms}], "truncated", "visited_all"}``.
    A missing path, a file or a pseudo-filesystem is `failed`, and so is the agent's own state
    (`hidden`), which a walk lists but does not enter."""
    check_args(args)
    try:
        return _list_dir(workspace, args, hidden)
    except ToolFailure as f:
        return ToolReport(outcome=Outcome.FAILED, text=f.text, data=f.data)


def _list_dir(workspace: str, args: ListDirArgs, hidden: HiddenPaths) -> ToolReport:
    try:
        glob = patterns.GlobMatcher(args.glob) if args.glob is not None else None
    except patterns.PatternError as e:
        raise ToolFailure(e.text) from None
    shown_root = args.path if args.path is not None else "the workspace"
    base = os.path.expanduser(workspace)
    root = os.path.abspath(os.path.join(base, os.path.expanduser(args.path or ".")))
    try:
        st = os.stat(root)
    except OSError as e:
        raise os_failure(e, shown_root, "list") from None
    if not stat.S_ISDIR(st.st_mode):
        raise ToolFailure(f"{shown_root} is not a directory: read_file reads a file")
    if hidden and hidden.covers(os.path.realpath(root)):
        raise ToolFailure(TEXT_HIDDEN.format(path=shown_root), {"path": shown_root})
    pseudo = PseudoFilesystems.read()
    fstype = pseudo.fstype(st.st_dev)
    if fstype is not None:
        raise ToolFailure(
            f"{shown_root} is on a {fstype} pseudo-filesystem (kernel interfaces, not files);"
            " list_dir lists only real file systems"
        )
    walk = _Walk(PathShower(workspace), glob, pseudo, [], hidden)
    complete = _walk(root, args.depth, walk)
    entries = [item.entry for item in sorted(walk.kept, key=lambda item: item.path)]
    truncated = walk.matched > len(entries) or not complete
    text = f"listed {len(entries)} entries of {shown_root}"
    if walk.matched > len(entries):
        text += f"; {walk.matched} matched, the first {len(entries)} by path are listed"
    if not complete:
        text += (
            f"; stopped after visiting {MAX_VISITED} entries, so more may exist: list a"
            " deeper directory or use a smaller depth"
        )
    if walk.unreadable:
        text += f"; could not read {walk.unreadable} directories"
    if walk.pseudo_skipped:
        text += f"; did not enter {walk.pseudo_skipped} directories on pseudo-filesystems"
    if walk.hidden_skipped:
        text += f"; did not enter {walk.hidden_skipped} directories of the agent's own state"
    data = {"entries": entries, "truncated": truncated, "visited_all": complete}
    return ToolReport(outcome=Outcome.COMPLETED, text=text, data=data)


class _Listing(Protocol):
    """What os.scandir returns: entries one at a time, and a close."""

    def __next__(self) -> os.DirEntry[str]: ...
    def close(self) -> None: ...


def _walk(root: str, depth: int, walk: _Walk) -> bool:
    """Visit every entry below `root` to `depth` levels, streaming each directory; False when
    it stopped at MAX_VISITED. At most `depth` directories are open at once."""
    stack: list[tuple[_Listing, str, int]] = []

    def enter(path: str, rel: str, level: int) -> None:
        try:
            stack.append((os.scandir(path), rel, level))
        except OSError:
            walk.unreadable += 1

    enter(root, "", 1)
    try:
        while stack:
            it, rel_dir, level = stack[-1]
            try:
                entry = next(it, None)
            except OSError:
                walk.unreadable += 1
                entry = None
            if entry is None:
                it.close()
                stack.pop()
                continue
            if walk.visited == MAX_VISITED:
                return False
            walk.visited += 1
            rel = f"{rel_dir}{entry.name}"
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue  # gone since it was listed
            walk.keep(entry.path, rel, st)
            if level < depth and stat.S_ISDIR(st.st_mode) and entry.name not in VCS_DIRS:
                if walk.pseudo.fstype(st.st_dev) is not None:
                    walk.pseudo_skipped += 1
                elif walk.hidden.hides(st):
                    walk.hidden_skipped += 1
                else:
                    enter(entry.path, rel + "/", level + 1)
        return True
    finally:
        for it, _, _ in stack:
            it.close()
