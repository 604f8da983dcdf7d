/**
 * The README's TypeScript section runs as written: its code blocks are the package's
 * examples/ files, character for character, and those files run against a real agent (the
 * client example as a process, twice; the AI SDK one with the SDK's mock model).
 */
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { promisify } from "node:util";
import { after, before, test } from "node:test";
import { MockLanguageModelV4, convertArrayToReadableStream } from "ai/test";
import { connect, toolCallId } from "../src/index.js";
import { reply } from "../examples/chat.js";
import { PACKAGE_ROOT, REPO_ROOT, startAgent, type Agent } from "./agent.js";

let agent: Agent;
before(async () => {
  agent = await startAgent();
});
after(async () => {
  await agent.stop();
});

function section(): string {
  const readme = readFileSync(join(REPO_ROOT, "README.md"), "utf8");
  const start = readme.indexOf("## Use it from TypeScript");
  assert.notEqual(start, -1);
  const end = readme.indexOf("\n## ", start + 1);
  return readme.slice(start, end === -1 ? undefined : end);
}

test("the README's TypeScript blocks are the examples, exactly", () => {
  const blocks = [...section().matchAll(/```ts\n([\s\S]*?)```/g)].map((match) => match[1]);
  const files = ["readme.ts", "chat.ts"].map((name) => readFileSync(join(PACKAGE_ROOT, "examples", name), "utf8"));
  assert.deepEqual(blocks, files);
});

test("the client example runs as written; a second run gets the saved result only", async () => {
  const run = async (): Promise<string> => {
    const { stdout } = await promisify(execFile)(process.execPath, [join(PACKAGE_ROOT, "dist", "examples", "readme.js")], {
      env: { ...process.env, TOOLWIRE_URL: agent.url, TOOLWIRE_TOKEN_FILE: agent.tokenFile },
    });
    return stdout;
  };
  const first = await run();
  const processId = toolCallId("chat-1", "msg-42", "call_1"); // process_id == call_id
  assert.match(first, new RegExp(`^hello from toolwire\ncompleted \\{\\s+exit_code: 0,\\s+signal: null,\\s+process_id: '${processId}'\\s+\\}\n$`));
  const second = await run();
  assert.equal(second, first.slice("hello from toolwire\n".length));
});

test("the AI SDK example runs the model's tool calls on the agent", async () => {
  const client = await connect(agent.url, { token: agent.token });
  try {
    const usage = {
      inputTokens: { total: 1, noCache: 1, cacheRead: 0, cacheWrite: 0 },
      outputTokens: { total: 1, text: 1, reasoning: 0 },
    };
    const model = new MockLanguageModelV4({
      doStream: [
        {
          stream: convertArrayToReadableStream([
            { type: "stream-start", warnings: [] },
            { type: "tool-call", toolCallId: "call_1", toolName: "execute", input: '{"command":"echo one"}' },
            { type: "tool-call", toolCallId: "call_2", toolName: "execute", input: '{"command":"echo two"}' },
            { type: "finish", finishReason: { unified: "tool-calls", raw: undefined }, usage },
          ]),
        },
        {
          stream: convertArrayToReadableStream([
            { type: "stream-start", warnings: [] },
            { type: "text-start", id: "t" },
            { type: "text-delta", id: "t", delta: "done" },
            { type: "text-end", id: "t" },
            { type: "finish", finishReason: { unified: "stop", raw: undefined }, usage },
          ]),
        },
      ],
    });
    const text = await reply(client, model, "readme-chat", [{ role: "user", content: "say one and two" }]);
    assert.equal(text, "done");
    for (const [providerId, output] of [["call_1", "one\n"], ["call_2", "two\n"]] as const) {
      // One message before the reply: the default message id is "1".
      const handle = await client.attach("readme-chat", toolCallId("readme-chat", "1", providerId));
      assert.equal((await handle.result()).output, output);
    }
  } finally {
    await client.close();
  }
});
