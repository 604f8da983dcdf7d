"""Tests of actors/tools/files.py: real files under tmp_path, no mocks.

The only fault injection is a wrapper around os.replace (to make one rename fail, or to see
which temp file a rename moves); everything else runs against the real file system.
"""

from __future__ import annotations

import ast
import hashlib
import os
import socket
import stat
import tempfile
import threading
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from toolwire.actors.big_writes import BIG_WRITE_BYTES, BIG_WRITES
from toolwire.actors.results import Outcome, ToolReport, ToolwireError
from toolwire.actors.tools import files
from toolwire.actors.tools.files import (
    READ_MAX_BYTES,
    READ_MAX_LINES,
    SEARCH_MAX_LINE_CHARS,
    Edit,
    EditFilesArgs,
    FileEdits,
    ReadFileArgs,
    SearchFilesArgs,
    WriteFileArgs,
    edit_files,
    read_file,
    search_files,
    write_file,
)
from toolwire.actors.tools.registry import TOOLS, parse_args
from toolwire.actors.tools.whole_files import READ_SLICE_BYTES

# --- helpers ------------------------------------------------------------------------------------


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    return workspace


def snapshot(root: Path) -> dict[str, tuple[str, bytes | str, int]]:
    """Every entry under root: kind, content (bytes, or a link's target) and mode."""
    out: dict[str, tuple[str, bytes | str, int]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath, name)
            rel = str(p.relative_to(root))
            st_ = p.lstat()
            if p.is_symlink():
                out[rel] = ("link", os.readlink(p), 0)
            elif p.is_dir():
                out[rel] = ("dir", b"", stat.S_IMODE(st_.st_mode))
            else:
                out[rel] = ("file", p.read_bytes(), stat.S_IMODE(st_.st_mode))
    return out


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def temps(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.name.startswith(files.TEMP_PREFIX)]


def assert_failed(report: ToolReport, *fragments: str) -> None:
    assert report.outcome is Outcome.FAILED, report
    assert report.data is None
    assert report.output == ""
    for fragment in fragments:
        assert fragment in report.text, (fragment, report.text)


def read(ws: Path, path: str, offset: int | None = None, limit: int | None = None) -> ToolReport:
    return read_file(str(ws), ReadFileArgs(path=path, offset=offset, limit=limit))


def write(ws: Path, path: str, content: str) -> ToolReport:
    return write_file(str(ws), WriteFileArgs(path=path, content=content))


def edit(ws: Path, *entries: tuple[str, list[Edit]]) -> ToolReport:
    args = EditFilesArgs(files=[FileEdits(path=p, edits=e) for p, e in entries])
    return edit_files(str(ws), args)


def search(ws: Path, pattern: str, **kw: Any) -> ToolReport:
    max_matches = kw.pop("max_matches", files.SEARCH_MAX_MATCHES)
    return search_files(str(ws), SearchFilesArgs(pattern=pattern, **kw), max_matches=max_matches)


def lines_model(text: str) -> list[str]:
    """Lines end at "\\n" only and keep their endings; a last line without one still counts."""
    parts = text.split("\n")
    return [p + "\n" for p in parts[:-1]] + ([parts[-1]] if parts[-1] else [])


# --- arguments ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "kind", "where"),
    [
        ({"path": "a", "offset": 0}, ReadFileArgs, "$.offset"),
        ({"path": "a", "limit": -1}, ReadFileArgs, "$.limit"),
        ({"path": ""}, ReadFileArgs, "$.path"),
        ({"path": "a", "offset": True}, ReadFileArgs, "$.offset"),
        ({"path": "a"}, WriteFileArgs, "content"),
        ({"files": []}, EditFilesArgs, "$.files"),
        ({"files": [{"path": "a", "edits": []}]}, EditFilesArgs, "$.files[0].edits"),
        (
            {"files": [{"path": "a", "edits": [{"old": "x", "new": ""}, {"old": "", "new": ""}]}]},
            EditFilesArgs,
            "$.files[0].edits[1].old",
        ),
        ({"pattern": ""}, SearchFilesArgs, "$.pattern"),
        ({"pattern": "x", "glob": ""}, SearchFilesArgs, "$.glob"),
    ],
)
def test_convert_names_the_field(raw: dict[str, Any], kind: type[Any], where: str) -> None:
    with pytest.raises(msgspec.ValidationError) as info:
        msgspec.convert(raw, kind)
    assert where in str(info.value)


@pytest.mark.parametrize(
    ("args", "named", "takes"),
    [
        (
            {"files": [{"path": "a", "edits": [{"old": "x", "new": "y"}]}], "q": 3},
            "args.q",
            "files",
        ),
        (
            {"files": [{"path": "a", "edits": [{"old": "x", "new": "y"}], "z": 2}]},
            "args.files[0].z",
            "path, edits, expected_sha256",
        ),
        (
            {"files": [{"path": "a", "edits": [{"old": "x", "new": "y", "why": 1}]}]},
            "args.files[0].edits[0].why",
            "old, new, replace_all",
        ),
    ],
)
def test_an_unknown_argument_is_bad_args_naming_it(
    args: dict[str, Any], named: str, takes: str
) -> None:
    # PROTOCOL.md 10.3: a misspelled argument silently ignored would mislead the model.
    with pytest.raises(ToolwireError) as info:
        parse_args(TOOLS["edit_files"], args)
    assert info.value.code == "bad_args"
    assert info.value.message == (
        f"edit_files: `{named}` is not an argument of this tool (it takes: {takes})"
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (ReadFileArgs(path="a", offset=0), "args.offset: must be >= 1"),
        (ReadFileArgs(path="a", limit=0), "args.limit: must be >= 1"),
        (ReadFileArgs(path=""), "args.path: must not be empty"),
        (ReadFileArgs(path="a\0b"), "args.path: must not contain a NUL character"),
        (WriteFileArgs(path="", content=""), "args.path: must not be empty"),
        (WriteFileArgs(path="a", content="x\ud800"), "args.content: must be valid Unicode"),
        (EditFilesArgs(files=[]), "args.files: must not be empty"),
        (EditFilesArgs(files=[FileEdits(path="a", edits=[])]), "args.files[0].edits: must not"),
        (
            EditFilesArgs(
                files=[
                    FileEdits(path="a", edits=[Edit(old="x", new="y")]),
                    FileEdits(path="b", edits=[Edit(old="x", new="y"), Edit(old="", new="y")]),
                ]
            ),
            "args.files[1].edits[1].old: must not be empty",
        ),
        (SearchFilesArgs(pattern=""), "args.pattern: must not be empty"),
        (SearchFilesArgs(pattern="x", path=""), "args.path: must not be empty"),
        (SearchFilesArgs(pattern="x", glob=""), "args.glob: must not be empty"),
    ],
)
def test_check_args_names_the_field(args: msgspec.Struct, message: str) -> None:
    check = next(tool.check for tool in TOOLS.values() if tool.args_type is type(args))
    with pytest.raises(ValueError) as info:
        check(args)
    assert str(info.value).startswith(message)


def test_tools_refuse_unchecked_args_before_touching_disk(ws: Path) -> None:
    with pytest.raises(ValueError, match=r"^args\.files: "):
        edit_files(str(ws), EditFilesArgs(files=[]))
    with pytest.raises(ValueError, match=r"^args\.path: "):
        write_file(str(ws), WriteFileArgs(path="", content="x"))
    assert snapshot(ws) == {}


def test_module_does_not_import_trio() -> None:
    tree = ast.parse(Path(files.__file__).read_text())
    imported: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module.split(".")[0])
    assert "trio" not in imported


# --- read_file ----------------------------------------------------------------------------------


def content(report: ToolReport) -> str:
    assert report.data is not None, report.text
    return str(report.data["content"])


def test_read_whole_file(ws: Path) -> None:
    (ws / "a.txt").write_bytes(b"one\ntwo\nthree\n")
    r = read(ws, "a.txt")
    assert r.outcome is Outcome.COMPLETED
    assert r.data == {
        "content": "one\ntwo\nthree\n",
        "lines": 3,
        "total_lines": 3,
        "sha256": sha(b"one\ntwo\nthree\n"),
    }
    assert r.output == ""  # the content travels once, in data
    assert r.text == "read 3 of 3 lines of a.txt"


def test_read_offset_and_limit(ws: Path) -> None:
    whole = b"".join(b"line %d\n" % i for i in range(1, 11))
    (ws / "a.txt").write_bytes(whole)
    r = read(ws, "a.txt", offset=3, limit=4)
    assert r.data == {
        "content": "line 3\nline 4\nline 5\nline 6\n",
        "lines": 4,
        "total_lines": 10,
        "sha256": sha(whole),  # of the whole file, not of the part returned
    }
    assert r.text == "read 4 of 10 lines of a.txt (lines 3-6)"
    r = read(ws, "a.txt", offset=9)
    assert r.data == {
        "content": "line 9\nline 10\n",
        "lines": 2,
        "total_lines": 10,
        "sha256": sha(whole),
    }


def test_read_keeps_line_endings(ws: Path) -> None:
    raw = b"a\r\nb\rc\n\n\xc3\xa9 no newline"
    (ws / "a.txt").write_bytes(raw)
    r = read(ws, "a.txt")
    assert r.data is not None
    assert r.data["content"].encode() == raw
    assert r.data["total_lines"] == 4
    assert read(ws, "a.txt", offset=2, limit=1).data == {
        "content": "b\rc\n",
        "lines": 1,
        "total_lines": 4,
        "sha256": sha(raw),
    }


def test_read_offset_past_end_is_completed_and_empty(ws: Path) -> None:
    (ws / "a.txt").write_bytes(b"1\n2\n3\n")
    r = read(ws, "a.txt", offset=7)
    assert r.outcome is Outcome.COMPLETED
    assert r.data == {"content": "", "lines": 0, "total_lines": 3, "sha256": sha(b"1\n2\n3\n")}
    assert "has 3 lines" in r.text


def test_read_empty_file(ws: Path) -> None:
    (ws / "e.txt").write_bytes(b"")
    r = read(ws, "e.txt")
    assert r.outcome is Outcome.COMPLETED
    assert r.data == {"content": "", "lines": 0, "total_lines": 0, "sha256": sha(b"")}
    assert "empty" in r.text


def test_read_caps_lines_and_names_next_offset(ws: Path) -> None:
    (ws / "big.txt").write_bytes(b"x\n" * 2500)
    r = read(ws, "big.txt")
    assert r.data == {
        "content": "x\n" * READ_MAX_LINES,
        "lines": 2000,
        "total_lines": 2500,
        "sha256": sha(b"x\n" * 2500),  # the lines past the cap are hashed too
    }
    assert f"stopped at {READ_MAX_LINES} lines" in r.text
    assert "offset=2001" in r.text
    r = read(ws, "big.txt", offset=2001, limit=5000)
    assert r.data is not None and r.data["lines"] == 500
    assert "stopped" not in r.text
    # A limit within the cap that leaves lines behind is the caller's choice: no cap note.
    assert "stopped" not in read(ws, "big.txt", limit=10).text


def test_read_caps_bytes_and_names_next_offset(ws: Path) -> None:
    line = b"y" * 999 + b"\n"
    (ws / "wide.txt").write_bytes(line * 1000)
    r = read(ws, "wide.txt", offset=5)
    fit = READ_MAX_BYTES // len(line)
    assert r.data is not None
    assert r.data["lines"] == fit
    assert len(r.data["content"].encode()) <= READ_MAX_BYTES
    assert f"offset={5 + fit}" in r.text and f"stopped at {READ_MAX_BYTES} bytes" in r.text


def test_read_cuts_a_single_overlong_line_on_a_character_boundary(ws: Path) -> None:
    (ws / "min.js").write_bytes(("é" * READ_MAX_BYTES).encode() + b"\nnext\n")
    r = read(ws, "min.js")
    assert r.outcome is Outcome.COMPLETED and r.data is not None
    content = r.data["content"]
    assert set(content) == {"é"}
    assert len(content.encode()) == READ_MAX_BYTES
    assert r.data["lines"] == 1 and r.data["total_lines"] == 2
    assert "line 1 is longer" in r.text and "offset=2" in r.text


def test_read_refuses_binary(ws: Path) -> None:
    (ws / "img.png").write_bytes(b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR")
    assert_failed(read(ws, "img.png"), "img.png is a binary file", "read_file only returns text")
    (ws / "latin1.txt").write_bytes(b"caf\xe9\n")
    assert_failed(read(ws, "latin1.txt"), "latin1.txt is a binary file", "UTF-8 at byte 3")


def test_read_missing_directory_and_fifo_fail(ws: Path) -> None:
    assert_failed(read(ws, "nope.txt"), "nope.txt does not exist")
    (ws / "d").mkdir()
    assert_failed(read(ws, "d"), "d is a directory")
    (ws / "f.txt").write_text("x")
    assert_failed(read(ws, "f.txt/inner"), "f.txt/inner does not exist")
    os.mkfifo(ws / "pipe")
    assert_failed(read(ws, "pipe"), "pipe is not a regular file")  # and does not block


def test_read_resolves_absolute_and_tilde_paths(
    ws: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "outside.txt").write_text("abs\n")
    assert content(read(ws, str(tmp_path / "outside.txt"))) == "abs\n"
    monkeypatch.setenv("HOME", str(tmp_path))
    assert content(read(ws, "~/outside.txt")) == "abs\n"
    (ws / "sub").mkdir()
    (ws / "sub" / "in.txt").write_text("rel\n")
    assert content(read(ws, "sub/../sub/in.txt")) == "rel\n"


_pieces = st.sampled_from(["a", "bc", "é", "💥", "\n", "\n", "\r", "\r\n", "\u2028", "\x0c", " "])


@settings(max_examples=200, deadline=None)
@given(
    text=st.lists(_pieces, max_size=60).map("".join),
    offset=st.none() | st.integers(1, 40),
    limit=st.none() | st.integers(1, 40),
)
def test_read_matches_list_slicing(text: str, offset: int | None, limit: int | None) -> None:
    with tempfile.TemporaryDirectory() as d:
        Path(d, "f.txt").write_bytes(text.encode())
        r = read_file(d, ReadFileArgs(path="f.txt", offset=offset, limit=limit))
    model = lines_model(text)
    start = (offset or 1) - 1
    want = model[start:] if limit is None else model[start : start + limit]
    assert r.outcome is Outcome.COMPLETED
    assert r.data == {
        "content": "".join(want),
        "lines": len(want),
        "total_lines": len(model),
        "sha256": sha(text.encode()),
    }
    assert r.output == ""


# Bytes made of the pieces a text reader must cut right: line ends of each kind, multi-byte
# characters whole and cut short, a NUL, and a run longer than the smallest blocks.
TEXT_LIKE_BYTES = st.lists(
    st.sampled_from([b"a", b"bc", b"\n", b"\n\n", b"\r", "é".encode(), "💥".encode(), b"\0",
                     b"\xe9", b"\xf0\x9f", b"x" * 9]),
    max_size=40,
).map(b"".join)  # fmt: skip


def _lines_or_failure(lines: Any) -> list[tuple[bytes, str]] | str:
    try:
        return [(raw, text) for raw, text in lines]
    except files.ToolFailure as failure:
        return failure.text


@settings(max_examples=300, deadline=None)
@given(
    data=TEXT_LIKE_BYTES,
    block=st.integers(1, 8),
    sniff=st.integers(1, 12),
)  # fmt: skip
def test_read_file_lines_match_the_whole_file_reader(data: bytes, block: int, sniff: int) -> None:
    """read_file reads with os.read in blocks (`_fd_text_lines`); edit_files checks the whole
    file at once (`_check_text`). Same text cut into the file's lines, same NUL sniff, same
    UTF-8 failure and offset, wherever the blocks cut the lines."""
    with tempfile.TemporaryDirectory() as d, pytest.MonkeyPatch.context() as mp:
        mp.setattr(files, "READ_BLOCK_BYTES", block)
        mp.setattr(files, "BINARY_SNIFF_BYTES", sniff)
        path = Path(d, "f")
        path.write_bytes(data)
        model: list[tuple[bytes, str]] | str
        try:
            files._check_text(data, "f", "read_file")
            model = [(raw, raw.decode()) for raw in _newline_lines(data)]
            assert "".join(line for _, line in model) == data.decode()
        except files.ToolFailure as failure:
            model = failure.text
        fd = os.open(path, os.O_RDONLY)
        try:
            block, eof = files._fd_sniff(fd, lambda _block: None)
            got = _lines_or_failure(
                files._fd_text_lines(fd, "f", "read_file", lambda _block: None, block, eof)
            )
        finally:
            os.close(fd)
    assert got == model


@settings(max_examples=300, deadline=None)
@given(
    data=TEXT_LIKE_BYTES,
    sniff=st.integers(1, 64),
    max_lines=st.integers(1, 12),
    max_bytes=st.integers(1, 64),
)  # fmt: skip
def test_a_whole_small_file_reads_as_its_lines_read_one_by_one_do(
    data: bytes, sniff: int, max_lines: int, max_bytes: int
) -> None:
    """A file that ends within its sniff, read with no offset and no limit, is taken whole
    (`_whole_text`: one decode, no loop over its lines); `offset=1` means the same and always
    reads line by line. Both say the same, failures and caps included, whatever the file
    holds and wherever the caps fall."""
    with tempfile.TemporaryDirectory() as d, pytest.MonkeyPatch.context() as mp:
        mp.setattr(files, "BINARY_SNIFF_BYTES", sniff)
        mp.setattr(files, "READ_MAX_LINES", max_lines)
        mp.setattr(files, "READ_MAX_BYTES", max_bytes)
        Path(d, "f").write_bytes(data)
        whole = read_file(d, ReadFileArgs(path="f"))
        by_lines = read_file(d, ReadFileArgs(path="f", offset=1))
    assert whole == by_lines


def test_a_small_text_file_is_taken_whole() -> None:
    """The property above holds only if the whole path is taken at all: for a small text file
    within the caps it is; a NUL byte, bytes that are not UTF-8, or a cap leave the decision to
    the line by line path."""
    assert files._whole_text(b"a\nb\n") == ("a\nb\n", 2)
    assert files._whole_text(b"a\nb") == ("a\nb", 2)
    assert files._whole_text(b"") == ("", 0)
    assert files._whole_text(b"a\0b\n") is None
    assert files._whole_text(b"\xe9\n") is None
    assert files._whole_text(b"\n" * (files.READ_MAX_LINES + 1)) is None


def _newline_lines(data: bytes) -> list[bytes]:
    """`data` cut after each "\\n" (the last line may lack one)."""
    lines = [piece + b"\n" for piece in data.split(b"\n")]
    lines[-1] = lines[-1][:-1]
    return [line for line in lines if line]


def test_read_file_says_what_a_path_is_when_it_cannot_open_it(ws: Path) -> None:
    """read_file opens first and fstats the open file; when the open itself fails, it still
    names what the path is, as a stat before the open did: a socket cannot be opened (ENXIO) and
    is "not a regular file", an unreadable file is "permission denied"."""

    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(ws / "sock"))
        assert_failed(read(ws, "sock"), "sock is not a regular file")
    (ws / "secret.txt").write_text("x\n")
    (ws / "secret.txt").chmod(0)
    try:
        if os.geteuid() != 0:  # root reads anything
            assert_failed(read(ws, "secret.txt"), "cannot read secret.txt: permission denied")
    finally:
        (ws / "secret.txt").chmod(0o644)


# --- write_file ---------------------------------------------------------------------------------


def test_write_creates_parents_and_counts_utf8_bytes(ws: Path) -> None:
    r = write(ws, "a/b/c/notes.txt", "héllo\n")
    assert r.outcome is Outcome.COMPLETED
    assert r.data == {"bytes": 7, "sha256": sha("héllo\n".encode())}
    assert r.text == "wrote 7 bytes to a/b/c/notes.txt"
    assert r.output == ""
    assert (ws / "a/b/c/notes.txt").read_bytes() == "héllo\n".encode()
    assert temps(ws) == []


def test_write_keeps_line_endings_verbatim(ws: Path) -> None:
    write(ws, "crlf.txt", "a\r\nb\rc\n")
    assert (ws / "crlf.txt").read_bytes() == b"a\r\nb\rc\n"


def test_write_keeps_mode_of_existing_file(ws: Path) -> None:
    script = ws / "run.sh"
    script.write_text("old\n")
    script.chmod(0o755)
    assert write(ws, "run.sh", "#!/bin/sh\necho new\n").outcome is Outcome.COMPLETED
    assert stat.S_IMODE(script.stat().st_mode) == 0o755
    assert script.read_text() == "#!/bin/sh\necho new\n"


def test_write_new_file_gets_umask_mode(ws: Path) -> None:
    old = os.umask(0o027)
    try:
        write(ws, "new.txt", "x")
    finally:
        os.umask(old)
    assert stat.S_IMODE((ws / "new.txt").stat().st_mode) == 0o640


def test_write_onto_directory_fails_and_changes_nothing(ws: Path) -> None:
    (ws / "d").mkdir()
    (ws / "d" / "keep.txt").write_text("keep")
    before = snapshot(ws)
    assert_failed(write(ws, "d", "x"), "d is a directory")
    assert snapshot(ws) == before


def test_write_under_a_file_fails_and_creates_nothing(ws: Path) -> None:
    (ws / "f.txt").write_text("x")
    before = snapshot(ws)
    assert_failed(write(ws, "f.txt/sub/new.txt", "x"), "f.txt/sub/new.txt")
    assert snapshot(ws) == before


def failing_replace(
    monkeypatch: pytest.MonkeyPatch, fail_dst: str | None = None, err: int = 28
) -> list[tuple[str, str]]:
    """Wrap os.replace: record every call, and raise OSError(err) for `fail_dst` (None: all)."""
    calls: list[tuple[str, str]] = []
    real = os.replace

    def replace(src: Any, dst: Any) -> None:
        calls.append((os.fspath(src), os.fspath(dst)))
        if fail_dst is None or os.fspath(dst) == fail_dst:
            raise OSError(err, os.strerror(err), os.fspath(dst))
        real(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    return calls


def test_write_failure_leaves_no_temp_and_old_content(
    ws: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (ws / "a.txt").write_text("old content")
    before = snapshot(ws)
    calls = failing_replace(monkeypatch)
    assert_failed(write(ws, "a.txt", "new content"), "cannot write a.txt", "no space left")
    assert calls and Path(calls[0][0]).name.startswith(files.TEMP_PREFIX)
    assert temps(ws) == []
    assert snapshot(ws) == before
    # The directories a failed write created are removed again.
    assert_failed(write(ws, "x/y/z.txt", "new"), "cannot write x/y/z.txt")
    assert snapshot(ws) == before


def test_write_renames_a_temp_from_the_same_directory(
    ws: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = os.replace
    calls: list[tuple[str, str]] = []

    def spy(src: Any, dst: Any) -> None:
        calls.append((os.fspath(src), os.fspath(dst)))
        assert Path(src).read_text() == "complete"  # fully written before the rename
        real(src, dst)

    monkeypatch.setattr(os, "replace", spy)
    (ws / "sub").mkdir()
    write(ws, "sub/f.txt", "complete")
    [(src, dst)] = calls
    assert os.path.dirname(src) == os.path.dirname(dst) == str((ws / "sub").resolve())
    assert Path(src).name.startswith(files.TEMP_PREFIX)


def test_a_concurrent_reader_never_sees_half_a_file(ws: Path) -> None:
    versions = ["a" * 300_000, "b" * 300_000]
    write(ws, "f.txt", versions[0])
    done = threading.Event()
    seen: set[str] = set()

    def reader() -> None:
        while not done.is_set():
            seen.add((ws / "f.txt").read_text())

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        for i in range(40):
            assert write(ws, "f.txt", versions[i % 2]).outcome is Outcome.COMPLETED
    finally:
        done.set()
        thread.join()
    assert seen and seen <= set(versions)


def test_a_parent_directory_another_write_creates_meanwhile_is_shared(
    ws: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Writes of different paths run at once on worker threads: between one write's check that
    # its parent is missing and its mkdir, another write (of another file there) creates it.
    # Both must complete, and a failing write must not take away the other's directories.
    real = os.mkdir
    other: list[str] = []  # the write to run at the first mkdir, once

    def mkdir(path: Any, mode: int = 0o777, *, dir_fd: int | None = None) -> None:
        if other:
            assert write(ws, other.pop(), "b").outcome is Outcome.COMPLETED
        real(path, mode)

    monkeypatch.setattr(os, "mkdir", mkdir)
    other.append("new/sub/b.txt")
    r = write(ws, "new/sub/a.txt", "a")
    assert r.outcome is Outcome.COMPLETED, r
    assert (ws / "new/sub/a.txt").read_text() == "a"
    assert (ws / "new/sub/b.txt").read_text() == "b"

    other.append("deep/er/b.txt")
    failing_replace(monkeypatch, fail_dst=str(ws.resolve() / "deep/er/a.txt"))
    assert_failed(write(ws, "deep/er/a.txt", "a"), "cannot write deep/er/a.txt")
    assert (ws / "deep/er/b.txt").read_text() == "b"  # the other write's directories stay
    assert not (ws / "deep/er/a.txt").exists()


def test_write_through_symlink_keeps_the_link(ws: Path) -> None:
    (ws / "real.txt").write_text("old")
    (ws / "link.txt").symlink_to("real.txt")
    assert write(ws, "link.txt", "new").outcome is Outcome.COMPLETED
    assert (ws / "link.txt").is_symlink()
    assert os.readlink(ws / "link.txt") == "real.txt"
    assert (ws / "real.txt").read_text() == "new"
    assert temps(ws) == []


# --- edit_files ---------------------------------------------------------------------------------


def test_edit_applies_sequentially_and_reports(ws: Path) -> None:
    (ws / "a.py").write_text("x = 1\ny = 2\n")
    r = edit(ws, ("a.py", [Edit(old="x = 1", new="x = 10"), Edit(old="x = 10\ny", new="z")]))
    assert r.outcome is Outcome.COMPLETED
    assert r.data == {"files": [{"path": "a.py", "replacements": 2, "sha256": sha(b"z = 2\n")}]}
    assert r.text == "applied 2 replacements in 1 file"
    assert r.output == ""
    assert (ws / "a.py").read_text() == "z = 2\n"
    assert temps(ws) == []


def test_edit_is_all_or_nothing_across_files(ws: Path) -> None:
    (ws / "a.py").write_text("alpha\n")
    (ws / "b.py").write_text("beta\n")
    before = snapshot(ws)
    inode = (ws / "a.py").stat().st_ino
    r = edit(
        ws,
        ("a.py", [Edit(old="alpha", new="ALPHA")]),
        ("b.py", [Edit(old="beta", new="BETA"), Edit(old="gamma", new="GAMMA")]),
    )
    assert_failed(r, "edit 2 of b.py: `old` text not found", "no file was changed")
    assert snapshot(ws) == before
    assert (ws / "a.py").stat().st_ino == inode  # not even rewritten with the same bytes


def test_edit_ambiguous_old_fails(ws: Path) -> None:
    (ws / "b.py").write_text("pass\npass\npass\n")
    before = snapshot(ws)
    r = edit(ws, ("b.py", [Edit(old="pass", new="return")]))
    assert_failed(r, "edit 1 of b.py", "occurs 3 times", "replace_all", "no file was changed")
    assert snapshot(ws) == before


def test_edit_replace_all_replaces_every_occurrence(ws: Path) -> None:
    (ws / "b.py").write_text("pass\npass\npass\n")
    r = edit(ws, ("b.py", [Edit(old="pass", new="return", replace_all=True)]))
    assert r.data == {
        "files": [{"path": "b.py", "replacements": 3, "sha256": sha(b"return\nreturn\nreturn\n")}]
    }
    assert (ws / "b.py").read_text() == "return\nreturn\nreturn\n"


def test_edit_missing_or_binary_file_fails(ws: Path) -> None:
    (ws / "a.py").write_text("alpha\n")
    (ws / "bin.dat").write_bytes(b"alpha\0")
    before = snapshot(ws)
    ok = ("a.py", [Edit(old="alpha", new="x")])
    assert_failed(edit(ws, ok, ("gone.py", [Edit(old="a", new="b")])), "gone.py does not exist")
    assert_failed(edit(ws, ok, ("bin.dat", [Edit(old="a", new="b")])), "bin.dat is a binary file")
    (ws / "d").mkdir()
    assert_failed(edit(ws, ok, ("d", [Edit(old="a", new="b")])), "d is a directory")
    assert snapshot(ws) == {**before, "d": snapshot(ws)["d"]}


def test_edit_preserves_crlf_and_hints_at_it(ws: Path) -> None:
    (ws / "w.txt").write_bytes(b"one\r\ntwo\r\n")
    r = edit(ws, ("w.txt", [Edit(old="one\ntwo", new="x")]))
    assert_failed(r, "not found (the file has CRLF line endings)")
    r = edit(ws, ("w.txt", [Edit(old="one\r\ntwo", new="1\r\n2")]))
    assert r.outcome is Outcome.COMPLETED
    assert (ws / "w.txt").read_bytes() == b"1\r\n2\r\n"


def test_edit_same_file_twice_applies_in_order(ws: Path) -> None:
    (ws / "a.py").write_text("v1\n")
    (ws / "link.py").symlink_to("a.py")
    r = edit(
        ws,
        ("a.py", [Edit(old="v1", new="v2")]),
        ("./a.py", [Edit(old="v2", new="v3")]),
        ("link.py", [Edit(old="v3", new="v4")]),
    )
    assert r.outcome is Outcome.COMPLETED, r.text
    assert r.data == {
        "files": [
            {"path": "a.py", "replacements": 1, "sha256": sha(b"v4\n")},
            {"path": "./a.py", "replacements": 1, "sha256": sha(b"v4\n")},
            {"path": "link.py", "replacements": 1, "sha256": sha(b"v4\n")},
        ]
    }
    assert r.text == "applied 3 replacements in 1 file"
    assert (ws / "a.py").read_text() == "v4\n"
    assert (ws / "link.py").is_symlink()


def test_edit_keeps_mode(ws: Path) -> None:
    (ws / "run.sh").write_text("echo a\n")
    (ws / "run.sh").chmod(0o750)
    edit(ws, ("run.sh", [Edit(old="a", new="b")]))
    assert stat.S_IMODE((ws / "run.sh").stat().st_mode) == 0o750


def test_edit_write_failure_restores_written_files(
    ws: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (ws / "a.py").write_text("alpha\n")
    (ws / "b.py").write_text("beta\n")
    before = snapshot(ws)
    calls = failing_replace(monkeypatch, fail_dst=str((ws / "b.py").resolve()))
    r = edit(ws, ("a.py", [Edit(old="alpha", new="A")]), ("b.py", [Edit(old="beta", new="B")]))
    assert_failed(r, "cannot write b.py: no space left", "restored", "no file was changed")
    assert snapshot(ws) == before
    assert [Path(dst).name for _src, dst in calls] == ["a.py", "b.py", "a.py"]


_ALPHABET = "ab\n"
_NAMES = ["a.txt", "b.txt", "c.txt"]
_edits = st.builds(
    Edit,
    old=st.text(_ALPHABET, min_size=1, max_size=3),
    new=st.text(_ALPHABET + "c", max_size=3),
    replace_all=st.booleans(),
)
_entries = st.lists(
    st.tuples(
        st.sampled_from([*_NAMES, *_NAMES, "missing.txt"]), st.lists(_edits, min_size=1, max_size=3)
    ),
    min_size=1,
    max_size=4,
)


def edit_model(
    contents: dict[str, str], entries: list[tuple[str, list[Edit]]]
) -> tuple[dict[str, str], list[int]] | None:
    """Sequential application; None when any edit does not apply."""
    current = dict(contents)
    counts = []
    for name, edits in entries:
        if name not in current:
            return None
        n = 0
        for e in edits:
            found = current[name].count(e.old)
            if found == 0 or (found > 1 and not e.replace_all):
                return None
            current[name] = current[name].replace(e.old, e.new, -1 if e.replace_all else 1)
            n += found if e.replace_all else 1
        counts.append(n)
    return current, counts


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    contents=st.lists(st.text(_ALPHABET, max_size=12), min_size=3, max_size=3),
    entries=_entries,
)
def test_edit_all_or_nothing_property(
    contents: list[str], entries: list[tuple[str, list[Edit]]]
) -> None:
    original = dict(zip(_NAMES, contents, strict=True))
    with tempfile.TemporaryDirectory() as d:
        for name, text in original.items():
            Path(d, name).write_bytes(text.encode())
        inodes = {name: Path(d, name).stat().st_ino for name in _NAMES}
        r = edit_files(d, EditFilesArgs(files=[FileEdits(path=p, edits=e) for p, e in entries]))
        on_disk = {name: Path(d, name).read_bytes().decode() for name in _NAMES}
        # A file is rewritten (a rename: a new inode) exactly when its bytes changed.
        rewritten = {name for name in _NAMES if Path(d, name).stat().st_ino != inodes[name]}
        leftovers = sorted(os.listdir(d))
    assert leftovers == _NAMES
    expected = edit_model(original, entries)
    if expected is None:
        assert r.outcome is Outcome.FAILED and r.data is None
        assert r.text.endswith("no file was changed")
        assert on_disk == original
        assert rewritten == set()
    else:
        assert r.outcome is Outcome.COMPLETED, r.text
        assert on_disk == expected[0]
        assert rewritten == {name for name in _NAMES if expected[0][name] != original[name]}
        assert r.data == {
            "files": [
                {"path": p, "replacements": n, "sha256": sha(expected[0][p].encode())}
                for (p, _), n in zip(entries, expected[1], strict=True)
            ]
        }


# --- search_files -------------------------------------------------------------------------------


@pytest.fixture
def tree(ws: Path) -> Path:
    (ws / "src" / "pkg").mkdir(parents=True)
    (ws / "src" / "app.py").write_text("import os\ndef main():\n    return os.getcwd()\n")
    (ws / "src" / "pkg" / "util.py").write_text("def helper():\n    pass\n")
    (ws / "src" / "notes.txt").write_text("def is not code here\n")
    (ws / "top.py").write_text("def top(): ...\n")
    (ws / ".git").mkdir()
    (ws / ".git" / "config").write_text("def in git\n")
    (ws / "src" / ".hg").mkdir()
    (ws / "src" / ".hg" / "x.py").write_text("def in hg\n")
    (ws / "blob.bin").write_bytes(b"def \0 binary\n")
    return ws


def test_search_regex_reports_relative_paths_in_sorted_order(tree: Path) -> None:
    r = search(tree, r"^def \w+\(")
    assert r.outcome is Outcome.COMPLETED and r.data is not None
    assert r.data == {
        "matches": [
            {"path": "src/app.py", "line": 2, "text": "def main():"},
            {"path": "src/pkg/util.py", "line": 1, "text": "def helper():"},
            {"path": "top.py", "line": 1, "text": "def top(): ..."},
        ],
        "truncated": False,
    }
    assert r.output == ""  # the matches travel once, in data
    assert r.text.startswith("found 3 matches in 3 files")


def test_search_skips_vcs_dirs_and_binary_files(tree: Path) -> None:
    r = search(tree, "def")
    assert r.data is not None
    paths = {m["path"] for m in r.data["matches"]}
    assert paths == {"src/app.py", "src/pkg/util.py", "src/notes.txt", "top.py"}


def test_search_decodes_legacy_bytes_with_replacement(ws: Path) -> None:
    (ws / "latin1.txt").write_bytes(b"caf\xe9 au lait\r\n")
    r = search(ws, "lait$")
    assert r.data is not None
    assert r.data["matches"] == [{"path": "latin1.txt", "line": 1, "text": "caf\ufffd au lait"}]


@pytest.mark.parametrize(
    ("glob", "expected"),
    [
        ("*.py", {"src/app.py", "src/pkg/util.py", "top.py"}),
        ("src/*.py", {"src/app.py"}),
        ("src/**/*.py", {"src/app.py", "src/pkg/util.py"}),
        ("**/util.py", {"src/pkg/util.py"}),
        ("*.txt", {"src/notes.txt"}),
        ("[at]*.py", {"src/app.py", "top.py"}),
        ("[!a]*.py", {"src/pkg/util.py", "top.py"}),
    ],
)
def test_search_glob_filters(tree: Path, glob: str, expected: set[str]) -> None:
    r = search(tree, "def|import", glob=glob)
    assert r.data is not None
    assert {m["path"] for m in r.data["matches"]} == expected


def test_search_glob_is_relative_to_the_search_root(tree: Path) -> None:
    r = search(tree, "def", path="src", glob="pkg/*.py")
    assert r.data is not None
    assert [m["path"] for m in r.data["matches"]] == ["src/pkg/util.py"]
    r = search(tree, "def", glob="*.rs")
    assert r.outcome is Outcome.COMPLETED
    assert "no text file" in r.text and "'*.rs'" in r.text


def test_search_truncates_at_the_cap(ws: Path) -> None:
    (ws / "a.txt").write_text("hit\n" * 6)
    (ws / "b.txt").write_text("hit\n" * 4)
    r = search(ws, "hit", max_matches=5)
    assert r.data is not None
    assert r.data["truncated"] is True
    assert [(m["path"], m["line"]) for m in r.data["matches"]] == [
        ("a.txt", i) for i in range(1, 6)
    ]
    assert "stopped at 5 matches" in r.text
    exact = search(ws, "hit", path="a.txt", max_matches=6)
    assert exact.data is not None and exact.data["truncated"] is False
    assert len(exact.data["matches"]) == 6


def test_search_bad_regex_fails(ws: Path) -> None:
    assert_failed(search(ws, "foo(bar"), "invalid regex 'foo(bar'", "missing )")


def test_search_missing_path_fails(ws: Path) -> None:
    assert_failed(search(ws, "x", path="nowhere"), "nowhere does not exist")


def test_search_a_single_file(tree: Path) -> None:
    r = search(tree, "os", path="src/app.py", glob="*.txt")  # the glob only filters a walk
    assert r.data is not None
    assert [m["line"] for m in r.data["matches"]] == [1, 3]
    assert_failed(search(tree, "def", path="blob.bin"), "blob.bin is a binary file")
    r = search(tree, "nothing", path="top.py")
    assert r.outcome is Outcome.COMPLETED and "in top.py" in r.text


def test_search_outside_workspace_reports_absolute_paths(ws: Path, tmp_path: Path) -> None:
    other = tmp_path / "other"
    other.mkdir()
    (other / "x.txt").write_text("needle\n")
    r = search(ws, "needle", path=str(other))
    assert r.data is not None
    assert r.data["matches"] == [{"path": str(other / "x.txt"), "line": 1, "text": "needle"}]


def test_search_does_not_follow_directory_symlinks(ws: Path) -> None:
    (ws / "d").mkdir()
    (ws / "d" / "f.txt").write_text("needle\n")
    (ws / "d" / "loop").symlink_to("..")
    (ws / "alias").symlink_to("d")
    (ws / "filelink.txt").symlink_to("d/f.txt")
    r = search(ws, "needle")
    assert r.data is not None
    assert [m["path"] for m in r.data["matches"]] == ["d/f.txt", "filelink.txt"]


def test_search_cuts_long_lines(ws: Path) -> None:
    (ws / "min.js").write_text("x" * 10_000 + "needle\n")
    r = search(ws, "needle")
    assert r.data is not None
    assert len(r.data["matches"][0]["text"]) == SEARCH_MAX_LINE_CHARS


# --- the disk is busy while a big file is written (issue 26) ------------------------------------


@pytest.mark.parametrize("size", [BIG_WRITE_BYTES, BIG_WRITE_BYTES - 1], ids=["big", "small"])
def test_a_big_write_or_edit_makes_the_disk_busy_for_its_fsyncs(
    ws: Path, monkeypatch: pytest.MonkeyPatch, size: int
) -> None:
    """The journal keeps its commits off the event loop while the disk is busy (their fsync
    would wait for this one): so a write of at least BIG_WRITE_BYTES counts as busy through
    each of its fsyncs, the file's and its directory's, and a smaller one not at all. Seen by
    the real fsync, which is watched, not replaced."""
    real_fsync = os.fsync
    busy_at_fsync: list[bool] = []

    def watched_fsync(fd: int) -> None:
        busy_at_fsync.append(BIG_WRITES.busy())
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", watched_fsync)
    report = write_file(str(ws), WriteFileArgs(path="big.txt", content="a" * size))
    assert report.outcome is Outcome.COMPLETED, report
    edit = EditFilesArgs(files=[FileEdits(path="big.txt", edits=[Edit(old="aaab", new="cccc")])])
    (ws / "big.txt").write_text("a" * (size - 1) + "b")
    report = edit_files(str(ws), edit)
    assert report.outcome is Outcome.COMPLETED, report
    # write_file: the file's fsync and its directory's; edit_files: the same.
    assert busy_at_fsync == [size >= BIG_WRITE_BYTES] * 4
    assert not BIG_WRITES.busy()  # and not after


@pytest.mark.parametrize("size", [BIG_WRITE_BYTES, BIG_WRITE_BYTES - 1], ids=["big", "small"])
@pytest.mark.parametrize("found", [True, False], ids=["applied", "not-found"])
def test_an_edit_of_a_big_file_keeps_the_disk_busy_from_its_read_to_its_end(
    ws: Path, monkeypatch: pytest.MonkeyPatch, size: int, found: bool
) -> None:
    """An edit_files of a big file reads, writes and fsyncs its files one after the other: the
    disk counts as busy from the read on (so the journal keeps its commits off the loop between
    two writes too), whether the edit is then applied or fails, and not once the call is over.
    Seen where the edit searches the file it read."""
    real_find_all = files.big_text.find_all
    busy_at_search: list[bool] = []

    def watched_find_all(*args: Any, **kwargs: Any) -> list[int]:
        busy_at_search.append(BIG_WRITES.busy())
        return real_find_all(*args, **kwargs)

    monkeypatch.setattr(files.big_text, "find_all", watched_find_all)
    (ws / "big.txt").write_text("a" * (size - 1) + "b")
    old = "aaab" if found else "zzz"
    edit = EditFilesArgs(files=[FileEdits(path="big.txt", edits=[Edit(old=old, new="cccc")])])
    report = edit_files(str(ws), edit)
    assert report.outcome is (Outcome.COMPLETED if found else Outcome.FAILED), report
    assert busy_at_search == [size >= BIG_WRITE_BYTES]
    assert not BIG_WRITES.busy()


# --- big files go to and from the kernel in slices (issue 26) -----------------------------------


def test_a_write_of_many_slices_is_the_content_byte_for_byte(ws: Path) -> None:
    """write_file hands a big file to the kernel a slice at a time (WRITE_SLICE_BYTES): the
    file is still exactly the content, its multi-byte characters across the slices' edges
    included, and the reported digest is the file's."""
    unit = "ab\u00e9\u20ac\U0001f600\n"  # 1, 1, 2, 3 and 4 bytes, and a newline: 12 bytes
    content = unit * (2 * files.WRITE_SLICE_BYTES // 12 + 1001)
    report = write_file(str(ws), WriteFileArgs(path="big.txt", content=content))
    assert report.outcome is Outcome.COMPLETED, report
    data = content.encode()
    assert len(data) > 2 * files.WRITE_SLICE_BYTES
    assert (ws / "big.txt").read_bytes() == data
    assert report.data == {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def test_an_edit_across_the_slices_of_a_big_file_reads_and_writes_it_whole(ws: Path) -> None:
    """edit_files reads a big file and writes its result in slices (READ_SLICE_BYTES,
    WRITE_SLICE_BYTES): an `old` that straddles a slice's edge is found, and the file left is
    the whole edited text, however the edits' pieces fall across the slices."""
    edge = READ_SLICE_BYTES
    text = "x" * (edge - 3) + "OLD-TEXT" + "y" * (edge + 17) + "tail-old" + "z" * 5
    (ws / "big.txt").write_text(text)
    edit = EditFilesArgs(
        files=[
            FileEdits(
                path="big.txt",
                edits=[Edit(old="OLD-TEXT", new="new"), Edit(old="tail-old", new="T" * 100)],
            )
        ]
    )
    report = edit_files(str(ws), edit)
    assert report.outcome is Outcome.COMPLETED, report
    expected = text.replace("OLD-TEXT", "new").replace("tail-old", "T" * 100).encode()
    assert (ws / "big.txt").read_bytes() == expected
    assert report.data is not None
    assert report.data["files"][0]["sha256"] == hashlib.sha256(expected).hexdigest()
