// One stream of 16-byte items from a real rsnet server: the Node client (async iteration and a
// plain Subscriber) against the Python client, over TCP and WebSocket, in the same run.
//   node bench/throughput.mjs [count] [prefetch]      (after npm run build)
// Run it outside `node --test`: the test runner's async-context tracking slows awaits 3-4x.
import { execFileSync } from "node:child_process";
import { fileURLToPath } from "node:url";

import { connect } from "../dist/index.js";
import { RSNET, startRsnet } from "../test/support.js";

const COUNT = Number(process.argv[2] ?? 1_000_000);
const PREFETCH = Number(process.argv[3] ?? 4096);
const HERE = fileURLToPath(new URL(".", import.meta.url));
const PYTHON = RSNET.replace(/rsnet$/, "python");

async function iterate(conn, count) {
  let received = 0;
  for await (const _ of conn.subscribe("items", { count, size: 16 }, { prefetch: PREFETCH })) received += 1;
  return received;
}

function subscriber(conn, count) {
  return new Promise((resolve, reject) => {
    let received = 0;
    let subscription;
    let granted = 0;
    conn.publisher("items", { count, size: 16 }).subscribe({
      onSubscribe(s) {
        subscription = s;
        granted = PREFETCH;
        s.request(PREFETCH);
      },
      onNext() {
        received += 1;
        if (granted - received <= PREFETCH / 4) {
          subscription.request(PREFETCH - PREFETCH / 4);
          granted += PREFETCH - PREFETCH / 4;
        }
      },
      onError: reject,
      onComplete: () => resolve(received),
    });
  });
}

async function rate(url, consume) {
  const conn = await connect(url);
  await consume(conn, COUNT / 5); // JIT warm-up
  const started = process.hrtime.bigint();
  const received = await consume(conn, COUNT);
  const seconds = Number(process.hrtime.bigint() - started) / 1e9;
  await conn.close();
  if (received !== COUNT) throw new Error(`received ${received} of ${COUNT}`);
  return COUNT / seconds;
}

const server = await startRsnet(["serve", "bench_server:server", "--tcp", "127.0.0.1:0", "--ws", "127.0.0.1:0"], {
  env: { ...process.env, PYTHONPATH: HERE },
});
try {
  console.log(`${COUNT} items of 16 B, prefetch ${PREFETCH}, items/s`);
  for (const transport of ["tcp", "ws"]) {
    const url = server[transport];
    const python = Number(execFileSync(PYTHON, [`${HERE}python_client.py`, url, String(COUNT), String(PREFETCH)]).toString());
    const loop = await rate(url, iterate);
    const plain = await rate(url, subscriber);
    const fmt = (x) => `${(x / 1e6).toFixed(2)}M`;
    console.log(`${transport.padEnd(3)}  node for-await ${fmt(loop)}  node Subscriber ${fmt(plain)}  python ${fmt(python)}  (node/python ${(loop / python).toFixed(2)}x)`);
  }
} finally {
  await server.stop();
}
