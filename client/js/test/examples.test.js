// The runnable examples in examples/, run as their comments say, against a real `rsnet broker`.
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import { after, before, test } from "node:test";

import { startRsnet } from "./support.js";

const run = promisify(execFile);
const EXAMPLES = fileURLToPath(new URL("../examples/", import.meta.url));

let broker;
before(async () => {
  broker = await startRsnet(["broker", "--tcp", "127.0.0.1:0", "--ws", "127.0.0.1:0"]);
});
after(async () => broker?.stop());

for (const transport of ["tcp", "ws"]) {
  test(`examples/sensors.mjs publishes and reads back, over ${transport}, and again without duplicates`, async () => {
    for (let round = 0; round < 2; round++) {
      const { stdout } = await run(process.execPath, [`${EXAMPLES}sensors.mjs`, broker[transport]]);
      assert.equal(
        stdout,
        [
          "stored 3 readings",
          'offset 0: {"sensor":"kitchen","celsius":20.5,"minute":0}',
          'offset 1: {"sensor":"kitchen","celsius":21,"minute":1}',
          'offset 2: {"sensor":"kitchen","celsius":21.5,"minute":2}',
          "",
        ].join("\n"),
      );
    }
  });
}
