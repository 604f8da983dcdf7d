"""The published schema and the message reference must match the code."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec

from toolwire.cli.main import main, schema_text
from toolwire.transport import protocol, reference

DOCS = Path(__file__).resolve().parent.parent / "docs"


def test_schema_file_is_current() -> None:
    stale = (DOCS / "protocol.schema.json").read_text() != schema_text()
    assert not stale, "docs/protocol.schema.json is stale: run `toolwire schema --out` on it"


def test_schema_command_prints_both_directions(capsys: object) -> None:
    assert main(["schema"]) == 0
    schema = json.loads(capsys.readouterr().out)  # type: ignore[attr-defined]
    client = {ref["$ref"].rsplit("/", 1)[1] for ref in schema["$defs"]["ClientToAgent"]["anyOf"]}
    agent = {ref["$ref"].rsplit("/", 1)[1] for ref in schema["$defs"]["AgentToClient"]["anyOf"]}
    assert client == {c.__name__ for c in protocol.CLIENT_MESSAGE_TYPES}
    assert agent == {c.__name__ for c in protocol.AGENT_MESSAGE_TYPES}


def test_message_reference_is_current() -> None:
    text = (DOCS / "protocol.md").read_text()
    start = text.index(reference.BEGIN)
    end = text.index(reference.END) + len(reference.END)
    stale = text[start:end] != reference.render()
    assert not stale, "docs/protocol.md is stale: run `toolwire schema --doc docs/protocol.md`"


def test_every_message_type_has_a_decodable_example() -> None:
    for union, classes in (
        (protocol.ClientMessage, protocol.CLIENT_MESSAGE_TYPES),
        (protocol.AgentMessage, protocol.AGENT_MESSAGE_TYPES),
    ):
        for cls in classes:
            tag = msgspec.inspect.type_info(cls).tag  # type: ignore[attr-defined]
            example = reference.EXAMPLES[tag]
            decoded = msgspec.json.decode(json.dumps(example), type=union)
            assert type(decoded) is cls
            # Re-encoding gives the example back: no field is renamed or silently dropped.
            assert msgspec.json.decode(msgspec.json.encode(decoded)) == {
                k: v for k, v in example.items() if v is not None
            } | {k: v for k, v in example.items() if k in _always_present(cls)}


def _always_present(cls: type) -> set[str]:
    info = msgspec.inspect.type_info(cls)
    return {f.encode_name for f in info.fields if f.required}  # type: ignore[attr-defined]
