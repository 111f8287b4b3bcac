// The demand the client's async iteration puts on the wire, as a real Python server receives
// it (test/fixtures/probe_server.py counts it), over TCP and WebSocket: by default adaptive and
// bounded by bytes (SPEC section 15), `prefetch` the fixed rule, `limit` exact. These mirror the
// Python clients' tests (tests/sync/test_both_clients.py); test/policy.test.js tests the policy.
import assert from "node:assert/strict";
import { fileURLToPath } from "node:url";
import { after, before, describe, test } from "node:test";

import { DEFAULT_BUDGET, MAX_WINDOW, connect } from "../dist/index.js";
import { PYTHON, startRsnet } from "./support.js";

const FIXTURES = fileURLToPath(new URL("./fixtures/", import.meta.url));
const MIB = 1024 * 1024;
/** A 1 MiB item, less what its frame adds, so that it fits the default maxFrameSize. */
const BLOB = MIB - 64;

let server;
before(async () => {
  server = await startRsnet([`${FIXTURES}probe_server.py`], { command: PYTHON });
});
after(async () => server?.stop());

let tags = 0;
const newTag = () => `t${++tags}`;
const turn = () => new Promise((resolve) => setImmediate(resolve));

/** What the server saw on the probed stream `tag` (asked on `conn`, after our pending frames). */
async function probe(conn, tag) {
  await turn(); // the REQUESTs decided so far are written before the question
  const answers = [];
  for await (const answer of conn.subscribe("demand", { tag })) answers.push(answer);
  assert.equal(answers.length, 1);
  return answers[0];
}

for (const transport of ["tcp", "ws"]) {
  describe(`over ${transport}`, () => {
    let conn;
    before(async () => {
      conn = await connect(server[transport]);
    });
    after(async () => conn?.close());

    /** Run `body` on a fresh connection, so that the probed stream is its first (id 1). */
    async function fresh(body) {
      const own = await connect(server[transport]);
      try {
        await body(own);
      } finally {
        await own.close();
      }
    }

    for (const budget of [undefined, 2 * MIB]) {
      test(`by default 1 MiB items keep the demand on the wire within the byte budget (${budget ?? "default"})`, () =>
        fresh(async (own) => {
          const tag = newTag();
          const outstanding = [];
          let taken = 0;
          for await (const blob of own.subscribe("blobs", { tag, size: BLOB }, { budget })) {
            assert.equal(blob.length, BLOB);
            taken += 1;
            outstanding.push((await probe(own, tag)).wire - taken);
            if (taken === 12) break;
          }
          const most = Math.floor((budget ?? DEFAULT_BUDGET) / BLOB); // 4, or 2: never the 256 of old
          assert.ok(outstanding.every((count) => count > 0 && count <= most), `outstanding ${outstanding}, at most ${most}`);
          assert.equal((await probe(own, tag)).cancelled, true, "leaving the loop cancels");
        }));
    }

    test("by default the demand on the wire stays within MAX_WINDOW for small items", () =>
      fresh(async (own) => {
        const tag = newTag();
        const outstanding = [];
        let taken = 0;
        for await (const item of own.subscribe("endless", { tag })) {
          assert.equal(item, taken);
          taken += 1;
          if (taken % 10_000 === 0) outstanding.push((await probe(own, tag)).wire - taken);
          if (taken === 30_000) break;
        }
        assert.equal(outstanding.length, 3);
        assert.ok(outstanding.every((count) => count > 0 && count <= MAX_WINDOW), `outstanding ${outstanding}`);
      }));

    test("prefetch keeps the fixed rule: 8 up front, then 6 each time 6 were consumed", () =>
      fresh(async (own) => {
        const tag = newTag();
        let taken = 0;
        let granted;
        for await (const item of own.subscribe("endless", { tag }, { prefetch: 8 })) {
          assert.equal(item, taken);
          if (++taken === 20) {
            granted = (await probe(own, tag)).wire;
            break;
          }
        }
        assert.equal(granted, 8 + 3 * 6, "20 consumed: refills after the 6th, 12th and 18th item");
        const seen = await probe(own, tag);
        assert.equal(seen.cancelled, true, "leaving the loop cancels");
        assert.equal(seen.requested, 8 + 3 * 6, "and nothing more is requested");
      }));

    for (const [limit, prefetch] of [
      [20, 8],
      [5, 64],
      [0, 8],
      [3, undefined],
      [5, undefined],
      [1000, undefined],
    ]) {
      test(`limit ${limit} is exact demand on the wire (prefetch ${prefetch ?? "adaptive"})`, () =>
        fresh(async (own) => {
          const tag = newTag();
          const got = [];
          for await (const item of own.subscribe("endless", { tag }, { limit, prefetch })) got.push(item);
          assert.deepEqual(got, Array.from({ length: limit }, (_, i) => i));
          const seen = await probe(own, tag);
          if (limit === 0) {
            assert.equal(seen.opened, false, "limit 0: the stream is never opened");
            return;
          }
          assert.equal(seen.cancelled, true, "taking the last item cancels the stream");
          assert.equal(seen.requested, limit);
          assert.equal(seen.emitted, limit);
        }));
    }

    test("a budget sizes the adaptive window only; bad options are refused at once", () => {
      assert.throws(() => conn.subscribe("endless", { tag: newTag() }, { prefetch: 8, budget: 1024 }), RangeError);
      for (const options of [{ budget: 0 }, { prefetch: 0 }, { prefetch: 1.5 }, { limit: -1 }]) {
        assert.throws(() => conn.subscribe("endless", { tag: newTag() }, options), RangeError, JSON.stringify(options));
      }
      assert.equal(conn.streamCount, 0, "nothing was opened");
    });
  });
}
