/**
 * What an iterating subscriber (`conn.subscribe(...)`) requests and when: adaptive demand
 * within a byte budget by default (`AdaptiveDemand`), a fixed `prefetch` on request (`Refill`).
 *
 * A port of the Python clients' policy (`rsnet/client_rules.py`: `Refill`, `AdaptiveDemand`,
 * `demand_policy`), with the same constants and the same decisions, so that every rsnet client
 * puts the same demand on the wire; SPEC section 15 explains it. It is client policy only: what
 * goes on the wire is ordinary REQUEST frames, and a Subscription's own `request(n)` is exact.
 *
 * Pure: no I/O, no timers, no promises. Time comes from a clock passed in, in milliseconds
 * from any origin (the client passes `performance.now`, which is monotonic); the round trip
 * is in the clock's unit. The decisions do not depend on the unit (the window is a rate times
 * a round trip), so the Python tests' cases hold here with the times in milliseconds.
 *
 * The driver's side, the same for both policies: send `initial` with the SUBSCRIBE; call
 * `consumed` as the consumer takes items and request what it returns; report each frame of
 * items as it arrives (`received`) and each time the consumer finds nothing buffered and has
 * to wait (`starved`). `untilDue` says how many items may be taken before `consumed` can
 * return demand.
 */
import { DEFAULT_MAX_FRAME_SIZE } from "./frames.js";

/** Bytes (as encoded on the wire) that a stream with adaptive demand may have requested and
 *  not yet consumed: in flight and buffered together. */
export const DEFAULT_BUDGET = 4 * 1024 * 1024;

/** Items an adaptive window starts at (the fixed default of earlier versions), once the byte
 *  budget allows it. */
export const INITIAL_WINDOW = 256;

/** Items an adaptive window shrinks to at the least (fewer only where the byte budget says so). */
export const MIN_WINDOW = 4;

/** Items an adaptive window grows to at the most, however small the items: decoded values
 *  take several times their wire size. */
export const MAX_WINDOW = 16384;

/** A window of HEADROOM x (items consumed per second) x (round trip) is enough: demand is
 *  topped up when a quarter of the window is left, and that quarter must last a round trip
 *  (4x), with a margin of 2x. */
export const HEADROOM = 8;

/** `untilDue()` and the policies' internal counts when nothing more will ever be requested
 *  (no limit: the items left to request are unbounded). */
const NEVER = Infinity;

/** A clock in milliseconds from any origin, monotonic (`performance.now`). */
export type Clock = () => number;

/** `prefetch` if usable (a positive integer); RangeError otherwise. */
export function checkPrefetch(prefetch: number): number {
  if (!Number.isInteger(prefetch) || prefetch < 1) {
    throw new RangeError(`prefetch must be a positive integer or undefined (adaptive), got ${String(prefetch)}`);
  }
  return prefetch;
}

/** `limit` (the most items a subscription may take) if usable; RangeError otherwise. */
export function checkLimit(limit: number): number {
  if (!Number.isInteger(limit) || limit < 0) {
    const shown = typeof limit === "bigint" ? `the bigint ${String(limit)}n` : String(limit);
    throw new RangeError(`limit must be a number, an integer >= 0, got ${shown}`);
  }
  return limit;
}

/** `budget` (bytes) if usable: a positive integer; RangeError otherwise. */
export function checkBudget(budget: number): number {
  if (!Number.isInteger(budget) || budget < 1) throw new RangeError(`budget must be a positive integer (bytes), got ${String(budget)}`);
  return budget;
}

/** What an iterating subscriber's driver holds: both policies have these members. */
export interface Demand {
  /** Items to request with the SUBSCRIBE (0: none). */
  readonly initial: number;
  /** `count` more items were consumed: how many to request now (0 for none yet). */
  consumed(count?: number): number;
  /** Items that may be consumed before `consumed` can return demand (Infinity: never). */
  untilDue(): number;
  /** `count` items arrived in one frame of `nbytes` bytes on the wire (0: not measured). */
  received(count: number, nbytes: number): void;
  /** The consumer found nothing buffered and waits for items. */
  starved(): void;
}

/**
 * The fixed prefetch rule (`subscribe(..., {prefetch: N})`): request `prefetch` up front, then
 * `prefetch - floor(prefetch / 4)` each time that many items were consumed (one REQUEST per
 * batch, never per item). Item sizes and waits play no part.
 *
 * With `limit`, the total requested never exceeds `limit` (exact demand for a known count:
 * nothing beyond it is ever sent), and `initial` is capped likewise.
 */
export class Refill implements Demand {
  readonly prefetch: number;
  readonly batch: number;
  readonly initial: number;
  private unrequested: number;
  private count = 0;

  constructor(prefetch: number, limit?: number | null) {
    this.prefetch = checkPrefetch(prefetch);
    this.batch = this.prefetch - Math.floor(this.prefetch / 4);
    const unrequested = limit == null ? NEVER : checkLimit(limit);
    this.initial = Math.min(this.prefetch, unrequested);
    this.unrequested = unrequested - this.initial;
  }

  consumed(count = 1): number {
    this.count += count;
    if (this.count < this.batch || !this.unrequested) return 0;
    const refills = Math.floor(this.count / this.batch);
    this.count -= refills * this.batch;
    const wanted = Math.min(refills * this.batch, this.unrequested);
    this.unrequested -= wanted;
    return wanted;
  }

  untilDue(): number {
    return this.unrequested ? Math.max(0, this.batch - this.count) : NEVER;
  }

  /** Items arrived: a fixed window does not care. */
  received(_count: number, _nbytes: number): void {}

  /** The consumer waits: a fixed window does not care. */
  starved(): void {}
}

export interface AdaptiveOptions {
  /** The most items to take: the total requested never exceeds it. */
  limit?: number | null;
  /** Bytes on the wire that may be requested and not yet consumed (default `DEFAULT_BUDGET`). */
  budget?: number | null;
  /** The largest an item can be on the wire: the client's `maxFrameSize` (default 1 MiB). */
  maxItemBytes?: number;
}

/**
 * Adaptive demand, the default of an iterating subscriber: a window of outstanding items
 * (requested and not yet consumed) that grows while the consumer keeps up and the round trip
 * dominates, shrinks for a slow consumer, and never holds more than `budget` bytes by the
 * item sizes measured so far. The spirit is TCP's receive-window auto-tuning.
 *
 * - **Top-up**: once the outstanding items fall to a quarter of the window, request what
 *   brings them back to the window (one REQUEST per three quarters of a window, as `Refill`).
 *   Each top-up is a decision point for the window:
 * - **grow**: the consumer had to wait for items since the last decision (`starved`): the
 *   window doubles (up to `MAX_WINDOW` and the byte budget). A slow publisher makes its
 *   consumer wait too, and gets a large window it does not fill: harmless, since the budget
 *   still bounds what a burst can bring;
 * - **shrink**: it never waited, and a window of `HEADROOM x rate x rtt` (the items it consumed
 *   per unit of time since the last decision, the round trip measured as below) is under half
 *   the window: the window becomes that (at least `MIN_WINDOW`);
 * - **bytes**: the window never exceeds `budget / itemBytes`. `itemBytes` is the size the
 *   items take on the wire (a frame's bytes over its item count, per frame received): it
 *   follows a rise at once and a fall by an eighth per frame; until the first frame it is
 *   `maxItemBytes` (the client's `maxFrameSize`, which no item can exceed), so the first
 *   request is `budget / maxItemBytes` items (4 with the defaults) and grows to
 *   `INITIAL_WINDOW` when the first items show they are small;
 * - **round trip**: from a top-up to the arrival of the first item it made requestable (the
 *   SUBSCRIBE counts too); the estimate is the smallest sample, allowed to rise by a quarter
 *   per sample, so it follows a slower path without keeping an outlier.
 *
 * With `limit`, the total requested never exceeds it. The clock is read at decisions and when
 * a round-trip sample completes, never per item.
 *
 * The byte bound holds for the sizes seen: a stream whose items suddenly grow may briefly hold
 * its window (at most `MAX_WINDOW` items) of the new size, until it has consumed what was
 * requested before it saw them.
 */
export class AdaptiveDemand implements Demand {
  readonly budget: number;
  /** Wire bytes per item, as measured (until the first frame: the largest possible). */
  itemBytes: number;
  /** The target window in items, before the byte bound (`limitWindow()` applies it). */
  window = INITIAL_WINDOW;
  /** The round-trip estimate in the clock's unit (ms), once measured. */
  rtt: number | null = null;
  readonly initial: number;
  private readonly clock: Clock;
  private measured = false;
  private unrequested: number;
  private requested: number;
  private count = 0; // items consumed
  private arrived = 0; // items received
  private waited = false;
  private cycleStart: number;
  private cycleConsumed = 0;
  // A round-trip sample in progress: sent at `probeSent` (null: none), done when more than
  // `probeMark` items have arrived.
  private probeMark = 0;
  private probeSent: number | null;
  private dueAt = 0;

  constructor(clock: Clock, options: AdaptiveOptions = {}) {
    this.clock = clock;
    this.budget = checkBudget(options.budget ?? DEFAULT_BUDGET);
    this.itemBytes = Math.max(1, options.maxItemBytes ?? DEFAULT_MAX_FRAME_SIZE);
    const unrequested = options.limit == null ? NEVER : checkLimit(options.limit);
    this.initial = Math.min(this.limitWindow(), unrequested);
    this.unrequested = unrequested - this.initial;
    this.requested = this.initial;
    const now = clock();
    this.cycleStart = now;
    this.probeSent = this.initial ? now : null;
    this.setDue();
  }

  /** The window in items now: the target, bounded by the byte budget. */
  limitWindow(): number {
    return Math.min(this.window, this.byteWindow());
  }

  /** The most items the byte budget allows at the measured size (at least 1). */
  private byteWindow(): number {
    return Math.max(1, Math.floor(this.budget / this.itemBytes));
  }

  consumed(count = 1): number {
    this.count += count;
    if (this.count < this.dueAt) return 0;
    return this.decide();
  }

  untilDue(): number {
    return Math.max(0, this.dueAt - this.count);
  }

  received(count: number, nbytes: number): void {
    this.arrived += count;
    if (nbytes > 0 && count > 0) {
      const size = nbytes / count;
      if (!this.measured || size > this.itemBytes) {
        this.measured = true;
        this.itemBytes = size;
      } else this.itemBytes += (size - this.itemBytes) / 8;
      this.setDue();
    }
    if (this.probeSent !== null && this.arrived > this.probeMark) {
      const sample = this.clock() - this.probeSent;
      this.probeSent = null;
      this.rtt = this.rtt === null ? sample : Math.min(sample, this.rtt * 1.25);
    }
  }

  starved(): void {
    this.waited = true;
  }

  private decide(): number {
    if (!this.unrequested) {
      this.dueAt = NEVER;
      return 0;
    }
    const now = this.clock();
    const cap = this.byteWindow();
    let window = Math.min(this.window, cap);
    if (this.waited) window = Math.min(2 * window, MAX_WINDOW);
    else if (this.rtt !== null && now > this.cycleStart) {
      const rate = (this.count - this.cycleConsumed) / (now - this.cycleStart);
      const target = Math.max(MIN_WINDOW, Math.ceil(HEADROOM * rate * this.rtt));
      if (2 * target < window) window = target;
    }
    this.window = Math.max(1, Math.min(window, cap));
    this.waited = false;
    this.cycleStart = now;
    this.cycleConsumed = this.count;
    let wanted = Math.min(this.limitWindow() - (this.requested - this.count), this.unrequested);
    if (wanted > 0) {
      if (this.probeSent === null) {
        this.probeMark = this.requested;
        this.probeSent = now;
      }
      this.requested += wanted;
      this.unrequested -= wanted;
    } else wanted = 0;
    this.setDue();
    return wanted;
  }

  /** The consumed count at which the next top-up is due: a quarter of the window left. */
  private setDue(): void {
    this.dueAt = this.unrequested ? this.requested - Math.floor(this.limitWindow() / 4) : NEVER;
  }
}

/** How an iterating subscriber asks for items (`conn.subscribe`'s options). */
export interface DemandOptions {
  /** A fixed window of this many items; unset (the default): adaptive demand within `budget`. */
  prefetch?: number | null;
  /** Adaptive demand only: bytes on the wire requested and not yet consumed, at most
   *  (default `DEFAULT_BUDGET`, 4 MiB). An error with `prefetch`. */
  budget?: number | null;
  /** Take at most this many items: the demand sent never adds up to more (exact). */
  limit?: number | null;
}

/**
 * The demand policy of `subscribe`: `Refill` for an explicit `prefetch`, else `AdaptiveDemand`
 * within `budget` bytes (default `DEFAULT_BUDGET`). A `budget` with a `prefetch` is a
 * RangeError: a fixed window is counted in items.
 */
export function demandPolicy(clock: Clock, options: DemandOptions & { maxItemBytes?: number } = {}): Demand {
  const { prefetch, limit, budget, maxItemBytes } = options;
  if (prefetch != null) {
    if (budget != null) throw new RangeError("budget sizes the adaptive window: give it without prefetch, or give no budget");
    return new Refill(prefetch, limit);
  }
  return new AdaptiveDemand(clock, { limit, budget, maxItemBytes });
}
