"""Args against a tool's `input_schema` (PROTOCOL.md 10.3), checked by the client (pure).

The agent's schemas are exact: args valid against one are never refused as `bad_args` for
their shape, and args it rejects always are. A `call` hears `bad_args` as an `error`, but a call
inside a `turn` fails on its own with a `failed` result (5.6), which a framework cannot tell
from a tool that failed. So the batch executor checks each call's args here first, and a call
they do not fit raises BadArgs for the model to fix, as a single call would.

Only the JSON Schema 2020-12 keywords the agent's schemas use are understood (`type`,
`properties`, `required`, `additionalProperties`, `items`, `minItems`, `enum`, `anyOf`,
`minimum`, `maximum`, `minLength`, `pattern`); the rest (`description`, `default`) say nothing
about validity. tests/test_arg_check.py holds it to an independent validator on every tool.
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["schema_error"]


def schema_error(schema: dict[str, Any], value: Any, path: str = "args") -> str | None:
    """Why `value` does not fit `schema` (naming the path, e.g. "args.pty.rows: ..."), or None
    when it does."""
    types = schema.get("type")
    if types is not None:
        names = [types] if isinstance(types, str) else list(types)
        if not any(_is_type(value, name) for name in names):
            return f"{path}: expected {' or '.join(names)}, got {_type_name(value)}"
    if "enum" in schema and not any(_same(value, option) for option in schema["enum"]):
        return f"{path}: must be one of {schema['enum']!r}"
    if "anyOf" in schema:
        reasons = [schema_error(branch, value, path) for branch in schema["anyOf"]]
        if all(reason is not None for reason in reasons):
            return next(r for r in reasons if r is not None)
    if _is_number(value):
        if "minimum" in schema and value < schema["minimum"]:
            return f"{path}: must be >= {schema['minimum']}"
        if "maximum" in schema and value > schema["maximum"]:
            return f"{path}: must be <= {schema['maximum']}"
    if isinstance(value, str):
        if len(value) < schema.get("minLength", 0):
            return f"{path}: must be at least {schema['minLength']} characters"
        if "pattern" in schema and re.search(schema["pattern"], value) is None:
            return f"{path}: does not match the pattern {schema['pattern']!r}"
    if isinstance(value, list):
        if len(value) < schema.get("minItems", 0):
            return f"{path}: must have at least {schema['minItems']} items"
        items = schema.get("items")
        if isinstance(items, dict):
            for index, item in enumerate(value):
                reason = schema_error(items, item, f"{path}[{index}]")
                if reason is not None:
                    return reason
    if isinstance(value, dict):
        return _object_error(schema, value, path)
    return None


def _object_error(schema: dict[str, Any], value: dict[str, Any], path: str) -> str | None:
    for name in schema.get("required", ()):
        if name not in value:
            return f"{path}.{name}: is required"
    properties: dict[str, Any] = schema.get("properties", {})
    extra = schema.get("additionalProperties", True)
    for name, item in value.items():
        sub = properties.get(name)
        if sub is None:
            if extra is False:
                return f"{path}.{name}: is not an argument of this tool"
            if isinstance(extra, dict):
                sub = extra
            else:
                continue
        reason = schema_error(sub, item, f"{path}.{name}")
        if reason is not None:
            return reason
    return None


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _is_type(value: Any, name: str) -> bool:
    if name == "integer":
        # JSON Schema counts the mathematical value: 3.0 is an integer.
        return _is_number(value) and (isinstance(value, int) or float(value).is_integer())
    if name == "number":
        return _is_number(value)
    return isinstance(value, _TYPES[name]) and not (name != "boolean" and isinstance(value, bool))


_TYPES: dict[str, type | tuple[type, ...]] = {
    "object": dict,
    "array": list,
    "string": str,
    "boolean": bool,
    "null": type(None),
}


def _type_name(value: Any) -> str:
    for name in ("null", "boolean", "integer", "number", "string", "array", "object"):
        if _is_type(value, name):
            return name
    return type(value).__name__


def _same(value: Any, option: Any) -> bool:
    """JSON equality: true is not 1, 1 is 1.0."""
    if isinstance(value, bool) or isinstance(option, bool):
        return isinstance(value, bool) and isinstance(option, bool) and value == option
    return bool(value == option) and _is_number(value) == _is_number(option)
