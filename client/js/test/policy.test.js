// The demand policies of an iterating subscriber (src/demand.ts), without sockets: a simulated
// stream with a clock of its own drives them as ItemStream does. The cases are those of the
// Python policy's tests (tests/test_demand.py), with times in milliseconds: the same decisions.
// test/wire-demand.test.js checks the demand the real client puts on the wire.
import assert from "node:assert/strict";
import { test } from "node:test";

import {
  AdaptiveDemand,
  DEFAULT_BUDGET,
  DEFAULT_MAX_FRAME_SIZE,
  INITIAL_WINDOW,
  MAX_WINDOW,
  MIN_WINDOW,
  Refill,
  demandPolicy,
} from "../dist/index.js";

const MIB = 1024 * 1024;

/** Simulated milliseconds: the policy reads it; only the simulation moves it. */
class Clock {
  now = 0;
  read = () => this.now;
}

/**
 * A publisher as fast as its demand, `rtt` ms away (a request's first item arrives one round
 * trip after it, then a frame of up to `batch` items every `perBatch` ms), items of
 * `itemBytes` on the wire, and a consumer that spends `perItem` ms on each. It drives the
 * policy as ItemStream does: `starved` before every wait, `received` per frame, `consumed` per
 * item, requesting what it returns; and it records what a user of the stream would see.
 */
class Stream {
  constructor(policy, clock, { rtt = 0.2, perItem = 0.5e-3, itemBytes = 18, batch = 256, perBatch = 0.02 } = {}) {
    Object.assign(this, { policy, clock, rtt, perItem, itemBytes, batch, perBatch });
    this.arrivals = []; // [time, items], in time order
    this.next = 0; // index of the first arrival not yet delivered
    this.buffered = 0;
    this.requested = 0;
    this.consumed = 0;
    this.waited = 0;
    this.peakOutstanding = 0; // items requested and not yet consumed, at the most
    this.request(policy.initial);
  }

  request(n) {
    if (!n) return;
    this.requested += n;
    this.peakOutstanding = Math.max(this.peakOutstanding, this.requested - this.consumed);
    const last = this.arrivals.length > this.next ? this.arrivals[this.arrivals.length - 1][0] + this.perBatch : 0;
    const start = Math.max(this.clock.now + this.rtt, last);
    for (let k = 0, first = 0; first < n; k++, first += this.batch) {
      this.arrivals.push([start + k * this.perBatch, Math.min(this.batch, n - first)]);
    }
  }

  deliverDue() {
    while (this.next < this.arrivals.length && this.arrivals[this.next][0] <= this.clock.now) {
      const count = this.arrivals[this.next++][1];
      this.buffered += count;
      this.policy.received(count, count * this.itemBytes);
    }
  }

  /** The consumer takes `count` items. */
  take(count) {
    for (let i = 0; i < count; i++) {
      this.deliverDue();
      if (!this.buffered) {
        assert.ok(this.next < this.arrivals.length, "the consumer waits for items nobody requested");
        this.policy.starved();
        this.waited += this.arrivals[this.next][0] - this.clock.now;
        this.clock.now = this.arrivals[this.next][0];
        this.deliverDue();
      }
      this.buffered -= 1;
      this.consumed += 1;
      this.clock.now += this.perItem;
      this.request(this.policy.consumed());
    }
  }

  /** Items per ms over the next `count` items. */
  rate(count) {
    const start = this.clock.now;
    this.take(count);
    return count / (this.clock.now - start);
  }
}

const adaptive = (clock, options) => new AdaptiveDemand(clock.read, options);

test("the first request assumes the largest items until the first ones arrive", () => {
  const clock = new Clock();
  const policy = adaptive(clock);
  assert.equal(policy.initial, DEFAULT_BUDGET / DEFAULT_MAX_FRAME_SIZE);
  assert.equal(policy.initial, 4);
  assert.equal(adaptive(clock, { maxItemBytes: 16 * 1024 }).initial, INITIAL_WINDOW, "small frames: 256 fit");
  const stream = new Stream(policy, clock);
  stream.take(1); // the 4 small items arrived, the consumer waited for them: up to 2 x 256 now
  assert.equal(stream.requested, 2 * INITIAL_WINDOW + 1);
});

test("a fast consumer grows the window until the round trip no longer dominates", () => {
  const clock = new Clock();
  const stream = new Stream(adaptive(clock), clock, { rtt: 0.2, perItem: 0.5e-3 });
  stream.take(100_000); // the ramp: a few milliseconds
  assert.ok(stream.rate(500_000) > 0.9 / stream.perItem, "within 10% of the consumer's own speed");
  assert.ok(stream.policy.window > (4 * 0.2) / 0.5e-3, "a quarter of it covers the round trip");
});

test("a fixed small prefetch is bound by the round trip, for comparison", () => {
  const clock = new Clock();
  const stream = new Stream(new Refill(256), clock, { rtt: 0.2, perItem: 0.5e-3 });
  stream.take(10_000);
  assert.ok(stream.rate(100_000) < 0.6 / stream.perItem, "the 5x of issue 13, in the small");
});

test("small items stop at MAX_WINDOW", () => {
  const clock = new Clock();
  const stream = new Stream(adaptive(clock), clock, { rtt: 50, perItem: 0.1e-3 }); // a long round trip
  stream.take(300_000);
  assert.equal(stream.policy.window, MAX_WINDOW);
  assert.ok(stream.peakOutstanding <= MAX_WINDOW);
});

for (const itemBytes of [1024, 64 * 1024, MIB - 64]) {
  test(`the byte budget bounds what is outstanding whatever the item size (${itemBytes} bytes)`, () => {
    const clock = new Clock();
    const stream = new Stream(adaptive(clock), clock, { rtt: 50, perItem: 1e-3, itemBytes, batch: 16 });
    stream.take(itemBytes < MIB / 2 ? 20_000 : 500);
    assert.ok(stream.peakOutstanding * itemBytes <= DEFAULT_BUDGET, `${stream.peakOutstanding} outstanding`);
    assert.equal(stream.policy.limitWindow(), Math.floor(DEFAULT_BUDGET / itemBytes), "and it is used");
  });
}

test("a budget smaller than one item still moves one at a time", () => {
  const clock = new Clock();
  const stream = new Stream(adaptive(clock, { budget: 1000 }), clock, { itemBytes: 5000, batch: 1 });
  stream.take(50);
  assert.equal(stream.consumed, 50);
  assert.equal(stream.peakOutstanding, 1);
});

test("a slow consumer shrinks the window", () => {
  const clock = new Clock();
  const stream = new Stream(adaptive(clock), clock, { rtt: 0.2, perItem: 0.5e-3 });
  stream.take(100_000);
  const grown = stream.policy.window;
  stream.perItem = 1; // now it takes a millisecond per item: 8 x 1/ms x 0.2 ms ~ 2 items
  stream.take(2 * grown);
  assert.ok(stream.policy.window <= 2 * MIN_WINDOW, `window ${stream.policy.window}`);
  const waited = stream.waited;
  stream.take(1_000);
  assert.equal(stream.waited, waited, "and a small window is enough for it: it never waits");
});

test("a consumer that speeds up again regrows the window", () => {
  const clock = new Clock();
  const stream = new Stream(adaptive(clock), clock, { perItem: 1 });
  stream.take(2_000);
  assert.ok(stream.policy.window <= 2 * MIN_WINDOW);
  stream.perItem = 0.5e-3;
  stream.take(100_000);
  assert.ok(stream.rate(300_000) > 0.9 / stream.perItem);
});

test("item sizes are followed up at once and down gradually", () => {
  const clock = new Clock();
  const policy = adaptive(clock);
  policy.received(100, 100 * 20);
  assert.equal(policy.itemBytes, 20);
  policy.received(1, 100_000);
  assert.equal(policy.itemBytes, 100_000);
  policy.received(10, 10 * 20);
  assert.ok(policy.itemBytes > 20 && policy.itemBytes < 100_000);
  for (let i = 0; i < 200; i++) policy.received(10, 10 * 20);
  assert.ok(Math.abs(policy.itemBytes - 20) < 0.2);
  const settled = policy.itemBytes;
  policy.received(5, 0); // unmeasured (an item without its frame's size): no change
  assert.equal(policy.itemBytes, settled);
});

test("the round trip is measured from a request to the first item it allowed", () => {
  const clock = new Clock();
  const policy = adaptive(clock, { maxItemBytes: 1024 }); // 256 up front
  const close = (a, b) => Math.abs(a - b) < 1e-9;
  clock.now = 3;
  policy.received(10, 100);
  assert.ok(close(policy.rtt, 3), "the SUBSCRIBE's own round trip");
  policy.received(182, 1820);

  /** Consume up to the next top-up; what it requests (and times). */
  const topUp = () => {
    assert.equal(policy.consumed(policy.untilDue() - 1), 0);
    return policy.consumed();
  };

  assert.ok(topUp() > 0);
  clock.now = 3.5;
  policy.received(64, 640); // the rest of the first 256: not the sample
  clock.now = 4;
  policy.received(1, 10); // the first item of the top-up
  assert.ok(close(policy.rtt, 1), "a smaller sample replaces the estimate");
  assert.ok(topUp() > 0);
  clock.now = 1000;
  policy.received(10 ** 4, 10 ** 5); // a much slower one: the estimate rises by a quarter only
  assert.ok(close(policy.rtt, 1.25));
});

for (const limit of [0, 1, 3, 5, 1000, 100_000]) {
  test(`a limit is never exceeded and is reached (${limit})`, () => {
    const clock = new Clock();
    const policy = adaptive(clock, { limit });
    const stream = new Stream(policy, clock);
    stream.take(limit);
    assert.equal(stream.requested, limit);
    assert.equal(policy.consumed(), 0);
    assert.equal(policy.untilDue(), Infinity);
  });
}

test("the fixed rule: prefetch up front, then prefetch - prefetch/4 per as many consumed, within a limit", () => {
  const policy = new Refill(8, 20);
  assert.equal(policy.initial, 8);
  const requests = [];
  for (let i = 0; i < 20; i++) {
    const wanted = policy.consumed();
    if (wanted) requests.push([i + 1, wanted]);
  }
  assert.deepEqual(requests, [[6, 6], [12, 6]], "8 + 6 + 6 = 20: the last refill is cut to the limit, none after");
  assert.equal(new Refill(64, 5).initial, 5);
  assert.equal(new Refill(100).consumed(150), 150, "two refills' worth at once: one request");
});

test("untilDue is where consumed first asks for more", () => {
  const clock = new Clock();
  for (const policy of [new Refill(100), adaptive(clock, { maxItemBytes: 1024 })]) {
    const due = policy.untilDue();
    for (let i = 0; i < due - 1; i++) assert.equal(policy.consumed(), 0);
    assert.ok(policy.consumed() > 0);
  }
});

test("demandPolicy chooses by prefetch", () => {
  const clock = new Clock();
  assert.ok(demandPolicy(clock.read) instanceof AdaptiveDemand);
  assert.ok(demandPolicy(clock.read, { prefetch: null }) instanceof AdaptiveDemand, "null is unset, as undefined");
  const fixed = demandPolicy(clock.read, { prefetch: 64, limit: 10 });
  assert.ok(fixed instanceof Refill);
  assert.equal(fixed.initial, 10);
  assert.equal(demandPolicy(clock.read, { budget: 10 * MIB }).budget, 10 * MIB);
  assert.throws(() => demandPolicy(clock.read, { prefetch: 64, budget: MIB }), RangeError, "a fixed window is counted in items");
  for (const bad of [0, -1, 1.5, "1", NaN, Infinity]) {
    assert.throws(() => demandPolicy(clock.read, { budget: bad }), RangeError, `budget ${bad}`);
    assert.throws(() => demandPolicy(clock.read, { prefetch: bad }), RangeError, `prefetch ${bad}`);
  }
  for (const bad of [-1, 1.5, "1", NaN]) assert.throws(() => demandPolicy(clock.read, { limit: bad }), RangeError, `limit ${bad}`);
});

test("a limit that is no usable number is a RangeError that shows what was given", () => {
  const policy = (limit) => demandPolicy(() => 0, { limit, maxItemBytes: DEFAULT_MAX_FRAME_SIZE });
  assert.throws(() => policy(-1), /limit must be a number, an integer >= 0, got -1/);
  assert.throws(() => policy(2.5), /got 2.5/);
  assert.throws(() => policy(2n), /got the bigint 2n/, "not 'got 2', which reads as a valid limit");
});
