/** `npm run check:types`: the checked-in protocol types match the schema, and a drift fails it. */
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { promisify } from "node:util";
import { test } from "node:test";
import { PACKAGE_ROOT, REPO_ROOT } from "./agent.js";

const script = join(PACKAGE_ROOT, "scripts", "gen-types.mjs");
const run = promisify(execFile);

test("the checked-in types match docs/protocol.schema.json", async () => {
  const { stdout } = await run(process.execPath, [script, "--check"]);
  assert.match(stdout, /matches/);
});

test("a schema that gained a field makes the check fail", async () => {
  const schema = JSON.parse(readFileSync(join(REPO_ROOT, "docs", "protocol.schema.json"), "utf8"));
  schema.$defs.Call.properties.added_in_test = { type: "integer" };
  const dir = mkdtempSync(join(tmpdir(), "toolwire-schema-"));
  try {
    const path = join(dir, "schema.json");
    writeFileSync(path, JSON.stringify(schema));
    await assert.rejects(run(process.execPath, [script, "--check", "--schema", path]), (error: { code?: number; stderr?: string }) => {
      assert.equal(error.code, 1);
      assert.match(error.stderr ?? "", /stale/);
      return true;
    });
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
