// The client's demand handling against a real server-side Connection over an in-memory pipe
// (the sans-I/O core on both ends, no network): coalescing, saturation at 2^63-1 (rule 3.17),
// request(n <= 0) (rule 3.9), and a server that sends more than requested (rule 1.1).
import assert from "node:assert/strict";
import { test } from "node:test";

import { Client, Connection, Encoder, ErrorCode, StreamError, writeFrame } from "../dist/index.js";
import { Recorder } from "./support.js";

const MAX = 2n ** 63n - 1n;
const tick = () => new Promise((resolve) => setImmediate(resolve));

/** A Client wired to a server Connection; `server.events()` flushes and returns what it saw. */
function pair() {
  const server = new Connection("server");
  const transport = {
    messageBased: false,
    buffered: 0,
    sent: [],
    send(chunks) {
      for (const chunk of chunks) if (chunk.length) server.receiveData(chunk);
    },
    drained: () => Promise.resolve(),
    end() {},
    destroy() {},
    onData: () => {},
    onClose: () => {},
    onText: () => {},
  };
  const conn = new Connection("client");
  server.receiveData(conn.dataToSend());
  server.sendWelcome();
  conn.receiveData(server.dataToSend());
  conn.eventsReceived();
  server.eventsReceived();
  const client = new Client(conn, transport, "memory://");
  const toClient = (bytes) => transport.onData(bytes);
  return {
    client,
    server,
    toClient,
    async events() {
      await tick();
      return server.eventsReceived();
    },
  };
}

test("requests made in one turn go out as one REQUEST; demand saturates at 2^63-1 (rule 3.17)", async () => {
  const { client, server, toClient, events } = pair();
  const recorder = new Recorder();
  recorder.onSubscribe = function (s) {
    this.subscription = s;
    s.request(3);
    s.request(4);
  };
  client.publisher("p").subscribe(recorder);
  recorder.subscription.request(5);
  recorder.subscription.request(6);
  const [subscribe, first] = await events();
  assert.equal(subscribe.event, "SUBSCRIBE");
  assert.equal(subscribe.initial_demand, 7, "demand requested in onSubscribe rides on SUBSCRIBE");
  assert.deepEqual([first.event, first.n], ["REQUEST", 11], "later requests of one turn: one REQUEST");
  server.sendAccept(subscribe.stream_id);
  toClient(server.dataToSend());
  recorder.subscription.request(2n ** 62n);
  recorder.subscription.request(2n ** 62n);
  recorder.subscription.request(1);
  const requests = await events();
  assert.deepEqual(
    requests.map((e) => [e.event, e.n]),
    [["REQUEST", MAX]],
    "one REQUEST, saturated at 2^63-1, never beyond",
  );
  assert.equal(server.outstandingDemand(subscribe.stream_id), Number.MAX_SAFE_INTEGER, "unbounded at the server");
  server.sendBatch(subscribe.stream_id, Array.from({ length: 1000 }, (_, i) => i));
  toClient(server.dataToSend());
  assert.equal(recorder.items.length, 1000);
  assert.equal(recorder.error, null);
});

/** A subscriber on publisher "p" with demand 1, its stream accepted by the server. */
async function accepted() {
  const { client, server, toClient, events } = pair();
  const recorder = new Recorder();
  client.publisher("p").subscribe(recorder);
  recorder.subscription.request(1);
  const [subscribe] = await events();
  server.sendAccept(subscribe.stream_id);
  toClient(server.dataToSend());
  return { recorder, events };
}

test("request(0) fails the subscriber locally (rule 3.9) and cancels at the server", async () => {
  const { recorder, events } = await accepted();
  recorder.subscription.request(0);
  assert.ok(recorder.error instanceof StreamError);
  assert.equal(recorder.error.code, ErrorCode.INVALID_REQUEST);
  assert.deepEqual((await events()).map((e) => e.event), ["CANCEL"], "no REQUEST(0) on the wire");
  recorder.subscription.request(1); // rule 3.6: a no-op now
  assert.deepEqual(await events(), []);
});

test("request(1.5) fails as rule 3.9 says, and says an integer is wanted", async () => {
  const { recorder } = await accepted();
  recorder.subscription.request(1.5);
  assert.equal(recorder.error.code, ErrorCode.INVALID_REQUEST);
  assert.equal(recorder.error.detail, "rule 3.9: request(1.5) must be a positive integer");
});

test("a server that sends beyond demand gets FLOW_CONTROL; the items within demand are delivered (rule 1.1)", async () => {
  const { client, server, toClient, events } = pair();
  const recorder = new Recorder();
  client.publisher("p").subscribe(recorder);
  recorder.subscription.request(2);
  const [subscribe] = await events();
  server.sendAccept(subscribe.stream_id);
  server.sendNext(subscribe.stream_id, "a");
  toClient(server.dataToSend());
  // The server-side Connection refuses to over-send, so write the offending frame by hand.
  const out = new Encoder(64);
  writeFrame(out, { type: "BATCH", stream_id: subscribe.stream_id, items: ["b", "c"] });
  toClient(out.take());
  assert.deepEqual(recorder.items, ["a"]);
  assert.ok(recorder.error instanceof StreamError);
  assert.equal(recorder.error.code, ErrorCode.FLOW_CONTROL);
  const [error] = await events();
  assert.equal(error.event, "ERROR");
  assert.equal(error.code, ErrorCode.FLOW_CONTROL, "the server is told why");
});

test("unknown error codes are delivered unchanged, up to 2^63-1", async () => {
  const { client, server, toClient, events } = pair();
  const recorder = new Recorder();
  client.publisher("p").subscribe(recorder);
  recorder.subscription.request(1);
  const [subscribe] = await events();
  server.sendError(subscribe.stream_id, MAX, "custom", { why: 2n ** 60n });
  toClient(server.dataToSend());
  assert.equal(recorder.error.code, MAX);
  assert.equal(recorder.error.codeName, `application error ${MAX}`);
  assert.deepEqual(recorder.error.data, { why: 2n ** 60n });
  const recorder2 = new Recorder();
  client.publisher("q").subscribe(recorder2);
  recorder2.subscription.request(1);
  const [second] = await events();
  server.sendError(second.stream_id, 77, "from a later version");
  toClient(server.dataToSend());
  assert.equal(recorder2.error.code, 77);
  assert.equal(recorder2.error.codeName, "unknown code 77");
});

test("an empty BATCH (0 items is allowed) hands the waiting iterator nothing", async () => {
  const { client, server, toClient, events } = pair();
  const items = client.subscribe("p");
  const first = items.next(); // waits: nothing has arrived
  const [subscribe] = await events();
  assert.equal(subscribe.initial_demand, 4, "adaptive demand: budget / maxFrameSize items before any arrived");
  server.sendAccept(subscribe.stream_id);
  toClient(server.dataToSend());
  const out = new Encoder(64);
  writeFrame(out, { type: "BATCH", stream_id: subscribe.stream_id, items: [] });
  toClient(out.take());
  server.sendNext(subscribe.stream_id, "a");
  toClient(server.dataToSend());
  assert.deepEqual(await first, { value: "a", done: false });
  items.cancel();
});

test("an iterator hands out the items of several buffered frames in order, then those of a frame it waited for", async () => {
  const { client, server, toClient, events } = pair();
  const items = client.subscribe("p", null, { prefetch: 100 });
  const [subscribe] = await events();
  server.sendAccept(subscribe.stream_id);
  server.sendBatch(subscribe.stream_id, [1, 2, 3]);
  toClient(server.dataToSend());
  assert.equal((await items.next()).value, 1); // the first frame is partly taken ...
  server.sendBatch(subscribe.stream_id, [4]);
  server.sendBatch(subscribe.stream_id, [5, 6]);
  toClient(server.dataToSend()); // ... when two more arrive in one read
  const taken = [];
  for (let i = 0; i < 5; i++) taken.push((await items.next()).value);
  assert.deepEqual(taken, [2, 3, 4, 5, 6]);
  const waiting = items.next(); // nothing buffered: it waits
  server.sendBatch(subscribe.stream_id, [7, 8]);
  server.sendNext(subscribe.stream_id, 9);
  toClient(server.dataToSend());
  assert.deepEqual(await waiting, { value: 7, done: false });
  assert.deepEqual([(await items.next()).value, (await items.next()).value], [8, 9]);
  server.sendComplete(subscribe.stream_id);
  toClient(server.dataToSend());
  assert.deepEqual(await items.next(), { value: undefined, done: true });
});

test("an iterator's refill goes out while items are still buffered, before the event loop turns", async () => {
  const { client, server, toClient, events } = pair();
  const items = client.subscribe("p", null, { prefetch: 8 }); // 8 up front, then 6 each time 6 were taken
  const [subscribe] = await events();
  assert.equal(subscribe.initial_demand, 8);
  server.sendAccept(subscribe.stream_id);
  server.sendBatch(subscribe.stream_id, [1, 2, 3, 4, 5, 6, 7, 8]);
  toClient(server.dataToSend());
  for (let i = 1; i <= 6; i++) assert.equal((await items.next()).value, i); // microtasks only
  // No macrotask ran since: a refill sent on the next turn would not be here yet, and a
  // consumer with items left would not let that turn come until it had taken them all.
  assert.deepEqual(server.eventsReceived().map((e) => [e.event, e.n]), [["REQUEST", 6]]);
  assert.equal((await items.next()).value, 7);
  items.cancel();
});

test("an iterator lets go of the items it handed out, even while frames keep arriving before it drains", async () => {
  // Memory stays bounded by what is buffered: a consumer that never empties its buffer (the
  // server refills it first) must not keep every item it has taken.
  const v8 = await import("node:v8");
  const vm = await import("node:vm");
  v8.setFlagsFromString("--expose-gc");
  const gc = vm.runInNewContext("gc");
  const { client, server, toClient, events } = pair();
  const items = client.subscribe("p", null, { prefetch: 1000 });
  const [subscribe] = await events();
  server.sendAccept(subscribe.stream_id);
  const taken = [];
  for (let frame = 0; frame < 50; frame++) {
    server.sendBatch(subscribe.stream_id, Array.from({ length: 10 }, (_, i) => ({ frame, i })));
    toClient(server.dataToSend());
    // Take 10 items, so that the buffer is never empty when the next frame arrives (5 stay).
    for (let i = 0; i < (frame === 0 ? 5 : 10); i++) taken.push(new WeakRef((await items.next()).value));
  }
  await new Promise((resolve) => setImmediate(resolve)); // WeakRefs hold their targets until the turn ends
  gc();
  const alive = taken.slice(0, 400).filter((ref) => ref.deref() !== undefined).length;
  assert.equal(alive, 0, "items taken long ago are garbage");
  items.cancel();
});
