/**
 * The servers of the tests: clients/testbed (throwaway lockd instances, PostgreSQL behind
 * fence-proxy, an HTTP service behind it), started once per test file.
 *
 * The binary is $LOCKD_TESTBED, else target/debug/testbed of the repository. Missing, the tests
 * FAIL with the command that builds it.
 */
import { spawn, type ChildProcessWithoutNullStreams } from "node:child_process";
import { existsSync } from "node:fs";
import * as path from "node:path";
import { createInterface, type Interface } from "node:readline";

/** The package's root (tests run from dist/test/). */
export const PACKAGE_ROOT = path.resolve(__dirname, "..", "..");
export const REPO_ROOT = path.resolve(PACKAGE_ROOT, "..", "..");

export class Testbed {
  servers: any;
  private lines: string[] = [];
  private waiting: ((line: string | null) => void)[] = [];
  private ended = false;
  private queue: Promise<unknown> = Promise.resolve();
  private stderr = "";

  private constructor(private readonly proc: ChildProcessWithoutNullStreams, rl: Interface) {
    rl.on("line", (line) => {
      const w = this.waiting.shift();
      if (w) w(line);
      else this.lines.push(line);
    });
    rl.on("close", () => {
      this.ended = true;
      for (const w of this.waiting.splice(0)) w(null);
    });
    proc.stderr.on("data", (d: Buffer) => {
      this.stderr = (this.stderr + d.toString()).slice(-8000);
    });
  }

  static async start(): Promise<Testbed> {
    const binary = process.env.LOCKD_TESTBED || path.join(REPO_ROOT, "target", "debug", "testbed");
    if (!existsSync(binary)) {
      throw new Error(
        `the testbed binary ${binary} is missing: build it with \`cargo build --workspace --bins\` (or set LOCKD_TESTBED)`,
      );
    }
    const proc = spawn(binary, [], { stdio: ["pipe", "pipe", "pipe"] });
    const bed = new Testbed(proc, createInterface({ input: proc.stdout }));
    const spawned = new Promise<void>((resolve, reject) => {
      proc.once("spawn", resolve);
      proc.once("error", reject);
    });
    await spawned;
    const first = await bed.readLine();
    if (first === null) {
      throw new Error(`the testbed ${binary} exited before describing its servers: ${bed.stderr}`);
    }
    bed.servers = JSON.parse(first);
    return bed;
  }

  private readLine(): Promise<string | null> {
    const line = this.lines.shift();
    if (line !== undefined) return Promise.resolve(line);
    if (this.ended) return Promise.resolve(null);
    return new Promise((resolve) => this.waiting.push(resolve));
  }

  /** Sends one command and returns the text of its `ok` answer (throws on anything else). */
  command(line: string): Promise<string> {
    const run = async () => {
      this.proc.stdin.write(line + "\n");
      const answer = ((await this.readLine()) ?? "").trim();
      if (!answer.startsWith("ok")) throw new Error(`testbed ${JSON.stringify(line)}: ${answer || "no answer"}`);
      return answer.slice(3);
    };
    const p = this.queue.then(run, run);
    this.queue = p.catch(() => undefined);
    return p;
  }

  /** Closes its stdin (it stops everything) and waits for it to exit. */
  async close(): Promise<void> {
    if (this.proc.exitCode !== null || this.proc.signalCode !== null) return;
    const exited = new Promise<void>((resolve) => this.proc.once("exit", () => resolve()));
    this.proc.stdin.end();
    const timer = setTimeout(() => this.proc.kill("SIGKILL"), 60_000);
    await exited;
    clearTimeout(timer);
  }
}
