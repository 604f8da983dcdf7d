/**
 * What a caller holds: a `CallHandle` per followed call, a `TurnHandle` per turn
 * (transport/client/handles.py). Each has the caller's side (properties, `for await`,
 * `result()`, `plan()`/`results()`) and the core's side: the `feed*` methods, synchronous and
 * never blocking, through which `ClientState` hands over what the agent sent. They ignore what
 * arrives after the handle ended; a caller never calls them.
 */
import { OutputCursor } from "./cursor.js";
import { ConnectionLost } from "./errors.js";
import type * as P from "./protocol.js";

/** One event of a followed call, in order: started, output (each byte once), approval, approval_resolved. */
export type CallEvent = P.Started | P.Output | P.Approval | P.ApprovalResolved;

/** A one-shot event. It only ever resolves: no promise here rejects unobserved. */
export class Flag {
  private resolve!: () => void;
  private readonly promise: Promise<void>;
  private done = false;

  constructor() {
    this.promise = new Promise<void>((resolve) => {
      this.resolve = resolve;
    });
  }

  set(): void {
    this.done = true;
    this.resolve();
  }

  isSet(): boolean {
    return this.done;
  }

  wait(): Promise<void> {
    return this.promise;
  }
}

/** An unbounded FIFO that never blocks its producer, ended by `close` (optionally with an error). */
export class Mailbox<T> implements AsyncIterableIterator<T> {
  private readonly items: T[] = [];
  private wakeup = new Flag();
  private closed = false;
  private error: unknown = undefined;

  get length(): number {
    return this.items.length;
  }

  put(item: T): void {
    if (!this.closed) {
      this.items.push(item);
      this.wakeup.set();
    }
  }

  close(error?: unknown): void {
    if (!this.closed) {
      this.closed = true;
      this.error = error;
      this.wakeup.set();
    }
  }

  [Symbol.asyncIterator](): Mailbox<T> {
    return this;
  }

  async next(): Promise<IteratorResult<T>> {
    while (this.items.length === 0) {
      if (this.closed) {
        if (this.error !== undefined) throw this.error;
        return { done: true, value: undefined };
      }
      if (this.wakeup.isSet()) this.wakeup = new Flag();
      await this.wakeup.wait();
    }
    return { done: false, value: this.items.shift()! };
  }
}

function resultOf(message: P.ResultMessage): P.Result {
  const { type: _type, chat_id: _chat, call_id: _call, ...result } = message;
  return result;
}

/**
 * One tool call this client follows, identified by (chatId, callId). `for await (const event of
 * handle)` yields its events in order (each byte of output once, each other event at most once)
 * and ends after the result arrived; `await handle.result()` gives the result, once, however
 * often the agent sent it. A client keeps one handle per call: a repeated `call` or `attach` of
 * a call it still follows returns the same handle.
 */
export class CallHandle implements AsyncIterable<CallEvent> {
  /** Buffer output for the caller (false: `stream: false`, no output kept). */
  stream: boolean;
  private readonly cursor: OutputCursor;
  private acceptedMessage: P.Accepted | null = null;
  private readonly settled = new Flag(); // accepted, or ended
  private readonly events = new Mailbox<CallEvent>();
  private texts: string[] = [];
  private resultValue: P.Result | null = null;
  private error: unknown = null;
  private readonly doneFlag = new Flag();
  private liveGenValue: number | null = null;
  private startedSeen = false;
  private approvalSeen = false;
  private resolvedSeen = false;

  constructor(
    readonly chatId: string,
    readonly callId: string,
    options: { stream: boolean; offset: number },
  ) {
    this.stream = options.stream;
    this.cursor = new OutputCursor(options.offset);
  }

  /** The newest `accepted` for this call (set before `call`/`attach` resolve). */
  get accepted(): P.Accepted {
    if (this.acceptedMessage === null) {
      throw new Error("no accepted yet; await handle.waitAccepted() (turn calls)");
    }
    return this.acceptedMessage;
  }

  /** The next byte offset of output this handle expects. */
  get offset(): number {
    return this.cursor.offset;
  }

  /** Where a re-attach starts so that no byte is skipped. */
  get resumeOffset(): number {
    return this.stream ? this.cursor.resumeOffset : 0;
  }

  /** Byte ranges [from, to) the agent no longer retained when we (re)read them. */
  get gaps(): readonly [number, number][] {
    return this.cursor.gaps;
  }

  get done(): boolean {
    return this.doneFlag.isSet();
  }

  /** The connection (by generation) on which this handle was last accepted. */
  get liveGen(): number | null {
    return this.liveGenValue;
  }

  get wasAccepted(): boolean {
    return this.acceptedMessage !== null;
  }

  /** All streamed output delivered so far, joined (each byte once, gaps left out). */
  outputText(): string {
    if (this.texts.length > 1) this.texts = [this.texts.join("")];
    return this.texts[0] ?? "";
  }

  /** Wait for the call's `accepted` (a turn's calls get theirs just after `turn_plan`). */
  async waitAccepted(): Promise<P.Accepted> {
    await this.settled.wait();
    if (this.acceptedMessage === null) {
      throw this.error ?? new ConnectionLost("the call ended without an accepted");
    }
    return this.acceptedMessage;
  }

  /** The call's final result. Rejects with the handle's error if it failed. */
  async result(): Promise<P.Result> {
    await this.doneFlag.wait();
    if (this.resultValue === null) throw this.error;
    return this.resultValue;
  }

  [Symbol.asyncIterator](): AsyncIterator<CallEvent> {
    return this.events;
  }

  // -- the client core's side: fed by ClientState (synchronous, never blocks) --------------

  feedAccepted(message: P.Accepted, gen: number): void {
    if (this.done) return;
    this.acceptedMessage = message;
    this.liveGenValue = gen;
    this.cursor.rewound = true; // a call/attach may move the agent's cursor back
    this.settled.set();
  }

  feedEvent(message: CallEvent | P.ResultMessage): void {
    if (this.done) return;
    switch (message.type) {
      case "output": {
        if (!this.stream) return;
        const taken = this.cursor.take(message.offset, message.data);
        if (taken === null) return;
        const [offset, text] = taken;
        this.texts.push(text);
        if (text !== message.data || offset !== message.offset) {
          message = { type: "output", chat_id: this.chatId, call_id: this.callId, offset, data: text };
        }
        this.events.put(message);
        return;
      }
      case "started":
        if (!this.startedSeen) {
          this.startedSeen = true;
          this.events.put(message);
        }
        return;
      case "approval":
        if (!this.approvalSeen) {
          this.approvalSeen = true;
          this.events.put(message);
        }
        return;
      case "approval_resolved":
        if (!this.resolvedSeen) {
          this.resolvedSeen = true;
          this.events.put(message);
        }
        return;
      case "result":
        this.resultValue = resultOf(message);
        this.events.close();
        this.doneFlag.set();
        this.settled.set();
        return;
    }
  }

  /** End the handle without a result: its iteration and `result()` reject with `error`. */
  feedFailure(error: unknown): void {
    if (this.done) return;
    this.error = error;
    this.events.close(error);
    this.doneFlag.set();
    this.settled.set();
  }
}

/** One `turn` (PROTOCOL.md 5.6): its plan, its calls' handles, and its results. */
export class TurnHandle {
  readonly callIds: string[];
  readonly stream: boolean;
  /** Per call, when stream is on. */
  readonly calls = new Map<string, CallHandle>();
  segments: string[][] | null = null;
  private resultsValue: P.Result[] | null = null;
  private error: unknown = null;
  private readonly planned = new Flag();
  private readonly doneFlag = new Flag();

  constructor(
    readonly chatId: string,
    readonly turnId: string,
    /** What a reconnect re-sends (with a new rid). */
    readonly message: P.Turn,
  ) {
    this.callIds = message.calls.map((spec) => spec.call_id);
    this.stream = message.stream ?? true;
  }

  get done(): boolean {
    return this.doneFlag.isSet();
  }

  /** The planner's segments (call ids, in request order once flattened). */
  async plan(): Promise<string[][]> {
    await this.planned.wait();
    if (this.segments === null) throw this.error;
    return this.segments;
  }

  /** One Result per call, in request order (from `turn_result`). */
  async results(): Promise<P.Result[]> {
    await this.doneFlag.wait();
    if (this.resultsValue === null) throw this.error;
    return this.resultsValue;
  }

  feedPlan(segments: string[][]): void {
    if (this.segments === null) this.segments = segments;
    this.planned.set();
  }

  feedResults(results: P.Result[]): void {
    if (!this.done) {
      this.resultsValue = results;
      this.planned.set();
      this.doneFlag.set();
    }
  }

  feedFailure(error: unknown): void {
    if (!this.done) {
      this.error = error;
      this.planned.set();
      this.doneFlag.set();
    }
  }
}
