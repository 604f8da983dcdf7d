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
 * never re-cut); then how many output bytes were omitted, if any.
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
  return lines.join("\n");
}
