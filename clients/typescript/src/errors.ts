/** The errors the client raises (transport/client/errors.py, in TypeScript). */
import type * as P from "./protocol.js";

/** Base class of every error this client raises. */
export class ToolwireClientError extends Error {
  override name = "ToolwireClientError";
}

/**
 * The client could not connect. `statusCode` is the HTTP status of a rejected handshake (401
 * wrong token, 404 wrong path, 400 subprotocol, 403 Origin), or null when the agent was not
 * reachable at all (then `cause` says why).
 */
export class ConnectError extends ToolwireClientError {
  override name = "ConnectError";
  constructor(
    readonly statusCode: number | null,
    readonly body = "",
    detail = "",
    options?: { cause?: unknown },
  ) {
    super(
      statusCode !== null
        ? `handshake rejected with HTTP ${statusCode}${body.trim() ? `: ${body.trim()}` : ""}`
        : `could not connect: ${detail}`,
      options,
    );
  }
}

/** The agent answered a request with `error` (PROTOCOL.md 6). Nothing was changed. */
export class RequestError extends ToolwireClientError {
  override name = "RequestError";
  readonly code: P.Error["code"];
  readonly detail: string;
  constructor(readonly error: P.Error) {
    super(`${error.code}: ${error.message}`);
    this.code = error.code;
    this.detail = error.message;
  }
}

/**
 * The connection is gone and this request or handle cannot be resumed: the client was closed,
 * `reconnect: false`, reconnecting was refused, or an `approve` was in flight.
 */
export class ConnectionLost extends ToolwireClientError {
  override name = "ConnectionLost";
}

/** The handle was detached (`client.detach`): its call goes on, this client stopped following it. */
export class Detached extends ToolwireClientError {
  override name = "Detached";
}

/**
 * The request is larger than the agent's `limits.max_message_bytes`. It was not sent: the agent
 * would close the connection with 1009, and re-sending after the reconnect would loop.
 */
export class MessageTooBig extends ToolwireClientError {
  override name = "MessageTooBig";
}

/**
 * Whether a rejected handshake may succeed later: 4xx says our request is wrong (token, path,
 * subprotocol) and will stay wrong; 408, 429 and 5xx (503 while the agent shuts down) pass.
 */
export function retryableStatus(statusCode: number): boolean {
  return !(statusCode >= 400 && statusCode < 500) || statusCode === 408 || statusCode === 429;
}
