// msgpack as SPEC 3 requires it, where JavaScript makes it easy to get wrong.
import assert from "node:assert/strict";
import { test } from "node:test";

import { Connection, ErrorCode, Ext, Float64, ProtocolError, decode, encode } from "../dist/index.js";

const hex = (bytes) => Buffer.from(bytes).toString("hex");
const bytes = (h) => Uint8Array.from(Buffer.from(h, "hex"));

/** A client connection past WELCOME that subscribed to "x" (stream 1) with `demand`. */
function subscribed(demand) {
  const conn = new Connection("client");
  conn.dataToSend();
  conn.receiveData(bytes("93020180"));
  conn.eventsReceived();
  conn.sendSubscribe("x", null, demand);
  conn.dataToSend();
  return conn;
}

test("integers are encoded as msgpack integers at every size, never as floats", () => {
  assert.equal(hex(encode(2 ** 32)), "cf0000000100000000");
  assert.equal(hex(encode(2 ** 53 - 1)), "cf001fffffffffffff");
  assert.equal(hex(encode(2 ** 60)), "cf1000000000000000"); // an exact number beyond 2^53
  assert.equal(hex(encode(-(2 ** 40))), "d3ffffff0000000000");
  assert.equal(hex(encode(2n ** 63n - 1n)), "cf7fffffffffffffff");
  assert.equal(hex(encode(2n ** 64n - 1n)), "cfffffffffffffffff");
  assert.equal(hex(encode(-(2n ** 63n))), "d38000000000000000");
  assert.equal(hex(encode(5n)), "05", "small bigints take the shortest form");
  assert.throws(() => encode(2n ** 64n), RangeError);
});

test("64-bit integers decode exactly: number when safe, bigint beyond", () => {
  assert.equal(decode(bytes("cf001fffffffffffff")), 2 ** 53 - 1);
  assert.equal(decode(bytes("cf0020000000000001")), 2n ** 53n + 1n);
  assert.equal(decode(bytes("cfffffffffffffffff")), 2n ** 64n - 1n);
  assert.equal(decode(bytes("d38000000000000000")), -(2n ** 63n));
  assert.equal(decode(bytes("cf0000000000000015")), 21, "a long form of a small int is a number");
  for (const value of [0, 1, -1, 2 ** 31, 2 ** 32 + 7, -(2 ** 50), 2n ** 62n + 3n, -(2n ** 62n)]) {
    assert.equal(decode(encode(value)), value);
  }
});

test("floats: fractions are float64; a whole float needs Float64 to stay one", () => {
  assert.equal(hex(encode(1.5)), "cb3ff8000000000000");
  assert.equal(hex(encode(12)), "0c");
  assert.equal(hex(encode(new Float64(12))), "cb4028000000000000");
  assert.equal(decode(bytes("cb4028000000000000")), 12);
  assert.equal(decode(bytes("ca3fc00000")), 1.5, "float32 is accepted");
});

test("strings, binary, ext and maps with binary keys", () => {
  assert.equal(hex(encode("é")), "a2c3a9");
  assert.equal(hex(encode(new Uint8Array([0, 255]))), "c40200ff");
  const ext = decode(bytes("d50501 02".replace(" ", "")));
  assert.ok(ext instanceof Ext && ext.type === 5 && hex(ext.data) === "0102");
  assert.equal(hex(encode(ext)), "d5050102");
  const map = decode(bytes("82c4014101a16202"));
  assert.ok(map instanceof Map, "a map with a binary key decodes as a Map");
  assert.deepEqual([...map.keys()].map((k) => (typeof k === "string" ? k : hex(k))), ["41", "b"]);
  assert.equal(hex(encode(map)), "82c4014101a16202");
  assert.deepEqual(decode(bytes("81a16101")), { a: 1 }, "string keys only: a plain object");
  const proto = decode(encode(JSON.parse('{"__proto__": {"polluted": 1}, "k": 2}')));
  assert.deepEqual(Object.keys(proto), ["__proto__", "k"], "a __proto__ key is kept as an own key");
  assert.equal({}.polluted, undefined, "and never sets a prototype");
});

test("only plain objects encode as maps: a Date, Set, RegExp, Error or class instance is refused, not sent as {}", () => {
  class Reading {
    constructor() {
      this.celsius = 21;
    }
  }
  for (const [value, name] of [
    [new Date(0), "Date"],
    [new Set([1]), "Set"],
    [/x/, "RegExp"],
    [new Error("e"), "Error"],
    [Promise.resolve(1), "Promise"],
    [new Reading(), "Reading"],
    [{ at: new Date(0) }, "Date"],
  ]) {
    assert.throws(() => encode(value), (error) => error instanceof TypeError && error.message.includes(`a ${name} is not encodable`), name);
  }
  assert.equal(hex(encode({ a: 1 })), "81a16101");
  assert.equal(hex(encode(Object.assign(Object.create(null), { a: 1 }))), "81a16101", "a null-prototype object is plain");
  assert.equal(hex(encode(Uint8Array.of(1, 2).buffer)), "c4020102", "an ArrayBuffer is its bytes");
  assert.equal(hex(encode(Uint16Array.of(0x0102))), "c4020201", "a typed array is its bytes, in memory order");
});

test("what SPEC 3 forbids is refused", () => {
  assert.throws(() => decode(bytes("810102")), ProtocolError, "integer map keys");
  assert.throws(() => decode(bytes("a2c328")), ProtocolError, "invalid UTF-8");
  assert.throws(() => decode(bytes("c1")), ProtocolError, "0xc1 is never used");
  assert.throws(() => decode(bytes("91".repeat(513) + "00")), ProtocolError, "deeper than 512 levels");
  assert.equal(decode(bytes("91".repeat(511) + "00")).length, 1);
  assert.throws(() => decode(bytes("91".repeat(512) + "c40100")), ProtocolError, "binary 513 levels deep");
  assert.deepEqual(decode(bytes("91".repeat(511) + "c40100")).flat(511), [Uint8Array.of(0)]);
});

test("a frame that cannot fit is refused from its length header, before its bytes arrive", () => {
  const conn = new Connection("client", { max_frame_size: 16384 });
  conn.dataToSend();
  // WELCOME, then the first 6 bytes of a NEXT whose item claims 1 GiB.
  conn.receiveData(bytes("93020180"));
  assert.equal(conn.state, "OPEN");
  conn.receiveData(bytes("931501c640000000"));
  const [closed] = conn.eventsReceived().filter((e) => e.event === "CLOSED");
  assert.equal(closed.code, 4); // FRAME_TOO_LARGE
  assert.equal(closed.by_peer, false);
});

test("frames split across reads, byte by byte, are reassembled", () => {
  const conn = subscribed(3);
  const frames = bytes("931201809315" + "01" + "a3616263" + "931501" + "cd1234");
  for (const b of frames) conn.receiveData(Uint8Array.of(b));
  const events = conn.eventsReceived();
  assert.deepEqual(
    events.map((e) => e.event),
    ["ACCEPT", "ITEMS", "ITEMS"],
  );
  assert.deepEqual(
    events.slice(1).flatMap((e) => e.items),
    ["abc", 0x1234],
  );
  assert.deepEqual(
    events.slice(1).map((e) => e.nbytes),
    [7, 6],
    "each frame's size on the wire, however it arrived (what adaptive demand sizes items by)",
  );
});

test("items report the bytes of their NEXT or BATCH frame, several frames to a read", () => {
  const conn = subscribed(10);
  // ACCEPT, BATCH of ["ab", "cd", 7], NEXT 1 KiB of binary: one read.
  const blob = "c5" + "0400" + "78".repeat(1024);
  conn.receiveData(bytes("931201809316" + "01" + "93" + "a26162" + "a26364" + "07" + "931501" + blob));
  const items = conn.eventsReceived().filter((e) => e.event === "ITEMS");
  assert.deepEqual(items.map((e) => e.items.length), [3, 1]);
  assert.deepEqual(items.map((e) => e.nbytes), [4 + 3 + 3 + 1, 3 + 3 + 1024]);
});

test("binary items (bin 8, 16 and 32) decode to copies, not views of the received bytes, alone in a BATCH or mixed", () => {
  const conn = subscribed(10);
  const bin16 = "c5" + "0100" + "ab".repeat(256);
  const bin32 = "c6" + "00000003" + "010203";
  // ACCEPT; BATCH [bin8 "\x00\xff", bin16 256 x 0xab, bin32 1 2 3]; BATCH [bin8 "\x07", "s", 5]: one read.
  const received = bytes("931201" + "80" + "931601" + "93" + "c40200ff" + bin16 + bin32 + "931601" + "93" + "c40107" + "a173" + "05");
  conn.receiveData(received);
  const [all, mixed] = conn.eventsReceived().filter((e) => e.event === "ITEMS");
  assert.deepEqual(all.items, [Uint8Array.of(0, 255), new Uint8Array(256).fill(0xab), Uint8Array.of(1, 2, 3)]);
  assert.deepEqual(mixed.items, [Uint8Array.of(7), "s", 5]);
  for (const item of [...all.items, mixed.items[0]]) {
    assert.ok(item instanceof Uint8Array && item.buffer !== received.buffer, "a copy, not a view of the received bytes");
  }
  received.fill(0); // the receive buffer reused: the items keep their bytes
  assert.deepEqual(all.items[0], Uint8Array.of(0, 255));
  assert.deepEqual(mixed.items[0], Uint8Array.of(7));
});

test("NEXT and BATCH frames of bin 8 items (read in one pass) decode as the generic path does: copies, sizes, demand, errors", () => {
  const conn = subscribed(20);
  const items = (n, from) => Array.from({ length: n }, (_, i) => "c402" + (from + i).toString(16).padStart(2, "0") + "ff").join("");
  // ACCEPT; BATCH of 3 (fixarray); BATCH of 16 (array 16); NEXT of one; an empty bin 8: one read, as a Node Buffer.
  const received = Buffer.from("931201" + "80" + "931601" + "93" + items(3, 0) + "931601" + "dc0010" + items(16, 3) + "931501" + "c400", "hex");
  conn.receiveData(received);
  const events = conn.eventsReceived().filter((e) => e.event === "ITEMS");
  assert.deepEqual(events.map((e) => e.items.length), [3, 16, 1]);
  assert.deepEqual(events.map((e) => e.nbytes), [4 + 3 * 4, 6 + 16 * 4, 5]);
  assert.deepEqual(events[1].items[15], Uint8Array.of(18, 0xff));
  assert.deepEqual(events[2].items[0], new Uint8Array(0));
  for (const item of events.flatMap((e) => e.items)) {
    assert.ok(Object.getPrototypeOf(item) === Uint8Array.prototype && item.buffer !== received.buffer, "a plain copy, not a view of the received bytes");
  }
  received.fill(0);
  assert.deepEqual(events[0].items[0], Uint8Array.of(0, 0xff));
  assert.equal(conn.outstandingDemand(1), 0);
  // Beyond demand: FLOW_CONTROL, a stream error; a frame for a stream never opened: the connection fails.
  conn.receiveData(bytes("931501" + "c40101"));
  assert.deepEqual(conn.eventsReceived().map((e) => [e.event, e.code]), [["ERROR", ErrorCode.FLOW_CONTROL]]);
  conn.receiveData(bytes("931609" + "91" + "c40101"));
  assert.deepEqual(conn.eventsReceived().map((e) => [e.event, e.code]), [["CLOSED", ErrorCode.PROTOCOL_ERROR]]);
});

test("a BATCH of binary items split across reads, byte by byte, decodes the same; one that outgrows max_frame_size is refused mid-way", () => {
  const open = (options) => {
    const conn = new Connection("client", options);
    conn.dataToSend();
    conn.receiveData(bytes("93020180"));
    conn.sendSubscribe("x", null, 1000);
    conn.dataToSend();
    conn.receiveData(bytes("931201" + "80"));
    conn.eventsReceived();
    return conn;
  };
  const conn = open();
  const batch = bytes("931601" + "94" + "c40101" + "c400" + "c403020304" + "c5000105");
  for (const b of batch) conn.receiveData(Uint8Array.of(b));
  const [items] = conn.eventsReceived();
  assert.deepEqual(items.items, [Uint8Array.of(1), new Uint8Array(0), Uint8Array.of(2, 3, 4), Uint8Array.of(5)]);
  // 100 items of 200 bytes cannot fit 16384 bytes: refused at the length header of the item
  // that crosses the limit (the 82nd), before its bytes arrive.
  const small = open({ max_frame_size: 16384 });
  const item = "c4c8" + "ab".repeat(200);
  small.receiveData(bytes("931601" + "dc0064" + item.repeat(81) + "c4c8"));
  const [closed] = small.eventsReceived().filter((e) => e.event === "CLOSED");
  assert.equal(closed?.code, 4); // FRAME_TOO_LARGE
});

test("a client answered in HTTP (a web port given for an rsnet one) is told so", () => {
  const conn = new Connection("client");
  conn.dataToSend();
  conn.receiveData(new TextEncoder().encode("HTTP/1.1 400 Bad Request\r\n\r\n"));
  const [closed] = conn.eventsReceived();
  assert.equal(closed.event, "CLOSED");
  assert.equal(closed.message, "the server answered in HTTP, not the rsnet protocol: is it a web port?");
});
