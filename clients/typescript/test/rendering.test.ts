/** renderResult against the shared vectors (tests/vectors/rendering.json, also read by the Python suite). */
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";
import { renderResult, type Result } from "../src/index.js";
import { REPO_ROOT } from "./agent.js";

const vectors = JSON.parse(readFileSync(join(REPO_ROOT, "tests", "vectors", "rendering.json"), "utf8")) as {
  cases: { name: string; result: Result; rendered: string }[];
};

test("the vectors file has cases", () => {
  assert.ok(vectors.cases.length >= 10);
});

for (const { name, result, rendered } of vectors.cases) {
  test(`renders: ${name}`, () => {
    assert.equal(renderResult(result), rendered);
  });
}
