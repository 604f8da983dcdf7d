"""The errors both client shells raise (the same classes, whichever event loop)."""

from __future__ import annotations

from toolwire.transport import protocol

__all__ = [
    "BadArgs",
    "BadWelcome",
    "CallConflict",
    "ConnectError",
    "ConnectionLost",
    "Detached",
    "MessageTooBig",
    "RequestError",
    "ToolwireClientError",
    "UnknownTool",
    "request_error",
    "retryable_status",
]


class ToolwireClientError(Exception):
    """Base class of every error this client raises."""


class ConnectError(ToolwireClientError):
    """The client could not connect. `status_code` is the HTTP status of a rejected handshake
    (401 wrong token, 404 wrong path, 400 unsupported subprotocol), or None when the agent was
    not reachable at all (then the cause is chained)."""

    def __init__(self, status_code: int | None, body: bytes = b"", detail: str = "") -> None:
        self.status_code = status_code
        self.body = body
        self.detail = detail
        if status_code is not None:
            text = body.decode("utf-8", "replace").strip()
            message = f"handshake rejected with HTTP {status_code}" + (f": {text}" if text else "")
        else:
            message = f"could not connect: {detail}"
        super().__init__(message)


class RequestError(ToolwireClientError):
    """The agent answered a request with `error` (PROTOCOL.md 6). Nothing was changed."""

    def __init__(self, code: str, message: str, error: protocol.Error | None = None) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.error = error


class BadArgs(RequestError):
    """`bad_args`: the args do not fit the tool (wrong type, missing or unknown argument). The
    call did not run; a framework hands the message back to the model to try again."""


class UnknownTool(RequestError):
    """`unknown_tool`: the agent has no tool of that name. The call did not run."""


class CallConflict(RequestError):
    """`conflict`: the call id was first used with another tool, other args or another
    sandbox. Nothing ran and the first call's record is untouched."""


_TYPED: dict[str, type[RequestError]] = {
    "bad_args": BadArgs,
    "unknown_tool": UnknownTool,
    "conflict": CallConflict,
}


def request_error(code: str, message: str, error: protocol.Error | None = None) -> RequestError:
    """The RequestError of an `error` reply, of the subclass its code has (BadArgs,
    UnknownTool, CallConflict), so a caller can catch what a model can fix by itself."""
    return _TYPED.get(code, RequestError)(code, message, error)


class ConnectionLost(ToolwireClientError):
    """The connection is gone and this request or handle cannot be resumed: the client was
    closed, `reconnect=False`, reconnecting was refused, or an `approve` was in flight."""


class Detached(ToolwireClientError):
    """The handle was detached (`Client.detach`): its call goes on, this client stopped
    following it."""


class MessageTooBig(ToolwireClientError, ValueError):
    """The request is larger than the agent's `limits.max_message_bytes`. It was not sent: the
    agent would close the connection with 1009, and re-sending after the reconnect would loop."""


class BadWelcome(Exception):
    """The agent's first message was not a `welcome` (a connection failure: reconnecting may
    reach a sane agent)."""


def retryable_status(status_code: int) -> bool:
    """Whether a rejected handshake may succeed later. 4xx says our request is wrong (token,
    path, subprotocol) and will stay wrong; retrying would hammer the agent for nothing.
    408/429 and 5xx (503 while it shuts down) pass."""
    return not (400 <= status_code < 500) or status_code in (408, 429)
