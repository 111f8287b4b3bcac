// Compiled (not run) by `npm test`: the public API's TypeScript types as an application uses them.
import {
  AdaptiveDemand,
  ConnectionLost,
  DEFAULT_BUDGET,
  ErrorCode,
  Float64,
  HandshakeError,
  StreamError,
  commit,
  connect,
  demandPolicy,
  follow,
  publish,
  topics,
  type BrokerRecord,
  type Client,
  type Demand,
  type SubscribeOptions,
  type Subscriber,
  type Subscription,
} from "../dist/index.js";

export async function example(url: string): Promise<void> {
  const conn: Client = await connect(url, { token: "t", keepaliveInterval: 5000, handshakeTimeout: 1000 });
  let total = 0;
  for await (const n of conn.subscribe<number>("range", { count: 10 }, { prefetch: 64 })) total += n;
  for await (const n of conn.subscribe<number>("range", { count: 10 })) total += n; // adaptive demand
  const bounded: SubscribeOptions = { budget: 2 * DEFAULT_BUDGET, limit: 5, metadata: { why: "types" } };
  for await (const n of conn.subscribe<number>("range", { count: 10 }, bounded)) total += n;
  const policy: Demand = demandPolicy(() => performance.now(), { prefetch: null, limit: 3 });
  if (policy instanceof AdaptiveDemand) console.log(policy.window, policy.rtt, policy.itemBytes, policy.untilDue());
  const subscriber: Subscriber<string> = {
    onSubscribe(s: Subscription) {
      s.request(10);
      s.request(2n ** 63n - 1n);
    },
    onNext(item: string) {
      item.toUpperCase();
    },
    onError(error: Error) {
      if (error instanceof StreamError) console.log(error.code, error.codeName, error.detail, error.data);
      if (error instanceof ConnectionLost) console.log(error.code);
    },
    onComplete() {},
  };
  conn.publisher<string>("names").subscribe(subscriber);
  const sent: number = await conn.offer("uploads", [1, new Float64(2), 3n], { producer: "p" }, { signal: AbortSignal.timeout(1000) });
  await publish(conn, "t", (async function* () { yield total + sent; })(), { producer: "p", firstSequence: 5n });
  await commit(conn, "t", "c", 3);
  const listing: Record<string, unknown>[] = await topics(conn);
  // @ts-expect-error: a typo in `from` is a type error, not only the broker's REJECTED
  follow(url, "t", { from: "earlest" });
  for await (const record of follow<{ celsius: number }>(url, "t", { from: "earliest", retryDelay: 10, budget: DEFAULT_BUDGET })) {
    const r: BrokerRecord<{ celsius: number }> = record;
    console.log(r.offset, r.value.celsius, listing.length);
    break;
  }
  await conn.close();
  const refused: unknown = ErrorCode.UNAUTHORIZED;
  if (refused instanceof HandshakeError) throw refused;
}
