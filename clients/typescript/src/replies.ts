/**
 * How each message from the agent changes the client's tables (transport/client/replies.py;
 * pure): a reply by `rid` resolves our request, a call event goes to the call's handle (once per
 * byte, once per event), an approval to the approvals stream.
 */
import { RequestError } from "./errors.js";
import type { CallHandle, Mailbox, TurnHandle } from "./handles.js";
import type * as P from "./protocol.js";
import { keyOf, type Key, type RequestState } from "./requests.js";

/** Unmatched `error` messages kept; the oldest go first. */
export const MAX_KEPT_ERRORS = 1000;

/** The part of `ClientState` a message from the agent reads and changes. */
export interface ReplyTables {
  /** The current connection: events count only on it. */
  readonly gen: number;
  readonly pending: Map<number, RequestState>;
  readonly handles: Map<Key, CallHandle>;
  readonly turns: Map<Key, TurnHandle>;
  readonly openGates: Set<Key>;
  readonly approvals: Mailbox<P.Approval>;
  readonly errors: P.Error[];
}

type CallEventMessage = P.Output | P.Started | P.ResultMessage | P.Approval | P.ApprovalResolved;

/** Route one decoded agent message. */
export function apply(state: ReplyTables, message: P.AgentToClient): void {
  const rid = "rid" in message && typeof message.rid === "number" ? message.rid : null;
  const request = rid !== null ? state.pending.get(rid) : undefined;
  switch (message.type) {
    case "output":
    case "started":
    case "result":
    case "approval":
    case "approval_resolved":
      onCallEvent(state, message);
      return;
    case "accepted":
      if (request !== undefined && request.handle !== null) {
        state.pending.delete(request.rid);
        request.handle.feedAccepted(message, state.gen);
        request.finish();
      } else if (message.rid === undefined || message.rid === null) {
        // A call of a turn: "as if sent as a call" (5.0).
        state.handles.get(keyOf(message.chat_id, message.call_id))?.feedAccepted(message, state.gen);
      }
      return;
    case "cancel_result":
      if (request !== undefined && request.kind === "cancel") {
        request.cancelResults.set(message.call_id, message);
        if (request.cancelIds.every((id) => request.cancelResults.has(id))) {
          state.pending.delete(request.rid);
          request.finish();
        }
      }
      return;
    case "turn_plan":
      state.turns.get(keyOf(message.chat_id, message.turn_id))?.feedPlan(message.segments);
      if (request !== undefined && request.kind === "turn") {
        state.pending.delete(request.rid);
        request.finish();
      }
      return;
    case "turn_result": {
      const key = keyOf(message.chat_id, message.turn_id);
      const ended = state.turns.get(key);
      state.turns.delete(key);
      ended?.feedResults(message.results);
      return;
    }
    case "interrupted":
      if (request !== undefined && request.kind === "interrupt") {
        state.pending.delete(request.rid);
        request.interrupted = message;
        request.finish();
      }
      return;
    case "chat_closed":
      if (request !== undefined && request.kind === "close_chat") {
        state.pending.delete(request.rid);
        request.chatClosed = message;
        request.finish();
      }
      return;
    case "tool_definitions":
      if (request !== undefined && request.kind === "describe_tools") {
        state.pending.delete(request.rid);
        request.toolDefinitions = message;
        request.finish();
      }
      return;
    case "error":
      onError(state, message, request);
      return;
    default:
      // A `welcome` is only the first message of a connection (the shell reads it); a type a
      // newer agent sends that we do not know is skipped.
      return;
  }
}

function onCallEvent(state: ReplyTables, message: CallEventMessage): void {
  const key = keyOf(message.chat_id, message.call_id);
  if (message.type === "approval") {
    if (!state.openGates.has(key)) {
      state.openGates.add(key);
      state.approvals.put(message);
    }
  } else if (message.type === "approval_resolved") {
    state.openGates.delete(key);
    gateClosed(state, key, message);
  } else if (message.type === "result") {
    state.openGates.delete(key);
  }
  const handle = state.handles.get(key);
  // Events count only after this connection accepted the handle's request: anything earlier
  // belongs to an earlier request for the same call (an ended handle).
  if (handle === undefined || handle.liveGen !== state.gen) return;
  handle.feedEvent(message);
  if (handle.done) state.handles.delete(key);
}

/**
 * An `approve` of ours is answered by the `approval_resolved` carrying our decision (there is
 * no direct reply). Another decision closed the gate first if it differs: then our error
 * (`not_parked`) is on its way.
 */
function gateClosed(state: ReplyTables, key: Key, message: P.ApprovalResolved): void {
  for (const request of [...state.pending.values()]) {
    if (request.kind !== "approve" || request.sentGen === null) continue;
    const approve = request.message as P.Approve;
    if (keyOf(approve.chat_id, approve.call_id) !== key) continue;
    if (message.decision === (approve.approved ? "approved" : "denied")) {
      state.pending.delete(request.rid);
      request.resolved = message;
      request.finish();
    }
  }
}

function onError(state: ReplyTables, message: P.Error, request: RequestState | undefined): void {
  if (request === undefined) {
    state.errors.push(message);
    state.errors.splice(0, Math.max(0, state.errors.length - MAX_KEPT_ERRORS));
    return;
  }
  state.pending.delete(request.rid);
  const error = new RequestError(message);
  for (const handle of request.created) {
    if (!handle.wasAccepted) {
      const key = keyOf(handle.chatId, handle.callId);
      if (state.handles.get(key) === handle) state.handles.delete(key);
      handle.feedFailure(error);
    }
  }
  if (request.internal && request.handle !== null) {
    // A re-attach failed (the agent no longer knows the call): the handle cannot end.
    const key = keyOf(request.handle.chatId, request.handle.callId);
    if (state.handles.get(key) === request.handle) state.handles.delete(key);
    request.handle.feedFailure(error);
  }
  const turn = request.turn;
  if (turn !== null && (turn.segments === null || request.internal)) {
    const key = keyOf(turn.chatId, turn.turnId);
    if (state.turns.get(key) === turn) state.turns.delete(key);
    turn.feedFailure(error);
  }
  request.finish(error);
}
