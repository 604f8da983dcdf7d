"""What each call of a turn reserves (PROTOCOL.md 5.6), read from its args with its paths
resolved against the filesystem: the shell's part of planning a turn (actors/planner.py holds
the pure part). It reads the filesystem (`os.path.realpath` follows symlinks), which on a slow
or network workspace takes long, so the shell runs `reserve` on a worker thread when ChatState
asks (`ResolveTurn`) and hands back canonical paths (`TurnPlanned`); ChatState plans with them
and makes no filesystem call of its own. A turn none of whose calls names a path (commands,
process tools) needs no thread hop: `reserve_at_once` gives its reservations right away.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

from toolwire.actors.calls import CallSpec
from toolwire.actors.canonical_paths import canonical_path
from toolwire.actors.planner import (
    BARRIER_RESERVATION,
    NOTHING_RESERVED,
    Access,
    PlannedCall,
    Reservation,
    Reserves,
)
from toolwire.actors.tools.registry import reserves_of


def reserve(specs: Sequence[CallSpec], workspace: str) -> tuple[Reservation, ...]:
    """Each call's reservation, in order (by its tool's role in the registry), with the
    workspace canonicalised once."""
    root = os.path.realpath(os.path.expanduser(workspace))
    return tuple(
        reservation_for(PlannedCall(s.call_id, reserves_of(s.tool), s.args), root) for s in specs
    )


def reserve_at_once(specs: Sequence[CallSpec]) -> tuple[Reservation, ...] | None:
    """Each call's reservation when none of them needs the filesystem (no call reserves a
    path), without looking at it; None when one does (then `reserve`, off the loop)."""
    found: list[Reservation] = []
    for spec in specs:
        reservation = _without_paths(PlannedCall(spec.call_id, reserves_of(spec.tool), spec.args))
        if reservation is None:
            return None
        found.append(reservation)
    return tuple(found)


def _path_arg(args: Mapping[object, object], key: str) -> str | None:
    """The string path in `args[key]`, or None when it is missing, not a string, or empty."""
    value = args.get(key)
    if isinstance(value, str) and value:
        return value
    return None


def _each_path(args: Mapping[object, object], each_in: str, key: str) -> list[str] | None:
    """Every `args[each_in][i][key]` (edit_files' `files[i].path`), or None when malformed."""
    entries = args.get(each_in)
    if not isinstance(entries, list) or not entries:
        return None
    paths: list[str] = []
    for entry in entries:
        if not isinstance(entry, dict):
            return None
        path = _path_arg(entry, key)
        if path is None:
            return None
        paths.append(path)
    return paths


def _raw_paths(role: Reserves, args: Mapping[object, object]) -> list[str] | None:
    """The uncanonicalised paths a READ or WRITE call touches, or None to make it a barrier."""
    if role.each_in is not None:
        return _each_path(args, role.each_in, role.path_arg)
    if role.default_path is not None and args.get(role.path_arg) is None:
        # A search or listing without a path covers the whole workspace (PROTOCOL.md 8, 10.5).
        return [role.default_path]
    path = _path_arg(args, role.path_arg)
    return None if path is None else [path]


def reservation_for(call: PlannedCall, workspace: str) -> Reservation:
    """What `call` reserves: shared paths, exclusive paths, nothing, or the whole turn.

    Anything the planner cannot read with certainty becomes a barrier, because a barrier is
    always safe: at worst it costs parallelism, never correctness.
    """
    at_once = _without_paths(call)
    if at_once is not None:
        return at_once
    assert isinstance(call.args, dict)
    raw = _raw_paths(call.reserves, call.args)
    assert raw is not None
    try:
        # dict.fromkeys dedupes (an edit_files naming one file twice) and keeps the order.
        paths = tuple(dict.fromkeys(canonical_path(path, workspace) for path in raw))
    except (ValueError, OSError):
        # A NUL byte or a path the OS refuses to look at: the tool will fail on it anyway.
        return BARRIER_RESERVATION
    return Reservation(call.reserves.access, paths)


def _without_paths(call: PlannedCall) -> Reservation | None:
    """What `call` reserves when that needs no path (a barrier, nothing), else None."""
    role = call.reserves
    if role.access is Access.BARRIER or not isinstance(call.args, dict):
        # Commands, what acts on them, tools we do not know, args that are not an object.
        return BARRIER_RESERVATION
    if role.access is Access.NONE:
        return NOTHING_RESERVED
    if _raw_paths(role, call.args) is None:
        return BARRIER_RESERVATION
    return None
