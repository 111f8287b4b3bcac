// tls:// and wss:// against a real `rsnet broker` with TLS on (server/README.md, "TLS"): the
// server's certificate checked against the CA given in `tls.ca`, and refused without it.
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, test } from "node:test";

import { HandshakeError, connect, publish } from "../dist/index.js";
import { PYTHON, startRsnet } from "./support.js";

let broker;
let ca;
let dir;
before(async () => {
  dir = mkdtempSync(join(tmpdir(), "rsnet-js-tls-"));
  // A CA and a certificate for 127.0.0.1 and localhost (trustme: in rsnet's test extra).
  execFileSync(PYTHON, [
    "-c",
    `import sys, trustme
ca = trustme.CA()
cert = ca.issue_cert("127.0.0.1", "localhost")
ca.cert_pem.write_to_path(sys.argv[1] + "/ca.pem")
cert.cert_chain_pems[0].write_to_path(sys.argv[1] + "/cert.pem")
cert.private_key_pem.write_to_path(sys.argv[1] + "/key.pem")`,
    dir,
  ]);
  ca = readFileSync(join(dir, "ca.pem"), "utf8");
  broker = await startRsnet(["broker", "--tcp", "127.0.0.1:0", "--ws", "127.0.0.1:0"], {
    env: { ...process.env, RSNET_BROKER__LISTEN__TLS__CERT: join(dir, "cert.pem"), RSNET_BROKER__LISTEN__TLS__KEY: join(dir, "key.pem") },
  });
});
after(async () => {
  await broker?.stop();
  if (dir) rmSync(dir, { recursive: true, force: true });
});

for (const scheme of ["tls", "wss"]) {
  test(`${scheme}:// publishes and subscribes, the server's certificate checked against tls.ca`, async () => {
    assert.match(broker[scheme], new RegExp(`^${scheme}://127\\.0\\.0\\.1:`));
    const conn = await connect(broker[scheme], { tls: { ca } });
    try {
      const topic = `secure.${scheme}`;
      assert.equal(await publish(conn, topic, ["a", "b"], { producer: "p" }), 2);
      const values = [];
      for await (const record of conn.subscribe(topic, { from: "earliest" })) {
        values.push(record.value);
        if (values.length === 2) break;
      }
      assert.deepEqual(values, ["a", "b"]);
    } finally {
      await conn.close();
    }
  });

  test(`${scheme}:// refuses a server whose certificate no trusted CA signed`, async () => {
    await assert.rejects(connect(broker[scheme], { handshakeTimeout: 5000 }), (error) => {
      assert.ok(error instanceof HandshakeError, String(error));
      assert.match(error.message, /certificate/);
      return true;
    });
  });
}

test("a plain tcp:// client at the TLS port is told to try tls://", async () => {
  await assert.rejects(connect(broker.tls.replace(/^tls:/, "tcp:"), { handshakeTimeout: 3000 }), (error) => {
    assert.ok(error instanceof HandshakeError, String(error));
    assert.match(error.message, /closed during the handshake without an answer \(if the server uses TLS: tls:\/\/ or wss:\/\/\)/);
    return true;
  });
});
