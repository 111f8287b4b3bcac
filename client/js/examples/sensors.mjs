// Publish readings to an rsnet broker, then read them back from the start of the topic.
//
//   rsnet broker                                # in another terminal: tcp://127.0.0.1:7600, in memory
//   npm run build && node examples/sensors.mjs  # or: node examples/sensors.mjs ws://127.0.0.1:7601/
//
// In an application, import from "rsnet-client" (npm install /path/to/rsnet-client-0.1.0.tgz).
import { StreamError, connect, publish } from "../dist/index.js";

const url = process.argv[2] ?? "tcp://127.0.0.1:7600";
const conn = await connect(url); // { token } too, if the broker has [[auth.tokens]]
try {
  const readings = [20.5, 21, 21.5].map((celsius, i) => ({ sensor: "kitchen", celsius, minute: i }));
  // Resolves once the broker has stored them all; run it again and the same producer and
  // sequences store nothing twice.
  const stored = await publish(conn, "sensors.kitchen", readings, { producer: "kitchen-1" });
  console.log(`stored ${stored} readings`);
  let read = 0;
  for await (const record of conn.subscribe("sensors.kitchen", { from: "earliest" })) {
    console.log(`offset ${record.offset}: ${JSON.stringify(record.value)}`);
    if (++read === readings.length) break; // leaving the loop cancels the subscription
  }
} catch (error) {
  if (error instanceof StreamError) console.error(`refused: ${error.codeName}: ${error.message}`);
  throw error;
} finally {
  await conn.close();
}
