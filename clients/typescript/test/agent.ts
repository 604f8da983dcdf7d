/**
 * A real `toolwire serve` for the tests, started from the repository's Python virtualenv
 * (TOOLWIRE_PYTHON, else <repo>/.venv/bin/python), as tests/test_serve.py starts it: port 0 on
 * 127.0.0.1 (the agent binds a free port and prints it), a temporary state dir and workspace,
 * and a token file. Plus a TCP relay whose `cut()` drops every relayed connection, as a dropped
 * link or a restarted load balancer does.
 */
import { spawn, type ChildProcess } from "node:child_process";
import { once } from "node:events";
import { existsSync, mkdtempSync, openSync, readFileSync, rmSync, writeFileSync, mkdirSync, closeSync } from "node:fs";
import net from "node:net";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

/** The package root (this file runs as dist/test/agent.js). */
export const PACKAGE_ROOT = resolve(fileURLToPath(new URL(".", import.meta.url)), "../..");
export const REPO_ROOT = resolve(PACKAGE_ROOT, "../..");

export interface Agent {
  url: string;
  token: string;
  tokenFile: string;
  workspace: string;
  stop(): Promise<void>;
  stderr(): string;
}

export async function startAgent(...extra: string[]): Promise<Agent> {
  const dir = mkdtempSync(join(tmpdir(), "toolwire-ts-"));
  const workspace = join(dir, "ws");
  const state = join(dir, "state");
  mkdirSync(workspace);
  const token = `ts-test-token-${process.pid}-${Date.now()}`;
  const tokenFile = join(dir, "token");
  writeFileSync(tokenFile, token + "\n", { mode: 0o600 });
  const stderrPath = join(dir, "serve.stderr");
  const stderrFd = openSync(stderrPath, "w");
  const python = process.env["TOOLWIRE_PYTHON"] ?? join(REPO_ROOT, ".venv", "bin", "python");
  if (!existsSync(python)) {
    throw new Error(`no Python at ${python}: set TOOLWIRE_PYTHON to a virtualenv with toolwire installed (README, "Test it")`);
  }
  const env: NodeJS.ProcessEnv = { ...process.env, PYTHONPATH: REPO_ROOT };
  delete env["TOOLWIRE_TOKEN"];
  const child: ChildProcess = spawn(
    python,
    ["-m", "toolwire.cli.main", "serve", "--host", "127.0.0.1", "--port", "0",
     "--workspace", workspace, "--state-dir", state, "--token-file", tokenFile,
     "--log-level", "warning", ...extra],
    { cwd: REPO_ROOT, env, stdio: ["ignore", "pipe", stderrFd] },
  );
  closeSync(stderrFd);
  const stderr = (): string => readFileSync(stderrPath, "utf8");
  const exited = once(child, "exit");
  let line = "";
  try {
    line = await new Promise<string>((resolveLine, reject) => {
      let buffered = "";
      const timer = setTimeout(() => reject(new Error(`toolwire serve did not start:\n${stderr()}`)), 30_000);
      child.stdout!.setEncoding("utf8");
      child.stdout!.on("data", (chunk: string) => {
        buffered += chunk;
        const end = buffered.indexOf("\n");
        if (end !== -1) {
          clearTimeout(timer);
          resolveLine(buffered.slice(0, end).trim());
        }
      });
      child.once("exit", (code) => {
        clearTimeout(timer);
        reject(new Error(`toolwire serve exited with ${code}:\n${stderr()}`));
      });
    });
  } catch (error) {
    child.kill("SIGKILL");
    rmSync(dir, { recursive: true, force: true });
    throw error;
  }
  const match = /^toolwire listening on (ws:\/\/127\.0\.0\.1:\d+\/v1)$/.exec(line);
  if (match === null) throw new Error(`unexpected first line: ${line}`);
  return {
    url: match[1]!,
    token,
    tokenFile,
    workspace,
    stderr,
    async stop() {
      if (child.exitCode === null && child.signalCode === null) {
        child.kill("SIGTERM"); // as a supervisor stops it: every process it started is stopped
        const timer = setTimeout(() => child.kill("SIGKILL"), 10_000);
        await exited;
        clearTimeout(timer);
      }
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

/** A TCP relay on 127.0.0.1 in front of the agent. */
export class Relay {
  readonly sockets = new Set<net.Socket>();
  accepted = 0;
  private constructor(
    private readonly server: net.Server,
    readonly port: number,
  ) {}

  static async start(upstreamUrl: string): Promise<Relay> {
    const upstream = new URL(upstreamUrl);
    let relay!: Relay;
    const server = net.createServer((downstream) => {
      relay.accepted += 1;
      const up = net.connect(Number(upstream.port), upstream.hostname);
      for (const socket of [downstream, up]) {
        relay.sockets.add(socket);
        socket.on("close", () => relay.sockets.delete(socket));
        socket.on("error", () => undefined);
      }
      downstream.pipe(up);
      up.pipe(downstream);
      downstream.on("close", () => up.destroy());
      up.on("close", () => downstream.destroy());
    });
    server.listen(0, "127.0.0.1");
    await once(server, "listening");
    relay = new Relay(server, (server.address() as net.AddressInfo).port);
    return relay;
  }

  url(): string {
    return `ws://127.0.0.1:${this.port}/v1`;
  }

  /** Both TCP sides of every relayed connection just go away. */
  cut(): void {
    for (const socket of this.sockets) socket.destroy();
  }

  async stop(): Promise<void> {
    this.cut();
    await new Promise<void>((done) => this.server.close(() => done()));
  }
}
