/**
 * One model-facing rendering of a Result, the same text as the Python executor's
 * (transport/client/rendering.py; the spec is RENDERING.md, both suites check
 * tests/vectors/rendering.json). Pure.
 */
import type * as P from "./protocol.js";

/**
 * The Result as the model reads it, lines joined by "\n": `outcome: X` with the exit code,
 * signal, and timed-out/canceled flags that add something; then the text when it says more than
 * the output; then the output as the agent cut it (its `[... N bytes omitted ...]` line kept,
 * never re-cut); then how many output bytes were omitted, if any; then, for a tool other than
 * `execute`, what its data holds (a string `content` as is, the rest as compact JSON), since
 * that is where a file tool's answer is.
 */
export function renderResult(result: P.Result): string {
  const data = result.data ?? {};
  let head = `outcome: ${result.outcome}`;
  const exitCode = data["exit_code"];
  if (typeof exitCode === "number" && Number.isInteger(exitCode)) head += `, exit code ${exitCode}`;
  const signal = data["signal"];
  if (signal !== undefined && signal !== null) head += `, signal ${String(signal)}`;
  if (result.timed_out && result.outcome !== "timed_out") head += ", timed out";
  if (result.canceled && result.outcome !== "canceled") head += ", canceled";
  const lines = [head];
  if (result.text !== "" && result.text !== result.output) lines.push(result.text);
  if (result.output !== "") lines.push(result.output);
  if (result.truncated_bytes > 0) {
    lines.push(`(${result.truncated_bytes} of ${result.output_bytes} output bytes omitted)`);
  }
  if (result.tool !== "execute" && Object.keys(data).length > 0) {
    const { content, ...rest } = data as Record<string, unknown>;
    if (typeof content === "string") {
      if (content !== "") lines.push(content);
    } else if (content !== undefined) {
      // Not a string: it goes with the rest, in the place the Python side puts it (last).
      (rest as Record<string, unknown>)["content"] = content;
    }
    if (Object.keys(rest).length > 0) lines.push(JSON.stringify(rest));
  }
  return lines.join("\n");
}
