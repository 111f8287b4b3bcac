/**
 * The rsnet client: connect to a server, subscribe to its publishers, offer it your own.
 *
 *     const conn = await connect("tcp://127.0.0.1:7600", { token });
 *     for await (const item of conn.subscribe("range", { count: 10 })) { ... }
 *     await conn.offer("uploads", records);       // the server pulls with its own demand
 *     await conn.close();                         // GO_AWAY, then the server closes
 *
 * The Reactive Streams model: `conn.publisher(name, params)` is a `Publisher`; its
 * `subscribe(subscriber)` calls `onSubscribe` with a `Subscription` whose `request(n)` and
 * `cancel()` go to the server as REQUEST and CANCEL. Demand requested between two writes is
 * sent as one REQUEST per stream; `subscribe(...)` as an async iterable sizes its own demand
 * (demand.ts: adaptive within a byte budget by default, or a fixed `prefetch`), never per item.
 *
 * Frames are written once per turn of the event loop (many frames per write and per
 * WebSocket message); demand goes out sooner, once the code that requested it yields (a
 * microtask), because a consumer iterating over buffered items never lets the event loop turn
 * until it has taken them all, and the REQUEST would wait for that, the server idle meanwhile.
 * When the connection ends, every open stream ends with
 * `ConnectionLost` (the CONN_ERROR's code if there was one): nothing waits forever.
 */
import { Connection, type Event } from "./connection.js";
import { ConnectionLost, ErrorCode, HandshakeError, ProtocolError, RsnetError, StreamError, type Code } from "./errors.js";
import { DEFAULT_KEEPALIVE_INTERVAL, DEFAULT_MAX_FRAME_SIZE, DEFAULT_MAX_STREAMS, MAX_INT, type Int } from "./frames.js";
import { demandPolicy, type Demand, type DemandOptions } from "./demand.js";
import { TransportError, openTransport, parseUrl, type TlsOptions, type Transport } from "./transport.js";

// ---------------------------------------------------------------- Reactive Streams interfaces

export interface Subscription {
  /** Ask for `n` more items (rule 3.8); n <= 0 ends the stream with an error (rule 3.9). */
  request(n: number | bigint): void;
  /** Stop the stream (rule 3.12); idempotent (rule 3.7). */
  cancel(): void;
}

export interface Subscriber<T> {
  onSubscribe(subscription: Subscription): void;
  onNext(item: T): void;
  onError(error: Error): void;
  onComplete(): void;
}

export interface Publisher<T> {
  subscribe(subscriber: Subscriber<T>): void;
}

export interface ConnectOptions {
  /** Sent as the HELLO's `auth_token`. */
  token?: string | Uint8Array;
  /** The largest frame this client accepts, in bytes: 16384 to 2147483647 (SPEC 2.1; a
   *  RangeError outside), default 1 MiB. */
  maxFrameSize?: number;
  maxStreams?: number;
  /** The client's proposal in ms; the server's WELCOME decides (SPEC 10.1). */
  keepaliveInterval?: number;
  /** Milliseconds to wait for the transport and the WELCOME (default 10000). */
  handshakeTimeout?: number;
  metadata?: Record<string, unknown>;
  /** Protocol versions to offer (default [1]); only useful to test a server's refusal. */
  versions?: number[];
  /** How Node checks the server's certificate over tls:// and wss:// (a browser: its own). */
  tls?: TlsOptions;
}

export interface OfferOptions {
  /** OFFER metadata (for example `content_type`). */
  metadata?: Record<string, unknown>;
  /** Aborting ends the stream with an ERROR (APPLICATION_ERROR) and rejects the offer. */
  signal?: AbortSignal;
}

export interface SubscribeOptions extends DemandOptions {
  /** SUBSCRIBE metadata. */
  metadata?: Record<string, unknown>;
}

/** Largest demand this side forwards: 2^63-1 means unbounded (rule 3.17). */
export const MAX_DEMAND = MAX_INT;
/** An offer waits for the transport when this many bytes are queued (backpressure to the socket). */
const HIGH_WATER = 1 << 20;

/** The demand policies' clock: monotonic milliseconds. */
const now = (): number => performance.now();

/** The empty frame an ItemStream holds when nothing is buffered (never written to). */
const EMPTY: unknown[] = [];

const schedule: (fn: () => void) => void =
  typeof setImmediate === "function" ? (fn) => setImmediate(fn) : (fn) => setTimeout(fn, 0);

/** Adds demand, saturating at 2^63-1 (rule 3.17). */
function addDemand(a: bigint, n: bigint): bigint {
  const sum = a + n;
  return sum > MAX_INT ? MAX_INT : sum;
}

// ---------------------------------------------------------------- streams this client subscribes to

/** One SUBSCRIBE stream: the Subscription handed to the local subscriber. */
class Inbound implements Subscription {
  streamId = 0;
  /** Demand requested locally and not yet sent in a REQUEST (or SUBSCRIBE). */
  pending = 0n;
  done = false;
  private subscriber: Subscriber<unknown> | null;

  constructor(
    private readonly client: Client,
    subscriber: Subscriber<unknown>,
  ) {
    this.subscriber = subscriber;
  }

  request(n: number | bigint): void {
    if (this.done) return; // rule 3.6
    const amount = typeof n === "bigint" ? n : Number.isInteger(n) ? BigInt(n) : 0n;
    if (amount <= 0n) {
      // Rule 3.9, signalled locally (SPEC 8.4): the wire never carries REQUEST(n <= 0); the
      // stream is cancelled at the server and the subscriber gets the error.
      const what = typeof n === "bigint" || Number.isInteger(n) ? "positive" : "a positive integer";
      this.fail(new StreamError(ErrorCode.INVALID_REQUEST, `rule 3.9: request(${n}) must be ${what}`), true);
      return;
    }
    const first = this.pending === 0n;
    this.pending = addDemand(this.pending, amount);
    if (first && this.streamId) this.client.demandPending(this);
  }

  cancel(): void {
    if (this.done) return; // rule 3.7
    this.done = true;
    this.subscriber = null; // rule 3.13
    this.client.endInbound(this, true);
  }

  // Signals from the connection.
  /** A frame's items and its size on the wire (what an ItemStream's demand is sized by). */
  deliver(items: unknown[], nbytes: number): void {
    const target = this.subscriber;
    if (target instanceof ItemStream) {
      target.receive(items, nbytes); // it never throws, and takes the frame at once
      return;
    }
    for (const item of items) {
      const subscriber = this.subscriber;
      if (subscriber === null) return; // cancelled while delivering: the rest are dropped
      try {
        subscriber.onNext(item);
      } catch (error) {
        this.fail(error as Error, true); // rule 2.13: a throwing onNext cancels
        return;
      }
    }
  }

  complete(): void {
    const subscriber = this.end();
    if (subscriber) safely(() => subscriber.onComplete());
  }

  fail(error: Error, sendCancel = false): void {
    const subscriber = this.subscriber;
    if (this.done || subscriber === null) return;
    this.done = true;
    this.subscriber = null;
    if (sendCancel) this.client.endInbound(this, true);
    safely(() => subscriber.onError(error));
  }

  private end(): Subscriber<unknown> | null {
    const subscriber = this.subscriber;
    this.done = true;
    this.subscriber = null;
    return subscriber;
  }
}

function safely(fn: () => void): void {
  try {
    fn();
  } catch (error) {
    // Rule 2.13: a subscriber's terminal method must not throw; nothing left to tell it.
    queueMicrotask(() => {
      throw error;
    });
  }
}

/** The server's publisher `name`: each `subscribe` opens a stream (a true RS Publisher). */
export class RemotePublisher<T = unknown> implements Publisher<T> {
  constructor(
    private readonly client: Client,
    readonly name: string,
    readonly params: unknown = null,
    private readonly metadata?: Record<string, unknown>,
  ) {}

  subscribe(subscriber: Subscriber<T>): void {
    if (subscriber === null || typeof subscriber !== "object") throw new TypeError("rule 1.9: subscriber must not be null");
    this.client.openInbound(subscriber as Subscriber<unknown>, this.name, this.params, this.metadata);
  }
}

/**
 * `for await (const item of conn.subscribe(...))`: an async iterator that is also the
 * stream's Subscriber. Leaving the loop (break, return, throw) cancels the stream; a remote
 * error is thrown from the loop.
 *
 * Its demand follows a policy of demand.ts, the Python clients' own: adaptive within a byte
 * budget by default, a fixed `prefetch` on request. The policy hears of every frame of items
 * received with its wire bytes (`receive`, from the connection's ITEMS events), of every item
 * handed out (one counter step; a REQUEST only when the policy asks for one), and of every
 * wait (`next()` with nothing buffered while the stream is open). With `limit`, handing out
 * the last item the limit allows cancels the stream.
 *
 * Buffered items stay in the arrays the decoder made, one per frame, never copied into one
 * queue: `current` is being handed out (from `head`), `later` holds the frames after it. A
 * frame's array is let go as its last item is handed out, so consumed items become garbage
 * frame by frame (one queue that never drains while frames keep arriving would keep them all,
 * and the garbage collector would copy them again and again). Keeping a frame of binary items
 * as bytes and creating each `Uint8Array` only as `next()` takes it was measured and is slower
 * (12-20% more CPU per 16-byte item in Node 20; see README): each item costs the same to
 * create either way, and items that die at once let V8 keep its young generation small, so it
 * collects twice as often.
 */
export class ItemStream<T = unknown> implements AsyncIterableIterator<T>, Subscriber<T> {
  private current = EMPTY as T[];
  private head = 0;
  private later: T[][] = [];
  private laterHead = 0;
  private subscription: Subscription | null = null;
  private readonly demand: Demand;
  private left: number; // items the limit still allows
  private finished = false;
  private error: Error | null = null;
  private waiting: { resolve: (r: IteratorResult<T>) => void; reject: (e: Error) => void } | null = null;

  /** Subscribes to `publisher` at once. `maxItemBytes`: the largest item the connection can
   *  receive (its `maxFrameSize`), which adaptive demand assumes until items arrive. */
  constructor(publisher: Publisher<T>, options: DemandOptions & { maxItemBytes?: number } = {}) {
    this.demand = demandPolicy(now, options);
    this.left = options.limit ?? Infinity;
    if (this.left === 0) {
      this.finished = true; // nothing to take: the stream is never opened
      return;
    }
    publisher.subscribe(this);
  }

  [Symbol.asyncIterator](): this {
    return this;
  }

  onSubscribe(subscription: Subscription): void {
    if (this.finished) {
      subscription.cancel(); // cancelled before the stream opened
      return;
    }
    this.subscription = subscription;
    if (this.demand.initial) subscription.request(this.demand.initial);
  }

  onNext(item: T): void {
    this.receive([item], 0);
  }

  /** @internal Items of one frame, in order, and the frame's bytes on the wire (0: unknown). */
  receive(items: T[], nbytes: number): void {
    if (this.finished || items.length === 0) return; // rule 2.8: in flight when we cancelled
    this.demand.received(items.length, nbytes);
    let first = 0;
    const waiting = this.waiting;
    if (waiting !== null) {
      // The consumer waits, so nothing is buffered: hand it the first item directly.
      this.waiting = null;
      first = 1;
      this.taken();
      waiting.resolve({ value: items[0], done: false });
      if (this.finished) return; // that was the last item the limit allows
    }
    if (first === items.length) return;
    if (this.head === this.current.length) {
      this.current = items; // nothing buffered: adopt the decoder's fresh array, no copy
      this.head = first;
    } else this.later.push(items); // first is 0: a waiting consumer means nothing was buffered
  }

  /** The current frame's last item was handed out: on to the next frame, or to none. */
  private advance(): void {
    const later = this.later;
    this.head = 0;
    if (this.laterHead === later.length) {
      this.current = EMPTY as T[];
      return;
    }
    this.current = later[this.laterHead];
    later[this.laterHead++] = EMPTY as T[];
    if (this.laterHead === later.length) {
      later.length = 0;
      this.laterHead = 0;
    }
  }

  onError(error: Error): void {
    this.finished = true;
    this.error = error;
    this.subscription = null;
    this.wake();
  }

  onComplete(): void {
    this.finished = true;
    this.subscription = null;
    this.wake();
  }

  private wake(): void {
    const waiting = this.waiting;
    if (waiting === null) return;
    this.waiting = null;
    if (this.error) waiting.reject(this.error);
    else waiting.resolve({ value: undefined, done: true });
  }

  /** One item was handed out: the policy decides whether to request (never per item). */
  private taken(): void {
    const wanted = this.demand.consumed(1);
    if (wanted > 0) this.subscription?.request(wanted);
    if (--this.left === 0) this.cancel(); // every item the limit allows was taken
  }

  next(): Promise<IteratorResult<T>> {
    const current = this.current;
    if (this.head < current.length) {
      // Invariant: `current` has items left unless nothing at all is buffered.
      const value = current[this.head++];
      if (this.head === current.length) this.advance();
      this.taken();
      return Promise.resolve({ value, done: false });
    }
    if (this.finished) {
      if (this.error) {
        const error = this.error;
        this.error = null; // thrown once; then the iterator is done
        return Promise.reject(error);
      }
      return Promise.resolve({ value: undefined, done: true });
    }
    this.demand.starved();
    return new Promise((resolve, reject) => (this.waiting = { resolve, reject }));
  }

  /** Leaving the loop early: cancel the stream (rule 3.12). */
  return(): Promise<IteratorResult<T>> {
    this.cancel();
    return Promise.resolve({ value: undefined, done: true });
  }

  /** Cancel the stream; a pending `next()` ends the iteration. */
  cancel(): void {
    this.finished = true;
    this.error = null;
    this.current = EMPTY as T[];
    this.head = 0;
    this.later = [];
    this.laterHead = 0;
    const subscription = this.subscription;
    this.subscription = null;
    subscription?.cancel();
    this.wake();
  }
}

// ---------------------------------------------------------------- streams this client offers

class Outbound {
  streamId = 0;
  accepted = false;
  /** Items the server requested and we have not sent (what the pump may still take). */
  credit = 0n;
  unsent: unknown[] = [];
  ended: Error | null | undefined = undefined; // undefined: open; null: cancelled by the server
  private wakeup: (() => void) | null = null;

  wake(): void {
    const wake = this.wakeup;
    this.wakeup = null;
    wake?.();
  }

  wait(): Promise<void> {
    return new Promise((resolve) => (this.wakeup = resolve));
  }
}

// ---------------------------------------------------------------- the client

export class Client {
  private readonly inbound = new Map<number, Inbound>();
  private readonly outbound = new Map<number, Outbound>();
  private dirty: Inbound[] = [];
  private flushScheduled = false;
  private demandFlushQueued = false;
  private closing = false;
  private lost: ConnectionLost | null = null;
  private keepaliveTimer: ReturnType<typeof setTimeout> | undefined;
  private lastSent = Date.now();
  private lastReceived = Date.now();
  private resolveClosed!: () => void;
  /** Resolves when the transport has closed, for whatever reason. */
  readonly closed: Promise<void> = new Promise((resolve) => (this.resolveClosed = resolve));
  private resolveGoAway!: (message: string) => void;
  /** Resolves with its message when the server sends GO_AWAY (it is shutting down: open
   *  streams go on, new ones fail with `StreamError` code GOING_AWAY, to retry elsewhere). */
  readonly goAway: Promise<string> = new Promise((resolve) => (this.resolveGoAway = resolve));

  /** Use `connect()`. */
  constructor(
    private readonly conn: Connection,
    private readonly transport: Transport,
    readonly url: string,
  ) {
    transport.onData = (data) => {
      this.lastReceived = Date.now();
      conn.receiveData(data);
      this.dispatch(conn.eventsReceived());
      this.flush();
    };
    transport.onText = () => {
      conn.sendConnError(ErrorCode.PROTOCOL_ERROR, "rsnet uses binary WebSocket messages only");
      this.lostWith(new ConnectionLost("the server sent a text message", ErrorCode.PROTOCOL_ERROR));
      this.flush();
      transport.end();
    };
    transport.onClose = (error) => {
      if (conn.state !== "CLOSED") {
        conn.receiveEof();
        conn.eventsReceived();
      }
      this.lostWith(new ConnectionLost(`connection to ${url} ended${error ? `: ${error.message}` : ""}`));
      clearTimeout(this.keepaliveTimer);
      this.resolveClosed();
    };
    this.armKeepalive();
  }

  /** The server's settings from its WELCOME. */
  get serverSettings(): Record<string, unknown> {
    return this.conn.peerSettings;
  }

  /** Streams open on this connection. */
  get streamCount(): number {
    return this.conn.streamCount;
  }

  /** The server's publisher `name` as a Reactive Streams Publisher (one stream per subscribe). */
  publisher<T = unknown>(name: string, params: unknown = null, metadata?: Record<string, unknown>): RemotePublisher<T> {
    return new RemotePublisher<T>(this, name, params, metadata);
  }

  /**
   * `for await (const item of conn.subscribe(name, params, {prefetch, budget, limit}))`: the
   * publisher's items, with adaptive demand within `budget` bytes by default (see
   * `SubscribeOptions`). Throws RangeError for a bad option, or `budget` with `prefetch`.
   */
  subscribe<T = unknown>(name: string, params: unknown = null, options: SubscribeOptions = {}): ItemStream<T> {
    const demand = { prefetch: options.prefetch, budget: options.budget, limit: options.limit, maxItemBytes: this.conn.frameLimit };
    return new ItemStream<T>(this.publisher<T>(name, params, options.metadata), demand);
  }

  /**
   * Serve `source` to the server under `name` (OFFER): the server pulls items with its own
   * demand; returns how many items were sent once the stream completed. Rejects with
   * `StreamError` if the server refuses or cancels with an error, `ProtocolError` for an item
   * larger than the server's `max_frame_size`, `ConnectionLost` if the connection ends first.
   * A source that throws ends the stream with APPLICATION_ERROR and
   * the promise rejects with that error; so does aborting `options.signal`.
   */
  async offer(
    name: string,
    source: Iterable<unknown> | AsyncIterable<unknown>,
    params: unknown = null,
    options: OfferOptions = {},
  ): Promise<number> {
    const out = new Outbound();
    out.streamId = this.open(() => this.conn.sendOffer(name, params, options.metadata));
    this.outbound.set(out.streamId, out);
    this.scheduleFlush();
    const signal = options.signal;
    const abort = (): void => {
      if (out.ended !== undefined) return;
      const reason = signal?.reason instanceof Error ? signal.reason : new Error("the offer was aborted");
      this.flushItems(out);
      this.conn.sendError(out.streamId, ErrorCode.APPLICATION_ERROR, `the producer stopped: ${reason.message}`);
      this.endOutbound(out, reason);
      this.scheduleFlush();
    };
    if (signal?.aborted) abort();
    signal?.addEventListener("abort", abort, { once: true });
    const iterator: Iterator<unknown> | AsyncIterator<unknown> =
      Symbol.asyncIterator in Object(source)
        ? (source as AsyncIterable<unknown>)[Symbol.asyncIterator]()
        : (source as Iterable<unknown>)[Symbol.iterator]();
    let sent = 0;
    try {
      for (;;) {
        while (out.ended === undefined && out.credit === 0n) await out.wait();
        if (out.ended !== undefined) break;
        const step = await iterator.next();
        if (out.ended !== undefined) break;
        if (step.done) {
          this.flushItems(out);
          this.conn.sendComplete(out.streamId);
          this.outbound.delete(out.streamId);
          this.scheduleFlush();
          return sent;
        }
        if (step.value === null || step.value === undefined) throw new TypeError("rule 2.13: items must not be null");
        out.unsent.push(step.value);
        out.credit -= 1n;
        sent += 1;
        this.scheduleFlush();
        if (this.transport.buffered >= HIGH_WATER) await this.transport.drained(HIGH_WATER / 2);
      }
    } catch (error) {
      if (out.ended === undefined) {
        this.flushItems(out);
        const err = error as Error;
        const code = err instanceof StreamError ? err.code : ErrorCode.APPLICATION_ERROR;
        this.conn.sendError(out.streamId, code, err instanceof StreamError ? err.detail : `${err.name}: ${err.message}`);
        this.outbound.delete(out.streamId);
        this.scheduleFlush();
      }
      throw error;
    } finally {
      signal?.removeEventListener("abort", abort);
      if (out.ended !== undefined) await (iterator as AsyncIterator<unknown>).return?.();
    }
    if (out.ended) throw out.ended;
    return sent; // cancelled by the server without an error: it wanted no more
  }

  /**
   * Close the connection cleanly: cancel what is still open here (subscribers get
   * `ConnectionLost`), send GO_AWAY, and wait for the server to close the transport (it does
   * so once no stream remains, SPEC 10.2). After `timeout` ms, send CONN_ERROR GOING_AWAY and
   * end the transport ourselves, then give the server up to 1 s more to read it and close
   * before the socket is destroyed: it resolves within `timeout` + 1000 ms.
   */
  async close(timeout = 5000): Promise<void> {
    if (!this.closing && this.conn.state === "OPEN") {
      this.closing = true;
      const reason = new ConnectionLost("the client closed the connection");
      for (const inbound of [...this.inbound.values()]) {
        inbound.fail(reason, true);
      }
      for (const out of [...this.outbound.values()]) {
        this.conn.sendError(out.streamId, ErrorCode.GOING_AWAY, "the client closed the connection");
        this.endOutbound(out, reason);
      }
      this.conn.sendGoAway("the client is done");
      this.flush();
    }
    let timer: ReturnType<typeof setTimeout> | undefined;
    const expired = new Promise<boolean>((resolve) => (timer = setTimeout(() => resolve(true), timeout)));
    const late = await Promise.race([this.closed.then(() => false), expired]);
    clearTimeout(timer);
    if (late && this.conn.state !== "CLOSED") {
      // SPEC 10.2: the drain deadline expired: CONN_ERROR GOING_AWAY, then close.
      this.conn.sendConnError(ErrorCode.GOING_AWAY, "the client's close deadline expired");
      this.lostWith(new ConnectionLost("the client closed the connection", ErrorCode.GOING_AWAY));
      this.flush();
    }
    this.transport.end();
    await Promise.race([this.closed, new Promise((resolve) => setTimeout(resolve, 1000))]);
    this.transport.destroy();
    await this.closed;
  }

  // ------------------------------------------------------------ internals: used by streams

  openInbound(subscriber: Subscriber<unknown>, name: string, params: unknown, metadata?: Record<string, unknown>): void {
    const inbound = new Inbound(this, subscriber);
    safely(() => subscriber.onSubscribe(inbound)); // rule 1.9: onSubscribe first, always
    if (inbound.done) return; // cancelled or failed inside onSubscribe
    let streamId: number;
    try {
      streamId = this.open(() => this.conn.sendSubscribe(name, params, inbound.pending, metadata));
    } catch (error) {
      inbound.fail(error as Error);
      return;
    }
    inbound.streamId = streamId;
    inbound.pending = 0n;
    this.inbound.set(streamId, inbound);
    this.scheduleFlush();
  }

  demandPending(inbound: Inbound): void {
    this.dirty.push(inbound);
    if (this.demandFlushQueued) return;
    // A microtask, not the next turn: see the module comment (the Python client likewise
    // yields once per request so that its writer sends it while items are still buffered).
    this.demandFlushQueued = true;
    queueMicrotask(() => {
      this.demandFlushQueued = false;
      this.flush();
    });
  }

  endInbound(inbound: Inbound, sendCancel: boolean): void {
    if (inbound.streamId === 0) return; // not open yet: openInbound sees `done`
    if (this.inbound.delete(inbound.streamId) && sendCancel) {
      this.conn.sendCancel(inbound.streamId);
      this.scheduleFlush();
    }
  }

  /** Opens a stream through `send` (which allocates the id and writes the frame, atomically). */
  private open(send: () => number): number {
    if (this.lost) throw this.lost;
    if (this.conn.peerGoingAway && !this.closing) {
      // As the server answers an opening after its GO_AWAY (SPEC 10.2): this stream is refused,
      // retryable on a new connection; the connection and its open streams go on.
      throw new StreamError(ErrorCode.GOING_AWAY, "the connection is going away: open the stream on a new connection");
    }
    if (this.closing || this.conn.goingAway) throw new ConnectionLost("the connection is closing", ErrorCode.GOING_AWAY);
    try {
      return send();
    } catch (error) {
      if (error instanceof ProtocolError && error.code === ErrorCode.TOO_MANY_STREAMS) {
        // SPEC 7.2: at the server's max_streams this client fails locally rather than queue.
        throw new StreamError(ErrorCode.TOO_MANY_STREAMS, error.message);
      }
      throw error;
    }
  }

  private flushItems(out: Outbound): void {
    if (out.unsent.length === 0) return;
    const items = out.unsent;
    out.unsent = [];
    this.conn.sendBatch(out.streamId, items);
  }

  private endOutbound(out: Outbound, error: Error | null): void {
    out.unsent = [];
    if (out.ended === undefined) out.ended = error;
    this.outbound.delete(out.streamId);
    out.wake();
  }

  // ------------------------------------------------------------ internals: I/O

  private scheduleFlush(): void {
    if (this.flushScheduled) return;
    this.flushScheduled = true;
    schedule(() => {
      this.flushScheduled = false;
      this.flush();
    });
  }

  /** Coalesced demand and pending items become frames; everything pending goes in one write. */
  private flush(): void {
    const dirty = this.dirty;
    this.dirty = [];
    for (const inbound of dirty) {
      if (!inbound.done && inbound.pending > 0n) {
        const n = inbound.pending;
        inbound.pending = 0n;
        this.conn.sendRequest(inbound.streamId, n);
      }
    }
    for (const out of this.outbound.values()) {
      if (out.unsent.length) {
        try {
          this.flushItems(out);
        } catch (error) {
          this.conn.sendError(out.streamId, (error as ProtocolError).code ?? ErrorCode.APPLICATION_ERROR, (error as Error).message);
          this.endOutbound(out, error as Error);
        }
      }
    }
    const chunks = this.transport.messageBased ? this.conn.dataToSendMessages() : [this.conn.dataToSend()];
    if (chunks.length && chunks[0].length) {
      this.transport.send(chunks);
      this.lastSent = Date.now();
    }
    if (this.conn.state === "CLOSED" || (this.conn.goingAway && this.conn.streamCount === 0 && this.conn.peerGoingAway)) {
      this.transport.end();
    }
  }

  private lostWith(error: ConnectionLost): void {
    if (this.lost === null) this.lost = error;
    for (const inbound of [...this.inbound.values()]) inbound.fail(this.lost);
    this.inbound.clear();
    for (const out of [...this.outbound.values()]) this.endOutbound(out, this.lost);
  }

  /** @internal Dispatch the connection's events (also those that came with the WELCOME). */
  dispatch(events: Event[]): void {
    for (const event of events) {
      switch (event.event) {
        case "ITEMS":
          this.inbound.get(event.stream_id)?.deliver(event.items, event.nbytes);
          break;
        case "COMPLETE": {
          // Only for streams we subscribe to: the connection refuses a COMPLETE on an offer.
          const inbound = this.inbound.get(event.stream_id);
          if (inbound) {
            this.inbound.delete(event.stream_id);
            inbound.complete();
          }
          break;
        }
        case "ERROR": {
          const error = new StreamError(event.code, event.message, event.data);
          const inbound = this.inbound.get(event.stream_id);
          if (inbound) {
            this.inbound.delete(event.stream_id);
            inbound.fail(error);
          }
          const out = this.outbound.get(event.stream_id);
          if (out) this.endOutbound(out, error);
          break;
        }
        case "ACCEPT": {
          const out = this.outbound.get(event.stream_id);
          if (out) out.accepted = true;
          break;
        }
        case "REQUEST": {
          const out = this.outbound.get(event.stream_id);
          if (out) {
            out.credit = addDemand(out.credit, BigInt(event.n));
            out.wake();
          }
          break;
        }
        case "CANCEL": {
          const out = this.outbound.get(event.stream_id);
          if (out) this.endOutbound(out, null);
          break;
        }
        case "SUBSCRIBE":
          this.conn.sendError(event.stream_id, ErrorCode.UNKNOWN_PUBLISHER, "this client hosts no publishers");
          break;
        case "OFFER":
          this.conn.sendError(event.stream_id, ErrorCode.UNKNOWN_PUBLISHER, "this client takes no offers");
          break;
        case "CLOSED":
          this.lostWith(
            new ConnectionLost(
              event.by_peer ? `the server closed the connection: ${event.message}` : `protocol violation by the server: ${event.message}`,
              event.code,
              event.data,
            ),
          );
          break;
        case "GO_AWAY": // the transport is closed in flush once no stream is left
          this.resolveGoAway(event.message);
          break;
        default: // PONG, HELLO/WELCOME (handshake)
          break;
      }
    }
  }

  private armKeepalive(): void {
    const k = this.conn.keepaliveInterval;
    if (!k) return;
    const tick = (): void => {
      if (this.conn.state !== "OPEN") return;
      const now = Date.now();
      if (now - this.lastReceived >= 3 * k) {
        // SPEC 10.1: nothing received for three intervals: the connection is dead.
        this.conn.sendConnError(ErrorCode.TIMEOUT, `nothing received for ${3 * k} ms`);
        this.lostWith(new ConnectionLost(`nothing received for ${3 * k} ms`, ErrorCode.TIMEOUT));
        this.flush();
        this.transport.end();
        return;
      }
      if (now - this.lastSent >= k) {
        this.conn.sendPing(0);
        this.flush();
      }
      const next = Math.min(this.lastSent + k, this.lastReceived + 3 * k) - Date.now();
      this.keepaliveTimer = setTimeout(tick, Math.max(next, 10));
      unref(this.keepaliveTimer);
    };
    this.keepaliveTimer = setTimeout(tick, k);
    unref(this.keepaliveTimer);
  }
}

function unref(timer: unknown): void {
  (timer as { unref?: () => void }).unref?.();
}

/**
 * Connect and complete the handshake. Rejects with `HandshakeError` when the server refuses
 * (`code`: UNAUTHORIZED, UNSUPPORTED_VERSION, ...), cuts the connection, does not answer
 * within `handshakeTimeout` (TIMEOUT) or cannot be reached (`code` null), and with a
 * `TypeError` for a URL no transport can use (`follow` retries the first kinds, not this).
 */
export async function connect(url: string, options: ConnectOptions = {}): Promise<Client> {
  const target = parseUrl(url); // a URL no transport can use: a TypeError, before any I/O
  const timeout = options.handshakeTimeout ?? 10000;
  const maxFrameSize = options.maxFrameSize ?? DEFAULT_MAX_FRAME_SIZE;
  const conn = new Connection("client", {
    max_frame_size: maxFrameSize,
    max_streams: options.maxStreams ?? DEFAULT_MAX_STREAMS,
    keepalive_interval: options.keepaliveInterval ?? DEFAULT_KEEPALIVE_INTERVAL,
    auth_token: options.token,
    metadata: options.metadata ?? { client: "rsnet-js/0.1" },
    versions: options.versions,
  });
  let timer: ReturnType<typeof setTimeout> | undefined;
  const deadline = new AbortController(); // closes a transport still opening when time is up
  const expired = new Promise<never>((_, reject) => {
    timer = setTimeout(() => {
      deadline.abort();
      reject(new HandshakeError(`connecting to ${url} timed out after ${timeout} ms`, ErrorCode.TIMEOUT));
    }, timeout);
  });
  let transport: Transport | undefined;
  try {
    const opened = openTransport(target, maxFrameSize, deadline.signal, options.tls);
    opened.catch(() => {}); // if the deadline won the race, its rejection is this one's
    transport = await Promise.race([opened, expired]);
    const open = transport;
    let answered = false;
    const welcomed = new Promise<Event[]>((resolve, reject) => {
      open.onData = (data) => {
        answered = true;
        conn.receiveData(data);
        const events = conn.eventsReceived();
        const closed = events.find((e) => e.event === "CLOSED");
        if (closed && closed.event === "CLOSED") {
          const what = closed.by_peer ? "the server refused the connection" : "the server broke the handshake";
          reject(new HandshakeError(`${what}: ${closed.message}`, closed.code, closed.data));
        } else if (conn.state === "OPEN") resolve(events);
      };
      open.onText = () => reject(new HandshakeError("the server sent a text message", ErrorCode.PROTOCOL_ERROR));
      open.onClose = (error) => {
        // A TLS port closes on the plain HELLO without a byte of rsnet: say what to try.
        const hint = answered || target.protocol === "tls:" || target.protocol === "wss:" ? "" : " without an answer (if the server uses TLS: tls:// or wss://)";
        reject(new HandshakeError(`the connection closed during the handshake${hint}${error ? `: ${error.message}` : ""}`));
      };
    });
    open.send(open.messageBased ? conn.dataToSendMessages() : [conn.dataToSend()]);
    const events = await Promise.race([welcomed, expired]);
    const client = new Client(conn, open, url);
    client.dispatch(events);
    return client;
  } catch (error) {
    if (transport) {
      if (error instanceof HandshakeError && error.code === ErrorCode.TIMEOUT && conn.state !== "CLOSED") {
        conn.sendConnError(ErrorCode.TIMEOUT, "handshake timed out");
        transport.send(transport.messageBased ? conn.dataToSendMessages() : [conn.dataToSend()]);
        transport.end();
      } else if (conn.state === "CLOSED") {
        const rest = conn.dataToSend(); // our CONN_ERROR, if we detected a violation
        if (rest.length) transport.send([rest]);
        transport.end();
      } else transport.destroy();
    }
    if (error instanceof RsnetError) throw error;
    // A transport's own error already says "cannot connect to URL".
    throw new HandshakeError(error instanceof TransportError ? error.message : `cannot connect to ${url}: ${(error as Error).message}`);
  } finally {
    clearTimeout(timer);
  }
}

export type { Code, Int };
