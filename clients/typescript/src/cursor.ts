/**
 * Byte-offset bookkeeping of one call's streamed output: each byte once, in order, also across
 * re-attaches and invalid UTF-8 (transport/client/cursor.py, line for line; pure).
 *
 * `offset` is the next byte offset expected. A chunk whose bytes were all delivered is dropped;
 * one that overlaps is trimmed to its new bytes (cut in the UTF-8 encoding, never inside a
 * character); one that starts beyond `offset` is a retention jump (PROTOCOL.md 5.2), kept in
 * `gaps`. The agent decodes with replacement, so one U+FFFD in `data` stands for 1 to 3 raw
 * bytes and `offset + utf8Length(data)` can overshoot: the cursor keeps an `anchor` (the last
 * offset known exactly) and the text since, and a re-attach resumes from the anchor, trimming
 * the repeated text off.
 */
const encoder = new TextEncoder();
const decoder = new TextDecoder();

export function utf8Length(text: string): number {
  return encoder.encode(text).length;
}

function countReplacements(text: string): number {
  let count = 0;
  for (let i = text.indexOf("\ufffd"); i !== -1; i = text.indexOf("\ufffd", i + 1)) count++;
  return count;
}

export class OutputCursor {
  offset: number;
  /** The least the true next offset can be (< offset only after U+FFFD). */
  low: number;
  /** The newest offset known exactly (a chunk start). */
  anchor: number;
  /** Text delivered from `anchor` on (non-empty only after U+FFFD). */
  sinceAnchor = "";
  /** Re-reading `sinceAnchor` after a re-attach from the anchor. */
  replaying = false;
  /** UTF-16 units of `sinceAnchor` the replay has repeated so far. */
  matched = 0;
  readonly gaps: [number, number][] = [];
  /** The next chunk may repeat bytes we have (a request of ours moved the agent's cursor back). */
  rewound = true;

  constructor(offset = 0) {
    this.offset = offset;
    this.low = offset;
    this.anchor = offset;
  }

  /** Where a re-attach must start so that no byte is skipped. */
  get resumeOffset(): number {
    return this.anchor;
  }

  /** The new part of a chunk as [offset, text], or null if it brings nothing new. */
  take(offset: number, data: string): [number, string] | null {
    if (this.replaying || (this.rewound && this.sinceAnchor !== "" && offset === this.anchor)) {
      return this.takeReplay(offset, data);
    }
    if (!this.rewound && this.low <= offset && offset < this.offset) {
      this.settle(offset); // the last chunk ended here: its U+FFFD were single bytes
    }
    if (offset > this.offset) {
      this.gaps.push([this.offset, offset]);
      this.settle(offset);
    }
    const raw = encoder.encode(data);
    let skip = Math.max(0, this.offset - offset);
    while (skip < raw.length && raw[skip]! >= 0x80 && raw[skip]! <= 0xbf) skip++; // never start inside a character
    if (skip >= raw.length) return null; // all of it was delivered before (or it is empty)
    this.rewound = false;
    const text = skip ? decoder.decode(raw.subarray(skip)) : data;
    const start = offset + skip;
    if (this.sinceAnchor !== "" || skip) {
      this.sinceAnchor += text;
    } else {
      this.anchor = offset;
      this.sinceAnchor = data;
    }
    this.advance(offset + raw.length);
    return [start, text];
  }

  /**
   * The agent re-reads from our anchor: the same bytes from the same character boundary decode
   * to the same text, so it repeats `sinceAnchor` first. Matching is by text, and every chunk
   * start (an exact offset) becomes the new anchor.
   */
  private takeReplay(offset: number, data: string): [number, string] | null {
    this.rewound = false;
    if (this.replaying && offset !== this.anchor) {
      // Chunks on one connection are contiguous: this one starts where the text matched so far ends.
      this.sinceAnchor = this.sinceAnchor.slice(this.matched);
      this.anchor = offset;
      this.matched = 0;
    }
    this.replaying = true;
    const rest = this.sinceAnchor.slice(this.matched);
    if (rest.startsWith(data)) {
      this.matched += data.length;
      return null;
    }
    if (!data.startsWith(rest)) {
      // Not what we had: the agent no longer retains those bytes. Take it as new.
      this.replaying = false;
      this.gaps.push([this.anchor, offset]);
      this.anchor = offset;
      this.sinceAnchor = data;
      this.advance(offset + utf8Length(data));
      return [offset, data];
    }
    const text = data.slice(rest.length);
    this.replaying = false;
    this.matched = 0;
    this.sinceAnchor = data;
    this.advance(offset + utf8Length(data));
    return [this.offset - utf8Length(text), text];
  }

  private settle(exact: number): void {
    this.offset = this.low = this.anchor = exact;
    this.sinceAnchor = "";
    this.replaying = false;
    this.matched = 0;
  }

  /** `sinceAnchor` now runs from `anchor` to `end` (an upper bound when it holds U+FFFD). */
  private advance(end: number): void {
    this.offset = end;
    this.low = end - 2 * countReplacements(this.sinceAnchor);
    if (this.low === end) this.settle(end);
  }
}
