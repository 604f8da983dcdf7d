"""search_files' patterns and globs on RE2 (actors/tools/patterns.py), its block-wise search,
its time budget and stop flag, and the mount table it reads: real files under tmp_path.

The block search (one RE2 call per block of lines, then a confirmation per line) must find
exactly what matching each line alone finds; hypothesis checks that against the plain model,
over line endings, bytes that are not UTF-8 and the patterns whose meaning differs between a
line and a block (anchors, `\\s`, negated classes, `\\A`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import re2  # type: ignore[import-untyped]
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from toolwire.actors.results import Outcome, ToolReport
from toolwire.actors.tools import files
from toolwire.actors.tools.files import (
    SearchFilesArgs,
    SearchStopped,
    check_search_files,
    search_files,
)
from toolwire.actors.tools.mounts import parse_mountinfo
from toolwire.actors.tools.patterns import compile_line_pattern


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    return workspace


def search(ws: Path, pattern: str, **kw: Any) -> ToolReport:
    options = {
        k: kw.pop(k) for k in ("max_matches", "should_stop", "max_seconds", "clock") if k in kw
    }
    return search_files(str(ws), SearchFilesArgs(pattern=pattern, **kw), **options)


# --- the block search finds what a line-by-line search finds ------------------------------------

PATTERNS = [
    "a", "^a", "a$", "^$", "^", "b\\s*$", "\\s", "[^a]", "a.b", "(?s)a.b", "\\bab\\b",
    "\\Aa", "a\\z", "(?i)A", "a\\r", "\\x{FFFD}", "^\\s+$", "ab|^b", "(?-m)^a",
]  # fmt: skip


def model(data: bytes, pattern: str) -> list[tuple[int, str]]:
    """Each line alone: split at "\\n", one "\\r" before it dropped, decoded with U+FFFD."""
    regex = re2.compile(pattern)
    pieces = data.split(b"\n")
    if pieces[-1] == b"":
        pieces.pop()
    found = []
    for number, raw in enumerate(pieces, start=1):
        line = raw.decode("utf-8", errors="replace")
        if line.endswith("\r"):
            line = line[:-1]
        if regex.search(line) is not None:
            found.append((number, line))
    return found


line_bytes = st.lists(
    st.sampled_from([b"a", b"b", b" ", b"\t", b"\r", b"\xff", b"\xc3\xa9", b"ab"])
)
texts = st.lists(line_bytes.map(b"".join), max_size=12).map(
    lambda lines: b"\n".join(lines)
) | st.lists(line_bytes.map(b"".join), max_size=12).map(lambda lines: b"\r\n".join(lines) + b"\n")


@settings(max_examples=300, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=texts, pattern=st.sampled_from(PATTERNS), block=st.sampled_from([3, 7, 64 * 1024]))
def test_block_search_matches_line_by_line(
    ws: Path, data: bytes, pattern: str, block: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Small blocks too, so that lines fall on every side of a block's edge.
    monkeypatch.setattr(files, "SEARCH_BLOCK_BYTES", block)
    (ws / "f.txt").write_bytes(data)
    r = search(ws, pattern, path="f.txt", max_matches=10_000)
    assert r.outcome is Outcome.COMPLETED, r
    assert r.data is not None
    assert [(m["line"], m["text"]) for m in r.data["matches"]] == model(data, pattern)


def test_a_pattern_with_text_anchors_is_matched_line_by_line() -> None:
    assert compile_line_pattern("\\Aimport").block is None
    assert compile_line_pattern("x\\z").block is None
    assert compile_line_pattern("(?i-m)^x").block is None
    assert compile_line_pattern("^import").block is not None


# --- what RE2 refuses ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pattern", "why"),
    [
        ("(a)\\1", "backreferences"),
        ("(?P<x>a)(?P=x)", "backreferences `(?P=name)`"),
        ("foo(?=bar)", "lookahead"),
        ("foo(?!bar)", "negative lookahead"),
        ("(?<=x)y", "lookbehind"),
        ("(?<!x)y", "negative lookbehind"),
        ("(?>a+)b", "atomic groups"),
        ("a++", "possessive quantifiers"),
        ("x\\Z", "write `$` or `\\z`"),
        ("\\u00e9", "write `\\x{HHHH}`"),
        ("a{1001}", "over 1000"),
    ],
)
def test_what_re2_does_not_support_fails_naming_it(ws: Path, pattern: str, why: str) -> None:
    (ws / "f.txt").write_text("anything\n")
    r = search(ws, pattern)
    assert r.outcome is Outcome.FAILED and r.data is None
    assert r.text.startswith(f"invalid regex {pattern!r}: "), r.text
    assert why in r.text and "RE2" in r.text, r.text


def test_a_plainly_bad_regex_says_what_is_wrong_only(ws: Path) -> None:
    r = search(ws, "foo(bar")
    assert r.outcome is Outcome.FAILED
    assert r.text == "invalid regex 'foo(bar': missing ): foo(bar"


def test_a_pattern_or_glob_that_is_not_unicode_is_bad_args() -> None:
    with pytest.raises(ValueError, match=r"args\.pattern: must be valid Unicode"):
        check_search_files(SearchFilesArgs(pattern="a\ud800"))
    with pytest.raises(ValueError, match=r"args\.glob: must be valid Unicode"):
        check_search_files(SearchFilesArgs(pattern="a", glob="\udcff*"))


# --- globs --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("glob", "expected"),
    [
        ("my file #1.txt", {"my file #1.txt"}),  # characters re.escape writes that RE2 refuses
        ("*[ #]*", {"my file #1.txt"}),
        # A name that is not UTF-8 is reported readable: each undecodable byte one U+FFFD,
        # which `?` matches as one character.
        ("[!m]*.txt", {"plain.txt", "caf\ufffd.txt"}),
        ("caf?.txt", {"caf\ufffd.txt"}),
        ("[]x]*", set()),
        ("[a-q]*.txt", {"my file #1.txt", "plain.txt", "caf\ufffd.txt"}),
    ],
)
def test_globs_with_special_characters(ws: Path, glob: str, expected: set[str]) -> None:
    for name in ("my file #1.txt", "plain.txt"):
        (ws / name).write_text("needle\n")
    (ws / os.fsdecode(b"caf\xe9.txt")).write_text("needle\n")
    r = search(ws, "needle", glob=glob)
    assert r.data is not None, r
    assert {m["path"] for m in r.data["matches"]} == expected


def test_a_glob_re2_cannot_compile_fails(ws: Path) -> None:
    r = search(ws, "x", glob="[z-a]*")
    assert r.outcome is Outcome.FAILED
    assert r.text.startswith("invalid glob '[z-a]*': invalid character class range"), r.text


# --- time budget and stop flag ------------------------------------------------------------------


class StepClock:
    """A clock that moves one second each time it is read: deterministic, no sleeping."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


def test_a_search_past_its_time_budget_returns_what_it_found(ws: Path) -> None:
    for i in range(10):
        (ws / f"f{i}.txt").write_text("hit\n")
    r = search(ws, "hit", max_seconds=4.5, clock=StepClock())
    assert r.outcome is Outcome.COMPLETED and r.data is not None
    assert r.data["truncated"] is True
    assert 0 < len(r.data["matches"]) < 10
    assert "stopped after 4.5 s, the longest one search runs, so more may match" in r.text


def test_a_search_told_to_stop_raises_search_stopped(ws: Path) -> None:
    (ws / "a.txt").write_text("hit\n" * 10)
    (ws / "b.txt").write_text("hit\n")
    asked: list[int] = []

    def should_stop() -> bool:
        asked.append(1)
        return len(asked) > 2

    with pytest.raises(SearchStopped):
        search(ws, "hit", should_stop=should_stop)
    # Told no, it runs to its end.
    r = search(ws, "hit", should_stop=lambda: False)
    assert r.data is not None and len(r.data["matches"]) == 11


# --- the mount table ----------------------------------------------------------------------------

MOUNTINFO = """\
22 28 0:21 / /proc rw,nosuid,nodev,noexec,relatime shared:12 - proc proc rw
23 28 0:22 / /sys rw,nosuid,nodev,noexec,relatime shared:2 - sysfs sysfs rw
28 1 259:2 / / rw,relatime shared:1 - ext4 /dev/nvme0n1p2 rw
30 23 0:26 / /sys/fs/cgroup rw,nosuid shared:4 - cgroup2 cgroup2 rw,nsdelegate
31 28 0:27 / /tmp rw,nosuid,nodev shared:5 - tmpfs tmpfs rw
40 28 0:40 / /home/u/remote rw,nosuid,nodev shared:9 - fuse.sshfs u@host: rw
41 28 0:41 / /mnt/x rw master:3 opt:1 - debugfs debugfs rw
not a mount line
"""


def test_the_mount_table_names_pseudo_filesystems_only() -> None:
    assert parse_mountinfo(MOUNTINFO) == {
        os.makedev(0, 21): "proc",
        os.makedev(0, 22): "sysfs",
        os.makedev(0, 26): "cgroup2",
        os.makedev(0, 41): "debugfs",  # optional fields before the separator are skipped
    }
