"""Encoders and decoders for both wire encodings, the subprotocol names, and the JSON Schema.

JSON travels in text frames (`toolwire.v1.json`), MessagePack in binary frames
(`toolwire.v1.msgpack`). One `Codec` per connection holds msgspec's reusable encoder and decoder
objects, which are several times faster than the module-level functions.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final, Literal

import msgspec

from toolwire.transport import protocol
from toolwire.transport.bounds import (
    MAX_WIRE_INT,
    MIN_WIRE_INT,
    TOO_DEEP,
    BoundsError,
    check_bounds,
    may_exceed_bounds,
)
from toolwire.transport.outline import outline

SUBPROTOCOL_JSON: Final = "toolwire.v1.json"
SUBPROTOCOL_MSGPACK: Final = "toolwire.v1.msgpack"
SUBPROTOCOLS: Final = {SUBPROTOCOL_JSON: "json", SUBPROTOCOL_MSGPACK: "msgpack"}

Encoding = Literal["json", "msgpack"]


class MessageError(Exception):
    """An undecodable or invalid message. `message` names the field path when msgspec knows it;
    `envelope` holds whatever of `rid`, `chat_id`, `call_id` could still be read, so the error
    reply can be matched to its request."""

    def __init__(self, message: str, envelope: dict[str, Any]) -> None:
        super().__init__(message)
        self.message = message
        self.envelope = envelope


class _Envelope(msgspec.Struct):
    # Everything typed `Any` so that this lenient second pass never fails on a bad field.
    rid: Any = None
    chat_id: Any = None
    call_id: Any = None


def choose_subprotocol(offered: list[str]) -> str | None:
    """The first offered subprotocol we support, else None (PROTOCOL.md 1)."""
    for name in offered:
        if name in SUBPROTOCOLS:
            return name
    return None


class Codec:
    """Encode agent->client messages and decode client->agent messages (or the reverse, for the
    client side: `Codec(encoding, side="client")`)."""

    def __init__(self, encoding: Encoding, side: Literal["agent", "client"] = "agent") -> None:
        self.encoding: Encoding = encoding
        incoming: Any = protocol.ClientMessage if side == "agent" else protocol.AgentMessage
        # Only the agent checks bounds: what it decodes comes from clients it does not control,
        # while a client decodes what the agent's own encoder made.
        self._checks_bounds = side == "agent"
        self._json_any = msgspec.json.Decoder()
        self._msgpack_any = msgspec.msgpack.Decoder()
        self._json_envelope = msgspec.json.Decoder(_Envelope)
        self._msgpack_envelope = msgspec.msgpack.Decoder(_Envelope)
        self._json_decoder = msgspec.json.Decoder(incoming)
        self._msgpack_decoder = msgspec.msgpack.Decoder(incoming)
        self._encoder: msgspec.json.Encoder | msgspec.msgpack.Encoder = (
            msgspec.json.Encoder() if encoding == "json" else msgspec.msgpack.Encoder()
        )
        # One protocol message as a WebSocket message's payload: UTF-8 JSON (always valid:
        # msgspec refuses lone surrogates) for a text frame, or MessagePack for a binary one.
        # The encoder's own method, not one of this class that calls it: the sender encodes
        # every message through it (one Python call fewer per message).
        self.encode_bytes: Callable[[msgspec.Struct], bytes] = self._encoder.encode

    def encode(self, message: msgspec.Struct) -> str | bytes:
        """One protocol message as one WebSocket message: str for JSON, bytes for msgpack."""
        data = self._encoder.encode(message)
        if self.encoding == "json":
            # msgspec emits UTF-8 bytes; a text frame needs str. Decoding valid UTF-8 is cheap.
            return data.decode()
        return data

    def decode(self, frame: str | bytes, may_exceed: bool | None = None) -> Any:
        """Decode one WebSocket message into a protocol Struct, or raise MessageError. A value
        out of the bounds of PROTOCOL.md 9.9 anywhere in it (unknown fields included) makes
        the whole message invalid, before anything acts on it. `may_exceed`: the answer of
        `may_exceed_bounds(frame)` where the caller has it already (it scans a big frame in
        pieces, `may_exceed_bounds_in_pieces`)."""
        try:
            if self.encoding == "json":
                if not isinstance(frame, str):
                    raise MessageError("toolwire.v1.json takes text frames, not binary ones", {})
                if self._checks_bounds and (
                    may_exceed_bounds(frame) if may_exceed is None else may_exceed
                ):
                    self._check_bounds(self._json_any.decode(frame))
                message = self._json_decoder.decode(frame)
            else:
                if not isinstance(frame, bytes):
                    raise MessageError("toolwire.v1.msgpack takes binary frames, not text ones", {})
                if self._checks_bounds and (
                    may_exceed_bounds(frame) if may_exceed is None else may_exceed
                ):
                    self._check_bounds(self._msgpack_any.decode(frame))
                message = self._msgpack_decoder.decode(frame)
        except msgspec.DecodeError as exc:
            raise MessageError(str(exc), self._envelope(frame)) from None
        except RecursionError:
            # msgspec's own decoder gives up near Python's recursion limit, far past ours, and
            # takes the top-level fields down with it: the iterative reader still finds them
            # (the `rid` at level 1 of a frame 1,000 deep is echoed) and where it is too deep.
            found = outline(frame)
            where = found.too_deep_at
            raise MessageError(
                str(BoundsError(TOO_DEEP, where)) if where is not None else TOO_DEEP,
                _envelope_of(found.fields),
            ) from None
        if self._checks_bounds:
            where = protocol.bad_id_path(message)
            if where is not None:
                raise MessageError(
                    f"ids hold printable characters only (no control, format or line "
                    f"separator characters, a trailing newline included) - at `{where}`",
                    _envelope_of(msgspec.to_builtins(message)),
                )
        return message

    def _check_bounds(self, generic: Any) -> None:
        try:
            check_bounds(generic)
        except BoundsError as exc:
            raise MessageError(str(exc), _envelope_of(generic)) from None

    def _envelope(self, frame: str | bytes) -> dict[str, Any]:
        try:
            if isinstance(frame, str):
                env = self._json_envelope.decode(frame)
            else:
                env = self._msgpack_envelope.decode(frame)
        except msgspec.DecodeError:
            return {}
        except RecursionError:  # a frame too deep for msgspec even to skip its unknown fields
            return _envelope_of(outline(frame).fields)
        return _envelope_of({"rid": env.rid, "chat_id": env.chat_id, "call_id": env.call_id})


def _envelope_of(generic: Any) -> dict[str, Any]:
    """What of `rid`, `chat_id`, `call_id` a generically decoded message holds, with the right
    types, for matching an error reply to its request."""
    if not isinstance(generic, dict):
        return {}
    found: dict[str, Any] = {}
    rid = generic.get("rid")
    if isinstance(rid, str) or (
        isinstance(rid, int) and not isinstance(rid, bool) and MIN_WIRE_INT <= rid <= MAX_WIRE_INT
    ):
        found["rid"] = rid  # an out-of-range rid is not echoed: no encoder could send it
    for name in ("chat_id", "call_id"):
        value = generic.get(name)
        if isinstance(value, str):
            found[name] = value
    return found


def json_schema() -> dict[str, Any]:
    """The JSON Schema of both directions, as `toolwire schema` prints it."""
    (client_schema, agent_schema), components = msgspec.json.schema_components(
        [protocol.ClientMessage, protocol.AgentMessage], ref_template="#/$defs/{name}"
    )
    components["ClientToAgent"] = {
        "description": "A message a client sends to the agent.",
        **client_schema,
    }
    components["AgentToClient"] = {
        "description": "A message the agent sends to a client.",
        **agent_schema,
    }
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "toolwire wire protocol v1",
        "description": "One WebSocket message carries one object with a `type` field.",
        "oneOf": [{"$ref": "#/$defs/ClientToAgent"}, {"$ref": "#/$defs/AgentToClient"}],
        "$defs": components,
    }
