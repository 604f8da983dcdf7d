"""transport/ids.py: the published vector, empty and repeated provider ids, and properties."""

from __future__ import annotations

import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st

from toolwire.transport.ids import TOOL_CALL_NAMESPACE, tool_call_id, tool_call_ids

CHAT = "11111111-1111-1111-1111-111111111111"
VECTOR = "ca92e3e7-ee42-5889-b1df-75869f9117ee"


def test_published_vector() -> None:
    # docs/protocol.md and Coder's chatd publish this vector; both sides must agree on it.
    assert uuid.UUID("0af4d6d3-691c-45dd-ac54-55ea97970ebc") == TOOL_CALL_NAMESPACE
    assert tool_call_id(CHAT, "42", "call_1") == VECTOR
    assert tool_call_ids(CHAT, "42", ["call_1"]) == [VECTOR]


def test_ids_are_uuid5_strings() -> None:
    parsed = uuid.UUID(tool_call_id("c", "m", "p"))
    assert parsed.version == 5
    assert str(parsed) == tool_call_id("c", "m", "p")


def test_empty_provider_ids_get_none() -> None:
    assert tool_call_ids(CHAT, "42", ["", "call_1", ""]) == [None, VECTOR, None]
    assert tool_call_ids(CHAT, "42", []) == []


def test_every_occurrence_of_a_repeated_provider_id_gets_none() -> None:
    ids = tool_call_ids(CHAT, "42", ["call_0", "call_1", "call_0", "call_2", "call_0"])
    assert ids == [None, VECTOR, None, tool_call_id(CHAT, "42", "call_2"), None]


def test_a_repeat_in_another_message_is_fine() -> None:
    # Repeats only matter within one message: the message id already separates the calls.
    first = tool_call_ids(CHAT, "1", ["call_0"])
    second = tool_call_ids(CHAT, "2", ["call_0"])
    assert first[0] is not None and second[0] is not None and first != second


@pytest.mark.parametrize("bad", [None, 7, b"call_1"])
def test_a_provider_id_that_is_not_a_str_is_a_value_error(bad: object) -> None:
    with pytest.raises(ValueError, match="not str"):
        tool_call_ids(CHAT, "42", ["call_1", bad])  # type: ignore[list-item]


def test_a_lone_surrogate_is_a_value_error() -> None:
    # JSON allows "\ud800"; such a string has no UTF-8 form, so no id can be derived from it.
    with pytest.raises(ValueError, match="valid Unicode"):
        tool_call_id(CHAT, "42", "call_\ud800")
    with pytest.raises(ValueError, match="valid Unicode"):
        tool_call_ids(CHAT, "42", ["call_\ud800"])


texts = st.text(alphabet=st.characters(blacklist_categories=["Cs"]), max_size=40)


@given(texts, texts, texts)
def test_deterministic(chat_id: str, message_id: str, provider_call_id: str) -> None:
    first = tool_call_id(chat_id, message_id, provider_call_id)
    assert first == tool_call_id(chat_id, message_id, provider_call_id)
    assert first == str(
        uuid.uuid5(TOOL_CALL_NAMESPACE, f"{chat_id}/{message_id}/{provider_call_id}")
    )


# "/" separates the parts, so ("a/b", "c") and ("a", "b/c") are the same name by design (it is
# Coder's scheme). Distinctness is promised for parts without "/" (UUIDs, message numbers,
# provider ids like "call_abc" or "toolu_01...").
parts = st.text(
    alphabet=st.characters(blacklist_characters="/", blacklist_categories=["Cs"]), max_size=30
)


@given(st.tuples(parts, parts, parts), st.tuples(parts, parts, parts))
def test_distinct_inputs_give_distinct_ids(
    a: tuple[str, str, str], b: tuple[str, str, str]
) -> None:
    if a != b:
        assert tool_call_id(*a) != tool_call_id(*b)


@given(st.lists(st.text(alphabet="abc_", max_size=3), max_size=12))
def test_tool_call_ids_matches_its_rule(provider_call_ids: list[str]) -> None:
    ids = tool_call_ids(CHAT, "m", provider_call_ids)
    assert len(ids) == len(provider_call_ids)
    for pid, got in zip(provider_call_ids, ids, strict=True):
        usable = pid != "" and provider_call_ids.count(pid) == 1
        assert got == (tool_call_id(CHAT, "m", pid) if usable else None)
    derived = [i for i in ids if i is not None]
    assert len(derived) == len(set(derived))
