/**
 * ClientState: every decision of the client, sans-IO (no sockets, no timers), mirroring
 * transport/client/state.py. The shell (client.ts) feeds it what happens (a connection opened
 * with a `welcome`, a frame arrived, the connection was lost, the caller sent a request or gave
 * up on one) and carries out what it returns (a frame to send now, or none; a delay before
 * reconnecting, or stop). It holds the rids, the pending requests, the call and turn handles,
 * what a new connection must follow again and re-send, in which order and from which byte
 * offset, what fails when, and when to reconnect. replies.ts says how each agent message
 * resolves a request or feeds a handle; requests.ts holds the request record and the backoff.
 */
import { utf8Length } from "./cursor.js";
import { ConnectError, ConnectionLost, Detached, MessageTooBig, retryableStatus } from "./errors.js";
import { CallHandle, Flag, Mailbox, TurnHandle } from "./handles.js";
import type * as P from "./protocol.js";
import { apply } from "./replies.js";
import {
  MAX_BACKOFF_ATTEMPT,
  RequestState,
  SUBSCRIBING,
  backoffDelay,
  keyOf,
  type Key,
  type Kind,
} from "./requests.js";

export interface StateOptions {
  reconnect?: boolean;
  backoffInitialMs?: number;
  backoffMaxMs?: number;
  random?: () => number;
}

/** What the shell does after a connection (attempt) ended: wait `delayMs`, then attempt `attempt`. */
export interface ReconnectPlan {
  delayMs: number;
  attempt: number;
}

/** Decode one agent frame; null for what is not a protocol message (a newer agent's, skipped). */
export function decodeFrame(frame: string): P.AgentToClient | null {
  let message: unknown;
  try {
    message = JSON.parse(frame);
  } catch {
    return null;
  }
  if (typeof message !== "object" || message === null || Array.isArray(message)) return null;
  if (typeof (message as { type?: unknown }).type !== "string") return null;
  return message as P.AgentToClient;
}

/** The state of one logical connection to an agent (PROTOCOL.md), across reconnects. */
export class ClientState {
  reconnect: boolean;
  readonly backoffInitialMs: number;
  readonly backoffMaxMs: number;
  private readonly random: () => number;
  /** Successful connects, the first included. */
  connections = 0;
  /** Errors that answer no request of ours (the newest 1,000). */
  readonly errors: P.Error[] = [];
  welcome: P.Welcome | null = null;
  /** A connection is open. */
  live = false;
  /** Connected and resubscribed: requests may go out directly. */
  ready = false;
  /** Bumps on every connect; events count only on the current one. */
  gen = 0;
  readonly pending = new Map<number, RequestState>();
  readonly handles = new Map<Key, CallHandle>();
  readonly turns = new Map<Key, TurnHandle>();
  readonly openGates = new Set<Key>();
  readonly approvals = new Mailbox<P.Approval>();
  closing = false;
  fatal: unknown = null;
  /** Replaced after each connect (and set when the client stops). */
  connectionChanged = new Flag();
  private nextRidValue = 1;

  constructor(options: StateOptions = {}) {
    this.reconnect = options.reconnect ?? true;
    this.backoffInitialMs = options.backoffInitialMs ?? 100;
    this.backoffMaxMs = options.backoffMaxMs ?? 5000;
    this.random = options.random ?? Math.random;
    if (!(this.backoffInitialMs > 0 && this.backoffMaxMs >= this.backoffInitialMs)) {
      throw new RangeError("need 0 < backoffInitialMs <= backoffMaxMs");
    }
  }

  // -- requests ----------------------------------------------------------------------------

  checkUsable(): void {
    if (this.fatal !== null) {
      throw new ConnectionLost(`the client cannot send: ${String(this.fatal)}`, { cause: this.fatal });
    }
  }

  nextRid(): number {
    return this.nextRidValue++;
  }

  private request(kind: Kind, message: P.ClientToAgent & { rid?: unknown }): RequestState {
    return new RequestState(message.rid as number, kind, message);
  }

  call(message: P.Call): RequestState {
    const offset = message.from_offset ?? 0;
    const [handle, created] = this.handleFor(message.chat_id, message.call_id, message.stream ?? true, offset);
    const request = this.request("call", message);
    request.handle = handle;
    if (created) request.created = [handle];
    return request;
  }

  attach(chatId: string, callId: string, fromOffset: number, stream: boolean): RequestState {
    const message: P.Attach = {
      type: "attach",
      rid: this.nextRid(),
      chat_id: chatId,
      call_id: callId,
      from_offset: fromOffset,
    };
    const [handle, created] = this.handleFor(chatId, callId, stream, fromOffset);
    const request = this.request("attach", message);
    request.handle = handle;
    if (created) request.created = [handle];
    return request;
  }

  cancel(chatId: string, ids: string[]): RequestState {
    const message: P.Cancel = { type: "cancel", rid: this.nextRid(), chat_id: chatId, call_ids: [...ids] };
    const request = this.request("cancel", message);
    request.cancelIds = ids;
    return request;
  }

  approve(message: P.Approve): RequestState {
    return this.request("approve", message);
  }

  interrupt(chatId: string, turnId: string | null): RequestState {
    return this.request("interrupt", {
      type: "interrupt",
      rid: this.nextRid(),
      chat_id: chatId,
      turn_id: turnId,
    });
  }

  closeChat(chatId: string): RequestState {
    return this.request("close_chat", { type: "close_chat", rid: this.nextRid(), chat_id: chatId });
  }

  /** PROTOCOL.md 10.3. Changes nothing on the agent: re-sent as it is after a reconnect. */
  describeTools(): RequestState {
    return this.request("describe_tools", { type: "describe_tools", rid: this.nextRid() });
  }

  /**
   * A repeat of a turn this client follows attaches it (plan again, the same calls' events): our
   * handles follow them already, and an error (a `conflict`) fails only this request.
   */
  turn(message: P.Turn): [RequestState, TurnHandle] {
    const existing = this.turns.get(keyOf(message.chat_id, message.turn_id));
    if (existing !== undefined && !existing.done) return [this.request("turn", message), existing];
    const turn = new TurnHandle(message.chat_id, message.turn_id, message);
    const created: CallHandle[] = [];
    if (turn.stream) {
      for (const spec of message.calls) {
        const [handle, isNew] = this.handleFor(message.chat_id, spec.call_id, true, 0);
        turn.calls.set(spec.call_id, handle);
        if (isNew) created.push(handle);
      }
    }
    const request = this.request("turn", message);
    request.turn = turn;
    request.created = created;
    return [request, turn];
  }

  /**
   * Stop following a call: its handle fails with `Detached`. Returns the `detach` frame to send
   * now, or null (between connections the new one does not follow it anyway).
   */
  detach(chatId: string, callId: string): string | null {
    this.checkUsable();
    const key = keyOf(chatId, callId);
    const handle = this.handles.get(key);
    this.handles.delete(key);
    handle?.feedFailure(new Detached(`detached from ${chatId}/${callId}`));
    if (!(this.live && this.ready)) return null;
    return JSON.stringify({ type: "detach", rid: this.nextRid(), chat_id: chatId, call_id: callId });
  }

  /** The unfinished handle of a call, or a new one (registered on send). */
  private handleFor(chatId: string, callId: string, stream: boolean, offset: number): [CallHandle, boolean] {
    const handle = this.handles.get(keyOf(chatId, callId));
    if (handle !== undefined && !handle.done) {
      handle.stream = handle.stream || stream;
      return [handle, false];
    }
    return [new CallHandle(chatId, callId, { stream, offset }), true];
  }

  encodeChecked(message: P.ClientToAgent): string {
    const frame = JSON.stringify(message);
    const limit = this.welcome?.limits.max_message_bytes;
    if (limit !== undefined) {
      const size = utf8Length(frame);
      if (size > limit) {
        throw new MessageTooBig(
          `${message.type} message of ${size} bytes exceeds the agent's max_message_bytes (${limit})`,
        );
      }
    }
    return frame;
  }

  /**
   * The caller sends `request`: check it, encode it, and track it and its handles. Throws
   * ConnectionLost or MessageTooBig, and then nothing was registered.
   */
  register(request: RequestState): void {
    this.checkUsable();
    request.frame = this.encodeChecked(request.message);
    this.pending.set(request.rid, request);
    for (const handle of request.created) this.handles.set(keyOf(handle.chatId, handle.callId), handle);
    if (request.turn !== null) this.turns.set(keyOf(request.turn.chatId, request.turn.turnId), request.turn);
  }

  /** The caller stopped waiting: forget what only this request wanted. */
  abandon(request: RequestState): void {
    this.pending.delete(request.rid);
    for (const handle of request.created) {
      const key = keyOf(handle.chatId, handle.callId);
      if (this.handles.get(key) === handle && !handle.wasAccepted) this.handles.delete(key);
    }
    const turn = request.turn;
    if (turn !== null && turn.segments === null) {
      const key = keyOf(turn.chatId, turn.turnId);
      if (this.turns.get(key) === turn) this.turns.delete(key);
    }
  }

  /**
   * The frame to send for `request` on the current connection now, or null: between
   * connections, or while resubscribing (unless `force`), the resubscribe pass sends it.
   */
  frameToSend(request: RequestState, force = false): string | null {
    if (!this.live || !(this.ready || force)) return null;
    request.sentGen = this.gen;
    let frame = request.frame;
    request.frame = null;
    if (frame === null) {
      try {
        frame = this.encodeChecked(request.message);
      } catch (error) {
        if (!(error instanceof MessageTooBig)) throw error;
        this.pending.delete(request.rid); // the new agent has a smaller limit
        request.finish(error);
        return null;
      }
    }
    return frame;
  }

  // -- connections ---------------------------------------------------------------------------

  /** A connection opened with `welcome`; returns its generation (for `resubscribe`). */
  onConnected(welcome: P.Welcome): number {
    this.gen += 1;
    this.live = true;
    this.welcome = welcome;
    this.connections += 1;
    // Nothing to resume (the first connection): requests may go out at once.
    this.ready = this.pending.size === 0 && this.handles.size === 0 && this.turns.size === 0;
    this.connectionChanged.set();
    this.connectionChanged = new Flag();
    return this.gen;
  }

  /**
   * The connection is gone. `approve` is not idempotent, so one in flight fails: it may or may
   * not have been applied. Everything else waits for the next connection.
   */
  onDisconnected(): void {
    if (!this.live) return;
    this.live = false;
    this.ready = false;
    for (const request of [...this.pending.values()]) {
      if (request.kind === "approve" && request.sentGen !== null) {
        this.pending.delete(request.rid);
        request.finish(
          new ConnectionLost(
            "the connection was lost while an approve was in flight; it may or may not have " +
              "been applied (the call's events and result will tell)",
          ),
        );
      }
    }
  }

  /**
   * The next requests to send on connection `gen` (each through `resendFrame`), or null once
   * nothing is left: then requests go out directly again (`ready`). Until then new requests are
   * left to this pass, which sends them after the older ones, so everything goes out in request
   * order (a `cancel` of an id followed by a `call` of it is a call that must not run). The
   * first pass also follows again every unfinished turn and call that no unsent request covers:
   * the turns first (a re-sent `turn` moves each call's cursor back to 0), then the attaches,
   * which move it forward to what we have.
   */
  resubscribe(gen: number, first: boolean): RequestState[] | null {
    if (gen !== this.gen || this.closing) return null;
    const unsent = [...this.pending.values()].filter((r) => r.sentGen !== gen).sort((a, b) => a.rid - b.rid);
    if (!first && unsent.length === 0) {
      this.ready = true;
      return null;
    }
    if (!first) return unsent;
    const covered = new Set<unknown>(
      unsent.filter((r) => SUBSCRIBING.has(r.kind)).map((r) => r.handle ?? r.turn),
    );
    const refollow: RequestState[] = [];
    for (const turn of this.turns.values()) {
      if (covered.has(turn) || turn.done) continue;
      const again = this.request("turn", { ...turn.message, rid: this.nextRid() });
      again.turn = turn;
      again.internal = true;
      refollow.push(again);
    }
    for (const handle of this.handles.values()) {
      if (covered.has(handle) || handle.done || !handle.wasAccepted) continue;
      const reattach = this.request("attach", {
        type: "attach",
        rid: this.nextRid(),
        chat_id: handle.chatId,
        call_id: handle.callId,
        from_offset: handle.resumeOffset,
      });
      reattach.handle = handle;
      reattach.internal = true;
      refollow.push(reattach);
    }
    return [...refollow, ...unsent];
  }

  /**
   * The frame that re-sends `request` on connection `gen`, or null if nothing is to be sent:
   * that connection is gone, the request was answered, failed or abandoned, or (a re-follow) its
   * handle ended or was detached meanwhile.
   */
  resendFrame(request: RequestState, gen: number): string | null {
    if (gen !== this.gen || this.closing) return null;
    if (request.internal) {
      const handle = request.handle;
      if (handle !== null && (handle.done || this.handles.get(keyOf(handle.chatId, handle.callId)) !== handle)) {
        return null;
      }
      if (request.turn !== null && request.turn.done) return null;
      this.pending.set(request.rid, request);
    } else if (this.pending.get(request.rid) !== request) {
      return null;
    } else if (request.kind === "attach" && request.handle !== null) {
      (request.message as P.Attach).from_offset = request.handle.resumeOffset;
    } else if (request.kind === "cancel") {
      (request.message as P.Cancel).call_ids = request.cancelIds.filter((id) => !request.cancelResults.has(id));
    }
    request.frame = null;
    return this.frameToSend(request, true);
  }

  // -- what the agent sends -----------------------------------------------------------------

  /** Apply one message from the agent. Synchronous: the reader never waits for a consumer. */
  receive(frame: string): void {
    const message = decodeFrame(frame);
    if (message !== null) apply(this, message);
  }

  /** The caller closes the client; false if it was closing already. */
  beginClose(): boolean {
    if (this.closing) return false;
    this.closing = true;
    return true;
  }

  /**
   * A connection (attempt) ended with `failure`. Returns the plan to reconnect after, or null to
   * stop: closing, the first connect failed (then `fatal` says why), reconnecting is refused for
   * good (every request and handle fails), or reconnecting is off.
   */
  afterLoss(failure: unknown, connectionsBefore: number, attempt: number): ReconnectPlan | null {
    if (this.closing) return null;
    if (this.connections === 0) {
      this.fatal =
        failure instanceof ConnectError ? failure : new ConnectError(null, "", String(failure), { cause: failure });
      return null;
    }
    if (this.connections > connectionsBefore) attempt = 0;
    if (failure instanceof ConnectError && failure.statusCode !== null && !retryableStatus(failure.statusCode)) {
      this.failAll(failure);
      return null;
    }
    if (!this.reconnect) {
      this.failAll(new ConnectionLost("the connection to the agent was lost"));
      return null;
    }
    const delayMs = backoffDelay(attempt, this.backoffInitialMs, this.backoffMaxMs, this.random);
    return { delayMs, attempt: Math.min(attempt + 1, MAX_BACKOFF_ATTEMPT) };
  }

  failAll(error: unknown): void {
    this.fatal = this.fatal ?? error;
    for (const request of this.pending.values()) request.finish(error);
    this.pending.clear();
    for (const handle of this.handles.values()) handle.feedFailure(error);
    this.handles.clear();
    for (const turn of this.turns.values()) turn.feedFailure(error);
    this.turns.clear();
    this.approvals.close();
    this.connectionChanged.set();
  }
}
