/**
 * Tool call ids derived from the conversation, so every retry of a tool call names it alike
 * (transport/ids.py): a UUIDv5 of "<chat>/<message>/<provider call>" in the namespace of Coder's
 * chatd, so TypeScript, Python and chatd agree on every id.
 */
import { createHash } from "node:crypto";

/** The UUIDv5 namespace of tool call ids (Coder's chatd uses this one). */
export const TOOL_CALL_NAMESPACE = "0af4d6d3-691c-45dd-ac54-55ea97970ebc";

const LONE_SURROGATE = /[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/;

function uuidBytes(uuid: string): Buffer {
  return Buffer.from(uuid.replace(/-/g, ""), "hex");
}

function uuid5(namespace: string, name: string): string {
  const hash = createHash("sha1")
    .update(uuidBytes(namespace))
    .update(Buffer.from(name, "utf8"))
    .digest();
  const bytes = hash.subarray(0, 16);
  bytes[6] = (bytes[6]! & 0x0f) | 0x50; // version 5
  bytes[8] = (bytes[8]! & 0x3f) | 0x80; // RFC 4122 variant
  const hex = bytes.toString("hex");
  return [hex.slice(0, 8), hex.slice(8, 12), hex.slice(12, 16), hex.slice(16, 20), hex.slice(20)].join("-");
}

/**
 * The call id of one provider tool call. Deterministic: the same three strings give the same id
 * on every host and retry. Throws a RangeError for a part that is not valid Unicode (a lone
 * surrogate has no UTF-8 form; replacing it would let two different ids collide).
 */
export function toolCallId(chatId: string, messageId: string, providerCallId: string): string {
  const name = `${chatId}/${messageId}/${providerCallId}`;
  if (LONE_SURROGATE.test(name)) {
    throw new RangeError(`tool call id parts must be valid Unicode text: ${JSON.stringify(name)}`);
  }
  return uuid5(TOOL_CALL_NAMESPACE, name);
}

/**
 * The call ids of every tool call of one assistant message, in order: null where the provider
 * id is empty, and null for EVERY occurrence of a provider id repeated in the message (calls
 * sharing an id would get each other's saved results; Coder's rule). Throws a TypeError for a
 * provider id that is not a string.
 */
export function toolCallIds(
  chatId: string,
  messageId: string,
  providerCallIds: readonly string[],
): (string | null)[] {
  const counts = new Map<string, number>();
  providerCallIds.forEach((id, index) => {
    if (typeof id !== "string") {
      throw new TypeError(`provider call id #${index} is ${typeof id}, not string: ${String(id)}`);
    }
    counts.set(id, (counts.get(id) ?? 0) + 1);
  });
  return providerCallIds.map((id) =>
    id !== "" && counts.get(id) === 1 ? toolCallId(chatId, messageId, id) : null,
  );
}
