"""Both encodings round-trip every message type (hypothesis over the Struct definitions)."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import msgspec.inspect as mi
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from toolwire.transport import protocol
from toolwire.transport.bounds import (
    MAX_NESTING_DEPTH,
    MAX_WIRE_INT,
    MIN_WIRE_INT,
    TOO_DEEP,
    BoundsError,
    check_bounds,
    may_exceed_bounds,
)
from toolwire.transport.codec import Codec, MessageError, choose_subprotocol
from toolwire.transport.outline import ENVELOPE_FIELDS, outline

_json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=10,
)


# Every category Python's str.isprintable() refuses (all separators but the space too).
_UNPRINTABLE = ("Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp", "Zs")


def _strategy(t: mi.Type) -> st.SearchStrategy[Any]:
    match t:
        case mi.Metadata(type=mi.StrType() as s, extra={"printable": True}):
            return st.text(
                alphabet=st.characters(blacklist_categories=_UNPRINTABLE),
                min_size=s.min_length or 0,
                max_size=min(s.max_length or 40, 40),
            )
        case mi.StrType():
            return st.text(
                alphabet=st.characters(blacklist_categories=("Cc", "Cs")),
                min_size=t.min_length or 0,
                max_size=min(t.max_length or 40, 40),
            )
        case mi.IntType():
            return st.integers(min_value=t.ge if t.ge is not None else -(2**40), max_value=2**53)
        case mi.BoolType():
            return st.booleans()
        case mi.NoneType():
            return st.none()
        case mi.AnyType():
            return _json_values
        case mi.LiteralType():
            return st.sampled_from(t.values)
        case mi.ListType():
            return st.lists(_strategy(t.item_type), max_size=3)
        case mi.DictType():
            return st.dictionaries(st.text(max_size=8), _json_values, max_size=3)
        case mi.StructType():
            return _struct_strategy(t.cls)
        case mi.UnionType():
            return st.one_of([_strategy(x) for x in t.types])
    raise AssertionError(t)


def _struct_strategy(cls: type[Any]) -> st.SearchStrategy[Any]:
    info = mi.type_info(cls)
    assert isinstance(info, mi.StructType)
    return st.builds(cls, **{f.name: _strategy(f.type) for f in info.fields})


client_messages = st.one_of([_struct_strategy(c) for c in protocol.CLIENT_MESSAGE_TYPES])
agent_messages = st.one_of([_struct_strategy(c) for c in protocol.AGENT_MESSAGE_TYPES])


@pytest.mark.parametrize("encoding", ["json", "msgpack"])
@settings(max_examples=300, deadline=None)
@given(message=client_messages)
def test_client_messages_round_trip(encoding: str, message: Any) -> None:
    client = Codec(encoding, side="client")  # type: ignore[arg-type]
    agent = Codec(encoding, side="agent")  # type: ignore[arg-type]
    frame = client.encode(message)
    assert isinstance(frame, str if encoding == "json" else bytes)
    assert agent.decode(frame) == message


@pytest.mark.parametrize("encoding", ["json", "msgpack"])
@settings(max_examples=300, deadline=None)
@given(message=agent_messages)
def test_agent_messages_round_trip(encoding: str, message: Any) -> None:
    agent = Codec(encoding, side="agent")  # type: ignore[arg-type]
    client = Codec(encoding, side="client")  # type: ignore[arg-type]
    assert client.decode(agent.encode(message)) == message


def test_wrong_type_names_the_field_path_and_keeps_the_rid() -> None:
    codec = Codec("json")
    with pytest.raises(MessageError) as info:
        codec.decode('{"type": "cancel", "rid": 9, "chat_id": "c", "call_ids": ["a", 7]}')
    assert "$.call_ids[1]" in info.value.message
    assert info.value.envelope == {"rid": 9, "chat_id": "c"}


def test_unknown_fields_are_ignored() -> None:
    message = Codec("json").decode(
        '{"type": "detach", "chat_id": "c", "call_id": "x", "from_the_future": [1, 2]}'
    )
    assert message == protocol.Detach(chat_id="c", call_id="x")


@pytest.mark.parametrize(
    "frame",
    [
        "{",
        "[]",
        '{"type": "nope"}',
        '{"chat_id": "c"}',
        '{"type": "call", "chat_id": "c", "call_id": "", "tool": "t", "args": {}}',
        '{"type": "call", "chat_id": "c", "call_id": "a\\u0000b", "tool": "t", "args": {}}',
        '{"type": "call", "chat_id": "c", "call_id": "x", "tool": "t", "args": []}',
        '{"type": "attach", "chat_id": "c", "call_id": "x", "from_offset": -1}',
    ],
)
def test_invalid_messages_are_refused_with_a_reason(frame: str) -> None:
    with pytest.raises(MessageError) as info:
        Codec("json").decode(frame)
    assert info.value.message


def test_a_frame_of_the_wrong_kind_is_refused() -> None:
    with pytest.raises(MessageError, match="text frames"):
        Codec("json").decode(b'{"type": "detach"}')
    with pytest.raises(MessageError, match="binary frames"):
        Codec("msgpack").decode('{"type": "detach"}')


def test_subprotocol_choice_is_the_first_supported_offer() -> None:
    assert choose_subprotocol(["x", "toolwire.v1.msgpack", "toolwire.v1.json"]) == (
        "toolwire.v1.msgpack"
    )
    assert choose_subprotocol(["toolwire.v2.json"]) is None
    assert choose_subprotocol([]) is None


def test_result_nulls_are_sent_not_omitted() -> None:
    result = protocol.ResultMessage(
        chat_id="c", call_id="x", tool="execute", outcome="not_run", text="t", data=None,
        output="", output_bytes=0, truncated_bytes=0, timed_out=False, canceled=True,
        started_at=None, finished_at=1, wall_ms=None,
    )  # fmt: skip
    decoded = msgspec.json.decode(Codec("json").encode(result))
    assert decoded["started_at"] is None and decoded["data"] is None and decoded["wall_ms"] is None


def test_the_domain_result_and_the_wire_result_have_the_same_fields() -> None:
    # transport/server.py copies one into the other by field name.
    from toolwire.actors.results import Result as DomainResult

    assert DomainResult.__struct_fields__ == protocol.Result.__struct_fields__


# PROTOCOL.md 9.9: value bounds, checked once at decode.

_any_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()  # unbounded: both sides of each bound
    | st.sampled_from([MIN_WIRE_INT, MIN_WIRE_INT - 1, MAX_WIRE_INT, MAX_WIRE_INT + 1])
    | st.text(alphabet='0123456789{}[]ab"\\', max_size=30),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=12,
)


def _depth(value: Any) -> int:
    """Container levels of a value; a scalar has none."""
    if isinstance(value, dict):
        return 1 + max((_depth(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((_depth(v) for v in value), default=0)
    return 0


def _ints(value: Any) -> list[int]:
    if isinstance(value, dict):
        return [i for v in value.values() for i in _ints(v)]
    if isinstance(value, list):
        return [i for v in value for i in _ints(v)]
    return [value] if isinstance(value, int) and not isinstance(value, bool) else []


def _wrapped(value: Any, levels: int) -> Any:
    for _ in range(levels):
        value = [value]
    return value


@settings(max_examples=400, deadline=None)
@given(value=_any_values, extra_levels=st.integers(0, 70))
def test_a_value_is_refused_exactly_when_it_is_out_of_bounds(value: Any, extra_levels: int) -> None:
    """Anywhere in a message (args, unknown fields): refused iff an integer is out of range or
    containers nest deeper than 64 levels, the message object itself being level 1. The cheap
    pre-test never lets an out-of-bounds frame through."""
    value = _wrapped(value, extra_levels)
    in_bounds = 1 + _depth(value) <= MAX_NESTING_DEPTH and all(
        MIN_WIRE_INT <= i <= MAX_WIRE_INT for i in _ints(value)
    )
    message = {"type": "detach", "chat_id": "c", "call_id": "x", "future": value}
    frames: list[tuple[str, str | bytes]] = [("json", json.dumps(message))]
    if all(MIN_WIRE_INT <= i <= MAX_WIRE_INT for i in _ints(value)):
        frames.append(("msgpack", msgspec.msgpack.encode(message)))
    for encoding, frame in frames:
        if not in_bounds:
            assert may_exceed_bounds(frame)
            with pytest.raises(MessageError):
                Codec(encoding).decode(frame)  # type: ignore[arg-type]
        else:
            assert Codec(encoding).decode(frame) == protocol.Detach(chat_id="c", call_id="x")  # type: ignore[arg-type]


def test_bounds_errors_name_the_field_path() -> None:
    with pytest.raises(BoundsError) as info:
        check_bounds({"args": {"xs": [1, 2**64]}})
    assert info.value.path == "$.args.xs[1]"
    with pytest.raises(BoundsError) as info:
        check_bounds({"args": _wrapped(0, MAX_NESTING_DEPTH)})
    assert "deeper than 64" in str(info.value)
    check_bounds({"args": _wrapped(0, MAX_NESTING_DEPTH - 1)})  # exactly 64 levels


def test_frames_too_deep_for_any_recursive_decoder_are_refused_not_raised() -> None:
    deep = (
        '{"type": "detach", "chat_id": "c", "call_id": "x", "z": ' + "[" * 5000 + "]" * 5000 + "}"
    )
    with pytest.raises(MessageError, match="deeper than 64"):
        Codec("json").decode(deep)
    packed = msgspec.msgpack.encode({"type": "detach", "chat_id": "c", "call_id": "x", "z": "@"})
    with pytest.raises(MessageError, match="deeper than 64"):
        Codec("msgpack").decode(packed.replace(b"\xa1@", b"\x91" * 4999 + b"\x90"))


# Issue 26, defect 3: a message nested deeper than msgspec's recursive decoder goes (about 1,000
# levels) still gets its `rid`, `chat_id` and `call_id` echoed, and the path where it first nests
# too deep, read by transport/outline.py without recursion.

_names = st.text(max_size=5).filter(lambda key: key not in ENVELOPE_FIELDS)
_scalars = (
    st.none()
    | st.booleans()
    | st.integers(MIN_WIRE_INT, MAX_WIRE_INT)
    | st.text(alphabet='0123456789{}[]ab",:\\', max_size=8)
)
# One level of the deep value: an array (with scalars before the next level, so the index in the
# path is not always 0) or an object (with members before the next level's key).
_steps = st.one_of(
    st.tuples(st.none(), st.lists(_scalars, max_size=2)),
    st.tuples(_names, st.dictionaries(_names, _scalars, max_size=2)),
).filter(lambda step: step[0] is None or step[0] not in step[1])
_rids = st.text(max_size=12) | st.integers(MIN_WIRE_INT, MAX_WIRE_INT)
_members = st.dictionaries(_names, _scalars | st.lists(_scalars, max_size=2), max_size=3)


def _encoded(value: Any, encoding: str) -> bytes:
    return json.dumps(value).encode() if encoding == "json" else msgspec.msgpack.encode(value)


def _deep_value(steps: list[tuple[Any, Any]], leaf: Any, encoding: str) -> bytes:
    """The value the steps nest (outermost first), encoded by hand without recursion."""
    opening, closing = [], []
    for key, siblings in steps:
        if encoding == "json":
            if key is None:
                opening.append(b"[" + b"".join(_encoded(v, "json") + b"," for v in siblings))
                closing.append(b"]")
            else:
                members = b"".join(
                    _encoded(k, "json") + b":" + _encoded(v, "json") + b","
                    for k, v in siblings.items()
                )
                opening.append(b"{" + members + _encoded(key, "json") + b":")
                closing.append(b"}")
        elif key is None:
            opening.append(
                bytes([0x91 + len(siblings)]) + b"".join(map(msgspec.msgpack.encode, siblings))
            )
        else:
            members = b"".join(
                msgspec.msgpack.encode(k) + msgspec.msgpack.encode(v) for k, v in siblings.items()
            )
            opening.append(bytes([0x81 + len(siblings)]) + members + msgspec.msgpack.encode(key))
    return b"".join(opening) + _encoded(leaf, encoding) + b"".join(reversed(closing))


def _message(members: list[tuple[str, bytes]], encoding: str) -> str | bytes:
    """An object of already encoded members, in this order."""
    if encoding == "json":
        return "{" + ",".join(json.dumps(k) + ":" + v.decode() for k, v in members) + "}"
    assert len(members) < 16
    return bytes([0x80 + len(members)]) + b"".join(
        msgspec.msgpack.encode(k) + v for k, v in members
    )


def _step_path(steps: list[tuple[Any, Any]]) -> str:
    return "".join(f"[{len(siblings)}]" if key is None else f".{key}" for key, siblings in steps)


@pytest.mark.parametrize("encoding", ["json", "msgpack"])
@settings(max_examples=150, deadline=None)
@given(
    rid=_rids,
    before=_members,
    after=_members,
    pattern=st.lists(_steps, min_size=1, max_size=4),
    levels=st.integers(MAX_NESTING_DEPTH, 3000),
    leaf=_scalars,
)
@example(rid="v2b", before={}, after={}, pattern=[("a", {})], levels=1000, leaf=1)
def test_any_top_level_rid_is_echoed_whatever_nesting_follows_it(
    encoding: str,
    rid: Any,
    before: dict[str, Any],
    after: dict[str, Any],
    pattern: list[tuple[Any, Any]],
    levels: int,
    leaf: Any,
) -> None:
    """The message itself is level 1 and its field `deep` level 2, so `levels` steps inside that
    field nest 1 + `levels` deep: at least 64 is too deep. The error names the path of the first
    level too deep and echoes `rid` (before the deep field) and `chat_id` (after it)."""
    steps = (pattern * (levels // len(pattern) + 1))[:levels]
    members = [("type", _encoded("attach", encoding)), ("rid", _encoded(rid, encoding))]
    members += [(k, _encoded(v, encoding)) for k, v in before.items()]
    members.append(("deep", _deep_value(steps, leaf, encoding)))
    members += [(k, _encoded(v, encoding)) for k, v in after.items() if k != "deep"]
    members.append(("chat_id", _encoded("c", encoding)))
    with pytest.raises(MessageError) as info:
        Codec(encoding).decode(_message(members, encoding))  # type: ignore[arg-type]
    assert info.value.envelope == {"rid": rid, "chat_id": "c"}
    where = "$.deep" + _step_path(steps[: MAX_NESTING_DEPTH - 1])
    assert info.value.message == f"{TOO_DEEP} - at `{where}`"


_in_range_values = st.recursive(
    _scalars,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=12,
)


@pytest.mark.parametrize("encoding", ["json", "msgpack"])
@settings(max_examples=300, deadline=None)
@given(
    envelope=st.dictionaries(
        st.sampled_from(sorted(ENVELOPE_FIELDS)), _in_range_values, max_size=3
    ),
    value=_in_range_values,
    extra_levels=st.integers(0, 200),
)
def test_the_outline_agrees_with_the_recursive_reference(
    encoding: str, envelope: dict[str, Any], value: Any, extra_levels: int
) -> None:
    """Where msgspec can decode a frame, the iterative reader finds the same first level too deep
    as check_bounds over the decoded value, and the same top-level fields."""
    message = {"type": "detach", "future": _wrapped(value, extra_levels)} | envelope
    frame = json.dumps(message) if encoding == "json" else msgspec.msgpack.encode(message)
    try:
        check_bounds(message)
        expected = None
    except BoundsError as exc:
        expected = exc.path
    found = outline(frame)
    assert found.too_deep_at == expected
    scalars = {k: v for k, v in envelope.items() if not isinstance(v, dict | list)}
    assert found.fields == scalars


@pytest.mark.parametrize("encoding", ["json", "msgpack"])
@settings(max_examples=200, deadline=None)
@given(rid=_rids, levels=st.integers(1, 300), data=st.data())
def test_a_frame_cut_short_yields_only_what_it_holds(
    encoding: str, rid: Any, levels: int, data: st.DataObject
) -> None:
    """Read up to where a frame breaks, the outline never raises and never reports a field the
    whole frame does not hold with that value (a number cut short is not read as a shorter one)."""
    # The nesting is built as a value, not spliced into the encoded frame: a splice could also
    # hit the rid's own bytes (a rid "@", or an int whose msgpack bytes hold the marker).
    nested: list[Any] = []
    for _ in range(levels - 1):
        nested = [nested]
    message = {"rid": rid, "z": nested, "chat_id": "c"}
    frame: str | bytes = (
        json.dumps(message) if encoding == "json" else msgspec.msgpack.encode(message)
    )
    cut = data.draw(st.integers(0, len(frame)))
    assert outline(frame).fields == {"rid": rid, "chat_id": "c"}
    assert outline(frame[:cut]).fields.items() <= {"rid": rid, "chat_id": "c"}.items()


@given(frame=st.text(alphabet='{}[]",: \\a0-e', max_size=60) | st.binary(max_size=60))
def test_the_outline_of_any_frame_is_an_answer_not_an_exception(frame: str | bytes) -> None:
    found = outline(frame)
    assert isinstance(found.fields, dict)
