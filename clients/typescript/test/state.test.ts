/** The sans-IO core on its own (no agent, no socket): cursor, reconnect plan, replies, backoff. */
import assert from "node:assert/strict";
import { test } from "node:test";
import { ClientState, ConnectError, ConnectionLost, OutputCursor, RequestError, type Welcome } from "../src/index.js";
import { backoffDelay } from "../src/requests.js";

/** A small seeded PRNG (mulberry32), so every run checks the same cases. */
function prng(seed: number): () => number {
  return () => {
    seed = (seed + 0x6d2b79f5) | 0;
    let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

const welcome = (boot = "b1"): Welcome => ({
  type: "welcome",
  protocol: 1,
  agent_id: "a",
  boot_id: boot,
  encoding: "json",
  tools: ["execute"],
  limits: {
    max_message_bytes: 1 << 20,
    output_retention_bytes: 1 << 20,
    result_output_bytes: 1 << 16,
    max_wait_ms: 1000,
    forget_after_s: 3600,
    exited_retention_s: 3600,
    max_processes_per_chat: 8,
  },
});

/** The agent's chunks of `text` from byte `from`: cut at random character boundaries. */
function chunks(text: string, from: number, random: () => number): [number, string][] {
  const chars = [...text];
  const out: [number, string][] = [];
  let offset = 0;
  let index = 0;
  while (index < chars.length && offset < from) offset += Buffer.byteLength(chars[index++]!);
  while (index < chars.length) {
    const take = 1 + Math.floor(random() * 6);
    const piece = chars.slice(index, index + take).join("");
    out.push([offset, piece]);
    offset += Buffer.byteLength(piece);
    index += take;
  }
  return out;
}

test("the cursor delivers each byte once across re-reads from any earlier offset", () => {
  const random = prng(7);
  const alphabet = ["a", "b", "\n", "é", "☃", "😀"];
  for (let round = 0; round < 300; round++) {
    const text = Array.from({ length: 1 + Math.floor(random() * 40) }, () => alphabet[Math.floor(random() * alphabet.length)]).join("");
    const cursor = new OutputCursor(0);
    let delivered = "";
    let expectedOffset = 0;
    const feed = (offset: number, data: string): void => {
      const taken = cursor.take(offset, data);
      if (taken === null) return;
      assert.equal(taken[0], expectedOffset, "each chunk starts where the last ended");
      delivered += taken[1];
      expectedOffset += Buffer.byteLength(taken[1]);
    };
    const first = chunks(text, 0, random);
    const cut = Math.floor(random() * (first.length + 1));
    for (const [offset, data] of first.slice(0, cut)) feed(offset, data);
    // A reconnect: the agent re-reads from where we resume, or (a repeated call) from 0.
    cursor.rewound = true;
    const from = random() < 0.5 ? cursor.resumeOffset : 0;
    for (const [offset, data] of chunks(text, from, random)) feed(offset, data);
    assert.equal(delivered, text);
    assert.deepEqual(cursor.gaps, []);
  }
});

test("a jump past what was retained is a gap, not a loss of what came after", () => {
  const cursor = new OutputCursor(0);
  assert.deepEqual(cursor.take(0, "abc"), [0, "abc"]);
  assert.deepEqual(cursor.take(10, "xyz"), [10, "xyz"]);
  assert.deepEqual(cursor.gaps, [[3, 10]]);
});

test("after a reconnect the plan re-sends turns, then re-attaches from each call's offset, then the unsent, in order", () => {
  const state = new ClientState();
  const gen = state.onConnected(welcome());
  assert.equal(state.resubscribe(gen, true)?.length, 0);
  assert.equal(state.resubscribe(gen, false), null);
  assert.equal(state.ready, true);

  const call = state.call({ type: "call", rid: state.nextRid(), chat_id: "c", call_id: "x", tool: "execute", args: { command: "y" } });
  state.register(call);
  assert.notEqual(state.frameToSend(call), null);
  state.receive(JSON.stringify({ type: "accepted", rid: call.rid, chat_id: "c", call_id: "x", replay: false, state: "running", requests: 1 }));
  state.receive(JSON.stringify({ type: "output", chat_id: "c", call_id: "x", offset: 0, data: "hello" }));
  assert.equal(call.handle!.offset, 5);

  const [turnRequest] = state.turn({ type: "turn", rid: state.nextRid(), chat_id: "c", turn_id: "t", calls: [{ call_id: "t1", tool: "execute", args: {} }] });
  state.register(turnRequest);
  state.frameToSend(turnRequest);
  state.receive(JSON.stringify({ type: "turn_plan", rid: turnRequest.rid, chat_id: "c", turn_id: "t", segments: [["t1"]] }));

  const approve = state.approve({ type: "approve", rid: state.nextRid(), chat_id: "c", call_id: "g", approved: true });
  state.register(approve);
  state.frameToSend(approve);

  state.onDisconnected();
  assert.ok(approve.done.isSet());
  assert.ok(approve.error instanceof ConnectionLost, "an approve in flight may have been applied: it is not re-sent");

  const cancel = state.cancel("c", ["z"]);
  state.register(cancel);
  assert.equal(state.frameToSend(cancel), null, "between connections nothing goes out");

  const next = state.onConnected(welcome());
  const plan = state.resubscribe(next, true)!;
  const frames = plan.map((request) => JSON.parse(state.resendFrame(request, next)!));
  assert.deepEqual(
    frames.map((frame) => [frame.type, frame.from_offset ?? frame.turn_id ?? frame.call_ids]),
    [["turn", "t"], ["attach", 5], ["cancel", ["z"]]],
  );
  assert.equal(state.ready, false);
  assert.equal(state.resubscribe(next, false), null);
  assert.equal(state.ready, true);
});

test("events from an earlier connection do not reach a handle accepted on this one", () => {
  const state = new ClientState();
  state.onConnected(welcome());
  const call = state.call({ type: "call", rid: state.nextRid(), chat_id: "c", call_id: "x", tool: "execute", args: {} });
  state.register(call);
  state.frameToSend(call);
  state.onDisconnected();
  state.onConnected(welcome());
  // The first connection's accepted never came; this output belongs to no request of this one.
  state.receive(JSON.stringify({ type: "output", chat_id: "c", call_id: "x", offset: 0, data: "stale" }));
  assert.equal(call.handle!.offset, 0);
});

test("an error reply fails its request with a RequestError carrying the code; an unmatched one is kept", () => {
  const state = new ClientState();
  state.onConnected(welcome());
  const call = state.call({ type: "call", rid: state.nextRid(), chat_id: "c", call_id: "x", tool: "execute", args: {} });
  state.register(call);
  state.frameToSend(call);
  state.receive(JSON.stringify({ type: "error", rid: call.rid, code: "bad_args", message: "command: required" }));
  assert.ok(call.error instanceof RequestError);
  assert.equal(call.error.code, "bad_args");
  assert.equal(state.handles.size, 0);
  state.receive(JSON.stringify({ type: "error", rid: 999, code: "unknown_call", message: "?" }));
  assert.deepEqual(state.errors.map((error) => error.code), ["unknown_call"]);
  state.receive("not json");
  state.receive(JSON.stringify({ type: "from_a_newer_agent" }));
});

test("a refused reconnect fails everything; the first failed connect stops at once", () => {
  const state = new ClientState();
  assert.equal(state.afterLoss(new Error("ECONNREFUSED"), 0, 0), null);
  assert.ok(state.fatal instanceof ConnectError);

  const other = new ClientState();
  other.onConnected(welcome());
  const call = other.call({ type: "call", rid: other.nextRid(), chat_id: "c", call_id: "x", tool: "execute", args: {} });
  other.register(call);
  other.onDisconnected();
  assert.notEqual(other.afterLoss(null, 1, 0), null, "a lost connection is retried");
  assert.equal(other.afterLoss(new ConnectError(401), 1, 1), null, "a 401 will stay a 401");
  assert.ok(call.error instanceof ConnectError);
});

test("backoff doubles from the initial delay up to the cap, with jitter in [0.5, 1]", () => {
  const random = prng(3);
  for (let attempt = 0; attempt < 40; attempt++) {
    const delay = backoffDelay(attempt, 100, 5000, random);
    const full = Math.min(5000, 100 * 2 ** attempt);
    assert.ok(delay >= full / 2 && delay <= full, `${attempt}: ${delay}`);
  }
});
