"""Each tool's `input_schema` (PROTOCOL.md 10.3) against what the agent takes, and the registry
entry every other part reads: the planner's roles, the docs' tool list, the welcome's.

Exact both ways: args generated from a schema are never refused for their shape, and args
changed from valid ones are refused exactly when the schema (checked by the `jsonschema`
package, an independent validator) refuses them.
"""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from toolwire.actors import planner
from toolwire.actors.canonical_paths import canonical_path
from toolwire.actors.planner import Access, PlannedCall
from toolwire.actors.reservations import reservation_for
from toolwire.actors.results import ToolwireError
from toolwire.actors.tools import registry
from toolwire.actors.tools.registry import TOOLS, input_schema, parse_args, parse_shape
from toolwire.transport import reference

VALIDATORS = {
    name: jsonschema.Draft202012Validator(input_schema(tool)) for name, tool in TOOLS.items()
}


def from_schema(node: dict[str, Any]) -> st.SearchStrategy[Any]:
    """Values valid against `node`, for the parts of JSON Schema the tools' schemas use."""
    if "anyOf" in node:
        return st.one_of([from_schema(option) for option in node["anyOf"]])
    if "enum" in node:
        return st.sampled_from(node["enum"])
    kind = node["type"]
    if kind == "string":
        if "pattern" in node:
            return st.from_regex(node["pattern"])
        return st.text(min_size=node.get("minLength", 0), max_size=12)
    if kind == "integer":
        return st.integers(node.get("minimum"), node.get("maximum"))
    if kind == "boolean":
        return st.booleans()
    if kind == "null":
        return st.none()
    if kind == "array":
        return st.lists(from_schema(node["items"]), min_size=node.get("minItems", 0), max_size=3)
    assert kind == "object", node
    extra = node.get("additionalProperties", False)
    if not node.get("properties") and isinstance(extra, dict):
        return st.dictionaries(st.text(max_size=5), from_schema(extra), max_size=3)
    required = set(node.get("required", []))
    props = node.get("properties", {})
    return st.fixed_dictionaries(
        {name: from_schema(p) for name, p in props.items() if name in required},
        optional={name: from_schema(p) for name, p in props.items() if name not in required},
    )


def _accepts(tool: str, args: Any) -> bool:
    try:
        parse_shape(TOOLS[tool], args)
    except ToolwireError as exc:
        assert exc.code == "bad_args", exc
        return False
    return True


@st.composite
def valid_args(draw: st.DrawFn) -> tuple[str, dict[str, Any]]:
    tool = draw(st.sampled_from(sorted(TOOLS)))
    return tool, draw(from_schema(input_schema(TOOLS[tool])))


json_values: st.SearchStrategy[Any] = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.sampled_from([0.0, 1.0, -1.0, 24.0])
    | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner),
    max_leaves=6,
)


def _paths(value: Any, at: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every place in a JSON value (the root included), as a path of keys and indexes."""
    found = [at]
    if isinstance(value, dict):
        for key, item in value.items():
            found += _paths(item, (*at, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found += _paths(item, (*at, index))
    return found


def _replace(value: Any, at: tuple[Any, ...], new: Any) -> Any:
    if not at:
        return new
    copy = json.loads(json.dumps(value))
    holder = copy
    for step in at[:-1]:
        holder = holder[step]
    holder[at[-1]] = new
    return copy


def _drop(value: Any, at: tuple[Any, ...]) -> Any:
    copy = json.loads(json.dumps(value))
    holder = copy
    for step in at[:-1]:
        holder = holder[step]
    if isinstance(holder, dict | list):
        del holder[at[-1]]
    return copy


@st.composite
def changed_args(draw: st.DrawFn) -> tuple[str, Any]:
    """Valid args with one change somewhere: a value replaced by any JSON value, a key or
    item dropped, or an unknown key added to an object."""
    tool, args = draw(valid_args())
    at = draw(st.sampled_from(_paths(args)))
    how = draw(st.sampled_from(["replace", "nudge", "drop", "add"]))
    if how == "drop" and at:
        return tool, _drop(args, at)
    target = args
    for step in at:
        target = target[step]
    if how == "nudge":
        # A value near the one there: the edges a schema and a decoder most easily disagree on.
        return tool, _replace(args, at, draw(_near(target)))
    if how == "add" and isinstance(target, dict):
        key = draw(st.text(min_size=1, max_size=6))
        return tool, _replace(args, at, target | {key: draw(json_values)})
    return tool, _replace(args, at, draw(json_values))


def _near(value: Any) -> st.SearchStrategy[Any]:
    if isinstance(value, bool):
        return st.sampled_from([int(value), float(value), str(value).lower(), None])
    if isinstance(value, int):
        return st.sampled_from(
            [float(value), value + 0.5, value - 1, value + 1, -1, 0, 65536, 2**64, str(value)]
        )
    if isinstance(value, str):
        return st.sampled_from(["", value + "\n", value[:1], 1, None, [value]])
    if isinstance(value, list):
        return st.sampled_from([[], value[:1], value * 2, {}])
    if isinstance(value, dict):
        return st.sampled_from([{}, [], None])
    return st.sampled_from([0, "", False])


@settings(max_examples=400, deadline=None)
@given(valid_args())
def test_args_valid_against_the_schema_are_taken(case: tuple[str, dict[str, Any]]) -> None:
    tool, args = case
    VALIDATORS[tool].validate(args)  # the generator makes what the schema says
    assert _accepts(tool, args)
    # The whole check refuses such args only for a rule about content, never about shape
    # (the rules docs/protocol.md lists beside the schema).
    try:
        parse_args(TOOLS[tool], args)
    except ToolwireError as exc:
        assert exc.code == "bad_args"
        assert any(rule in exc.message for rule in CONTENT_RULES), exc.message


CONTENT_RULES = (
    "must not contain a NUL character",
    "must be non-empty, without `=` or NUL",
    "must hold printable characters only",
)


@settings(max_examples=1500, deadline=None)
@given(changed_args())
def test_the_schema_and_the_agent_agree_on_every_change(case: tuple[str, Any]) -> None:
    tool, args = case
    assert _accepts(tool, args) == VALIDATORS[tool].is_valid(args), args


@pytest.mark.parametrize("tool", sorted(TOOLS))
def test_each_schema_is_self_contained_and_described(tool: str) -> None:
    schema = input_schema(TOOLS[tool])
    jsonschema.Draft202012Validator.check_schema(schema)
    assert "$ref" not in json.dumps(schema) and "$defs" not in schema
    assert schema["type"] == "object" and schema["additionalProperties"] is False
    assert set(schema["required"]) <= set(schema["properties"])
    for where, prop in _properties(schema, "args"):
        assert prop.get("description"), where
    assert 0 < len(TOOLS[tool].description) <= registry.MAX_DESCRIPTION_CHARS


def _properties(node: Any, where: str) -> list[tuple[str, dict[str, Any]]]:
    found: list[tuple[str, dict[str, Any]]] = []
    if isinstance(node, dict):
        for name, prop in node.get("properties", {}).items():
            found += [(f"{where}.{name}", prop), *_properties(prop, f"{where}.{name}")]
        for key in ("items", "anyOf"):
            sub = node.get(key)
            for item in sub if isinstance(sub, list) else [sub]:
                found += _properties(item, where)
    return found


@pytest.mark.parametrize("tool", sorted(TOOLS))
def test_an_unknown_argument_is_bad_args_naming_it(tool: str) -> None:
    args = next(iter(_examples(tool)))
    with pytest.raises(ToolwireError) as info:
        parse_args(TOOLS[tool], args | {"pathh": "x"})
    assert info.value.code == "bad_args"
    known = ", ".join(input_schema(TOOLS[tool])["properties"]) or None
    takes = f"(it takes: {known})" if known else "(it takes none)"
    assert info.value.message == f"{tool}: `args.pathh` is not an argument of this tool {takes}"


def _examples(tool: str) -> list[dict[str, Any]]:
    minimal = {
        "execute": {"command": "true"},
        "process_output": {"process_id": "p"},
        "process_signal": {"process_id": "p", "signal": "SIGTERM"},
        "process_list": {},
        "process_input": {"process_id": "p", "data": ""},
        "process_resize": {"process_id": "p", "rows": 24, "cols": 80},
        "read_file": {"path": "a"},
        "write_file": {"path": "a", "content": ""},
        "edit_files": {"files": [{"path": "a", "edits": [{"old": "x", "new": "y"}]}]},
        "search_files": {"pattern": "x"},
        "list_dir": {},
    }
    return [minimal[tool]]


def test_a_whole_number_written_as_a_float_is_an_integer() -> None:
    # JSON Schema's integer includes 2.0, and some encoders write one; 2.5 is no integer.
    assert parse_args(TOOLS["read_file"], {"path": "a", "offset": 2.0}) == parse_args(
        TOOLS["read_file"], {"path": "a", "offset": 2}
    )
    with pytest.raises(ToolwireError, match=r"args\.offset"):
        parse_args(TOOLS["read_file"], {"path": "a", "offset": 2.5})


# --- the registry as the one source ---------------------------------------------------------------


def test_the_docs_welcome_lists_the_registrys_tools_in_order() -> None:
    assert reference.EXAMPLES["welcome"]["tools"] == registry.TOOL_NAMES
    assert {"describe_tools", "list_dir"} <= set(reference.EXAMPLES["welcome"]["features"])


@pytest.mark.parametrize("tool", sorted(TOOLS))
def test_a_tools_role_reads_an_argument_the_tool_has(tool: str) -> None:
    """A role that names an arg the tool does not have would reserve nothing it touches: the
    planner would read a missing path and make every call of it a barrier, silently."""
    role = TOOLS[tool].reserves
    if role.access in (Access.BARRIER, Access.NONE):
        return
    schema = input_schema(TOOLS[tool])
    if role.each_in is not None:
        schema = schema["properties"][role.each_in]["items"]
    assert role.path_arg in schema["properties"]
    # A default path is only for an arg that may be left out.
    assert (role.default_path is not None) == (role.path_arg not in schema["required"])
    assert TOOLS[tool].effect == ("write" if role.access is Access.WRITE else "read")


@settings(max_examples=300, deadline=None)
@given(valid_args())
def test_a_valid_calls_reservation_holds_the_paths_its_tool_touches(
    case: tuple[str, dict[str, Any]],
) -> None:
    """The planner, given a tool's role from the registry, reserves exactly the paths the
    tool's args name (canonical, deduplicated), or the whole workspace for a search or listing
    without a path; process readers reserve nothing; commands and what acts on them are
    barriers. Paths are spelled under a directory that does not exist, so canonical paths are
    plain joins (no filesystem is read that a test could leave behind)."""
    tool, args = case
    workspace = "/nonexistent-toolwire-ws"
    got = reservation_for(PlannedCall("c", TOOLS[tool].reserves, args), workspace)
    role = TOOLS[tool].reserves
    if role.access in (Access.BARRIER, Access.NONE):
        assert got == planner.Reservation(role.access, ())
        return
    if role.each_in is not None:
        raw = [entry[role.path_arg] for entry in args[role.each_in]]
    elif args.get(role.path_arg) is None:
        raw = ["."]
    else:
        raw = [args[role.path_arg]]
    if any("\0" in path for path in raw):
        assert got.access is Access.BARRIER  # no tool can open it: it fails on its own
        return
    expected = tuple(dict.fromkeys(canonical_path(p, workspace) for p in raw))
    assert got == planner.Reservation(role.access, expected)


def test_an_unknown_tool_is_a_barrier() -> None:
    assert registry.reserves_of("frobnicate") == planner.BARRIER


def test_every_process_op_and_file_run_is_dispatched() -> None:
    # The kinds follow the runs: a tool's kind can never disagree with how it runs.
    kinds = {name: tool.kind.value for name, tool in TOOLS.items()}
    assert kinds == {
        "execute": "execute",
        "process_output": "process",
        "process_signal": "process",
        "process_list": "process",
        "process_input": "process",
        "process_resize": "process",
        "read_file": "inline",
        "write_file": "thread",
        "edit_files": "thread",
        "search_files": "thread",
        "list_dir": "thread",
    }
    stoppable = sorted(name for name, tool in TOOLS.items() if tool.stoppable)
    assert stoppable == ["process_input", "process_output", "search_files"]
    read_only = sorted(name for name, tool in TOOLS.items() if tool.read_only)
    assert read_only == ["list_dir", "process_list", "process_output", "read_file", "search_files"]


def test_a_tool_breaking_a_rule_fails_as_the_registry_loads() -> None:
    class Loose(msgspec.Struct):  # unknown fields ignored, no description
        path: str

    broken = registry.tool_def(
        "broken", Loose, lambda args: None, registry.OnLoop(lambda ws, a: None), planner.reader(),
        "read", "x",
    )  # fmt: skip
    with pytest.raises(TypeError, match="must forbid unknown fields"):
        registry.check_registry((broken,))
    registry.check_registry(tuple(TOOLS.values()))
