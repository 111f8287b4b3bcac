// Every golden vector of protocol/vectors/ (frames, conversations, invalid inputs), replayed
// against the sans-I/O core as every side the vector names (protocol/vectors/README.md).
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { test } from "node:test";

import { Connection, Ext, Float64, FrameReader, Scanner, Encoder, writeFrame } from "../dist/index.js";

const VECTORS = new URL("../../../protocol/vectors/", import.meta.url);
const load = (name) => JSON.parse(tagFloats(readFileSync(new URL(name, VECTORS), "utf8"))).vectors;

/** JSON text with every number that has a fraction or exponent (a float64, vectors/README.md)
 *  tagged as {"$float": "..."}: JSON.parse would turn 12.0 into the integer 12. */
function tagFloats(text) {
  let out = "";
  let i = 0;
  while (i < text.length) {
    const c = text[i];
    if (c === '"') {
      let j = i + 1;
      while (text[j] !== '"') j += text[j] === "\\" ? 2 : 1;
      out += text.slice(i, j + 1);
      i = j + 1;
    } else if (c === "-" || (c >= "0" && c <= "9")) {
      const m = /^-?\d+(\.\d+)?([eE][-+]?\d+)?/.exec(text.slice(i, i + 64));
      out += m[1] || m[2] ? `{"$float": "${m[0]}"}` : m[0];
      i += m[0].length;
    } else {
      out += c;
      i += 1;
    }
  }
  return out;
}

const fromHex = (hex) => Uint8Array.from(hex.match(/../g) ?? [], (h) => parseInt(h, 16));
const toHex = (bytes) => Buffer.from(bytes).toString("hex");

/** JSON vector value -> JS value (the three tags of vectors/README.md). */
function fromJson(v) {
  if (Array.isArray(v)) return v.map(fromJson);
  if (v !== null && typeof v === "object") {
    const keys = Object.keys(v);
    if (keys.length === 1 && keys[0] === "$int") return BigInt(v.$int);
    if (keys.length === 1 && keys[0] === "$float") return new Float64(Number(v.$float));
    if (keys.length === 1 && keys[0] === "$bin") return fromHex(v.$bin);
    if (keys.length === 1 && keys[0] === "$ext") return new Ext(v.$ext[0], fromHex(v.$ext[1]));
    return Object.fromEntries(keys.map((k) => [k, fromJson(v[k])]));
  }
  return v;
}

/** A comparable form: integers (number or bigint) by value, floats, bytes, ext. */
function canon(v) {
  if (typeof v === "bigint") return `int:${v}`;
  if (typeof v === "number") return Number.isInteger(v) ? `int:${v}` : `float:${v}`;
  if (v instanceof Uint8Array) return `bin:${toHex(v)}`;
  // A whole float decodes to a plain number (JS cannot tell 12.0 from 12): compared as one.
  if (v instanceof Float64) return Number.isInteger(v.value) ? `int:${v.value}` : `float:${v.value}`;
  if (v instanceof Ext) return `ext:${v.type}:${toHex(v.data)}`;
  if (Array.isArray(v)) return v.map(canon);
  if (v instanceof Map) return { $map: [...v].map(([k, x]) => [canon(k), canon(x)]) };
  if (v !== null && typeof v === "object") return Object.fromEntries(Object.keys(v).map((k) => [k, canon(v[k])]));
  return v;
}

function decodeFrames(bytes) {
  const scanner = new Scanner();
  const reader = new FrameReader();
  const frames = [];
  let pos = 0;
  while (pos < bytes.length) {
    scanner.reset(bytes, bytes.length, Number.MAX_SAFE_INTEGER);
    const end = scanner.scan(pos);
    assert.ok(end > 0, "output ends inside a frame");
    frames.push(reader.read(bytes, pos, end, scanner.flags));
    pos = end;
  }
  return frames;
}

/** Only the keys `expected` lists are compared (vectors/README.md). */
function assertSubset(actual, expected, where) {
  for (const key of Object.keys(expected)) {
    assert.deepEqual(canon(actual[key]), canon(fromJson(expected[key])), `${where}: ${key}`);
  }
}

/** Our events in the vectors' form: one NEXT per item. */
function flatten(events) {
  const out = [];
  for (const e of events) {
    if (e.event === "ITEMS") for (const item of e.items) out.push({ event: "NEXT", stream_id: e.stream_id, item });
    else out.push(e);
  }
  return out;
}

function perform(conn, frame) {
  const f = fromJson(frame);
  switch (f.type) {
    case "HELLO":
      return; // written when a client connection is created
    case "WELCOME":
      return conn.sendWelcome(f.settings.metadata);
    case "SUBSCRIBE":
      return assert.equal(conn.sendSubscribe(f.name, f.params, f.initial_demand, f.metadata), f.stream_id);
    case "OFFER":
      return assert.equal(conn.sendOffer(f.name, f.params, f.metadata), f.stream_id);
    case "ACCEPT":
      return conn.sendAccept(f.stream_id, f.metadata);
    case "REQUEST":
      return conn.sendRequest(f.stream_id, f.n);
    case "CANCEL":
      return conn.sendCancel(f.stream_id);
    case "NEXT":
      return conn.sendNext(f.stream_id, f.item);
    case "BATCH":
      return conn.sendBatch(f.stream_id, f.items);
    case "COMPLETE":
      return conn.sendComplete(f.stream_id);
    case "ERROR":
      return conn.sendError(f.stream_id, f.code, f.message, f.data);
    case "PING":
      return conn.sendPing(f.token);
    case "GO_AWAY":
      return conn.sendGoAway(f.message);
    case "CONN_ERROR":
      return conn.sendConnError(f.code, f.message, f.data);
    default:
      throw new Error(`cannot send ${f.type} through the API`);
  }
}

function replay(vector, side) {
  const conn = new Connection(side, fromJson(vector.config?.[side] ?? {}));
  vector.steps.forEach((step, index) => {
    if (step.side !== side) return;
    const where = `${vector.name} as ${side}, step ${index} (${step.step})`;
    if (step.step === "send" && step.auto) {
      const out = conn.dataToSend();
      const frames = decodeFrames(out);
      assert.equal(frames.length, step.compare.length, `${where}: frame count`);
      step.compare.forEach((expected, i) => assertSubset(frames[i], expected, `${where} frame ${i}`));
    } else if (step.step === "send") {
      for (const frame of step.frames) perform(conn, frame);
      assert.equal(toHex(conn.dataToSend()), step.hex, where);
    } else {
      if (step.step === "receive") conn.receiveData(fromHex(step.hex));
      else conn.receiveEof();
      const events = flatten(conn.eventsReceived());
      assert.equal(events.length, step.events.length, `${where}: events ${JSON.stringify(events.map((e) => e.event))}`);
      step.events.forEach((expected, i) => assertSubset(events[i], expected, `${where} event ${i}`));
      if (step.state) assert.equal(conn.state, step.state, `${where}: state`);
    }
  });
  assert.equal(conn.dataToSend().length, 0, `${vector.name} as ${side}: wrote bytes no step accounts for`);
  return conn;
}

const frames = load("frames.json");
const conversations = load("conversations.json");
const invalid = load("invalid.json");

test("the vector files are all here", () => {
  assert.equal(frames.length, 43);
  assert.ok(conversations.length >= 10 && invalid.length >= 59);
});

for (const vector of frames) {
  test(`frame ${vector.name}`, () => {
    const bytes = fromHex(vector.hex);
    const [decoded] = decodeFrames(bytes);
    if (vector.frame === null) {
      assert.equal(decoded, null, "an extension frame is ignored");
      return;
    }
    assert.deepEqual(canon(decoded), canon(fromJson(vector.frame)));
    if (!vector.decode_only) {
      const out = new Encoder(64);
      writeFrame(out, fromJson(vector.frame));
      assert.equal(toHex(out.take()), vector.hex);
    }
  });
}

for (const vector of [...conversations, ...invalid]) {
  for (const side of vector.roles) {
    test(`${vector.error ? "invalid" : "conversation"} ${vector.name} as ${side}`, () => {
      const conn = replay(vector, side);
      if (vector.error?.scope === "connection") assert.equal(conn.state, "CLOSED");
      if (vector.error?.scope === "stream") assert.equal(conn.state, "OPEN");
    });
  }
}
