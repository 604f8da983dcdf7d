"""The read/write reservation planner of a `turn` (PROTOCOL.md section 5.6).

A turn is a batch of tool calls the model asked for in one assistant message. Running them one
by one wastes the wall time of every slow read; running them all at once lets a write race a
read of the same file, and the model then sees a result that matches no order it asked for. The
planner splits the batch into consecutive *segments*: the calls of one segment are safe to run
concurrently, and the segments run one after another. Flattening the segments gives back the
request order exactly, so a sequential reading of the turn is always a correct explanation of
what happened.

Each call gets a `Reservation`, read from its args by its tool's role (`Reserves`), which the
tool's registry entry names (actors/tools/registry.py; this module knows no tool by name):

- readers (`read_file`, `search_files`, `list_dir`) reserve their path in shared mode: two
  reads of one file never disturb each other, so they never conflict;
- writers (`write_file`, `edit_files`) reserve every path they touch exclusively: a write must
  not overlap a read (the reader could see the old or the new content, depending on timing) or
  another write (the last one to finish would win, whatever the request order said);
- the process tools `process_list` and `process_output` touch no file at all, so they reserve
  nothing and never conflict;
- barriers run alone in their segment: `execute` (a shell command can read or write any path,
  and we cannot know which without running it), `process_signal`, `process_input` and
  `process_resize` (PROTOCOL.md 9.1: each changes what a running command does, which can be
  anything, so it is ordered against everything), tools the planner does not know (it
  cannot know what they touch), and every call whose args are malformed (not a dict, or
  without the path the tool needs). A malformed call will fail on its own terms anyway; making
  it a barrier keeps the plan obviously correct instead of guessing at what it meant.

Paths are compared in canonical form so that two spellings of one file (`x`, `./x`,
`d/../x`, `~/ws/x`, an absolute path, a symlink to it) are one reservation. Resolving them
reads the filesystem, so it is not done here: the shell reads each call's `Reservation`
(actors/reservations.py) before it hands the turn to ChatState, once per turn, before any call
of the turn runs, so the canonical forms describe the filesystem as the turn found it.
Containment is tested component by component, so a write under a searched directory conflicts
with the search, while `/a/b` and `/a/bc` stay independent.

This module is a pure core: no trio, no I/O, no filesystem call.

Known limits, accepted because they only cost parallelism or need an oracle we do not have:
hard links to one inode are different paths to the planner; a search that follows a symlink
inside its tree to a directory elsewhere reserves only the tree it was asked to search.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

# How many calls of one segment run at once. Hermes runs parallel batches on 8 workers, and
# models rarely ask for more than a handful of calls per message; 8 keeps a big batch of reads
# from opening hundreds of files (and threads) at once while still hiding most latency. The
# planner itself never splits a segment at this size: a segment of 20 reads is one segment that
# the executor drains 8 at a time, so the plan stays a pure function of reservations.
MAX_PARALLEL_CALLS = 8


class Access(enum.Enum):
    READ = "read"  # shared: conflicts only with an overlapping WRITE
    WRITE = "write"  # exclusive: conflicts with any overlapping READ or WRITE
    NONE = "none"  # process tools: reserve nothing, never conflict with a READ, WRITE or NONE
    BARRIER = "barrier"  # runs alone: conflicts with everything


@dataclass(frozen=True, slots=True)
class Reserves:
    """A tool's role in a turn: how the planner reads a call's args into a `Reservation`. Each
    tool's entry in the registry (actors/tools/registry.py) names its role; a tool the
    registry does not know is a barrier (`BARRIER`).

    READ and WRITE reserve the path in `args[path_arg]` (a non-empty string), or, with
    `each_in`, the `path_arg` of every object of the list `args[each_in]` (edit_files);
    `default_path` is the path reserved when the arg is absent or null (the workspace root of
    a search). NONE and BARRIER read no args."""

    access: Access
    path_arg: str = "path"
    default_path: str | None = None
    each_in: str | None = None


def reader(path_arg: str = "path", *, default: str | None = None) -> Reserves:
    """Reads the path in `args[path_arg]` (or `default` when absent): shared with readers."""
    return Reserves(Access.READ, path_arg, default)


def writer(path_arg: str = "path", *, each_in: str | None = None) -> Reserves:
    """Writes the path in `args[path_arg]` (or of each entry of `args[each_in]`): exclusive."""
    return Reserves(Access.WRITE, path_arg, None, each_in)


# Touches no file (the process table's readers): never conflicts.
NOTHING = Reserves(Access.NONE)
# May touch anything (a command, what acts on one, a tool the planner does not know): alone.
BARRIER = Reserves(Access.BARRIER)


class PlannedCall(NamedTuple):
    """What the planner needs of one call of a turn."""

    call_id: str
    # The tool's role, from the registry (BARRIER for a tool it does not know).
    reserves: Reserves
    # Normally a dict (the call's `args` object). Anything else (a list, None, a string) makes
    # the call a barrier: the tool will reject it, and we do not guess what it would touch.
    args: object


@dataclass(frozen=True)
class Reservation:
    access: Access
    # Canonical absolute paths (reservations.canonical_path); empty for NONE and BARRIER.
    paths: tuple[str, ...]


# What a call reserves when it is a barrier, and when it touches no file.
BARRIER_RESERVATION = Reservation(Access.BARRIER, ())
NOTHING_RESERVED = Reservation(Access.NONE, ())


def _overlaps(a: str, b: str) -> bool:
    """True when canonical path `a` equals or contains `b`, or `b` contains `a`.

    Compared component by component, not as raw string prefixes: `/a/b` contains `/a/b/c`
    (writing `/a/b/c` changes what a search of `/a/b` sees) but not `/a/bc` (a sibling that
    merely shares a prefix). Canonical paths have no trailing slash except the root `/`,
    which contains everything.
    """
    if a == b:
        return True
    shorter, longer = (a, b) if len(a) < len(b) else (b, a)
    return longer.startswith(shorter.rstrip("/") + "/")


def conflicts(a: Reservation, b: Reservation) -> bool:
    """True when the calls holding `a` and `b` must not run at the same time.

    Symmetric. A barrier conflicts with everything (that is what makes it run alone); NONE
    conflicts with nothing else; two READs never conflict; otherwise (at least one WRITE) the
    reservations conflict when some path of one overlaps some path of the other.
    """
    if a.access is Access.BARRIER or b.access is Access.BARRIER:
        return True
    if a.access is Access.NONE or b.access is Access.NONE:
        return False
    if a.access is Access.READ and b.access is Access.READ:
        return False
    return any(_overlaps(p, q) for p in a.paths for q in b.paths)


def plan_segments(call_ids: Sequence[str], reservations: Sequence[Reservation]) -> list[list[str]]:
    """Split a turn's calls (their ids in request order, each with its `Reservation`) into
    consecutive segments of call ids (the `turn_plan`).

    Greedy, in request order: a call joins the current segment unless it is a barrier or
    conflicts with a reservation already in it. A conflict closes the segment and the call
    opens the next one. A barrier closes the current segment (if it has calls), gets a segment
    of its own, and the call after it opens a fresh segment. Greedy is enough: a segment only
    ever holds calls adjacent in request order, so reordering (which could pack more calls
    together) is never allowed, and closing a segment earlier than needed would only lose
    parallelism.

    Every call appears exactly once, so flattening the result gives back the request order.
    Duplicate call_ids are NOT deduplicated here: the caller rejects a turn that names one
    call_id twice before planning (each call id is at most once, PROTOCOL.md section 5.1), and
    if duplicates slip through, each occurrence is planned like any other call.

    Segments are not capped at MAX_PARALLEL_CALLS; the executor runs at most that many calls of
    a segment at once.
    """
    segments: list[list[str]] = []
    current: list[str] = []
    held = _SegmentReservations()
    for call_id, reservation in zip(call_ids, reservations, strict=True):
        if reservation.access is Access.BARRIER:
            if current:
                segments.append(current)
            segments.append([call_id])
            current, held = [], _SegmentReservations()
            continue
        if held.conflicts_with(reservation):
            segments.append(current)
            current, held = [], _SegmentReservations()
        current.append(call_id)
        held.add(reservation)
    if current:
        segments.append(current)
    return segments


def _enclosing(path: str) -> list[str]:
    """The keys of every path that contains `path` by `_overlaps` (its proper ancestors, as
    `_key` spells them): the text before each "/" of it."""
    return [path[:i] for i, char in enumerate(path) if char == "/"]


def _key(path: str) -> str:
    """How `_overlaps` compares a containing path: without its trailing slashes."""
    return path.rstrip("/")


class _SegmentReservations:
    """The paths a segment holds, indexed so that checking one more call costs the length of
    its paths, not the size of the segment: `plan_segments` stays linear in the turn (issue 27:
    a turn of 3,000 reads of distinct files took 4.5 million `conflicts` checks).

    Answers exactly as `conflicts` against each held reservation would (tests/test_planner.py
    checks it against that pairwise reference): a READ conflicts with a held WRITE that equals,
    contains or lies inside one of its paths; a WRITE with any held READ or WRITE so placed."""

    __slots__ = ("_inside", "_paths")

    def __init__(self) -> None:
        # By access: the held paths as `_key` spells them, and the keys of every path that
        # contains one of them (so "some held path lies inside p" is one lookup of p's key).
        self._paths: dict[Access, set[str]] = {Access.READ: set(), Access.WRITE: set()}
        self._inside: dict[Access, set[str]] = {Access.READ: set(), Access.WRITE: set()}

    def conflicts_with(self, reservation: Reservation) -> bool:
        if reservation.access is Access.NONE:
            return False
        against = [Access.WRITE] if reservation.access is Access.READ else list(self._paths)
        for path in reservation.paths:
            for access in against:
                paths = self._paths[access]
                if not paths:
                    continue
                if _key(path) in paths:
                    return True
                if _key(path) in self._inside[access]:
                    return True  # a held path lies inside this one
                if any(outer in paths for outer in _enclosing(path)):
                    return True  # a held path contains this one
        return False

    def add(self, reservation: Reservation) -> None:
        if reservation.access is Access.NONE:
            return
        paths = self._paths[reservation.access]
        inside = self._inside[reservation.access]
        for path in reservation.paths:
            paths.add(_key(path))
            inside.update(_enclosing(path))
