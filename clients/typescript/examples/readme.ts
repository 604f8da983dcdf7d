import { readFileSync } from "node:fs";
import { connect, toolCallId } from "toolwire";

const url = process.env["TOOLWIRE_URL"] ?? "ws://127.0.0.1:7411/v1";
const token = readFileSync(process.env["TOOLWIRE_TOKEN_FILE"] ?? "token", "utf8").trim();

const client = await connect(url, { token });
try {
  const callId = toolCallId("chat-1", "msg-42", "call_1"); // the same id on every retry
  const handle = await client.call("chat-1", callId, "execute", { command: "echo hello from toolwire" });
  for await (const event of handle) {
    // started, output (with byte offsets), approval, approval_resolved
    if (event.type === "output") process.stdout.write(event.data);
  }
  const result = await handle.result(); // exactly one, truthful
  console.log(result.outcome, result.data);
} finally {
  await client.close();
}
