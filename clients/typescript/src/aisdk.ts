/**
 * Tools for the Vercel AI SDK: the agent's `describe_tools`, as AI SDK `tool()` definitions
 * whose `execute` runs each call through a toolwire `Client`.
 *
 *   const tools = await toolwireTools(client, { chatId });
 *   const result = streamText({ model, tools, messages, abortSignal });
 *
 * - Ids: a call's id is `toolCallId(chatId, messageId, <the provider's tool call id>)`, so the
 *   agent runs it at most once and a retry of the same tool call gets its saved result.
 *   `messageId` names the assistant message that asked for the call (default: its position in
 *   the conversation, `options.messages.length`, which is the same on every replay of the same
 *   conversation). An empty provider id, or one repeated within one message, is refused before
 *   anything runs (`toolCallIds`' rule): such calls would get each other's results. Make one
 *   tool set per chat request, as the repeat check spans the set's lifetime.
 * - `abortSignal` (the SDK's, from `streamText({abortSignal})`) cancels the call on the agent.
 * - Output streams as preliminary tool results (`{status: "running", output, outputBytes}`, the
 *   newest output so far; `{status: "awaiting_approval"}` while an approval gate is parked), and
 *   the final output is `{status: "done", result, text}`, where `text` is `renderResult(result)`: what the
 *   model is given (`toModelOutput`), the same text as the Python integration gives it.
 * - A refused request (`bad_args`, `conflict`, ...) throws its RequestError: the SDK hands the
 *   model a tool error with the agent's message.
 */
import { jsonSchema, tool, type Tool, type ToolExecutionOptions } from "ai";
import type { CallOptions, Client } from "./client.js";
import { toolCallId } from "./ids.js";
import type * as P from "./protocol.js";
import { renderResult } from "./rendering.js";

/**
 * What a toolwire tool's execute yields: preliminary results (`output`: the newest
 * PRELIMINARY_OUTPUT_CHARS of the output so far, like a terminal's view of it; `outputBytes`:
 * how many bytes the command has printed), then the final one.
 */
export type ToolwireToolOutput =
  | { status: "running"; output: string; outputBytes: number }
  | { status: "awaiting_approval"; output: string; outputBytes: number }
  | { status: "done"; result: P.Result; text: string };

/**
 * Each preliminary result replaces the one before it in the UI stream; sending all the output
 * every time would make a long build's stream grow with the square of its output.
 */
export const PRELIMINARY_OUTPUT_CHARS = 16 * 1024;

function tail(text: string): string {
  if (text.length <= PRELIMINARY_OUTPUT_CHARS) return text;
  const cut = text.slice(-PRELIMINARY_OUTPUT_CHARS);
  const first = cut.charCodeAt(0);
  return first >= 0xdc00 && first <= 0xdfff ? cut.slice(1) : cut; // never half a surrogate pair
}

export interface ToolwireToolsOptions {
  /** The chat the calls belong to (PROTOCOL.md 2). */
  chatId: string;
  /** The assistant message's id (see above); a string, or derived from the execution options. */
  messageId?: string | ((options: ToolExecutionOptions<unknown>) => string);
  /** Only these tools (default: every tool the agent describes). */
  only?: readonly string[];
  /** Per-call options (sandbox, timeout, approval): the chat server's choice, never the model's. */
  callOptions?: (toolName: string, input: Record<string, unknown>) => CallOptions;
}

/** How many messages' provider ids the repeat check remembers. */
const REMEMBERED_MESSAGES = 1000;

/** The agent's tools as AI SDK tools, keyed by tool name. */
export async function toolwireTools(
  client: Client,
  options: ToolwireToolsOptions,
): Promise<Record<string, Tool<Record<string, unknown>, ToolwireToolOutput>>> {
  const definitions = await client.describeTools();
  const seen = new Map<string, Set<string>>(); // message id -> provider ids claimed in it
  const claim = (messageId: string, providerId: string): void => {
    if (providerId === "") throw new Error("the provider's tool call id is empty: refusing to run a call that has no stable id");
    let ids = seen.get(messageId);
    if (ids === undefined) {
      ids = new Set();
      seen.set(messageId, ids);
      if (seen.size > REMEMBERED_MESSAGES) seen.delete(seen.keys().next().value!);
    }
    if (ids.has(providerId)) {
      throw new Error(
        `the provider repeated tool call id ${JSON.stringify(providerId)} in one message: ` +
          "refusing to run it (calls sharing an id would get each other's results)",
      );
    }
    ids.add(providerId);
  };
  const tools: Record<string, Tool<Record<string, unknown>, ToolwireToolOutput>> = {};
  for (const definition of definitions) {
    if (options.only !== undefined && !options.only.includes(definition.name)) continue;
    tools[definition.name] = toolFor(client, options, definition, claim);
  }
  return tools;
}

function toolFor(
  client: Client,
  options: ToolwireToolsOptions,
  definition: P.ToolDefinition,
  claim: (messageId: string, providerId: string) => void,
): Tool<Record<string, unknown>, ToolwireToolOutput> {
  const name = definition.name;
  return tool<Record<string, unknown>, ToolwireToolOutput, {}>({
    description: definition.description,
    inputSchema: jsonSchema<Record<string, unknown>>(definition.input_schema as Parameters<typeof jsonSchema>[0]),
    async *execute(input, execution): AsyncGenerator<ToolwireToolOutput> {
      const messageId =
        typeof options.messageId === "function"
          ? options.messageId(execution)
          : (options.messageId ?? String(execution.messages.length));
      claim(messageId, execution.toolCallId);
      const callId = toolCallId(options.chatId, messageId, execution.toolCallId);
      const signal = execution.abortSignal;
      const cancel = (): void => {
        // The result (canceled, with the output so far) still arrives on the handle.
        client.cancel(options.chatId, [callId]).catch(() => undefined);
      };
      signal?.throwIfAborted();
      const handle = await client.call(options.chatId, callId, name, input, options.callOptions?.(name, input));
      signal?.addEventListener("abort", cancel, { once: true });
      try {
        if (signal?.aborted) cancel();
        for await (const event of handle) {
          if (event.type === "output") {
            yield { status: "running", output: tail(handle.outputText()), outputBytes: handle.offset };
          } else if (event.type === "approval") {
            yield { status: "awaiting_approval", output: tail(handle.outputText()), outputBytes: handle.offset };
          }
        }
        const result = await handle.result();
        yield { status: "done", result, text: renderResult(result) };
      } finally {
        signal?.removeEventListener("abort", cancel);
      }
    },
    toModelOutput({ output }) {
      // Only the final output reaches the model; preliminary ones are for the UI.
      const value = output.status === "done" ? output.text : output.output;
      return { type: "text", value };
    },
  });
}

