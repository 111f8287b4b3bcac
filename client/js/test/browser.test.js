// The live view in real headless Chromium, served by a real broker (its HTTP port): the page finds
// the broker's WebSocket by itself, records arrive, and lowering the page's demand lowers both
// the delivered rate and, on a backpressure topic, the producer's.
import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { existsSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, test } from "node:test";
import { fileURLToPath } from "node:url";

import { connect, topics } from "../dist/index.js";
import { freePort, startRsnet } from "./support.js";

const CHROMIUM = process.env.CHROMIUM ?? "/usr/bin/chromium";
const ARTIFACTS = fileURLToPath(new URL("../test-results/", import.meta.url));
const skip = existsSync(CHROMIUM) ? false : `Chromium not found at ${CHROMIUM}: apt-get install chromium (as root; make test does it), or set CHROMIUM`;

const dir = mkdtempSync(join(tmpdir(), "rsnet-js-live-"));
let broker;
let browser;

before(async () => {
  if (skip) return;
  const config = join(dir, "rsnet.toml");
  writeFileSync(config, '[topic_defaults]\nslow_subscriber = { policy = "backpressure", max_lag = 200 }\n');
  const listen = ["--tcp", "127.0.0.1:0", "--ws", "127.0.0.1:0", "--metrics", "127.0.0.1:0"];
  const { chromium } = await import("playwright-core");
  // Both at once; each is kept as soon as it is up, so that after() ends it if the other failed.
  await Promise.all([
    startRsnet(["broker", "--config", config, ...listen], { listeners: 3 }).then((started) => (broker = started)),
    chromium
      .launch({
        executablePath: CHROMIUM,
        args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update", "--disable-sync", "--no-first-run"],
      })
      .then((launched) => (browser = launched)),
  ]);
});

after(async () => {
  await browser?.close();
  await broker?.stop();
  rmSync(dir, { recursive: true, force: true });
});

const pause = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

test("the live view shows records, and its demand control slows a backpressure topic's producer", { skip, timeout: 90000 }, async () => {
  // A producer as fast as the broker lets it be: it is pulled with the broker's demand.
  const producer = await connect(broker.tcp);
  let produced = 0;
  let producing = true;
  async function* readings() {
    while (producing) {
      produced += 1;
      yield { sensor: "kitchen", celsius: 20 + (produced % 50) / 10, n: produced };
    }
  }
  await producer.offer("live.bp", [{ first: true }]); // the topic exists before the page looks
  const offering = producer.offer("live.bp", readings());

  const page = await browser.newPage({ viewport: { width: 1000, height: 760 } });
  const errors = [];
  page.on("pageerror", (error) => errors.push(error));
  page.on("console", (message) => message.type() === "error" && errors.push(message.text())); // e.g. a CSP refusal
  await page.goto(`${broker.live}?topic=live.bp&demand=2000`); // no broker=: from /live/config.json
  await page.waitForFunction(() => window.liveView?.delivered > 200, null, { timeout: 30000 });
  await page.waitForFunction(() => document.querySelectorAll("#records tbody tr").length > 5);
  await page.waitForFunction(() => [...document.querySelectorAll("#topics tbody tr")].some((r) => r.dataset.topic === "live.bp"));

  async function measure(ms) {
    const [d0, p0] = [await page.evaluate(() => window.liveView.delivered), produced];
    await pause(ms);
    const [d1, p1] = [await page.evaluate(() => window.liveView.delivered), produced];
    return { delivered: ((d1 - d0) * 1000) / ms, produced: ((p1 - p0) * 1000) / ms };
  }
  const high = await measure(1000);
  await page.evaluate(() => window.liveView.setDemand(100));
  await pause(500); // the records already granted (at most 0.1 s worth) drain
  const low = await measure(1500);
  mkdirSync(ARTIFACTS, { recursive: true });
  await page.screenshot({ path: join(ARTIFACTS, "live-view.png") });
  producing = false;
  await offering;
  await producer.close();

  assert.deepEqual(errors, [], "no error on the page");
  assert.equal(await page.evaluate(() => window.liveView.error), null);
  assert.ok(high.delivered > 500, `delivered ${high.delivered}/s at demand 2000/s`);
  assert.ok(low.delivered > 0, "records still arrive at demand 100/s");
  assert.ok(low.delivered < high.delivered / 3, `delivered ${low.delivered}/s at demand 100/s vs ${high.delivered}/s`);
  assert.ok(low.produced < high.produced / 3, `the producer sent ${low.produced}/s at demand 100/s vs ${high.produced}/s`);
  console.log(`live view: delivered ${high.delivered}/s -> ${low.delivered}/s, produced ${high.produced}/s -> ${low.produced}/s`);
});

test("the live view says what it cannot use: a ?demand= that is no number, a topic not there yet, a token it needs", { skip, timeout: 60000 }, async () => {
  const token = "viewer-token-0123456789abcdef";
  const config = join(dir, "auth.toml");
  const hash = createHash("sha256").update(token).digest("hex");
  writeFileSync(config, `[[auth.tokens]]\nname = "viewer"\nhash = "sha256:${hash}"\nsubscribe = [">"]\n`);
  const secured = await startRsnet(["broker", "--config", config, "--tcp", "127.0.0.1:0", "--ws", "127.0.0.1:0"]);
  const page = await browser.newPage();
  const status = () => page.evaluate(() => document.getElementById("status").textContent);
  try {
    await page.goto(`${broker.live}?demand=abc`);
    await page.waitForFunction(() => document.getElementById("status").textContent.startsWith("connected"));
    assert.match(await status(), /\?demand=abc is no number of records\/s: 2000 it is/);
    assert.equal(await page.evaluate(() => window.liveView.demand), 2000);
    assert.equal(await page.evaluate(() => document.getElementById("demand-value").textContent), "2000");

    await page.goto(`${broker.live}?topic=live.later&demand=99999`);
    await page.waitForFunction(() => document.getElementById("status").textContent.includes("does not exist yet"));
    assert.equal(await status(), "topic live.later does not exist yet: waiting for its first record");
    assert.equal(await page.evaluate(() => window.liveView.demand), 5000, "clamped to the control's range");
    const producer = await connect(broker.tcp);
    await producer.offer("live.later", [1, 2, 3]);
    await producer.close();
    await page.waitForFunction(() => window.liveView.delivered === 3);

    await page.goto(`${broker.live}?broker=${secured.ws}`); // this page's broker has no tokens
    await page.waitForFunction(() => document.getElementById("status").textContent.includes("requires a token"));
    assert.equal(await page.evaluate(() => document.getElementById("token-field").hidden), false);
    await page.fill("#token", token);
    await page.click("#connect button, #connect input[type=submit]");
    await page.waitForFunction(() => document.getElementById("status").textContent.startsWith("connected"));
  } finally {
    await page.close();
    await secured.stop();
  }
});

/** Until the broker has `count` subscribers of `topic`: the page's subscription is placed (its
 * onSubscribe comes before the broker has it, and "from latest" would miss what is offered). */
async function placed(conn, topic, count = 1) {
  for (;;) {
    const listed = (await topics(conn)).find((t) => t.topic === topic);
    if (listed && Number(listed.subscriber_count) >= count) return;
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
}

test("the live view shows no stale figures while its broker is gone, and reconnects once it is back", { skip, timeout: 90000 }, async () => {
  const [tcp, ws, http] = [await freePort(), await freePort(), await freePort()];
  const listen = ["broker", "--tcp", `127.0.0.1:${tcp}`, "--ws", `127.0.0.1:${ws}`, "--metrics", `127.0.0.1:${http}`];
  let restartable = await startRsnet(listen, { listeners: 3 });
  const page = await browser.newPage();
  const errors = [];
  page.on("pageerror", (error) => errors.push(error));
  const rows = () => page.evaluate(() => document.querySelectorAll("#topics tbody tr").length);
  try {
    const producer = await connect(restartable.tcp);
    await producer.offer("live.again", [1, 2, 3]);
    await page.goto(`${restartable.live}?topic=live.again`);
    await page.waitForFunction(() => window.liveView.connected && document.querySelectorAll("#topics tbody tr").length > 0);
    await placed(producer, "live.again"); // CI saw the offer come first under load: nothing delivered
    await producer.offer("live.again", [4, 5]);
    await page.waitForFunction(() => window.liveView.delivered === 2);

    await restartable.stop();
    await page.waitForFunction(() => document.getElementById("status").textContent.includes("trying again"));
    assert.equal(await page.evaluate(() => window.liveView.connected), false);
    assert.equal(await rows(), 0, "no topic figures while nothing is connected");
    assert.equal(await page.evaluate(() => document.getElementById("stream").hidden), true);

    restartable = await startRsnet(listen, { listeners: 3 });
    await page.waitForFunction(() => window.liveView.connected, null, { timeout: 30000 });
    // Subscribed again to the topic it showed, from the latest record (a memory broker's
    // topics start empty after a restart): the new records arrive.
    const again = await connect(restartable.tcp);
    await page.waitForFunction(() => document.getElementById("topic-name").textContent === "live.again");
    // (No topic on the new broker until this offer: the page waits for its first record.)
    await again.offer("live.again", [6, 7, 8]);
    await page.waitForFunction(() => window.liveView.delivered === 3, null, { timeout: 30000 });
    await again.close();
    assert.deepEqual(errors, [], "no error on the page");
  } finally {
    await page.close();
    await restartable.stop();
  }
});
