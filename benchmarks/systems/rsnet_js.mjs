// The Node client's side of the rsnet-js system (see rsnet_js.py): one measurement, then
//   RESULT {"items": N, "warmup_items": W, "seconds": S, "cpu_s": C, "node_peak_rss_mib": M}
// on stdout. Run by plain node, never inside `node --test` (its async-context tracking makes
// every await 3-4x dearer). Usage: node rsnet_js.mjs '{"kind": "stream", "url": ..., "params": {...}}'
import { connect } from "../../client/js/dist/index.js";

const { kind, url, params } = JSON.parse(process.argv[2]);
if (kind !== "stream") throw new Error(`rsnet-js measures only "stream", not ${kind}`);
// Our stdin is the runner's pipe (benchmarks/worker.py): its end means the runner is gone.
process.stdin.on("end", () => process.exit(3)).resume();

const conn = await connect(url);

async function read(count) {
  let items = 0;
  if (params.api === "subscriber") {
    // A Reactive Streams Subscriber doing the prefetch rule by hand, as rsnet_system.Prefetching.
    const refill = params.prefetch - Math.floor(params.prefetch / 4);
    await new Promise((resolve, reject) => {
      let subscription;
      let since = 0;
      conn.publisher("items", { count, size: params.size }).subscribe({
        onSubscribe(s) {
          subscription = s;
          s.request(params.prefetch);
        },
        onNext() {
          items += 1;
          if (++since === refill) {
            since = 0;
            subscription.request(refill);
          }
        },
        onError: reject,
        onComplete: resolve,
      });
    });
  } else {
    // As a user writes it (README): async iteration with the Python client's demand policy,
    // prefetch up front and prefetch - prefetch/4 each time that many were consumed; prefetch
    // null (a default-demand row) is the option not set: adaptive demand, as in the Python client.
    for await (const _ of conn.subscribe("items", { count, size: params.size }, { prefetch: params.prefetch })) {
      items += 1;
    }
  }
  return items;
}

// A stream read the same way first, not timed: V8 compiles the hot path as it runs (the first
// few hundred thousand items go at about half speed), as rsnet_system.py reads one too.
const warmed = params.warmup ? await read(params.warmup) : 0;
const cpu = process.cpuUsage();
const started = process.hrtime.bigint();
const items = await read(params.count);
const seconds = Number(process.hrtime.bigint() - started) / 1e9;
const used = process.cpuUsage(cpu);
await conn.close();
const nodePeakRssMib = process.resourceUsage().maxRSS / 1024;
console.log(`RESULT ${JSON.stringify({ items, warmup_items: warmed, seconds, cpu_s: (used.user + used.system) / 1e6, node_peak_rss_mib: nodePeakRssMib })}`);
process.exit(0);
