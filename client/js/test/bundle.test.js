// The browser bundle the broker serves (rsnet/broker/static/rsnet-client.js) is committed: it
// must be exactly what scripts/bundle.mjs builds from src/ now, or the page runs an old client.
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { test } from "node:test";

import { BUNDLE, build } from "../scripts/bundle.mjs";

test("the committed browser bundle is built from the current sources", async () => {
  const fresh = await build();
  const committed = readFileSync(BUNDLE, "utf8");
  assert.ok(committed === fresh, `${BUNDLE} is stale: run "npm run bundle" in client/js and commit it`);
});

test("the browser bundle loads without Node's modules and exports the client", async () => {
  const exported = await import(BUNDLE);
  for (const name of ["connect", "publish", "follow", "commit", "topics", "StreamError", "ConnectionLost", "HandshakeError"]) {
    assert.equal(typeof exported[name], "function", name);
  }
  assert.doesNotMatch(readFileSync(BUNDLE, "utf8"), /^import .* from /m, "no static import: one file for the browser");
});
