// End to end against a real `rsnet broker` (Python): publish with acknowledgements,
// subscribe, resume, cursors, topics, and `follow` across a broker restart.
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, test } from "node:test";

import { BrokerCode, ErrorCode, Float64, HandshakeError, StreamError, codeName, commit, connect, follow, publish, topics } from "../dist/index.js";
import { RSNET, freePort, startRsnet } from "./support.js";

const dataDir = mkdtempSync(join(tmpdir(), "rsnet-js-broker-"));
let broker;
let tcp;
let ws;

async function startBroker() {
  broker = await startRsnet(["broker", "--data-dir", dataDir, "--tcp", `127.0.0.1:${tcp}`, "--ws", `127.0.0.1:${ws}`]);
  return broker;
}

before(async () => {
  tcp = await freePort();
  ws = await freePort();
  await startBroker();
});
after(async () => {
  await broker?.stop();
  rmSync(dataDir, { recursive: true, force: true });
});

async function take(stream, n) {
  const out = [];
  for await (const item of stream) {
    out.push(item);
    if (out.length === n) break;
  }
  return out;
}

test("publish waits for acknowledgements; subscribers read the records from any offset", async () => {
  const conn = await connect(broker.tcp);
  const values = Array.from({ length: 500 }, (_, i) => ({ n: i, big: 2n ** 60n + BigInt(i) }));
  assert.equal(await publish(conn, "js.orders", values, { producer: "p1" }), 500);
  const reader = await connect(broker.ws);
  const records = await take(reader.subscribe("js.orders", { from: "earliest" }), 500);
  assert.deepEqual(records.map((r) => r.offset), Array.from({ length: 500 }, (_, i) => i));
  assert.deepEqual(records.map((r) => r.value), values, "64-bit values stored and returned exactly");
  assert.ok(records.every((r) => r.topic === "js.orders" && typeof r.timestamp === "number"));
  const tail = await take(reader.subscribe("js.orders", { from: 495 }), 5);
  assert.deepEqual(tail.map((r) => r.value.n), [495, 496, 497, 498, 499]);
  await reader.close();
  await conn.close();
});

test("republishing with the same producer and sequences stores nothing twice", async () => {
  const conn = await connect(broker.tcp);
  await publish(conn, "js.idem", ["a", "b", "c"], { producer: "idem-1" });
  await publish(conn, "js.idem", ["b", "c", "d"], { producer: "idem-1", firstSequence: 1 });
  const records = await take(conn.subscribe("js.idem", { from: "earliest" }), 4);
  assert.deepEqual(records.map((r) => r.value), ["a", "b", "c", "d"]);
  // A record that would be a fifth one would show up here; the end is offset 4.
  const [listing] = (await topics(conn)).filter((t) => t.topic === "js.idem");
  assert.equal(listing.next_offset, 4);
  await conn.close();
});

test("an offer without a producer stores records as they come, without deduplication", async () => {
  const conn = await connect(broker.tcp);
  assert.equal(await conn.offer("js.plain", ["x", "y"]), 2);
  assert.equal(await conn.offer("js.plain", ["x", "y"], null), 2);
  const records = await take(conn.subscribe("js.plain", { from: "earliest" }), 4);
  assert.deepEqual(records.map((r) => r.value), ["x", "y", "x", "y"]);
  await conn.close();
});

test("an async source is pulled with the broker's demand", async () => {
  const conn = await connect(broker.ws);
  async function* source() {
    for (let i = 0; i < 3000; i++) yield i;
  }
  assert.equal(await publish(conn, "js.async", source()), 3000);
  const records = await take(conn.subscribe("js.async", { from: "earliest" }, { prefetch: 1000 }), 3000);
  assert.deepEqual(records.map((r) => r.value), Array.from({ length: 3000 }, (_, i) => i));
  await conn.close();
});

test("commit stores a cursor; a subscription with it resumes there", async () => {
  const conn = await connect(broker.tcp);
  await publish(conn, "js.cursor", [10, 11, 12, 13, 14]);
  const echo = await commit(conn, "js.cursor", "group-a", 2n ** 2n - 1n); // offsets may be bigint
  assert.deepEqual(echo, { topic: "js.cursor", cursor: "group-a", offset: 3 });
  const resumed = await take(conn.subscribe("js.cursor", { cursor: "group-a", from: "earliest" }), 2);
  assert.deepEqual(resumed.map((r) => r.value), [13, 14]);
  await assert.rejects(commit(conn, "js.cursor", "group-a", 99), (e) => e instanceof StreamError && e.code === ErrorCode.REJECTED);
  // SPEC 3: a float is not an integer, even a whole one.
  await assert.rejects(commit(conn, "js.cursor", "group-a", new Float64(1)), (e) => e instanceof StreamError && e.code === ErrorCode.REJECTED);
  await conn.close();
});

test("broker errors are typed with their codes", async () => {
  const conn = await connect(broker.tcp);
  await publish(conn, "js.errors", [1]);
  await assert.rejects(take(conn.subscribe("js.errors", { from: 7 }), 1), (e) => {
    assert.ok(e instanceof StreamError && e.code === BrokerCode.OFFSET_OUT_OF_RANGE && e.data.next === 1, String(e));
    assert.equal(e.codeName, "OFFSET_OUT_OF_RANGE", "named as BROKER.md names it, not 'application error 4101'");
    assert.ok(e.message.startsWith("OFFSET_OUT_OF_RANGE: "), e.message);
    return true;
  });
  assert.equal(codeName(4112), "STORAGE_ERROR");
  assert.equal(codeName(4199), "application error 4199");
  await assert.rejects(take(conn.subscribe("bad..name"), 1), (e) => e instanceof StreamError && e.code === ErrorCode.REJECTED);
  await conn.close();
});

test("follow resumes across a broker restart with no gap and no duplicate", async () => {
  const producer = await connect(broker.tcp);
  await publish(producer, "js.follow", Array.from({ length: 50 }, (_, i) => i), { producer: "f" });
  await producer.close();
  const seen = [];
  const records = follow(broker.ws, "js.follow", { from: "earliest", prefetch: 16, retryDelay: 50 });
  for await (const record of records) {
    seen.push(record);
    if (seen.length === 30) break; // leaving the loop closes follow's connection
  }
  // Follow again from where we are, restart the broker underneath, publish more.
  const resumed = follow(broker.ws, "js.follow", { from: seen.length, retryDelay: 50 });
  const next = await resumed.next();
  seen.push(next.value);
  await broker.stop();
  await startBroker();
  const producer2 = await connect(broker.tcp);
  await publish(producer2, "js.follow", Array.from({ length: 20 }, (_, i) => 50 + i), { producer: "f", firstSequence: 50 });
  await producer2.close();
  while (seen.length < 70) seen.push((await resumed.next()).value);
  await resumed.return();
  assert.deepEqual(seen.map((r) => r.offset), Array.from({ length: 70 }, (_, i) => i));
  assert.deepEqual(seen.map((r) => r.value), Array.from({ length: 70 }, (_, i) => i));
});

test("tokens: a reader may subscribe but not publish; publish fails with UNAUTHORIZED, nothing left running", async () => {
  const reader = "reader-token-0123456789abcdef";
  const writer = "writer-token-0123456789abcdef";
  const hash = (token) => execFileSync(RSNET, ["broker", "hash-token"], { input: `${token}\n` }).toString().trim();
  const config = join(dataDir, "auth.toml");
  writeFileSync(
    config,
    `[[auth.tokens]]\nname = "reader"\nhash = "${hash(reader)}"\npublish = []\nsubscribe = ["js.>"]\n\n` +
      `[[auth.tokens]]\nname = "writer"\nhash = "${hash(writer)}"\npublish = ["js.>"]\nsubscribe = ["js.>"]\n`,
  );
  const secured = await startRsnet(["broker", "--config", config, "--tcp", "127.0.0.1:0", "--ws", "127.0.0.1:0"]);
  try {
    await assert.rejects(connect(secured.tcp), (e) => e instanceof HandshakeError && e.code === ErrorCode.UNAUTHORIZED);
    const readerConn = await connect(secured.ws, { token: reader });
    let pulled = 0;
    async function* source() {
      for (let i = 0; i < 1000; i++) {
        pulled += 1;
        yield i;
      }
    }
    await assert.rejects(publish(readerConn, "js.secure", source()), (e) => e instanceof StreamError && e.code === ErrorCode.UNAUTHORIZED);
    assert.equal(pulled, 0, "no record was taken from the source");
    assert.equal(readerConn.streamCount, 0, "no stream left open");
    const writerConn = await connect(secured.tcp, { token: writer });
    assert.equal(await publish(writerConn, "js.secure", [1, 2]), 2);
    const records = await take(readerConn.subscribe("js.secure", { from: "earliest" }), 2);
    assert.deepEqual(records.map((r) => r.value), [1, 2]);
    await writerConn.close();
    await readerConn.close();
  } finally {
    await secured.stop();
  }
});
