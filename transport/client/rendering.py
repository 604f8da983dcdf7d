"""The one model-facing rendering of a Result, shared by every integration (pure: no I/O).

What a model reads back for a tool call must be the truth and nothing else: the outcome (a
`denied` or `canceled` call never reads like a success), the exit code and signal, the agent's
summary, and the output with the agent's own omitted-bytes line where it cut the middle. The
TypeScript client renders the same text from the same rules; both test suites read the cases of
tests/vectors/rendering.json, so the two never drift apart.
"""

from __future__ import annotations

import json

from toolwire.transport.protocol import Result

__all__ = ["render_result"]


def render_result(result: Result) -> str:
    """The text a model is given for `result`, lines joined by "\\n", nothing else added:

    1. `outcome: <outcome>`, then only those that apply, in this order: `, exit code N`
       (data holds an integer `exit_code`), `, signal S` (data holds a non-null `signal`),
       `, timed out` (timed_out, unless the outcome says so), `, canceled` (likewise);
    2. the agent's `text`, when non-empty and not the same as `output`;
    3. `output`, when non-empty, as the agent cut it (never re-cut);
    4. `(<truncated_bytes> of <output_bytes> output bytes omitted)` when bytes were omitted;
    5. for a tool other than `execute` (whose data is on the first line), what its `data`
       holds, since that is where a file tool's answer is: a string `content` (read_file) as
       is, then the rest of `data`, when any is left, as one line of compact JSON (what
       JavaScript's `JSON.stringify` writes, so both clients give the same text).
    """
    head = f"outcome: {result.outcome}"
    data = result.data if isinstance(result.data, dict) else {}
    exit_code = data.get("exit_code")
    # A bool is an int in Python but not an exit code (nor a number in TypeScript).
    if isinstance(exit_code, int) and not isinstance(exit_code, bool):
        head += f", exit code {exit_code}"
    signal = data.get("signal")
    if signal is not None:
        head += f", signal {signal}"
    if result.timed_out and result.outcome != "timed_out":
        head += ", timed out"
    if result.canceled and result.outcome != "canceled":
        head += ", canceled"
    lines = [head]
    if result.text and result.text != result.output:
        lines.append(result.text)
    if result.output:
        lines.append(result.output)
    if result.truncated_bytes > 0:
        lines.append(f"({result.truncated_bytes} of {result.output_bytes} output bytes omitted)")
    if result.tool != "execute" and data:
        rest = dict(data)
        if isinstance(rest.get("content"), str):
            content = rest.pop("content")
            if content:
                lines.append(content)
        elif "content" in rest:
            rest["content"] = rest.pop("content")  # not text: it goes with the rest, last
        if rest:
            lines.append(json.dumps(rest, ensure_ascii=False, separators=(",", ":")))
    return "\n".join(lines)
