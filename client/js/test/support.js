// Start real rsnet processes (the Python server and broker) for end-to-end tests.
import { spawn } from "node:child_process";
import { existsSync } from "node:fs";
import { createServer } from "node:net";
import { fileURLToPath } from "node:url";

const ROOT = fileURLToPath(new URL("../../../", import.meta.url));
/** The rsnet command: $RSNET_BIN, else the worktree's .venv (make test installs it). */
export const RSNET = process.env.RSNET_BIN ?? `${ROOT}.venv/bin/rsnet`;
if (!existsSync(RSNET)) throw new Error(`rsnet not found at ${RSNET}: run "make .venv/.installed" or set RSNET_BIN`);

/** The Python of the same environment, for fixture servers. */
export const PYTHON = RSNET.replace(/rsnet$/, "python");

/**
 * Run `rsnet <args>` (or `command <args>`) and resolve once it announced `listeners` listeners:
 * `{tcp, ws, live, stop()}` (`tls`, `wss` in their place with TLS on; `live`: the broker's live
 * view page, when it serves one).
 * `stop(signal)` ends it and resolves when it exited.
 */
export function startRsnet(args, { listeners = 2, env = process.env, command = RSNET } = {}) {
  const proc = spawn(command, args, { stdio: ["ignore", "ignore", "pipe"], env });
  let stderr = "";
  const urls = {};
  const exited = new Promise((resolve) => proc.once("exit", resolve));
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`rsnet ${args.join(" ")} did not start:\n${stderr}`)), 20000);
    proc.stderr.setEncoding("utf8");
    proc.stderr.on("data", (chunk) => {
      stderr += chunk;
      for (const m of stderr.matchAll(/serving ((tcp|ws|tls|wss):\/\/[^\s]+)/g)) urls[m[2]] = m[1];
      for (const m of stderr.matchAll(/live view on (http:\/\/[^\s]+)/g)) urls.live = m[1];
      if (Object.keys(urls).length >= listeners) {
        clearTimeout(timer);
        resolve({
          ...urls,
          proc,
          stderr: () => stderr,
          stop: async (signal = "SIGTERM") => {
            if (proc.exitCode === null && proc.signalCode === null) proc.kill(signal);
            await exited;
          },
        });
      }
    });
    proc.once("exit", (code) => {
      clearTimeout(timer);
      reject(new Error(`rsnet ${args.join(" ")} exited with ${code}:\n${stderr}`));
    });
  });
}

/** A free TCP port on 127.0.0.1 (for a broker that must restart on the same address). */
export function freePort() {
  return new Promise((resolve, reject) => {
    const server = createServer();
    server.once("error", reject);
    server.listen(0, "127.0.0.1", () => {
      const { port } = server.address();
      server.close(() => resolve(port));
    });
  });
}

/** A Subscriber that records every signal, with promises to wait for counts and the end. */
export class Recorder {
  items = [];
  error = null;
  completed = false;
  subscription = null;
  #waiters = [];
  onSubscribe(s) {
    this.subscription = s;
  }
  onNext(item) {
    this.items.push(item);
    this.#check();
  }
  onError(error) {
    this.error = error;
    this.#check();
  }
  onComplete() {
    this.completed = true;
    this.#check();
  }
  /** Resolves when `predicate(this)` holds (checked at every signal). */
  until(predicate) {
    if (predicate(this)) return Promise.resolve();
    return new Promise((resolve) => this.#waiters.push({ predicate, resolve }));
  }
  #check() {
    this.#waiters = this.#waiters.filter(({ predicate, resolve }) => (predicate(this) ? (resolve(), false) : true));
  }
}
