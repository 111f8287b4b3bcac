// Keepalive and stream limits against a real rsnet server configured tightly (300 ms
// keepalive, 2 concurrent streams per client): test/fixtures/tight_server.py.
import assert from "node:assert/strict";
import { fileURLToPath } from "node:url";
import { after, before, test } from "node:test";

import { ConnectionLost, ErrorCode, StreamError, connect } from "../dist/index.js";
import { PYTHON, Recorder, startRsnet } from "./support.js";

const FIXTURES = fileURLToPath(new URL("./fixtures/", import.meta.url));
let server;

before(async () => {
  server = await startRsnet([`${FIXTURES}tight_server.py`], { command: PYTHON });
});
after(async () => server?.stop());

const pause = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

test("the WELCOME's keepalive interval is used: an idle client stays connected", async () => {
  const conn = await connect(server.tcp, { keepaliveInterval: 60000 }); // our proposal is ignored
  assert.equal(conn.serverSettings.keepalive_interval, 300);
  // Idle for well over 3 intervals: only our PINGs (and PONGs) keep the server from closing.
  await pause(1500);
  const items = [];
  for await (const item of conn.subscribe("range", { count: 2 })) items.push(item);
  assert.deepEqual(items, [0, 1]);
  await conn.close();
});

test("a server that goes silent is detected after 3 intervals (TIMEOUT)", async () => {
  const conn = await connect(server.ws);
  const recorder = new Recorder();
  conn.publisher("ticks", { interval: 10 }).subscribe(recorder);
  recorder.subscription.request(1);
  server.proc.kill("SIGSTOP"); // the process is frozen: no byte, no PONG
  try {
    await recorder.until((r) => r.error);
  } finally {
    server.proc.kill("SIGCONT");
  }
  assert.ok(recorder.error instanceof ConnectionLost);
  assert.equal(recorder.error.code, ErrorCode.TIMEOUT);
  await conn.closed;
});

test("at the server's max_streams a new subscription fails locally; the others go on", async () => {
  const conn = await connect(server.tcp);
  const a = conn.subscribe("ticks", { interval: 0.01 });
  const b = conn.subscribe("ticks", { interval: 0.01 });
  assert.equal((await a.next()).value, 0);
  assert.equal((await b.next()).value, 0);
  await assert.rejects(
    async () => {
      for await (const _ of conn.subscribe("range", { count: 1 }));
    },
    (e) => e instanceof StreamError && e.code === ErrorCode.TOO_MANY_STREAMS,
  );
  await a.return();
  const items = [];
  for await (const item of conn.subscribe("range", { count: 1 })) items.push(item);
  assert.deepEqual(items, [0], "a slot is free again once a stream ended");
  assert.equal((await b.next()).value, 1);
  await conn.close();
});

test("offering to a server without a sink of that name is refused with a code", async () => {
  const conn = await connect(server.tcp);
  await assert.rejects(conn.offer("nowhere", [1, 2, 3]), (e) => e instanceof StreamError && e.code === ErrorCode.UNKNOWN_PUBLISHER);
  await conn.close();
});
