// The Node WebSocket transport over ws:// reads the server's frames itself (transport.ts,
// WsReader) and gives `ws` all it does not take: against a bare server writing frames of every
// kind, split between reads at every byte, the client must see what `ws` alone would show it.
import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import net from "node:net";
import { test } from "node:test";

import { openTransport } from "../dist/transport.js";

const GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11";

/** A server frame (never masked): FIN and opcode in `first`, the length as short as it goes
 *  unless `long` (the 64-bit form, which `ws` accepts for any length). */
function frame(first, payload, long = false) {
  const n = payload.length;
  const head = long ? [first, 127, 0, 0, 0, 0, (n >>> 24) & 255, (n >>> 16) & 255, (n >>> 8) & 255, n & 255] : n < 126 ? [first, n] : [first, 126, n >> 8, n & 255];
  return Buffer.concat([Buffer.from(head), payload]);
}

/** The payloads of the client's frames (masked, as a client's must be), with their opcodes. */
function clientFrames(bytes) {
  const frames = [];
  let p = 0;
  while (p + 6 <= bytes.length) {
    let n = bytes[p + 1] & 0x7f;
    let h = 2;
    if (n === 126) [n, h] = [bytes.readUInt16BE(p + 2), 4];
    const mask = bytes.subarray(p + h, p + h + 4);
    if (p + h + 4 + n > bytes.length) break;
    const payload = Buffer.from(bytes.subarray(p + h + 4, p + h + 4 + n)).map((b, i) => b ^ mask[i % 4]);
    frames.push({ opcode: bytes[p] & 0x0f, payload });
    p += h + 4 + n;
  }
  return frames;
}

/**
 * One connection's WebSocket server: it answers the upgrade, waits for the client's first
 * message, then writes `script` `step` bytes at a time, each write read on its own.
 */
async function serve(script, step) {
  const received = [];
  const server = net.createServer((socket) => {
    socket.setNoDelay(true);
    let request = Buffer.alloc(0);
    let upgraded = false;
    socket.on("data", async (data) => {
      if (upgraded) {
        received.push(data);
        if (received.length > 1) return;
        for (let p = 0; p < script.length; p += step) {
          socket.write(script.subarray(p, p + step));
          await new Promise((resolve) => setTimeout(resolve, 1));
        }
        return;
      }
      request = Buffer.concat([request, data]);
      const text = request.toString("latin1");
      if (!text.includes("\r\n\r\n")) return;
      upgraded = true;
      const key = /sec-websocket-key: *(\S+)/i.exec(text)[1];
      const accept = createHash("sha1").update(key + GUID).digest("base64");
      socket.write(`HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: ${accept}\r\nSec-WebSocket-Protocol: rsnet\r\n\r\n`);
    });
    socket.on("error", () => {});
  });
  await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
  return { url: new URL(`ws://127.0.0.1:${server.address().port}/`), received, close: () => server.close() };
}

/** Opens the transport, sends one message and records what it reports until it closes. */
async function run(url, maxMessageSize) {
  const transport = await openTransport(url, maxMessageSize);
  const seen = [];
  const closed = new Promise((resolve) => {
    transport.onData = (data) => {
      assert.ok(data instanceof Uint8Array);
      if (data.length) seen.push(Buffer.from(data)); // a copy: the transport may reuse its buffer
    };
    transport.onText = () => seen.push("text");
    transport.onClose = (error) => resolve(error);
  });
  transport.send([new Uint8Array([1, 2, 3])]);
  const error = await closed;
  // Pieces of one message may come apart: join the data between the other events.
  const events = [];
  for (const item of seen) {
    if (typeof item !== "string" && events.length && typeof events.at(-1) !== "string") events[events.length - 1] = Buffer.concat([events.at(-1), item]);
    else events.push(item);
  }
  return { events: events.map((e) => (typeof e === "string" ? e : e.toString("latin1"))), error };
}

const big = Buffer.alloc(300, "x");
const script = Buffer.concat([
  frame(0x82, Buffer.from("one")),
  frame(0x89, Buffer.from("hi")), // ping: `ws` answers with a pong
  frame(0x82, big),
  frame(0x02, Buffer.from("ab")), // a binary message in two fragments, which `ws` assembles
  frame(0x80, Buffer.from("cd")),
  frame(0x82, Buffer.from("fives"), true),
  frame(0x82, Buffer.alloc(0)),
  frame(0x81, Buffer.from("no")), // text: the client's PROTOCOL_ERROR
  frame(0x82, Buffer.from("six")),
  frame(0x88, Buffer.from([0x03, 0xe8])), // close 1000
]);

for (const step of [1, 3, 7, script.length]) {
  test(`ws://: frames of every kind, written ${step} byte(s) at a time, reach the client in order as ws would give them`, async () => {
    const server = await serve(script, step);
    try {
      const { events, error } = await run(server.url, 1 << 20);
      assert.deepEqual(events, [`one${big.toString("latin1")}abcdfives`, "text", "six"]);
      assert.equal(error, undefined); // a clean close, answered
      const frames = clientFrames(Buffer.concat(server.received));
      assert.deepEqual(frames[0], { opcode: 2, payload: Buffer.from([1, 2, 3]) });
      assert.ok(frames.some((f) => f.opcode === 0x0a && f.payload.toString() === "hi"), "no pong for the ping");
      assert.ok(frames.some((f) => f.opcode === 0x08), "the close was not answered");
    } finally {
      server.close();
    }
  });
}

test("ws://: a message over the limit fails the connection as ws does, and is not delivered", async () => {
  const server = await serve(Buffer.concat([frame(0x82, Buffer.from("ok")), frame(0x82, Buffer.alloc(200, "y")), frame(0x82, Buffer.from("late"))]), 1);
  try {
    const { events, error } = await run(server.url, 100);
    assert.deepEqual(events, ["ok"]);
    assert.match(error?.message ?? "", /Max payload size exceeded/);
  } finally {
    server.close();
  }
});

test("ws://: a masked frame from the server fails the connection as ws does", async () => {
  const masked = Buffer.from([0x82, 0x83, 0, 0, 0, 0, 1, 2, 3]);
  const server = await serve(Buffer.concat([frame(0x82, Buffer.from("ok")), masked, frame(0x82, Buffer.from("late"))]), 2);
  try {
    const { events, error } = await run(server.url, 1 << 20);
    assert.deepEqual(events, ["ok"]);
    assert.match(error?.message ?? "", /MASK must be clear/);
  } finally {
    server.close();
  }
});
