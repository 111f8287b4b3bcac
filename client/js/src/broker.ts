/**
 * Helpers for the rsnet broker (protocol/BROKER.md): publish with acknowledgements, follow a
 * topic across reconnects, commit cursors, list topics.
 *
 *     await publish(conn, "sensors.kitchen", readings, { producer: "kitchen-1" });
 *     for await (const record of follow(url, "sensors.kitchen", { from: "earliest" })) { ... }
 */
import { connect, type Client, type ConnectOptions } from "./client.js";
import { ConnectionLost, ErrorCode, HandshakeError, StreamError, registerCodeNames } from "./errors.js";
import { TransportError } from "./transport.js";

/** The broker's application error codes (protocol/BROKER.md); `StreamError.codeName` knows them. */
export const BrokerCode = {
  OFFSET_TRIMMED: 4100,
  OFFSET_OUT_OF_RANGE: 4101,
  SLOW_SUBSCRIBER: 4102,
  TOO_MANY_TOPICS: 4103,
  OFFSET_DAMAGED: 4110,
  STORAGE_FULL: 4111,
  STORAGE_ERROR: 4112,
} as const;

registerCodeNames(BrokerCode);

/** A topic record: `{topic, offset, timestamp, value}` (and `skipped` after a drop). */
export interface BrokerRecord<T = unknown> {
  topic: string;
  offset: number | bigint;
  timestamp: number | bigint;
  value: T;
  skipped?: number | bigint;
}

export interface PublishOptions {
  /** The producer id: republishing with the same id and sequences is idempotent. Default: random. */
  producer?: string;
  /** Sequence number of the first record (default 0); later records count up from it. */
  firstSequence?: number | bigint;
}

function randomId(): string {
  const bytes = new Uint8Array(16);
  globalThis.crypto.getRandomValues(bytes);
  return Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
}

/**
 * Publish `records` to `topic` and resolve once the broker has stored every one (its `$acks`
 * stream acknowledged the last sequence). Resolves to how many were published. Rejects with
 * `StreamError` if the broker refuses (e.g. UNAUTHORIZED, or REJECTED for a record it finds too
 * large), `ProtocolError` for a record larger than the broker's `max_frame_size` (it cannot be
 * sent at all), `ConnectionLost` if the connection ends first: records not acknowledged then may or may not be stored, and publishing them
 * again with the same producer and sequences is safe (the broker drops duplicates).
 */
export async function publish(
  conn: Client,
  topic: string,
  records: Iterable<unknown> | AsyncIterable<unknown>,
  options: PublishOptions = {},
): Promise<number> {
  const producer = options.producer ?? `producer-${randomId()}`;
  const first = BigInt(options.firstSequence ?? 0);
  let acked = first - 1n;
  let wanted: bigint | null = null;
  let settle!: (error?: Error) => void;
  const done = new Promise<void>((resolve, reject) => (settle = (error) => (error ? reject(error) : resolve())));
  done.catch(() => {}); // observed below; never an unhandled rejection meanwhile
  // Acknowledgements first (BROKER.md: subscribe to $acks before offering).
  const acks = conn.subscribe<{ sequence: number | bigint }>("$acks", { producer, topic }, { prefetch: 16 });
  const watching = (async () => {
    try {
      for await (const ack of acks) {
        const sequence = BigInt(ack.sequence);
        if (sequence > acked) acked = sequence;
        if (wanted !== null && acked >= wanted) return settle();
      }
      settle(new StreamError(ErrorCode.INTERNAL, "$acks ended before every record was acknowledged"));
    } catch (error) {
      settle(error as Error);
    }
  })();
  const stop = new AbortController();
  const offering = conn.offer(topic, records, { producer, sequence: first }, { signal: stop.signal });
  offering.catch(() => {}); // observed through the race below
  try {
    const sent = await Promise.race([
      offering,
      done.then(() => {
        throw new StreamError(ErrorCode.INTERNAL, "$acks ended before the offer did");
      }),
    ]).catch((error: Error) => {
      stop.abort(error); // $acks refused (e.g. UNAUTHORIZED): publishing cannot succeed
      throw error;
    });
    wanted = first + BigInt(sent) - 1n;
    if (sent === 0 || acked >= wanted) settle();
    await done;
    return sent;
  } finally {
    acks.cancel();
    await watching;
  }
}

/** Commit `cursor` on `topic` at `offset` (the next record the group wants); resolves to the echo. */
export async function commit(conn: Client, topic: string, cursor: string, offset: number | bigint): Promise<unknown> {
  let echo: unknown;
  for await (const item of conn.subscribe("$commit", { topic, cursor, offset })) echo = item;
  return echo;
}

/** The broker's topics this client may subscribe to (`$topics`). */
export async function topics(conn: Client): Promise<Record<string, unknown>[]> {
  const all: Record<string, unknown>[] = [];
  for await (const entry of conn.subscribe<Record<string, unknown>>("$topics")) all.push(entry);
  return all;
}

/** Where a subscription to a topic starts (BROKER.md): the oldest retained record, the next
 *  one to be published, an offset, or the first record at or after a time (ms since the epoch). */
export type From = "earliest" | "latest" | number | bigint | { timestamp: number | bigint };

export interface FollowOptions extends ConnectOptions {
  /** Where to start: "earliest", "latest" (default), an offset, or `{timestamp}`. */
  from?: From;
  /** Start at this named cursor's committed offset, if it has one. */
  cursor?: string;
  /** As for `conn.subscribe`: a fixed window of items; unset: adaptive demand within `budget`. */
  prefetch?: number | null;
  /** As for `conn.subscribe`: the adaptive window's byte budget (default 4 MiB). */
  budget?: number | null;
  /** First delay between reconnects, doubled up to `maxRetryDelay` (ms). */
  retryDelay?: number;
  maxRetryDelay?: number;
  /** Called with each connection error before the next attempt (for logging). */
  onRetry?: (error: Error) => void;
}

/**
 * Yield a topic's records, reconnecting after connection failures: after a reconnect it
 * subscribes from the offset after the last record it yielded, so records continue with no
 * gap and no duplicate. A broker going away (GOING_AWAY: a restart) is waited for as a lost
 * connection is; other stream errors (e.g. OFFSET_TRIMMED) and refused credentials are thrown. Leaving the loop closes the connection.
 */
export async function* follow<T = unknown>(url: string, topic: string, options: FollowOptions = {}): AsyncGenerator<BrokerRecord<T>> {
  let position: unknown = options.from ?? "latest";
  let cursor = options.cursor;
  const initialDelay = options.retryDelay ?? 100;
  let delay = initialDelay;
  for (;;) {
    let conn: Client | undefined;
    try {
      conn = await connect(url, options);
      const params: Record<string, unknown> = { from: position };
      if (cursor !== undefined) params.cursor = cursor;
      for await (const record of conn.subscribe<BrokerRecord<T>>(topic, params, { prefetch: options.prefetch, budget: options.budget })) {
        delay = initialDelay;
        cursor = undefined; // resume from our own position, not the cursor's
        position = typeof record.offset === "bigint" ? record.offset + 1n : record.offset + 1;
        yield record;
      }
      return; // a topic subscription never completes, but if it does, so do we
    } catch (error) {
      const fatal =
        error instanceof HandshakeError && (error.code === ErrorCode.UNAUTHORIZED || error.code === ErrorCode.UNSUPPORTED_VERSION);
      // A broker shutting down ends subscriptions with GOING_AWAY: wait for the next one, as
      // for a lost connection.
      const goingAway = error instanceof StreamError && error.code === ErrorCode.GOING_AWAY;
      if (fatal || !(goingAway || error instanceof ConnectionLost || error instanceof TransportError)) throw error;
      options.onRetry?.(error);
      await new Promise((resolve) => setTimeout(resolve, delay));
      delay = Math.min(delay * 2, options.maxRetryDelay ?? 5000);
    } finally {
      await conn?.close(1000);
    }
  }
}
