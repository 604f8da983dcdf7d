/** The client against a real `toolwire serve`: the scenarios of issue 33, item 3. */
import assert from "node:assert/strict";
import { existsSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import {
  connect,
  ConnectError,
  ConnectionLost,
  RequestError,
  toolCallId,
  type CallEvent,
  type Client,
} from "../src/index.js";
import { Relay, startAgent, type Agent } from "./agent.js";

let agent: Agent;
let chatNumber = 0;
const newChat = (): string => `ts-chat-${++chatNumber}`;

before(async () => {
  agent = await startAgent();
});
after(async () => {
  await agent.stop();
});

async function withClient<T>(body: (client: Client) => Promise<T>, url = agent.url): Promise<T> {
  const client = await connect(url, { token: agent.token, backoffInitialMs: 10 });
  try {
    return await body(client);
  } finally {
    await client.close();
  }
}

/** Every event of a handle, in order, and the output stitched from the events' offsets. */
async function drain(events: AsyncIterable<CallEvent>): Promise<{ events: CallEvent[]; output: string }> {
  const seen: CallEvent[] = [];
  let output = "";
  let next = -1;
  for await (const event of events) {
    seen.push(event);
    if (event.type === "output") {
      if (next !== -1) assert.equal(event.offset, next, "output offsets are contiguous");
      next = event.offset + Buffer.byteLength(event.data);
      output += event.data;
    }
  }
  return { events: seen, output };
}

describe("calls", () => {
  test("a call streams started and output with offsets, then one result", async () => {
    await withClient(async (client) => {
      const chat = newChat();
      const handle = await client.call(chat, "c1", "execute", { command: "printf 'one\\n'; printf 'two\\n'" });
      assert.equal(handle.accepted.replay, false);
      const { events, output } = await drain(handle);
      assert.equal(events[0]?.type, "started");
      assert.equal(output, "one\ntwo\n");
      const result = await handle.result();
      assert.equal(result.outcome, "completed");
      assert.equal(result.output, "one\ntwo\n");
      assert.deepEqual(result.data?.["exit_code"], 0);
      assert.equal(handle.outputText(), "one\ntwo\n");
    });
  });
});

test("a repeat gets the saved result byte for byte, and the command ran once", async () => {
  const chat = newChat();
  const args = { command: "echo run >> runs.txt; echo done" };
  const first = await withClient(async (client) => (await client.call(chat, "once", "execute", args)).result());
  await withClient(async (client) => {
    const again = await client.call(chat, "once", "execute", args);
    assert.equal(again.accepted.replay, true);
    assert.equal(again.accepted.state, "done");
    const { events } = await drain(again);
    assert.deepEqual(events, [], "a call that has ended gets the saved result only");
    const second = await again.result();
    assert.equal(JSON.stringify(second), JSON.stringify(first));
  });
  assert.equal(readFileSync(join(agent.workspace, "runs.txt"), "utf8"), "run\n");
});

test("the socket dropped mid-stream resumes from the offset, nothing lost or doubled", async () => {
  const relay = await Relay.start(agent.url);
  try {
    const lines = Array.from({ length: 300 }, (_, i) => `line ${i + 1}\n`).join("");
    const command = 'i=1; while [ $i -le 300 ]; do echo "line $i"; i=$((i+1)); sleep 0.005; done';
    await withClient(async (client) => {
      const chat = newChat();
      const handle = await client.call(chat, "drop", "execute", { command });
      let output = "";
      let next = 0;
      let dropped = false;
      for await (const event of handle) {
        if (event.type !== "output") continue;
        assert.equal(event.offset, next, "each byte once, in order");
        output += event.data;
        next += Buffer.byteLength(event.data);
        if (!dropped && output.includes("line 10\n")) {
          dropped = true;
          relay.cut();
        }
      }
      const result = await handle.result();
      assert.ok(dropped);
      assert.equal(client.connections, 2);
      assert.equal(relay.accepted, 2);
      assert.equal(output, lines, "the output is the command's, exactly");
      assert.equal(result.output, lines);
      assert.equal(result.outcome, "completed");
      assert.deepEqual(handle.gaps, []);
    }, relay.url());
  } finally {
    await relay.stop();
  }
});

test("requests in flight when the connection drops are re-sent and answered once", async () => {
  const relay = await Relay.start(agent.url);
  try {
    await withClient(async (client) => {
      const chat = newChat();
      const running = await client.call(chat, "slow", "execute", { command: "sleep 0.3; echo late" });
      relay.cut(); // before the agent's reply to what follows could arrive
      const [handle, tools] = await Promise.all([
        client.call(chat, "after", "execute", { command: "echo after" }),
        client.describeTools(),
      ]);
      assert.equal((await handle.result()).output, "after\n");
      assert.ok(tools.some((definition) => definition.name === "execute"));
      assert.equal((await running.result()).output, "late\n");
      assert.ok(client.connections >= 2);
    }, relay.url());
  } finally {
    await relay.stop();
  }
});

test("without reconnect a lost connection fails what is unfinished with ConnectionLost", async () => {
  const relay = await Relay.start(agent.url);
  try {
    const client = await connect(relay.url(), { token: agent.token, reconnect: false });
    try {
      const handle = await client.call(newChat(), "lost", "execute", { command: "sleep 1" });
      relay.cut();
      await assert.rejects(handle.result(), ConnectionLost);
      await assert.rejects(client.call(newChat(), "x", "execute", { command: "true" }), ConnectionLost);
    } finally {
      await client.close();
    }
  } finally {
    await relay.stop();
  }
});

test("close while reconnecting stops at once and fails what is unfinished", async () => {
  const relay = await Relay.start(agent.url);
  const client = await connect(relay.url(), { token: agent.token, backoffInitialMs: 10, backoffMaxMs: 20 });
  const handle = await client.call(newChat(), "orphan", "execute", { command: "sleep 1" });
  await relay.stop(); // the link goes, and every reconnect is refused
  await client.close();
  await assert.rejects(handle.result(), ConnectionLost);
  assert.equal(client.connected, false);
  assert.equal(relay.accepted, 1);
});

test("a wrong token is a ConnectError with the HTTP status, never retried", async () => {
  await assert.rejects(connect(agent.url, { token: "wrong" }), (error: unknown) => {
    assert.ok(error instanceof ConnectError);
    assert.equal(error.statusCode, 401);
    return true;
  });
});

test("cancel while running ends the call canceled with its output so far", async () => {
  await withClient(async (client) => {
    const chat = newChat();
    const handle = await client.call(chat, "long", "execute", { command: "echo up; sleep 30" });
    for await (const event of handle) {
      if (event.type === "output" && handle.outputText().includes("up\n")) break;
    }
    const replies = await client.cancel(chat, ["long"]);
    const reply = replies["long"]!;
    assert.equal(reply.received, true);
    assert.equal(reply.result.outcome, "canceled");
    assert.equal(reply.result.text, "tool call was canceled while running");
    assert.equal(reply.result.output, "up\n");
    const result = await handle.result();
    assert.equal(result.outcome, "canceled");
    assert.deepEqual(await client.cancelAndCollect(chat, ["long", "never-sent"]), {
      long: result,
      "never-sent": (await client.cancel(chat, ["never-sent"]))["never-sent"]!.result,
    });
  });
});

test("an interrupt of a turn gives every call exactly one result", async () => {
  await withClient(async (client) => {
    const chat = newChat();
    const turn = await client.turn(chat, "t1", [
      { call_id: "a", tool: "execute", args: { command: "echo a-up; sleep 30" } },
      { call_id: "b", tool: "execute", args: { command: "echo b > b.txt" } },
      { call_id: "c", tool: "read_file", args: { path: "c.txt" } },
    ]);
    const a = turn.calls.get("a")!;
    for await (const event of a) {
      if (event.type === "output" && a.outputText() === "a-up\n") break;
    }
    const ended = await client.interrupt(chat, "t1");
    assert.deepEqual([...ended].sort(), ["a", "b", "c"]);
    const results = await turn.results();
    assert.deepEqual(
      results.map((result) => result.outcome),
      ["canceled", "not_run", "not_run"],
    );
    for (const [index, callId] of ["a", "b", "c"].entries()) {
      assert.deepEqual(await turn.calls.get(callId)!.result(), results[index]);
    }
    assert.equal(existsSync(join(agent.workspace, "b.txt")), false, "b never ran");
    assert.deepEqual(client.errors, []);
  });
});

test("two approvals parked at once are each answered alone", async () => {
  await withClient(async (client) => {
    const chat = newChat();
    const first = await client.call(chat, "gate-a", "write_file", { path: `${chat}-a.txt`, content: "a" }, { approval: true });
    const second = await client.call(chat, "gate-b", "write_file", { path: `${chat}-b.txt`, content: "b" }, { approval: true });
    const parked: string[] = [];
    for await (const approval of client.approvals()) {
      if (approval.chat_id !== chat) continue;
      parked.push(approval.call_id);
      if (parked.length === 2) break;
    }
    assert.deepEqual(parked.sort(), ["gate-a", "gate-b"]);
    const resolved = await client.approve(chat, "gate-b", true);
    assert.equal(resolved.decision, "approved");
    assert.equal((await second.result()).outcome, "completed");
    assert.equal(readFileSync(join(agent.workspace, `${chat}-b.txt`), "utf8"), "b");
    assert.equal(first.done, false, "the other gate stays parked");
    assert.equal(existsSync(join(agent.workspace, `${chat}-a.txt`)), false);
    const denied = await client.approve(chat, "gate-a", false, { reason: "not now" });
    assert.equal(denied.decision, "denied");
    const result = await first.result();
    assert.equal(result.outcome, "denied");
    assert.equal(result.text, "tool call was denied: not now; no changes were made");
    const { events } = await drain(first);
    assert.deepEqual(events.map((event) => event.type), ["approval", "approval_resolved"]);
    await assert.rejects(client.approve(chat, "gate-a", true), (error: unknown) => {
      assert.ok(error instanceof RequestError);
      assert.equal(error.code, "not_parked");
      return true;
    });
  });
});

test("a turn is planned into segments in request order and reports every call in it", async () => {
  await withClient(async (client) => {
    const chat = newChat();
    const turn = await client.turn(chat, "plan", [
      { call_id: "r1", tool: "read_file", args: { path: "p/a.txt" } },
      { call_id: "r2", tool: "read_file", args: { path: "p/b.txt" } },
      { call_id: "w1", tool: "write_file", args: { path: "p/a.txt", content: "new" } },
      { call_id: "r3", tool: "read_file", args: { path: "p/c.txt" } },
      { call_id: "x1", tool: "execute", args: { command: "cat p/a.txt" } },
    ]);
    const segments = await turn.plan();
    assert.deepEqual(segments, [["r1", "r2"], ["w1", "r3"], ["x1"]]);
    assert.deepEqual(segments.flat(), turn.callIds);
    const results = await turn.results();
    assert.deepEqual(results.map((result) => result.tool), ["read_file", "read_file", "write_file", "read_file", "execute"]);
    assert.equal(results[4]!.output, "new", "the barrier ran after the write");
  });
});

test("bad_args is a typed RequestError, and the refused call id stays unused", async () => {
  await withClient(async (client) => {
    const chat = newChat();
    for (const args of [{}, { command: "true", colour: "red" }]) {
      await assert.rejects(client.call(chat, "bad", "execute", args), (error: unknown) => {
        assert.ok(error instanceof RequestError);
        assert.equal(error.code, "bad_args");
        return true;
      });
    }
    assert.equal(client.handle(chat, "bad"), undefined);
    const handle = await client.call(chat, "bad", "execute", { command: "echo fine" });
    assert.equal(handle.accepted.replay, false);
    assert.equal((await handle.result()).output, "fine\n");
    await assert.rejects(client.attach(chat, "no-such-call"), (error: unknown) => error instanceof RequestError && error.code === "unknown_call");
  });
});

test("attach from an offset gets the rest of the output and the same result", async () => {
  await withClient(async (client) => {
    const chat = newChat();
    const result = await (await client.call(chat, "done", "execute", { command: "printf 'abcdef'" })).result();
    const attached = await client.attach(chat, "done", 3);
    const { events, output } = await drain(attached);
    assert.equal(output, "def");
    const outputs = events.filter((event) => event.type === "output");
    assert.deepEqual(outputs.map((event) => event.offset), [3]);
    assert.deepEqual(await attached.result(), result);
  });
});

test("a call from an offset streams the output from there, with or without the agent's call_from_offset", async () => {
  await withClient(async (client) => {
    const chat = newChat();
    const handle = await client.call(chat, "from", "execute", { command: "printf 'abcdef'; sleep 0.2; printf 'gh'" }, { fromOffset: 3 });
    const { events, output } = await drain(handle);
    assert.equal(output, "defgh");
    const first = events.find((event) => event.type === "output");
    assert.equal(first?.type === "output" ? first.offset : -1, 3);
    assert.equal((await handle.result()).output, "abcdefgh", "the result is unchanged by it");
  });
});

test("closeChat ends the chat's calls and refuses new ones", async () => {
  await withClient(async (client) => {
    const chat = newChat();
    const handle = await client.call(chat, "bg", "execute", { command: "echo up; sleep 30" });
    for await (const event of handle) {
      if (event.type === "output") break; // it runs
    }
    const closed = await client.closeChat(chat);
    assert.deepEqual(closed.call_ids, ["bg"]);
    assert.equal((await handle.result()).outcome, "canceled");
    await assert.rejects(client.call(chat, "new", "execute", { command: "true" }), (error: unknown) => error instanceof RequestError && error.code === "chat_closed");
  });
});

test("the tool call id vector and the refusal of empty or repeated provider ids", async () => {
  const { toolCallIds } = await import("../src/index.js");
  const chat = "11111111-1111-1111-1111-111111111111";
  assert.equal(toolCallId(chat, "42", "call_1"), "ca92e3e7-ee42-5889-b1df-75869f9117ee");
  assert.deepEqual(toolCallIds(chat, "42", ["", "call_1", ""]), [null, "ca92e3e7-ee42-5889-b1df-75869f9117ee", null]);
  const ids = toolCallIds(chat, "42", ["call_0", "call_1", "call_0", "call_2", "call_0"]);
  assert.deepEqual(ids, [null, "ca92e3e7-ee42-5889-b1df-75869f9117ee", null, toolCallId(chat, "42", "call_2"), null]);
  assert.throws(() => toolCallId(chat, "42", "call_\ud800"), RangeError);
  assert.throws(() => toolCallIds(chat, "42", ["call_1", 7 as unknown as string]), TypeError);
});
