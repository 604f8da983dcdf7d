"""The four file tools of PROTOCOL.md section 8: read_file, write_file, edit_files, search_files.

Plain synchronous functions, so nothing here imports trio: the chat actor runs read_file on the
event loop, and the writers and search_files on worker threads (actors/tools/registry.py says
which). Each takes the workspace directory and an already converted args Struct and returns a
ToolReport. Any number of them may run at once on different threads: the writes of one path
take turns (`PATH_LOCKS`), and directories they both create are shared (`_make_parents`).

Contract shared by all four:

- Arguments. The caller converts the wire dict with ``msgspec.convert(args, ReadFileArgs)`` and
  so on. The Structs carry ``msgspec.Meta`` constraints (non-empty strings and lists, positive
  line numbers), so ``convert`` itself rejects most bad arguments with a field path such as
  ``$.files[0].edits[1].old``. Each tool's check (``check_read_file`` and so on, its
  ``check`` in the registry) re-checks every one of those rules (a Struct built directly in
  Python skips Meta constraints) plus what Meta cannot express: NUL bytes in paths, text that
  cannot be encoded as UTF-8. It raises ``ValueError("args.offset: must be >= 1")``. Every
  tool calls its check first, so invalid args built by hand raise ValueError before touching
  the disk; the registry calls it beforehand and answers ``bad_args``. An unknown field is
  refused by ``convert`` (PROTOCOL.md 10.3).
- Paths. Relative paths resolve against ``workspace``; ``~`` expands. Texts name a path as the
  caller gave it.
- Failures on the tool's own terms (missing file, directory, binary file, permission denied, an
  edit that does not apply, bad regex ...) return ``outcome=failed`` with one plain sentence a
  model can act on, ``data=None`` (except the changed-file failure of ``expected_sha256``,
  whose data says which digests differ), and leave the disk unchanged. They never raise.
  Anything else (a bug) may raise; the chat turns that into ``unknown``.
- ``output``: read_file puts the returned content there, search_files a ``path:line: text``
  listing, the writers leave it "". ``data`` always carries the full payload as well.
- Text means UTF-8 without NUL bytes. A file with a NUL byte in its first 8 KiB, or that is not
  valid UTF-8, is a binary file: read_file and edit_files refuse it. search_files skips files
  with a NUL byte but searches non-UTF-8 ones, decoding bad bytes as U+FFFD.
  Lines end at ``\\n`` only (``\\r\\n`` keeps its ``\\r`` in the line; a lone ``\\r`` does not
  end a line), and line endings are kept byte for byte.
"""

from __future__ import annotations

import enum
import errno
import hashlib
import os
import re
import secrets
import stat
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass, field
from typing import Annotated, Any, BinaryIO, Protocol

import msgspec

from toolwire.actors.big_writes import BIG_WRITES
from toolwire.actors.canonical_paths import canonical_path
from toolwire.actors.hidden_paths import NOTHING_HIDDEN, TEXT_HIDDEN, HiddenPaths
from toolwire.actors.results import Outcome, ToolFailure, ToolReport
from toolwire.actors.tools import big_text, patterns
from toolwire.actors.tools.mounts import PseudoFilesystems
from toolwire.actors.tools.whole_files import WholeFile, read_whole

# --- limits -------------------------------------------------------------------------------------

# read_file returns at most this many lines per call: keeps one result a sane size for a model's
# context; the text says which offset to ask for next.
READ_MAX_LINES = 2000
# read_file returns at most this many bytes of content per call, for files with long lines (a
# minified bundle of 2000 lines could be megabytes); 256 KiB stays well under message limits.
READ_MAX_BYTES = 256 * 1024
# A NUL byte within this many leading bytes marks a binary file. 8 KiB is what git and grep
# sniff: text files practically never contain NUL, binary formats almost always do early on.
BINARY_SNIFF_BYTES = 8 * 1024
# read_file reads in blocks of this size: one read (and the one that finds the end) for most
# source files.
READ_BLOCK_BYTES = 64 * 1024
# A file's bytes go to the kernel in write(2) calls of at most this many bytes (issue 26). The
# kernel the agent runs on is built without preemption of kernel code (PREEMPT_NONE, the server
# default): a thread inside a system call keeps its CPU until the call returns or reaches one of
# the kernel's few preemption points, whatever its nice value. Beside edits of 16 MiB files the
# event loop's thread waited 17-24 ms in the run queue (`/proc/self/task/TID/schedstat`) while
# the tool's thread, in a write(2) of 8 MiB (the copy into the page cache), ran 13-20 ms. Each
# return to user space is a point where the loop's thread gets the CPU: a slice of 1 MiB is
# about 1 ms of copying there, and 16 calls for a 16 MiB file cost nothing next to its fsync.
WRITE_SLICE_BYTES = 1 << 20
# search_files stops after this many matches: a pattern like "e" would otherwise return every
# line of the tree; 500 is enough to act on and bounds the result near 250 KB.
SEARCH_MAX_MATCHES = 500
# Each matched line is cut to this many characters so one minified line cannot flood a result.
SEARCH_MAX_LINE_CHARS = 500
# search_files reads and matches whole lines in blocks of about this size, and looks for a
# cancel (and at the clock) between blocks. One RE2 call per block keeps Python's cost per line
# near zero; and at RE2's slowest (about 1 MB/s, measured, for a pattern whose automaton
# outgrows its cache) a block takes 0.07 s, so a cancel is answered about that fast.
SEARCH_BLOCK_BYTES = 64 * 1024
# The longest one search_files runs before it returns what it found so far (truncated, with a
# text saying so). Enough for a few GB at RE2's usual speed; a search of "/" or of a slow
# network mount still answers while the model can act on it. Sourcegraph's default search
# timeout is 10 s (60 s at most); a tool call of a model may wait somewhat longer.
SEARCH_MAX_SECONDS = 30.0
# Directories of version control systems: their contents are object stores and metadata, never
# what a search means, and .git alone can hold more files than the tree itself.
VCS_DIRS = frozenset({".git", ".hg", ".svn", ".bzr", "_darcs", "CVS"})
# Name prefix of the temporary file an atomic write creates next to its target; a leftover one
# (after a crash) is recognisable and safe to delete.
TEMP_PREFIX = ".toolwire-"
# Attempts at picking an unused random temp name before giving up (48 random bits each: a
# second attempt is already astronomically unlikely).
TEMP_NAME_ATTEMPTS = 100


# --- arguments ----------------------------------------------------------------------------------

NonEmptyStr = Annotated[str, msgspec.Meta(min_length=1)]
LineNumber = Annotated[int, msgspec.Meta(ge=1)]

# `expected_sha256` (PROTOCOL.md 9.4): the file must not exist, or its bytes must hash to this.
ABSENT = "absent"
# Ends in "not followed by any character", not `$`: Python's `$` (msgspec's, and Python
# validators') also matches before a final newline, ECMA-262's (JSON Schema's) does not; the
# lookahead means the end of the string in both, so the schema and the agent agree exactly.
_EXPECTED_SHA256_PATTERN = rf"^(?:{ABSENT}|[0-9a-fA-F]{{64}})(?![\s\S])"
ExpectedSha256 = Annotated[
    Annotated[str, msgspec.Meta(pattern=_EXPECTED_SHA256_PATTERN)] | None,
    msgspec.Meta(
        description=(
            'The hex SHA-256 of the bytes the file must hold for the change to be made, or "absent"'
            " (the file must not exist). Otherwise the call ends `failed` and changes nothing."
        ),
    ),
]


def _described(description: str) -> msgspec.Meta:
    return msgspec.Meta(description=description)


_PATH = "A file's path, relative to the workspace or absolute; `~` is the home directory."


class ReadFileArgs(msgspec.Struct, forbid_unknown_fields=True):
    path: Annotated[NonEmptyStr, _described(_PATH)]
    offset: Annotated[
        LineNumber | None, _described("The 1-based number of the first line to return; default 1.")
    ] = None
    limit: Annotated[
        LineNumber | None,
        _described("How many lines to return; default the rest of the file, up to the caps."),
    ] = None


class WriteFileArgs(msgspec.Struct, forbid_unknown_fields=True):
    path: Annotated[NonEmptyStr, _described(_PATH + " Missing parent directories are made.")]
    content: Annotated[str, _described("The file's whole new content, written as UTF-8.")]
    expected_sha256: ExpectedSha256 = None


class Edit(msgspec.Struct, forbid_unknown_fields=True):
    old: Annotated[
        NonEmptyStr,
        _described("The exact text to replace, whitespace included; it must occur once."),
    ]
    new: Annotated[str, _described("The text to put in its place.")]
    replace_all: Annotated[
        bool, _described("Replace every occurrence of `old` (it may then occur many times).")
    ] = False


class FileEdits(msgspec.Struct, forbid_unknown_fields=True):
    path: Annotated[NonEmptyStr, _described(_PATH)]
    edits: Annotated[
        list[Edit],
        msgspec.Meta(min_length=1, description="The edits of this file, applied in order."),
    ]
    expected_sha256: ExpectedSha256 = None


class EditFilesArgs(msgspec.Struct, forbid_unknown_fields=True):
    files: Annotated[
        list[FileEdits],
        msgspec.Meta(min_length=1, description="The files to edit, each with its edits."),
    ]


class SearchFilesArgs(msgspec.Struct, forbid_unknown_fields=True):
    pattern: Annotated[
        NonEmptyStr,
        _described("An RE2 regular expression, matched against each line without its ending."),
    ]
    path: Annotated[
        NonEmptyStr | None,
        _described("The file or directory to search; default the workspace root."),
    ] = None
    glob: Annotated[
        NonEmptyStr | None,
        _described(
            "Only files whose path below `path` matches this glob (`*`, `?`, `**`, `[...]`;"
            " without a `/` it matches the base name at any depth); a file named by `path` is"
            " searched whatever the glob."
        ),
    ] = None


# What the Structs alone do not guarantee, one check per tool, each raising ValueError naming
# the field. They repeat the Meta constraints (those only run in ``msgspec.convert``/decode,
# not in a Struct built directly) and add: no NUL byte in a path or glob, and every text
# written to disk encodable as UTF-8 (no lone surrogates).


def check_read_file(args: ReadFileArgs) -> None:
    _check_path("args.path", args.path)
    _check_line_number("args.offset", args.offset)
    _check_line_number("args.limit", args.limit)


def check_write_file(args: WriteFileArgs) -> None:
    _check_path("args.path", args.path)
    _check_utf8("args.content", args.content)
    _check_expected("args.expected_sha256", args.expected_sha256)


def check_edit_files(args: EditFilesArgs) -> None:
    if not args.files:
        raise ValueError("args.files: must not be empty")
    for i, entry in enumerate(args.files):
        _check_path(f"args.files[{i}].path", entry.path)
        _check_expected(f"args.files[{i}].expected_sha256", entry.expected_sha256)
        if not entry.edits:
            raise ValueError(f"args.files[{i}].edits: must not be empty")
        for j, edit in enumerate(entry.edits):
            field = f"args.files[{i}].edits[{j}]"
            if not edit.old:
                raise ValueError(f"{field}.old: must not be empty")
            _check_utf8(f"{field}.old", edit.old)
            _check_utf8(f"{field}.new", edit.new)


def check_search_files(args: SearchFilesArgs) -> None:
    if not args.pattern:
        raise ValueError("args.pattern: must not be empty")
    _check_utf8("args.pattern", args.pattern)  # RE2 matches UTF-8
    if args.path is not None:
        _check_path("args.path", args.path)
    if args.glob is not None:
        check_glob("args.glob", args.glob)


def check_glob(field: str, value: str) -> None:
    _check_path(field, value)
    _check_utf8(field, value)


def check_path(field: str, value: str) -> None:
    """A path arg: non-empty, without NUL (no system call takes one)."""
    _check_path(field, value)


def _check_path(field: str, value: str) -> None:
    if not value:
        raise ValueError(f"{field}: must not be empty")
    if "\0" in value:
        raise ValueError(f"{field}: must not contain a NUL character")


def _check_line_number(field: str, value: int | None) -> None:
    if value is not None and value < 1:
        raise ValueError(f"{field}: must be >= 1")


def _check_expected(field: str, value: str | None) -> None:
    if value is not None and re.fullmatch(_EXPECTED_SHA256_PATTERN, value) is None:
        raise ValueError(f'{field}: must be 64 hex digits (a SHA-256) or "absent"')


def _check_utf8(field: str, value: str) -> None:
    if value.isascii():  # O(1) (CPython keeps the flag): a 16 MiB text is not encoded to check
        return
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(f"{field}: must be valid Unicode (lone surrogate at {e.start})") from None


# --- shared helpers -----------------------------------------------------------------------------


def _resolve(workspace: str, path: str) -> str:
    """The path to open: `path` against the workspace, `~` expanded; symlinks left to the OS.
    (`expanduser` called only on a path that starts with `~`, the one it changes: two calls
    fewer on every file tool's call.)"""
    if path[:1] == "~":
        path = os.path.expanduser(path)
    if workspace[:1] == "~":
        workspace = os.path.expanduser(workspace)
    return os.path.join(workspace, path)


def _completed(text: str, data: dict[str, Any], output: str = "") -> ToolReport:
    return ToolReport(outcome=Outcome.COMPLETED, text=text, data=data, output=output)


def _failed(failure: ToolFailure) -> ToolReport:
    return ToolReport(outcome=Outcome.FAILED, text=failure.text, data=failure.data)


def _plural(n: int, word: str, plural: str | None = None) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {plural or word + 's'}"


# The verbs of `os_failure` that create or replace: for them a missing path is no reason to
# fail (they create it), so an ENOENT means a directory on the way vanished under them.
_WRITING_VERBS = frozenset({"write", "create the parent directories of"})


def os_failure(e: OSError, shown: str, verb: str) -> ToolFailure:
    """One plain sentence for an OSError on `shown` (the path as the caller gave it)."""
    writing = verb in _WRITING_VERBS
    if isinstance(e, FileNotFoundError):
        if writing:
            return ToolFailure(
                f"cannot {verb} {shown}: a directory on its path was removed while it was"
                " being written"
            )
        return ToolFailure(f"{shown} does not exist")
    if isinstance(e, NotADirectoryError):
        if writing:
            return ToolFailure(f"cannot {verb} {shown}: a parent of it is a file, not a directory")
        return ToolFailure(f"{shown} does not exist: a parent of it is a file, not a directory")
    if isinstance(e, IsADirectoryError):
        return ToolFailure(f"{shown} is a directory, not a file")
    if isinstance(e, PermissionError):
        return ToolFailure(f"cannot {verb} {shown}: permission denied")
    if e.errno == errno.ELOOP:
        return ToolFailure(f"cannot {verb} {shown}: too many levels of symbolic links")
    if e.errno == errno.ENOSPC:
        return ToolFailure(f"cannot {verb} {shown}: no space left on device")
    reason = e.strerror or str(e)
    return ToolFailure(f"cannot {verb} {shown}: {reason[:1].lower()}{reason[1:]}")


def _stat_regular(full: str, shown: str, verb: str, tool: str) -> os.stat_result:
    """Stat `full` (following symlinks) and insist on a regular file."""
    try:
        st = os.stat(full)
    except OSError as e:
        raise os_failure(e, shown, verb) from None
    _check_regular(st, shown, tool)
    return st


def _check_regular(st: os.stat_result, shown: str, tool: str) -> None:
    if stat.S_ISDIR(st.st_mode):
        raise ToolFailure(f"{shown} is a directory; {tool} works on files")
    if not stat.S_ISREG(st.st_mode):
        raise ToolFailure(f"{shown} is not a regular file; {tool} works on regular files")


def _open_regular(full: str, shown: str, tool: str) -> int:
    """Open `full` for reading (following symlinks) and insist on a regular file; returns the
    file descriptor. Open then fstat, with the same failures as `_stat_regular` then `open`:
    stat first resolves the path twice, and the trivial call is mostly syscalls (issue 6).
    O_NONBLOCK so that opening a FIFO does not wait for a writer (fstat then refuses it);
    reads of a regular file ignore it."""
    try:
        fd = os.open(full, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
    except OSError as e:
        # Name what the path is, as a stat before the open did: a socket (which cannot be
        # opened) is "not a regular file", a directory we may not read is "a directory".
        _stat_regular(full, shown, "read", tool)
        raise os_failure(e, shown, "read") from None
    try:
        _check_regular(os.fstat(fd), shown, tool)
    except BaseException:
        os.close(fd)
        raise
    return fd


# How each tool says it does not handle binary files.
_TEXT_ONLY = {
    "read_file": "read_file only returns text",
    "edit_files": "edit_files only edits text",
    "search_files": "search_files only searches text",
}


def _binary_failure(shown: str, tool: str, why: str) -> ToolFailure:
    return ToolFailure(f"{shown} is a binary file ({why}); {_TEXT_ONLY[tool]}")


def _check_text(raw: big_text.Text, shown: str, tool: str, *, end: int | None = None) -> None:
    """Refuse binary content: ToolFailure if a NUL byte is in the first BINARY_SNIFF_BYTES of
    `raw[:end]` or those bytes are not valid UTF-8 (the failure names the byte offset of the
    first bad byte, as `_decode_line` does).

    The whole buffer at once, not a line at a time: a file of 16 MiB has some 170,000 lines,
    and a Python loop over them holds the GIL for seconds in all, which the event loop, sharing
    it with this worker thread, waits for (issue 26); and in windows (`big_text.check_utf8`),
    without keeping a decoded copy, for the same reason."""
    stop = len(raw) if end is None else end
    if b"\0" in raw[: min(stop, BINARY_SNIFF_BYTES)]:
        raise _binary_failure(shown, tool, "it contains NUL bytes")
    try:
        big_text.check_utf8(raw, end=end)
    except UnicodeDecodeError as e:
        raise _binary_failure(shown, tool, f"not valid UTF-8 at byte {e.start}") from None


def _decode_line(raw: bytes, offset: int, shown: str, tool: str) -> str:
    """`raw`, the line at byte `offset` of the file, as text; ToolFailure if not UTF-8."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise _binary_failure(shown, tool, f"not valid UTF-8 at byte {offset + e.start}") from None


def _fd_sniff(fd: int, on_block: Callable[[bytes], None]) -> tuple[bytes, bool]:
    """The first BINARY_SNIFF_BYTES or more of a file descriptor (a short read must not
    shorten the sniff), read with `os.read` in blocks of READ_BLOCK_BYTES instead of through a
    buffered file object (which adds an fstat, two lseeks and an ioctl to every open), and
    whether the file ended within them. Every block read is passed to `on_block` too (read_file
    hashes the file in the same pass)."""
    block = b""
    while len(block) < BINARY_SNIFF_BYTES:
        more = os.read(fd, READ_BLOCK_BYTES)
        if not more:
            return block, True
        on_block(more)
        block += more
    return block, False


def _fd_text_lines(
    fd: int, shown: str, tool: str, on_block: Callable[[bytes], None], block: bytes, eof: bool
) -> Iterator[tuple[bytes, str]]:
    """The lines of a text file descriptor, as (raw, text) pairs, with `_check_text`'s checks
    and failures: from `block` and `eof` (`_fd_sniff`'s), then read on as it reads."""
    if b"\0" in block[:BINARY_SNIFF_BYTES]:
        raise _binary_failure(shown, tool, "it contains NUL bytes")
    offset = 0
    head: list[bytes] = []  # the start of a line that goes on in the next block
    while True:
        pieces = block.split(b"\n")
        tail = pieces.pop()
        if pieces and head:
            head.append(pieces[0])
            pieces[0] = b"".join(head)
            head = []
        for piece in pieces:
            raw = piece + b"\n"
            yield raw, _decode_line(raw, offset, shown, tool)
            offset += len(raw)
        if tail:
            head.append(tail)
        if eof:
            break
        block = os.read(fd, READ_BLOCK_BYTES)
        on_block(block)
        eof = not block
    if head:  # the last line, without a newline
        raw = b"".join(head)
        yield raw, _decode_line(raw, offset, shown, tool)


# --- preconditions: expected_sha256 and one lock per canonical path ------------------------------


class _PathLock:
    __slots__ = ("lock", "users")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.users = 0  # threads holding or waiting for `lock`; the entry goes at 0


class PathLocks:
    """One lock per canonical path, so that a precondition check and the rename it guards are
    one step with respect to every other toolwire write of that path (PROTOCOL.md 9.4).

    Why `threading.Lock` and not a trio lock: the writers are plain synchronous functions, and
    the chat runs write_file and edit_files on worker threads (ToolKind.THREAD), so that a
    write of 16 MiB and its fsyncs never stall the event loop. A trio lock cannot be taken from
    another thread; a thread lock can. The event loop itself never takes one, so a write that
    waits for a path's lock holds only its own worker thread: every other chat, connection and
    keepalive goes on. A lock is taken and released inside one synchronous call, never held
    across an await, so its holder always runs to the end of its write and releases it.

    The table holds a path only while some thread holds or waits for its lock: an entry is
    created on first use and removed when its last user releases it, so it never grows with
    the paths ever written (``len()`` is the number of paths in use right now).
    """

    def __init__(self) -> None:
        self._guard = threading.Lock()  # guards `_entries` and every entry's `users`
        self._entries: dict[str, _PathLock] = {}

    def __len__(self) -> int:
        with self._guard:
            return len(self._entries)

    @contextmanager
    def hold(self, paths: Iterable[str]) -> Iterator[None]:
        """Hold the locks of `paths` (canonical paths; duplicates are fine) for the block.

        They are taken in sorted order, so two writers of overlapping sets of paths (two
        multi-file edits) cannot each hold a lock the other waits for.
        """
        held: list[tuple[str, _PathLock]] = []
        try:
            for path in sorted(set(paths)):
                held.append((path, self._acquire(path)))
            yield
        finally:
            for path, entry in reversed(held):
                self._release(path, entry)

    def _acquire(self, path: str) -> _PathLock:
        with self._guard:
            entry = self._entries.get(path)
            if entry is None:
                entry = self._entries[path] = _PathLock()
            entry.users += 1
        try:
            entry.lock.acquire()
        except BaseException:  # interrupted while waiting: we hold nothing, drop our use
            self._drop_user(path, entry)
            raise
        return entry

    def _release(self, path: str, entry: _PathLock) -> None:
        entry.lock.release()
        self._drop_user(path, entry)

    def _drop_user(self, path: str, entry: _PathLock) -> None:
        with self._guard:
            entry.users -= 1
            if entry.users == 0:
                del self._entries[path]


# Every toolwire write of this process goes through these locks: the chats of one agent share
# the workspace, and a lock per path is only a guarantee if all writers take the same one.
PATH_LOCKS = PathLocks()


def _sha256_hex(data: bytes | memoryview) -> str:
    return hashlib.sha256(data).hexdigest()


def _current_sha256(target: str, shown: str, tool: str) -> str:
    """The hex SHA-256 of the file at `target` (a canonical path) as it is now, or ABSENT when
    there is none. A path that cannot be read as a regular file fails as the tool would."""
    try:
        fd = os.open(target, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
    except (FileNotFoundError, NotADirectoryError):
        return ABSENT
    except OSError as e:
        raise os_failure(e, shown, "read") from None
    try:
        _check_regular(os.fstat(fd), shown, tool)
        digest = hashlib.sha256()
        while block := os.read(fd, READ_BLOCK_BYTES):
            digest.update(block)
    except OSError as e:
        raise os_failure(e, shown, "read") from None
    finally:
        os.close(fd)
    return digest.hexdigest()


def _changed_failure(shown: str, expected: str, actual: str) -> ToolFailure:
    """PROTOCOL.md 9.4's failure for a file whose bytes are not the ones the caller expected."""

    def short(digest: str) -> str:
        return digest if digest == ABSENT else digest[:12]

    return ToolFailure(
        f"{shown} changed since it was read (expected sha256 {short(expected)},"
        f" found {short(actual)}); no changes were made",
        {"path": shown, "expected_sha256": expected, "actual_sha256": actual},
    )


def _check_precondition(target: str, shown: str, expected: str, tool: str) -> None:
    """Raise the changed-file failure unless the file at `target` is what `expected` says.
    Call it with `target`'s lock held, and keep holding it until the write is renamed."""
    actual = _current_sha256(target, shown, tool)
    if actual != expected.lower():
        raise _changed_failure(shown, expected, actual)


# How often a path is resolved again when a symlink on it changed while it was being resolved
# (os.path.realpath found a link, then readlink found none): a program that replaces a link
# (unlink, then symlink) leaves it missing for microseconds, so a second try almost always
# sees it whole; three bound the work against a link that flips without pause.
RESOLVE_ATTEMPTS = 3


def hidden_failure(shown: str) -> ToolFailure:
    return ToolFailure(TEXT_HIDDEN.format(path=shown), {"path": shown})


def _canonical_target(
    path: str, workspace: str, shown: str, verb: str, hidden: HiddenPaths = NOTHING_HIDDEN
) -> str:
    """`canonical_path`, resolved again if a symlink on the path changed meanwhile; a path
    that keeps changing fails (before anything is written) with a text that says so, and so
    does one inside the agent's own files (`hidden`)."""
    for _ in range(RESOLVE_ATTEMPTS):
        try:
            target = canonical_path(path, workspace)
        except (FileNotFoundError, NotADirectoryError):
            continue  # readlink found no link where lstat had just seen one
        except OSError as e:
            if e.errno != errno.EINVAL:  # EINVAL: readlink of what is no longer a link
                raise os_failure(e, shown, "resolve") from None
        else:
            if hidden.covers(target):
                raise hidden_failure(shown)
            return target
    raise ToolFailure(
        f"cannot {verb} {shown}: a symlink on its path kept changing while it was resolved;"
        " nothing was written"
    )


def _writable_again(target: str, shown: str, verb: str) -> os.stat_result | None:
    """Called when os.access said `target` may not be written: find out why, so that the
    text says what is true. access() answers only yes or no, and no also for a path that is
    missing for an instant (a symlink being replaced), which no stat before or after can rule
    out. So the file is opened for writing (nothing is written: the write itself is a rename),
    and the open's errno says what holds for the file the path names at that moment. Returns
    the file's stat if it may be written after all, None if there is no file any more; else
    raises the failure that says why it may not."""
    try:
        fd = os.open(target, os.O_WRONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except PermissionError:
        raise ToolFailure(
            f"cannot {verb} {shown}: permission denied (the file is read-only)"
        ) from None
    except OSError as e:
        if e.errno == errno.EROFS:
            raise ToolFailure(f"cannot {verb} {shown}: it is on a read-only file system") from None
        if e.errno not in (errno.ETXTBSY, errno.EWOULDBLOCK):
            raise os_failure(e, shown, verb) from None
        # A running program, or a file another program holds a lease on: a rename replaces
        # it all the same (the program keeps the old file).
        try:
            return os.stat(target)
        except FileNotFoundError:
            return None
        except OSError as e2:
            raise os_failure(e2, shown, verb) from None
    try:
        return os.fstat(fd)
    finally:
        os.close(fd)


# --- read_file ----------------------------------------------------------------------------------


def read_file(
    workspace: str, args: ReadFileArgs, *, hidden: HiddenPaths = NOTHING_HIDDEN
) -> ToolReport:
    """Return lines ``offset`` .. ``offset + limit - 1`` (1-based) of a UTF-8 text file.

    ``data = {"content", "lines", "total_lines"}``; ``output`` is the content too. Content keeps
    its line endings. Without ``limit`` the whole rest of the file is returned, and either way
    at most READ_MAX_LINES lines and READ_MAX_BYTES bytes; when a cap stops the read, the text
    says so and names the offset to continue from. A single line longer than READ_MAX_BYTES is
    returned cut. An offset past the end is not a failure: the result is completed with empty
    content and the text gives the file's line count. The whole file is scanned (to count
    lines and to check it is UTF-8), but only the requested lines are kept in memory.
    """
    check_read_file(args)
    return read_checked_file(workspace, args, hidden=hidden)


def read_checked_file(
    workspace: str, args: ReadFileArgs, *, hidden: HiddenPaths = NOTHING_HIDDEN
) -> ToolReport:
    """`read_file` of args that passed `check_read_file`: what the registry runs, since every
    call's args pass that check when the call is admitted (`registry.parse_args`), and the
    check done again on every run was four Python calls of the trivial call's."""
    try:
        return _read_file(workspace, args, hidden)
    except ToolFailure as f:
        return _failed(f)


def _read_file(workspace: str, args: ReadFileArgs, hidden: HiddenPaths) -> ToolReport:
    shown = args.path
    full = _resolve(workspace, shown)
    fd = _open_regular(full, shown, "read_file")
    if hidden.covers_fd(fd):
        os.close(fd)
        raise hidden_failure(shown)
    digest = hashlib.sha256()  # of the whole file, whatever part of it is returned
    try:
        block, eof = _fd_sniff(fd, digest.update)
        whole = _whole_text(block) if eof and args.offset is None and args.limit is None else None
        if whole is None:
            return _read_by_lines(fd, shown, args, digest, block, eof)
    except OSError as e:
        raise os_failure(e, shown, "read") from None
    finally:
        os.close(fd)
    # The whole file, every line of it returned: what `_read_by_lines` says of it, without its
    # loop (tests/test_file_tools.py checks that the two agree).
    content, total = whole
    data = {"content": content, "lines": total, "total_lines": total, "sha256": digest.hexdigest()}
    if total == 0:
        return _completed(f"read 0 of 0 lines of {shown}; the file is empty", data)
    return _completed(f"read {total} of {_plural(total, 'line')} of {shown}", data)


class _Digest(Protocol):
    """What read_file needs of its `hashlib.sha256()`."""

    def update(self, data: bytes, /) -> None: ...

    def hexdigest(self) -> str: ...


def _read_by_lines(
    fd: int, shown: str, args: ReadFileArgs, digest: _Digest, block: bytes, eof: bool
) -> ToolReport:
    """read_file line by line, from the sniffed `block` (`_fd_sniff`) on: an offset, a limit,
    a cap, a file longer than its sniff, or one `_whole_text` leaves to this (it names the
    failure of a binary file)."""
    start = args.offset if args.offset is not None else 1
    want = READ_MAX_LINES if args.limit is None else min(args.limit, READ_MAX_LINES)
    capped_by_lines = args.limit is None or args.limit > READ_MAX_LINES
    parts: list[str] = []
    size = 0  # bytes of content kept
    total = 0  # lines seen so far; the whole file at the end
    stopped_at: int | None = None  # first line not returned, when a cap or `limit` stopped us
    note = ""  # why a cap stopped the read, with the offset to continue from
    for raw, text in _fd_text_lines(fd, shown, "read_file", digest.update, block, eof):
        total += 1
        if total < start or stopped_at is not None:
            continue
        if len(parts) == want:
            stopped_at = total
            if capped_by_lines:
                note = f"; stopped at {READ_MAX_LINES} lines, the most one read returns"
        elif size + len(raw) <= READ_MAX_BYTES:
            parts.append(text)
            size += len(raw)
        elif parts:
            stopped_at = total
            note = f"; stopped at {READ_MAX_BYTES} bytes, the most one read returns"
        else:
            # One line over the byte cap: return its head, cut on a character boundary
            # (the line decoded whole, so only the last character can be partial).
            cut = raw[:READ_MAX_BYTES].decode("utf-8", errors="ignore")
            parts.append(cut)
            size = len(cut.encode("utf-8"))
            stopped_at = total + 1
            note = (
                f"; line {total} is longer than {READ_MAX_BYTES} bytes and was cut"
                f" to its first {size} bytes"
            )
    if note and stopped_at is not None and stopped_at <= total:
        note += f"; continue with offset={stopped_at}"
    content = "".join(parts)
    n = len(parts)
    data = {"content": content, "lines": n, "total_lines": total, "sha256": digest.hexdigest()}
    if total == 0:
        text = f"read 0 of 0 lines of {shown}; the file is empty"
    elif start > total:
        text = (
            f"offset {start} is past the end of {shown}, which has"
            f" {_plural(total, 'line')}; nothing was read"
        )
    else:
        text = f"read {n} of {_plural(total, 'line')} of {shown}"
        if n < total:
            text += f" (lines {start}-{start + n - 1})"
        text += note
    # The content travels once, in data.content: PROTOCOL.md gives `output` to tools that have
    # process output, and a 256 KiB read must not be sent (and kept) twice.
    return _completed(text, data)


def _whole_text(block: bytes) -> tuple[str, int] | None:
    """A file that ended within its sniff, read whole (no offset, no limit), as its text and
    its line count: what the line by line path returns for it when every line fits both caps,
    found with one decode and one count instead of a Python loop over its lines (the trivial
    call of issue 29 reads a 300-byte file). None when that path must decide: a NUL byte (a
    binary file, or text past the sniff), bytes that are not UTF-8 (that path names where), or
    a cap that stops the read. tests/test_file_tools.py checks it against that path."""
    if len(block) > READ_MAX_BYTES or b"\0" in block:
        return None
    try:
        text = block.decode("utf-8")
    except UnicodeDecodeError:
        return None
    # Lines end at b"\n" (an ASCII byte, never part of a longer character); a last line
    # without one counts too.
    lines = block.count(b"\n") + (1 if block and not block.endswith(b"\n") else 0)
    if lines > READ_MAX_LINES:
        return None
    return text, lines


# --- atomic writes ------------------------------------------------------------------------------


def _create_temp(directory: str, mode: int) -> tuple[int, str]:
    """Create and open a new, uniquely named file in `directory`; return (fd, path).

    Like tempfile.mkstemp, but with a caller-chosen mode: O_CREAT applies the umask (and any
    default ACL) exactly as a normal open would, which a later chmod could not reproduce.
    """
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
    for _ in range(TEMP_NAME_ATTEMPTS):
        path = os.path.join(directory, f"{TEMP_PREFIX}{secrets.token_hex(6)}.tmp")
        try:
            return os.open(path, flags, mode), path
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, "no unused temporary file name", directory)


def _atomic_write(target: str, pieces: big_text.Pieces, old: os.stat_result | None) -> None:
    """Replace `target` (a resolved path, no symlink) by a file holding `pieces`, one after
    the other, atomically.

    The bytes go to a temp file in the same directory (so the rename cannot cross file
    systems), are flushed and fsynced, then os.replace puts it in place: a reader sees the old
    file or the new one, never half of either. `old` is the stat of the file being replaced:
    its mode is kept, and its owner when the process may chown; a new file gets 0o666 minus
    the umask. The temp file is removed on any failure. Raises OSError.
    """
    # The disk is busy from the first byte to the directory's fsync: the journal's commits
    # keep off the event loop meanwhile (actors/big_writes.py).
    with BIG_WRITES.writing(big_text.size(pieces)):
        _write_and_rename(target, pieces, old)


def _write_and_rename(target: str, pieces: big_text.Pieces, old: os.stat_result | None) -> None:
    directory = os.path.dirname(target) or "."
    fd, temp = _create_temp(directory, 0o600 if old is not None else 0o666)
    replaced = False
    try:
        with os.fdopen(fd, "wb") as f:
            if old is not None:
                if (old.st_uid, old.st_gid) != (os.geteuid(), os.getegid()):
                    # Only root may give a file away; otherwise keep our own ownership.
                    with suppress(PermissionError):
                        os.fchown(f.fileno(), old.st_uid, old.st_gid)
                os.fchmod(f.fileno(), stat.S_IMODE(old.st_mode))  # after chown, which clears suid
            for piece in pieces:
                _write_in_slices(f, piece)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temp, target)
        replaced = True
    finally:
        if not replaced:
            with suppress(OSError):
                os.unlink(temp)
    _fsync_dir(directory)


def _write_in_slices(f: BinaryIO, piece: big_text.Piece) -> None:
    """Write all of `piece` to `f`, a slice of at most WRITE_SLICE_BYTES per call: a slice
    past the buffer's size goes to the kernel in one write(2) of its own (and each is written
    whole, the buffered writer retrying short writes), so no call holds a CPU for long."""
    if len(piece) <= WRITE_SLICE_BYTES:
        f.write(piece)
        return
    with memoryview(piece) as view:
        for at in range(0, len(view), WRITE_SLICE_BYTES):
            f.write(view[at : at + WRITE_SLICE_BYTES])


def _fsync_dir(directory: str) -> None:
    """Make a rename durable (best effort: not every platform or file system allows it)."""
    with suppress(OSError):
        fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _make_parents(directory: str) -> list[str]:
    """Create `directory` and its missing ancestors; return those created, outermost first.

    On failure the directories created so far are removed again before the OSError propagates.
    """
    missing: list[str] = []
    current = directory
    while not os.path.isdir(current):
        if os.path.lexists(current):
            raise NotADirectoryError(errno.ENOTDIR, "a parent path is a file", current)
        missing.append(current)
        parent = os.path.dirname(current)
        if parent == current:
            break
        current = parent
    created: list[str] = []
    try:
        for d in reversed(missing):
            try:
                os.mkdir(d)
            except FileExistsError:
                # Another writer (a write of another path on another thread, or a program
                # outside toolwire) made it since the check: use it, and leave it to them.
                if not os.path.isdir(d):
                    raise
                continue
            created.append(d)
    except OSError:
        _remove_dirs(created)
        raise
    return created


def _remove_dirs(created: list[str]) -> None:
    for d in reversed(created):
        with suppress(OSError):
            os.rmdir(d)


# --- write_file ---------------------------------------------------------------------------------


def write_file(
    workspace: str, args: WriteFileArgs, *, hidden: HiddenPaths = NOTHING_HIDDEN
) -> ToolReport:
    """Write ``content`` (as UTF-8) to ``path``, atomically;
    ``data = {"bytes": n, "sha256": <hex SHA-256 of the bytes written>}``.

    Missing parent directories are created (and removed again if the write then fails). An
    existing file keeps its mode (and owner, when permitted); a new file gets 0o666 minus the
    umask. If ``path`` is a symlink, the file it resolves to is written and the link stays a
    link (a dangling link gets its target created). As with any rename-based write, the path
    gets a new inode: other hard links to the old file keep the old content. A directory or
    other non-regular target is refused.

    With ``expected_sha256`` the file is replaced only if its bytes hash to that digest (or, for
    ``"absent"``, only if there is no file); otherwise the call fails with PROTOCOL.md 9.4's
    text and data (`_changed_failure`). The check, the write, its fsync and the rename all
    happen with the path's lock held (`PATH_LOCKS`), as every write of this module does.
    """
    check_write_file(args)
    try:
        return _write_file(workspace, args, hidden)
    except ToolFailure as f:
        return _failed(f)


def _write_file(workspace: str, args: WriteFileArgs, hidden: HiddenPaths) -> ToolReport:
    target = _canonical_target(args.path, workspace, args.path, "write", hidden)
    with PATH_LOCKS.hold([target]):
        if args.expected_sha256 is not None:
            _check_precondition(target, args.path, args.expected_sha256, "write_file")
        return _write_locked(target, args)


def _write_locked(target: str, args: WriteFileArgs) -> ToolReport:
    shown = args.path
    data = args.content.encode("utf-8")
    old: os.stat_result | None
    try:
        old = os.stat(target)
    except FileNotFoundError:
        old = None
    except OSError as e:
        raise os_failure(e, shown, "write") from None
    _check_replaceable(old, shown)
    if old is not None and not os.access(target, os.W_OK):
        # The rename would replace it anyway; refuse as open(path, "w") would, if it is so.
        old = _writable_again(target, shown, "write")
        _check_replaceable(old, shown)
    try:
        created = _make_parents(os.path.dirname(target))
    except NotADirectoryError:
        raise ToolFailure(
            f"cannot write {shown}: a parent of it is a file, not a directory"
        ) from None
    except OSError as e:
        raise os_failure(e, shown, "create the parent directories of") from None
    try:
        _atomic_write(target, [data], old)
    except OSError as e:
        _remove_dirs(created)
        raise os_failure(e, shown, "write") from None
    return _completed(
        f"wrote {_plural(len(data), 'byte')} to {shown}",
        {"bytes": len(data), "sha256": _sha256_hex(data)},
    )


def _check_replaceable(old: os.stat_result | None, shown: str) -> None:
    if old is not None and stat.S_ISDIR(old.st_mode):
        raise ToolFailure(f"{shown} is a directory; write_file writes files")
    if old is not None and not stat.S_ISREG(old.st_mode):
        raise ToolFailure(f"{shown} is not a regular file; write_file only replaces regular files")


# --- edit_files ---------------------------------------------------------------------------------


@dataclass
class _EditTarget:
    target: str  # resolved path (symlinks followed): two entries naming it share one target
    shown: str  # the path as first given
    # The file's bytes as read: a pooled read buffer's start for a big file
    # (actors/tools/whole_files.py), which stays lent until the call's last write is done.
    whole: WholeFile
    stat: os.stat_result
    # The content with the edits applied so far, as views into the read bytes and the edits'
    # texts (big_text), None before the first edit: no whole-file value is made unless a file
    # gets a second edit.
    edited: list[big_text.Piece] | None = None
    # How many edits were applied, and the last one's `old` and `new`: with one edit, whether
    # the content is still the file's bytes needs no hash of them (`_unchanged`).
    applied: int = 0
    last_old: bytes = b""
    last_new: bytes = b""

    @property
    def original(self) -> big_text.Piece:
        """The file's bytes as read, without a copy."""
        return self.whole.content()

    @property
    def length(self) -> int:
        return self.whole.length

    @property
    def content(self) -> big_text.Pieces:
        return [self.original] if self.edited is None else self.edited

    def searched(self) -> tuple[big_text.Text, int]:
        """What the next edit searches: `text[:end]`, the content as it stands."""
        if self.edited is None:
            return self.whole.data, self.whole.length
        data = big_text.joined(self.edited)
        return data, len(data)


def edit_files(
    workspace: str, args: EditFilesArgs, *, hidden: HiddenPaths = NOTHING_HIDDEN
) -> ToolReport:
    """Apply exact-text replacements to one or more UTF-8 files, all or nothing.

    ``data = {"files": [{"path": <as given>, "replacements": n}, ...]}``, one entry per entry
    of ``args.files``, in order. Every file is read and every edit applied in memory first.
    Edits apply in order within a file (edit 2 sees the result of edit 1); an edit whose
    ``old`` is not found, or is found more than once without ``replace_all``, fails the whole
    call and nothing is written. Texts number edits from 1 ("edit 2 of a.py" is
    ``files[i].edits[1]``). A file named twice (also through another spelling or a symlink)
    gets the second entry's edits applied after the first's, and is written once. Matching is
    exact: a file with CRLF line endings needs CRLF in ``old``. Files the edits leave unchanged
    are not rewritten.

    Only then is each changed file written atomically (as write_file does). If a write fails,
    the files already written are restored from their original bytes, best effort: the failed
    text says whether that worked. Missing, binary, non-UTF-8 and non-regular files fail.

    Each entry may carry ``expected_sha256``: before anything is read for editing, every such
    entry's file must hash to it (or be absent, for ``"absent"``), else the call fails with
    PROTOCOL.md 9.4's text for the first entry that does not, and no file changes. The locks
    of all the call's paths (`PATH_LOCKS`, taken in sorted order) are held from that check
    until the last rename. Each entry of ``data.files`` also has ``sha256``: the hex SHA-256 of
    its file as the call left it (written, or unchanged when the edits changed nothing).
    """
    check_edit_files(args)
    try:
        return _edit_files(workspace, args, hidden)
    except ToolFailure as f:
        return _failed(f)


_UNCHANGED = "; no file was changed"


def _load_edit_target(
    target: str, shown: str, expected: str | None, reads: ExitStack
) -> _EditTarget:
    """Read the file at `target` whole for editing; a read buffer it borrows is given back
    when `reads` closes."""
    try:
        st = _stat_regular(target, shown, "read", "edit_files")
        if not os.access(target, os.W_OK):
            again = _writable_again(target, shown, "edit")
            if again is None:
                raise ToolFailure(f"{shown} does not exist")  # removed since the stat
            _check_regular(again, shown, "edit_files")
            st = again
        # From a big file's read to the call's end (`reads` closes when the last write is
        # done), not only through its writes: the edit reads, writes and fsyncs its files one
        # after the other, and a commit on the loop's thread between two of them waited for the
        # disk as well (up to 15 ms; actors/big_writes.py).
        reads.enter_context(BIG_WRITES.writing(st.st_size))
        with open(target, "rb", buffering=0) as f:
            whole = reads.enter_context(read_whole(f, os.fstat(f.fileno()).st_size))
        _check_text(whole.data, shown, "edit_files", end=whole.length)
    except ToolFailure as e:
        raise ToolFailure(e.text + _UNCHANGED) from None
    except OSError as e:
        raise ToolFailure(os_failure(e, shown, "read").text + _UNCHANGED) from None
    loaded = _EditTarget(target, shown, whole, st)
    if expected is not None and (actual := _sha256_hex(loaded.original)) != expected.lower():
        # Changed by something other than toolwire since the precondition check: still refuse.
        raise _changed_failure(shown, expected, actual)
    return loaded


def _edit_files(workspace: str, args: EditFilesArgs, hidden: HiddenPaths) -> ToolReport:
    paths = [
        _canonical_target(entry.path, workspace, entry.path, "edit", hidden) for entry in args.files
    ]
    with PATH_LOCKS.hold(paths):
        for entry, target in zip(args.files, paths, strict=True):
            if entry.expected_sha256 is not None:
                try:
                    _check_precondition(target, entry.path, entry.expected_sha256, "edit_files")
                except ToolFailure as f:
                    if f.data is None:  # the path is not a readable file: say nothing changed
                        raise ToolFailure(f.text + _UNCHANGED) from None
                    raise
        return _edit_locked(args, paths)


def _edit_locked(args: EditFilesArgs, paths: list[str]) -> ToolReport:
    # The read buffers are lent until the last write is done (a failed write restores the
    # files written from them). `_edit_read` has returned when they go back, and with it every
    # view of them: a buffer is lent again only once no view of it is left.
    with ExitStack() as reads:
        return _edit_read(args, paths, reads)


def _edit_read(args: EditFilesArgs, paths: list[str], reads: ExitStack) -> ToolReport:
    targets: dict[str, _EditTarget] = {}  # by resolved path, in order of first appearance
    counts: list[int] = []
    for entry, target in zip(args.files, paths, strict=True):
        current = targets.get(target)
        if current is None:
            current = targets[target] = _load_edit_target(
                target, entry.path, entry.expected_sha256, reads
            )
        count = 0
        for number, edit in enumerate(entry.edits, start=1):
            data, end = current.searched()
            old = edit.old.encode("utf-8")  # the same matches as in the text: see big_text
            starts = big_text.find_all(data, old, end=end)
            found = len(starts)
            where = f"edit {number} of {entry.path}"
            if found == 0:
                hint = ""
                crlf = "\n" in edit.old and "\r\n" not in edit.old
                if crlf and big_text.contains(data, b"\r\n", end=end):
                    hint = " (the file has CRLF line endings)"
                raise ToolFailure(f"{where}: `old` text not found{hint}{_UNCHANGED}")
            if found > 1 and not edit.replace_all:
                raise ToolFailure(
                    f"{where}: `old` text occurs {found} times; add more context or set"
                    f" replace_all{_UNCHANGED}"
                )
            new = edit.new.encode("utf-8")
            current.edited = big_text.replaced(data, starts, len(old), new, end=end)
            current.applied += 1
            current.last_old, current.last_new = old, new
            count += found
        counts.append(count)

    written: list[_EditTarget] = []  # files already replaced on disk
    digests: dict[str, str] = {}  # by resolved path: the SHA-256 the file is left with
    for t in targets.values():
        digests[t.target] = big_text.sha256_hex(t.content)
        if _unchanged(t, digests[t.target]):
            continue  # the edits left it as it was (as "a" -> "b" then "b" -> "a")
        try:
            _atomic_write(t.target, t.content, t.stat)
        except OSError as e:
            raise ToolFailure(_write_failure_text(e, t, written)) from None
        written.append(t)

    total = sum(counts)
    text = f"applied {_plural(total, 'replacement')} in {_plural(len(targets), 'file')}"
    files = [
        {"path": entry.path, "replacements": n, "sha256": digests[target]}
        for entry, n, target in zip(args.files, counts, paths, strict=True)
    ]
    return _completed(text, {"files": files})


def _unchanged(t: _EditTarget, digest: str) -> bool:
    """Whether the edits left the content of `t`, whose SHA-256 is now `digest`, the bytes
    the file was read as."""
    if big_text.size(t.content) != t.length:
        return False
    if t.applied == 1:
        # One edit and the same size: `old` gave way to a `new` as long, at each of its
        # matches, so the bytes are the same iff `new` is `old`. (No second pass over 16 MiB.)
        return t.last_new == t.last_old
    return digest == _sha256_hex(t.original)


def _write_failure_text(e: OSError, failed: _EditTarget, written: list[_EditTarget]) -> str:
    """Restore the files already written (best effort) and describe the outcome truthfully."""
    text = os_failure(e, failed.shown, "write").text
    not_restored: list[str] = []
    for t in reversed(written):
        try:
            _atomic_write(t.target, [t.original], os.stat(t.target))
        except OSError:
            not_restored.append(t.shown)
    if not written:
        return text + _UNCHANGED
    if not not_restored:
        restored = (
            "the file already written was"
            if len(written) == 1
            else "the files already written were"
        )
        return f"{text}; {restored} restored{_UNCHANGED}"
    return (
        f"{text}; restoring {', '.join(reversed(not_restored))} also failed, so"
        f" {'it holds' if len(not_restored) == 1 else 'they hold'} the edited content"
    )


# --- search_files -------------------------------------------------------------------------------


class SearchStopped(Exception):
    """`search_files` was told to stop (`should_stop`) before it was over: the call was
    canceled while running, and there is no result to report."""


def _is_inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


class PathShower:
    """Turns an absolute file path into the path a match reports."""

    def __init__(self, workspace: str) -> None:
        self.workspace = os.path.abspath(os.path.expanduser(workspace))
        self.workspace_real = os.path.realpath(self.workspace)

    def __call__(self, path: str) -> str:
        for root in (self.workspace, self.workspace_real):
            if _is_inside(path, root):
                return _readable(os.path.relpath(path, root))
        return _readable(path)


def _readable(path: str) -> str:
    """A path as a result can carry it: a file name that is not UTF-8 (os.scandir keeps its
    bytes as lone surrogates, which no JSON or MessagePack encoder takes) shows each byte
    that does not decode as U+FFFD."""
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        return path.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    return path


def search_files(
    workspace: str,
    args: SearchFilesArgs,
    *,
    max_matches: int = SEARCH_MAX_MATCHES,
    should_stop: Callable[[], bool] | None = None,
    max_seconds: float = SEARCH_MAX_SECONDS,
    clock: Callable[[], float] = time.monotonic,
    hidden: HiddenPaths = NOTHING_HIDDEN,
) -> ToolReport:
    """Search text files line by line for the regex ``pattern`` (RE2 syntax, see
    actors/tools/patterns.py: matched in time linear in the text, whatever the pattern).

    ``data = {"matches": [{"path", "line", "text"}], "truncated": bool}``. ``path`` (default:
    the workspace root) is a file or a directory. A directory is walked in sorted order
    (deterministic results), skipping VCS directories (.git, .hg, .svn, ...) and not
    following directory symlinks (no loops); symlinks to files are searched. ``glob`` filters
    the files found by the walk (see patterns.glob_to_regex); a file named directly by
    ``path`` is searched whatever the glob. A pattern or glob RE2 cannot compile fails, naming
    what is wrong or not supported.

    The pattern is matched against each line without its line ending (``\\n`` or
    ``\\r\\n``). Files with a NUL byte in their first 8 KiB are skipped as binary (naming one
    directly fails); other bytes that are not UTF-8 decode as U+FFFD, so files in a legacy
    encoding are still searched. Only regular files of real file systems are read: anything
    on a pseudo-filesystem (/proc, /sys, /dev, cgroups, debugfs ..., see actors/tools/mounts.py)
    is skipped without being opened (naming it directly fails), as are FIFOs, sockets and
    devices. Unreadable files and directories (a file leased by another program included: it
    is opened without waiting) are skipped and counted in the text. Reported paths are
    relative to the workspace when inside it, else absolute; line numbers are 1-based; texts
    are cut to SEARCH_MAX_LINE_CHARS characters.

    After ``max_matches`` matches the search stops; ``truncated`` is then true when at least
    one more match exists. After ``max_seconds`` (by ``clock``) the search stops too, with the
    matches found so far, ``truncated`` true and a text saying so. ``should_stop`` is asked
    between blocks of lines (SEARCH_BLOCK_BYTES) and between files; once it says yes the
    search raises SearchStopped. The agent's own files (`hidden`) are never read: naming one
    fails, a walk passes them by (and says how many).
    """
    check_search_files(args)
    state = _SearchState(
        should_stop=should_stop, clock=clock, deadline=clock() + max_seconds, hidden=hidden
    )
    try:
        return _search_files(workspace, args, max_matches, max_seconds, state)
    except ToolFailure as f:
        return _failed(f)


def search_files_until(
    workspace: str,
    args: SearchFilesArgs,
    should_stop: Callable[[], bool],
    *,
    hidden: HiddenPaths = NOTHING_HIDDEN,
) -> ToolReport:
    """search_files that a cancel stops: SearchStopped once `should_stop` says yes."""
    return search_files(workspace, args, should_stop=should_stop, hidden=hidden)


@dataclass
class _SearchState:
    should_stop: Callable[[], bool] | None
    clock: Callable[[], float]
    deadline: float
    matches: list[dict[str, Any]] = field(default_factory=list)
    files: set[str] = field(default_factory=set)  # shown paths with at least one match
    searched: int = 0
    unreadable: int = 0
    # Files and directories not read because they are on a pseudo-filesystem, by its type.
    pseudo: dict[str, int] = field(default_factory=dict)
    truncated: bool = False
    out_of_time: bool = False
    hidden: HiddenPaths = NOTHING_HIDDEN
    hidden_skipped: int = 0  # the agent's own files and directories, passed by

    def skip_hidden(self, st: os.stat_result) -> bool:
        if not self.hidden.hides(st):
            return False
        self.hidden_skipped += 1
        return True

    def over(self) -> bool:
        """Asked between blocks and files: raise SearchStopped if told to stop; True once
        the search should end here (the match cap or the time budget reached)."""
        if self.should_stop is not None and self.should_stop():
            raise SearchStopped
        if not self.out_of_time and self.clock() >= self.deadline:
            self.out_of_time = self.truncated = True
        return self.truncated

    def skip_pseudo(self, fstype: str) -> None:
        self.pseudo[fstype] = self.pseudo.get(fstype, 0) + 1

    def add(self, shown: str, number: int, text: str, max_matches: int) -> bool:
        """Record a match; False (and truncated) when it is one more than `max_matches`."""
        if len(self.matches) >= max_matches:
            self.truncated = True
            return False
        self.matches.append({"path": shown, "line": number, "text": text[:SEARCH_MAX_LINE_CHARS]})
        self.files.add(shown)
        return True


def _pseudo_failure(shown: str, fstype: str) -> ToolFailure:
    return ToolFailure(
        f"{shown} is on a {fstype} pseudo-filesystem (kernel interfaces, not files);"
        " search_files only reads regular files of real file systems"
    )


def _search_files(
    workspace: str, args: SearchFilesArgs, max_matches: int, max_seconds: float, state: _SearchState
) -> ToolReport:
    try:
        pattern = patterns.compile_line_pattern(args.pattern)
        glob = patterns.GlobMatcher(args.glob) if args.glob is not None else None
    except patterns.PatternError as e:
        raise ToolFailure(e.text) from None
    shown_root = args.path if args.path is not None else "the workspace"
    root = os.path.abspath(_resolve(workspace, args.path if args.path is not None else "."))
    try:
        st = os.stat(root)
    except OSError as e:
        raise os_failure(e, shown_root, "search") from None
    if state.hidden and state.hidden.covers(os.path.realpath(root)):
        raise hidden_failure(shown_root)
    pseudo = PseudoFilesystems.read()
    fstype = pseudo.fstype(st.st_dev)
    if fstype is not None:
        raise _pseudo_failure(shown_root, fstype)
    show = PathShower(workspace)
    is_dir = stat.S_ISDIR(st.st_mode)
    if is_dir:
        _search_tree(root, pattern, glob, show, state, max_matches, pseudo)
    elif stat.S_ISREG(st.st_mode):
        try:
            skipped = _search_file(root, pattern, show(root), state, max_matches, pseudo)
        except OSError as e:
            raise os_failure(e, shown_root, "search") from None
        if skipped is _Skipped.BINARY:
            raise _binary_failure(shown_root, "search_files", "it contains NUL bytes")
        if skipped is _Skipped.HIDDEN:
            raise hidden_failure(shown_root)
        if skipped is _Skipped.PSEUDO:  # it was swapped for one after the stat
            raise _pseudo_failure(shown_root, next(iter(state.pseudo)))
        if skipped is _Skipped.NOT_REGULAR:
            raise ToolFailure(f"{shown_root} is not a regular file or a directory")
    else:
        raise ToolFailure(f"{shown_root} is not a regular file or a directory")

    found = len(state.matches)
    if found:
        text = f"found {_plural(found, 'match', 'matches')} in {_plural(len(state.files), 'file')}"
    elif glob is not None and is_dir and state.searched == 0:
        text = f"found no matches: no text file in {shown_root} matches glob {args.glob!r}"
    else:
        text = f"found no matches for {args.pattern!r}"
    if is_dir:
        text += f" (searched {_plural(state.searched, 'file')} in {shown_root})"
    elif not found:
        text += f" in {shown_root}"
    if state.out_of_time:
        text += (
            f"; stopped after {max_seconds:g} s, the longest one search runs, so more may"
            " match: narrow the path or glob"
        )
    elif state.truncated:
        text += f"; stopped at {max_matches} matches: narrow the pattern, path or glob"
    if state.unreadable:
        unread = _plural(state.unreadable, "file or directory", "files or directories")
        text += f"; could not read {unread}"
    if state.pseudo:
        count = sum(state.pseudo.values())
        kinds = ", ".join(sorted(state.pseudo))
        things = _plural(count, "file or directory", "files or directories")
        text += f"; skipped {things} on pseudo-filesystems ({kinds})"
    if state.hidden_skipped:
        things = _plural(state.hidden_skipped, "file or directory", "files or directories")
        text += f"; skipped {things} of the agent's own state"
    return _completed(text, {"matches": state.matches, "truncated": state.truncated})


def _walk_files(
    root: str, state: _SearchState, pseudo: PseudoFilesystems
) -> Iterator[tuple[str, str]]:
    """Yield (path, "/"-separated path relative to root) of every file below `root`.

    Order is by path, component by component (each directory's entries sorted by name, a
    subdirectory's files coming where its name sorts), so results never depend on the order
    the file system lists entries in. VCS directories are skipped, directory symlinks are not
    descended into, and neither are directories on a pseudo-filesystem (a mount of /proc or
    /sys below the root; counted in `state.pseudo`); unreadable directories are counted in
    `state.unreadable`.
    """
    stack: list[tuple[str, str, Iterator[os.DirEntry[str]]]] = []

    def push(path: str, rel: str) -> None:
        try:
            with os.scandir(path) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError:
            state.unreadable += 1
            return
        stack.append((path, rel, iter(entries)))

    push(root, "")
    while stack:
        _path, rel_dir, entries = stack[-1]
        entry = next(entries, None)
        if entry is None:
            stack.pop()
            continue
        rel = f"{rel_dir}{entry.name}"
        try:
            is_dir = entry.is_dir(follow_symlinks=False)
        except OSError:
            is_dir = False
        if not is_dir:
            yield entry.path, rel
        elif entry.name not in VCS_DIRS and not state.over():
            try:
                entry_st = entry.stat(follow_symlinks=False)
            except OSError:
                state.unreadable += 1
                continue
            fstype = pseudo.fstype(entry_st.st_dev)
            if state.skip_hidden(entry_st):
                continue
            if fstype is not None:
                state.skip_pseudo(fstype)
            else:
                push(entry.path, rel + "/")


def _search_tree(
    root: str,
    pattern: patterns.LinePattern,
    glob: patterns.GlobMatcher | None,
    show: PathShower,
    state: _SearchState,
    max_matches: int,
    pseudo: PseudoFilesystems,
) -> None:
    for path, rel in _walk_files(root, state, pseudo):
        if state.over():
            return
        if glob is not None and not glob.matches(rel):
            continue
        try:
            # Before opening: a FIFO would block the open, a device may act on it, and a
            # pseudo-filesystem's "regular" file (/proc/kmsg) may be consumed by reading it.
            st = os.stat(path)
            if not stat.S_ISREG(st.st_mode):
                continue  # directory symlinks, FIFOs, sockets, devices
            fstype = pseudo.fstype(st.st_dev)
            if fstype is not None:
                state.skip_pseudo(fstype)
                continue
            _search_file(path, pattern, show(path), state, max_matches, pseudo)
        except OSError:
            state.unreadable += 1  # dangling links too


class _Skipped(enum.Enum):
    BINARY = "binary"
    PSEUDO = "pseudo"
    HIDDEN = "hidden"
    NOT_REGULAR = "not regular"


def _search_file(
    path: str,
    pattern: patterns.LinePattern,
    shown: str,
    state: _SearchState,
    max_matches: int,
    pseudo: PseudoFilesystems,
) -> _Skipped | None:
    """Search one file, appending to `state`; say why if it was skipped. Raises OSError.

    The checks of the stat before it are made again on the open file itself, so a path
    swapped in between (for a FIFO, or a link into /proc) is never read. O_NONBLOCK: an open
    never waits (for a FIFO's writer, or for another program's lease on the file)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return _Skipped.NOT_REGULAR
        if state.hidden and (state.hidden.hides(st) or state.hidden.covers_fd(fd)):
            state.hidden_skipped += 1
            return _Skipped.HIDDEN
        fstype = pseudo.fstype(st.st_dev)
        if fstype is not None:
            state.skip_pseudo(fstype)
            return _Skipped.PSEUDO
        head = b""
        while len(head) < BINARY_SNIFF_BYTES:  # a short read must not shorten the sniff
            more = os.read(fd, SEARCH_BLOCK_BYTES)
            if not more:
                break
            head += more
        if b"\0" in head[:BINARY_SNIFF_BYTES]:
            return _Skipped.BINARY
        state.searched += 1
        number = 1  # of the first line of the next block
        for block in _line_blocks(fd, head, state):
            number = _search_block(block, number, pattern, shown, state, max_matches)
            if state.truncated or state.over():
                break
    finally:
        os.close(fd)
    return None


def _line_blocks(fd: int, head: bytes, state: _SearchState) -> Iterator[bytes]:
    """The rest of the file after `head` (read already), with `head`, as blocks of whole
    lines of about SEARCH_BLOCK_BYTES (every block but the last ends with "\\n"). A line
    longer than a block makes its block as long as the line."""
    parts = [head] if head else []
    while True:
        if state.over():
            return
        more = os.read(fd, SEARCH_BLOCK_BYTES)
        if not more:
            break
        cut = more.rfind(b"\n") + 1
        if cut == 0:
            parts.append(more)
            continue
        parts.append(more[:cut])
        yield b"".join(parts)
        parts = [more[cut:]] if cut < len(more) else []
    if parts:
        yield b"".join(parts)


def _search_block(
    block: bytes,
    number: int,
    pattern: patterns.LinePattern,
    shown: str,
    state: _SearchState,
    max_matches: int,
) -> int:
    """Search the whole lines of `block`, the first of which is line `number`; return the
    number of the line after the block. Lines are matched without their "\\n" or "\\r\\n",
    and bytes that are not UTF-8 as U+FFFD, as one line decoded alone would be."""
    text = block.replace(b"\r\n", b"\n") if b"\r" in block else block
    # The file's last line, without a "\n": a line even when empty once its "\r" is dropped
    # (a file holding just "\r" is one empty line, and `^$` matches it).
    tail_line = not block.endswith(b"\n")
    if text.endswith(b"\r"):
        text = text[:-1]
    if not text.isascii():
        try:
            text.decode("utf-8")
        except UnicodeDecodeError:
            text = text.decode("utf-8", errors="replace").encode("utf-8")
    after = number + block.count(b"\n")
    if pattern.block is None:
        lines = text.split(b"\n")
        if not tail_line:
            lines.pop()  # the empty piece after the block's last "\n"
        for i, raw in enumerate(lines):
            line = raw.decode("utf-8")
            if pattern.line.search(line) is not None and not state.add(
                shown, number + i, line, max_matches
            ):
                break
        return after
    # One RE2 call finds the next line with a match (`LinePattern.block`): lines without one
    # cost no Python at all. The line it points at is confirmed by the line pattern.
    search = pattern.block.search
    size = len(text)
    pos = counted = 0  # where to search from; up to where newlines are counted into `number`
    while pos < size or (pos == size and tail_line):
        found = search(text, pos)
        if found is None:
            break
        start = text.rfind(b"\n", 0, found.start()) + 1
        if start >= size and not tail_line:  # an empty match after the last "\n": no line
            break
        end = text.find(b"\n", found.start())
        end = size if end == -1 else end
        number += text.count(b"\n", counted, start)
        counted = start
        line = text[start:end].decode("utf-8")
        if pattern.line.search(line) is not None and not state.add(
            shown, number, line, max_matches
        ):
            break
        pos = end + 1
    return after
