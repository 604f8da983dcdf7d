/**
 * The AI SDK tools against a real agent, driven by the SDK's own mock language model
 * (ai/test MockLanguageModelV4) issuing parallel tool calls.
 */
import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import { stepCountIs, streamText, type TextStreamPart, type ToolSet } from "ai";
import { MockLanguageModelV4, convertArrayToReadableStream } from "ai/test";
import { connect, renderResult, toolCallId, toolwireTools, type Client, type Result, type ToolwireToolOutput } from "../src/index.js";
import { PRELIMINARY_OUTPUT_CHARS } from "../src/aisdk.js";
import { startAgent, type Agent } from "./agent.js";

let agent: Agent;
let client: Client;

before(async () => {
  agent = await startAgent();
  client = await connect(agent.url, { token: agent.token });
});
after(async () => {
  await client.close();
  await agent.stop();
});

const usage = {
  inputTokens: { total: 1, noCache: 1, cacheRead: 0, cacheWrite: 0 },
  outputTokens: { total: 1, text: 1, reasoning: 0 },
};

type Part = Parameters<typeof convertArrayToReadableStream>[0][number];

/** One model response: these tool calls (id, tool, args), or a text. */
function response(calls: [string, string, Record<string, unknown>][], text?: string): { stream: ReadableStream } {
  const parts: Part[] = [{ type: "stream-start", warnings: [] }];
  for (const [id, name, args] of calls) {
    parts.push({ type: "tool-call", toolCallId: id, toolName: name, input: JSON.stringify(args) });
  }
  if (text !== undefined) {
    parts.push({ type: "text-start", id: "t" }, { type: "text-delta", id: "t", delta: text }, { type: "text-end", id: "t" });
  }
  parts.push({ type: "finish", finishReason: { unified: calls.length ? "tool-calls" : "stop", raw: undefined }, usage });
  return { stream: convertArrayToReadableStream(parts) };
}

/** Each command waits (up to 5 s) for the other's flag: both complete only if they ran at once. */
const meet = (mine: string, theirs: string): string =>
  `touch ${mine}; i=0; while [ ! -f ${theirs} ] && [ $i -lt 500 ]; do sleep 0.01; i=$((i+1)); done; ` +
  `[ -f ${theirs} ] && echo ${mine} met ${theirs}`;

test("parallel tool calls run at once through the agent, stream preliminary output, and reach the model rendered", async () => {
  const chat = "ai-chat-1";
  const tools = await toolwireTools(client, { chatId: chat, messageId: "msg-1" });
  assert.ok(tools["execute"] && tools["read_file"]);
  const model = new MockLanguageModelV4({
    doStream: [
      response([
        ["call_a", "execute", { command: meet("a.flag", "b.flag") }],
        ["call_b", "execute", { command: meet("b.flag", "a.flag") }],
        ["call_r", "read_file", { path: "missing.txt" }],
      ]),
      response([], "both met"),
    ],
  });
  const stream = streamText({ model, tools, prompt: "meet", stopWhen: stepCountIs(2) });
  const parts: TextStreamPart<ToolSet>[] = [];
  for await (const part of stream.fullStream) parts.push(part);
  assert.equal(await stream.text, "both met");

  // Each call ran once on the agent under the id derived from chat, message and provider id.
  const results = new Map<string, Result>();
  for (const providerId of ["call_a", "call_b", "call_r"]) {
    const handle = await client.attach(chat, toolCallId(chat, "msg-1", providerId));
    results.set(providerId, await handle.result());
  }
  assert.equal(results.get("call_a")!.output, "a.flag met b.flag\n");
  assert.equal(results.get("call_b")!.output, "b.flag met a.flag\n");
  assert.equal(results.get("call_r")!.outcome, "failed");

  // Preliminary results carried the output while it ran; the final one carries the Result.
  const toolResults = parts.filter((part) => part.type === "tool-result");
  const preliminary = toolResults.filter((part) => part.preliminary === true);
  assert.ok(preliminary.some((part) => part.toolCallId === "call_a" && (part.output as { status: string }).status === "running"));
  const finals = toolResults.filter((part) => part.preliminary !== true);
  assert.deepEqual(finals.map((part) => part.toolCallId).sort(), ["call_a", "call_b", "call_r"]);
  for (const part of finals) {
    const output = part.output as { status: string; result: Result; text: string };
    assert.equal(output.status, "done");
    assert.deepEqual(output.result, results.get(part.toolCallId));
  }

  // What the model was given for each call is exactly renderResult(result).
  const prompt = model.doStreamCalls[1]!.prompt;
  const given = new Map<string, unknown>();
  for (const message of prompt) {
    if (message.role !== "tool") continue;
    for (const item of message.content) {
      if (item.type === "tool-result") given.set(item.toolCallId, item.output);
    }
  }
  for (const [providerId, result] of results) {
    assert.deepEqual(given.get(providerId), { type: "text", value: renderResult(result) });
  }
  assert.equal(
    renderResult(results.get("call_a")!),
    "outcome: completed, exit code 0\ncommand exited with code 0\na.flag met b.flag\n",
  );
});

test("the SDK's abortSignal cancels the call on the agent", async () => {
  const chat = "ai-chat-2";
  const tools = await toolwireTools(client, { chatId: chat }); // default message id: 1 message before it
  const model = new MockLanguageModelV4({
    doStream: [response([["call_long", "execute", { command: "echo up; sleep 30" }]])],
  });
  const controller = new AbortController();
  const stream = streamText({ model, tools, prompt: "wait", abortSignal: controller.signal });
  for await (const part of stream.fullStream) {
    if (part.type === "tool-result" && (part.output as { output?: string }).output === "up\n") controller.abort();
  }
  const handle = await client.attach(chat, toolCallId(chat, "1", "call_long"));
  const result = await handle.result();
  assert.equal(result.outcome, "canceled");
  assert.equal(result.output, "up\n");
});

test("preliminary results carry the newest output, bounded; the final one all of it", async () => {
  const chat = "ai-chat-5";
  const tools = await toolwireTools(client, { chatId: chat, messageId: "m" });
  const command = "i=0; while [ $i -lt 50 ]; do head -c 999 /dev/zero | tr '\\0' x; echo; i=$((i+1)); done";
  const model = new MockLanguageModelV4({ doStream: [response([["call_big", "execute", { command }]])] });
  const stream = streamText({ model, tools, prompt: "big" });
  const preliminary: ToolwireToolOutput[] = [];
  const finals: ToolwireToolOutput[] = [];
  for await (const part of stream.fullStream) {
    if (part.type === "tool-result") (part.preliminary ? preliminary : finals).push(part.output as ToolwireToolOutput);
  }
  const whole = ("x".repeat(999) + "\n").repeat(50);
  assert.equal(finals.length, 1);
  assert.ok(finals[0]!.status === "done" && finals[0]!.result.output === whole);
  const running = preliminary.filter((output) => output.status === "running");
  assert.ok(running.length > 0);
  for (const output of running) assert.ok(output.output.length <= PRELIMINARY_OUTPUT_CHARS);
  assert.deepEqual(running.at(-1), { status: "running", output: whole.slice(-PRELIMINARY_OUTPUT_CHARS), outputBytes: 50_000 });
});

test("a refused call reaches the model as a tool error with the agent's code", async () => {
  const chat = "ai-chat-3";
  const tools = await toolwireTools(client, { chatId: chat, messageId: "m" });
  const model = new MockLanguageModelV4({
    doStream: [response([["call_bad", "execute", { command: "true", colour: "red" }]]), response([], "ok")],
  });
  const stream = streamText({ model, tools, prompt: "bad", stopWhen: stepCountIs(2) });
  const errors: unknown[] = [];
  for await (const part of stream.fullStream) {
    if (part.type === "tool-error") errors.push(part.error);
  }
  assert.equal(errors.length, 1);
  assert.match(String(errors[0]), /bad_args|colour/);
});

test("a provider id repeated in one message is refused", async () => {
  const chat = "ai-chat-4";
  const tools = await toolwireTools(client, { chatId: chat, messageId: "m" });
  const execute = tools["execute"]!.execute!;
  const options = { toolCallId: "call_0", messages: [], context: {} };
  const first = execute({ command: "echo once" }, options) as AsyncIterable<unknown>;
  for await (const _ of first);
  const second = execute({ command: "echo twice" }, options) as AsyncIterable<unknown>;
  await assert.rejects(async () => {
    for await (const _ of second);
  }, /repeated tool call id/);
  const empty = execute({ command: "echo none" }, { ...options, toolCallId: "" }) as AsyncIterable<unknown>;
  await assert.rejects(async () => {
    for await (const _ of empty);
  }, /empty/);
});
