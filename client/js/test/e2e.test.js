// End to end against a real `rsnet serve --demo` (Python) over TCP and WebSocket.
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";

import { ConnectionLost, ErrorCode, HandshakeError, StreamError, connect, follow } from "../dist/index.js";
import { createServer } from "node:net";
import { Recorder, startRsnet } from "./support.js";

/** A port on 127.0.0.1 nothing listens on (bound, then closed). */
async function freePort() {
  const probe = createServer();
  await new Promise((resolve) => probe.listen(0, "127.0.0.1", resolve));
  const { port } = probe.address();
  await new Promise((resolve) => probe.close(resolve));
  return port;
}

let server;
before(async () => {
  server = await startRsnet(["serve", "--demo", "--tcp", "127.0.0.1:0", "--ws", "127.0.0.1:0"]);
});
after(async () => server?.stop());

for (const transport of ["tcp", "ws"]) {
  describe(`over ${transport}`, () => {
    let conn;
    before(async () => {
      conn = await connect(server[transport]);
    });
    after(async () => conn?.close());

    test("a stream delivers every item in order, then completes", async () => {
      const items = [];
      for await (const item of conn.subscribe("range", { start: 5, count: 3000 }, { prefetch: 64 })) items.push(item);
      assert.deepEqual(items, Array.from({ length: 3000 }, (_, i) => i + 5));
      assert.equal(conn.streamCount, 0);
    });

    test("exact flow control: request 10, then 5, gets exactly 15 (rule 1.1)", async () => {
      const recorder = new Recorder();
      conn.publisher("range", { count: 1000 }).subscribe(recorder);
      recorder.subscription.request(10);
      await recorder.until((r) => r.items.length >= 10 || r.error);
      assert.equal(recorder.items.length, 10);
      recorder.subscription.request(5);
      await recorder.until((r) => r.items.length >= 15 || r.error);
      // A round trip on the same connection: an over-sending server would have been caught by
      // now (the client answers a 16th item with FLOW_CONTROL and reports the error).
      const probe = [];
      for await (const item of conn.subscribe("range", { count: 2 })) probe.push(item);
      assert.deepEqual(probe, [0, 1]);
      assert.equal(recorder.error, null);
      assert.deepEqual(recorder.items, Array.from({ length: 15 }, (_, i) => i));
      recorder.subscription.cancel();
    });

    test("leaving the loop cancels mid-stream; the connection stays usable", async () => {
      let seen = 0;
      for await (const item of conn.subscribe("range", { count: 1_000_000 }, { prefetch: 128 })) {
        assert.equal(item, seen);
        if (++seen === 500) break;
      }
      assert.equal(conn.streamCount, 0, "the stream closed at the client");
      const again = [];
      for await (const item of conn.subscribe("range", { start: 1, count: 3 })) again.push(item);
      assert.deepEqual(again, [1, 2, 3]);
    });

    test("an endless stream can be cancelled through the Subscription", async () => {
      const recorder = new Recorder();
      conn.publisher("ticks", { interval: 0.001 }).subscribe(recorder);
      recorder.subscription.request(2n ** 63n - 1n); // unbounded (rule 3.17)
      await recorder.until((r) => r.items.length >= 20);
      recorder.subscription.cancel();
      recorder.subscription.cancel(); // rule 3.7: idempotent
      assert.equal(recorder.error, null);
      const again = [];
      for await (const item of conn.subscribe("range", { count: 2 })) again.push(item);
      assert.deepEqual(again, [0, 1]);
    });

    test("errors arrive typed, with the protocol code and name", async () => {
      await assert.rejects(
        async () => {
          for await (const _ of conn.subscribe("no-such-publisher"));
        },
        (error) => error instanceof StreamError && error.code === ErrorCode.UNKNOWN_PUBLISHER && error.codeName === "UNKNOWN_PUBLISHER",
      );
      await assert.rejects(
        async () => {
          for await (const _ of conn.subscribe("range", { count: -1 }));
        },
        (error) => error instanceof StreamError && error.code === ErrorCode.REJECTED && /count/.test(error.detail),
      );
      const items = [];
      await assert.rejects(
        async () => {
          for await (const item of conn.subscribe("fail", { n: 3 })) items.push(item);
        },
        (error) => error instanceof StreamError && error.code === ErrorCode.APPLICATION_ERROR && error.codeName === "APPLICATION_ERROR",
      );
      assert.deepEqual(items, [0, 1, 2], "items before the error are delivered");
    });

    test("request(0) fails the stream locally with INVALID_REQUEST (rule 3.9); the connection lives", async () => {
      const recorder = new Recorder();
      conn.publisher("range", { count: 100 }).subscribe(recorder);
      recorder.subscription.request(0);
      await recorder.until((r) => r.error);
      assert.ok(recorder.error instanceof StreamError);
      assert.equal(recorder.error.code, ErrorCode.INVALID_REQUEST);
      recorder.subscription.request(5); // rule 3.6: a no-op after the stream ended
      const again = [];
      for await (const item of conn.subscribe("range", { count: 2 })) again.push(item);
      assert.deepEqual(again, [0, 1]);
    });

    test("64-bit integers round-trip exactly, as bigint beyond 2^53", async () => {
      const start = 2n ** 62n;
      const items = [];
      for await (const item of conn.subscribe("range", { start, count: 3 })) items.push(item);
      assert.deepEqual(items, [start, start + 1n, start + 2n]);
      const edge = [];
      for await (const item of conn.subscribe("range", { start: 2 ** 53 - 2, count: 4 })) edge.push(BigInt(item));
      assert.deepEqual(edge, [0n, 1n, 2n, 3n].map((i) => 2n ** 53n - 2n + i));
      const negative = [];
      for await (const item of conn.subscribe("range", { start: -(2n ** 63n), count: 1 })) negative.push(item);
      assert.deepEqual(negative, [-(2n ** 63n)]);
    });
  });
}

test("a server refuses a protocol version it does not speak", async () => {
  await assert.rejects(
    connect(server.tcp, { versions: [99] }),
    (error) =>
      error instanceof HandshakeError && error.code === ErrorCode.UNSUPPORTED_VERSION && error.data.versions.includes(1),
  );
});

test("close() is a clean GO_AWAY: the server closes the transport", async () => {
  const conn = await connect(server.ws);
  const items = [];
  for await (const item of conn.subscribe("range", { count: 2 })) items.push(item);
  // With a minute of patience allowed, close() returns as soon as the server closed.
  const started = Date.now();
  await conn.close(60000);
  assert.ok(Date.now() - started < 30000);
  await assert.rejects(async () => {
    for await (const _ of conn.subscribe("range", { count: 1 }));
  }, ConnectionLost);
});

test("close() with a stream open ends it with ConnectionLost", async () => {
  const conn = await connect(server.tcp);
  const stream = conn.subscribe("ticks", { interval: 0.01 });
  const first = await stream.next();
  assert.equal(first.value, 0);
  const outcome = (async () => {
    try {
      for await (const _ of stream);
      return "completed";
    } catch (error) {
      return error;
    }
  })();
  await conn.close(60000);
  assert.ok((await outcome) instanceof ConnectionLost);
});

test("a URL no transport can use is a TypeError at once; an address nobody answers is a HandshakeError that says so once", async () => {
  for (const url of ["not a url", "http://127.0.0.1:1", "tcp://127.0.0.1", "udp://127.0.0.1:7600"]) {
    await assert.rejects(connect(url), (e) => e instanceof TypeError && e.message.includes(JSON.stringify(url)), url);
    const started = Date.now();
    await assert.rejects(follow(url, "t").next(), TypeError, "follow does not retry a URL it can never use");
    assert.ok(Date.now() - started < 1000);
  }
  const closed = await freePort();
  for (const url of [`tcp://127.0.0.1:${closed}`, `ws://127.0.0.1:${closed}/`]) {
    await assert.rejects(connect(url), (e) => {
      assert.ok(e instanceof HandshakeError && e.code === null, String(e));
      assert.equal(e.message.split("cannot connect").length, 2, e.message);
      return true;
    });
  }
});

test("a WebSocket URL at the TCP port is told the server speaks rsnet there, not HTTP", async () => {
  // An outside check: it said "Parse Error: Expected HTTP/, RTSP/ or ICE/".
  const url = server.tcp.replace("tcp://", "ws://") + "/";
  await assert.rejects(connect(url), (e) => {
    assert.ok(e instanceof HandshakeError, String(e));
    assert.equal(e.message, `cannot connect to ${url}: the server answered in the rsnet protocol, not HTTP: connect with tcp://`);
    return true;
  });
});

test("a connect that times out closes its socket, the WebSocket still upgrading included", async () => {
  // A listener that accepts and then says nothing: no HTTP upgrade answer, no WELCOME.
  const open = new Set();
  const silent = createServer((socket) => {
    open.add(socket);
    socket.on("close", () => open.delete(socket));
    socket.on("error", () => {});
    socket.resume(); // read (and drop) what comes, so that the client's end is seen
  });
  await new Promise((resolve) => silent.listen(0, "127.0.0.1", resolve));
  const { port } = silent.address();
  try {
    for (const url of [`ws://127.0.0.1:${port}/`, `tcp://127.0.0.1:${port}`]) {
      await assert.rejects(connect(url, { handshakeTimeout: 200 }), (e) => e instanceof HandshakeError && e.code === ErrorCode.TIMEOUT, url);
      // The listener sees the connection end: nothing of the failed connect is left open (a
      // browser would hold up every later WebSocket to this host behind one left connecting).
      const deadline = Date.now() + 5000;
      while (open.size && Date.now() < deadline) await new Promise((resolve) => setTimeout(resolve, 20));
      assert.equal(open.size, 0, `${url}: the timed-out connection is still open`);
    }
  } finally {
    for (const socket of open) socket.destroy();
    silent.close();
  }
});

test("a token is required when the server has one", async () => {
  const secured = await startRsnet(["serve", "--demo", "--tcp", "127.0.0.1:0", "--token", "s3cret-token"], { listeners: 1 });
  try {
    await assert.rejects(connect(secured.tcp), (e) => e instanceof HandshakeError && e.code === ErrorCode.UNAUTHORIZED);
    await assert.rejects(connect(secured.tcp, { token: "wrong" }), (e) => e instanceof HandshakeError && e.code === ErrorCode.UNAUTHORIZED);
    const conn = await connect(secured.tcp, { token: "s3cret-token" });
    const items = [];
    for await (const item of conn.subscribe("range", { count: 2 })) items.push(item);
    assert.deepEqual(items, [0, 1]);
    await conn.close();
  } finally {
    await secured.stop();
  }
});

test("a server that dies mid-stream ends the stream with ConnectionLost", async () => {
  const doomed = await startRsnet(["serve", "--demo", "--tcp", "127.0.0.1:0"], { listeners: 1 });
  const conn = await connect(doomed.tcp);
  const stream = conn.subscribe("ticks", { interval: 0.01 });
  assert.equal((await stream.next()).value, 0);
  await doomed.stop("SIGKILL");
  await assert.rejects(async () => {
    for await (const _ of stream);
  }, ConnectionLost);
  await conn.closed;
});

test("a server shutting down (GO_AWAY) lets open streams run; new ones fail at once", async () => {
  const leaving = await startRsnet(["serve", "--demo", "--tcp", "127.0.0.1:0", "--grace", "2"], { listeners: 1 });
  const conn = await connect(leaving.tcp);
  const stream = conn.subscribe("ticks", { interval: 0.05 });
  assert.equal((await stream.next()).value, 0);
  leaving.proc.kill("SIGTERM"); // rsnet serve: GO_AWAY, drain for --grace seconds, then close
  const outcome = (async () => {
    const items = [];
    try {
      for await (const item of stream) items.push(item);
      return { items, error: null };
    } catch (error) {
      return { items, error };
    }
  })();
  // The GO_AWAY arrives while the stream keeps delivering; a new subscription then fails locally.
  assert.equal(typeof (await conn.goAway), "string");
  await assert.rejects(async () => {
    for await (const _ of conn.subscribe("range", { count: 1 }));
  }, (e) => e instanceof StreamError && e.code === ErrorCode.GOING_AWAY);
  const { items, error } = await outcome;
  assert.ok(items.length >= 3, `the open stream went on during the drain (${items.length} more ticks)`);
  assert.ok(error instanceof ConnectionLost, "ended when the drain deadline expired");
  assert.equal(error.code, ErrorCode.GOING_AWAY);
  await leaving.stop();
});
