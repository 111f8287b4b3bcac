// Serves the live view and the modules it imports, as plain files (no build step):
//   node web/serve.mjs [port]   then open http://127.0.0.1:PORT/?broker=ws://127.0.0.1:7601/
import { createReadStream, statSync } from "node:fs";
import { createServer } from "node:http";
import { extname, join, normalize } from "node:path";
import { fileURLToPath } from "node:url";

const ROOT = fileURLToPath(new URL("..", import.meta.url));
const ALLOWED = ["/web/", "/dist/", "/node_modules/msgpackr/"];
const TYPES = { ".html": "text/html", ".js": "text/javascript", ".css": "text/css", ".map": "application/json" };

/** Start serving on 127.0.0.1:`port` (0: any); resolves to the http.Server. */
export function serveLiveView(port = 0) {
  const server = createServer((request, response) => {
    const url = new URL(request.url, "http://localhost");
    if (url.pathname === "/") {
      response.writeHead(302, { location: `/web/index.html${url.search}` }).end();
      return;
    }
    const path = normalize(url.pathname);
    const file = join(ROOT, path);
    if (!ALLOWED.some((prefix) => path.startsWith(prefix)) || !file.startsWith(ROOT)) {
      response.writeHead(404).end();
      return;
    }
    try {
      statSync(file);
    } catch {
      response.writeHead(404).end();
      return;
    }
    response.writeHead(200, { "content-type": TYPES[extname(file)] ?? "application/octet-stream" });
    createReadStream(file).pipe(response);
  });
  return new Promise((resolve) => server.listen(port, "127.0.0.1", () => resolve(server)));
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  const server = await serveLiveView(Number(process.argv[2] ?? 8080));
  console.log(`rsnet live view: http://127.0.0.1:${server.address().port}/?broker=ws://127.0.0.1:7601/`);
}
