// Binary items stay whole after later reads: the client reads each socket into one reused
// buffer (TCP) and reads runs of bin 8 items in one pass, so every item it hands out must be a
// copy, never a view of the bytes it received (test/fixtures/bytes_server.py).
import assert from "node:assert/strict";
import { fileURLToPath } from "node:url";
import { after, before, test } from "node:test";

import { connect } from "../dist/index.js";
import { PYTHON, Recorder, startRsnet } from "./support.js";

const FIXTURES = fileURLToPath(new URL("./fixtures/", import.meta.url));
let server;

before(async () => {
  server = await startRsnet([`${FIXTURES}bytes_server.py`], { command: PYTHON });
});
after(async () => server?.stop());

const COUNT = 20000; // at 100 bytes, about 2 MB: many reads of 64 KiB

/** The index of the item whose bytes these are, or -1 if they are not one item's. */
function index(item, size) {
  if (!(item instanceof Uint8Array) || item.length !== size) return -1;
  const view = new DataView(item.buffer, item.byteOffset, item.byteLength);
  const i = view.getUint32(0);
  for (let at = 4; at < size; at += 4) if (view.getUint32(at) !== i) return -1;
  return i;
}

function checkAll(items, size) {
  assert.equal(items.length, COUNT);
  const wrong = items.findIndex((item, i) => index(item, size) !== i);
  assert.equal(wrong, -1, `item ${wrong} changed after it was handed out`);
}

for (const transport of ["tcp", "ws"]) {
  // 100 bytes: bin 8 (the one-pass read); 300 bytes: bin 16 (the generic read).
  for (const size of [100, 300]) {
    test(`${transport}: ${COUNT} items of ${size} bytes, all kept by for await, are intact`, async () => {
      const conn = await connect(server[transport]);
      const items = [];
      for await (const item of conn.subscribe("blobs", { count: COUNT, size }, { prefetch: 4096 })) items.push(item);
      checkAll(items, size);
      await conn.close();
    });

    test(`${transport}: ${COUNT} items of ${size} bytes, all kept by a Subscriber, are intact`, async () => {
      const conn = await connect(server[transport]);
      const recorder = new Recorder();
      conn.publisher("blobs", { count: COUNT, size }).subscribe(recorder);
      recorder.subscription.request(COUNT);
      await recorder.until((r) => r.completed || r.error);
      assert.equal(recorder.error, null);
      checkAll(recorder.items, size);
      await conn.close();
    });
  }
}
