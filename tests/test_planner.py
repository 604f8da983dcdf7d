"""Tests of the turn planner (actors/planner.py, PROTOCOL.md section 5.6).

Everything runs against real files and symlinks in a temporary directory: the planner's job is
to see through the spellings the filesystem allows, so faking the filesystem would test nothing.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from toolwire.actors.canonical_paths import canonical_path
from toolwire.actors.planner import (
    MAX_PARALLEL_CALLS,
    Access,
    PlannedCall,
    Reservation,
    conflicts,
    plan_segments,
)
from toolwire.actors.reservations import reservation_for
from toolwire.actors.tools.registry import TOOLS, reserves_of


def call_of(call_id: str, tool: str, args: object) -> PlannedCall:
    """A call as the chat hands it to the planner: with its tool's role from the registry."""
    return PlannedCall(call_id, reserves_of(tool), args)


def plan_of(calls: list[PlannedCall], workspace: str) -> list[list[str]]:
    """Plan as the chat does: each call's reservation read first (the shell's part, which
    resolves the paths), then the pure split into segments."""
    return plan_segments([c.call_id for c in calls], [reservation_for(c, workspace) for c in calls])


@dataclass(frozen=True)
class Layout:
    base: Path  # also $HOME in the tests that spell paths with `~`
    real: Path  # the real workspace directory
    ws: Path  # a symlink to `real`: the workspace as the planner is given it
    outside: Path  # a directory next to the workspace


def make_layout(base: Path) -> Layout:
    """Build the test tree.

    base/
      real/            the workspace: x, y, dz, d/z, a/b/c, a/bc, lx -> x, ld -> d
      ws -> real
      outside/o
    """
    real = base / "real"
    (real / "d").mkdir(parents=True)
    (real / "a" / "b").mkdir(parents=True)
    for name in ("x", "y", "dz", "d/z", "a/b/c", "a/bc"):
        (real / name).write_text(name)
    (real / "lx").symlink_to("x")
    (real / "ld").symlink_to("d", target_is_directory=True)
    ws = base / "ws"
    ws.symlink_to(real, target_is_directory=True)
    outside = base / "outside"
    outside.mkdir()
    (outside / "o").write_text("o")
    return Layout(base=base, real=real, ws=ws, outside=outside)


@pytest.fixture
def lay(tmp_path: Path) -> Layout:
    return make_layout(tmp_path)


def plan(lay: Layout, *calls: tuple[str, object]) -> list[list[str]]:
    """Plan calls given as (tool, args); their ids are c0, c1, ... in request order."""
    planned = [call_of(f"c{i}", tool, args) for i, (tool, args) in enumerate(calls)]
    return plan_of(planned, str(lay.ws))


def read(path: str) -> tuple[str, object]:
    return ("read_file", {"path": path})


def write(path: str) -> tuple[str, object]:
    return ("write_file", {"path": path, "content": "new"})


def search(path: str | None = None) -> tuple[str, object]:
    args: dict[str, object] = {"pattern": "x"}
    if path is not None:
        args["path"] = path
    return ("search_files", args)


def edit(*paths: str) -> tuple[str, object]:
    return (
        "edit_files",
        {"files": [{"path": p, "edits": [{"old": "a", "new": "b"}]} for p in paths]},
    )


def access_of(lay: Layout, tool: str, args: object) -> Access:
    return reservation_for(call_of("c", tool, args), str(lay.ws)).access


# --- the constants ---------------------------------------------------------------------------


def test_the_registry_gives_each_tool_its_role() -> None:
    by_access: dict[Access, list[str]] = {}
    for name, tool in TOOLS.items():
        by_access.setdefault(tool.reserves.access, []).append(name)
    assert sorted(by_access[Access.READ]) == ["list_dir", "read_file", "search_files"]
    assert sorted(by_access[Access.WRITE]) == ["edit_files", "write_file"]
    assert sorted(by_access[Access.NONE]) == ["process_list", "process_output"]
    assert sorted(by_access[Access.BARRIER]) == [
        "execute",
        "process_input",
        "process_resize",
        "process_signal",
    ]
    assert MAX_PARALLEL_CALLS == 8


# --- readers and writers ---------------------------------------------------------------------


def test_readers_of_one_file_stay_parallel(lay: Layout) -> None:
    assert plan(lay, read("x"), read("x"), search("x"), read("./x")) == [["c0", "c1", "c2", "c3"]]


def test_read_then_write_of_one_file_splits(lay: Layout) -> None:
    assert plan(lay, read("x"), write("x")) == [["c0"], ["c1"]]
    assert plan(lay, write("x"), read("x")) == [["c0"], ["c1"]]


def test_a_conflict_opens_a_fresh_segment(lay: Layout) -> None:
    # The write of x conflicts with the read of x, so it opens segment 2; the read of y there
    # does not conflict with the write, so it joins it (the old segment is closed for good).
    assert plan(lay, read("x"), read("y"), write("x"), read("y")) == [["c0", "c1"], ["c2", "c3"]]
    assert plan(lay, read("x"), write("x"), read("x")) == [["c0"], ["c1"], ["c2"]]


def test_write_into_a_searched_subtree_splits(lay: Layout) -> None:
    assert plan(lay, search("d"), write("d/z")) == [["c0"], ["c1"]]
    assert plan(lay, search("d"), edit("d/new")) == [["c0"], ["c1"]]
    # ... and the other way round: a write of a directory covers every file below it.
    assert plan(lay, write("d"), read("d/z")) == [["c0"], ["c1"]]


def test_default_root_search_conflicts_with_any_write_in_the_workspace(lay: Layout) -> None:
    assert plan(lay, search(), write("d/z")) == [["c0"], ["c1"]]
    assert plan(lay, ("search_files", {"pattern": "x", "path": None}), write("x")) == [
        ["c0"],
        ["c1"],
    ]
    root = reservation_for(call_of("c", *search()), str(lay.ws))
    assert root == Reservation(Access.READ, (str(lay.real),))
    # A write outside the workspace is not inside the searched root.
    assert plan(lay, search(), write(str(lay.outside / "o"))) == [["c0", "c1"]]
    assert plan(lay, search(), write("../outside/o")) == [["c0", "c1"]]


def test_disjoint_search_and_write_stay_parallel(lay: Layout) -> None:
    assert plan(lay, search("d"), write("x"), write("dz")) == [["c0", "c1", "c2"]]


def test_writers_of_one_path_split(lay: Layout) -> None:
    assert plan(lay, write("x"), write("x")) == [["c0"], ["c1"]]
    assert plan(lay, write("x"), edit("y", "x")) == [["c0"], ["c1"]]
    assert plan(lay, write("x"), write("y"), edit("dz")) == [["c0", "c1", "c2"]]


def test_edit_files_reserves_every_file_it_names(lay: Layout) -> None:
    res = reservation_for(call_of("c", *edit("x", "d/z", "./x")), str(lay.ws))
    # Every path, canonical, once each, in request order.
    assert res == Reservation(Access.WRITE, (str(lay.real / "x"), str(lay.real / "d/z")))
    assert plan(lay, edit("x", "d/z"), read("d/z")) == [["c0"], ["c1"]]


def test_component_wise_containment(lay: Layout) -> None:
    # `a/b` is a directory and `a/bc` a file next to it: a shared string prefix is no overlap.
    assert plan(lay, search("a/b"), write("a/bc")) == [["c0", "c1"]]
    assert plan(lay, write("a/b"), read("a/bc")) == [["c0", "c1"]]
    assert plan(lay, search("a/b"), write("a/b/c")) == [["c0"], ["c1"]]
    assert plan(lay, search("d"), write("dz")) == [["c0", "c1"]]


def test_conflicts_on_reservations() -> None:
    def w(*paths: str) -> Reservation:
        return Reservation(Access.WRITE, paths)

    def r(*paths: str) -> Reservation:
        return Reservation(Access.READ, paths)

    assert conflicts(r("/a/b"), w("/a/b/c"))
    assert conflicts(w("/a/b/c"), r("/a/b"))
    assert not conflicts(r("/a/b"), w("/a/bc"))
    assert not conflicts(w("/a/bc"), w("/a/b"))
    assert conflicts(w("/a/b"), w("/a/b"))
    assert not conflicts(r("/a/b"), r("/a/b"))
    assert conflicts(r("/"), w("/etc/passwd"))
    assert conflicts(w("/x", "/y"), r("/q", "/y"))
    nothing = Reservation(Access.NONE, ())
    barrier = Reservation(Access.BARRIER, ())
    for other in (r("/"), w("/"), nothing):
        assert not conflicts(nothing, other)
        assert not conflicts(other, nothing)
    for other in (r("/"), w("/"), nothing, barrier):
        assert conflicts(barrier, other)
        assert conflicts(other, barrier)


# --- canonical paths -------------------------------------------------------------------------


def test_symlink_to_a_file_is_the_file(lay: Layout) -> None:
    assert canonical_path("lx", str(lay.ws)) == str(lay.real / "x")
    assert plan(lay, read("lx"), write("x")) == [["c0"], ["c1"]]
    assert plan(lay, write("lx"), write("x")) == [["c0"], ["c1"]]


def test_symlinked_directory_is_its_target(lay: Layout) -> None:
    assert plan(lay, write("ld/z"), read("d/z")) == [["c0"], ["c1"]]
    assert plan(lay, search("ld"), write("d/z")) == [["c0"], ["c1"]]
    assert plan(lay, search("d"), edit("ld/z")) == [["c0"], ["c1"]]


def test_new_write_target_under_a_symlinked_directory(lay: Layout) -> None:
    # Neither d/new nor d/sub exist yet: realpath resolves the existing prefix (ld -> d) and
    # appends the rest, so the new file is reserved at its real place.
    assert not (lay.real / "d" / "new").exists()
    assert canonical_path("ld/new", str(lay.ws)) == str(lay.real / "d" / "new")
    assert canonical_path("ld/sub/new", str(lay.ws)) == str(lay.real / "d" / "sub" / "new")
    assert plan(lay, read("d/new"), write("ld/new")) == [["c0"], ["c1"]]
    assert plan(lay, write(str(lay.ws / "ld" / "new")), read(str(lay.real / "d" / "new"))) == [
        ["c0"],
        ["c1"],
    ]


def test_the_workspace_is_canonicalised_too(lay: Layout) -> None:
    assert canonical_path("x", str(lay.ws)) == str(lay.real / "x")
    assert canonical_path(".", str(lay.ws)) == str(lay.real)
    # An absolute path through the real directory meets a relative one through the link.
    assert plan(lay, read(str(lay.real / "x")), write("x")) == [["c0"], ["c1"]]
    assert plan(lay, read(str(lay.ws / "x")), write(str(lay.real / "x"))) == [["c0"], ["c1"]]


def test_tilde_and_dotdot(lay: Layout, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(lay.base))
    real_x = str(lay.real / "x")
    assert canonical_path("~/ws/x", str(lay.ws)) == real_x
    assert canonical_path("~/real/d/../x", str(lay.ws)) == real_x
    assert canonical_path("d/../x", str(lay.ws)) == real_x
    assert canonical_path("./d/./../x", str(lay.ws)) == real_x
    assert canonical_path("../real/x", str(lay.ws)) == real_x
    # `..` after a symlink folds like the kernel does it: from the link's target.
    assert canonical_path("ld/../x", str(lay.ws)) == real_x
    # The workspace may be spelled with `~` too.
    assert canonical_path("x", "~/ws") == real_x
    assert plan(lay, read("~/ws/x"), write("d/../x")) == [["c0"], ["c1"]]
    assert plan(lay, read("~/ws/y"), write("d/../x")) == [["c0", "c1"]]


def test_canonical_path_of_odd_spellings(lay: Layout) -> None:
    assert canonical_path("d/", str(lay.ws)) == str(lay.real / "d")
    assert canonical_path("d//z", str(lay.ws)) == str(lay.real / "d" / "z")
    assert canonical_path("//", str(lay.ws)) == "/"
    with pytest.raises(ValueError):
        canonical_path("x\0y", str(lay.ws))


# --- barriers --------------------------------------------------------------------------------


MALFORMED: list[tuple[str, object]] = [
    ("read_file", ["x"]),
    ("read_file", None),
    ("read_file", "x"),
    ("read_file", {}),
    ("read_file", {"path": 3}),
    ("read_file", {"path": ""}),
    ("read_file", {"path": None}),
    ("read_file", {"path": "x\0y"}),
    ("search_files", {"pattern": "x", "path": 3}),
    ("search_files", {"pattern": "x", "path": ""}),
    ("search_files", []),
    ("write_file", {"content": "c"}),
    ("write_file", {"path": ["x"], "content": "c"}),
    ("edit_files", {"files": "x"}),
    ("edit_files", {"files": {"path": "x"}}),
    ("edit_files", {"files": []}),
    ("edit_files", {}),
    ("edit_files", {"files": ["x"]}),
    ("edit_files", {"files": [{"edits": []}]}),
    ("edit_files", {"files": [{"path": "x", "edits": []}, {"path": 3, "edits": []}]}),
    ("process_list", None),
    ("process_output", ["p"]),
]


@pytest.mark.parametrize(("tool", "args"), MALFORMED)
def test_malformed_args_make_a_barrier(lay: Layout, tool: str, args: object) -> None:
    assert access_of(lay, tool, args) is Access.BARRIER
    # A barrier runs alone, even between calls that could share a segment.
    assert plan(lay, read("y"), (tool, args), read("y")) == [["c0"], ["c1"], ["c2"]]


@pytest.mark.parametrize(
    ("tool", "args"),
    [
        ("execute", {"command": "cat x"}),
        ("process_signal", {"process_id": "p", "signal": "SIGTERM"}),
        # PROTOCOL.md 9.1: typing into or resizing a command is ordered against everything.
        ("process_input", {"process_id": "p", "data": "y\n"}),
        ("process_input", {"process_id": "p", "data": "", "eof": True, "path": "x"}),
        ("process_resize", {"process_id": "p", "rows": 24, "cols": 80}),
        ("frobnicate", {"path": "x"}),
        ("", {}),
    ],
)
def test_execute_process_signal_and_unknown_tools_are_barriers(
    lay: Layout, tool: str, args: object
) -> None:
    assert reservation_for(call_of("c", tool, args), str(lay.ws)) == Reservation(Access.BARRIER, ())
    assert plan(lay, read("x"), read("y"), (tool, args), read("x")) == [
        ["c0", "c1"],
        ["c2"],
        ["c3"],
    ]


def test_barriers_at_the_edges_and_back_to_back(lay: Layout) -> None:
    ex = ("execute", {"command": "make"})
    assert plan(lay, ex) == [["c0"]]
    assert plan(lay, ex, ex, read("x"), read("y")) == [["c0"], ["c1"], ["c2", "c3"]]
    assert plan(lay, read("x"), ex) == [["c0"], ["c1"]]


def test_process_tools_reserve_nothing_and_never_conflict(lay: Layout) -> None:
    assert access_of(lay, "process_list", {}) is Access.NONE
    assert access_of(lay, "process_output", {"process_id": "p", "wait": True}) is Access.NONE
    # process_output without a process_id is the tool's error to report, not a path question.
    assert access_of(lay, "process_output", {}) is Access.NONE
    calls: tuple[tuple[str, object], ...] = (
        write("x"),
        ("process_list", {}),
        ("process_output", {"process_id": "p"}),
        edit("y"),
        search(),
    )
    assert plan(lay, *calls[:4]) == [["c0", "c1", "c2", "c3"]]
    # The root search conflicts with the writes, not with the process tools.
    assert plan(lay, *calls) == [["c0", "c1", "c2", "c3"], ["c4"]]


# --- plan shape ------------------------------------------------------------------------------


def test_empty_turn(lay: Layout) -> None:
    assert plan(lay) == []


def test_segments_are_not_capped_at_max_parallel_calls(lay: Layout) -> None:
    # The executor runs at most MAX_PARALLEL_CALLS of a segment at once; the plan does not cut.
    n = MAX_PARALLEL_CALLS * 2 + 1
    assert plan(lay, *[read("x")] * n) == [[f"c{i}" for i in range(n)]]


def test_duplicate_call_ids_are_not_deduplicated(lay: Layout) -> None:
    calls = [
        call_of("same", "read_file", {"path": "x"}),
        call_of("same", "read_file", {"path": "x"}),
        call_of("same", "write_file", {"path": "x", "content": ""}),
    ]
    assert plan_of(calls, str(lay.ws)) == [["same", "same"], ["same"]]


# --- properties over random turns ------------------------------------------------------------
#
# A call is drawn abstractly: a kind and a few references to files of the layout, each with two
# spelling indices. Rendering with the first or the second index spells the same files
# differently, which must never change the plan. The expected access of each kind and the real
# file behind each spelling are known, so an independent oracle can plan the turn from file
# names alone, without the filesystem.

# Real path (relative to the workspace, "" = its root) -> ways to spell it. {ws}, {real} and
# {out} are filled in from the layout; `~` is the layout's base (HOME is set while planning).
SPELLINGS: dict[str, list[str]] = {
    "": [".", "./", "{ws}", "{real}/", "~/ws", "d/..", "ld/.."],
    "x": ["x", "./x", "d/../x", "ld/../x", "{ws}/x", "{real}/x", "lx", "./lx", "~/ws/x"],
    "y": ["y", "{ws}/./y", "~/real/y"],
    "d": ["d", "./d", "d/", "ld", "{ws}/ld/", "{real}/d"],
    "d/z": ["d/z", "ld/z", "./d//z", "{real}/d/z", "d/../d/z", "~/ws/ld/z"],
    "d/new": ["d/new", "ld/new", "{ws}/ld/new", "./d/./new"],
    "dz": ["dz", "./dz", "{real}/dz"],
    "../outside/o": ["{out}/o", "../outside/o", "~/outside/o"],
}
KEYS = sorted(SPELLINGS)

# kind -> (tool, expected access). Paths are filled in by `render`.
KINDS: dict[str, tuple[str, Access]] = {
    "read": ("read_file", Access.READ),
    "search": ("search_files", Access.READ),
    "search_root": ("search_files", Access.READ),
    "search_none": ("search_files", Access.READ),
    "write": ("write_file", Access.WRITE),
    "edit": ("edit_files", Access.WRITE),
    "process_list": ("process_list", Access.NONE),
    "process_output": ("process_output", Access.NONE),
    "execute": ("execute", Access.BARRIER),
    "process_signal": ("process_signal", Access.BARRIER),
    "process_input": ("process_input", Access.BARRIER),
    "process_resize": ("process_resize", Access.BARRIER),
    "unknown": ("frobnicate", Access.BARRIER),
    "bad_list": ("read_file", Access.BARRIER),
    "bad_missing": ("write_file", Access.BARRIER),
    "bad_int": ("read_file", Access.BARRIER),
    "bad_files": ("edit_files", Access.BARRIER),
}

Ref = tuple[str, int, int]  # (real key, spelling index A, spelling index B)
Abstract = tuple[str, list[Ref]]

refs_st = st.lists(
    st.tuples(st.sampled_from(KEYS), st.integers(0, 99), st.integers(0, 99)),
    min_size=1,
    max_size=3,
)
turns_st = st.lists(st.tuples(st.sampled_from(sorted(KINDS)), refs_st), max_size=14)
PROPERTY = settings(max_examples=150, deadline=None, database=None)


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Layout:
    # Module-scoped and never written to by the tests, so every hypothesis example sees the
    # same, intact tree.
    return make_layout(tmp_path_factory.mktemp("planner"))


@contextmanager
def home(lay: Layout) -> Iterator[None]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HOME", str(lay.base))
        yield


def spell(lay: Layout, ref: Ref, which: int) -> str:
    key, a, b = ref
    options = SPELLINGS[key]
    text = options[(a, b)[which] % len(options)]
    return text.format(ws=lay.ws, real=lay.real, out=lay.outside)


def render(lay: Layout, turn: list[Abstract], which: int = 0) -> list[PlannedCall]:
    calls: list[PlannedCall] = []
    for i, (kind, refs) in enumerate(turn):
        tool = KINDS[kind][0]
        path = spell(lay, refs[0], which)
        args: object
        if kind in ("read", "search", "write"):
            args = {"path": path, "pattern": "p", "content": "c"}
        elif kind == "search_root":
            args = {"pattern": "p"}
        elif kind == "search_none":
            args = {"pattern": "p", "path": None}
        elif kind == "edit":
            files = [{"path": spell(lay, r, which), "edits": []} for r in refs]
            args = {"files": files}
        elif kind == "bad_list":
            args = [path]
        elif kind == "bad_missing":
            args = {"content": path}
        elif kind == "bad_int":
            args = {"path": len(path)}
        elif kind == "bad_files":
            args = {"files": path}
        else:
            args = {
                "process_id": "p",
                "command": path,
                "signal": "SIGTERM",
                "data": path,
                "rows": 24,
                "cols": 80,
            }
        calls.append(call_of(f"c{i}", tool, args))
    return calls


def oracle_paths(kind: str, refs: list[Ref]) -> list[str]:
    """The real files a call touches, as workspace-relative keys ("" = the workspace root)."""
    if kind in ("search_root", "search_none"):
        return [""]
    if kind == "edit":
        return [key for key, _, _ in refs]
    return [refs[0][0]]


def oracle_overlap(p: str, q: str) -> bool:
    if p.startswith("..") or q.startswith(".."):
        return p == q  # the one file outside the workspace
    return p == q or p == "" or q == "" or q.startswith(p + "/") or p.startswith(q + "/")


def oracle_plan(turn: list[Abstract]) -> list[list[str]]:
    """The plan computed from the layout's real file names, without touching the filesystem."""
    segments: list[list[str]] = []
    current: list[str] = []
    held: list[tuple[Access, list[str]]] = []
    for i, (kind, refs) in enumerate(turn):
        access = KINDS[kind][1]
        paths = oracle_paths(kind, refs)
        if access is Access.BARRIER:
            segments += [current] if current else []
            segments.append([f"c{i}"])
            current, held = [], []
            continue
        clash = access is not Access.NONE and any(
            other is not Access.NONE
            and Access.WRITE in (access, other)
            and any(oracle_overlap(p, q) for p in paths for q in theirs)
            for other, theirs in held
        )
        if clash:
            segments.append(current)
            current, held = [], []
        current.append(f"c{i}")
        held.append((access, paths))
    if current:
        segments.append(current)
    return segments


@PROPERTY
@given(turn=turns_st)
def test_property_plan_shape(shared: Layout, turn: list[Abstract]) -> None:
    with home(shared):
        calls = render(shared, turn)
        segments = plan_of(calls, str(shared.ws))
        res = {c.call_id: reservation_for(c, str(shared.ws)) for c in calls}
    # Every kind gets the access the protocol gives it.
    for call, (kind, _) in zip(calls, turn, strict=True):
        assert res[call.call_id].access is KINDS[kind][1]
    # Order preserved: flattening gives back the request order exactly; no segment is empty.
    assert [cid for seg in segments for cid in seg] == [c.call_id for c in calls]
    assert all(segments)
    for seg in segments:
        # A barrier is always alone in its segment.
        if any(res[cid].access is Access.BARRIER for cid in seg):
            assert len(seg) == 1
        # No two calls of a segment conflict.
        for i, a in enumerate(seg):
            for b in seg[i + 1 :]:
                assert not conflicts(res[a], res[b]), (a, b, res[a], res[b])
    # Greedy maximality: each boundary is caused by a barrier on either side of it, or by a
    # conflict of the next segment's first call with a call of the previous segment.
    for prev, nxt in itertools.pairwise(segments):
        first = res[nxt[0]]
        assert (
            first.access is Access.BARRIER
            or res[prev[-1]].access is Access.BARRIER
            or any(conflicts(first, res[cid]) for cid in prev)
        ), (prev, nxt)


@PROPERTY
@given(turn=turns_st)
def test_property_spellings_of_one_file_are_one(shared: Layout, turn: list[Abstract]) -> None:
    with home(shared):
        first = plan_of(render(shared, turn, which=0), str(shared.ws))
        second = plan_of(render(shared, turn, which=1), str(shared.ws))
        # The workspace's own spelling does not matter either.
        third = plan_of(render(shared, turn, which=1), str(shared.real))
    assert first == second == third


@PROPERTY
@given(turn=turns_st)
def test_property_plan_matches_an_oracle_on_real_names(
    shared: Layout, turn: list[Abstract]
) -> None:
    with home(shared):
        segments = plan_of(render(shared, turn), str(shared.ws))
    assert segments == oracle_plan(turn)


def _pairwise_plan(reservations: list[tuple[str, Reservation]]) -> list[list[str]]:
    """The plan by the definition of 5.6, each call checked against every reservation of its
    segment with `conflicts`: the reference the indexed planner must equal."""
    segments: list[list[str]] = []
    current: list[str] = []
    held: list[Reservation] = []
    for call_id, reservation in reservations:
        if reservation.access is Access.BARRIER:
            if current:
                segments.append(current)
            segments.append([call_id])
            current, held = [], []
            continue
        if any(conflicts(reservation, other) for other in held):
            segments.append(current)
            current, held = [], []
        current.append(call_id)
        held.append(reservation)
    if current:
        segments.append(current)
    return segments


# Absolute paths over a tiny alphabet, so that equal, containing, contained and merely
# prefix-sharing paths (`/a` and `/ab`) all come up; the root `/` too.
_components = st.lists(st.sampled_from(["a", "b", "ab"]), min_size=0, max_size=3)
_abs_paths = _components.map(lambda parts: "/" + "/".join(parts))
# Not on disk: canonicalising a path under it changes nothing.
_PLAN_ROOT = "/nonexistent-toolwire-plan-root"


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from([Access.READ, Access.WRITE, Access.NONE, Access.BARRIER]),
            st.lists(_abs_paths, min_size=1, max_size=3),
        ),
        max_size=12,
    )
)
def test_the_indexed_planner_plans_as_the_pairwise_definition(
    calls: list[tuple[Access, list[str]]],
) -> None:
    """Issue 27: the planner indexes a segment's paths so a turn of thousands of calls is
    planned in linear time; it must plan exactly as checking every pair would."""
    assert not Path(_PLAN_ROOT).exists()
    real_root = _PLAN_ROOT
    planned: list[PlannedCall] = []
    reservations: list[tuple[str, Reservation]] = []
    for index, (access, paths) in enumerate(calls):
        call_id = f"c{index}"
        if access is Access.BARRIER:
            planned.append(call_of(call_id, "execute", {"command": "x"}))
            reservations.append((call_id, Reservation(Access.BARRIER, ())))
            continue
        if access is Access.NONE:
            planned.append(call_of(call_id, "process_list", {}))
            reservations.append((call_id, Reservation(Access.NONE, ())))
            continue
        spelled = [real_root + path if path != "/" else real_root for path in paths]
        if access is Access.WRITE:
            args: dict[str, object] = {"files": [{"path": p, "edits": []} for p in spelled]}
            planned.append(call_of(call_id, "edit_files", args))
        else:
            planned.append(call_of(call_id, "read_file", {"path": spelled[0]}))
            spelled = spelled[:1]
        reservations.append((call_id, Reservation(access, tuple(dict.fromkeys(spelled)))))
    assert plan_of(planned, real_root) == _pairwise_plan(reservations)
