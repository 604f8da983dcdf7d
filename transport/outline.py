"""What a frame says at its top level, read without recursion: the fields that match an error
reply to its request (`rid`, `chat_id`, `call_id`: PROTOCOL.md 2 echoes `rid` on `error`), and
where the frame first nests deeper than MAX_NESTING_DEPTH (9.9 names the field path). Pure: no
I/O.

It answers where msgspec cannot: msgspec's decoders recurse, and give up with RecursionError
near Python's recursion limit (about 1,000 levels), losing the top-level fields with the rest.
A message nested 1,000 deep with its `rid` at level 1 then got an error without that `rid`, and
a client matching replies by `rid` waited forever (issue 26).

Both readers make one pass over the frame, never recurse, and keep a stack of at most
MAX_NESTING_DEPTH levels: past a level too deep they only count where the value ends. So the
work is linear in the frame's size whatever its shape, and no frame can make it deep or
quadratic. They stop where the structure breaks (a closer that does not match, a missing colon,
a string never closed, a truncated item, the end of the frame) and report what they read before
it; scalars are checked only where a field is read from them. A frame that is not an object at
its top level has no fields.
"""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass, field
from itertools import accumulate
from typing import Any, Final, Generic, TypeVar

import msgspec

from toolwire.transport.bounds import MAX_NESTING_DEPTH

# The top-level fields an error reply echoes when the request carried them (PROTOCOL.md 4).
ENVELOPE_FIELDS: Final = frozenset({"rid", "chat_id", "call_id"})


@dataclass(frozen=True, slots=True)
class Outline:
    """`fields`: the last scalar value of each asked-for top-level field (a later object or
    array in its place removes it, as a decoder that keeps the last value would see it);
    `too_deep_at`: the path (`$.args.z[0]`) of the first object or array nested deeper than
    MAX_NESTING_DEPTH, the frame itself being level 1, or None."""

    fields: dict[str, Any] = field(default_factory=dict)
    too_deep_at: str | None = None


def outline(frame: str | bytes, names: frozenset[str] = ENVELOPE_FIELDS) -> Outline:
    """The outline of a JSON text frame (str) or a MessagePack binary frame (bytes)."""
    if isinstance(frame, str):
        return _JsonReader(frame, names).read()
    return _MsgpackReader(frame, names).read()


def _path(levels: list[tuple[bool, Any]]) -> str:
    """`$` and one step per open container: `.key` in an object, `[index]` in an array."""
    return "$" + "".join(f".{step}" if is_object else f"[{step}]" for is_object, step in levels)


# --- JSON ---------------------------------------------------------------------------------------

_WS: Final = r"[ \t\n\r]*+"
_STRING: Final = r'"[^"\\]*+(?:\\.[^"\\]*+)*+"'  # escapes are checked when it is decoded
_BARE: Final = r'[^ \t\n\r"\[\]{},:]++'  # number, true, false, null, or junk that fails to decode
# One token after whitespace: a string, a structural character, a bare scalar, or a lone quote
# (a string never closed). Every quantifier is possessive: the engine never backtracks.
_JSON_TOKEN: Final = re.compile(rf'{_WS}({_STRING}|[\[\]{{}},:]|{_BARE}|")', re.DOTALL)
# Runs that need no token-by-token reading, each item followed by its comma: scalars in an
# array (only their count matters, for the index in a path), members with scalar values in an
# object below the top level (the next key names the path).
_ARRAY_RUN: Final = re.compile(rf"(?:{_WS}(?:{_STRING}|{_BARE}){_WS},)++", re.DOTALL)
_OBJECT_RUN: Final = re.compile(
    rf"(?:{_WS}{_STRING}{_WS}:{_WS}(?:{_STRING}|{_BARE}){_WS},)++", re.DOTALL
)
_STRINGS: Final = re.compile(_STRING, re.DOTALL)
_VALUE_END: Final = re.compile(rf"{_WS}[,}}]")
_MEMBER: Final = re.compile(rf"{_WS}({_STRING}){_WS}:{_WS}({_STRING}|{_BARE}){_WS},", re.DOTALL)
# Inside a value that needs no path any more only containers and strings matter: whatever lies
# between them is passed over by the regex engine.
_NESTING: Final = re.compile(rf'[^"\[\]{{}}]*+({_STRING}|[\[\]{{}}]|")', re.DOTALL)
# The step each bracket takes in depth: +1 for `[` and `{`, -1 (0xFF as a signed byte) for `]`
# and `}`; every other character is deleted first (a string's brackets are removed before).
_DEPTH_STEPS: Final = bytes(1 if c in b"[{" else 0xFF if c in b"]}" else 0 for c in range(256))
_NOT_BRACKETS: Final = bytes(c for c in range(256) if c not in b"[]{}")
# The longest prefix of a chunk that cuts no string in two.
_WHOLE_STRINGS: Final = re.compile(rf'(?:[^"]++|{_STRING})*+', re.DOTALL)
_FIRST_CHUNK: Final = 256


_Frame = TypeVar("_Frame", str, bytes)


class _Reader(Generic[_Frame]):
    """What both readers share: the frame, the names wanted, and what was found so far; a
    subclass's `_read` walks the frame and raises `_Stop` where it can go no further."""

    def __init__(self, frame: _Frame, names: frozenset[str]) -> None:
        self.frame: _Frame = frame
        self.names = names
        self.fields: dict[str, Any] = {}
        self.too_deep_at: str | None = None

    def read(self) -> Outline:
        with contextlib.suppress(_Stop):
            self._read()
        return Outline(self.fields, self.too_deep_at)

    def _read(self) -> None:
        raise NotImplementedError


class _JsonReader(_Reader[str]):
    def _read(self) -> None:
        frame = self.frame
        # One entry per open container: is it an object, and its current key (the raw token,
        # decoded only when a path needs it) or index.
        levels: list[tuple[bool, Any]] = []
        top_key: Any = None
        # What may come next: "value", "key" (after `,` in an object), "key_or_close" (after
        # `{`), "value_or_close" (after `[`), "colon", "next" (`,` or the closer, after a value).
        expect = "value"
        pos = 0
        while True:
            if levels and expect != "colon" and expect != "next":
                pos, expect = self._read_run(levels, pos, expect)
            match = _JSON_TOKEN.match(frame, pos)
            if match is None:
                return
            token = match.group(1)
            pos = match.end()
            lead = token[0]
            if expect == "colon":
                if lead != ":":
                    return
                expect = "value"
            elif expect == "next" or (lead in "}]" and expect.endswith("_or_close")):
                if lead == ",":
                    is_object, step = levels[-1]
                    if is_object:
                        expect = "key"
                    else:
                        levels[-1] = (False, step + 1)
                        expect = "value"
                elif lead == ("}" if levels[-1][0] else "]"):
                    levels.pop()
                    if not levels:
                        return
                    expect = "next"
                else:
                    return
            elif expect == "key" or expect == "key_or_close":
                if lead != '"' or token == '"':
                    return
                levels[-1] = (True, token)
                if len(levels) == 1:
                    top_key = _json_scalar(token)
                expect = "colon"
            elif lead in "{[":
                if len(levels) == 1 and top_key in self.names:
                    self.fields.pop(top_key, None)
                if len(levels) == MAX_NESTING_DEPTH and self.too_deep_at is None:
                    steps = [(o, _json_scalar(s) if o else s) for o, s in levels]
                    self.too_deep_at = _path(steps)
                if self.too_deep_at is not None:
                    # No other path is needed: the rest of this top-level value is skipped.
                    pos = _skip_nested(frame, pos, len(levels))
                    del levels[1:]
                    expect = "next"
                elif not levels and lead != "{":
                    return  # a message is an object
                else:
                    levels.append((lead == "{", 0))
                    expect = "key_or_close" if lead == "{" else "value_or_close"
            elif lead not in ",:]}":
                if not levels or token == '"':
                    return  # a scalar is no message; a string never closed
                if len(levels) == 1 and top_key in self.names:
                    if _VALUE_END.match(frame, pos) is None:
                        return  # a number the end of the frame may have cut short
                    self.fields[top_key] = _json_scalar(token)
                expect = "next"
            else:
                return

    def _read_run(self, levels: list[tuple[bool, Any]], pos: int, expect: str) -> tuple[int, str]:
        """Past a run of scalar items, if one starts at `pos`; at the top level, reading the
        asked-for fields among its members."""
        is_object, step = levels[-1]
        if is_object and expect.startswith("key"):
            run = _OBJECT_RUN.match(self.frame, pos)
            if run is not None:
                if len(levels) == 1:
                    self._read_members(run.group())
                return run.end(), "key"
        elif not is_object and expect.startswith("value"):
            run = _ARRAY_RUN.match(self.frame, pos)
            if run is not None:
                items = run.group()
                if '"' in items:
                    items = _STRINGS.sub("", items)  # a comma inside a string is no separator
                levels[-1] = (False, step + items.count(","))
                return run.end(), "value"
        return pos, expect

    def _read_members(self, members: str) -> None:
        # Only a run that may name a field is read member by member: a name's quoted spelling
        # is in it, or an escape could spell one.
        if "\\" not in members and not any(f'"{name}"' in members for name in self.names):
            return
        for member in _MEMBER.finditer(members):
            key = _json_scalar(member.group(1))
            if key in self.names:
                self.fields[key] = _json_scalar(member.group(2))


def _skip_nested(frame: str, pos: int, depth: int) -> int:
    """Past the end of the `depth` containers open at `pos`. Only their count matters here, not
    their kinds; it is followed chunk by chunk at the speed of bytes.translate and
    itertools.accumulate, so that a frame nested millions deep costs no Python step per level.
    Chunks double from a small first one, so a short value costs little and the last chunk, the
    one read token by token to find the exact end, is at most twice what came before it."""
    size = _FIRST_CHUNK
    while True:
        cut = _WHOLE_STRINGS.match(frame, pos, pos + size)
        assert cut is not None  # the pattern matches the empty string
        if cut.end() == pos:  # a string longer than the chunk, or one never closed
            string = _STRINGS.match(frame, pos)
            if string is None:
                raise _Stop
            pos = string.end()
            continue
        chunk = cut.group()
        if '"' in chunk:
            chunk = _STRINGS.sub("", chunk)  # brackets inside strings are not containers
        brackets = chunk.encode("ascii", "replace").translate(_DEPTH_STEPS, _NOT_BRACKETS)
        steps = memoryview(brackets).cast("b")
        if min(accumulate(steps, initial=depth)) > 0:
            depth += sum(steps)
            pos = cut.end()
            size = min(2 * size, len(frame))
            continue
        while depth:  # the end is in this chunk
            match = _NESTING.match(frame, pos)
            if match is None:
                raise _Stop
            pos = match.end()
            token = match.group(1)
            if token in ("[", "{"):
                depth += 1
            elif token in ("]", "}"):
                depth -= 1
            elif token == '"':
                raise _Stop  # a string never closed
        return pos


class _Stop(Exception):
    """The frame stops fitting the grammar here: what was read before it stands."""


def _json_scalar(token: str) -> Any:
    try:
        return msgspec.json.decode(token)
    except msgspec.DecodeError:
        raise _Stop from None


# --- MessagePack --------------------------------------------------------------------------------

# Per leading byte: its kind, then for a scalar the bytes after the lead byte (a fixed size, or
# the size of a length field and the bytes that follow it besides the data: 1 for an ext's
# type), for a container the size of its count field (0: the count is in the lead byte).
_SCALAR, _ARRAY, _MAP = range(3)
_FIXED: Final = {
    **{0xC0: 0, 0xC2: 0, 0xC3: 0},  # nil, false, true
    **{0xCA: 4, 0xCB: 8},  # float 32, 64
    **{0xCC: 1, 0xCD: 2, 0xCE: 4, 0xCF: 8, 0xD0: 1, 0xD1: 2, 0xD2: 4, 0xD3: 8},  # uint, int
    **{0xD4: 2, 0xD5: 3, 0xD6: 5, 0xD7: 9, 0xD8: 17},  # fixext: a type byte and the data
}
_SIZED: Final = {
    **{0xC4: (1, 0), 0xC5: (2, 0), 0xC6: (4, 0)},  # bin 8, 16, 32
    **{0xD9: (1, 0), 0xDA: (2, 0), 0xDB: (4, 0)},  # str 8, 16, 32
    **{0xC7: (1, 1), 0xC8: (2, 1), 0xC9: (4, 1)},  # ext 8, 16, 32: a type byte, then the data
}
_CONTAINERS: Final = {0xDC: (_ARRAY, 2), 0xDD: (_ARRAY, 4), 0xDE: (_MAP, 2), 0xDF: (_MAP, 4)}
# Scalars of one byte (fixints, nil, booleans, the empty string), read as a run by the regex
# engine.
_ONE_BYTE_SCALARS: Final = re.compile(rb"[\x00-\x7f\xa0\xc0\xc2\xc3\xe0-\xff]++")
# Any item of one byte, small maps and arrays counted by their header, with the step each takes
# in the count of items still to read: -1 for a scalar, entries - 1 for a header (a map's
# entries counting twice), as a signed byte.
_ONE_BYTE_ITEMS: Final = re.compile(rb"[\x00-\xa0\xc0\xc2\xc3\xe0-\xff]++")
_ITEM_STEPS: Final = bytes(
    (2 * (c & 0x0F) - 1 if c <= 0x8F else (c & 0x0F) - 1 if c <= 0x9F else -1) % 256
    if c >= 0x80
    else 0xFF
    for c in range(256)
)


class _MsgpackReader(_Reader[bytes]):
    def _read(self) -> None:
        # One entry per open container: is it a map, the items it has left to start (a map's
        # entries count twice: key and value), and its current key (as the slice of the frame
        # that holds it, decoded only when a path needs it) or index.
        levels: list[list[Any]] = []
        top_key: Any = None
        pos = 0
        while True:
            if len(levels) > 1:
                pos = self._read_run(levels[-1], pos)
                if levels[-1][1] == 0:
                    if self._close(levels):
                        return
                    continue
            kind, count, start, pos = self._item(pos)
            in_key = False
            if levels:
                level = levels[-1]
                level[1] -= 1
                if level[0]:
                    in_key = level[1] % 2 == 1  # a key starts with an odd number left after it
                else:
                    level[2] += 1
            elif kind != _MAP:
                return  # a message is a map
            if in_key:
                levels[-1][2] = (start, pos)
                if len(levels) == 1:
                    top_key = self._scalar(start, pos) if kind == _SCALAR else None
            elif len(levels) == 1 and top_key in self.names:
                if kind == _SCALAR:
                    self.fields[top_key] = self._scalar(start, pos)
                else:
                    self.fields.pop(top_key, None)
            if kind != _SCALAR:
                if len(levels) == MAX_NESTING_DEPTH and self.too_deep_at is None:
                    self.too_deep_at = _path([self._step(level) for level in levels])
                if self.too_deep_at is not None:
                    # No other path is needed: every item still to come inside this top-level
                    # value, this one's entries included, is skipped with one counter.
                    left = count * (2 if kind == _MAP else 1)
                    pos = self._skip(pos, left + sum(level[1] for level in levels[1:]))
                    del levels[1:]
                elif count:
                    levels.append([kind == _MAP, count * (2 if kind == _MAP else 1), -1])
                    continue
            if self._close(levels):
                return

    @staticmethod
    def _close(levels: list[list[Any]]) -> bool:
        """Close every container whose last item has been read; True when the frame is."""
        while levels and levels[-1][1] == 0:
            levels.pop()
        return not levels

    def _read_run(self, level: list[Any], pos: int) -> int:
        """Past a run of one-byte scalars in `level` (below the top level), if one is at `pos`;
        in a map only whole entries, so that the next key read names the path."""
        run = _ONE_BYTE_SCALARS.match(self.frame, pos)
        if run is None:
            return pos
        is_map, left, step = level
        items: int = min(run.end() - pos, left)
        if is_map:
            if left % 2:
                return pos  # a value comes first
            items -= items % 2
        else:
            level[2] = step + items
        level[1] = left - items
        return pos + items

    def _item(self, pos: int) -> tuple[int, int, int, int]:
        """The item at `pos`: its kind, its count of entries (a container), where it starts and
        where the next item starts (for a container: its first entry)."""
        frame = self.frame
        if pos >= len(frame):
            raise _Stop
        lead = frame[pos]
        if lead <= 0x7F or lead >= 0xE0:
            return _SCALAR, 0, pos, pos + 1
        if lead <= 0x8F:
            return _MAP, lead & 0x0F, pos, pos + 1
        if lead <= 0x9F:
            return _ARRAY, lead & 0x0F, pos, pos + 1
        if lead <= 0xBF:
            end = pos + 1 + (lead & 0x1F)
        elif lead in _FIXED:
            end = pos + 1 + _FIXED[lead]
        elif lead in _SIZED:
            size_bytes, extra = _SIZED[lead]
            end = pos + 1 + size_bytes
            end += extra + int.from_bytes(frame[pos + 1 : end], "big")
        elif lead in _CONTAINERS:
            kind, size_bytes = _CONTAINERS[lead]
            end = pos + 1 + size_bytes
            if end > len(frame):
                raise _Stop
            return kind, int.from_bytes(frame[pos + 1 : end], "big"), pos, end
        else:
            raise _Stop  # 0xC1 is never used
        if end > len(frame):
            raise _Stop
        return _SCALAR, 0, pos, end

    def _skip(self, pos: int, items: int) -> int:
        """Past `items` items from `pos`, each container adding its entries. Runs of one-byte
        items (scalars, and the headers of small maps and arrays, which add their entries) are
        counted chunk by chunk at the speed of bytes.translate and itertools.accumulate, so that
        a frame nested millions deep costs no Python step per level; chunks double, so the last
        one, read byte by byte to find the exact end, is at most twice what came before it."""
        frame = self.frame
        size = _FIRST_CHUNK
        while items:
            scalars = _ONE_BYTE_SCALARS.match(frame, pos)
            if scalars is not None:
                skipped = min(scalars.end() - pos, items)  # each takes one from the count
                items -= skipped
                pos += skipped
                continue
            run = _ONE_BYTE_ITEMS.match(frame, pos, pos + size)
            if run is not None:
                steps = memoryview(run.group().translate(_ITEM_STEPS)).cast("b")
                if min(accumulate(steps, initial=items)) > 0:
                    items += sum(steps)
                    pos = run.end()
                    size = min(2 * size, len(frame))
                    continue
                for step in steps:  # the end is in this run
                    items += step
                    pos += 1
                    if not items:
                        return pos
            kind, count, _, pos = self._item(pos)
            items += count * (2 if kind == _MAP else 1) - 1
        return pos

    def _scalar(self, start: int, end: int) -> Any:
        try:
            return msgspec.msgpack.decode(self.frame[start:end])
        except msgspec.DecodeError:
            raise _Stop from None

    def _step(self, level: list[Any]) -> tuple[bool, Any]:
        is_map, _, step = level
        if not is_map:
            return False, step
        start, end = step
        kind = self.frame[start]
        if 0x80 <= kind <= 0x9F or kind in _CONTAINERS:
            return True, "?"  # a key that is itself a container: no name to give
        return True, self._scalar(start, end)
