/**
 * A request in flight (what to re-send, what answered it), and the reconnect backoff: the small
 * data of `ClientState` (transport/client/requests.py; pure).
 */
import { Flag, type CallHandle, type TurnHandle } from "./handles.js";
import type * as P from "./protocol.js";

/** Reconnect attempts counted for backoff: 2**32 times the initial delay is past any cap. */
export const MAX_BACKOFF_ATTEMPT = 32;

export type Key = string;
export type Kind =
  | "call"
  | "attach"
  | "cancel"
  | "approve"
  | "turn"
  | "interrupt"
  | "close_chat"
  | "describe_tools";

/** Requests that make a connection follow a call or a turn. */
export const SUBSCRIBING: ReadonlySet<Kind> = new Set<Kind>(["call", "attach", "turn"]);

/** The table key of a call or turn: chat and id, unambiguous (JSON of the pair). */
export function keyOf(chatId: string, id: string): Key {
  return JSON.stringify([chatId, id]);
}

/** One request of ours: what to (re)send, and what answered it. */
export class RequestState {
  readonly done = new Flag();
  /** Its encoding for the first send. */
  frame: string | null = null;
  handle: CallHandle | null = null;
  turn: TurnHandle | null = null;
  /** Handles made for this request (registered on send). */
  created: CallHandle[] = [];
  /** Made by the client itself (a re-follow): nobody awaits it. */
  internal = false;
  /** The connection it was handed to, null if never sent. */
  sentGen: number | null = null;
  error: unknown = null;
  cancelIds: string[] = [];
  readonly cancelResults = new Map<string, P.CancelResult>();
  interrupted: P.Interrupted | null = null;
  chatClosed: P.ChatClosed | null = null;
  toolDefinitions: P.ToolDefinitions | null = null;
  resolved: P.ApprovalResolved | null = null;

  constructor(
    readonly rid: number,
    readonly kind: Kind,
    /** The protocol message to (re)send. */
    readonly message: P.ClientToAgent,
  ) {}

  finish(error: unknown = null): void {
    if (!this.done.isSet()) {
      this.error = error;
      this.done.set();
    }
  }
}

/**
 * The wait before reconnect attempt `attempt` (0 for the first after a success): exponential up
 * to `maxMs`, scaled by a random factor in [0.5, 1] so that replicas that lost the same agent do
 * not reconnect in lockstep.
 */
export function backoffDelay(
  attempt: number,
  initialMs: number,
  maxMs: number,
  random: () => number,
): number {
  const growth = 2 ** Math.min(attempt, MAX_BACKOFF_ATTEMPT);
  return Math.min(maxMs, initialMs * growth) * (0.5 + 0.5 * random());
}
