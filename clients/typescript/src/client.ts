/**
 * The client: `connect(url, {token})` gives a `Client`, one logical connection to an agent over
 * `ws`, resumed across reconnects (transport/client/api.py and session.py, in TypeScript).
 *
 * Every decision is `ClientState`'s (state.ts). This module only does the I/O: it opens the
 * WebSocket (subprotocol toolwire.v1.json, `Authorization: Bearer`), reads the `welcome`, feeds
 * every frame to the state, sends what the state says, pings, and reconnects after the delay
 * the state gives. Resume (`reconnect: true`, the default): a lost connection (not `close()`) is
 * re-established with exponential backoff and jitter, every unfinished call is re-attached from
 * the last byte offset known exactly, and unanswered idempotent requests are re-sent (`call`,
 * `attach`, `cancel`, `turn`, `interrupt`, `close_chat`, `describe_tools`), so every handle sees
 * each byte once, in order, and its one result. `approve` is not idempotent: one in flight when
 * the connection drops rejects with ConnectionLost.
 */
import WebSocket from "ws";
import { ConnectError, ConnectionLost } from "./errors.js";
import type { CallHandle, TurnHandle } from "./handles.js";
import type * as P from "./protocol.js";
import type { RequestState } from "./requests.js";
import { decodeFrame, ClientState } from "./state.js";
import { keyOf } from "./requests.js";

/** The one subprotocol this client speaks: JSON text frames. */
export const SUBPROTOCOL = "toolwire.v1.json";
/**
 * The largest message accepted from the agent. A `turn_result` carries up to 64 KiB of output
 * per call, so a big turn is a few MiB; 256 MiB only guards against a broken peer (a close for
 * size would make the client reconnect and receive the same message again).
 */
export const MAX_INCOMING_MESSAGE_BYTES = 256 * 1024 * 1024;
/** TCP connect + HTTP upgrade + `welcome` must finish within this. */
export const CONNECT_TIMEOUT_MS = 10_000;
/**
 * We ping the agent too (it pings every 20 s): without it a silently vanished agent is noticed
 * only when TCP gives up. Two missed intervals, as the server, and the connection counts as lost.
 */
export const PING_INTERVAL_MS = 20_000;
/** A graceful close gets this long; then the socket is just destroyed. */
export const CLOSE_TIMEOUT_MS = 1_000;

export interface ConnectOptions {
  /** Sent as `Authorization: Bearer <token>`; omit for `--insecure-no-auth` agents. */
  token?: string;
  /** Re-establish a lost connection and resume (default true); else what is unfinished fails. */
  reconnect?: boolean;
  /** First reconnect delay (default 100 ms), doubling up to `backoffMaxMs` (default 5 s), with jitter. */
  backoffInitialMs?: number;
  backoffMaxMs?: number;
  connectTimeoutMs?: number;
  /** Client-side keepalive interval; null turns it off. */
  pingIntervalMs?: number | null;
}

export interface CallOptions {
  timeoutMs?: number;
  background?: boolean;
  approval?: boolean;
  /** false: only accepted/approval/result, no output kept (default true). */
  stream?: boolean;
  /** PROTOCOL.md 10.4; part of what the call id stands for (another sandbox is a `conflict`). */
  sandbox?: P.Sandbox;
  /**
   * PROTOCOL.md 10.2: the output starts at this byte offset (a chat server that restarted and
   * kept how much it had shown). Sent when given; an agent without `call_from_offset` sends
   * from 0, and the handle drops the earlier bytes itself.
   */
  fromOffset?: number;
}

export interface ApproveOptions {
  reason?: string;
  scope?: "call" | "chat";
}

/** A call of a `turn`, as the protocol has it (`call_id`, `tool`, `args`, ...). */
export type CallSpec = P.CallSpec;

/** Connect to an agent at `ws://HOST:PORT/v1`. Rejects with ConnectError, never retried, when the first connect fails. */
export async function connect(url: string, options: ConnectOptions = {}): Promise<Client> {
  const client = new Client(url, options);
  await client.open();
  return client;
}

type Session = { ws: WebSocket; closed: Promise<unknown> };

/** One logical connection to one agent. Make it with `connect(...)`. */
export class Client {
  readonly url: string;
  private readonly state: ClientState;
  private readonly headers: Record<string, string>;
  private readonly connectTimeoutMs: number;
  private readonly pingIntervalMs: number | null;
  private ws: WebSocket | null = null;
  /** The socket of the connection attempt under way (welcomed or not). */
  private attempt: WebSocket | null = null;
  private opened = false;
  private wakeSleep: (() => void) | null = null;
  private stopped: Promise<void> = Promise.resolve();

  constructor(url: string, options: ConnectOptions = {}) {
    const parsed = new URL(url);
    if (parsed.protocol !== "ws:" && parsed.protocol !== "wss:") {
      throw new TypeError(`not a ws:// or wss:// URL: ${url}`);
    }
    this.url = url;
    this.state = new ClientState({
      reconnect: options.reconnect ?? true,
      backoffInitialMs: options.backoffInitialMs ?? 100,
      backoffMaxMs: options.backoffMaxMs ?? 5000,
    });
    this.headers = options.token ? { authorization: `Bearer ${options.token}` } : {};
    this.connectTimeoutMs = options.connectTimeoutMs ?? CONNECT_TIMEOUT_MS;
    this.pingIntervalMs = options.pingIntervalMs === undefined ? PING_INTERVAL_MS : options.pingIntervalMs;
  }

  // -- state -------------------------------------------------------------------------------

  /** Whether a lost connection is re-established (else what is unfinished fails). */
  get reconnect(): boolean {
    return this.state.reconnect;
  }

  set reconnect(value: boolean) {
    this.state.reconnect = value;
  }

  /** Successful connects, the first included. */
  get connections(): number {
    return this.state.connections;
  }

  /** `error` messages that answered no request of ours (the newest 1,000). */
  get errors(): readonly P.Error[] {
    return this.state.errors;
  }

  /** The `welcome` of the current (or last) connection. */
  get welcome(): P.Welcome {
    if (this.state.welcome === null) throw new Error("not connected yet");
    return this.state.welcome;
  }

  get bootId(): string {
    return this.welcome.boot_id;
  }

  get connected(): boolean {
    return this.state.live;
  }

  /**
   * Wait until the client has connected `count` times in all: after a lost connection,
   * `waitConnections(client.connections + 1)` waits for the reconnect. Rejects with
   * ConnectionLost if the client stops first.
   */
  async waitConnections(count: number): Promise<void> {
    while (this.state.connections < count) {
      this.state.checkUsable();
      await this.state.connectionChanged.wait();
    }
  }

  /** The unfinished handle this client holds for a call, if any. */
  handle(chatId: string, callId: string): CallHandle | undefined {
    return this.state.handles.get(keyOf(chatId, callId));
  }

  // -- requests ----------------------------------------------------------------------------

  /**
   * Send `call` and resolve once it is `accepted`; reject with RequestError on `error`. At most
   * once per (chatId, callId): a repeat gets the same call's events and its saved result.
   */
  async call(
    chatId: string,
    callId: string,
    tool: string,
    args: Record<string, unknown>,
    options: CallOptions = {},
  ): Promise<CallHandle> {
    const message: P.Call = {
      type: "call",
      rid: this.state.nextRid(),
      chat_id: chatId,
      call_id: callId,
      tool,
      args,
      timeout_ms: options.timeoutMs ?? null,
      background: options.background ?? false,
      approval: options.approval ?? false,
      stream: options.stream ?? true,
      sandbox: options.sandbox ?? null,
    };
    if (options.fromOffset !== undefined) message.from_offset = options.fromOffset;
    const request = this.state.call(message);
    await this.roundtrip(request);
    return request.handle!;
  }

  /**
   * Follow an existing call from `fromOffset`: retained output, then live events, then its
   * result. RequestError `unknown_call` if the agent has no record of it.
   */
  async attach(chatId: string, callId: string, fromOffset = 0): Promise<CallHandle> {
    const request = this.state.attach(chatId, callId, fromOffset, true);
    await this.roundtrip(request);
    return request.handle!;
  }

  /** Stop following a call (it goes on). Its handle fails with `Detached`. */
  async detach(chatId: string, callId: string): Promise<void> {
    const frame = this.state.detach(chatId, callId);
    if (frame !== null) this.sendFrame(frame);
  }

  /**
   * Cancel calls (PROTOCOL.md 5.3); resolves with one `cancel_result` per distinct id. A cancel
   * of a running call waits for it to end (SIGTERM, then SIGKILL after the agent's grace). Safe
   * to repeat.
   */
  async cancel(chatId: string, callIds: readonly string[]): Promise<Record<string, P.CancelResult>> {
    const ids = [...new Set(callIds)];
    if (ids.length === 0) return {};
    const request = this.state.cancel(chatId, ids);
    await this.roundtrip(request);
    return Object.fromEntries(ids.map((id) => [id, request.cancelResults.get(id)!]));
  }

  /** Cancel calls and map each id to its truthful final result (`not_run`, `canceled`, or the real one). */
  async cancelAndCollect(chatId: string, callIds: readonly string[]): Promise<Record<string, P.Result>> {
    const replies = await this.cancel(chatId, callIds);
    return Object.fromEntries(Object.entries(replies).map(([id, reply]) => [id, reply.result]));
  }

  /**
   * Answer a parked approval gate; resolves with the `approval_resolved` that closed it, rejects
   * with RequestError (`not_parked`, `unknown_call`). `scope: "chat"` with approved approves the
   * tool for the whole chat (PROTOCOL.md 9.5). Not re-sent after a reconnect: one in flight
   * when the connection drops rejects with ConnectionLost (the call's events tell what happened).
   */
  async approve(
    chatId: string,
    callId: string,
    approved: boolean,
    options: ApproveOptions = {},
  ): Promise<P.ApprovalResolved> {
    const request = this.state.approve({
      type: "approve",
      rid: this.state.nextRid(),
      chat_id: chatId,
      call_id: callId,
      approved,
      reason: options.reason ?? null,
      scope: options.scope ?? "call",
    });
    await this.roundtrip(request);
    return request.resolved!;
  }

  /**
   * Every `approval` this client receives, from any call it follows, once per gate, in arrival
   * order; ends when the client closes. Kept from the start; shared: consume it from one place.
   */
  approvals(): AsyncIterable<P.Approval> {
    return this.state.approvals;
  }

  /**
   * Run a batch with the read/write planner (PROTOCOL.md 5.6). Resolves once the plan (and,
   * with stream on, every call's `accepted`) arrived; `handle.calls.get(callId)` follows each call.
   */
  async turn(
    chatId: string,
    turnId: string,
    calls: readonly CallSpec[],
    options: { stream?: boolean } = {},
  ): Promise<TurnHandle> {
    const message: P.Turn = {
      type: "turn",
      rid: this.state.nextRid(),
      chat_id: chatId,
      turn_id: turnId,
      calls: [...calls],
      stream: options.stream ?? true,
    };
    const [request, turn] = this.state.turn(message);
    await this.roundtrip(request);
    if (request.turn === turn) {
      for (const handle of turn.calls.values()) await handle.waitAccepted();
    }
    return turn;
  }

  /**
   * Cancel every unresolved call of the chat (or of one turn); resolves once the agent says the
   * chat is quiet (`interrupted`), with the ids of the calls it ended.
   */
  async interrupt(chatId: string, turnId?: string): Promise<string[]> {
    const request = this.state.interrupt(chatId, turnId ?? null);
    await this.roundtrip(request);
    return request.interrupted!.call_ids;
  }

  /** Close the chat (PROTOCOL.md 9.6): its unresolved calls end, its processes are stopped. */
  async closeChat(chatId: string): Promise<P.ChatClosed> {
    const request = this.state.closeChat(chatId);
    await this.roundtrip(request);
    return request.chatClosed!;
  }

  /** The agent's tools as a model is given them (PROTOCOL.md 10.3), in `welcome.tools` order. */
  async describeTools(): Promise<P.ToolDefinition[]> {
    const request = this.state.describeTools();
    await this.roundtrip(request);
    return request.toolDefinitions!.tools;
  }

  /**
   * Close the connection and stop. Calls on the agent go on; every waiting request and
   * unfinished handle of this client rejects with ConnectionLost.
   */
  async close(): Promise<void> {
    if (!this.state.beginClose()) return this.stopped;
    if (this.attempt !== null && this.attempt !== this.ws) this.attempt.terminate(); // not welcomed yet
    const ws = this.ws;
    if (ws !== null) {
      const closed = new Promise<void>((resolve) => ws.once("close", () => resolve()));
      ws.close(1000);
      const timer = setTimeout(() => ws.terminate(), CLOSE_TIMEOUT_MS);
      await closed;
      clearTimeout(timer);
    }
    this.state.failAll(new ConnectionLost("the client was closed"));
    this.wakeSleep?.();
    await this.stopped;
  }

  // -- plumbing ------------------------------------------------------------------------------

  /** Connect (the first time) and run the connection loop; what `connect` does. */
  async open(): Promise<void> {
    if (this.opened) throw new Error("this Client was opened already; make a new one to connect again");
    this.opened = true;
    let settle!: (error: unknown) => void;
    const first = new Promise<unknown>((resolve) => {
      settle = resolve;
    });
    this.stopped = this.run(settle);
    const error = await first;
    if (error !== null) {
      await this.stopped;
      throw error;
    }
  }

  /** Register, send, and wait for the reply; throw the request's error if it failed. */
  private async roundtrip(request: RequestState): Promise<void> {
    this.state.register(request);
    const frame = this.state.frameToSend(request);
    if (frame !== null) this.sendFrame(frame);
    await request.done.wait();
    if (request.error !== null) throw request.error;
  }

  private sendFrame(frame: string): void {
    const ws = this.ws;
    // A failure shows as the connection's loss, after which the request is re-sent or failed.
    if (ws !== null && ws.readyState === WebSocket.OPEN) ws.send(frame, () => undefined);
  }

  /** Connect, read until the connection is lost, reconnect after the state's delay. */
  private async run(settleFirst: (error: unknown) => void): Promise<void> {
    let attempt = 0;
    for (;;) {
      const before = this.state.connections;
      const failure = await this.session(() => settleFirst(null));
      const plan = this.state.afterLoss(failure, before, attempt);
      if (this.state.connections === 0) settleFirst(this.state.fatal);
      if (plan === null) {
        if (!this.state.closing && this.state.fatal !== null) this.state.failAll(this.state.fatal);
        return;
      }
      attempt = plan.attempt;
      await new Promise<void>((resolve) => {
        const timer = setTimeout(resolve, plan.delayMs);
        this.wakeSleep = () => {
          clearTimeout(timer);
          resolve();
        };
      });
      this.wakeSleep = null;
      if (this.state.closing) return;
    }
  }

  /** One connection, from the handshake to its close; resolves with why it ended (null: a clean close). */
  private session(onWelcome: () => void): Promise<unknown> {
    return new Promise<unknown>((resolve) => {
      let failure: unknown = null;
      let welcomed = false;
      let pinger: NodeJS.Timeout | null = null;
      const ws = new WebSocket(this.url, [SUBPROTOCOL], {
        headers: this.headers,
        handshakeTimeout: this.connectTimeoutMs,
        maxPayload: MAX_INCOMING_MESSAGE_BYTES,
        perMessageDeflate: false,
      });
      this.attempt = ws;
      const welcomeTimer = setTimeout(() => {
        failure = new ConnectError(null, "", "no welcome in time");
        ws.terminate();
      }, this.connectTimeoutMs);
      ws.on("unexpected-response", (req, res) => {
        const chunks: Buffer[] = [];
        res.on("data", (chunk: Buffer) => chunks.push(chunk));
        res.on("end", () => {
          failure = new ConnectError(res.statusCode ?? null, Buffer.concat(chunks).toString("utf8"));
          req.destroy();
          finish();
        });
        res.on("error", () => finish());
      });
      ws.on("error", (error) => {
        failure ??= error;
        finish();
      });
      ws.on("message", (data, isBinary) => {
        const frame = isBinary ? null : data.toString();
        if (!welcomed) {
          const message = frame === null ? null : decodeFrame(frame);
          if (this.state.closing) {
            ws.terminate(); // closed while this attempt was under way
            return;
          }
          if (message === null || message.type !== "welcome") {
            failure = new ConnectError(null, "", `expected welcome, got ${message?.type ?? "an undecodable message"}`);
            ws.terminate();
            return;
          }
          welcomed = true;
          clearTimeout(welcomeTimer);
          this.ws = ws;
          const gen = this.state.onConnected(message);
          onWelcome();
          if (this.pingIntervalMs) pinger = this.keepalive(ws, this.pingIntervalMs);
          void this.resubscribe(gen);
          return;
        }
        if (frame !== null) this.state.receive(frame);
      });
      ws.on("close", () => finish());
      let finished = false;
      const finish = (): void => {
        if (finished) return;
        finished = true;
        clearTimeout(welcomeTimer);
        if (pinger !== null) clearInterval(pinger);
        if (this.attempt === ws) this.attempt = null;
        if (this.ws === ws) {
          this.ws = null;
          this.state.onDisconnected();
        }
        if (ws.readyState !== WebSocket.CLOSED) ws.terminate();
        resolve(failure);
      };
    });
  }

  /** Ping every interval; two intervals without a pong and the connection counts as lost. */
  private keepalive(ws: WebSocket, intervalMs: number): NodeJS.Timeout {
    let lastPong = Date.now();
    ws.on("pong", () => {
      lastPong = Date.now();
    });
    const timer = setInterval(() => {
      if (Date.now() - lastPong > 2 * intervalMs) {
        ws.terminate();
        return;
      }
      ws.ping();
    }, intervalMs);
    timer.unref();
    return timer;
  }

  /** After connect `gen`: send what the state says, pass after pass, until nothing is left. */
  private async resubscribe(gen: number): Promise<void> {
    let first = true;
    for (let batch = this.state.resubscribe(gen, first); batch !== null; batch = this.state.resubscribe(gen, first)) {
      first = false;
      for (const request of batch) {
        const frame = this.state.resendFrame(request, gen);
        if (frame !== null) this.sendFrame(frame);
      }
      // Let requests made meanwhile join the next pass, in request order.
      await Promise.resolve();
    }
  }
}
