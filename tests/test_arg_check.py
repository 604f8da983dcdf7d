"""The client's args check (transport/client/arg_check.py) agrees with an independent JSON
Schema 2020-12 validator on every tool's input_schema, so a batch refuses as BadArgs exactly
the args the agent would refuse for their shape (PROTOCOL.md 10.3)."""

from __future__ import annotations

from typing import Any

import jsonschema
import pytest
from hypothesis import given
from hypothesis import strategies as st

from toolwire.actors.tools.registry import TOOLS, input_schema
from toolwire.transport.client.arg_check import schema_error

SCHEMAS = {name: input_schema(tool) for name, tool in TOOLS.items()}

SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 70000),
    st.sampled_from([0.0, 1.0, 2.5, -1.0, 3.0]),
    st.sampled_from(["", "a", "sh", "bash", "SIGTERM", "absent", "a" * 64, "0" * 64, "x\n"]),
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(
            st.sampled_from(["path", "edits", "old", "new", "rows", "cols", "x"]), inner, max_size=3
        ),
    ),
    max_leaves=8,
)


def args_for(name: str) -> st.SearchStrategy[dict[str, Any]]:
    keys = [*SCHEMAS[name].get("properties", {}), "unknown_arg"]
    return st.dictionaries(st.sampled_from(keys), VALUES, max_size=len(keys))


@pytest.mark.parametrize("name", sorted(SCHEMAS))
@given(data=st.data())
def test_the_check_agrees_with_jsonschema(name: str, data: st.DataObject) -> None:
    args = data.draw(args_for(name))
    expected = jsonschema.Draft202012Validator(SCHEMAS[name]).is_valid(args)
    reason = schema_error(SCHEMAS[name], args)
    assert (reason is None) == expected, (args, reason)


@pytest.mark.parametrize(
    ("tool", "args", "path"),
    [
        ("read_file", {"path": "a", "limit": 0}, "args.limit"),
        ("read_file", {"path": "a", "ofset": 3}, "args.ofset"),
        ("read_file", {}, "args.path"),
        ("execute", {"command": "true", "pty": {"rows": 24, "cols": 80, "x": 1}}, "args.pty.x"),
        ("execute", {"command": True}, "args.command"),
        ("list_dir", {"depth": 9}, "args.depth"),
    ],
)
def test_a_refusal_names_the_argument(tool: str, args: dict[str, Any], path: str) -> None:
    reason = schema_error(SCHEMAS[tool], args)
    assert reason is not None and reason.startswith(path + ":"), reason


def test_valid_args_pass() -> None:
    assert schema_error(SCHEMAS["read_file"], {"path": "a", "offset": 1.0}) is None
    assert schema_error(SCHEMAS["execute"], {"command": "ls", "shell": "bash"}) is None
