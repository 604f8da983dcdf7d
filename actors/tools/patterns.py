"""The patterns a client supplies to the file tools (search_files' `pattern` and `glob`),
compiled for RE2, a regex engine whose matching time is linear in the text searched.

Why not Python's `re` (issue 27): it backtracks, so a pattern such as ``(a+)+$`` takes time
exponential in the line it is matched against (13 s for 29 characters, doubling with each one
more), and it holds the GIL for the whole match, so even on a worker thread it freezes the event
loop: every chat, connection and keepalive of the agent. RE2 (the engine of Go's regexp and, in
spirit, of ripgrep) never backtracks, and its Python binding releases the GIL while it matches.
A glob becomes a regex too, and ``*a*a*a*a*b`` is as catastrophic for `re` as ``(a+)+$``: it
is compiled for RE2 as well.

RE2's syntax is Python's (and Perl's) without the constructs that need backtracking:
backreferences, lookahead and lookbehind, atomic groups, possessive quantifiers, and a few
others. A pattern that uses one is refused with a `PatternError` whose text names what is not
supported and what to write instead where there is an equivalent. Other differences are in
docs/semantics.md ("search_files").

Nothing here touches the disk; the compiled objects are safe to use from any thread.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Protocol, cast

import re2  # type: ignore[import-untyped]  # google-re2 ships no type information


class Regex(Protocol):
    """What this module's callers use of a compiled RE2 pattern."""

    def search(self, text: str | bytes, pos: int = ...) -> Any: ...

    def fullmatch(self, text: str | bytes) -> Any: ...


class PatternError(ValueError):
    """A pattern RE2 cannot compile; `text` is the sentence the tool's result says."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text


def _options(*, never_nl: bool = False) -> Any:
    options = re2.Options()
    options.log_errors = False  # RE2 would print each refused pattern on the agent's stderr
    # A match never spans lines (see `LinePattern.block`), whatever the pattern says.
    options.never_nl = never_nl
    return options


_LINE_OPTIONS = _options()
_BLOCK_OPTIONS = _options(never_nl=True)

# What a pattern written for Python's `re` may use that RE2 refuses, recognised by the start of
# RE2's error message (its `error` carries no code): why, and what to write instead.
_UNSUPPORTED: tuple[tuple[str, str], ...] = (
    ("invalid perl operator: (?=", "lookahead `(?=...)` is not supported"),
    ("invalid perl operator: (?!", "negative lookahead `(?!...)` is not supported"),
    ("invalid perl operator: (?<=", "lookbehind `(?<=...)` is not supported"),
    ("invalid perl operator: (?<!", "negative lookbehind `(?<!...)` is not supported"),
    # RE2 names only "(?P" here: `(?P<name>...)` it supports, so this is `(?P=name)`.
    ("invalid perl operator: (?P", "backreferences `(?P=name)` are not supported"),
    ("invalid perl operator: (?>", "atomic groups `(?>...)` are not supported"),
    ("invalid perl operator: (?#", "comments `(?#...)` are not supported"),
    ("invalid perl operator: (?x", "verbose mode `(?x)` is not supported"),
    ("invalid escape sequence: \\Z", "`\\Z` is not supported: write `$` or `\\z`"),
    ("invalid escape sequence: \\u", "`\\u` escapes are not supported: write `\\x{HHHH}`"),
    ("invalid escape sequence: \\U", "`\\U` escapes are not supported: write `\\x{HHHHHH}`"),
    ("invalid escape sequence: \\N", "`\\N{...}` is not supported: write `\\x{HHHH}`"),
    ("invalid repetition size", "a repetition count is over 1000 or out of order"),
    ("pattern too large", "the compiled pattern is over RE2's memory limit: simplify it"),
)
# Flags RE2 knows are i, m, s and U; Python's a, L, u (and x) are refused.
_FLAG_REFUSED = "inline flags other than i, m, s and U are not supported"
_ENGINE = (
    "search_files matches with RE2, whose time is linear in the text searched, so it has no"
    " backreferences, lookahead, lookbehind or possessive quantifiers"
)


def _why(message: str) -> str | None:
    for prefix, why in _UNSUPPORTED:
        if message.startswith(prefix):
            return why
    if message.startswith("invalid escape sequence: \\") and message[-1:].isdigit():
        return "backreferences `\\N` are not supported"
    if message.startswith("bad repetition operator: ") and message.endswith("+"):
        return "possessive quantifiers (`*+`, `++`, `?+`) are not supported"
    if message.startswith("invalid perl operator: (?") and message[-1:] in "aLu":
        return _FLAG_REFUSED
    return None


def _compile(pattern: str, options: Any) -> Regex:
    try:
        return cast(Regex, re2.compile(pattern, options))
    finally:
        # `re2.compile` keeps the last 128 patterns in a process-wide cache, each with up to
        # max_mem (8 MiB) of matching state: a client sending distinct patterns would make the
        # agent hold up to a GiB. Emptied at once, a pattern lives as long as its search (a
        # search running on another thread keeps the pattern it holds).
        re2.purge()


def _error_text(e: Exception) -> str:
    message = e.args[0] if e.args else str(e)
    if isinstance(message, bytes):
        message = message.decode("utf-8", errors="replace")
    return str(message)


# A pattern the block pre-filter would read differently from a line match: `\A`, `\z` (the
# start and end of the text: a line, or a whole block), `\C` (any byte, a newline included),
# and a flag group that turns multi-line mode off. A false alarm (`\\A`, an escaped
# backslash) only costs speed: such patterns are matched one line at a time.
_BLOCK_UNSAFE = re.compile(r"\\[ACz]|\(\?[a-zA-Z]*-[a-zA-Z]*m")


@dataclass(frozen=True, slots=True)
class LinePattern:
    """A search_files pattern, matched against one line at a time (without its line ending).

    `line` is the pattern itself, for one line (a str). `block` is the same pattern in
    multi-line mode, never matching a newline: matched over a block of whole lines (bytes,
    valid UTF-8, CRLF folded to LF), it finds a match wherever some line of the block has one,
    so one RE2 call skips every line without a match (matching line by line costs a Python
    call per line: ten times slower on a typical tree). Each line it points at is then
    confirmed with `line`. None when the pattern uses what a block would read differently.
    """

    source: str
    line: Regex
    block: Regex | None


def compile_line_pattern(pattern: str) -> LinePattern:
    """Compile search_files' `pattern`; PatternError names what is wrong or unsupported."""
    try:
        line = _compile(pattern, _LINE_OPTIONS)
    except re2.error as e:
        message = _error_text(e)
        why = _why(message)
        text = f"invalid regex {pattern!r}: {message}"
        if why is not None:
            text += f"; {why} ({_ENGINE})"
        raise PatternError(text) from None
    block: Regex | None = None
    if _BLOCK_UNSAFE.search(pattern) is None:
        try:
            block = _compile(f"(?m){pattern}", _BLOCK_OPTIONS)
        except re2.error:
            block = None  # cannot happen for a pattern that compiled; be safe: line by line
    return LinePattern(pattern, line, block)


# --- globs --------------------------------------------------------------------------------------


def _literal(ch: str) -> str:
    """`ch` as an RE2 literal: letters and digits as they are, anything else by code point
    (RE2 refuses some escapes Python's re.escape writes, such as `\\ ` and `\\#`)."""
    if ch.isascii() and (ch.isalnum() or ch == "_"):
        return ch
    return f"\\x{{{ord(ch):x}}}"


def _class_body(body: str) -> str:
    """A glob's `[...]` body (without the brackets) as an RE2 class body: `!` or `^` first
    negates, `a-z` is a range, every other character is literal."""
    out: list[str] = []
    if body[:1] in ("!", "^"):
        out.append("^")
        body = body[1:]
    i = 0
    while i < len(body):
        if body[i] == "-" and 0 < i < len(body) - 1:
            out.append("-")
        else:
            out.append(_literal(body[i]))
        i += 1
    return "".join(out)


def glob_to_regex(glob: str) -> str:
    """The RE2 source of a glob over "/"-separated paths relative to the search root.

    ``*`` matches within one path component, ``?`` one character other than "/", ``[...]`` a
    character class (``[!...]`` negated), ``**/`` zero or more whole directories, and a
    trailing ``**`` everything below. A glob without "/" matches the file's base name at any
    depth ("*.py"); a glob with "/" matches the whole relative path ("src/**/*.py" matches
    src/a.py and src/x/y/a.py; a leading "/" or "./" is dropped). Case-sensitive.
    """
    if "/" not in glob:
        glob = "**/" + glob
    while glob.startswith(("/", "./")):
        glob = glob[1:] if glob.startswith("/") else glob[2:]
    out: list[str] = []
    i, n = 0, len(glob)
    while i < n:
        if glob.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif glob.startswith("**", i):
            out.append(".*")
            i += 2
        elif glob[i] == "*":
            out.append("[^/]*")
            i += 1
        elif glob[i] == "?":
            out.append("[^/]")
            i += 1
        elif glob[i] == "[":
            j = i + 1
            if j < n and glob[j] in "!^":
                j += 1
            if j < n and glob[j] == "]":
                j += 1  # a "]" first in the class is literal
            j = glob.find("]", j)
            if j == -1:  # no closing bracket: a literal "["
                out.append(_literal("["))
                i += 1
                continue
            out.append(f"[{_class_body(glob[i + 1 : j])}]")
            i = j + 1
        else:
            out.append(_literal(glob[i]))
            i += 1
    return "(?s)" + "".join(out)


class GlobMatcher:
    """A compiled glob (see `glob_to_regex`); `matches(rel)` for a "/"-separated path."""

    __slots__ = ("_regex",)

    def __init__(self, glob: str) -> None:
        try:
            self._regex = _compile(glob_to_regex(glob), _LINE_OPTIONS)
        except re2.error as e:
            raise PatternError(f"invalid glob {glob!r}: {_error_text(e)}") from None

    def matches(self, rel: str) -> bool:
        try:
            return self._regex.fullmatch(rel) is not None
        except UnicodeEncodeError:
            # A file name that is not UTF-8 (os.scandir keeps its bytes as lone surrogates):
            # match its readable form, each undecodable byte one U+FFFD, as `?` expects.
            readable = rel.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
            return self._regex.fullmatch(readable) is not None
