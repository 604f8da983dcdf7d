import { stepCountIs, streamText, type LanguageModel, type ModelMessage } from "ai";
import { toolwireTools, type Client } from "toolwire";

/** One reply of a chat: the model calls the agent's tools (in parallel when it asks so). */
export async function reply(
  client: Client,
  model: LanguageModel, // e.g. openai("gpt-5") from @ai-sdk/openai
  chatId: string,
  messages: ModelMessage[],
  abortSignal?: AbortSignal, // aborting cancels the running calls on the agent
): Promise<string> {
  const tools = await toolwireTools(client, { chatId });
  const result = streamText({ model, tools, messages, abortSignal, stopWhen: stepCountIs(10) });
  for await (const part of result.fullStream) {
    if (part.type === "tool-result" && part.preliminary) {
      // part.output is { status: "running", output, outputBytes }: the newest output, for the UI
    }
  }
  return await result.text;
}
