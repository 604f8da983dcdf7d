"""Tool call IDs derived from the conversation, so every retry of a tool call names it alike.

A tool call is identified by `(chat_id, call_id)` (PROTOCOL.md 2), and the agent runs each pair
at most once. That promise is only as good as the orchestrator's ids: a retry (a replica that
took over, a chat server that restarted mid-turn) must name the call exactly as the first try
did, without having stored anything. So the id is derived, not drawn: a UUIDv5 of the chat, the
assistant message that asked for the call, and the model provider's own tool call id, in the
same namespace as Coder's chatd, so toolwire and chatd agree on every id:

    >>> tool_call_id("11111111-1111-1111-1111-111111111111", "42", "call_1")
    'ca92e3e7-ee42-5889-b1df-75869f9117ee'

Provider ids are not always usable. Some providers send an empty id, and some repeat an id
within one message (parallel calls that all say `call_0`). Deriving an id from those would give
two different calls one id, and then each would get the other's saved result, so
`tool_call_ids` refuses them: it returns None for them, and the caller must pick another way to
name those calls (or not run them) rather than merge them.
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Sequence
from typing import Final

__all__ = ["TOOL_CALL_NAMESPACE", "tool_call_id", "tool_call_ids"]

# The UUIDv5 namespace of tool call ids: Coder's chatd uses this one, and sharing it is what
# makes ids derived by either side equal for the same (chat, message, provider call).
TOOL_CALL_NAMESPACE: Final = uuid.UUID("0af4d6d3-691c-45dd-ac54-55ea97970ebc")


def tool_call_id(chat_id: str, message_id: str, provider_call_id: str) -> str:
    """The call id of one provider tool call: UUIDv5 of `"<chat>/<message>/<provider call>"`.

    Deterministic: the same three strings give the same id on every host and every retry.
    The caller is responsible for not passing an empty or repeated provider id (see
    `tool_call_ids`, which checks a whole message at once).

    Raises ValueError if a part is not valid Unicode text (a lone surrogate, as a JSON escape
    like "\\ud800" can produce): it has no UTF-8 form to hash, and replacing it would let two
    different ids collide.
    """
    name = f"{chat_id}/{message_id}/{provider_call_id}"
    try:
        return str(uuid.uuid5(TOOL_CALL_NAMESPACE, name))
    except UnicodeEncodeError as exc:
        raise ValueError(f"tool call id parts must be valid Unicode text: {name!r}") from exc


def tool_call_ids(
    chat_id: str, message_id: str, provider_call_ids: Sequence[str]
) -> list[str | None]:
    """The call ids of every tool call of one assistant message, in order.

    None where the provider id is empty, and None for EVERY occurrence of a provider id that
    appears more than once in the message: calls sharing an id would get each other's saved
    responses (Coder's rule), and no occurrence is more entitled to the id than another.

    Raises ValueError if a provider id is not a str (a provider SDK that hands over None or an
    int is a bug to surface, not an id to stringify).
    """
    for index, provider_call_id in enumerate(provider_call_ids):
        if not isinstance(provider_call_id, str):
            raise ValueError(
                f"provider call id #{index} is {type(provider_call_id).__name__}, not str: "
                f"{provider_call_id!r}"
            )
    counts = Counter(provider_call_ids)
    return [
        tool_call_id(chat_id, message_id, pid) if pid and counts[pid] == 1 else None
        for pid in provider_call_ids
    ]
